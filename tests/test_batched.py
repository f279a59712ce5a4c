"""Batched device math and the vectorised replay give the unbatched, per-process results bit for bit (issue 12).

Every scenario runs three ways -- batched (the ``batched`` backend, the default), unbatched
(``fn`` node by node on the event-free path) and on SimPy processes (the reference) -- and must give the
same trace (floats by ``repr``), the same messages in every view and the same keyed-draw counters; the vectorised
replay must really be taken. The building blocks (NumPy's SeedSequence / PCG64 / choice for many keys, the
batched gradient and sum, vectorised availability and draws) are compared with their scalar forms.
"""

from __future__ import annotations

import numpy as np
import pytest

from fednet.sim import pcg
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.rng import Streams
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import SWITCH, Recorder, engine, snapshot  # noqa: E402
from test_pinned_traces import digits_task  # noqa: E402

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def three_ways(make, monkeypatch) -> tuple[tuple, tuple, tuple, int]:
    """Snapshots batched, unbatched and on processes, and how often the vectorised replay finished a step."""
    engine(monkeypatch)
    proto = make()
    batched, taken = snapshot(proto), proto.sim.engine_paths.count("batched")
    engine(monkeypatch, ("batched",))
    unbatched = snapshot(make())
    engine(monkeypatch, SWITCH["FAST_PATH"] + ("batched",))
    slow = snapshot(make())
    engine(monkeypatch)
    return batched, unbatched, slow, taken


#: pinned scenarios whose rounds take the batched path (conventional FL; CodedSecAgg timing, one group)
BATCHED_SCENARIOS = ["conventional", "conventional_drop2", "conventional_dropout", "codedsecagg_onegroup_z2_timing",
                     "codedsecagg_dropout_timing"]


@pytest.mark.parametrize("name", BATCHED_SCENARIOS + ["codedsecagg_onegroup_z2_full", "codedpaddedfl_dropout_timing"])
def test_pinned_scenarios_batched_equal_unbatched(name: str, monkeypatch) -> None:
    batched, unbatched, slow, taken = three_ways(Recorder(name), monkeypatch)
    if name in BATCHED_SCENARIOS and name != "codedsecagg_dropout_timing":   # (groups = 2: a tree with edges)
        assert taken > 0, f"{name}: the vectorised replay was never taken"
    assert batched == unbatched
    assert batched == slow


@pytest.mark.parametrize("proto_name,params,dropout,views", [
    ("conventional", dict(minibatch_fraction=0.2), 0.0, True),
    ("conventional", dict(minibatch_fraction=0.25, drop_slowest=7), 0.0, True),
    ("conventional", dict(minibatch_fraction=0.2, drop_slowest=12), 0.15, False),
    ("codedsecagg", dict(z=3, groups=1, mode="timing"), 0.0, True),
    ("codedsecagg", dict(z=2, groups=1, mode="timing"), 0.1, False),
])
def test_many_devices_batched_equal_unbatched(proto_name: str, params: dict, dropout: float, views: bool,
                                              monkeypatch) -> None:
    """D = 40 on an LTE star with mixed rates and loss: the vector draws, the k-th arrival and the cancellations."""
    from fednet.protocol import registry
    import fednet.protocols.codedsecagg  # noqa: F401
    import fednet.protocols.conventional  # noqa: F401
    D = 40

    def make():
        g = lte_star(D, loss=0.1, device_mac_rates=[2e6 * (1 + i % 5) for i in range(D)],
                     rng=np.random.default_rng(1))
        sim = Simulation(g, 5, device_compute=ShiftedExponential(0.5), record_views=views,
                         availability=BernoulliDropout(dropout) if dropout else None, secret_seed=11)
        proto = registry.get(proto_name)(sim, digits_task(D, 16, "noniid"), params)
        proto.run(4)
        return proto
    batched, unbatched, slow, taken = three_ways(make, monkeypatch)
    assert taken >= 4
    assert batched == unbatched == slow


