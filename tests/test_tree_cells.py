"""The ``tree`` backend on shared round-robin cells (:mod:`fednet.sim.engine.backends.tree_cells`) equals the SimPy
processes, bit for bit.

CodedSecAgg in timing mode (the tree of Sec. VI-D, eqs. 14-15; ``k' = z + 1`` of ``n'`` roots, so the late roots'
transfers are cancelled on the air) runs on several cell layouts with the ``tree`` backend allowed and disallowed:
the trace (floats by ``repr``), the final model, the keyed-draw counters, the counters, every device's ``received``
and every cell air's state (idle, the same number of transfers) must be equal, and the engine must record the tree
backend as taken.  Where SimPy's order of simultaneous events would decide (identical devices without loss and with
deterministic compute), where the cells are proportional fair or busy, and in full mode (no batch), the backend
declines with its reason and the reference gives the same run.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fednet.sim.engine.backends.tree as tree_backend
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.engine.backends.tree_cells import tree_cells_reason
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_cells, lte_star
from fednet.topologies.radio import radio_star
from test_fast_path import engine
from test_pinned_traces import SECRET_SEED, digits_task

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends

STEP = "tree_aggregate 'tree_share'"
RATES = [2e6, 5e5, 1e6, 3e6, 7.5e5, 2.5e5]


def _cells(D: int, n_cells: int, *, packet_bits: int | None = None, **kw):
    return lambda: lte_cells(D, n_cells=n_cells, loss=0.1, packet_bits=packet_bits,
                             device_mac_rates=[RATES[i % 6] for i in range(D)], **kw)


def _mix(D: int, n_cells: int):
    """Every other device in one of ``n_cells`` cells, the rest on their own dedicated links."""
    def graph():
        g = lte_star(D, loss=0.1, device_mac_rates=[RATES[i % 6] for i in range(D)],
                     uplink_bps=[2e6 * (1 + i % 3) for i in range(D)])
        devices = [v for v, a in g.nodes(data=True) if a.get("role") == "device"]
        for i, v in enumerate(devices):
            if i % 2:
                g.nodes[v]["cell"] = i % n_cells
        g.graph["cell_scheduler"] = "round_robin"
        return g
    return graph


def _radio(D: int, n_cells: int):
    return lambda: radio_star(D, n_cells=n_cells, rng=np.random.default_rng(7),
                              device_mac_rates=[RATES[i % 6] for i in range(D)])


def _csa(graph, params: dict, rounds: int, *, compute=None, dropout: float = 0.0, mode: str = "timing"):
    def make():
        sim = Simulation(graph(), 3, device_compute=compute or ShiftedExponential(0.5), secret_seed=SECRET_SEED,
                         availability=BernoulliDropout(dropout) if dropout else None, record_views=False)
        from fednet.protocols.codedsecagg import CodedSecAgg
        proto = CodedSecAgg(sim, digits_task(sim.n_devices, 10, "noniid"), {"mode": mode, **params}, label="csa")
        proto.run(rounds)
        return proto
    return make


def _snapshot(proto) -> tuple:
    """Everything the replay must reproduce: trace, final model, keyed-draw counters, counters, every device's
    ``received``, and each cell air's state (transfers in progress, virtual time, transfers made so far)."""
    sim = proto.sim
    rows = [{k: repr(v) for k, v in row.items()} for row in proto.trace]
    draws = {k: v[1].tolist() for k, v in sim.streams._entries.items()}
    received = [repr(getattr(dev.state, "received", None)) for dev in proto.devices]
    airs = [(a.active, getattr(a, "_virtual", None), getattr(a, "transfers", None)) for pair in sim.cells.values()
            for a in pair]
    return (rows, repr(np.asarray(proto.theta).tolist()), draws, repr(dataclasses.asdict(sim.counters)), received,
            airs)


def _both(make, monkeypatch) -> tuple[tuple, tuple, object, object]:
    """Runs with every backend allowed and with the ``tree`` backend disallowed (the reference processes)."""
    engine(monkeypatch)
    on = make()
    engine(monkeypatch, ("tree",))
    off = make()
    assert off.sim.engine_paths.count("tree") == 0
    return _snapshot(on), _snapshot(off), on.sim, off.sim


def _taken(sim) -> int:
    """Rounds whose tree step the ``tree`` backend ran (the engine's recorded paths)."""
    return sim.engine_paths.counts.get(("tree", STEP, "tree"), 0)


def _reasons(sim) -> str:
    return " | ".join(reason for _, _, reason in sim.engine_paths.reasons)


