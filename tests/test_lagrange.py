"""Lagrange coded computing and the LightSecAgg mask code (references.md test vectors)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.algebra.fields import prime_field, uniform
from fednet.algebra.meter import MacMeter
from fednet.algebra.modp import add_mod, sum_mod
from fednet.algebra.quantize import dequantize, quantize
from fednet.codes.lagrange import lcc_decode, lcc_encode
from fednet.codes.lightsecagg import (
    check_lsa_parameters,
    default_lsa_points,
    lsa_aggregate_encoded,
    lsa_decode_aggregate_mask,
    lsa_encode_mask,
    lsa_mask_pieces,
)

P_TV = 2**30 - 35


def test_lightsecagg_test_vectors():
    """references.md: p = 2**30 - 35, N = 4, U = 2, T = 0, alpha = 2..5, beta = 10, 11."""
    alphas, betas = [2, 3, 4, 5], [10, 11]
    rng = np.random.default_rng(0)  # unused: T = 0 draws no noise
    enc0 = lsa_encode_mask(np.array([680331467, 80426342]), 2, 0, P_TV, rng, alphas, betas)
    enc1 = lsa_encode_mask(np.array([620178032, 641176901]), 2, 0, P_TV, rng, alphas, betas)
    assert enc0[:, 0].tolist() == [110863522, 584700186, 1058536850, 458631725]
    assert enc1[:, 0].tolist() == [452187080, 473185949, 494184818, 515183687]
    # survivors {0, 1}: every user j aggregates the two encoded masks it holds
    s = np.stack([lsa_aggregate_encoded([enc0[j], enc1[j]], P_TV) for j in range(4)])
    for J in itertools.combinations(range(4), 2):
        agg = lsa_decode_aggregate_mask(s[list(J)], [alphas[j] for j in J], betas, 2, 0, 2, P_TV)
        assert agg.tolist() == [226767710, 721603243]


@pytest.mark.parametrize("q", [2**31 - 1, P_TV])
def test_unmask_every_survivor_set(q):
    """N = 5, T = 1, U = 3, d = 7: the server recovers the sum of the survivors' models exactly for
    every survivor set U1 with |U1| >= U and every responder subset J of U1 with |J| >= U."""
    N, U, T, d = 5, 3, 1, 7
    rng = np.random.default_rng(1)
    alphas, betas = default_lsa_points(N, U)
    x = [uniform(rng, q, d) for _ in range(N)]  # quantised models
    zmask = [uniform(rng, q, d) for _ in range(N)]
    enc = [lsa_encode_mask(zmask[i], U, T, q, rng, alphas, betas) for i in range(N)]  # (N, L) each
    masked = [add_mod(x[i], zmask[i], q) for i in range(N)]
    n_checked = 0
    for size in range(U, N + 1):
        for U1 in itertools.combinations(range(N), size):
            s = {j: lsa_aggregate_encoded([enc[i][j] for i in U1], q) for j in U1}
            for r in range(U, size + 1):
                for J in itertools.combinations(U1, r):
                    mask = lsa_decode_aggregate_mask(
                        np.stack([s[j] for j in J]), [alphas[j] for j in J], betas, U, T, d, q
                    )
                    total = sum_mod([masked[i] for i in U1], q)
                    model = (total - mask) % q
                    assert np.array_equal(model, sum_mod([x[i] for i in U1], q))
                    n_checked += 1
            # below U: a clear error
            J = U1[: U - 1]
            with pytest.raises(ValueError, match="at least U = 3"):
                lsa_decode_aggregate_mask(np.stack([s[j] for j in J]), [alphas[j] for j in J], betas, U, T, d, q)
    assert n_checked == 10 * 1 + 5 * 5 + 1 * 16


def test_no_int64_overflow_near_2_31_at_u8():
    """The public-implementation pitfall: p near 2**31, U = 8 -> int64 dot products overflow."""
    q = 2**31 - 1
    N, U, T, d = 10, 8, 2, 60
    rng = np.random.default_rng(2)
    alphas, betas = default_lsa_points(N, U)
    z = [np.full(d, q - 1, dtype=np.int64), uniform(rng, q, d)]  # extreme and random masks
    enc = [lsa_encode_mask(zi, U, T, q, rng, alphas, betas) for zi in z]
    GF = prime_field(q)
    s = np.stack([lsa_aggregate_encoded([enc[0][j], enc[1][j]], q) for j in range(N)])
    mask = lsa_decode_aggregate_mask(s[2:], alphas[2:], betas, U, T, d, q)
    assert np.array_equal(mask, np.asarray(GF(z[0]) + GF(z[1])))


def test_noise_pieces_are_random_and_T_private():
    q, U, T = 11, 3, 2
    rng = np.random.default_rng(3)
    pieces = lsa_mask_pieces(np.arange(5) % q, U, T, q, rng)
    assert pieces.shape == (3, 5) and np.any(pieces[U - T :] != 0)
    # any T encoded shares of a fixed mask are uniform: chi-square over 2 users, 121 cells
    from scipy.stats import chi2

    alphas, betas = default_lsa_points(4, U)
    M = 200 * q**T
    z = np.full(M, 7)  # M independent scalar masks: d = M, U - T = 1 piece of length M
    enc = lsa_encode_mask(z, U, T, q, rng, alphas, betas)  # (N, M)
    for a, b in itertools.combinations(range(4), 2):
        cells = enc[a] * q + enc[b]
        h = np.bincount(cells, minlength=q**T)
        stat = ((h - M / q**T) ** 2 / (M / q**T)).sum()
        assert chi2.sf(stat, q**T - 1) > 1e-4


def test_lcc_polynomial_evaluation():
    """LCC with K = 2, T = 1 for f(X) = X^T X (degree 2): any 2 (K + T - 1) + 1 = 5 results decode."""
    q = 2**31 - 1
    K, T, N = 2, 1, 6
    rng = np.random.default_rng(4)
    blocks = uniform(rng, q, (K, 3, 2))
    alphas, betas = list(range(10, 10 + N)), [1, 2, 3]
    with MacMeter() as meter:
        enc = lcc_encode(blocks, T, alphas, betas, q, rng)
    assert meter.macs == N * (K + T) * 6
    GF = prime_field(q)
    f = lambda X: np.asarray(GF(X).T @ GF(X))  # noqa: E731
    results = np.stack([f(e) for e in enc])
    for J in itertools.combinations(range(N), 5):
        got = lcc_decode(results[list(J)], [alphas[j] for j in J], betas, K, T, 2, q)
        for k in range(K):
            assert np.array_equal(got[k], f(blocks[k]))
    with pytest.raises(ValueError, match="needs deg_f"):
        lcc_decode(results[:4], alphas[:4], betas, K, T, 2, q)
    with pytest.raises(ValueError, match="disjoint"):
        lcc_encode(blocks, T, [1, 20, 21, 22, 23, 24], betas, q, rng)


def test_parameters_and_quantisation():
    with pytest.raises(ValueError, match="U must satisfy"):
        check_lsa_parameters(5, 2, 2, 97)
    with pytest.raises(ValueError, match="U must satisfy"):
        check_lsa_parameters(5, 6, 1, 97)
    x = np.array([-1.5, 0.25, 3.0])
    v = quantize(x, 8, P_TV, n_summands=100)
    assert v[0] == P_TV - 384
    assert np.array_equal(dequantize(v, 8, P_TV), x)
    with pytest.raises(ValueError, match="field too small"):
        quantize(np.array([1e6]), 16, P_TV, n_summands=100)
