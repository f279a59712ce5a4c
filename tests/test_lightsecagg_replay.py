"""LightSecAgg's timing-mode round without per-user processes (the engine's ``masked`` backend, :mod:`fednet.sim.engine.backends.masked`) equals the
process path bit for bit.

Each scenario runs with the ``masked`` backend allowed and disallowed: the traces (times, bits, messages' retransmissions, MACs,
survivors, accuracy and loss) and every keyed-draw counter must be equal, and the replay must really have been
taken (or, where SimPy's order of simultaneous events decides, really refused).  The scenarios cover the two orders
of the forwards and the survivor lists on the downlinks (the last bundle in before or after the U-th masked
upload), users still training, uploading or receiving their forwards when the round ends (cut), U = D, retransmissions
with packets, heterogeneous processors, and ties everywhere (identical users, deterministic compute).
"""

from __future__ import annotations

import numpy as np
import pytest

import fednet.sim.engine.backends.masked as lsa_replay
from fednet.protocol import registry
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import engine, snapshot  # noqa: E402
from test_pinned_traces import digits_task  # noqa: E402

import fednet.protocols.lightsecagg  # noqa: F401,E402  (registers the protocol)

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def _run(D: int, params: dict, *, compute=None, rounds: int = 4, seed: int = 3, **net) -> object:
    g = lte_star(D, **net)
    sim = Simulation(g, seed, device_compute=compute or ShiftedExponential(0.5), record_views=False)
    proto = registry.get("lightsecagg")(sim, digits_task(D, 16, "noniid"), dict(params, mode="timing"))
    proto.run(rounds)
    return proto


def _both(monkeypatch, *args, **kwargs) -> tuple[tuple, tuple, int, int]:
    """Snapshots with the replay on and off, and how many rounds it replayed and refused with it on."""
    taken, refused = [0], [0]
    real = lsa_replay.replay_round

    def counting(*a, **k):
        out = real(*a, **k)
        (taken if not isinstance(out, str) else refused)[0] += 1
        return out
    monkeypatch.setattr(lsa_replay, "replay_round", counting)
    engine(monkeypatch)
    on = snapshot(_run(*args, **kwargs))
    counts = taken[0], refused[0]
    engine(monkeypatch, ("masked",))
    off = snapshot(_run(*args, **kwargs))
    assert taken[0] == counts[0]                        # never taken with the switch off
    return on, off, *counts


RATES = [2e6, 4e6, 8e6, 3e6, 5e6, 6e6, 1e6, 7e6, 2.5e6, 9e6, 3.5e6, 4.5e6, 5.5e6]


@pytest.mark.parametrize("D,z,U,net", [
    (6, 1, 6, {}),                                              # U = D: everyone survives
    (6, 1, 4, {}),
    (13, 2, 9, {"packet_bits": 2000}),                          # many packets, retransmissions
    (13, 3, 5, {"loss": 0.3}),
    (13, 1, 12, {"uplink_bps": 2e5}),                           # slow uplinks: bundles last, forwards after T1
    (13, 2, 10, {"downlink_bps": 3e4, "uplink_bps": 5e7}),      # slow downlinks: forwards cut at the round end
    (13, 1, 10, {"device_mac_rates": RATES[:10] + [2e4] * 3}),  # slow processors: still training at the end
    (13, 1, 11, {"downlink_bps": [10e6] * 12 + [2e3]}),         # a model download that never lands in time
])
def test_replay_equals_processes(D: int, z: int, U: int, net: dict, monkeypatch) -> None:
    """Heterogeneous users (MAC rates and shifted-exponential setup times): replayed every round, same bits."""
    net = {"device_mac_rates": RATES[:D], **net}
    on, off, taken, refused = _both(monkeypatch, D, dict(z=z, U=U), **net)
    assert taken == 4 and refused == 0
    assert on == off


def test_both_downlink_orders_are_covered(monkeypatch) -> None:
    """Scenarios of the test above put the last bundle in before the U-th masked upload (forwards first, then the
    survivor lists) and after it (lists first): the replay's two branches are both checked.  The branch shows in
    the order in which the replay sizes the downloads of the mask phase (a forward carries ``L (D - 1)`` elements,
    a list ``U``)."""
    seen = set()
    real = lsa_replay.transmission_times
    sizes: list[int] = []

    def tap(bits, *a, **k):
        sizes.append(int(bits))
        return real(bits, *a, **k)
    monkeypatch.setattr(lsa_replay, "transmission_times", tap)
    for net in ({}, {"uplink_bps": 2e5}):
        for epoch in range(4):
            sizes.clear()
            _run(13, dict(z=1, U=12), device_mac_rates=RATES, rounds=1, seed=epoch, **net)
            seen.add(tuple(sizes[3:5]))                         # after the model, bundle and masked upload
    assert len(seen) == 2


def test_ties_fall_back(monkeypatch) -> None:
    """Identical users, no loss, deterministic compute: the U-th and the next masked uploads arrive at one
    instant, so the replay refuses (SimPy's insertion order decides) and the processes give the same result."""
    on, off, taken, refused = _both(monkeypatch, 8, dict(z=1, U=5), compute=Deterministic(), loss=0.0,
                                    device_mac_rates=[4e6] * 8)
    assert refused == 4 and taken == 0
    assert on == off


@pytest.mark.parametrize("params", [dict(z=1, U=5, offline_parallel=False), dict(z=1, U=5, mask_relay="per_message")])
def test_other_schedules_use_processes(params: dict, monkeypatch) -> None:
    """The replay knows only the bundled relay overlapping training; the other schedules keep their processes."""
    on, off, taken, refused = _both(monkeypatch, 6, params, device_mac_rates=RATES[:6])
    assert taken == 0
    assert on == off


def test_random_small_rounds_with_u_from_one_to_d(monkeypatch) -> None:
    """30 drawn star set-ups (3-8 users, U from 1 to D, rates from a few values, deterministic or shifted-exponential
    compute, with and without loss), two rounds each: the replay equals the processes every time.  With U = 1 the
    survivor aggregates once its survivor list is in (its own share is its mask phase's only input it waits for), not
    after its forward, which then may end after the round."""
    rng = np.random.default_rng(1)
    taken = 0
    for trial in range(30):
        D = int(rng.integers(3, 9))
        U = int(rng.integers(1, D + 1)) if trial % 2 else 1
        net = dict(device_mac_rates=list(rng.choice([1e6, 2e6, 4e6], D)),
                   uplink_bps=list(rng.choice([1e6, 2e6, 4e6], D)),
                   downlink_bps=list(rng.choice([2e6, 4e6, 8e6], D)), loss=float(rng.choice([0.0, 0.0, 0.2])),
                   header_overhead=0.0)
        compute = Deterministic() if rng.random() < 0.6 else ShiftedExponential(0.5)
        on, off, t, _ = _both(monkeypatch, D, dict(z=min(1, U - 1), U=U), compute=compute, rounds=2, seed=trial,
                              **net)
        assert on == off, (trial, D, U, net, compute)
        taken += t
    assert taken >= 20, taken
