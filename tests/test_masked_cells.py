"""LightSecAgg's masked round on shared round-robin cells without per-user processes (the ``masked`` backend's cells
path, :mod:`fednet.sim.engine.backends.masked_cells`) equals the reference processes bit for bit.

Each scenario runs with the ``masked`` backend allowed and disallowed (``$FEDNET_ENGINE``, as
tests/test_lightsecagg_replay.py): the traces (times, bits, messages, retransmissions, MACs, survivors, accuracy,
loss), the final models, every keyed-draw counter and the cells' airs afterwards (idle, the same number of transfers)
must be equal, and the replay must really have been taken (or, where SimPy's order of simultaneous events decides,
really refused, with its reason).  Layouts: one cell, several, a radio star's cells, cells mixed with dedicated
links; U < D and U = D; retransmissions with packets; rounds cut at ``T2`` with transfers still on the air; both
orders of the forwards and the survivor lists.
"""

from __future__ import annotations

import numpy as np
import pytest

import fednet.sim.engine.backends.masked_cells as cells_replay
from fednet.protocol import registry
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_cells
from fednet.topologies.radio import radio_star

from test_fast_path import engine, snapshot  # noqa: E402
from test_pinned_traces import digits_task  # noqa: E402

import fednet.protocols.lightsecagg  # noqa: F401,E402  (registers the protocol)

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends

RATES = [2e6, 4e6, 8e6, 3e6, 5e6, 6e6, 1e6, 7e6, 2.5e6, 9e6, 3.5e6, 4.5e6, 5.5e6]


def _graph(D: int, layout: str, net: dict):
    """``"cells:k"``: lte_cells with k cells; ``"radio:k"``: a radio star's k cells; ``"mixed:k"``: k cells, every
    third device on its own dedicated links (no ``cell``)."""
    kind, k = layout.split(":")
    rates = net.pop("device_mac_rates", [RATES[i % len(RATES)] for i in range(D)])
    if kind == "radio":
        return radio_star(D, n_cells=int(k), rng=np.random.default_rng(5), device_mac_rates=rates, **net)
    g = lte_cells(D, n_cells=int(k), device_mac_rates=rates, **net)
    if kind == "mixed":
        devices = [v for v, a in g.nodes(data=True) if a.get("role") == "device"]
        for v in devices[::3]:
            del g.nodes[v]["cell"]
    return g


def _run(D: int, params: dict, layout: str = "cells:2", *, compute=None, rounds: int = 4, seed: int = 3,
         availability=None, mode: str = "timing", **net):
    sim = Simulation(_graph(D, layout, dict(net)), seed, device_compute=compute or ShiftedExponential(0.5),
                     record_views=False, availability=availability)
    proto = registry.get("lightsecagg")(sim, digits_task(D, 16, "noniid"), dict(params, mode=mode))
    proto.run(rounds)
    return proto


def _airs(proto) -> list[tuple]:
    """Each cell air's state after the run: transfers in progress, virtual time, transfers ever asked for (a
    round-robin air's; a proportional-fair one's transfers in progress)."""
    return [(a.active, getattr(a, "_virtual", 0.0), getattr(a, "transfers", 0))
            for pair in proto.sim.cells.values() for a in pair]


def _states(proto) -> list[tuple[bool, bool]]:
    """Which users hold encoded shares and a downloaded model (an encoding or a download cut at T2 sets none)."""
    return [(getattr(d.state, "encoded", None) is None, getattr(d.state, "received", None) is None)
            for d in proto.sim.devices]


def _both(monkeypatch, *args, **kwargs) -> tuple[tuple, tuple, int, int, object]:
    """Snapshots (trace, views, draw counters, final model, airs, users' states) with the backend allowed and
    disallowed, how many rounds the cells replay ran and refused with it allowed, and the run with it allowed."""
    taken, refused = [0], [0]
    real = cells_replay.replay_round_cells

    def counting(*a, **k):
        out = real(*a, **k)
        (taken if not isinstance(out, str) else refused)[0] += 1
        return out
    monkeypatch.setattr(cells_replay, "replay_round_cells", counting)
    engine(monkeypatch)
    p_on = _run(*args, **kwargs)
    on = (snapshot(p_on), p_on.theta.tobytes(), _airs(p_on), _states(p_on))
    counts = taken[0], refused[0]
    engine(monkeypatch, ("masked",))
    p_off = _run(*args, **kwargs)
    off = (snapshot(p_off), p_off.theta.tobytes(), _airs(p_off), _states(p_off))
    assert taken[0] == counts[0] and p_off.sim.engine_paths.count("masked") == 0   # never taken when disallowed
    return on, off, *counts, p_on


def _messages_if_nothing_cut(proto, D: int) -> int:
    """Messages of a run whose rounds let every transfer end: per round the model, bundle, masked upload and forward
    of every user, and the survivor list and aggregated mask of each survivor."""
    return sum(4 * D + 2 * len(row["used"]) for row in proto.trace if "used" in row)