@pytest.mark.parametrize("graph,params,dropout", [
    (_cells(16, 1), dict(z=1, groups=2), 0.0),                          # one cell: every transfer shares it
    (_cells(24, 3), dict(z=1, groups=4), 0.0),                          # children in two steps: the downlink's queue
    (_cells(24, 4), dict(z=1, groups=3), 0.0),                          # N not a power of two
    (_cells(24, 4), dict(z=1, groups=4), 0.0),                          # the groups are the cells
    (_cells(32, 4, packet_bits=2000), dict(z=1, groups=8), 0.0),        # Fig. 3's tree, packets
    (_cells(40, 2), dict(z=2, groups=4, k_prime=4), 0.0),               # k' = 4 of 10 roots
    (_cells(24, 2), dict(z=1, groups=4), 0.15),                         # absentees: incomplete subtrees drop out
    (_mix(24, 2), dict(z=1, groups=4), 0.0),                            # cells and dedicated links mixed
    (_radio(24, 3), dict(z=1, groups=4), 0.0),                          # rates and losses from the channel
])
def test_tree_on_cells_replays_the_reference(graph, params, dropout, monkeypatch) -> None:
    on, off, s_on, _ = _both(_csa(graph, params, 5, dropout=dropout), monkeypatch)
    assert _taken(s_on) >= 4, (s_on.engine_paths.counts, _reasons(s_on))
    assert s_on.cells and all(active == 0 and virtual == 0.0 and n > 0 for active, virtual, n in on[-1])
    for a, b in zip(on, off):
        assert a == b