def test_ties_fall_back_to_the_node_by_node_replay(monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute: every arrival ties; the batched values feed the
    node-by-node replay, which keeps SimPy's insertion order."""
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    D = 7

    def make():
        g = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D)
        sim = Simulation(g, 3, device_compute=Deterministic())
        proto = registry.get("conventional")(sim, digits_task(D, 16, "iid"), dict(minibatch_fraction=0.5,
                                                                                drop_slowest=2))
        proto.run(3)
        return proto
    batched, unbatched, slow, taken = three_ways(make, monkeypatch)
    assert taken == 0
    assert batched == unbatched == slow


# -- building blocks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compiled", [True, False] if pcg.COMPILED else [False])
def test_pcg_choice_equals_numpy(compiled: bool) -> None:
    rng = np.random.default_rng(3)
    for seed in (0, 12345, 2**40 + 7):
        keys = [(1, int(i), 2964470305, int(e)) for i, e in zip(rng.integers(0, 5000, 25), rng.integers(0, 9999, 25))]
        keys[0] = (1, 0, 7, 0)
        ent = np.array([pcg.key_words(seed, k) for k in keys], dtype=np.uint32)
        words = pcg.seed_states(ent, compiled=compiled)
        assert (words == np.array([np.random.SeedSequence(seed, spawn_key=k).generate_state(4, np.uint64)
                                   for k in keys])).all()
        gen = pcg.PCG64Batch(words)
        raw = np.stack([gen.next64(np.arange(len(keys))) for _ in range(3)], axis=1)
        want = np.array([np.random.PCG64(np.random.SeedSequence(seed, spawn_key=k)).random_raw(3) for k in keys])
        assert (raw == want).all()
        for n, b in [(96, 19), (2400, 480), (10, 10), (5, 1), (1, 1), (7, 3), (100, 99), (10000, 2)]:
            got = pcg.choice_without_replacement(words, n, b, compiled=compiled)
            want = np.array([np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=k)))
                             .choice(n, size=b, replace=False) for k in keys])
            assert got.dtype == np.int64 and (got == want).all(), (n, b)


@pytest.mark.parametrize("compiled", [True, False] if pcg.COMPILED else [False])
def test_pcg_seed_states_equal_numpy(compiled: bool) -> None:
    """SeedSequence's words for keys of 1 to 9 entropy words (pool of 4: padded, and mixed in past it), big seeds."""
    rng = np.random.default_rng(11)
    for seed in (0, 1, 2**32 - 1, 2**32, 2**64 + 3, 2**150 + 2**90 + 17):
        for n_key in range(0, 6):
            keys = [tuple(int(v) for v in rng.integers(0, 2**32, n_key)) for _ in range(40)]
            keys[0] = (0,) * n_key
            ent = np.array([pcg.key_words(seed, k) for k in keys], dtype=np.uint32)
            want = np.array([np.random.SeedSequence(seed, spawn_key=k).generate_state(4, np.uint64) for k in keys])
            assert (pcg.seed_states(ent, compiled=compiled) == want).all(), (seed, n_key)


def test_lemire_rejections_equal_numpy() -> None:
    """A range near 2^32 rejects often: the redraws must follow NumPy's buffered 32-bit draws."""
    keys = [(1, i, 5, 5) for i in range(64)]
    words = pcg.seed_states(np.array([pcg.key_words(0, k) for k in keys], dtype=np.uint32))
    gen = pcg.PCG64Batch(words)
    rng = 3 * 2**30                                     # threshold 2^30: a quarter of the draws are redrawn
    got = np.stack([pcg._bounded_lemire(gen, None, rng) for _ in range(5)], axis=1)
    want = np.array([np.random.Generator(np.random.PCG64(np.random.SeedSequence(0, spawn_key=k)))
                     .integers(0, rng, size=5, endpoint=True) for k in keys])
    assert (got == want.astype(np.uint64)).all()


