"""The bundled exchange's forwards without processes (:data:`fednet.protocol.primitives.REPLAY_FORWARDS`) equal the
process path bit for bit.

LightSecAgg's mask exchange runs with the switch on and off and must give the same trace (times, bits,
retransmissions, MACs, survivors), the same messages in every node's view and relay list and the same keyed-draw
counters (:func:`test_fast_path.snapshot`), the replay being really taken: on the pinned and at-scale scenarios
(in tests/test_bulk_exchange.py, with the bulk exchange's own check), with ties everywhere (identical loss-free links, deterministic compute), and where the round ends while forwards
to dropped users are still under way (they are cut as their processes would be).
"""

from __future__ import annotations

import pytest

import fednet.protocol.primitives as primitives
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import run_both  # noqa: E402


def _both(make, monkeypatch) -> tuple:
    """Snapshots with the forwards replayed and as processes, and how often the replay was taken."""
    return run_both(make, monkeypatch, "REPLAY_FORWARDS", "_replay_forwards")


# The pinned and at-scale LightSecAgg scenarios with the replay on and off: tests/test_bulk_exchange.py (SHORTCUTS).


def _lightsecagg(g, compute, params: dict, rounds: int = 3):
    from fednet.protocol import registry
    import fednet.protocols.lightsecagg  # noqa: F401
    from test_pinned_traces import digits_task
    proto = registry.get("lightsecagg")(Simulation(g, 3, device_compute=compute),
                                        digits_task(g.number_of_nodes() - 1, 16, "iid"), params)
    proto.run(rounds)
    return proto


@pytest.mark.parametrize("offline_parallel", [True, False])
def test_replayed_forwards_ties(offline_parallel: bool, monkeypatch) -> None:
    """Identical devices, no loss, deterministic compute (ties everywhere): SimPy's order is kept."""
    def make():
        return _lightsecagg(lte_star(12, loss=0.0, device_mac_rates=[4e6] * 12), Deterministic(),
                            dict(z=2, U=9, offline_parallel=offline_parallel, mode="timing"))
    on, off, taken = _both(make, monkeypatch)
    assert taken > 0
    assert on == off


@pytest.mark.parametrize("mode", ["timing", "full"])
def test_replayed_forwards_cut_at_the_round_end(mode: str, monkeypatch) -> None:
    """Three users with slow links drop out of U1 and are still receiving their forwards when the round ends:
    those forwards are cut (hop uncounted, link released) as their interrupted processes are."""
    down = [10e6] * 9 + [2e4] * 3
    up = [5e6] * 9 + [1e4] * 3

    def make():
        g = lte_star(12, loss=0.1, uplink_bps=up, downlink_bps=down, device_mac_rates=[4e6] * 12)
        return _lightsecagg(g, ShiftedExponential(0.5), dict(z=2, U=9, mode=mode))
    on, off, taken = _both(make, monkeypatch)
    assert taken > 0
    assert on == off
    for row in on[0][1:]:                                   # the slow users are never survivors
        assert not {"9", "10", "11"} & set(row["used"].strip("'").split())
    monkeypatch.setattr(primitives, "REPLAY_FORWARDS", True)
    proto = make()
    got = [m for i in (9, 10, 11) for m in proto.sim.devices[i].view if m.kind == "encoded_mask_relay"]
    assert len(got) < 3 * 3                                  # some forwards to them never arrived (cut)
