"""DReS-FL math: LCC data sharing, decoding the degree-8 gradient from every 9-subset, psi, Q."""

import itertools

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.codes.dresfl import (
    DRESFL_PRIME_200,
    DecodeFailure,
    concat_rows,
    decode_gradients,
    default_points,
    dresfl_update,
    evaluate_on_shares,
    global_shards,
    gradient_degree,
    max_dropouts,
    psi,
    recovery_threshold,
    share_dataset,
    split_shards,
    stochastic_round,
    transform_data,
)
from fednet.learning.field_models import FieldPolyMLP

Q = DRESFL_PRIME_200


def _setup(K, T, N, sizes=(6, 3, 3, 2), m=4, seed=0):
    rng = np.random.default_rng(seed)
    model = FieldPolyMLP(sizes, Q, data_bits=4, weight_bits=None, init_scale=4.0)
    params = model.init_params(seed)
    params["b1"] = rng.integers(-5, 6, sizes[1])
    params["b2"] = rng.integers(-5, 6, sizes[2])
    x = rng.random((m * K, sizes[0]))
    y = rng.integers(0, sizes[-1], m * K)
    xbar, ybar = model.transform(x, y)
    alphas, betas = default_points(N, K, T)
    secret = np.random.default_rng(12345)  # the client's secret stream, not the public seed
    xs, ys = share_dataset(xbar, ybar, K, T, alphas, betas, Q, secret)
    return model, params, xbar, ybar, alphas, betas, xs, ys


def _plain_gradients(model, params, xbar, ybar, K):
    return [model.integer_gradient(params, xk, yk, transformed=True)
            for xk, yk in zip(split_shards(xbar, K), split_shards(ybar, K))]


def test_degree_threshold_and_theorem1():
    assert gradient_degree(2) == 8 and gradient_degree(1) == 4
    assert recovery_threshold(1, 1, 8) == 9
    assert recovery_threshold(2, 1, 8) == 17
    assert max_dropouts(20, 1, 1, 8) == 11  # Remark 1: N - 1 - deg(g)
    with pytest.raises(ValueError, match="eq. \\(1\\) fails"):
        max_dropouts(8, 1, 1, 8)


def test_points_disjoint():
    for N, K, T in [(10, 1, 1), (20, 4, 2), (3, 1, 0)]:
        a, b = default_points(N, K, T)
        assert len(a) == N and len(b) == K + T and not set(a) & set(b)


def test_decode_degree8_gradient_from_every_9_subset():
    K, T, N = 1, 1, 10
    model, params, xbar, ybar, alphas, betas, xs, ys = _setup(K, T, N)
    assert model.degree == 8
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs, ys)
    plain = _plain_gradients(model, params, xbar, ybar, K)
    need = recovery_threshold(K, T, model.degree)
    n_subsets = 0
    for subset in itertools.combinations(range(N), need):
        dec = decode_gradients([uploads[j] for j in subset], [alphas[j] for j in subset], betas, K, T,
                               model.degree, Q)
        for k in range(K):
            for name, g in plain[k].items():
                assert (psi(dec[k][name], Q) == g).all(), (subset, name)
        n_subsets += 1
    assert n_subsets == 10
    # the plain gradient is not trivially small: it needs many bits, so a wrong decode cannot pass
    assert max(abs(int(v)) for v in plain[0]["W1"].ravel()) > 2**20


def test_decode_K2_T1_row_selection():
    K, T = 2, 1
    deg = 8
    N = recovery_threshold(K, T, deg) + 1
    model, params, xbar, ybar, alphas, betas, xs, ys = _setup(K, T, N, m=5, seed=3)
    rows = np.array([4, 0, 2])  # a common row selection I_t inside each shard
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs, ys, rows=rows)
    dec = decode_gradients(uploads[1:], alphas[1:], betas, K, T, deg, Q)
    for k, (xk, yk) in enumerate(zip(split_shards(xbar, K), split_shards(ybar, K))):
        g = model.integer_gradient(params, xk[rows], yk[rows], transformed=True)
        for name in g:
            assert (psi(dec[k][name], Q) == g[name]).all()


