"""Geometry and channel (issue 28, items 1-2): path loss, Rayleigh outage, link adaptation to a BLER target, and
the simulated retransmissions of a radio_star link against the closed form, within sampling error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.sim.compute import Deterministic
from fednet.sim.network import Message
from fednet.sim.simulation import Simulation
from fednet.topologies.radio import outage_probability, pathloss_db, radio_star, rate_for_outage


def test_pathloss_models() -> None:
    assert pathloss_db(np.array([1000.0]))[0] == pytest.approx(128.1)
    assert pathloss_db(np.array([100.0]))[0] == pytest.approx(128.1 - 37.6)
    assert pathloss_db(np.array([1.0]), "free_space", 2e9)[0] == pytest.approx(38.47, abs=0.01)
    with pytest.raises(ValueError, match="pathloss model must be one of"):
        pathloss_db(np.array([1.0]), "hata")


@pytest.mark.parametrize("snr_db,r_over_b", [(0.0, 0.5), (10.0, 2.0), (20.0, 4.0)])
def test_rayleigh_outage_matches_monte_carlo(snr_db: float, r_over_b: float) -> None:
    """P(B log2(1 + SNR |h|^2) < r), |h|^2 ~ Exp(1), against 1 - exp(-(2^(r/B) - 1)/SNR): 200,000 draws, 5 sigma."""
    snr, B = 10 ** (snr_db / 10), 1e6
    h2 = np.random.default_rng(7).exponential(1.0, 200_000)
    est = float(np.mean(B * np.log2(1 + snr * h2) < r_over_b * B))
    p = outage_probability(r_over_b * B, B, snr)
    assert abs(est - p) <= 5 * math.sqrt(p * (1 - p) / h2.size)
    assert outage_probability(rate_for_outage(0.1, B, snr), B, snr) == pytest.approx(0.1, rel=1e-12)


def test_a_radio_link_retransmits_as_its_bler() -> None:
    """Packets on a device's uplink are lost with its outage probability (the BLER target): the retransmissions
    counted over 4,000 single-packet messages estimate it within 5 sigma."""
    g = radio_star(3, rng=np.random.default_rng(1), bler=0.2, device_mac_rates=[1e6] * 3, packet_bits=None)
    sim = Simulation(g, 0, device_compute=Deterministic())
    dev = sim.devices[0]
    assert dev.uplink.loss == pytest.approx(0.2, rel=1e-9) and dev.downlink.loss == pytest.approx(0.2, rel=1e-9)
    n = 4000

    def send():
        for k in range(n):
            sim.round = k
            yield from sim.transfer(Message(0, sim.server.index, "x", None, 1000, 1, round=k))
    sim.env.process(send())
    sim.env.run()
    extra = sim.counters.retransmissions
    est = extra / (n + extra)                                     # lost / sent, geometric trials
    assert abs(est - 0.2) <= 5 * math.sqrt(0.2 * 0.8 / (n + extra))


def test_places_rates_and_reproducibility() -> None:
    a = radio_star(20, rng=np.random.default_rng(3), device_mac_rates=[1e6] * 20)
    b = radio_star(20, rng=np.random.default_rng(3), device_mac_rates=[1e6] * 20)
    d = [a.nodes[i]["distance_m"] for i in range(20)]
    assert all(35.0 <= x <= 500.0 for x in d) and d == [b.nodes[i]["distance_m"] for i in range(20)]
    ups = [a.edges[i, "server"]["uplink_bps"] for i in range(20)]
    snr = [a.nodes[i]["snr_up_db"] for i in range(20)]
    order = np.argsort(snr)
    assert list(np.array(ups)[order]) == sorted(ups)              # a better channel gets a higher rate
    shannon = radio_star(20, rng=np.random.default_rng(3), rate_model="shannon", device_mac_rates=[1e6] * 20)
    assert all(shannon.edges[i, "server"]["uplink_bps"] > ups[i] for i in range(20))   # no margin for fading
    cells = radio_star(6, rng=np.random.default_rng(3), n_cells=2, device_mac_rates=[1e6] * 6)
    assert [cells.nodes[i]["cell"] for i in range(6)] == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="bler must be in"):
        radio_star(2, rng=np.random.default_rng(0), bler=1.0)
    with pytest.raises(ValueError, match="needs the topology's rng"):
        radio_star(2)


def test_a_study_runs_on_a_radio_star(tmp_path) -> None:
    from fednet.study.config import load_study
    from fednet.study.runner import run_study
    from test_faults import study_text, write

    text = study_text(network='kind = "radio_star"\nparams = { radius_m = 300.0, bler = 0.1 }', epochs=2)
    text = text.replace("loss = 0.0\n", "")            # radio_star draws its own losses (a set loss is refused)
    res = run_study(load_study(write(tmp_path, text)), None, progress=False)
    assert next(iter(res.traces.values()))[0][-1]["time_s"] > 0


def test_the_topology_is_drawn_where_the_devices_are(tmp_path) -> None:
    from fednet.topologies.secagg_tree import draw_topology

    g = radio_star(8, rng=np.random.default_rng(2), n_cells=2, device_mac_rates=[1e6] * 8)
    assert all(math.hypot(g.nodes[i]["x_m"], g.nodes[i]["y_m"]) == pytest.approx(g.nodes[i]["distance_m"])
               for i in range(8))
    out = draw_topology(g, tmp_path / "t.png", n_groups=2, title="radio")
    assert out.read_bytes()[:4] == b"\x89PNG"


# -- CQI table link adaptation (rate_model = "cqi_table") -----------------------------------------------------------

#: 3GPP TS 36.213 Table 7.2.3-1: (modulation order, code rate x 1024) of CQI 1..15.
_MCS = [(2, 78), (2, 120), (2, 193), (2, 308), (2, 449), (2, 602), (4, 378), (4, 490), (4, 616), (6, 466), (6, 567),
        (6, 666), (6, 772), (6, 873), (6, 948)]


def test_the_cqi_table_is_the_standards_and_its_thresholds_rise() -> None:
    """Each efficiency is modulation order x code rate / 1024 rounded half up to 4 decimals (how the table is built:
    4 x 616 / 1024 = 2.40625 is listed as 2.4063); thresholds and efficiencies strictly increase."""
    from fednet.topologies.radio import CQI_EFFICIENCY, CQI_SNR_DB

    assert len(CQI_EFFICIENCY) == len(CQI_SNR_DB) == 15
    assert list(CQI_EFFICIENCY) == [math.floor(m * r / 1024 * 1e4 + 0.5) / 1e4 for m, r in _MCS]
    assert all(a < b for a, b in zip(CQI_SNR_DB, CQI_SNR_DB[1:]))
    assert all(a < b for a, b in zip(CQI_EFFICIENCY, CQI_EFFICIENCY[1:]))


def test_the_right_cqi_is_picked_at_boundary_snrs() -> None:
    from fednet.topologies.radio import CQI_SNR_DB, cqi_for_snr

    for k, t in enumerate(CQI_SNR_DB, start=1):
        assert cqi_for_snr(t) == k                                   # the threshold itself is met
        assert cqi_for_snr(float(np.nextafter(t, -np.inf))) == k - 1
    assert cqi_for_snr(-30.0) == 0 and cqi_for_snr(60.0) == 15 and cqi_for_snr(5) == 7
    with pytest.raises(ValueError, match="snr_db must be a finite number of dB, got nan"):
        cqi_for_snr(float("nan"))


def test_cqi_table_rates_are_efficiency_times_bandwidth() -> None:
    """Each link's rate is eff(CQI(mean SNR)) x B and its per-packet loss the 10 % BLER; a device below CQI 1 is
    refused naming it; a BLER other than the table's is refused."""
    from fednet.topologies.radio import CQI_BLER, CQI_EFFICIENCY, cqi_for_snr

    g = radio_star(30, rng=np.random.default_rng(4), rate_model="cqi_table", radius_m=250.0, uplink_hz=2e6,
                   downlink_hz=5e6, device_mac_rates=[1e6] * 30)
    cqis = set()
    for i in range(30):
        e, node = g.edges[i, "server"], g.nodes[i]
        up, down = cqi_for_snr(node["snr_up_db"]), cqi_for_snr(node["snr_down_db"])
        cqis.add(up)
        assert e["uplink_bps"] == CQI_EFFICIENCY[up - 1] * 2e6 and e["downlink_bps"] == CQI_EFFICIENCY[down - 1] * 5e6
        assert e["uplink_loss"] == e["downlink_loss"] == CQI_BLER == 0.1
    assert len(cqis) >= 4                                            # the draw spans several CQIs
    with pytest.raises(ValueError, match=r"device \d+ is out of range on its uplink: mean SNR -?\d+\.\d+ dB is below "
                                         r"CQI 1's threshold -6.934 dB"):
        radio_star(30, rng=np.random.default_rng(4), rate_model="cqi_table", radius_m=5000.0, min_distance_m=3000.0,
                   device_mac_rates=[1e6] * 30)
    with pytest.raises(ValueError, match="thresholds are defined at, 0.1; got bler = 0.2"):
        radio_star(3, rng=np.random.default_rng(4), rate_model="cqi_table", bler=0.2, device_mac_rates=[1e6] * 3)
    with pytest.raises(ValueError, match="rate_model must be one of"):
        radio_star(3, rng=np.random.default_rng(4), rate_model="mcs", device_mac_rates=[1e6] * 3)
