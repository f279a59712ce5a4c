"""A cancelled transfer's radio energy (issue 28, item 4): its radio was on until the server stopped waiting, so it is
charged the airtime it had -- the time since it started on a dedicated link, the airtime it was served on a cell
(its share of the air so far), the slots it held under proportional fair -- in closed form."""

from __future__ import annotations

import pytest
import simpy

from fednet.sim.cells import ProportionalFairAir, SharedAir
from fednet.sim.compute import Deterministic
from fednet.sim.network import Message
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_cells, lte_star

R, B = 1e6, 200_000                  # bit/s, bits of one message: 0.2 s of airtime alone
TX, RX = 0.2, 0.05                   # W
ENERGY = {"tx_power_w": TX, "rx_power_w": RX}


def _cancelled_at(air, t_cancel: float, *snr: float) -> dict[str, float]:
    """A and B (0.2 s of airtime each) from 0 on ``air``; B cancelled at ``t_cancel``: A's end, B's ``held_s``."""
    env = air.env
    got: dict[str, float] = {}

    def send(name: str):
        try:
            yield from air.transmit(0.2, *snr)
            got[name] = env.now
        except simpy.Interrupt as stop:
            got[name + ".held"] = stop.held_s

    env.process(send("A"))
    b = env.process(send("B"))

    def cancel():
        yield env.timeout(t_cancel)
        b.interrupt("cancelled")

    env.process(cancel())
    env.run()
    return got


def test_a_cancelled_transfer_reports_the_airtime_it_was_served() -> None:
    """Round robin: B shares the air with A for 0.1 s, so it was served 0.05 s; proportional fair: it held half the
    slots for 0.1 s, 0.05 s (the slots, whatever the rate)."""
    rr = _cancelled_at(SharedAir(simpy.Environment(), "cell"), 0.1)
    assert rr["B.held"] == pytest.approx(0.05, rel=1e-12) and rr["A"] == pytest.approx(0.25, rel=1e-12)
    pf = _cancelled_at(ProportionalFairAir(simpy.Environment(), "cell"), 0.1, 10.0)
    assert pf["B.held"] == pytest.approx(0.05, rel=1e-12)


def _sims(graph) -> Simulation:
    return Simulation(graph, 0, device_compute=Deterministic())


def _upload(sim: Simulation, dev: int, out: dict):
    try:
        yield from sim.transfer(Message(dev, sim.server.index, "x", None, B, 1))
        out[dev] = sim.now
    except simpy.Interrupt:
        out[dev] = -sim.now


def _run(sim: Simulation, cancel_at: float) -> dict[int, float]:
    """Devices 0 and 1 upload B bits from 0; device 1's upload is cancelled at ``cancel_at``."""
    done: dict[int, float] = {}
    sim.env.process(_upload(sim, 0, done))
    b = sim.env.process(_upload(sim, 1, done))

    def cancel():
        yield sim.env.timeout(cancel_at)
        b.interrupt("cancelled")

    sim.env.process(cancel())
    sim.env.run()
    return done


def test_on_the_star_a_cancelled_upload_is_charged_until_it_was_cancelled() -> None:
    """Dedicated links: device 0's upload 0.2 s at TX, device 1's cancelled after 0.08 s: TX (0.2 + 0.08)."""
    sim = _sims(lte_star(2, uplink_bps=R, downlink_bps=R, loss=0.0, header_overhead=0.0,
                         device_mac_rates=[1e6] * 2, energy=ENERGY))
    done = _run(sim, 0.08)
    assert done == {0: pytest.approx(0.2, rel=1e-12), 1: -0.08}
    assert sim.counters.device_energy_j == pytest.approx(TX * (0.2 + 0.08), rel=1e-12)
    assert sim.counters.bits_up == B                      # the cancelled message's bits are not counted


@pytest.mark.parametrize("scheduler", ["round_robin", "proportional_fair"])
def test_in_a_cell_a_cancelled_upload_is_charged_the_airtime_it_was_served(scheduler: str) -> None:
    """One cell, both uploads from 0, device 1's cancelled at 0.1 s, when it had been served 0.05 s (half the air):
    round robin TX (0.2 + 0.05) -- device 0's full airtime and device 1's share; proportional fair charges slots held:
    device 0 held half the slots for 0.1 s and all of them after, and device 1 0.05 s."""
    g = lte_cells(2, n_cells=1, uplink_bps=R, downlink_bps=R, loss=0.0, header_overhead=0.0,
                  device_mac_rates=[1e6] * 2, energy=ENERGY, scheduler=scheduler, snr_db=10.0)
    sim = _sims(g)
    done = _run(sim, 0.1)
    assert done[1] == -0.1
    if scheduler == "round_robin":
        assert done[0] == pytest.approx(0.25, rel=1e-12)
        assert sim.counters.device_energy_j == pytest.approx(TX * (0.2 + 0.05), rel=1e-12)
    else:
        held_0 = 0.05 + (done[0] - 0.1)                    # half the slots until 0.1 s, then all of them
        assert sim.counters.device_energy_j == pytest.approx(TX * (held_0 + 0.05), rel=1e-9)


def test_without_an_energy_model_nothing_is_charged() -> None:
    sim = _sims(lte_star(2, uplink_bps=R, downlink_bps=R, loss=0.0, header_overhead=0.0,
                         device_mac_rates=[1e6] * 2))
    _run(sim, 0.08)
    assert sim.counters.device_energy_j == 0.0