def test_below_threshold_is_a_decode_failure():
    K, T, N = 1, 1, 10
    model, params, xbar, ybar, alphas, betas, xs, ys = _setup(K, T, N)
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs[:8], ys[:8])
    with pytest.raises(DecodeFailure, match=r"needs deg\(g\)\(K \+ T - 1\) \+ 1 = 8\*\(1 \+ 1 - 1\) \+ 1 = 9 .*got 8") as e:
        decode_gradients(uploads, alphas[:8], betas, K, T, 8, Q)
    assert (e.value.received, e.value.needed) == (8, 9)
    # the threshold is tight: treating g as degree 7 (8 evaluations) decodes a wrong gradient
    plain = _plain_gradients(model, params, xbar, ybar, K)[0]
    wrong = decode_gradients(uploads, alphas[:8], betas, K, T, 7, Q)[0]
    assert any((psi(wrong[k], Q) != plain[k]).any() for k in plain)
    # alphas meeting betas are refused
    with pytest.raises(ValueError, match="disjoint"):
        decode_gradients(uploads + [uploads[0]], alphas[:8] + [betas[0]], betas, K, T, 8, Q)


def test_sharing_charges_lcc_macs_and_masks_data():
    K, T, N = 1, 1, 4
    rng = np.random.default_rng(0)
    xbar = rng.integers(0, 17, (6, 5))
    ybar = rng.integers(0, 17, (6, 2))
    alphas, betas = default_points(N, K, T)
    with MacMeter() as m:
        xs, ys = share_dataset(xbar, ybar, K, T, alphas, betas, Q, np.random.default_rng(7))
    assert m.macs == N * (K + T) * 6 * (5 + 2)
    assert xs.shape == (N, 6, 5) and ys.shape == (N, 6, 2)
    # with T = 1 a share is masked by uniform noise: no entry equals the data, and entries are full-width
    assert all((xs[j] != xbar).all() for j in range(N))
    assert np.median([int(v).bit_length() for v in xs.ravel()]) >= 195


def test_transform_data():
    x = np.array([[0.0, 0.5, 1.0, 0.03125, 0.09375]])
    assert transform_data(x, 4).tolist() == [[0, 8, 16, 0, 2]]  # rint: 0.5 -> 0, 1.5 -> 2 (ties to even)
    assert transform_data(x, 2, c=1.0).tolist() == [[4, 6, 8, 4, 4]]
    with pytest.raises(ValueError, match="divisible by K = 4"):
        split_shards(np.zeros((6, 2)), 4)


