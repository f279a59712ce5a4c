"""The event-free path of ``gather`` / edgeless ``tree_aggregate`` equals the SimPy process path bit for bit.

Every scenario runs twice, with :data:`the gather backends <fednet.sim.engine.config.BACKENDS>` allowed and disallowed, and must give the
same trace (floats by ``repr``), the same messages in every node's view and relay list (kind, ends, sizes,
send and delivery times, hops) and the same keyed-draw counters; the fast path must really be taken.
Ties (deterministic compute, identical links, no loss) check SimPy's insertion order is reproduced.
"""

from __future__ import annotations

import numpy as np
import pytest

from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_pinned_traces import SCENARIOS, run_scenario, digits_task  # noqa: E402

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def snapshot(proto) -> tuple:
    """Trace, views, relays and draw counters of a finished run, as exact comparable values."""
    rows = [{k: repr(v) for k, v in row.items()} for row in proto.trace]

    def msgs(lst):
        return [(m.kind, m.src, m.dst, m.bits, repr(m.sent_at), repr(m.delivered_at), repr(m.hops)) for m in lst]
    views = [(msgs(n.view), msgs(n.relayed)) for n in proto.sim.nodes]
    draws = {k: v[1].tolist() for k, v in proto.sim.streams._entries.items()}
    return rows, views, draws


#: The backends each former module switch stood for (the switches are now the simulation's EngineConfig).
SWITCH = {"FAST_PATH": ("gather", "groups", "tree", "masked"), "BATCHED": ("batched",),
          "BULK_EXCHANGE": ("bundled", "cyclic", "relays", "masked"), "GROUPS_REPLAY": ("groups",),
          "TREE_REPLAY": ("tree",), "ROUND_REPLAY": ("masked",)}
#: The path whose count tells a backend ran (``sim.engine_paths``), by the name of the code it used to be.
COUNTED = {"_fast_rounds": "gather", "_bulk_bundled": "bundled", "_replay_relays": "relays", "_replay_cyclic": "cyclic",
           "_fast_groups": "groups", "_replay_vectorised": "batched", "replay_tree": "tree", "replay_round": "masked"}


def engine(monkeypatch, off=()) -> None:
    """Make every Simulation built from now on disallow the backends ``off`` (``$FEDNET_ENGINE``)."""
    monkeypatch.setenv("FEDNET_ENGINE", ",".join(f"-{b}" for b in off) or "all")


def run_both(make, monkeypatch, switch: str = "FAST_PATH", method: str = "_fast_rounds") -> tuple[tuple, tuple, int]:
    """Snapshots of ``make()`` with the backends of ``switch`` allowed and disallowed, and how often the backend
    named by ``method`` ran with them allowed (it must not run with them disallowed), from the run's engine paths."""
    path = COUNTED[method]
    engine(monkeypatch)
    proto = make()
    on, taken = snapshot(proto), proto.sim.engine_paths.count(path)
    engine(monkeypatch, SWITCH[switch])
    proto = make()
    off = snapshot(proto)
    assert proto.sim.engine_paths.count(path) == 0
    engine(monkeypatch)
    return on, off, taken


class Recorder:
    """Builds a pinned scenario and keeps the protocol object."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self):
        import importlib
        from test_pinned_traces import CLASSES, lossy_sim
        proto_name, params, D, d, rounds, seed, dropout, kind = SCENARIOS[self.name]
        module, cls_name = CLASSES[proto_name]
        cls = getattr(importlib.import_module(module), cls_name)
        proto = cls(lossy_sim(D, seed, dropout), digits_task(D, d, kind), params, label=self.name)
        proto.run(rounds)
        return proto


FAST_SCENARIOS = ["conventional", "conventional_drop2", "conventional_dropout", "cfl", "approx_gc",
                  "codedsecagg_onegroup_z2_full", "codedsecagg_onegroup_z2_timing", "codedpaddedfl_relay_steps_full",
                  "lightsecagg_bundled_timing", "codedsecagg_dropout_timing", "codedpaddedfl_dropout_timing",
                  "lightsecagg_dropout_timing"]


#: the server works beside the devices (CFL's parity gradient; LightSecAgg's exchange): the general path is kept
GENERAL_ONLY = {"cfl", "lightsecagg_bundled_timing", "lightsecagg_dropout_timing",
                "codedsecagg_dropout_timing"}   # (groups = 2 / the exchange: equality still checked)


@pytest.mark.parametrize("name", FAST_SCENARIOS)
def test_fast_path_equals_processes(name: str, monkeypatch) -> None:
    fast, slow, calls = run_both(Recorder(name), monkeypatch)
    if name not in GENERAL_ONLY:
        assert calls > 0, f"{name}: the fast path was never taken"
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]


@pytest.mark.parametrize("proto_name,params", [
    ("conventional", dict(minibatch_fraction=0.5)),
    ("conventional", dict(minibatch_fraction=0.5, drop_slowest=3)),
    ("codedsecagg", dict(z=2, groups=1, mode="timing")),
])
def test_fast_path_ties(proto_name: str, params: dict, monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute: every time ties; SimPy's order must be kept."""
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    import fednet.protocols.codedsecagg  # noqa: F401
    D = 7

    def make():
        g = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D)
        sim = Simulation(g, 3, device_compute=Deterministic())
        proto = registry.get(proto_name)(sim, digits_task(D, 16, "iid"), params)
        proto.run(3)
        return proto
    fast, slow, calls = run_both(make, monkeypatch)
    assert calls > 0
    assert fast == slow
    used = [r["used"] for r in fast[0][1:]]
    assert all(u for u in used)


