"""CodedSecAgg's set-up exchange without per-pair objects (the ``cyclic`` backend) and ``compute_each`` without
processes (the ``compute`` backend) give the reference's results bit for bit (issue 32: the set-up at D = 20,000).

Each scenario runs CodedSecAgg's set-up and two epochs twice -- every backend allowed, then ``FEDNET_ENGINE=reference``
(plain SimPy processes) -- and compares the traces, views and relay lists, keyed-draw counters
(:func:`test_fast_path.snapshot`), the simulation's counters and the final model.  Scenarios: timing mode on both
relay schedules, each group encoding on its own or not (``encode_per_group``), several D and N, lossy links of one
rate, two uplink rates (two classes of links), every link its own rate and loss, a loss-free deterministic network
where every time ties, and small
chunks of steps (several chunks, a chunk not dividing the steps); full mode, where the shares are real arrays and
the ``relays`` backend runs instead.  A planted error in the replayed link times is caught.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fednet.protocols.codedsecagg import CodedSecAgg, CodedSecAggConfig
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.engine.backends import cyclic
from fednet.sim.engine.mailbox import AlikeDelivered, CyclicSteps, Repeated, cyclic_steps, prepend, received_by
from fednet.sim.network import negative_binomials_from_uniforms, transmission_times
from fednet.sim.rng import Streams
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import snapshot  # noqa: E402
from test_pinned_traces import SECRET_SEED, digits_task  # noqa: E402

#: These tests check the backends themselves (tests/conftest.py: every backend allowed unless a test says otherwise).
pytestmark = pytest.mark.backends

#: name -> (D, seed, protocol parameters, network: "lossy", "two_rates", "ties" or "spread" (every link its own rate
#: and loss, downlinks slower than uplinks: queues at the receivers))
SCENARIOS = {
    "steps_N3": (12, 31, dict(groups=3, sharing_schedule="relay_steps"), "lossy"),
    "steps_N2_z2": (16, 32, dict(z=2, groups=2, sharing_schedule="relay_steps"), "lossy"),
    "steps_N4_per_group": (16, 33, dict(groups=4, sharing_schedule="relay_steps", encode_per_group=True), "lossy"),
    "steps_N1": (9, 34, dict(z=2, groups=1, sharing_schedule="relay_steps"), "lossy"),
    "steps_N2_two_rates": (20, 35, dict(groups=2, sharing_schedule="relay_steps"), "two_rates"),
    "steps_N3_ties": (12, 36, dict(groups=3, sharing_schedule="relay_steps"), "ties"),
    "steps_N2_paper": (12, 37, dict(groups=2, sharing_schedule="relay_steps", **CodedSecAggConfig.paper_accounting),
                       "lossy"),
    "asap_N3": (12, 38, dict(groups=3, sharing_schedule="relay_asap"), "lossy"),
    "asap_N2_per_group": (16, 39, dict(groups=2, sharing_schedule="relay_asap", encode_per_group=True), "two_rates"),
    "asap_N1_ties": (8, 40, dict(z=2, groups=1, sharing_schedule="relay_asap"), "ties"),
    "asap_N3_spread": (12, 43, dict(groups=3, sharing_schedule="relay_asap"), "spread"),
    "steps_N2_spread": (12, 44, dict(groups=2, sharing_schedule="relay_steps"), "spread"),
    "steps_N3_full": (12, 41, dict(groups=3, sharing_schedule="relay_steps", mode="full"), "lossy"),
    "asap_N2_full": (8, 42, dict(groups=2, sharing_schedule="relay_asap", mode="full"), "lossy"),
}


def make(name: str, record_views: bool = False) -> CodedSecAgg:
    """The scenario ``name``: its set-up and two epochs (timing mode unless it says otherwise)."""
    D, seed, params, network = SCENARIOS[name]
    rates = [2e6 * (1 + (i % 4)) for i in range(D)]
    if network == "ties":
        g, compute = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D), Deterministic()
    elif network == "spread":
        g = lte_star(D, uplink_bps=[4e6 + 3e5 * i for i in range(D)], downlink_bps=[1e6 + 1e5 * i for i in range(D)],
                     loss=[0.05 + 0.01 * i for i in range(D)], device_mac_rates=rates)
        compute = ShiftedExponential(0.5)
    else:
        uplinks = [5e6 if i % 2 else 2.5e6 for i in range(D)] if network == "two_rates" else 5e6
        g, compute = lte_star(D, loss=0.1, uplink_bps=uplinks, device_mac_rates=rates), ShiftedExponential(0.5)
    sim = Simulation(g, seed, device_compute=compute, record_views=record_views, secret_seed=SECRET_SEED)
    proto = CodedSecAgg(sim, digits_task(D, 16, "noniid"), dict(dict(mode="timing", z=1), **params), label=name)
    proto.run(2)
    return proto


def outcome(proto: CodedSecAgg) -> tuple:
    """What must not move: the snapshot (trace, views, relays, draw counters), the counters, the final model."""
    return snapshot(proto), repr(vars(proto.sim.counters)), proto.theta.tobytes()


def on_and_off(name: str, monkeypatch, record_views: bool = False) -> tuple[tuple, tuple, CodedSecAgg]:
    """The scenario's outcome with every backend allowed and on the reference semantics, and the first run."""
    monkeypatch.setenv("FEDNET_ENGINE", "all")
    fast = make(name, record_views)
    monkeypatch.setenv("FEDNET_ENGINE", "reference")
    ref = make(name, record_views)
    monkeypatch.setenv("FEDNET_ENGINE", "all")
    return outcome(fast), outcome(ref), fast


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_setup_equals_reference(name: str, monkeypatch) -> None:
    """The set-up and epochs equal the reference's, bit for bit; the cyclic backend runs in timing mode (the relays
    backend in full mode), the compute backend wherever a group does not run beside the others."""
    fast, ref, proto = on_and_off(name, monkeypatch)
    timing = SCENARIOS[name][2].get("mode", "timing") == "timing"
    paths = proto.sim.engine_paths
    assert paths.count("cyclic") > 0 if timing else paths.count("cyclic") == 0
    assert paths.count("relays") == (0 if timing else 1)
    if not SCENARIOS[name][2].get("encode_per_group"):
        assert paths.count("compute") >= 2                     # the encoding and the combining
    assert fast == ref


