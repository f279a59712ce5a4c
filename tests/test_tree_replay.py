"""``Net.tree_aggregate``'s replay (:mod:`fednet.sim.engine.backends.tree`) equals the SimPy processes, bit for bit.

CodedSecAgg in timing mode (the tree of Sec. VI-D, eqs. 14-15, with a batch for eq. 13) runs with
the ``tree`` backend allowed and disallowed and must give the same trace (floats by ``repr``), the
same keyed-draw counters, the same counters and the same ``received`` on every device; the replay must really be
taken where no simultaneous events decide, and must refuse (and leave the step to the processes, with the same
results) where they do: identical devices without loss and with deterministic compute make every time tie.
"""

from __future__ import annotations

import dataclasses

import pytest

import fednet.sim.engine.backends.tree as tree_backend
from fednet.sim.engine.forest import forest_parts
from test_fast_path import engine
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_pinned_traces import SECRET_SEED, digits_task

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def _csa(D: int, params: dict, rounds: int, *, ties: bool = False, dropout: float = 0.0, seed: int = 3,
         packet_bits: int | None = None):
    from fednet.protocols.codedsecagg import CodedSecAgg

    def make():
        if ties:
            g = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D)
            sim = Simulation(g, seed, device_compute=Deterministic(), secret_seed=SECRET_SEED, record_views=False)
        else:
            g = lte_star(D, loss=0.1, device_mac_rates=[1e6 * (1 + (i % 5)) for i in range(D)])
            g.graph["packet_bits"] = packet_bits
            sim = Simulation(g, seed, device_compute=ShiftedExponential(0.5), secret_seed=SECRET_SEED,
                             availability=BernoulliDropout(dropout) if dropout else None, record_views=False)
        proto = CodedSecAgg(sim, digits_task(D, 10, "noniid"), {"mode": "timing", **params}, label="csa")
        proto.run(rounds)
        return proto
    return make


def _snapshot(proto) -> tuple:
    rows = [{k: repr(v) for k, v in row.items()} for row in proto.trace]
    draws = {k: v[1].tolist() for k, v in proto.sim.streams._entries.items()}
    received = [repr(getattr(dev.state, "received", None)) for dev in proto.devices]
    return rows, draws, repr(dataclasses.asdict(proto.sim.counters)), received


def run_both(make, monkeypatch) -> tuple[tuple, tuple, int, int]:
    """Snapshots with the replay on and off; how often it was tried, and how often it was taken, with it on."""
    tried, taken = [0], [0]
    real = tree_backend.replay_tree

    def counting(*a, **k):
        tried[0] += 1
        got = real(*a, **k)
        taken[0] += not isinstance(got, str)
        return got
    monkeypatch.setattr(tree_backend, "replay_tree", counting)
    engine(monkeypatch)
    on = _snapshot(make())
    n_tried, n_taken = tried[0], taken[0]
    engine(monkeypatch, ("tree",))
    off = _snapshot(make())
    assert tried[0] == n_tried
    return on, off, n_tried, n_taken


@pytest.mark.parametrize("D,params,dropout,packet_bits", [
    (16, dict(z=1, groups=2), 0.0, None),
    (24, dict(z=1, groups=4), 0.0, None),                       # children in two steps: the downlink's queue
    (24, dict(z=1, groups=3), 0.0, None),                       # N not a power of two
    (32, dict(z=1, groups=8), 0.0, 2000),                       # Fig. 3's tree, packets
    (40, dict(z=2, groups=4, k_prime=4), 0.0, None),
    (24, dict(z=1, groups=4), 0.15, None),                      # absentees: incomplete subtrees drop out
    (24, dict(z=1, groups=4, sharing_schedule="relay_asap", charge_encoding=False, widen_compute=True), 0.0, None),
])
def test_replay_equals_processes(D: int, params: dict, dropout: float, packet_bits: int | None, monkeypatch) -> None:
    on, off, tried, taken = run_both(_csa(D, params, 4, dropout=dropout, packet_bits=packet_bits), monkeypatch)
    assert taken >= 3, (tried, taken)
    for a, b in zip(on, off):
        assert a == b