def test_vector_draws_equal_scalar_draws() -> None:
    """Streams.uniforms, negative_binomials_from_uniforms and transmission_times equal their scalar forms."""
    from fednet.sim.network import negative_binomials_from_uniforms, transmission_time, transmission_times
    from fednet.sim.rng import Streams, negative_binomial_from_uniform
    a, b = Streams(5, 40, width=3), Streams(5, 40, width=3)
    nodes = np.array([7, 3, 39, 0, 12])
    for _ in range(5):                                   # crosses block boundaries (width 3)
        vec = a.uniforms(nodes, "uplink", 2)
        assert vec.tolist() == [b.uniform(int(i), "uplink", 2) for i in nodes]
    assert a.uniform(8, "uplink", 2) == b.uniform(8, "uplink", 2)
    a.uniform(3, "uplink", 2), b.uniform(3, "uplink", 2)      # node 3 one draw ahead: its next one starts a new block
    for _ in range(2):                                   # the nodes' draws in two blocks at once
        vec = a.uniforms(nodes, "uplink", 2)
        assert vec.tolist() == [b.uniform(int(i), "uplink", 2) for i in nodes]
    for bad in ([1, 1], [1, 2, 2], [4, 2, 4]):
        with pytest.raises(ValueError, match="distinct"):
            a.uniforms(np.array(bad), "uplink", 2)
    rng = np.random.default_rng(0)
    m = 3000
    u, n, p = rng.random(m), rng.integers(1, 30, m), rng.choice([0.0, 0.05, 0.3, 0.95], m)
    u[:10] = 0.0
    want = [negative_binomial_from_uniform(float(x), int(y), float(z)) for x, y, z in zip(u, n, p)]
    assert negative_binomials_from_uniforms(u, n, p).tolist() == want
    for n1, p1 in ((1, 0.1), (7, 0.3), (29, 0.95), (3, 0.0)):    # one (n, p): the stored CDF's search
        from fednet.sim.rng import _nb_quantile_walk
        got = negative_binomials_from_uniforms(u, np.full(m, n1), np.full(m, p1))
        walk = [0 if p1 == 0.0 or x <= 0.0 else _nb_quantile_walk(float(x), n1, p1) for x in u]
        assert got.tolist() == walk
    bits = rng.integers(0, 10**6, m)
    bits[:5] = 0
    rates = rng.random(m) * 1e7 + 1.0
    for pb in (None, 1500):
        secs, extras = transmission_times(bits, rates, 0.1, p, pb, u)
        for t in range(0, m, 7):
            s, _, e = transmission_time(int(bits[t]), float(rates[t]), 0.1, float(p[t]), pb, float(u[t]))
            assert (secs[t], extras[t]) == (s, e)


def _eager_mailbox(monkeypatch) -> None:
    """One SimPy event per pair, env.all_of per wait (the mailbox backend disallowed)."""
    engine(monkeypatch, ("mailbox",))


@pytest.mark.parametrize("name", ["lightsecagg_bundled_full", "lightsecagg_bundled_timing",
                                  "lightsecagg_per_message_serial_timing", "lightsecagg_dropout_full"])
def test_lazy_mailbox_equals_eager(name: str, monkeypatch) -> None:
    """LightSecAgg's masks through the lazy Mailbox (O(N) events) give what one event per pair gave."""
    lazy = snapshot(Recorder(name)())
    _eager_mailbox(monkeypatch)
    eager = snapshot(Recorder(name)())
    assert lazy == eager