@pytest.mark.parametrize("name", ["steps_N2_two_rates", "asap_N3"])
def test_views_recorded_take_the_relays_backend(name: str, monkeypatch) -> None:
    """With views recorded (every message kept) the cyclic backend declines and the relays backend runs: equal."""
    fast, ref, proto = on_and_off(name, monkeypatch, record_views=True)
    assert proto.sim.engine_paths.count("cyclic") == 0 and proto.sim.engine_paths.count("relays") == 1
    assert "views are recorded" in proto.sim.engine_paths.explain()
    assert fast == ref


@pytest.mark.parametrize("chunk", [1, 40, 100])
def test_chunks_of_steps(chunk: int, monkeypatch) -> None:
    """The 9 steps (20 devices in 2 groups) replayed in chunks of 1, 2 or 5 steps (``chunk / 20`` of them): equal."""
    monkeypatch.setattr(cyclic, "CHUNK_MESSAGES", chunk)
    fast, ref, _ = on_and_off("steps_N2_two_rates", monkeypatch)
    assert fast == ref


@pytest.mark.parametrize("plant", ["ulp", "draw_order"])
def test_planted_error_is_caught(plant: str, monkeypatch) -> None:
    """A replay whose link times are one ulp long, or whose links take their draws of steps 1 and 2 in the wrong
    order, gives another outcome: the comparison can fail."""
    right = cyclic._link_seconds

    def planted(sim, u, *args):
        if plant == "draw_order":
            u = u[[1, 0, *range(2, len(u))]]
        secs, extra = right(sim, u, *args)
        return (np.nextafter(secs, np.inf) if plant == "ulp" else secs), extra
    monkeypatch.setattr(cyclic, "_link_seconds", planted)
    fast, ref, proto = on_and_off("steps_N3", monkeypatch)
    assert proto.sim.engine_paths.count("cyclic") > 0
    assert fast[0] != ref[0]