def test_the_cut_cancels_transfers_on_the_air(monkeypatch) -> None:
    """The replayed rounds really cut the tree short: of ``n' = 6`` roots only ``k' = 2`` are awaited, so in every
    round some devices never start their upload (fewer keyed uplink draws than devices), and some uploads start but
    are cancelled on the air (more uplink draws than uploads ended)."""
    from fednet.sim.network import Message
    from fednet.sim.rng import purpose_id

    make = _csa(_cells(24, 2), dict(z=1, groups=4), 3)
    on, off, s_on, _ = _both(make, monkeypatch)
    assert on == off and _taken(s_on) == 3
    engine(monkeypatch)
    proto = make()
    bits = Message(0, 1, "tree_share", None, proto._size, proto._bits).bits
    uplink = purpose_id("uplink")
    started = {r: int(v[1].sum()) for (pid, r), v in proto.sim.streams._entries.items() if pid == uplink and r > 0}
    ended = {row["round"]: row["bits_up"] // bits for row in proto.trace if row["round"] > 0}
    assert sorted(started) == sorted(ended) == [1, 2, 3]
    assert all(started[r] < 24 for r in started)
    assert any(started[r] > ended[r] for r in started), (started, ended)


def test_a_tree_without_download_replays_the_reference(monkeypatch) -> None:
    """``tree_aggregate`` without a download (every node computes at the start): after a round, CodedSecAgg's tree
    climbs again from the shares of the epsilon each device holds; both engines give the same arrivals, time, draws
    and counters."""
    def make():
        proto = _csa(_cells(24, 3), dict(z=1, groups=4), 1)()
        out = {}

        def step():
            out["got"] = yield from proto.net.tree_aggregate(
                proto.column_tree, proto._eq13, proto._add, kind="tree_share", root_kind="master_share", first=2,
                n_elements=proto._size, element_bits=proto._bits, alike=True)
            out["t"] = proto.env.now                      # (the reference's stale air timeouts run on after it)
        proto.env.process(step())
        proto.env.run()
        got = out["got"]
        return proto, (repr(out["t"]), [(node.index, repr(value)) for node, value in got.results],
                       sorted(node.index for node in got.cancelled))

    engine(monkeypatch)
    on, got_on = make()
    engine(monkeypatch, ("tree",))
    off, got_off = make()
    assert _taken(on.sim) == 2 and _taken(off.sim) == 0
    assert got_on == got_off and len(got_on[1]) == 2
    assert _snapshot(on) == _snapshot(off)


def test_ties_are_left_to_simpy(monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute: every transfer of a level ends at one instant and two
    children's messages ask for one downlink together; the backend declines (nothing changed) and the reference
    gives the same run."""
    graph = lambda: lte_cells(16, n_cells=2, loss=0.0, device_mac_rates=[4e6] * 16)  # noqa: E731
    on, off, s_on, _ = _both(_csa(graph, dict(z=1, groups=4), 3, compute=Deterministic()), monkeypatch)
    assert _taken(s_on) == 0
    assert "SimPy's order decides" in _reasons(s_on)
    for a, b in zip(on, off):
        assert a == b


@pytest.mark.parametrize("seed", [0, 1])
def test_tie_heavy_layouts_replay_or_decline_exactly(seed, monkeypatch) -> None:
    """Drawn small layouts where events often coincide (deterministic compute mostly, rates from two or three
    values, often no loss): whether the backend replays a round or declines it (SimPy's order of simultaneous events
    deciding), the run equals the reference's; both happen."""
    rng = np.random.default_rng(seed)
    taken = declined = 0
    for _ in range(12):
        groups = int(rng.choice([2, 4]))
        D = groups * int(rng.choice([3, 4]))
        n_cells = int(rng.integers(1, 4))
        mac = [float(rng.choice([1.3e6, 2.9e6])) for _ in range(D)]
        up = [float(rng.choice([1.1e6, 2.3e6, 7.1e5])) for _ in range(D)]
        down = [float(rng.choice([2.7e6, 3.3e6])) for _ in range(D)]
        loss = 0.0 if rng.random() < 0.7 else 0.1
        compute = Deterministic() if rng.random() < 0.7 else None

        def graph(D=D, n_cells=n_cells, loss=loss, mac=mac, up=up, down=down):
            return lte_cells(D, n_cells=n_cells, loss=loss, device_mac_rates=mac, uplink_bps=up, downlink_bps=down)
        on, off, s_on, _ = _both(_csa(graph, dict(z=1, groups=groups), 3, compute=compute), monkeypatch)
        assert on == off
        taken += _taken(s_on)
        declined += 3 - _taken(s_on)
    assert taken and declined, (taken, declined)


def test_proportional_fair_cells_decline(monkeypatch) -> None:
    """Proportional-fair cells are not replayed: the reason is recorded and the reference runs."""
    graph = _cells(16, 2, scheduler="proportional_fair", snr_db=10.0)
    on, off, s_on, _ = _both(_csa(graph, dict(z=1, groups=2), 3), monkeypatch)
    assert _taken(s_on) == 0
    assert "another scheduler than round robin" in _reasons(s_on)
    assert on == off


def test_an_energy_model_keeps_the_reference(monkeypatch) -> None:
    """The backends do not account the radios' energy: with an energy model the tree backend declines and the
    reference runs (the joules in the trace are the reference's)."""
    energy = {"tx_power_w": 0.2, "rx_power_w": 0.05, "kappa": 1e-28, "cpu_hz": 2e9, "cycles_per_mac": 3.0}
    on, off, s_on, _ = _both(_csa(_cells(16, 2, energy=energy), dict(z=1, groups=2), 2), monkeypatch)
    assert _taken(s_on) == 0 and "energy model" in _reasons(s_on)
    assert on == off and float(on[0][-1]["energy_j"]) > 0


def test_full_mode_declines_for_want_of_a_batch(monkeypatch) -> None:
    on, off, s_on, _ = _both(_csa(_cells(16, 2), dict(z=1, groups=2), 2, mode="full"), monkeypatch)
    assert _taken(s_on) == 0
    assert "the step gives no batch" in _reasons(s_on)
    assert on == off


def test_a_busy_cell_is_refused() -> None:
    """A transfer in progress on a node's cell air: the replay would not see it, so the step is refused."""
    sim = Simulation(_cells(4, 1)(), 1, secret_seed=SECRET_SEED, record_views=False)
    kids, parent, taking_part = {0: [1], 1: []}, {0: None, 1: 0}, [0, 1]

    class NetStub:
        pass
    net = NetStub()
    net.sim = sim
    assert tree_cells_reason(net, kids, parent, taking_part) is True
    air = sim.devices[3].uplink.air

    def hold():
        yield from air.transmit(1.0)
    sim.env.process(hold())
    sim.env.run(until=0.5)
    assert air.active == 1
    assert tree_cells_reason(net, kids, parent, taking_part) == "a node's cell has a transfer in progress"
    sim.env.run()
    assert air.active == 0 and tree_cells_reason(net, kids, parent, taking_part) is True


def test_the_replay_is_tried_on_cells_and_the_star_keeps_replay_tree(monkeypatch) -> None:
    """On cells the tree backend calls replay_tree_cells, on the star replay_tree (unchanged)."""
    called: list[str] = []
    for name in ("replay_tree", "replay_tree_cells"):
        real = getattr(tree_backend, name)

        def spy(*a, _real=real, _name=name, **k):
            called.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(tree_backend, name, spy)
    engine(monkeypatch)
    _csa(_cells(16, 2), dict(z=1, groups=2), 2)()
    assert called == ["replay_tree_cells"] * 2
    called.clear()
    _csa(lambda: lte_star(16, loss=0.1, device_mac_rates=[2e6] * 16), dict(z=1, groups=2), 2)()
    assert called == ["replay_tree"] * 2