@pytest.mark.parametrize("offline_parallel", [True, False])
def test_lazy_mailbox_ties(offline_parallel: bool, monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute (ties everywhere): lazy and eager Mailbox agree,
    and the lazy one schedules fewer events."""
    from fednet.protocol import registry
    import fednet.protocols.lightsecagg  # noqa: F401
    D = 8
    counts = []

    def make():
        g = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D)
        sim = Simulation(g, 3, device_compute=Deterministic())
        n = [0]
        step = sim.env.step

        def counted():
            n[0] += 1
            step()
        sim.env.step = counted
        proto = registry.get("lightsecagg")(sim, digits_task(D, 16, "iid"),
                                            dict(z=1, U=5, offline_parallel=offline_parallel))
        proto.run(3)
        counts.append(n[0])
        return proto
    lazy = snapshot(make())
    _eager_mailbox(monkeypatch)
    eager = snapshot(make())
    assert lazy == eager
    assert counts[0] < counts[1]


def test_run_restores_the_garbage_collector() -> None:
    """Protocol.run freezes and disables the collector for its rounds only, also when a round raises."""
    import gc
    from fednet.protocol.base import StragglerShortfall
    assert gc.isenabled()
    before = gc.get_freeze_count()
    Recorder("conventional")()
    assert gc.isenabled() and gc.get_freeze_count() == before
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    from test_pinned_traces import lossy_sim
    proto = registry.get("conventional")(lossy_sim(6, 0, dropout=0.9), digits_task(6, 24, "noniid"), {})
    with pytest.raises(StragglerShortfall):
        proto.run(3)                          # too few devices: the first round raises
    assert gc.isenabled() and gc.get_freeze_count() == before


@pytest.mark.parametrize("drop_slowest,dropout", [(0, 0.0), (2, 0.0), (2, 0.25)])
def test_fast_path_timing_key(drop_slowest: int, dropout: float, monkeypatch) -> None:
    """A gather under its own ``timing_key`` draws ``downlink:<key>``, ``compute-<key>``, ``uplink:<key>`` on both
    paths (same results, same draw counters), and the shared streams are left alone; availability as drawn."""
    import fednet.protocols.conventional as conventional
    from fednet.protocols.conventional import ConventionalFL
    from test_pinned_traces import lossy_sim
    from fednet.sim.rng import purpose_id

    class Keyed(ConventionalFL):
        def round(self, epoch: int):
            replies = yield from self.net.gather(self.devices, self.local_gradient, kind="gradient",
                                                 first=sum(map(self.net.available, self.devices)) - drop_slowest,
                                                 download=self.theta.astype(np.float32), timing_key="probe")
            G = yield from self.net.server_compute(conventional.sum_gradients, replies.values)
            self.used = [dev.index for dev in replies.nodes]
            self.mode.update(self, G, sum(self.task.X[i].shape[0] for i in self.used))

    D = 9

    def make():
        proto = Keyed(lossy_sim(D, 5, dropout), digits_task(D, 16, "iid"), dict(minibatch_fraction=0.5))
        proto.run(3)
        return proto
    fast, slow, calls = run_both(make, monkeypatch)
    assert calls > 0
    assert fast == slow
    purposes = {key[0] for key in fast[2]}
    assert purpose_id("uplink:probe") in purposes and purpose_id("compute-probe") in purposes
    assert purpose_id("uplink") not in purposes and purpose_id("compute") not in purposes
    used = [r["used"] for r in fast[0][1:]]
    assert all(u for u in used)


@pytest.mark.parametrize("name,params", [
    ("fedavg", {"hidden": [8, 8], "batch_size": 8}),
    ("scaffold", {"hidden": [8, 8], "batch_size": 8}),
    ("fedavg_lightsecagg", {"hidden": [8, 8], "batch_size": 8, "U": 3}),
    ("dresfl", {"hidden": [3, 3], "batch_size": 8, "weight_bits": 4}),
    ("dresfl", {"hidden": [3, 3], "batch_size": 8, "weight_bits": 4, "setup_dropouts": "reshare"}),
])
def test_fast_path_new_protocols_under_dropouts(name: str, params: dict, monkeypatch) -> None:
    """Protocols merged after the fast path (DReS-FL and its baselines), with per-client dropouts in the
    rounds and in the setup phase (setup attempts): the fast path gives the same traces, views and draws."""
    from factories import make_task
    from fednet.protocol import registry
    from fednet.sim.dropout import PerClientDropout
    D = 10

    def make():
        sim = Simulation(lte_star(D, device_mac_rates=[1e6 * (1 + i % 3) for i in range(D)], loss=0.1), 3,
                         availability=PerClientDropout([0.2] * D))
        proto = registry.get(name)(sim, make_task(D=D, n=40, d=12, c=3), params)
        proto.run(4)
        return proto
    fast, slow, calls = run_both(make, monkeypatch)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert any(r["dropped"] != repr("") for r in fast[0][1:]), "no dropout happened: the scenario tests nothing"
    if name != "fedavg_lightsecagg":
        assert calls > 0


def test_node_table_follows_assignments() -> None:
    """``Simulation.node_table`` is kept between calls and made anew after any node, link or compute-model change."""
    from fednet.sim.compute import ShiftedExponential
    sim = Simulation(lte_star(4, rng=np.random.default_rng(0)), seed=0, device_compute=ShiftedExponential(0.5))
    devs = sim.devices

    def fresh():
        return [[d.index, d.downlink.rate_bps, d.downlink.loss, d.uplink.rate_bps, d.uplink.loss, d.mac_rate,
                 d.compute_model.setup_fraction if type(d.compute_model) is ShiftedExponential else -1.0]
                for d in devs]
    t = sim.node_table(devs)
    assert t.tolist() == fresh() and sim.node_table(devs) is t          # kept while nothing changed
    with pytest.raises(ValueError):
        t[0, 0] = 1.0                                                    # read-only
    changes = [lambda: setattr(devs[1], "mac_rate", 7.0), lambda: setattr(devs[2].uplink, "rate_bps", 3.0),
               lambda: setattr(devs[0].downlink, "loss", 0.25),
               lambda: setattr(devs[0].compute_model, "setup_fraction", 0.125),
               lambda: setattr(devs[3], "compute_model", Deterministic())]
    for change in changes:
        before = sim.node_table(devs)
        change()
        after = sim.node_table(devs)
        assert after is not before and after.tolist() == fresh()
    assert sim.node_table(devs[::-1]).tolist() == fresh()[::-1]
    assert sim.node_table([*devs, sim.server]) is None


def test_fast_path_follows_rates_changed_between_rounds(monkeypatch) -> None:
    """A device's MAC rate and link rate changed after each round: the replay reads the new ones (same trace)."""
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    from test_pinned_traces import lossy_sim

    def make():
        sim = lossy_sim(6, 3, 0.0)
        proto = registry.get("conventional")(sim, digits_task(6, 8, "iid"), dict(minibatch_fraction=0.5),
                                             label="rates")

        def change(row):
            dev = sim.devices[row["round"] % 6]
            dev.mac_rate *= 0.5
            dev.uplink.rate_bps *= 2.0
        proto.run(5, on_round=change)
        return proto
    fast, slow, calls = run_both(make, monkeypatch)
    assert calls > 0 and fast == slow


def test_idle_follows_resources() -> None:
    """``Simulation.idle``: False while any processor or link of the nodes is held or queued for, True after; the
    environment's count of held slots (its shortcut, ``settled=True``) follows every request and release."""
    import simpy
    from fednet.sim.compute import ShiftedExponential
    sim = Simulation(lte_star(3, rng=np.random.default_rng(0)), seed=0, device_compute=ShiftedExponential(0.5))
    devs = sim.devices

    def held() -> int:
        return sum(len(r.users) for n in sim.nodes for r in (n.cpu, *(l.resource for l in (n.uplink, n.downlink) if l)))
    assert sim.idle(devs) and sim.idle(devs, settled=True) and sim.env.held == 0
    for owner, res in ((devs[2], devs[2].cpu), (devs[1], devs[1].uplink.resource), (devs[0], devs[0].downlink.resource)):
        first, second = res.request(), res.request()
        sim.env.run(until=sim.env.now + 1.0)
        assert res.users == [first] and res.queue == [second] and sim.env.held == held() == 1
        others = [d for d in devs if d is not owner]
        for settled in (False, True):
            assert not sim.idle(devs, settled=settled) and not sim.idle([owner], settled=settled)
            assert sim.idle(others, settled=settled)              # something held elsewhere: each one looked at
        res.release(first)
        sim.env.run(until=sim.env.now + 1.0)
        assert res.users == [second] and not res.queue and not sim.idle(devs) and sim.env.held == held() == 1
        third = res.request()
        sim.env.run(until=sim.env.now + 1.0)
        third.cancel()                                   # a waiting request withdrawn: nothing was held by it
        res.release(second)
        sim.env.run(until=sim.env.now + 1.0)
        assert sim.idle(devs) and sim.idle(devs, settled=True) and sim.env.held == held() == 0
    plain = simpy.Resource(sim.env, capacity=1)          # not a slot: the shortcut must look at it
    devs[0].cpu = plain
    req = plain.request()
    sim.env.run(until=sim.env.now + 1.0)
    assert plain.users == [req] and sim.env.held == 0 and not sim.idle(devs, settled=True)


def test_held_slots_after_process_runs(monkeypatch) -> None:
    """After runs on SimPy's processes (cancelled work included), the count of held slots is the true one."""
    engine(monkeypatch, SWITCH["FAST_PATH"])
    for name in ("conventional_drop2", "lightsecagg_dropout_timing", "codedpaddedfl_relay_steps_full"):
        sim = Recorder(name)().sim
        assert sim.env.held == sum(len(r.users) for n in sim.nodes
                                   for r in (n.cpu, *(l.resource for l in (n.uplink, n.downlink) if l)))
