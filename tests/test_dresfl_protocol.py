"""DReS-FL on the engine (Shao et al., Alg. 1): exactness, modes, threshold, paired dropouts, privacy audit."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from factories import make_task
from fednet.codes.dresfl import DRESFL_PRIME_200
from fednet.protocol import registry
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.dropout import ExtremeDropout, PerClientDropout
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

CFG = {"hidden": [3, 3], "batch_size": 8, "weight_bits": 4}          # deg(g) = 8, R = 9 with K = T = 1


def _run(D=10, seed=3, rounds=4, availability=None, task=None, **cfg):
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), seed,
                     availability=availability or PerClientDropout([0.05] * D))
    proto = registry.get("dresfl")(sim, task or make_task(D=D, n=20, d=6, c=3), {**CFG, **cfg})
    proto.run(rounds)
    return proto


def test_full_and_timing_agree_and_decode_exactly():
    """Full mode decodes every round bit for bit (its observer raises otherwise); timing mode gives the
    same times, traffic, MACs and parameters without the coded data."""
    full, timing = _run(mode="full"), _run(mode="timing")
    cols = ["time_s", "bits_up", "bits_down", "device_macs", "server_macs", "used", "decode_failed"]
    assert [[r[c] for c in cols] for r in full.trace] == [[r[c] for c in cols] for r in timing.trace]
    for k in full.params:
        assert np.array_equal(np.asarray(full.params[k]), np.asarray(timing.params[k]))
    assert full.decoded_rounds == 4
    # one-time sharing: N (N - 1) shares of (m_i / K)(d_x + d_y) elements of 200 bits each
    assert full.trace[0]["bits_up"] == 10 * 9 * 20 * (6 + 3) * 200
    assert full.trace[1]["bits_up"] == full.R * full.n_params * 200      # the first R uploads


def test_observer_catches_a_wrong_decode(monkeypatch):
    from fednet.protocols import dresfl

    real = dresfl.decode_gradients

    def corrupt(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0]["b1"] = (np.asarray(out[0]["b1"]).astype(object) + 1) % DRESFL_PRIME_200
        return out

    monkeypatch.setattr(dresfl, "decode_gradients", corrupt)
    with pytest.raises(AssertionError, match="differs"):
        _run(rounds=1)


def test_recovery_threshold_and_skipped_rounds():
    """Theorem 1: N = R clients decode with no dropout; fewer present clients skip the round (footnote 6)."""
    with pytest.raises(ValueError, match="needs N >= "):
        _run(D=8)
    p = _run(D=9, availability=AlwaysAvailable(), rounds=2)
    assert p.decoded_rounds == 2 and not any(r["decode_failed"] for r in p.trace)
    q = _run(D=10, availability=PerClientDropout([0.02] * 8 + [0.6] * 2), rounds=12, seed=4)
    failed = [r["decode_failed"] for r in q.trace[1:]]
    assert any(failed) and not all(failed)
    for r in q.trace[1:]:
        n_present = 10 - len(r["dropped"].split())
        assert r["decode_failed"] == (n_present < 9)
        assert r["skipped"] == r["decode_failed"]


def test_dropouts_paired_with_baselines():
    D, seed = 10, 21
    task = make_task(D=D, n=20, d=6, c=3)
    dres = _run(D=D, seed=seed, availability=ExtremeDropout(D, seed), rounds=10, task=task, mode="timing")
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), seed, availability=ExtremeDropout(D, seed))
    fed = registry.get("fedavg")(sim, task, {"hidden": [3, 3], "batch_size": 8})
    fed.run(10)
    assert [r["dropped"] for r in dres.trace[1:]] == [r["dropped"] for r in fed.trace[1:]]


def _coded_view(T: int) -> np.ndarray:
    """Everything client 0 received in the sharing phase, as field elements."""
    p = _run(D=10, T=T, rounds=0, mode="full")
    vals = []
    for msg in p.devices[0].view:
        if msg.kind == "coded_data":
            vals.append(np.asarray(msg.payload.x.to_field()).reshape(-1))
            vals.append(np.asarray(msg.payload.y.to_field()).reshape(-1))
    return np.concatenate(vals)


def test_privacy_audit_one_colluder_sees_uniform_shares():
    """T = 1: a colluding client's view of the others' coded data is uniform over GF(p) (chi-square over 16
    equal bins of the field); the same audit rejects T = 0 (power check: the shares are then the data)."""
    bins = 16
    for T, uniform in ((1, True), (0, False)):
        v = _coded_view(T)
        assert v.size == 9 * 20 * 9
        idx = np.array([int(x) * bins // DRESFL_PRIME_200 for x in v])
        counts = np.bincount(idx, minlength=bins)
        pvalue = stats.chisquare(counts).pvalue
        assert (pvalue > 1e-3) if uniform else (pvalue < 1e-6)