def test_cyclic_steps_description() -> None:
    """CyclicSteps: the pairs of cyclic_steps, its receivers by arithmetic, unequal groups refused."""
    nodes = [SimpleNamespace(index=i) for i in range(12)]
    groups = [nodes[0:4], nodes[4:8], nodes[8:12]]
    pairs = CyclicSteps(groups)
    assert len(pairs) == 3 and pairs.n == 4 and pairs.index.shape == (3, 4)
    expected = cyclic_steps(groups)
    assert pairs.steps() == expected
    for r in range(1, 4):
        assert pairs.receivers(r).tolist() == [dst.index for _, dst in expected[r - 1]]
    assert pairs.receivers(np.array([1, 3])).tolist() == [pairs.receivers(1).tolist(), pairs.receivers(3).tolist()]
    with pytest.raises(ValueError, match="equal sizes"):
        CyclicSteps([nodes[0:4], nodes[4:7]])
    assert len(CyclicSteps([nodes[0:1], nodes[1:2]])) == 0


def test_alike_delivered_mapping() -> None:
    """AlikeDelivered: the pairs of the steps in order, one value each; received_by and prepend in O(1)."""
    nodes = [SimpleNamespace(index=i) for i in range(6)]
    pairs = CyclicSteps([nodes[0:3], nodes[3:6]])
    delivered = AlikeDelivered(pairs, "v")
    want = [(s.index, d.index) for step in cyclic_steps(pairs.groups) for s, d in step]
    assert list(delivered) == want and len(delivered) == 12
    assert delivered[(0, 2)] == "v" and (0, 3) not in delivered and (1, 1) not in delivered
    got = received_by(delivered)
    assert sorted(got) == list(range(6)) and all(isinstance(v, Repeated) and list(v) == ["v", "v"]
                                                 for v in got.values())
    assert received_by({(0, 1): "a", (2, 1): "b", (0, 2): "c"}) == {1: ["a", "b"], 2: ["c"]}
    held = prepend("own", got[4])
    assert isinstance(held, Repeated) and len(held) == 3 and list(held) == ["own", "v", "v"]
    assert held[0] == "own" and held[-1] == "v" and held[1:] == ["v", "v"]
    assert prepend("own", ["a"]) == ["own", "a"]
    with pytest.raises(IndexError):
        held[3]


@pytest.mark.parametrize("offsets", [(0, 0, 0, 0), (3, 0, 9, 1)])
def test_uniforms_repeated_equal_in_turn(offsets: tuple) -> None:
    """Streams.uniforms_repeated equals uniforms_in_turn over the tiled nodes (equal and unequal draws taken before,
    nodes in a range and not), and advances each node's stream alike."""
    a, b = Streams(7, 30, width=4), Streams(7, 30, width=4)
    for s in (a, b):
        for node, k in zip((2, 3, 4, 17), offsets):
            for _ in range(k):
                s.uniform(node, "uplink", 1)
    for nodes in (np.array([2, 3, 4, 17]), np.array([2, 3, 4])):
        got = a.uniforms_repeated(nodes, 11, "uplink", 1)
        assert got.shape == (11, len(nodes))
        assert got.tolist() == b.uniforms_in_turn(np.tile(nodes, 11), "uplink", 1).reshape(11, -1).tolist()
    assert a.uniform(17, "uplink", 1) == b.uniform(17, "uplink", 1)
    assert {k: v[1].tolist() for k, v in a._entries.items()} == {k: v[1].tolist() for k, v in b._entries.items()}
    with pytest.raises(ValueError, match="distinct"):
        a.uniforms_repeated(np.array([3, 2, 3]), 2, "uplink", 1)
    assert a.uniforms_repeated(np.array([3]), 0, "uplink", 1).shape == (0, 1)


@pytest.mark.parametrize("n,p", [(1, 0.1), (3, 0.1), (7, 0.3), (2, 0.0), (4, 0.95)])
def test_scalar_link_class_equals_arrays(n: int, p: float) -> None:
    """negative_binomials_from_uniforms and transmission_times with scalar (n, p) / rate and loss: the array path's
    results, element for element (u of two dimensions, zeros included)."""
    rng = np.random.default_rng(n)
    u = rng.random((5, 40))
    u[0, :3] = 0.0
    u[1, 0] = 1.0 - 2 ** -53
    want = negative_binomials_from_uniforms(u.reshape(-1), np.full(u.size, n), np.full(u.size, p)).reshape(u.shape)
    assert negative_binomials_from_uniforms(u, n, p).tolist() == want.tolist()
    bits, rate = 31_000, 2.5e6
    secs, extra = transmission_times(bits, np.full(u.size, rate), 0.1, np.full(u.size, p), 12_000, u.reshape(-1),
                                     arrays=True)
    s2, e2 = transmission_times(bits, rate, 0.1, p, 12_000, u, arrays=True)
    assert s2.reshape(-1).tolist() == secs.tolist() and e2.reshape(-1).tolist() == extra.tolist()
    s3, e3 = transmission_times(0, rate, 0.1, p, None, u, arrays=True)
    assert not s3.any() and not e3.any()