def test_psi_eq6_boundaries():
    v = np.array([0, 1, (Q - 1) // 2 - 1, (Q - 1) // 2, Q - 1], dtype=object)
    assert psi(v, Q).tolist() == [0, 1, (Q - 1) // 2 - 1, (Q - 1) // 2 - Q, -1]


def test_stochastic_rounding_is_unbiased():
    """E[Q(z)] = z: the mean of n = 200000 draws lies within 5 standard errors (sd <= 1/2)."""
    rng = np.random.default_rng(2024)
    n = 200_000
    for z in (0.3, -2.75, 7.0, 1e-3):
        draws = stochastic_round(np.full(n, z), rng)
        assert set(np.unique(draws)) <= {np.floor(z), np.floor(z) + 1}
        assert abs(draws.mean() - z) < 5 * 0.5 / np.sqrt(n)
    # exact rational path: z = 1/3
    draws = stochastic_round(np.full(n, 1, dtype=object), rng, den=3)
    assert abs(np.mean(draws.astype(np.int64)) - 1 / 3) < 5 * 0.5 / np.sqrt(n)


def test_update_keeps_parameters_integer_in_Zp():
    rng = np.random.default_rng(5)
    params = {"W1": np.array([[3, -2]], dtype=np.int64), "b1": np.array([0], dtype=np.int64)}
    g = {"W1": np.array([[2**150, -(2**149)]], dtype=object), "b1": np.array([7], dtype=object)}
    new = dresfl_update(params, g, 0.1, 64, Q, rng, shift=140)
    assert all(np.asarray(v).dtype.kind in "iO" for v in new.values())
    z = 0.1 / 64 * 2**10
    assert new["W1"][0, 0] in (3 - int(np.floor(z)), 3 - int(np.floor(z)) - 1)
    # clipping to a small norm bounds the step
    clipped = dresfl_update(params, g, 0.1, 1, Q, rng, max_norm=1.0, shift=150, clip_bits=150)
    assert abs(int(clipped["W1"][0, 0]) - 3) <= 1
    with pytest.raises(ValueError, match="left Z_p"):
        dresfl_update({"w": np.array([(Q - 1) // 2], dtype=object)}, {"w": np.array([-64], dtype=object)},
                      1.0, 64, Q, rng)


def test_share_dataset_equals_lcc_encode():
    """The RNS encoding equals fednet.codes.lagrange.lcc_encode given the same noise stream."""
    from fednet.algebra.fields import to_field
    from fednet.codes.lagrange import lcc_encode

    K, T, N = 2, 2, 5
    rng = np.random.default_rng(1)
    xbar = rng.integers(-8, 17, (4, 3))
    ybar = rng.integers(0, 17, (4, 2))
    alphas, betas = default_points(N, K, T)
    xs, ys = share_dataset(xbar, ybar, K, T, alphas, betas, Q, np.random.default_rng(9))
    ref_rng = np.random.default_rng(9)
    xr = lcc_encode(split_shards(to_field(xbar, Q), K), T, alphas, betas, Q, ref_rng)
    yr = lcc_encode(split_shards(to_field(ybar, Q), K), T, alphas, betas, Q, ref_rng)
    assert (xs == xr).all() and (ys == yr).all()
    # in residue form (as a client keeps it) the values are the same
    xs_r, _ = share_dataset(xbar, ybar, K, T, alphas, betas, Q, np.random.default_rng(9), as_rns=True)
    assert xs_r.shape == (N, 2, 3) and (xs_r.to_field() == xr).all()
    with pytest.raises(ValueError, match="disjoint"):
        share_dataset(xbar, ybar, K, T, [1, 9, 10, 11, 12], betas, Q, np.random.default_rng(9))


def test_coded_data_in_residue_form_decodes():
    """Clients keep their coded data as RnsArrays (as_rns=True); decoding still gives the plain gradient."""
    K, T, N = 1, 1, 9
    model = FieldPolyMLP((5, 3, 2, 2), Q, data_bits=4, weight_bits=None, init_scale=3.0)
    params = model.init_params(2)
    rng = np.random.default_rng(3)
    xbar, ybar = model.transform(rng.random((6, 5)), rng.integers(0, 2, 6))
    alphas, betas = default_points(N, K, T)
    xs, ys = share_dataset(xbar, ybar, K, T, alphas, betas, Q, np.random.default_rng(4), as_rns=True,
                           ctx=model.ctx)
    rows = np.array([5, 1, 3])
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs, ys, rows=rows)
    dec = decode_gradients(uploads, alphas, betas, K, T, model.degree, Q)[0]
    plain = model.integer_gradient(params, xbar[rows], ybar[rows], transformed=True)
    assert all((psi(dec[k], Q) == plain[k]).all() for k in plain)


def test_rns_uploads_decode_like_canonical_uploads():
    K, T, N = 1, 1, 10
    model, params, xbar, ybar, alphas, betas, xs, ys = _setup(K, T, N)
    up_f = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs, ys)
    up_r = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y, as_rns=True), xs, ys)
    with MacMeter() as m1:
        d1 = decode_gradients(up_f[1:], alphas[1:], betas, K, T, 8, Q)
    with MacMeter() as m2:
        d2 = decode_gradients(up_r[1:], alphas[1:], betas, K, T, 8, Q)
    assert m1.macs == m2.macs == K * 9 * model.n_params
    assert all((d1[0][k] == d2[0][k]).all() for k in d1[0])


def test_global_shards_and_concat_rows():
    """Shard k of every client stacked in client order; RnsArray rows stacked with the same values."""
    xs = [np.arange(12).reshape(4, 3), 100 + np.arange(6).reshape(2, 3)]      # K = 2: shards of 2 and 1 rows
    g = global_shards(xs, [2, 1], 2)
    assert [a.tolist() for a in g] == [[[0, 1, 2], [3, 4, 5], [100, 101, 102]],
                                       [[6, 7, 8], [9, 10, 11], [103, 104, 105]]]
    q = DRESFL_PRIME_200
    rng = np.random.default_rng(3)
    xbar = rng.integers(-50, 50, (4, 3))
    alphas, betas = default_points(3, 1, 1)
    xs_r, _ = share_dataset(xbar, xbar[:, :1], 1, 1, alphas, betas, q, rng, as_rns=True)
    both = concat_rows([xs_r[0], xs_r[1]])
    assert both.shape == (8, 3)
    assert (both.to_field() == np.concatenate([xs_r[0].to_field(), xs_r[1].to_field()])).all()


def test_theorem1_D_resilience_N20_any_11_dropouts_decode_12_fail():
    """Theorem 1 / eq. (1) at the paper's N = 20, K = T = 1, deg(g) = 8: R = 9, so any D = N - R = 11
    dropouts leave a decodable set (checked on 40 random 9-subsets of the 20 clients plus the first and last
    nine), while D = 12 leaves 8 uploads: a DecodeFailure naming 9 and 8, and a degree-7 interpolation
    through those 8 gives a wrong gradient (the threshold is tight)."""
    K, T, N = 1, 1, 20
    model, params, xbar, ybar, alphas, betas, xs, ys = _setup(K, T, N, seed=7)
    assert max_dropouts(N, K, T, model.degree) == 11 == N - recovery_threshold(K, T, model.degree)
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y), xs, ys)
    plain = _plain_gradients(model, params, xbar, ybar, K)[0]
    rng = np.random.default_rng(11)
    subsets = [tuple(range(9)), tuple(range(11, 20))] + [tuple(sorted(rng.choice(N, 9, replace=False)))
                                                        for _ in range(40)]
    for subset in subsets:
        dec = decode_gradients([uploads[j] for j in subset], [alphas[j] for j in subset], betas, K, T, 8, Q)[0]
        assert all((psi(dec[n], Q) == plain[n]).all() for n in plain), subset
    for subset in (tuple(range(8)), tuple(range(12, 20))):
        with pytest.raises(DecodeFailure, match="got 8") as e:
            decode_gradients([uploads[j] for j in subset], [alphas[j] for j in subset], betas, K, T, 8, Q)
        assert (e.value.received, e.value.needed) == (8, 9)
        wrong = decode_gradients([uploads[j] for j in subset], [alphas[j] for j in subset], betas, K, T, 7, Q)[0]
        assert any((psi(wrong[n], Q) != plain[n]).any() for n in plain)


