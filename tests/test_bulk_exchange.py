"""The bulk bundled exchange (the ``bundled`` engine backend) equals the per-pair one bit for bit.

LightSecAgg's mask exchange runs with the switch on and off and must give the same trace, the same messages in
every node's view and relay list and the same keyed-draw counters (:func:`test_fast_path.snapshot`), the bulk
path being really taken; :meth:`Mailbox.put_many` must act as :meth:`Mailbox.put` of each pair in order (the
same completions of waits registered before and after, at the same heap keys, the same payloads); and the
exchange must return the same ``{(src, dst): payload}`` in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest

from fednet.protocol.modes import Shape
from fednet.protocol.primitives import AllToAll, Mailbox
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import Recorder, engine, run_both, snapshot  # noqa: E402
from test_lightsecagg_scale import SCALE_SCENARIOS, run  # noqa: E402

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def _both(make, monkeypatch) -> tuple:
    """Snapshots with the bulk exchange on and off, and how often it was taken."""
    return run_both(make, monkeypatch, "BULK_EXCHANGE", "_bulk_bundled")


#: The LightSecAgg shortcuts checked on == off below: (module switch, the method it takes), i.e. the bulk exchange
#: itself and, inside it, the forwards replayed without a process each.
SHORTCUTS = [("BULK_EXCHANGE", "_bulk_bundled")]


@pytest.mark.parametrize("switch, method", SHORTCUTS)
@pytest.mark.parametrize("name", ["lightsecagg_bundled_full", "lightsecagg_bundled_timing",
                                  "lightsecagg_dropout_full", "lightsecagg_dropout_timing"])
def test_pinned_lightsecagg_bulk_equals_pairs(name: str, switch: str, method: str, monkeypatch) -> None:
    bulk, pairs, taken = run_both(Recorder(name), monkeypatch, switch, method)
    assert taken > 0
    assert bulk == pairs


@pytest.mark.parametrize("switch, method", SHORTCUTS)
@pytest.mark.parametrize("name", sorted(SCALE_SCENARIOS))
def test_lightsecagg_at_scale_bulk_equals_pairs(name: str, switch: str, method: str, monkeypatch) -> None:
    bulk, pairs, taken = run_both(lambda: run(name), monkeypatch, switch, method)
    assert taken > 0
    assert bulk == pairs


@pytest.mark.parametrize("offline_parallel", [True, False])
def test_bulk_exchange_ties(offline_parallel: bool, monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute (ties everywhere): SimPy's order is kept."""
    from fednet.protocol import registry
    import fednet.protocols.lightsecagg  # noqa: F401
    from test_pinned_traces import digits_task

    def make():
        g = lte_star(12, loss=0.0, device_mac_rates=[4e6] * 12)
        proto = registry.get("lightsecagg")(Simulation(g, 3, device_compute=Deterministic()),
                                            digits_task(12, 16, "iid"),
                                            dict(z=2, U=9, offline_parallel=offline_parallel, mode="timing"))
        proto.run(3)
        return proto
    bulk, pairs, taken = _both(make, monkeypatch)
    assert taken > 0
    assert bulk == pairs


def _mailbox_run(bulk: bool, stand_ins: bool) -> tuple:
    """A scripted delivery: singles and two blocks to node 0 at the same instants, waits before and after."""
    sim = Simulation(lte_star(3, device_mac_rates=[1e6] * 3), 0)
    env, box, log = sim.env, Mailbox(sim.env), []
    rows = Shape((5, 3), np.int64) if stand_ins else np.arange(15, dtype=np.int64).reshape(5, 3)

    def put_rows(srcs, rows_):
        if bulk:
            box.put_many(srcs, 0, rows_)
        else:
            for k, src in enumerate(srcs):
                box.put(src, 0, rows_[k])

    def waiter(name, srcs, at):
        yield env.timeout(at)
        yield box.wait(0, srcs)
        log.append((name, env.now, env.current))

    def deliver():
        yield env.timeout(1.0)
        box.put(9, 0, rows[0])
        put_rows([4, 2, 7], rows[[1, 2, 3]] if not stand_ins else Shape((3, 3), np.int64))
        env.process(waiter("after-same-instant", [2, 9], 0.0))
        yield env.timeout(1.0)
        put_rows([5, 3], rows[[3, 4]] if not stand_ins else Shape((2, 3), np.int64))

    for name, srcs, at in [("all", [9, 4, 2, 7, 5, 3], 0.0), ("first-block", [4, 7], 0.5), ("one", [2], 0.0),
                           ("later", [3, 9], 1.5), ("late", [4, 5], 3.0), ("none", [], 0.2),
                           ("frozen", frozenset({2, 5}), 0.0), ("frozen-after", frozenset({9, 4, 3}), 1.5),
                           ("frozen-held", frozenset({9, 7}), 1.5)]:
        env.process(waiter(name, srcs, at))
    env.process(deliver())
    sim.env.run()
    got = [box.get(s, 0) for s in (9, 4, 2, 7, 5, 3)]
    many = box.get_many([3, 9, 2], 0)
    return log, next(env._eid), got, many


