"""Huge primes never build a galois field: Lagrange coding over 2^200 - 75 takes milliseconds."""

import time

import numpy as np

import fednet.algebra.fields as fields
from fednet.algebra.fields import lagrange_coefficients, uniform, vandermonde
from fednet.codes.dresfl import DRESFL_PRIME_200
from fednet.codes.lagrange import lcc_decode, lcc_encode


def test_lcc_toy_over_200_bit_prime_is_fast_and_builds_no_galois_field(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("galois.GF must not be built for a huge prime")

    monkeypatch.setattr(fields.galois, "GF", refuse)
    fields.prime_field.cache_clear()
    p = DRESFL_PRIME_200
    rng = np.random.default_rng(0)
    X = uniform(rng, p, (2, 2, 3))
    alphas, betas = list(range(3, 13)), [1, 2, 100]
    t = time.perf_counter()
    enc = lcc_encode(X, 1, alphas, betas, p, rng)
    dec = lcc_decode(enc[3:], alphas[3:], betas, 2, 1, 1, p)
    assert (dec == X).all()
    assert time.perf_counter() - t < 5.0  # was ~40 s (galois.GF(p) factoring p - 1)


def test_python_int_lagrange_and_vandermonde_interpolate_exactly():
    p = DRESFL_PRIME_200
    src = [3, 7, 11, 20]
    coeffs = [5, p - 2, 123456789, p // 3]  # a degree-3 polynomial
    V = vandermonde(src, 4, p)
    vals = [sum(int(V[i, j]) * coeffs[j] for j in range(4)) % p for i in range(4)]
    dst = [0, 1, 7, 99]
    L = lagrange_coefficients(src, dst, p)
    for t, d in enumerate(dst):
        want = sum(c * pow(d, j, p) for j, c in enumerate(coeffs)) % p
        assert sum(int(L[t, j]) * vals[j] for j in range(4)) % p == want
    assert int(L[2, 1]) == 1 and all(int(L[2, j]) == 0 for j in (0, 2, 3))  # dst on a source point