def test_psi_inverts_the_signed_embedding():
    """psi (eq. 6) maps v mod p back to v for every v in the signed range [-(p-1)/2, (p-1)/2 - 1]
    (random 200-bit values, both ends and zero), so a decoded gradient below the bound is the integer one."""
    rng = np.random.default_rng(3)
    half = (Q - 1) // 2
    v = [0, 1, -1, half - 1, -half] + [int.from_bytes(rng.bytes(25), "big") % (2 * half) - half for _ in range(500)]
    v = np.array(v, dtype=object)
    assert (psi(v % Q, Q) == v).all()


def test_update_Q_is_unbiased_through_dresfl_update():
    """E[w_new] = w - lr / n_rows * g / 2^shift for the whole update of eq. (7) (clip off): the mean of
    n = 100000 independently rounded copies lies within 5 standard errors; every draw is floor or ceil."""
    rng = np.random.default_rng(99)
    n, lr, n_rows, shift = 100_000, 0.1, 64, 120
    g_int = 2**127 + 12345                    # z = 0.1 / 64 * 2^7 (+ tiny) = 0.2000000...
    params = {"w": np.full(n, 5, dtype=np.int64)}
    new = dresfl_update(params, {"w": np.full(n, g_int, dtype=object)}, lr, n_rows, Q, rng, shift=shift)["w"]
    from fractions import Fraction
    z = float(Fraction(lr) * g_int / (n_rows * 2**shift))
    assert set(np.unique(new)) <= {5 - int(np.floor(z)), 5 - int(np.floor(z)) - 1}
    assert abs(new.mean() - (5 - z)) < 5 * 0.5 / np.sqrt(n)
    assert new.dtype == np.int64 and abs(new).max() < (Q - 1) // 2