@pytest.mark.parametrize("D,z,U,layout,net", [
    (6, 1, 6, "cells:1", {}),                                           # U = D, one cell
    (6, 1, 4, "cells:1", {}),
    (13, 2, 9, "cells:3", {"packet_bits": 2000}),                       # many packets, retransmissions
    (13, 3, 5, "cells:2", {"loss": 0.3}),
    (13, 1, 12, "cells:4", {"uplink_bps": 2e5}),                        # slow uplinks: bundles last, lists first
    (13, 2, 10, "cells:2", {"downlink_bps": 3e4, "uplink_bps": 5e7}),   # slow downlinks: forwards cut at T2
    (13, 1, 10, "cells:3", {"device_mac_rates": RATES[:10] + [2e4] * 3}),   # still training at T2
    (13, 1, 11, "cells:2", {"downlink_bps": [10e6] * 12 + [2e3]}),      # a model download that never lands in time
    (8, 0, 1, "cells:2", {"device_mac_rates": RATES[:7] + [1e3]}),     # U = 1: T2 before an encoding and its bundle
    (12, 2, 8, "radio:2", {}),                                          # a radio star's cells
    (12, 1, 12, "mixed:2", {}),                                         # cells and dedicated links, U = D
    (13, 2, 9, "mixed:3", {"loss": 0.2, "uplink_bps": 1e6}),
])
def test_cells_replay_equals_processes(D: int, z: int, U: int, layout: str, net: dict, monkeypatch) -> None:
    on, off, taken, refused, _ = _both(monkeypatch, D, dict(z=z, U=U), layout, **net)
    assert taken == 4 and refused == 0
    assert on == off
    assert all(active == 0 and virtual == 0.0 for active, virtual, _ in on[2])    # the airs idle, as the reference
    assert sum(n for *_, n in on[2]) > 0                                        # and used


@pytest.mark.parametrize("D,z,U,layout,net", [
    (13, 2, 10, "cells:2", {"downlink_bps": 3e4, "uplink_bps": 5e7}),
    (13, 1, 10, "cells:3", {"device_mac_rates": RATES[:10] + [2e4] * 3}),
    (13, 1, 11, "cells:2", {"downlink_bps": [10e6] * 12 + [2e3]}),
    (8, 0, 1, "cells:2", {"device_mac_rates": RATES[:7] + [1e3]}),
])
def test_rounds_cut_at_the_last_aggregated_mask_replay_the_cut(D, z, U, layout, net, monkeypatch) -> None:
    """Scenarios where transfers are still on the air (or not yet started) when the round ends: fewer messages than
    a round in which everything ends, with the replay taken and the reference's counts."""
    on, off, taken, _, proto = _both(monkeypatch, D, dict(z=z, U=U), layout, **net)
    assert taken == 4 and on == off
    assert proto.sim.counters.messages < _messages_if_nothing_cut(proto, D)


def _downlink_order(D: int, U: int, layout: str, seed: int, **net) -> bool:
    """Whether the last bundle arrives before the U-th masked upload in the reference's first round (from the
    server's view and relayed messages: ``T_b < T1``, each survivor's forward then its list on its downlink)."""
    sim = Simulation(_graph(D, layout, dict(net)), seed, device_compute=ShiftedExponential(0.5), record_views=True)
    proto = registry.get("lightsecagg")(sim, digits_task(D, 16, "noniid"), dict(z=1, U=U, mode="timing"))
    proto.run(1)
    assert proto.sim.engine_paths.count("masked", "masked") == 0          # views recorded: the processes ran
    Tb = max(m.delivered_at for m in sim.server.relayed if m.kind == "encoded_mask_relay")
    T1 = sorted(m.delivered_at for m in sim.server.view if m.kind == "masked_model")[U - 1]
    return Tb < T1


@pytest.mark.parametrize("net,order", [({}, True), ({"uplink_bps": 2e5}, False)])
def test_both_downlink_orders_are_replayed(net: dict, order: bool, monkeypatch) -> None:
    """The last bundle in before the U-th masked upload (each survivor's forward first, then its list) and after
    it (the list first): the reference's first round shows which, and the replay equals the reference in both."""
    assert _downlink_order(13, 12, "cells:3", 3, **net) is order
    on, off, taken, _, _ = _both(monkeypatch, 13, dict(z=1, U=12), "cells:3", rounds=1, **net)
    assert taken == 1 and on == off


def test_ties_decline_and_the_reference_runs(monkeypatch) -> None:
    """Identical users in one cell, no loss, deterministic compute: their encodings end together and their bundles
    ask for the air at one instant from different events; the replay declines with its reason and the reference
    gives the trace."""
    on, off, taken, refused, proto = _both(monkeypatch, 8, dict(z=1, U=5), "cells:1", compute=Deterministic(),
                                           loss=0.0, device_mac_rates=[4e6] * 8)
    assert refused == 4 and taken == 0
    assert on == off
    reasons = " ".join(r for kind, _, r in proto.sim.engine_paths.reasons if kind == "masked")
    assert "SimPy's order decides" in reasons


