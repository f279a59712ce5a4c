"""FedVS math (fednet.codes.fedvs): exact decoding from every threshold set, decode failures, T-privacy, field size."""

from itertools import combinations

import numpy as np
import pytest
from scipy.stats import chisquare

from fednet.codes import fedvs as fv

P = 2**61 - 1  # Mersenne prime, int64 storage


def _network(N, K, T, d=(3, 2, 4, 1, 2, 3, 2), D=(1, 2, 1, 3, 1, 2, 1), M=6, h=3, seed=0, l_x=6, l_w=8):
    rng = np.random.default_rng(seed)
    alphas, betas = fv.default_points(K, T, N)
    d, D = d[:N], D[:N]
    x_bars, w_bars, dshares, mshares = [], [], [], []
    for n in range(N):
        x = rng.uniform(-1, 1, size=(M, d[n]))
        w = rng.normal(0, 0.5, size=(d[n] * D[n], h))
        xb = fv.quantize_data(fv.powers(x, D[n]), l_x, P)
        wb = fv.quantize_model(w, l_w, P, rng)
        x_bars.append(xb)
        w_bars.append(wb)
        dshares.append(fv.share_data(xb, K, T, alphas, betas, P, rng))     # (N, M/K, d D)
        mshares.append(fv.share_model(wb, K, T, alphas, betas, P, rng))    # (N, d D, h)
    coded = np.stack([fv.coded_embedding([dshares[n][j] for n in range(N)], [mshares[n][j] for n in range(N)], P)
                      for j in range(N)])
    return alphas, betas, x_bars, w_bars, coded


@pytest.mark.parametrize("N,K,T", [(7, 2, 1), (7, 1, 2), (6, 3, 0), (7, 1, 1)])
def test_decodes_embedding_sum_from_every_threshold_set(N, K, T):
    alphas, betas, x_bars, w_bars, coded = _network(N, K, T, seed=N + 10 * K + 100 * T)
    plain = fv.plain_quantized_sum(x_bars, w_bars, P)                     # (M, h), Python ints
    need = fv.recovery_threshold(K, T)
    assert need == 2 * (K + T - 1) + 1
    sets = list(combinations(range(N), need))
    assert len(sets) >= 6
    for S in sets:
        dec = fv.decode_embedding_sum(coded[list(S)], [alphas[j] for j in S], betas, K, T, P)
        signed = fv.from_field(dec, P).astype(object)
        assert signed.shape == plain.shape
        assert (signed == plain).all(), S
    # dequantisation: the mean embedding of the rounded data and model, to float precision
    H = fv.dequantize(dec, 6, 8, N, P)
    ref = np.array(plain, dtype=np.float64) / 2.0**14 / N
    np.testing.assert_allclose(H, ref, rtol=0, atol=1e-12)
    assert np.abs(ref).max() > 0.01


def test_too_few_uploads_is_a_clear_decode_failure():
    N, K, T = 7, 2, 1
    alphas, betas, _, _, coded = _network(N, K, T)
    with pytest.raises(fv.FedVSDecodeFailure, match=r"2\(K \+ T - 1\) \+ 1 = 2\(2 \+ 1 - 1\) \+ 1 = 5 .* got 4") as e:
        fv.decode_embedding_sum(coded[:4], alphas[:4], betas, K, T, P)
    assert isinstance(e.value, RuntimeError) and e.value.needed == 5 and e.value.received == 4
    with pytest.raises(ValueError, match="distinct"):
        fv.decode_embedding_sum(coded[[0, 0, 1, 2, 3]], [alphas[0]] * 2 + alphas[1:4], betas, K, T, P)


def test_fewer_than_threshold_cannot_be_forced():
    """A degree-2(K+T-1) psi is not determined by 2(K+T-1) points: decoding from them (forced) is wrong."""
    N, K, T = 7, 2, 1
    alphas, betas, x_bars, w_bars, coded = _network(N, K, T, seed=3)
    from fednet.algebra.fields import lagrange_coefficients
    from fednet.algebra.modp import lincomb_mod
    C = lagrange_coefficients(alphas[:4], betas[:K], P)
    wrong = lincomb_mod(C, coded[:4], P).reshape(-1, coded.shape[-1])
    assert not (fv.from_field(wrong, P).astype(object) == fv.plain_quantized_sum(x_bars, w_bars, P)).all()


def _chi2_uniform(values, q, cells_dims):
    """p-value of a chi-square test that ``values`` (n, cells_dims) are uniform on GF(q)^cells_dims."""
    idx = np.zeros(values.shape[0], dtype=np.int64)
    for j in range(cells_dims):
        idx = idx * q + values[:, j]
    counts = np.bincount(idx, minlength=q**cells_dims)
    return chisquare(counts).pvalue


