"""The radio layer against Chen et al. (IEEE TWC 2021; issue 28's validation study): the waterfall BLER model's
formula, and the reduced validation of studies/radio_validation_report.py within its stated tolerances."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.topologies.radio import outage_probability, radio_star, waterfall_bler
from studies import radio_validation_report as rv

#: Chen et al.'s link in radio_star's terms (studies/radio_validation.toml): P = 0.01 W, h = d^-2, B N0 = 1e-14 W.
CHEN = dict(pathloss="power_law", pathloss_exponent=2.0, shadowing_db=0.0, tx_power_dbm=10.0, bs_power_dbm=30.0,
            noise_dbm_hz=-170.0, noise_figure_db=0.0, uplink_hz=1e6, downlink_hz=20e6, rate_model="shannon",
            bler_model="waterfall", waterfall_m=1.08, packet_bits=None, header_overhead=0.0)


def test_waterfall_loss_is_chens_formula() -> None:
    """Each link's loss is ``1 - exp(-m (I + B N0) / (P h))`` with the powers in watts, its rate ``B log2(1 + P h /
    (I + B N0))``; the downlink keeps its own interference unless it is lossless."""
    d = [20.0, 150.0, 333.0, 499.0]
    i_w = [1e-8, 3e-8, 7e-8, 1.1e-7]
    g = radio_star(4, rng=np.random.default_rng(0), distances_m=d, interference_w=i_w, downlink_interference_w=1.8e-7,
                   device_mac_rates=[1e6] * 4, **CHEN)
    for k in range(4):
        h = d[k] ** -2.0
        e = g.edges[k, "server"]
        assert e["uplink_loss"] == pytest.approx(1 - math.exp(-1.08 * (i_w[k] + 1e-14) / (0.01 * h)), rel=1e-9)
        assert e["uplink_bps"] == pytest.approx(1e6 * math.log2(1 + 0.01 * h / (i_w[k] + 1e-14)), rel=1e-9)
        assert e["downlink_loss"] == pytest.approx(1 - math.exp(-1.08 * (1.8e-7 + 2e-13) / (1.0 * h)), rel=1e-9)
        assert g.nodes[k]["distance_m"] == d[k]
    lossless = radio_star(4, rng=np.random.default_rng(0), distances_m=d, interference_w=i_w,
                          downlink_lossless=True, device_mac_rates=[1e6] * 4, **CHEN)
    assert all(lossless.edges[k, "server"]["downlink_loss"] == 0.0 for k in range(4))
    assert all(lossless.edges[k, "server"]["uplink_loss"] == g.edges[k, "server"]["uplink_loss"] for k in range(4))


def test_waterfall_is_the_rayleigh_outage_at_threshold_m() -> None:
    """``1 - exp(-m / SINR)`` is the probability that a Rayleigh-faded SINR (``|h|^2 ~ Exp(1)``) falls below ``m``:
    the outage at the rate with ``2^(r/B) - 1 = m``, and a Monte Carlo estimate within 5 sigma."""
    m, sinr, B = 1.08, 3.0, 1e6
    q = waterfall_bler(sinr, m)
    assert q == pytest.approx(outage_probability(B * math.log2(1 + m), B, sinr), rel=1e-12)
    h2 = np.random.default_rng(11).exponential(1.0, 200_000)
    est = float(np.mean(sinr * h2 < m))
    assert abs(est - q) <= 5 * math.sqrt(q * (1 - q) / h2.size)


def test_new_radio_parameters_are_checked() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="needs rate_model = 'shannon'"):
        radio_star(2, rng=rng, bler_model="waterfall")
    with pytest.raises(ValueError, match="bler_model must be one of"):
        radio_star(2, rng=rng, bler_model="ber")
    with pytest.raises(ValueError, match="interference_w has 3 entries for 2 devices"):
        radio_star(2, rng=rng, interference_w=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="downlink_interference_w must be finite watts"):
        radio_star(2, rng=rng, downlink_interference_w=-1e-9)
    with pytest.raises(ValueError, match="distances_m has 1 entries for 2 devices"):
        radio_star(2, rng=rng, distances_m=[10.0])
    with pytest.raises(ValueError, match="placement must be one of"):
        radio_star(2, rng=rng, placement="hexagon")
    with pytest.raises(ValueError, match="waterfall_m must be a positive"):
        radio_star(2, rng=rng, rate_model="shannon", bler_model="waterfall", waterfall_m=0.0)


def test_distance_placement_is_uniform_in_distance() -> None:
    """``placement = "distance"`` draws ``d ~ U(lo, hi)`` (mean (lo + hi) / 2, within 5 sigma); ``"area"`` the
    uniform drop (mean ``2 (hi^3 - lo^3) / (3 (hi^2 - lo^2))``)."""
    n, lo, hi = 4000, 1.0, 500.0
    for placement, mean, var in (("distance", (lo + hi) / 2, (hi - lo) ** 2 / 12),
                                 ("area", 2 * (hi ** 3 - lo ** 3) / (3 * (hi ** 2 - lo ** 2)),
                                  (hi ** 2 + lo ** 2) / 2 - (2 * (hi ** 3 - lo ** 3) / (3 * (hi ** 2 - lo ** 2))) ** 2)):
        g = radio_star(n, rng=np.random.default_rng(5), placement=placement, min_distance_m=lo, radius_m=hi,
                       device_mac_rates=[1e6] * n)
        d = np.array([g.nodes[i]["distance_m"] for i in range(n)])
        assert abs(d.mean() - mean) <= 5 * math.sqrt(var / n), placement


def test_reduced_validation_reproduces_chen() -> None:
    """The report at a reduced size: every reproduced number within its stated tolerance of Chen et al.'s closed
    form (per-user q, l^U, l^D, e and budget at 5 distances x 2 RBs; means over 300 drawn users per RB; the real
    model size's factor 2^20 / 10^6; one FL round's trace time and joules)."""
    rows = (rv.per_distance(0, 300) + rv.drawn(0, 300) + [rv.true_size_factor(0)] + rv.one_round(0))
    bad = [(r.what, r.paper, r.fednet, r.tol) for r in rows if not r.ok]
    assert not bad, bad
    assert len(rows) == 10 * 6 + 6 * 3 + 1 + 2                      # one_round(0) has no retransmission
    exact = [r for r in rows if "m l^" in r.what and r.what.endswith(" s")]    # per distance: airtimes
    assert len(exact) == 20 and all(abs(r.ratio - 1) < 1e-5 for r in exact)
    real = next(r for r in rows if r.what.endswith("real 636,160 bits"))
    assert real.ratio == pytest.approx(2 ** 20 / 1e6, rel=1e-5)
    budget = {r.what: r.fednet for r in rows if r.what.endswith("meets budgets")}
    assert budget["RB1 d=500m meets budgets"] == 1.0 and budget["RB6 d=200m meets budgets"] == 0.0


def test_a_wrong_model_fails_the_validation() -> None:
    """The check can fail: with the waterfall threshold doubled, the packet errors leave their tolerance."""
    spec = rv.network_spec(distances_m=[300.0, 500.0], interference_w=1e-8, waterfall_m=2.16)
    recs = rv.simulate(spec, 0, 300)
    for d, r in zip((300.0, 500.0), recs):
        q = float(rv.paper_q(d, 1e-8))
        assert abs(r.lost / r.sent - q) > 4 * math.sqrt(q * (1 - q) / r.sent)