def test_proportional_fair_cells_decline_with_the_reason(monkeypatch) -> None:
    on, off, taken, refused, proto = _both(monkeypatch, 8, dict(z=1, U=6), "cells:2",
                                           scheduler="proportional_fair", snr_db=10.0)
    assert taken == 0 and refused == 0                 # declined in can_run, before the replay is tried
    assert on == off
    reasons = " ".join(r for kind, _, r in proto.sim.engine_paths.reasons if kind == "masked")
    assert "only round-robin cells are replayed" in reasons


def test_dropouts_energy_and_full_mode_run_the_reference_with_the_reason(monkeypatch) -> None:
    """Absent users (Bernoulli dropouts), an energy model (no backend accounts energy) and full mode (values that
    need their inputs): the backend declines each with its reason and the run is the reference's."""
    cases = [({"availability": BernoulliDropout(0.2)}, "not every user takes part"),
             ({"energy": {"tx_power_w": 0.2, "rx_power_w": 0.1}}, "energy model"),
             ({"mode": "full", "rounds": 2}, "full mode")]
    for kwargs, reason in cases:
        on, off, taken, _, proto = _both(monkeypatch, 10, dict(z=1, U=5), "cells:2", **kwargs)
        assert taken == 0 and on == off, reason
        assert reason in " ".join(r for kind, _, r in proto.sim.engine_paths.reasons if kind == "masked")


def test_the_engine_records_the_masked_backend_on_cells(monkeypatch) -> None:
    """The engine's paths (what ``fednet run --explain-engine`` prints) name the masked backend for every round on
    cells, with no reason to decline."""
    engine(monkeypatch)
    proto = _run(13, dict(z=2, U=9), "cells:3", rounds=3)
    paths = proto.sim.engine_paths
    assert paths.count("masked", "masked") == 3 and paths.count("reference", "masked") == 0
    assert not [r for kind, _, r in paths.reasons if kind == "masked"]
    assert "masked" in paths.explain()


@pytest.mark.parametrize("U", [1, 3, 8])
def test_mirrored_cells_decline_where_the_order_of_two_airs_decides(U: int, monkeypatch) -> None:
    """Two cells of the same four users (deterministic compute, no loss): each event of one cell has its twin in
    the other at the same instant, on another air.  The masked uploads arrive in pairs, so which of a pair is the
    U-th (and the order of the survivors' uploads) is SimPy's insertion order: the replay declines and the reference
    runs."""
    on, off, taken, refused, proto = _both(
        monkeypatch, 8, dict(z=min(1, U - 1), U=U), "cells:2", compute=Deterministic(), loss=0.0, rounds=2,
        device_mac_rates=[1e6, 2e6, 3e6, 5e6] * 2, uplink_bps=[1e6, 3e6, 2e6, 4e6] * 2,
        downlink_bps=[5e6, 6e6, 7e6, 9e6] * 2)
    assert taken == 0 and refused >= 1 and on == off
    reasons = " ".join(r for kind, _, r in proto.sim.engine_paths.reasons if kind == "masked")
    assert "masked uploads that arrive at one instant from different events" in reasons


def test_random_small_rounds_replay_or_decline_never_differ(monkeypatch) -> None:
    """40 drawn set-ups (3-8 users, 1-3 cells, U from 1 to D, rates from a few values so that events coincide,
    deterministic or shifted-exponential compute, with and without loss), two rounds each: with the backend allowed
    the run equals the reference's every time, most rounds are replayed, and the coincidences are declined."""
    rng = np.random.default_rng(2028)
    taken = declined = 0
    for trial in range(40):
        D = int(rng.integers(3, 9))
        U = int(rng.integers(1, D + 1))
        net = dict(device_mac_rates=list(rng.choice([1e6, 2e6, 4e6], D)),
                   uplink_bps=list(rng.choice([1e6, 2e6, 4e6], D)),
                   downlink_bps=list(rng.choice([2e6, 4e6, 8e6], D)), loss=float(rng.choice([0.0, 0.0, 0.2])),
                   header_overhead=0.0)
        compute = Deterministic() if rng.random() < 0.6 else ShiftedExponential(0.5)
        layout = f"cells:{min(D, int(rng.integers(1, 4)))}"
        on, off, t, r, _ = _both(monkeypatch, D, dict(z=min(1, U - 1), U=U), layout, compute=compute, rounds=2,
                                 seed=trial, **net)
        assert on == off, (trial, D, U, layout, net, compute)
        taken, declined = taken + t, declined + r
    assert taken >= 30 and declined >= 5, (taken, declined)