def test_streams_choices_and_minibatch_rows_many() -> None:
    s = Streams(4, 301)
    nodes = np.arange(0, 300, 3)
    got = s.choices(nodes, "minibatch", (17,), 96, 19)
    assert (got == np.array([s.generator(int(i), "minibatch", 17).choice(96, size=19, replace=False)
                             for i in nodes])).all()
    assert (s.choices(nodes[:3], "minibatch", (2,), 20000, 900) ==
            np.array([s.generator(int(i), "minibatch", 2).choice(20000, size=900, replace=False)
                      for i in nodes[:3]])).all()              # NumPy's tail-shuffle branch: node by node
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    D = 12
    proto = registry.get("conventional")(Simulation(lte_star(D, rng=np.random.default_rng(0)), 2),
                                         digits_task(D, 16, "noniid"), {})
    proto.epoch = 9
    batches = [3 + i % 4 for i in range(D)]
    many = proto.minibatch_rows_many(proto.devices, batches)
    for dev, b, rows in zip(proto.devices, batches, many):
        assert rows.tolist() == proto.minibatch_rows(dev, b).tolist()


def test_batched_gradient_and_sum_equal_per_device() -> None:
    from fednet.algebra.meter import MacMeter
    from fednet.learning.models import ridge_gradient, ridge_gradients
    from fednet.protocols.conventional import minibatch_gradient, minibatch_gradients, sum_gradients
    from fednet.algebra.meter import axpy
    rng = np.random.default_rng(0)
    for B, b, d, c in [(50, 19, 20, 10), (5, 480, 300, 10), (3, 1, 4, 1), (4, 7, 1, 1)]:
        x, y, th = rng.normal(size=(B, b, d)), rng.normal(size=(B, b, c)), rng.normal(size=(d, c))
        with MacMeter() as m:
            g = ridge_gradients(x, y, th, scale=2.5)
        assert m.macs == 2 * B * b * d * c
        for i in range(B):
            assert g[i].tobytes() == ridge_gradient(x[i], y[i], th, scale=2.5).tobytes()
    X = [rng.normal(size=(30 + 10 * (i % 2), 8)) for i in range(9)]
    Y = [rng.normal(size=(len(x), 3)) for x in X]
    rows = [rng.choice(len(x), 6 + (i % 3), replace=False) for i, x in enumerate(X)]
    th = rng.normal(size=(8, 3))
    for cache in (None, {}):
        with MacMeter() as m:
            got, macs = minibatch_gradients(X, Y, th, rows, cache)
        assert m.macs == sum(macs) == sum(2 * len(r) * 8 * 3 for r in rows)
        for i in range(len(X)):
            assert got[i].tobytes() == minibatch_gradient(X[i], Y[i], th, rows[i]).tobytes()
    cache = {}                                      # a second round reuses the gather buffers: its own rows
    for _ in range(3):
        rows = [rng.choice(len(x), 6 + (i % 3), replace=False) for i, x in enumerate(X)]
        got, _ = minibatch_gradients(X, Y, th, rows, cache)
        assert all(got[i].tobytes() == minibatch_gradient(X[i], Y[i], th, rows[i]).tobytes() for i in range(len(X)))
    stack = np.stack([rng.choice(40, 5, replace=False) for _ in range(4)])   # one group, rows as one array
    same = [X[i] for i in (1, 3, 5, 7)], [Y[i] for i in (1, 3, 5, 7)]
    got, _ = minibatch_gradients(*same, th, stack, cache)
    assert got.shape == (4, 8, 3)
    assert all(got[j].tobytes() == minibatch_gradient(same[0][j], same[1][j], th, stack[j]).tobytes() for j in range(4))
    for bad in (40, -1):                            # rows outside a device's points: an error, not a clipped row
        wrong = stack.copy()
        wrong[2, 1] = bad
        with pytest.raises(IndexError, match=r"minibatch rows must lie in \[0, 40\)"):
            minibatch_gradients(*same, th, wrong, cache)
    grads = [rng.normal(size=(4, 3)) for _ in range(40)]
    grads[0][0, 0] = -0.0
    grads[0][1, 1] = np.nan
    for gs in (grads, [np.full((2, 1), -0.0)] * 3, [rng.normal(size=(1, 1)) for _ in range(30)]):
        total = np.zeros_like(gs[0])
        for g in gs:
            total = axpy(1.0, g, total)
        with MacMeter() as m:
            got = sum_gradients(gs)
        assert got.tobytes() == total.tobytes() and m.macs == len(gs) * gs[0].size
    stack = np.stack(grads)                              # a stack's rows in a given order (GatherResult.stack_rows)
    stack[3] = -0.0
    stack[5, 2, 1] = np.inf
    for rows in (rng.permutation(40), rng.permutation(40)[:17], np.array([3, 3, 0]), np.array([7])):
        total = np.zeros_like(stack[0])
        for r in rows:
            total = axpy(1.0, stack[r], total)
        with MacMeter() as m:
            got = sum_gradients(stack, rows)
        assert got.tobytes() == total.tobytes() == sum_gradients(stack[rows]).tobytes()
        assert m.macs == len(rows) * stack[0].size
    big = rng.normal(size=(300, 50, 10)) * np.exp(rng.normal(size=(300, 1, 1)) * 8)   # magnitudes 1e-10 .. 1e10
    rows = rng.permutation(300)[:280]
    assert sum_gradients(big, rows).tobytes() == sum_gradients(big[rows]).tobytes()


