"""The primitives of fednet.protocol: failures reported by gather/first_k, exchange schedules, tree_aggregate,
the uncharged-compute guard, the modes and the trace columns."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from fednet.algebra.meter import MacMeter, matmul
from fednet.protocol.base import Protocol
from fednet.protocol.modes import Full, Shape, Timing, make_mode
from fednet.protocol.primitives import GatherResult, Mailbox, UnchargedCompute, cyclic_steps
from fednet.protocol.trace import COLUMNS
from fednet.sim.compute import BernoulliDropout, Deterministic
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star
from factories import make_task

D = 6


def sim_of(rates=None, dropout=0.0, seed=0) -> Simulation:
    """Loss-free star, deterministic compute: device i at ``rates[i]`` MAC/s."""
    rates = rates or [1e3 * (i + 1) for i in range(D)]
    g = lte_star(D, loss=0.0, device_mac_rates=rates)
    return Simulation(g, seed, device_compute=Deterministic(),
                      availability=BernoulliDropout(dropout) if dropout else None)


def work(dev):
    """Device i charges 1000 MACs: device D-1 (fastest) finishes first."""
    return matmul(np.ones((10, 10)), np.ones((10, 10)))


class Probe(Protocol):
    """A protocol whose round is given by the test (unregistered: no ``name``)."""

    body = None

    def round(self, epoch):
        self.out = yield from type(self).body(self)
        self.theta = self.theta + 0.0


def run(body, sim=None, rounds=1) -> Probe:
    cls = type("P", (Probe,), {"body": staticmethod(body)})
    p = cls(sim or sim_of(), make_task(D=D))
    p.run(rounds)
    return p


def test_gather_returns_results_and_cancelled() -> None:
    p = run(lambda self: self.net.gather(self.devices, work, kind="g", first=2))
    res = p.out
    assert isinstance(res, GatherResult)
    assert [n.index for n in res.nodes] == [5, 4]                 # fastest first
    assert sorted(n.index for n in res.cancelled) == [0, 1, 2, 3]
    assert res.dropped == [] and res.missed_deadline == []
    assert [n.index for n, _ in res] == [5, 4] and len(res) == 2  # iterates over results


def test_gather_reports_dropped_devices_in_result_and_trace() -> None:
    sim = sim_of(dropout=0.5, seed=3)
    p = run(lambda self: self.net.gather(self.devices, work, kind="g"), sim=sim, rounds=2)
    absent = sorted(n.index for n in p.out.dropped)
    present = sorted(n.index for n in p.out.nodes)
    assert absent and present and sorted(absent + present) == list(range(D))
    assert p.trace[-1]["dropped"] == " ".join(map(str, absent))
    assert p.trace[0]["event"] == "phase" and p.trace[1]["event"] == "round"
    assert p.trace[1]["decode_failed"] is False


def test_gather_deadline_marks_missed() -> None:
    # device i needs 1000 / (1000 (i + 1)) s of compute plus transfers; a 0.3 s deadline keeps the fast ones
    p = run(lambda self: self.net.gather(self.devices, work, kind="g", deadline=0.3))
    got = sorted(n.index for n in p.out.nodes)
    missed = sorted(n.index for n in p.out.missed_deadline)
    assert got and missed and sorted(got + missed) == list(range(D)) and max(missed) < min(got)
    assert p.out.cancelled == []


def test_gather_without_cancel_leaves_work_pending() -> None:
    def body(self):
        res = yield from self.net.gather(self.devices, work, kind="g", first=1, cancel=False)
        assert [n.index for n, _ in res.pending] == [0, 1, 2, 3, 4]
        yield self.env.timeout(10.0)                               # the others finish meanwhile
        assert not any(proc.is_alive for _, proc in res.pending)
        return res
    p = run(body)
    assert p.trace[1]["device_macs"] == D * 1000                   # everybody's work was charged


def test_uncharged_compute_raises_naming_the_step() -> None:
    with pytest.raises(UnchargedCompute, match="'plain'.*0 MACs"):
        run(lambda self: self.net.compute_each(self.devices, lambda dev: np.ones(3) @ np.ones(3), step="plain"))
    with pytest.raises(UnchargedCompute, match="gather 'g'"):
        run(lambda self: self.net.gather(self.devices, lambda dev: np.zeros(2), kind="g"))
    with pytest.raises(UnchargedCompute, match="server_compute|<lambda>"):
        run(lambda self: self.net.server_compute(lambda: 1.0))
    p = run(lambda self: self.net.compute_each(self.devices, lambda dev: dev.index, free=True))
    assert p.out == {i: i for i in range(D)}


@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap", "upload_once", "bundled"])
def test_exchange_delivers_every_share_with_the_schedule_traffic(schedule) -> None:
    groups = [[0, 1, 2], [3, 4, 5]]

    def body(self):
        box = Mailbox(self.env)
        nodes = [[self.devices[i] for i in g] for g in groups]
        out = yield from self.net.exchange(cyclic_steps(nodes), lambda s, d: np.full(4, 10 * s.index + d.index),
                                           kind="share", schedule=schedule, n_elements=4, element_bits=8, mailbox=box)
        return out, box
    cls = type("P", (Probe,), {"body": staticmethod(body)})
    proto = cls(sim_of(), make_task(D=D))
    proto.sim.round = 0

    def main():
        proto.out = yield from body(proto)
    proto.sim.run(main())
    out, box = proto.out
    pairs = [(a, b) for g in groups for a in g for b in g if a != b]
    assert sorted(out) == sorted(pairs)
    for a, b in pairs:
        expect = np.full(4, 10 * a + b)
        got = out[(a, b)]
        assert np.array_equal(got, expect) or (schedule == "upload_once")   # upload_once forwards src's one payload
        assert box.get(a, b) is out[(a, b)]
    c = proto.sim.take_counters()
    n_msgs = {"relay_steps": 12, "relay_asap": 12, "upload_once": 6 + 12, "bundled": 6 + 6}[schedule]
    assert c.messages == (n_msgs if schedule in ("upload_once", "bundled") else 2 * n_msgs)
    bits = 4 * 8                                                   # one share (payload bits: counters exclude headers)
    ups = {"relay_steps": 12, "relay_asap": 12, "upload_once": 6, "bundled": 12}[schedule]
    assert c.bits_up == pytest.approx(ups * bits) and c.bits_down == pytest.approx(12 * bits)


def test_tree_aggregate_sums_children_into_roots() -> None:
    tree = nx.DiGraph()
    tree.add_nodes_from(range(D))
    for child, parent, step in [(2, 0, 0), (4, 2, 0), (3, 1, 1), (5, 1, 0)]:
        tree.add_edge(child, parent, step=step)

    def own(dev):
        return matmul(np.full((1, 1), float(dev.index + 1)), np.ones((1, 1)))

    def add(acc, part):
        return matmul(np.ones((1, 1)), acc + part)

    p = run(lambda self: self.net.tree_aggregate(tree, own, add, kind="t", root_kind="root", n_elements=1))
    sums = {n.index: float(v[0, 0]) for n, v in p.out}
    assert sums == {0: 1 + 3 + 5, 1: 2 + 4 + 6}
    q = run(lambda self: self.net.tree_aggregate(tree, own, add, kind="t", root_kind="root", first=1, n_elements=1))
    assert len(q.out) == 1 and len(q.out.cancelled) == 1


def test_modes_charge_the_same_macs_and_timing_returns_stand_ins() -> None:
    a, b = np.ones((5, 7)), np.ones((7, 3))
    with MacMeter() as full:
        out = Full().run(matmul, a, b)
    with MacMeter() as timing:
        stub = Timing().run(matmul, Shape.like(a), Shape((7, 3), np.float64), stand_in=lambda: "host value")
    assert full.macs == timing.macs == 105
    assert isinstance(stub, Shape) and stub.shape == out.shape and stub.value == "host value"
    assert Timing().value(stub) == "host value" and Full().value(out) is out
    with pytest.raises(AssertionError, match="closed form"):
        Full().run(matmul, a, b, macs=104)
    assert Full().run(matmul, a, b, macs=105).shape == (5, 3)
    assert Timing().offline(np.linalg.inv, a, like="skipped") == "skipped"
    assert Shape((4, 2), np.int64)[1].shape == (2,) and Shape((4, 2), np.int64).size == 8
    with pytest.raises(ValueError, match="mode must be one of"):
        make_mode("fast")


def test_trace_keeps_the_old_columns_first() -> None:
    old = ["protocol", "seed", "round", "time_s", "accuracy", "loss", "bits_up", "bits_down", "device_macs",
           "server_macs", "retransmissions", "used"]
    assert list(COLUMNS[:len(old)]) == old
    assert {"event", "dropped", "decode_failed"} <= set(COLUMNS)


def test_record_update_rows_split_the_round_counters() -> None:
    def body(self):
        yield from self.net.gather(self.devices[:2], work, kind="g")
        self.record("update")
        yield from self.net.gather(self.devices[2:], work, kind="g")
        return None
    p = run(body)
    events = [r["event"] for r in p.trace]
    assert events == ["phase", "update", "round"]
    assert p.trace[1]["device_macs"] == 2000 and p.trace[2]["device_macs"] == 4000
    with pytest.raises(ValueError, match="event must be one of"):
        p.record("epoch")


class Prepared:
    """A non-array object a step returns (like a prepared matrix)."""

    def __init__(self, a):
        self.a = a
        self.size = a.size


def prepare_op(a):
    return Prepared(matmul(a, np.eye(a.shape[1])))


def apply_op(p, x):
    return matmul(p.a, x)


def test_timing_opaque_outputs_are_rebuilt_from_zero_operands() -> None:
    a, x = np.ones((3, 4)), np.ones((4, 2))
    with MacMeter() as full:
        y = Full().run(apply_op, Full().run(prepare_op, a), x)
    t = Timing()
    with MacMeter() as timing:
        stub = t.run(apply_op, t.run(prepare_op, Shape.like(a)), Shape.like(x))
    assert full.macs == timing.macs == 3 * 4 * 4 + 3 * 4 * 2
    assert isinstance(stub, Shape) and stub.shape == y.shape


def test_gather_result_makes_its_results_on_first_use() -> None:
    from types import SimpleNamespace
    nodes = [SimpleNamespace(index=i) for i in (5, 3, 9)]
    values = np.arange(6.0).reshape(3, 2)
    r = GatherResult(dropped=[nodes[1]])
    r._arrived(nodes, values, [2, 0], [9, 5])
    assert r.indices == [9, 5]
    assert [(n.index, v.tolist()) for n, v in r] == [(9, [4.0, 5.0]), (5, [0.0, 1.0])]
    assert r.nodes == [nodes[2], nodes[0]] and len(r) == 2 and r[1][0] is nodes[0]
    assert r.indices == [9, 5]                         # after the results were made: from them
    r._arrived(nodes, values, [1], [3])
    r.results = [(nodes[0], "x")]                      # an assignment replaces what was not made yet
    assert r.indices == [5] and r.values == ["x"]
    assert GatherResult().indices == [] and GatherResult(results=[(nodes[1], 1)]).indices == [3]