def _compute_probe(twice: bool = False):
    """A probe protocol whose round runs two compute_each steps with per-node MACs (metered and known) on 6 devices
    of random speeds; its outcome: results, simulated end, counters, draws, processors' grants, and the engine's
    paths."""
    from fednet.algebra.meter import matmul
    from test_primitives import D, run

    def body(self):
        devs = self.devices
        first = yield from self.net.compute_each(devs[1:], lambda dev: matmul(np.ones((dev.index + 1, 4)),
                                                                              np.ones((4, 3))).sum(),
                                                 macs=lambda dev: 100 * dev.index)
        second = yield from self.net.compute_each(devs + devs[:1] if twice else devs[::-1], None,
                                                  macs=lambda dev: 7 + dev.index, timing_key="mask")
        return first, second, self.sim.env.now

    g = lte_star(D, loss=0.1, device_mac_rates=[1e3 * (1 + (i * 7) % 5) for i in range(D)])
    p = run(body, Simulation(g, 5, device_compute=ShiftedExponential(0.5)))
    draws = {k: v[1].tolist() for k, v in p.sim.streams._entries.items()}
    grants = [n.cpu.grants for n in p.sim.nodes]
    return (repr(p.out), repr(vars(p.sim.counters)), draws, repr(p.trace), grants), p.sim.engine_paths


def test_compute_each_equals_reference(monkeypatch) -> None:
    """compute_each without processes (the compute backend): results, times, counters and draws of the reference;
    a node listed twice (its processor would queue) takes the reference."""
    monkeypatch.setenv("FEDNET_ENGINE", "all")
    fast, paths = _compute_probe()
    assert paths.count("compute") == 2
    fast_twice, paths_twice = _compute_probe(twice=True)
    assert paths_twice.count("compute") == 1 and "computes twice" in paths_twice.explain()
    monkeypatch.setenv("FEDNET_ENGINE", "reference")
    assert _compute_probe()[0] == fast
    assert _compute_probe(twice=True)[0] == fast_twice


def _failing_probe():
    """compute_each where device 2's computation raises after metering; the MACs and draws counted when the
    exception reaches the round: the reference's later processes still compute at that instant."""
    from fednet.algebra.meter import matmul
    from test_primitives import run

    class Boom(RuntimeError):
        pass

    def work(dev):
        matmul(np.ones((dev.index + 1, 4)), np.ones((4, 3)))
        if dev.index == 2:
            raise Boom("device 2")
        return dev.index

    seen = {}

    def body(self):
        try:
            yield from self.net.compute_each(self.devices, work)
        except Boom:
            seen["macs"], seen["now"] = self.sim.counters.device_macs, self.sim.env.now
            seen["draws"] = {k: v[1].tolist() for k, v in self.sim.streams._entries.items()}
        return None

    g = lte_star(6, loss=0.1, device_mac_rates=[1e3 * (1 + i) for i in range(6)])
    p = run(body, Simulation(g, 5, device_compute=ShiftedExponential(0.5)))
    return seen, p.sim.engine_paths


def test_compute_each_failure_counts_what_the_reference_counts(monkeypatch) -> None:
    """A computation that raises: every node still computes (MACs, draws) before the exception reaches the caller,
    on the backend as on the reference."""
    from fednet.sim.engine.backends import compute

    ran = []
    real = compute.replay_compute
    monkeypatch.setattr(compute, "replay_compute", lambda *a, **k: (ran.append(1), (yield from real(*a, **k)))[1])
    monkeypatch.setenv("FEDNET_ENGINE", "all")
    fast, _ = _failing_probe()
    assert ran == [1]                                    # the backend ran (a failed step records no path)
    monkeypatch.setenv("FEDNET_ENGINE", "reference")
    ref, paths = _failing_probe()
    assert ran == [1] and paths.count("compute") == 0
    assert fast == ref and fast["macs"] == sum(12 * (i + 1) for i in range(6) if i != 2)   # not the failed one