def test_available_many_and_peeked_draws() -> None:
    g = lte_star(30, rng=np.random.default_rng(0))
    a = Simulation(g, 1, availability=BernoulliDropout(0.4))
    b = Simulation(g, 1, availability=BernoulliDropout(0.4))
    a.round = b.round = 3
    some = [a.devices[i] for i in (4, 9, 2, 17)]
    assert a.available_many(some).tolist() == [b.available(b.devices[i]) for i in (4, 9, 2, 17)]
    assert a.available_many(a.devices + [a.server]).tolist() == [b.available(n) for n in b.devices] + [True]
    assert {k: v.tolist() for k, v in a._available.items()} == {k: v.tolist() for k, v in b._available.items()}
    always = Simulation(g, 1)                              # nothing to draw: every device, and the errors
    assert always.available_many(always.devices + [always.server]).tolist() == [True] * 31
    for where in (dict(round=-1), dict(phase=-2)):
        with pytest.raises(ValueError, match="must be non-negative"):
            always.available_many(always.devices, **where)
    s, t = Streams(0, 10), Streams(0, 10)
    nodes = np.array([3, 1, 7])
    peek = s.uniforms(nodes, "uplink", 2, advance=False)
    assert not s._entries                                  # a look leaves no entry behind
    s.advance(nodes[:2], "uplink", 2)
    assert peek.tolist() == t.uniforms(nodes, "uplink", 2).tolist()
    assert s.uniform(7, "uplink", 2) == peek[2] and s.uniform(3, "uplink", 2) == t.uniform(3, "uplink", 2)


@pytest.mark.parametrize("threads", [1, 2])
def test_chunked_minibatch_gradients_equal_per_device(monkeypatch, threads: int) -> None:
    """Devices whose points are not stacked (beyond STACK_BYTES, or no cache) are batched in chunks of gathered
    minibatches (bounded memory at any D, issue 32): the same floats and MACs as device by device."""
    import fednet.learning.models as models
    from fednet.algebra.meter import MacMeter
    from fednet.algebra.slices import compute_threads

    rng = np.random.default_rng(5)
    X = [rng.normal(size=(40, 6)) for _ in range(23)]
    Y = [rng.normal(size=(40, 2)) for _ in range(23)]
    rows = np.stack([rng.choice(40, 7, replace=False) for _ in range(23)])
    th = rng.normal(size=(6, 2))
    monkeypatch.setattr(models, "STACK_BYTES", 0)                      # no stack fits
    monkeypatch.setattr(models, "CHUNK_BYTES", 3 * 7 * 8 * 8)          # three devices' minibatches a chunk
    with compute_threads(threads), MacMeter() as m:
        got, macs = models.minibatch_gradients(X, Y, th, rows, {})
    assert got.shape == (23, 6, 2) and m.macs == sum(macs) == 23 * 2 * 7 * 6 * 2
    for i in range(23):
        assert got[i].tobytes() == models.minibatch_gradient(X[i], Y[i], th, rows[i]).tobytes()
    bad = rows.copy()
    bad[4, 0] = 40
    with pytest.raises(IndexError, match=r"minibatch rows must lie in \[0, 40\)"):
        models.minibatch_gradients(X, Y, th, bad, {})


