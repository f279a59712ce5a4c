"""FedBuff with LightSecAgg masks (issue 29, item 2): the decoded buffered sum equals sum_u w_u Q(G_u) exactly in
the field for random arrival orders and dropouts; the server's view of one update is uniform (and the audit
fails when the mask is zeroed); check_protocol passes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from factories import make_task
from fednet.algebra.fields import uniform
from fednet.errors import ConfigError
from fednet.protocols.fedbuff_lightsecagg import FedBuffLightSecAgg
from fednet.sim.compute import BernoulliDropout, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

RATES = [2e6, 5e5, 1e6, 3e6, 7.5e5]


def _sim(D: int, seed: int, dropout: float = 0.0) -> Simulation:
    g = lte_star(D, device_mac_rates=[RATES[i % len(RATES)] for i in range(D)], loss=0.1)
    return Simulation(g, seed, device_compute=ShiftedExponential(1.0), secret_seed=seed + 100,
                      availability=BernoulliDropout(dropout) if dropout else None)


@pytest.mark.parametrize("seed,K,U,z,dropout,staleness", [
    (0, 2, 4, 1, 0.0, "sqrt"), (1, 3, 3, 2, 0.0, "none"), (2, 2, 4, 1, 0.2, "sqrt"), (3, 4, 5, 1, 0.1, "sqrt"),
])
def test_the_decoded_buffered_sum_is_exact(seed, K, U, z, dropout, staleness) -> None:
    D = 7
    proto = FedBuffLightSecAgg(_sim(D, seed, dropout), make_task(D=D),
                               {"buffer_size": K, "U": U, "z": z, "staleness": staleness, "check_decoding": True})
    rows = proto.run(8, strict=False)
    trained = [r for r in rows[1:] if not r["decode_failed"]]
    assert trained and rows[-1]["checked_rounds"] == len(trained)          # every decoded round was exact
    assert any(int(s) > 0 for r in trained for s in r["staleness"].split()) or staleness == "none"


def test_it_trains_like_fedbuff() -> None:
    """Masks cancel: the quantised weighted sum is FedBuff's sum to within the quantisation (accuracy alike)."""
    from fednet.protocols.fedbuff import FedBuff

    D = 6
    plain = FedBuff(_sim(D, 5), make_task(D=D), {"buffer_size": 3}).run(12)
    secure = FedBuffLightSecAgg(_sim(D, 5), make_task(D=D), {"buffer_size": 3, "U": 4}).run(12)
    assert abs(plain[-1]["accuracy"] - secure[-1]["accuracy"]) <= 0.05
    assert secure[-1]["time_s"] > plain[-1]["time_s"]                     # the masks cost time
    assert secure[-1]["bits_up"] > plain[-1]["bits_up"]


def _uploads(proto_cls, monkeypatch=None):
    D = 6
    proto = proto_cls(_sim(D, 9), make_task(D=D), {"buffer_size": 2, "U": 4, "check_decoding": True})
    seen = []
    send = proto.net.send

    def spy(src, dst, payload, *, kind, **kw):
        if kind == "masked_gradient":
            seen.append((payload, dict(proto.plain)))
        return (yield from send(src, dst, payload, kind=kind, **kw))
    proto.net.send = spy
    proto.run(4)
    return proto.config.p, seen


def _audit(p: int, seen) -> float:
    """p-value of a chi-square test that the server's masked uploads are uniform over GF(p) (16 bins)."""
    vals = np.concatenate([x for x, _ in seen]).astype(np.float64)
    counts = np.histogram(vals / p, bins=16, range=(0.0, 1.0))[0]
    return float(stats.chisquare(counts).pvalue)


def test_the_server_sees_uniform_uploads_and_the_audit_can_fail(monkeypatch) -> None:
    p, seen = _uploads(FedBuffLightSecAgg)
    assert _audit(p, seen) > 1e-4
    import fednet.protocols.fedbuff_lightsecagg as mod

    monkeypatch.setattr(mod, "uniform", lambda rng, q, shape: np.zeros(shape, dtype=np.int64))   # mutation: no mask
    p, seen = _uploads(FedBuffLightSecAgg)
    assert _audit(p, seen) < 1e-6


def test_check_protocol_passes_and_bad_settings_are_refused() -> None:
    from fednet.testing import check_protocol

    report = check_protocol(FedBuffLightSecAgg, {"buffer_size": 2, "U": 3}, task=make_task(D=6), rounds=3)
    assert "another secret seed leaves every time" in report.explain()
    with pytest.raises(ConfigError, match="U must satisfy z < U <= D"):
        FedBuffLightSecAgg(_sim(6, 0), make_task(D=6), {"buffer_size": 2, "U": 7})
    with pytest.raises(ConfigError, match="U must exceed z"):
        FedBuffLightSecAgg(_sim(6, 0), make_task(D=6), {"buffer_size": 2, "U": 2, "z": 2})
    assert uniform(np.random.default_rng(0), 11, (3,)).max() < 11
