"""``fednet.testing.check_protocol``: it passes on the built-ins and on a small outside protocol charging declared
kernels, and fails, naming the check, on a protocol whose timing mode bills more than its kernels meter (a stand-in
billed to the clock), on one whose kernel declares fewer MACs than it meters (naming the step and the kernel), on
one whose time depends on a secret, and on one that is not deterministic at a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from fednet.algebra.meter import charge, kernel
from fednet.algebra.shape import Shape
from fednet.learning.models import minibatch_gradient
from fednet.protocol import registry
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
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
        local_gradients = None                                   # no batched twin: every node runs local_gradient

        def local_gradient(self, dev):
            secret = self.sim.secret_rng(dev, "pad", self.epoch).integers(1, 1000)
            charge(int(secret))                                  # the secret shows in the device's compute time
            return super().local_gradient(dev)
    with pytest.raises(AssertionError, match="another secret seed changes a public quantity"):
        check_protocol(Leaky, {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)


def test_a_run_that_is_not_deterministic_fails() -> None:
    conventional = registry.get("conventional")

    class Noisy(conventional):
        local_gradients = None

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
        def local_gradient(self, dev):
            charge(7)                                            # the scalar step charges more than its batch twin
            return super().local_gradient(dev)
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_protocol(Twin, {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)


# -- a small outside protocol charging declared kernels (fednet.algebra.meter.kernel) ---------------------------------
def _gradient_macs(X, Y, theta, rows) -> int:
    """``2 b d c``: the minibatch gradient's two products (eq. 3)."""
    return 2 * len(rows) * X.shape[1] * Y.shape[1]


@kernel(macs=_gradient_macs, out=lambda X, Y, theta, rows: Shape((X.shape[1], Y.shape[1]), np.float64),
        value=lambda X, Y, theta, rows: minibatch_gradient(X, Y, theta, rows))   # timing mode's host value
def declared_gradient(X, Y, theta, rows):
    """A device's minibatch gradient, ``(d, c)``: a declared kernel."""
    return minibatch_gradient(X, Y, theta, rows)


@kernel(macs=lambda X, Y, theta, rows: _gradient_macs(X, Y, theta, rows) - 1,      # one MAC too few
        out=lambda X, Y, theta, rows: Shape((X.shape[1], Y.shape[1]), np.float64),
        value=lambda X, Y, theta, rows: minibatch_gradient(X, Y, theta, rows))
def under_declared_gradient(X, Y, theta, rows):
    """The same kernel declaring one MAC fewer than it meters."""
    return minibatch_gradient(X, Y, theta, rows)


class SmallConfig(ProtocolConfig):
    mode: Literal["full", "timing"] = "full"


@dataclass
class SmallState(NodeState):
    batch: int = 0


class SmallFL(Protocol):
    """Minibatch FL whose devices charge a declared kernel through ``self.mode.run(kernel, *args)``."""

    name = "small-declared"
    Config = SmallConfig
    State = SmallState
    setup_dropouts = "none"
    gradient_kernel = staticmethod(declared_gradient)

    def setup(self):
        for dev in self.devices:
            dev.state.batch = max(1, self.task.X[dev.index].shape[0] // 2)
        return
        yield  # pragma: no cover

    def local_gradient(self, dev):
        rows = self.minibatch_rows(dev, dev.state.batch)
        return self.mode.run(self.gradient_kernel, self.task.X[dev.index], self.task.Y[dev.index],
                             dev.state.received.astype(np.float64), rows)

    def round(self, epoch):
        replies = yield from self.net.gather(self.devices, self.local_gradient, kind="gradient",
                                             download=self.theta.astype(np.float32))
        self.used = replies.indices
        G = sum(self.mode.value(g) for g in replies.values)
        self.mode.update(self, G, int(self.point_counts[self.used].sum()))


def test_an_outside_protocol_with_declared_kernels_passes() -> None:
    report = check_protocol(SmallFL, {"mode": "timing"}, task=make_task(D=6), rounds=2)
    assert "full and timing mode" in report.explain()


def test_a_kernel_declaring_too_few_macs_fails_naming_the_step() -> None:
    """Timing mode charges the declaration (one MAC short a call), so full mode, which meters the kernel on every
    call, refuses the first call, naming the protocol, the step and the kernel with both counts."""
    class UnderDeclared(SmallFL):
        gradient_kernel = staticmethod(under_declared_gradient)
    with pytest.raises(AssertionError, match=r"UnderDeclared: full mode refuses a declared cost: small-declared: "
                                             r"step \"gather 'gradient'\": kernel \S*under_declared_gradient "
                                             r"metered 360 MACs but declares 359"):
        check_protocol(UnderDeclared, {"mode": "timing"}, task=make_task(D=6), rounds=2)
