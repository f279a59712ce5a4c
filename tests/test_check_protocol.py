"""``fednet.testing.check_protocol``: it passes on the built-ins and on a small outside protocol charging declared
kernels, and fails, naming the check, on a protocol whose timing mode bills more than its kernels meter (a stand-in
billed to the clock), on one whose kernel declares fewer MACs than it meters (naming the step and the kernel), on
one whose time depends on a secret, on one that is not deterministic at a seed, and on one that sends field elements
at the wrong width."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from fednet.algebra.meter import charge, kernel
from fednet.algebra.shape import Shape
from fednet.learning.models import minibatch_gradient, minibatch_gradients_of
from fednet.protocol import registry
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.primitives import batched
from fednet.sim.engine import wire
from fednet.sim.simulation import Simulation
from fednet.testing import check_protocol
from fednet.topologies.lte import lte_star
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


# -- wire widths (issue 27, item 2) ------------------------------------------------------------------------------------
P61 = 2**61 - 1


def _field_sender(width):
    """conventional, plus one message of eight elements of GF(2^61 - 1) a round from device 0, billed at ``width``."""
    conventional = registry.get("conventional")

    class FieldSender(conventional):
        def round(self, epoch):
            yield from super().round(epoch)
            share = (np.arange(1, 9, dtype=np.int64) * (P61 // 9) + epoch) % P61    # up to ~2^61
            kw = {} if width is None else {"element_bits": width}
            self.last = yield from self.net.send(self.devices[0], self.server, share, kind="field_share", **kw)
    return FieldSender


def test_field_elements_sent_at_the_wrong_width_fail() -> None:
    """61-bit field elements billed at 32 bits: the harness names the message kind, the round and the width."""
    with pytest.raises(AssertionError, match=r"round \d+, message kind 'field_share'.*need 61 bits.*billed at 32"):
        check_protocol(_field_sender(32), {"minibatch_fraction": 0.5}, task=make_task(D=6), rounds=2)


def test_field_elements_declared_as_such_pass_and_cost_ceil_log2_p() -> None:
    report = check_protocol(_field_sender(wire.field(P61)), {"minibatch_fraction": 0.5}, task=make_task(D=6),
                            rounds=2)
    assert "fit the width it is billed at" in report.explain()
    sim = Simulation(lte_star(6, device_mac_rates=[1e6] * 6), 0)
    proto = _field_sender(wire.field(P61))(sim, make_task(D=6), {"minibatch_fraction": 0.5})
    proto.run(1)
    assert proto.last.element_bits == 61 and proto.last.bits == 8 * 61


def test_a_field_declaration_checks_the_values_against_p() -> None:
    """Values below 2^61 but not below p = 2^31 - 1 (a declared GF(p) whose elements were not reduced)."""
    with pytest.raises(AssertionError, match=r"message kind 'field_share'.*not elements of \[0, 2147483647\)"):
        check_protocol(_field_sender(wire.field(2**31 - 1)), {"minibatch_fraction": 0.5}, task=make_task(D=6),
                       rounds=1)


def test_an_undeclared_integer_payload_is_an_error_naming_the_kind() -> None:
    sim = Simulation(lte_star(6, device_mac_rates=[1e6] * 6), 0)
    proto = _field_sender(None)(sim, make_task(D=6), {"minibatch_fraction": 0.5})
    with pytest.raises(wire.WireWidthError, match=r"message kind 'field_share'.*int64.*element_bits="):
        proto.run(1)


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
