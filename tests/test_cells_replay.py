"""Shared cells without processes (issue 28, item 3 at scale): :func:`shared_finishes` gives the times the reference
:class:`~fednet.sim.cells.SharedAir` gives, bit for bit, and the vectorised gather replays a whole round on cells
with the reference's trace; where SimPy's order would decide (an arrival at the instant the air's timeout fires) it
says so and the reference runs."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from factories import make_task
from fednet.protocol import registry
from fednet.sim.cells import SharedAir
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.engine import EngineConfig
from fednet.sim.engine.backends.airtime import shared_finishes
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_cells
from fednet.topologies.radio import radio_star

pytestmark = pytest.mark.backends


def _reference(starts: np.ndarray, airtimes: np.ndarray) -> np.ndarray:
    """The transfers on one SharedAir in SimPy, each started by its own process at its time."""
    env = simpy.Environment()
    air = SharedAir(env, "cell")
    out = np.full(len(starts), np.nan)

    def one(k: int):
        yield env.timeout(float(starts[k]))
        yield from air.transmit(float(airtimes[k]))
        out[k] = env.now

    for k in range(len(starts)):
        env.process(one(k))
    env.run()
    return out


def test_shared_finishes_equal_sharedair_bit_for_bit_on_random_transfers() -> None:
    """300 drawn sets: starts on a coarse grid (ties among arrivals), airtimes with repeats and zeros."""
    rng = np.random.default_rng(28)
    decided = 0
    for _ in range(300):
        m = int(rng.integers(1, 25))
        starts = rng.integers(0, 6, m) * float(rng.choice([0.1, 0.25, 1.0])) + float(rng.uniform(0, 3))
        airtimes = rng.choice([0.0, 0.05, 0.3, 1.0, 2.5], m) if rng.random() < 0.5 else rng.exponential(1.0, m)
        got = shared_finishes(starts, airtimes)
        if got is None:
            continue
        decided += 1
        want = _reference(starts, airtimes)
        assert got.tolist() == want.tolist(), (starts, airtimes)
    assert decided >= 200                         # most draws are decided; the rest are the undecidable ties


def test_the_closed_forms_and_an_undecidable_tie() -> None:
    """n equal transfers from 0 end together at n w; one joining at t1 during another's w: t1 + 2 (w - t1) and 2 w
    (tests/test_cells.py's closed forms); an arrival exactly when the air's timeout fires is not decided."""
    assert shared_finishes(np.zeros(4), np.full(4, 0.2)).tolist() == [0.8] * 4
    assert shared_finishes(np.array([0.0, 0.05]), np.array([0.2, 0.2])) == pytest.approx([0.35, 0.4], rel=1e-12)
    assert shared_finishes(np.array([0.0, 0.5]), np.array([0.5, 0.5])) is None      # B arrives as A's timeout fires
    with pytest.raises(ValueError, match="airtimes"):
        shared_finishes(np.zeros(2), np.array([1.0, -1.0]))


def _run(engine: str, protocol: str, graph, *, compute=None, epochs: int = 6, params=None, views: bool = False):
    D = graph.number_of_nodes() - 1
    sim = Simulation(graph, 4, device_compute=compute or ShiftedExponential(0.5), secret_seed=11,
                     record_views=views, engine=EngineConfig.parse(engine))
    proto = registry.get(protocol)(sim, make_task(D=D), params or {})
    return proto.run(epochs), proto, sim


def _cells(D: int, n_cells: int, loss: float = 0.1):
    rates = [2e6, 5e5, 1e6, 3e6, 7.5e5, 2.5e5]
    return lte_cells(D, n_cells=n_cells, loss=loss, device_mac_rates=[rates[i % 6] for i in range(D)])


@pytest.mark.parametrize("protocol,params", [("conventional", {}), ("conventional", {"minibatch_fraction": 0.5})])
@pytest.mark.parametrize("D,n_cells", [(6, 1), (12, 3), (20, 4)])
def test_a_gather_on_cells_replays_the_reference_trace(protocol, params, D, n_cells) -> None:
    ref, p_ref, _ = _run("reference", protocol, _cells(D, n_cells), params=params)
    got, p_got, s_got = _run("", protocol, _cells(D, n_cells), params=params)
    assert got == ref                                  # every column: times, counters, accuracy, loss
    assert np.array_equal(p_got.theta, p_ref.theta)
    paths = {key[2] for key in s_got.engine_paths.counts if key[0] == "gather"}
    assert paths == {"gather", "batched"}, s_got.engine_paths.counts      # the gather backend, its batched path


def test_radio_cells_and_recorded_views_replay_the_reference() -> None:
    g = lambda: radio_star(16, n_cells=2, rng=np.random.default_rng(5), device_mac_rates=[1e6] * 16)  # noqa: E731
    ref, _, s_ref = _run("reference", "conventional", g(), views=True)
    got, _, s_got = _run("", "conventional", g(), views=True)
    assert got == ref
    for a, b in zip(s_ref.devices, s_got.devices):
        assert [(m.kind, m.hops) for m in a.view] == [(m.kind, m.hops) for m in b.view]
    assert [(m.src, m.kind, m.hops) for m in s_ref.server.view] == [(m.src, m.kind, m.hops) for m in s_got.server.view]
    assert {key[2] for key in s_got.engine_paths.counts if key[0] == "gather"} == {"gather", "batched"}


def test_equal_devices_in_one_cell_tie_and_the_reference_runs() -> None:
    """Deterministic compute, no loss, equal rates: every upload starts at one instant and all end together (tied
    arrivals): the replay declines with its reason and the reference gives the trace."""
    g = lambda: lte_cells(6, n_cells=1, loss=0.0, device_mac_rates=[1e6] * 6)  # noqa: E731
    ref, _, _ = _run("reference", "conventional", g(), compute=Deterministic())
    got, _, s_got = _run("", "conventional", g(), compute=Deterministic())
    assert got == ref
    reasons = " ".join(reason for _, _, reason in s_got.engine_paths.reasons)
    assert "tied arrival times" in reasons and s_got.engine_paths.count("reference", "gather") > 0


def test_a_gather_without_a_batch_on_cells_runs_the_reference_with_the_reason() -> None:
    got, _, s_got = _run("", "fedavg", _cells(8, 2), params={"local_steps": 2})
    ref, _, _ = _run("reference", "fedavg", _cells(8, 2), params={"local_steps": 2})
    assert got == ref
    assert "replayed by the vectorised (batched) gather only" in " ".join(r for _, _, r in s_got.engine_paths.reasons)


@pytest.mark.parametrize("D,n_cells,drop,fast", [(8, 2, 2, False), (12, 1, 5, False), (20, 4, 3, False),
                                                  (12, 1, 6, True)])
def test_first_k_on_cells_replays_the_reference(D, n_cells, drop, fast) -> None:
    """Conventional FL dropping the slowest: the cancelled uploads leave the air at the k-th arrival in the
    reference, and the replay gives its trace. ``fast``: devices that compute in no time, so the next round's
    uploads would meet the cancelled ones on the air if they stayed (they do not)."""
    def graph():
        if not fast:
            return _cells(D, n_cells)
        return lte_cells(D, n_cells=n_cells, loss=0.1, device_mac_rates=[1e13] * D,
                         uplink_bps=[1e6 * (1 + i % 4) for i in range(D)])
    got, p_got, s_got = _run("", "conventional", graph(), params={"drop_slowest": drop}, epochs=8)
    ref, p_ref, _ = _run("reference", "conventional", graph(), params={"drop_slowest": drop}, epochs=8)
    assert got == ref and np.array_equal(p_got.theta, p_ref.theta)
    assert s_got.engine_paths.count("batched", "gather") == 8


def test_a_cancelled_transfer_leaves_the_air_at_once() -> None:
    """A and B (0.2 s of airtime each) from 0; B is cancelled at 0.1 s, when A has had 0.05 s of service: A then
    has the air alone and ends at 0.1 + 0.15 = 0.25 s (not at 0.4 s, as if B still held its share). The air is idle
    afterwards and a new transfer takes exactly its own airtime."""
    env = simpy.Environment()
    air = SharedAir(env, "cell")
    ends: dict[str, float] = {}

    def send(name: str, w: float):
        try:
            yield from air.transmit(w)
            ends[name] = env.now
        except simpy.Interrupt:
            ends[name] = -env.now

    a, b = env.process(send("A", 0.2)), env.process(send("B", 0.2))

    def cancel():
        yield env.timeout(0.1)
        b.interrupt("cancelled")
        yield a
        assert air.active == 0
        yield env.timeout(1.0)
        start = env.now
        yield from air.transmit(0.3)
        ends["C"] = env.now - start

    env.process(cancel())
    env.run()
    assert ends["A"] == pytest.approx(0.25, rel=1e-12) and ends["B"] == -0.1
    assert ends["C"] == pytest.approx(0.3, rel=1e-12)


def test_a_cancelled_transfer_leaves_a_proportional_fair_air_too() -> None:
    """The same under proportional fair at 10 dB: two transfers move G_2 / 2 of their airtime per second; B cancelled
    at 0.1 s leaves A with 0.2 - 0.1 G_2 / 2 to send alone (G_1 = 1)."""
    from fednet.sim.cells import ProportionalFairAir, pf_gain

    env = simpy.Environment()
    air = ProportionalFairAir(env, "cell")
    ends: dict[str, float] = {}

    def send(name: str):
        try:
            yield from air.transmit(0.2, 10.0)
            ends[name] = env.now
        except simpy.Interrupt:
            ends[name] = -env.now

    env.process(send("A"))
    b = env.process(send("B"))

    def cancel():
        yield env.timeout(0.1)
        b.interrupt("cancelled")

    env.process(cancel())
    env.run()
    g2 = float(pf_gain(2, 10.0))
    assert ends["B"] == -0.1 and air.active == 0
    assert ends["A"] == pytest.approx(0.1 + (0.2 - 0.1 * g2 / 2), rel=1e-9)


def _coded(engine: str, graph, params: dict, epochs: int = 5):
    D = graph.number_of_nodes() - 1
    sim = Simulation(graph, 2, device_compute=ShiftedExponential(0.5), secret_seed=11,
                     engine=EngineConfig.parse(engine))
    proto = registry.get("codedpaddedfl")(sim, make_task(D=D), params)
    return proto.run(epochs), sim


@pytest.mark.parametrize("D,n_cells,groups,mode", [(12, 1, 2, "timing"), (16, 2, 4, "timing"), (20, 4, 2, "timing"),
                                                   (12, 3, 3, "full")])
def test_groups_on_cells_replay_the_reference(D, n_cells, groups, mode) -> None:
    """CodedPaddedFL with grouping (each group waits for its first k, then decodes) in shared cells: the groups'
    transfers share the cells' air, a group's cancelled transfers leave it at its k-th arrival, and the replay gives
    the reference's trace bit for bit."""
    params = {"alpha": 2, "groups": groups, "mode": mode}
    ref, _ = _coded("reference", _cells(D, n_cells), params)
    got, s_got = _coded("", _cells(D, n_cells), params)
    assert got == ref
    assert s_got.engine_paths.count("groups", "groups") == 5, s_got.engine_paths.counts


def test_groups_on_cells_match_views_and_draws(monkeypatch) -> None:
    """Beyond the trace: every node's view (kinds, ends, sizes, send and delivery times, hops) and the keyed-draw
    counters are the reference's (tests/test_fast_path.py's snapshot), with views recorded."""
    from test_fast_path import engine, snapshot
    from fednet.protocols.codedpaddedfl import CodedPaddedFL

    def make():
        sim = Simulation(_cells(12, 2), 3, device_compute=ShiftedExponential(0.5), secret_seed=11, record_views=True)
        proto = CodedPaddedFL(sim, make_task(D=12), {"alpha": 2, "groups": 3, "mode": "timing"})
        proto.run(4)
        return proto
    engine(monkeypatch)
    on = make()
    engine(monkeypatch, ("groups",))
    off = make()
    assert on.sim.engine_paths.count("groups", "groups") == 4 and off.sim.engine_paths.count("groups") == 0
    assert snapshot(on) == snapshot(off)


def test_a_follow_up_that_uses_a_replayed_cell_is_caught() -> None:
    """A group's ``then`` sends to a device of another group in the same cell while that group's transfers are still
    replayed on its air: the replayed times would be wrong, so the step raises a named EngineError."""
    from fednet.protocols.codedpaddedfl import CodedPaddedFL
    from fednet.sim.engine.results import EngineError

    sim = Simulation(_cells(12, 1), 3, device_compute=ShiftedExponential(0.5), secret_seed=11)
    proto = CodedPaddedFL(sim, make_task(D=12), {"alpha": 2, "groups": 3, "mode": "timing"})
    proto.run(0)

    def then(g, result):
        if g == 0:                                       # while the other groups' uploads hold the cell's uplink
            yield from proto.net.send(proto.devices[proto.groups[0][-1]], proto.server, np.zeros(10_000),
                                      kind="note", element_bits=32)

    def step():
        groups = [[proto.devices[i] for i in group] for group in proto.groups]
        yield from proto.net.gather_groups(groups, proto._device_epoch, kind="coded_gradient", first=[1, 4, 4],
                                           then=then, download=np.zeros((3, 3)), download_kind="epsilon",
                                           download_bits=32, upload_bits=32)
    proto.env.process(step())
    with pytest.raises(EngineError, match="follow-up step used a shared cell"):
        proto.env.run()


def test_stale_air_timeouts_left_by_the_reference_do_not_block_the_next_replay() -> None:
    """A round the reference runs on cells leaves its airs' stale timeouts queued (no-ops when they fire); the
    backends' "nothing else scheduled" check (``events.alone``) must see through them, or every later round would
    run the reference too, while a transfer in progress (a live timeout) still blocks it."""
    from fednet.sim.engine.events import alone
    from fednet.sim.network import Message

    sim = Simulation(lte_cells(2, n_cells=1, uplink_bps=1e6, downlink_bps=1e6, loss=0.0, header_overhead=0.0,
                               device_mac_rates=[1e6] * 2), 0, device_compute=ShiftedExponential(0.5))
    env = sim.env

    def upload(dev: int):
        try:
            yield from sim.transfer(Message(dev, sim.server.index, "x", None, 200_000, 1))
        except simpy.Interrupt:
            pass

    env.process(upload(0))
    b = env.process(upload(1))
    env.run(until=0.05)
    assert alone(sim) is not True                      # both on the air: its live timeout is someone's wait
    b.interrupt("cancelled")                           # leaves the air: the timeout armed for two becomes stale
    env.run(until=0.3)                                 # device 0 ends alone at 0.05 + (0.2 - 0.025) = 0.225 s
    stale = [e for e in env._queue if e[3].callbacks]
    assert stale and all(cb.stale for e in stale for cb in e[3].callbacks)
    assert alone(sim) is True