@pytest.mark.parametrize("T,colluders", [(1, (2,)), (2, (0, 4)), (2, (1, 3))])
def test_colluders_data_and_model_shares_are_uniform(T, colluders):
    """Thm. 5.2: any T colluders' shares of one entry are uniform on GF(q)^T; zeroed masks are detected."""
    q, K, N, n_draws = 11, 2, 5, 12100
    alphas, betas = fv.default_points(K, T, N)
    rng = np.random.default_rng(1234)
    # data: the same two segments (value 3 and 7) shared n_draws times with fresh masks (columns)
    blocks = np.stack([np.full(n_draws, 3), np.full(n_draws, 7)])
    masks = fv.draw_masks(rng, q, T, (n_draws,))
    sh = fv.lagrange_shares(blocks, masks, alphas, betas, q)                # (N, n_draws)
    view = sh[list(colluders)].T                                            # (n_draws, T)
    assert _chi2_uniform(view, q, T) > 1e-4
    # power check: the same test rejects when the masks are zeroed (or constant)
    sh0 = fv.lagrange_shares(blocks, np.zeros_like(masks), alphas, betas, q)
    assert _chi2_uniform(sh0[list(colluders)].T, q, T) < 1e-12
    # power check against a subtler leak: only the first mask used (second zero) when T = 2
    if T == 2:
        half = masks.copy()
        half[1] = 0
        sh1 = fv.lagrange_shares(blocks, half, alphas, betas, q)
        assert _chi2_uniform(sh1[list(colluders)].T, q, T) < 1e-12
    # models: W_bar at every beta_k (k <= K), V masks at the others (eq. 4)
    w_bar = np.full((n_draws, 1), 5)
    msh = fv.share_model(w_bar, K, T, alphas, betas, q, rng)               # (N, n_draws, 1)
    assert _chi2_uniform(msh[list(colluders), :, 0].T, q, T) > 1e-4
    # and the data shares through share_data
    dsh = fv.share_data(np.tile([[3], [7]], (1, n_draws)).reshape(2, n_draws), K, T, alphas, betas, q, rng)
    assert _chi2_uniform(dsh[list(colluders), 0, :].T, q, T) > 1e-4


def test_quantisation_and_stochastic_rounding():
    assert fv.round_half_up(np.array([0.49, 0.5, -0.5, -0.51, 2.5])).tolist() == [0, 1, 0, -1, 3]
    xb = fv.quantize_data(np.array([[0.5, -0.25]]), 3, 17)
    assert xb.tolist() == [[4, 15]]
    rng = np.random.default_rng(0)
    r = fv.stochastic_round(np.full(200000, 2.3), rng)
    assert set(np.unique(r)) == {2, 3}
    assert abs(r.mean() - 2.3) < 0.005                     # unbiased (std of the mean ~ 0.001)
    w = fv.quantize_model(np.array([[-1.3]]), 2, 101, rng)   # 2^2 * -1.3 = -5.2 -> -5 or -6
    assert int(w[0, 0]) in (96, 95)


def test_field_size_is_derived_and_a_small_field_refused():
    d, D = [28] * 28, [1] * 28
    B = fv.embedding_bound(8, 10, 1.0, 4.0, d, D)
    assert B == 28 * 28 * 256 * 4096
    p = fv.required_modulus(8, 10, 1.0, 4.0, d, D)
    assert p > 2 * B + 1
    assert fv.check_modulus(p, 8, 10, 1.0, 4.0, d, D) == p
    with pytest.raises(fv.FieldTooSmall, match=rf"smallest sufficient prime is {p}") as e:
        fv.check_modulus(2**30 - 35, 8, 10, 1.0, 4.0, d, D)
    assert isinstance(e.value, ValueError) and e.value.smallest == p
    # PN depth enters through the powers: D_n = 2 doubles the bound for x_max = 1
    assert fv.embedding_bound(8, 10, 1.0, 4.0, d, [2] * 28) == 2 * B
    with pytest.raises(ValueError, match="p must be below 2\\*\\*62"):
        fv.check_modulus(2**89 - 1, 8, 10, 1.0, 4.0, d, D)


def test_bound_is_tight_enough_for_extreme_values():
    """Data and weights at the bound give a sum that the derived field decodes exactly (no wrap-around)."""
    N, K, T, l_x, l_w = 3, 1, 1, 4, 4
    d, D = [2, 3, 1], [2, 1, 2]
    p = fv.required_modulus(l_x, l_w, 1.0, 2.0, d, D)
    alphas, betas = fv.default_points(K, T, N)
    rng = np.random.default_rng(5)
    xb = [fv.quantize_data(fv.powers(np.ones((2, d[n])), D[n]), l_x, p) for n in range(N)]
    wb = [fv.quantize_model(np.full((d[n] * D[n], 1), -2.0), l_w, p, rng) for n in range(N)]
    ds = [fv.share_data(x, K, T, alphas, betas, p, rng) for x in xb]
    ms = [fv.share_model(w, K, T, alphas, betas, p, rng) for w in wb]
    coded = np.stack([fv.coded_embedding([ds[n][j] for n in range(N)], [ms[n][j] for n in range(N)], p)
                      for j in range(N)])
    dec = fv.decode_embedding_sum(coded, alphas, betas, K, T, p)
    B = fv.embedding_bound(l_x, l_w, 1.0, 2.0, d, D)
    assert fv.from_field(dec, p).tolist() == [[-B], [-B]]
