"""LightSecAgg baseline: exact unmasking on the engine, survivor sets, U, timing = full."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.protocols.lightsecagg import LightSecAgg, LightSecAggConfig, mask_upload, unmask_aggregate
from fednet.algebra.fields import uniform
from fednet.codes.lightsecagg import default_lsa_points, lsa_aggregate_encoded, lsa_encode_mask
from factories import make_sim, make_task


def test_unmask_pure():
    p, N, U, T, b = 2**32 - 5, 5, 3, 1, 16
    rng = np.random.default_rng(0)
    alphas, betas = default_lsa_points(N, U)
    G = [rng.uniform(-4, 4, (4, 3)) for _ in range(N)]
    masks = [uniform(rng, p, 12) for _ in range(N)]
    enc = [lsa_encode_mask(masks[i], U, T, p, rng, alphas, betas) for i in range(N)]
    up = [mask_upload(G[i], masks[i], b, p, N) for i in range(N)]
    U1 = [0, 2, 3, 4]
    s = np.stack([lsa_aggregate_encoded([enc[i][j] for i in U1], p) for j in U1])
    out = unmask_aggregate([up[i] for i in U1], s[1:], [alphas[j] for j in U1[1:]], betas, U, T, (4, 3), b, p)
    want = sum(np.rint(G[i] * 2.0**b) / 2.0**b for i in U1)
    assert np.array_equal(out, want)


def test_field_too_small_is_refused():
    with pytest.raises(ValueError, match="field too small"):
        mask_upload(np.full((2, 2), 1e6), np.zeros(4, np.int64), 16, 2**31 - 1, 100)
    with pytest.raises(ValueError, match="U must exceed z"):
        LightSecAggConfig(z=3, U=3)
    with pytest.raises(ValueError, match="U must satisfy"):
        LightSecAgg.check(LightSecAggConfig(z=1, U=9), 8)
    with pytest.raises(ValueError, match="prime"):
        LightSecAggConfig(p=2**32)


def test_protocol_server_recovers_sum_of_survivors():
    """Full mode: the update equals conventional FL on exactly the survivors' quantised gradients."""
    D, U, T = 8, 6, 2
    p = LightSecAgg(make_sim(D, seed=3), make_task(D=D), dict(z=T, U=U))
    rows = p.run(3)
    for r in rows[1:]:
        assert len(r["used"].split()) == U
    # replay: the same minibatches (same streams) on the same survivors give the same model
    q = LightSecAgg(make_sim(D, seed=3), make_task(D=D), dict(z=T, U=U, mode="timing"))
    q.run(3)
    assert np.allclose(p.theta, q.theta, rtol=0, atol=1e-4)  # batched vs per-device float rounding
    # the server's plaintext view: masked models and aggregated masks only
    server_plain = {m.kind for m in p.server.view if m.dst == p.server.index and not m.kind.endswith("_relay")}
    assert server_plain == {"masked_model", "aggregated_mask"}


@pytest.mark.parametrize("parallel,relay", [(True, "bundled"), (False, "bundled"), (True, "per_message")])
def test_timing_equals_full(parallel, relay):
    D = 8
    rows = {}
    for mode in ("full", "timing"):
        p = LightSecAgg(make_sim(D, seed=5, loss=0.1), make_task(D=D),
                        dict(z=1, U=7, mode=mode, offline_parallel=parallel, mask_relay=relay))
        rows[mode] = p.run(3)
    for a, b in zip(rows["full"], rows["timing"]):
        assert a["time_s"] == pytest.approx(b["time_s"])
        assert (a["bits_up"], a["device_macs"], a["server_macs"], a["used"]) == (
            b["bits_up"], b["device_macs"], b["server_macs"], b["used"])


@pytest.mark.parametrize("relay", ["bundled", "per_message"])
def test_overlap_is_not_slower_deterministic(relay):
    D = 8
    t = {}
    for par in (True, False):
        p = LightSecAgg(make_sim(D, deterministic=True), make_task(D=D),
                        dict(z=1, U=8, offline_parallel=par, mask_relay=relay))
        t[par] = p.run(2)[-1]["time_s"]
    assert t[True] < t[False]


def test_u_equal_n_uses_everyone_and_mask_traffic():
    D, d, c, T = 6, 6, 3, 1
    p = LightSecAgg(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c), dict(z=T))
    rows = p.run(1)
    assert rows[1]["used"] == "0 1 2 3 4 5"
    L = -(-(d * c) // (D - T))
    # per user: N-1 encoded masks (relayed: up and down), d c masked model, L aggregated mask
    assert rows[1]["bits_up"] == 32 * D * ((D - 1) * L + d * c + L)