@pytest.mark.parametrize("stand_ins", [False, True])
def test_put_many_equals_puts(stand_ins: bool) -> None:
    log_b, eid_b, got_b, many_b = _mailbox_run(True, stand_ins)
    log_p, eid_p, got_p, many_p = _mailbox_run(False, stand_ins)
    assert log_b == log_p and eid_b == eid_p
    assert len(log_b) == 10
    if stand_ins:
        assert all(isinstance(g, Shape) and g.shape == (3,) for g in got_b + got_p)
        assert many_b.shape == many_p.shape == (3, 3)
    else:
        assert all(np.array_equal(a, b) for a, b in zip(got_b, got_p))
        assert np.array_equal(many_b, many_p) and many_b.dtype == many_p.dtype


def test_put_many_refuses_a_pair_twice() -> None:
    sim = Simulation(lte_star(3, device_mac_rates=[1e6] * 3), 0)
    box = Mailbox(sim.env)
    box.put(1, 0, np.zeros(2))
    with pytest.raises(ValueError, match="from 1 to 0"):
        box.put_many([2, 1], 0, np.zeros((2, 2)))
    box.put_many([2, 3], 0, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="from 3 to 0"):
        box.put(3, 0, np.zeros(2))
    with pytest.raises(ValueError, match="from 4 to 0"):
        box.put_many([4, 4], 0, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="from 3 to 0"):                # a pair of an earlier block
        box.put_many([6, 3, 5], 0, np.zeros((3, 2)))
    box.put_many([6, 5], 0, np.zeros((2, 2)))
    assert [box.get(src, 0).shape for src in (1, 2, 3, 5, 6)] == [(2,)] * 5


@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_exchange_returns_the_same_deliveries(dropout: float, monkeypatch) -> None:
    from fednet.protocol import registry
    import fednet.protocols.conventional  # noqa: F401
    from fednet.sim.compute import BernoulliDropout
    from test_pinned_traces import digits_task

    def deliveries():
        D = 7
        sim = Simulation(lte_star(D, loss=0.1, device_mac_rates=[1e6 * (1 + i % 3) for i in range(D)]), 5, availability=BernoulliDropout(dropout) if dropout else None)
        proto = registry.get("conventional")(sim, digits_task(D, 16, "iid"), {})
        sim.round = 1
        tables = {dev.index: np.arange(D * 2, dtype=np.int64).reshape(D, 2) + 100 * dev.index for dev in sim.devices}
        senders = [dev for dev in sim.devices if dev.index != 3]
        box = Mailbox(sim.env)
        out = sim.env.process(proto.net.exchange(AllToAll(senders, sim.devices[::-1]), None,
                                                 rows=lambda s: tables[s.index], kind="share", schedule="bundled",
                                                 n_elements=2, element_bits=32, mailbox=box))
        sim.env.run()
        got = [(pair, value.tolist()) for pair, value in out.value.items()]
        dst = got[-1][0][1]
        srcs = [src for (src, to), _ in got if to == dst][::-1]
        return got, sim.env.now, box.get_many(srcs, dst).tolist(), [box.get(src, dst).tolist() for src in srcs]

    engine(monkeypatch)
    bulk = deliveries()
    engine(monkeypatch, ("bundled",))
    assert bulk == deliveries()
    assert len(bulk[0]) > 0 and bulk[2] == bulk[3]


def test_fedavg_lightsecagg_bulk_equals_pairs(monkeypatch) -> None:
    """FedAvg with LightSecAgg (DReS-FL's baseline) shares its masks the same way, with absent clients."""
    from factories import make_task
    from fednet.protocol import registry
    from fednet.sim.compute import BernoulliDropout
    D = 10

    def make():
        sim = Simulation(lte_star(D, device_mac_rates=[1e6 * (1 + i % 3) for i in range(D)], loss=0.1), 3,
                         availability=BernoulliDropout(0.2), secret_seed=7)
        proto = registry.get("fedavg_lightsecagg")(sim, make_task(D=D, n=40, d=12, c=3),
                                                   {"hidden": [8, 8], "batch_size": 8, "U": 5})
        proto.run(4)
        return proto
    bulk, pairs, taken = _both(make, monkeypatch)
    assert taken > 0
    assert bulk == pairs
