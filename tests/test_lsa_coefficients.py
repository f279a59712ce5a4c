"""LightSecAgg's Lagrange coefficients (issue 32, item 2): the cached encoding matrix and the per-round decoding
matrix equal a fresh galois computation (the oracle) for several point sets and fields, and a decoded aggregate
mask still equals the plain sum of the masks in the field (So et al., MLSys 2022, Sec. 4)."""

from __future__ import annotations

import galois
import numpy as np
import pytest

from fednet.algebra.fields import field_dtype, lagrange_coefficients, uniform
from fednet.algebra.meter import MacMeter
from fednet.codes.lightsecagg import (default_lsa_points, lsa_aggregate_encoded, lsa_decode_aggregate_mask,
                                      lsa_encode_mask, lsa_encoding_matrix)

FIELDS = [2**31 - 1, 2**32 - 5, 2**61 - 1, 2**72 + 15]


def oracle(src: list[int], dst: list[int], q: int) -> np.ndarray:
    """``L[t, j] = l_j(dst_t)`` from galois' Lagrange polynomials of the unit vectors over GF(q)."""
    GF = galois.GF(q, verify=False, compile="python-calculate")
    x = GF([v % q for v in src])
    rows = [galois.lagrange_poly(x, GF([int(i == j) for i in range(len(src))]))(GF([v % q for v in dst]))
            for j in range(len(src))]
    return np.array([[int(r[t]) for r in rows] for t in range(len(dst))], dtype=object).astype(field_dtype(q))


@pytest.mark.parametrize("q", FIELDS)
def test_encoding_matrix_is_galois_and_built_once(q: int) -> None:
    rng = np.random.default_rng(q % 1000)
    for N, U in [(5, 3), (9, 9), (12, 7)]:
        for alphas, betas in [default_lsa_points(N, U),
                              (lambda p: (p[:N], p[N:]))([int(v) for v in rng.choice(10**6, N + U, replace=False)])]:
            C = lsa_encoding_matrix(alphas, betas, U, 1, q)
            assert C is lsa_encoding_matrix(list(alphas), list(betas), U, 1, q)         # cached, not rebuilt
            want = oracle(betas, alphas, q)
            assert np.array_equal(C.matmul(np.eye(U, dtype=np.int64)), want)        # what every user applies
            z = uniform(rng, q, 4 * (U - 1))
            enc = lsa_encode_mask(z, U, 1, q, np.random.default_rng(1), alphas, betas)
            pieces = np.concatenate([z.reshape(U - 1, 4), uniform(np.random.default_rng(1), q, (1, 4))])
            assert np.array_equal(enc, (want.astype(object) @ pieces.astype(object) % q).astype(field_dtype(q)))


@pytest.mark.parametrize("q", FIELDS)
def test_decoding_matrix_is_galois_for_responder_sets(q: int) -> None:
    rng = np.random.default_rng(7)
    alphas, betas = default_lsa_points(10, 6)
    for _ in range(4):
        responders = [alphas[i] for i in rng.permutation(10)[:6]]            # any U of them, in arrival order
        for dst in (betas[:4], betas[:2] + responders[:2]):                    # points may coincide with sources
            want = oracle(responders, dst, q)
            for cache in (False, True):
                got = lagrange_coefficients(responders, dst, q, cache=cache)
                assert got.dtype == field_dtype(q) and np.array_equal(got, want)


@pytest.mark.parametrize("q", [2**32 - 5, 2**61 - 1])
def test_decoded_aggregate_is_the_plain_sum(q: int) -> None:
    N, U, T, d = 9, 6, 2, 13
    alphas, betas = default_lsa_points(N, U)
    rng = np.random.default_rng(3)
    masks = [uniform(rng, q, d) for _ in range(N)]
    enc = [lsa_encode_mask(masks[i], U, T, q, rng, alphas, betas) for i in range(N)]
    for trial in range(3):
        U1 = sorted(rng.choice(N, size=U + trial, replace=False).tolist())
        s = {j: lsa_aggregate_encoded([enc[i][j] for i in U1], q) for j in U1}
        responders = [int(j) for j in rng.permutation(U1)[:U]]
        with MacMeter() as meter:
            agg = lsa_decode_aggregate_mask(np.stack([s[j] for j in responders]), [alphas[j] for j in responders],
                                            betas, U, T, d, q)
        plain = np.stack(masks)[U1].astype(object).sum(axis=0) % q
        assert np.array_equal(agg, plain.astype(field_dtype(q)))
        assert meter.macs == (U - T) * U * -(-d // (U - T))                   # the product's MACs only


def test_bad_points_are_refused_every_time() -> None:
    for _ in range(2):                                                         # a refusal is not cached
        with pytest.raises(ValueError, match="disjoint"):
            lsa_encoding_matrix([1, 2, 3], [3, 4], 2, 1, 2**31 - 1)
        with pytest.raises(ValueError, match="distinct"):
            lsa_encoding_matrix([5, 5, 6], [3, 4], 2, 1, 2**31 - 1)