def test_per_node_key_parts_and_per_device_rounds() -> None:
    """``choices`` with a key part per node (an asynchronous client's own iteration) and ``minibatch_rows_many``
    with a round per device give each node's own generator's draws."""
    s = Streams(4, 301)
    nodes = np.arange(0, 300, 7)
    its = (nodes * 13) % 50
    got = s.choices(nodes, "minibatch", (its,), 96, 19)
    assert (got == np.array([s.generator(int(i), "minibatch", int(e)).choice(96, size=19, replace=False)
                             for i, e in zip(nodes, its)])).all()
    with pytest.raises(ValueError, match="per-node key part"):
        s.choices(nodes, "minibatch", (its[:-1],), 96, 19)
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    D = 12
    proto = registry.get("conventional")(Simulation(lte_star(D, rng=np.random.default_rng(0)), 2),
                                         digits_task(D, 16, "noniid"), {})
    batches = [3 + i % 4 for i in range(D)]
    epochs = [1 + (5 * i) % 7 for i in range(D)]
    many = proto.minibatch_rows_many(proto.devices, batches, epochs)
    for dev, b, e, rows in zip(proto.devices, batches, epochs, many):
        assert rows.tolist() == proto.minibatch_rows(dev, b, e).tolist()


@pytest.mark.parametrize("stacked", [True, False])
def test_some_minibatch_gradients_equal_per_device(stacked: bool, monkeypatch) -> None:
    """The gradients of a subset of a kept population (FedBuff's clients of one call) are each device's own."""
    from fednet.algebra.meter import MacMeter
    from fednet.learning import models
    if not stacked:
        monkeypatch.setattr(models, "STACK_BYTES", 0)
    rng = np.random.default_rng(5)
    X = [rng.normal(size=(30 + 10 * (i % 2), 8)) for i in range(9)]
    Y = [rng.normal(size=(len(x), 3)) for x in X]
    th = rng.normal(size=(8, 3))
    cache: dict = {}
    for which in ([4, 1, 7], [0, 2, 3, 5, 6, 8], [8]):
        rows = [rng.choice(len(X[p]), 5 + p % 2, replace=False) for p in which]
        with MacMeter() as m:
            got, macs = models.some_minibatch_gradients(X, Y, th, which, rows, cache)
        assert m.macs == sum(macs) == sum(2 * len(r) * 8 * 3 for r in rows)
        for j, p in enumerate(which):
            assert got[j].tobytes() == models.minibatch_gradient(X[p], Y[p], th, rows[j]).tobytes()


def test_buffered_sum_weighted_at_once_equals_an_axpy_each() -> None:
    from fednet.algebra.meter import MacMeter, axpy
    from fednet.learning.models import sum_gradients
    from fednet.protocol.buffered import buffered_sum
    rng = np.random.default_rng(1)
    G = [rng.normal(size=(7, 3)) for _ in range(5)]
    w = [1.0, 0.5, 1 / np.sqrt(3), 0.25, 1 / np.sqrt(6)]
    with MacMeter() as m:
        got = buffered_sum(G, w, 0.3)
    want = axpy(0.3, sum_gradients([axpy(wi, g, 0.0) for wi, g in zip(w, G)]), 0.0)
    assert got.tobytes() == want.tobytes() and m.macs == 2 * 5 * 21 + 21     # a scaling and an addition each
