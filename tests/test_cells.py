"""Shared cells (issue 28, item 3): devices of a cell share its airtime by equal shares (processor sharing),
checked against the closed forms with deterministic links (no loss, no overhead)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.errors import ConfigError
from fednet.sim.cells import SharedAir
from fednet.sim.compute import Deterministic
from fednet.sim.network import Message
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_cells, lte_star

R, B = 1e6, 200_000          # bit/s, bits of one message (b / R = 0.2 s alone)


def _sim(n: int, n_cells: int = 1) -> Simulation:
    g = lte_cells(n, n_cells=n_cells, uplink_bps=R, downlink_bps=2 * R, loss=0.0, header_overhead=0.0,
                  device_mac_rates=[1e6] * n)
    return Simulation(g, 0, device_compute=Deterministic())


def _upload(sim: Simulation, dev: int, at: float, out: dict, bits: int = B):
    yield sim.env.timeout(at)
    msg = Message(dev, sim.server.index, "x", None, bits, 1)
    yield from sim.transfer(msg)
    out[dev] = sim.now


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_n_equal_uploads_each_end_at_n_b_over_r(n: int) -> None:
    sim, done = _sim(n), {}
    for i in range(n):
        sim.env.process(_upload(sim, i, 0.0, done))
    sim.env.run()
    assert all(t == pytest.approx(n * B / R, rel=1e-12) for t in done.values()) and len(done) == n


def test_a_device_joining_mid_transfer_slows_the_other_as_processor_sharing_predicts() -> None:
    """A alone from 0 (work W = 0.2 s), B from t1 = 0.05 s: A ends at t1 + 2 (W - t1) = 0.35, B at 2 W = 0.4."""
    sim, done = _sim(2), {}
    sim.env.process(_upload(sim, 0, 0.0, done))
    sim.env.process(_upload(sim, 1, 0.05, done))
    sim.env.run()
    assert done[0] == pytest.approx(0.35, rel=1e-12) and done[1] == pytest.approx(0.4, rel=1e-12)


def test_unequal_transfers_and_separate_cells() -> None:
    """Work 0.1 and 0.3 s from 0 in one cell: 0.2 and 0.4; in two cells each alone: 0.1 and 0.3."""
    for n_cells, want in ((1, (0.2, 0.4)), (2, (0.1, 0.3))):
        sim, done = _sim(2, n_cells), {}
        sim.env.process(_upload(sim, 0, 0.0, done, bits=100_000))
        sim.env.process(_upload(sim, 1, 0.0, done, bits=300_000))
        sim.env.run()
        assert (done[0], done[1]) == pytest.approx(want, rel=1e-12)


def test_a_device_sends_its_own_messages_in_turn_and_downlinks_are_separate() -> None:
    sim, done = _sim(2), {}

    def two(dev):
        for k in range(2):
            msg = Message(dev, sim.server.index, "x", None, B, 1)
            yield from sim.transfer(msg)
        done[dev] = sim.now
    sim.env.process(two(0))
    sim.env.process(two(1))
    down = {}

    def download():
        yield from sim.transfer(Message(sim.server.index, 0, "m", None, 2 * B, 1))
        down[0] = sim.now
    sim.env.process(download())
    sim.env.run()
    assert done[0] == pytest.approx(0.8) and done[1] == pytest.approx(0.8)      # 4 transfers of 0.2 s, 2 at a time
    assert down[0] == pytest.approx(0.2)                                          # the downlink is its own air


@pytest.mark.backends                    # the backends' reasons to decline (all allowed)
def test_one_device_per_cell_is_the_star_and_the_vectorised_gather_replays_it() -> None:
    from fednet.protocol import registry
    from factories import make_task

    task = make_task(D=6)
    rates = [1e6, 2e6, 5e5, 1e6, 3e6, 1e6]
    star = Simulation(lte_star(6, loss=0.1, device_mac_rates=rates), 3, secret_seed=4)
    cells = Simulation(lte_cells(6, n_cells=6, loss=0.1, device_mac_rates=rates), 3, secret_seed=4)
    a = registry.get("conventional")(star, task, {}).run(3)
    b = registry.get("conventional")(cells, task, {}).run(3)
    assert a == b                                                                  # the same times and draws
    assert cells.engine_paths.count("batched", "gather") == 3                        # no process per device
    shared = Simulation(lte_cells(6, n_cells=1, loss=0.1, device_mac_rates=rates), 3, secret_seed=4)
    c = registry.get("conventional")(shared, task, {}).run(3)
    assert c[-1]["time_s"] > a[-1]["time_s"]                                       # six uploads share one cell


def test_bad_cells_are_refused() -> None:
    with pytest.raises(ValueError, match="n_cells must be in"):
        lte_cells(3, n_cells=4, device_mac_rates=[1e6] * 3)
    with pytest.raises(ValueError, match="scheduler must be one of"):
        lte_cells(3, scheduler="fair", device_mac_rates=[1e6] * 3)
    g = lte_cells(3, device_mac_rates=[1e6] * 3)
    g.graph["cell_scheduler"] = "fair"
    with pytest.raises(ConfigError, match="cell_scheduler must be one of"):
        Simulation(g, 0)
    air = SharedAir(Simulation(lte_star(1, device_mac_rates=[1e6]), 0).env, "cell")
    with pytest.raises(ValueError, match="airtime must be finite"):
        next(air.transmit(-1.0))
    assert np.isfinite(R)


def test_a_study_runs_in_cells(tmp_path) -> None:
    """network.kind = "lte_cells" keeps the network fields and adds n_cells; a bad n_cells is refused at load."""
    from fednet.study.config import StudyError, load_study
    from fednet.study.runner import run_study
    from test_faults import study_text, write

    base = study_text(network='kind = "lte_cells"\nparams = { n_cells = 2 }\nuplink_bps = 1e6', epochs=2)
    study = load_study(write(tmp_path, base))
    res = run_study(study, None, progress=False)
    star = run_study(load_study(write(tmp_path, study_text(network="uplink_bps = 1e6", epochs=2), "t.toml")), None,
                     progress=False)
    label = study.runs[0].name
    assert res.traces[label][0][-1]["time_s"] > star.traces[label][0][-1]["time_s"]     # three uploads per cell
    assert res.traces[label][0][-1]["accuracy"] == star.traces[label][0][-1]["accuracy"]
    with pytest.raises(StudyError, match=r"params.n_cells must be an integer in \[1, n_devices = 6\], got 7"):
        load_study(write(tmp_path, base.replace("n_cells = 2", "n_cells = 7"), "bad.toml"))
    with pytest.raises(StudyError, match="lte_cells takes the network fields and params n_cells, scheduler"):
        load_study(write(tmp_path, base.replace("n_cells = 2", "n_cells = 2, radius = 3"), "bad2.toml"))


@pytest.mark.backends                    # the backends' reasons to decline (all allowed)
def test_the_latency_floor_delays_delivery_not_the_link() -> None:
    """hop_latency_s L: a message arrives L after its last bit; the next one on the link does not wait for it;
    a relayed message pays it on both hops; a synchronous round of download and upload pays exactly 2 L."""
    L = 0.01
    g = lte_star(2, uplink_bps=R, downlink_bps=R, loss=0.0, header_overhead=0.0, device_mac_rates=[1e6] * 2,
                 hop_latency_s=L)
    sim, got = Simulation(g, 0, device_compute=Deterministic()), []

    def two():
        for _ in range(2):
            msg = Message(0, sim.server.index, "x", None, B, 1)
            sim.env.process(_deliver(msg))
            yield sim.env.timeout(0)

    def _deliver(msg):
        yield from sim.transfer(msg)
        got.append(sim.now)
    sim.env.process(two())
    relayed = []

    def relay():
        yield from sim.transfer(Message(1, 0, "r", None, B, 1))
        relayed.append(sim.now)
    sim.env.process(relay())
    sim.env.run()
    assert got == pytest.approx([B / R + L, 2 * B / R + L]) and relayed == pytest.approx([2 * (B / R + L)])
    assert "latency floor" in _conventional(L)[1] and _conventional(0.0)[1] == ""
    with_floor, without = _conventional(L)[0], _conventional(0.0)[0]
    for r, (a, b) in enumerate(zip(with_floor, without)):
        assert a["time_s"] - b["time_s"] == pytest.approx(2 * L * r, abs=1e-12)    # +2 L a round
        assert a["accuracy"] == b["accuracy"]


def _conventional(L: float):
    from fednet.protocol import registry
    from factories import make_task

    g = lte_star(5, loss=0.1, device_mac_rates=[1e6, 2e6, 5e5, 1e6, 3e6], hop_latency_s=L)
    sim = Simulation(g, 2, device_compute=Deterministic(), secret_seed=3)
    rows = registry.get("conventional")(sim, make_task(D=5), {}).run(4)
    return rows, ("latency floor" if "latency floor" in sim.engine_paths.explain() else "")


@pytest.mark.backends                    # the backends' reasons to decline (all allowed)
def test_energy_is_airtime_times_power_plus_joules_per_mac() -> None:
    """tx_power_w x uplink airtime + rx_power_w x downlink airtime + j_per_mac x MACs, per row; the summary gives
    the joules until each target; the backends decline (they do not account energy)."""
    from fednet.protocol import registry
    from fednet.study.results import summarize
    from factories import make_task

    energy = {"tx_power_w": 0.2, "rx_power_w": 0.05, "kappa": 1e-28, "cpu_hz": 2e9, "cycles_per_mac": 3.0}
    g = lte_star(4, loss=0.0, header_overhead=0.0, device_mac_rates=[1e6] * 4, uplink_bps=R, downlink_bps=2 * R,
                 energy=energy)
    sim = Simulation(g, 0, device_compute=Deterministic(), secret_seed=1)
    rows = registry.get("conventional")(sim, make_task(D=4), {}).run(3)
    jpm = 1e-28 * (2e9) ** 2 * 3.0
    for r in rows[1:]:
        want = 0.2 * r["bits_up"] / R + 0.05 * r["bits_down"] / (2 * R) + jpm * r["device_macs"]
        assert r["energy_j"] == pytest.approx(want, rel=1e-12)
    assert "energy model" in sim.engine_paths.explain()
    s = summarize({"c": {0: rows}}, [0.0], None)["runs"]["c"]
    assert s["energy_j_total"]["0"] == pytest.approx(sum(r["energy_j"] for r in rows))
    assert s["per_target"]["0"]["energy_j"]["0"] == pytest.approx(rows[0]["energy_j"])    # reached at round 0
    plain = Simulation(lte_star(4, device_mac_rates=[1e6] * 4), 0)
    assert "energy_j" not in registry.get("conventional")(plain, make_task(D=4), {}).run(1)[-1]
    with pytest.raises(ValueError, match="energy takes"):
        lte_star(2, device_mac_rates=[1e6] * 2, energy={"watts": 1})


def test_a_study_reports_energy_to_each_target(tmp_path) -> None:
    from fednet.study.config import StudyError, load_study
    from fednet.study.runner import run_study
    from test_faults import study_text, write

    text = study_text(network="energy = { tx_power_w = 0.2, cpu_hz = 1e9 }", epochs=2)
    res = run_study(load_study(write(tmp_path, text)), None, progress=False)
    run = next(iter(res.summary["runs"].values()))
    assert run["energy_j_total"]["0"] > 0 and "energy_j" in next(iter(run["per_target"].values()))
    with pytest.raises(StudyError, match="energy takes"):
        load_study(write(tmp_path, study_text(network="energy = { watts = 1.0 }"), "bad.toml"))