@pytest.mark.parametrize("D,params", [(12, dict(z=1, groups=2)), (16, dict(z=1, groups=4))])
def test_ties_are_left_to_simpy(D: int, params: dict, monkeypatch) -> None:
    """Every time ties: the replay refuses (nothing changed) and the processes give the same round."""
    on, off, tried, taken = run_both(_csa(D, params, 3, ties=True), monkeypatch)
    assert tried >= 3 and taken == 0
    for a, b in zip(on, off):
        assert a == b


def test_full_mode_and_views_keep_the_processes(monkeypatch) -> None:
    """No batch (full mode) or views recorded: the replay is not tried."""
    from fednet.protocols.codedsecagg import CodedSecAgg

    tried = [0]
    real = tree_backend.replay_tree

    def counting(*a, **k):
        tried[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(tree_backend, "replay_tree", counting)
    for mode, views in (("full", False), ("timing", True)):
        g = lte_star(16, loss=0.1, device_mac_rates=[2e6] * 16)
        sim = Simulation(g, 1, device_compute=ShiftedExponential(0.5), secret_seed=SECRET_SEED, record_views=views)
        CodedSecAgg(sim, digits_task(16, 10, "noniid"), {"mode": mode, "z": 1, "groups": 2}, label="csa").run(2)
    assert tried[0] == 0


def test_tree_parts_are_checked_and_follow_a_rewired_tree() -> None:
    """The forest's roots and subtrees are kept per tree, recomputed when its edges change in place; a cycle or
    a node with two parents is refused."""
    import networkx as nx

    proto = _csa(8, dict(z=1, groups=2), 0)()
    tree = nx.DiGraph([(1, 0), (2, 0), (4, 3)])
    roots, members, root_of, kids, parent, _nodes = forest_parts(proto.net._tree_parts_of, tree, False)
    assert roots == [0, 3] and members[0] == {0, 1, 2} and root_of[4] == 3
    tree.remove_edge(2, 0)
    tree.add_edge(2, 3)                                  # the same counts, another tree
    roots, members, root_of, kids, parent, _nodes = forest_parts(proto.net._tree_parts_of, tree, False)
    assert members[0] == {0, 1} and members[3] == {2, 3, 4} and root_of[2] == 3
    assert kids[3] == [4, 2] and parent[2] == 3 and parent[3] is None   # children in step order (no steps: insertion)
    nx.set_edge_attributes(tree, {(2, 3): 0, (4, 3): 1}, "step")       # the same edges, other steps
    assert forest_parts(proto.net._tree_parts_of, tree, False)[3][3] == [2, 4]
    for bad in (nx.DiGraph([(0, 1), (1, 0)]), nx.DiGraph([(0, 1), (0, 2)])):
        with pytest.raises(ValueError, match="tree must be a forest"):
            forest_parts(proto.net._tree_parts_of, bad, False)


def test_a_combine_batch_that_miscounts_is_refused(monkeypatch) -> None:
    """combine_batch must meter the sum of the MACs it reports, as a step's batch must (CodedSecAgg's
    ``alike`` tree in timing mode, whose combine batch is :func:`fednet.sim.engine.results.alike_batches`')."""
    import fednet.protocol.primitives as primitives

    real = primitives.alike_batches

    def undercharged(fn, combine):
        batch, combine_batch = real(fn, combine)

        def miscounted(accs, parts):
            values, macs = combine_batch(accs, parts)
            return values, [m + 1 for m in macs]
        return batch, miscounted
    monkeypatch.setattr(primitives, "alike_batches", undercharged)
    with pytest.raises(AssertionError, match="combine_batch returned"):
        _csa(24, dict(z=1, groups=4), 2)()
