"""``fednet.testing.check_protocol``: it passes on the built-ins and fails, naming the check, on a protocol whose
timing mode bills more than its kernels meter (a stand-in billed to the clock), on one whose time depends on a
secret, and on one that is not deterministic at a seed."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fednet.algebra.meter import charge
from fednet.learning.models import minibatch_gradients_of
from fednet.protocol import registry
from fednet.protocol.primitives import batched
from fednet.testing import check_protocol
from factories import make_task

pytestmark = pytest.mark.backends


@pytest.mark.parametrize("name,params", [
    ("conventional", {"minibatch_fraction": 0.5, "drop_slowest": 1}),
    ("codedpaddedfl", {"alpha": 3, "mode": "timing"}),
    ("codedsecagg", {"z": 1, "groups": 2, "mode": "timing"}),
    ("lightsecagg", {"z": 1, "U": 6, "mode": "timing"}),
    ("secagg", {"mode": "timing"}),
    ("secaggplus", {"mode": "timing"}),
])
def test_built_ins_pass(name: str, params: dict) -> None:
    report = check_protocol(registry.get(name), params, task=make_task(D=8), rounds=2)
    assert "full and timing mode" in report.explain() or "mode" not in params
    assert report.engine.backends_used()


def _cpfl():
    return registry.get("codedpaddedfl")


def test_a_stand_in_billed_in_timing_mode_fails() -> None:
    """Timing mode that charges more than full mode's kernels meter (the 62x server MACs of issue 27's example)."""
    base = _cpfl()

    class Billing(base):
        def _device_epoch(self, dev):
            out = super()._device_epoch(dev)
            if self.config.mode == "timing":
                charge(1000)                                     # the stand-in's own arithmetic, billed
            return out
    with pytest.raises(AssertionError, match="full and timing mode differ.*device_macs|full and timing mode differ"):
        check_protocol(Billing, {"alpha": 3}, task=make_task(D=8), rounds=2)


def test_a_time_that_depends_on_a_secret_fails() -> None:
    conventional = registry.get("conventional")

    class Leaky(conventional):
        def local_gradient(self, dev):
            secret = self.sim.secret_rng(dev, "pad", self.epoch).integers(1, 1000)
            charge(int(secret))                                  # the secret shows in the device's compute time
            return super().local_gradient(dev)
    with pytest.raises(AssertionError, match="another secret seed changes a public quantity"):
        check_protocol(Leaky, {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)


def test_a_run_that_is_not_deterministic_fails() -> None:
    conventional = registry.get("conventional")

    class Noisy(conventional):
        def local_gradient(self, dev):
            charge(random.randint(1, 10**6))                     # the host's unkeyed randomness
            return super().local_gradient(dev)
    with pytest.raises(AssertionError, match="not deterministic|differs from the reference"):     # either run shows it
        check_protocol(Noisy, {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)


def test_a_batch_twin_that_differs_from_its_step_fails() -> None:
    """A batched kernel (the engine's ``batched`` backend) that does not compute what the node-by-node step does:
    the engine check names the first differing column."""
    conventional = registry.get("conventional")

    class Twin(conventional):
        @batched(minibatch_gradients_of)                         # declares the batch of the step it overrides
        def local_gradient(self, dev):
            charge(7)                                            # the scalar step charges more than its batch twin
            return super().local_gradient(dev)
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_protocol(Twin, {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)
