"""Exact modular kernels and field helpers, checked against galois (the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.fields import (
    as_field,
    check_field_capacity,
    field_dtype,
    fixed_point_field,
    from_field,
    lagrange_coefficients,
    prime_field,
    to_field,
    uniform,
    vandermonde,
)
from fednet.algebra.meter import MacMeter
from fednet.algebra.modp import (
    add_mod,
    lincomb_mod,
    matmul_mod,
    PreparedMatrix,
    prepare,
    scale_mod,
    signed_int64,
    sub_mod,
    sum_mod,
)

Q31 = 2**31 - 1
Q30 = 2**30 - 35  # LightSecAgg test-vector prime
Q73 = fixed_point_field(48, 24)
P32 = 2**32 - 5                         # LightSecAgg's 32-bit field: uint64 folding
PRIMES = [97, Q30, Q31, P32, 2**61 - 1, Q73, 2**127 - 1]


def _galois(a, q):
    return prime_field(q)(np.asarray(a))


def _np(x):
    return np.asarray(x.view(np.ndarray)).astype(object)


def test_fixed_point_field_is_remark3_prime():
    assert Q73 == 2**72 + 15
    assert Q73 > 2 ** (48 + 24) and prime_field(Q73).order == Q73
    assert field_dtype(Q73) == object and field_dtype(Q31) == np.int64


def test_signed_map_roundtrip_and_negatives():
    x = np.array([0, 1, -1, -2, 2**47, -(2**47)], dtype=np.int64)
    v = to_field(x, Q73)
    assert v[2] == Q73 - 1 and v[3] == Q73 - 2
    assert list(from_field(v, Q73)) == list(x)
    v31 = to_field(x[:4], Q31)
    assert v31.dtype == np.int64 and v31[2] == Q31 - 1


def test_field_too_small_is_refused():
    with pytest.raises(ValueError, match="outside the signed range"):
        to_field(np.array([2**40]), Q31)
    with pytest.raises(ValueError, match="field too small"):
        check_field_capacity(Q31, 2**31, what="sums")
    check_field_capacity(Q73, 2**71)
    with pytest.raises(ValueError, match="q must be a prime"):
        prime_field(2**31)
    with pytest.raises(ValueError, match=r"in \[0, q\)"):
        as_field(np.array([Q31]), Q31)


@pytest.mark.parametrize("q", PRIMES)
@pytest.mark.parametrize("mkn", [(3, 4, 5), (7, 33, 2), (1, 1, 1), (4, 2100, 3)])
def test_matmul_matches_galois(q, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(q % 1000 + k)
    a, b = uniform(rng, q, (m, k)), uniform(rng, q, (k, n))
    ref = _np(_galois(a, q) @ _galois(b, q))
    with MacMeter() as meter:
        got = matmul_mod(a, b, q)
    assert got.dtype == field_dtype(q)
    assert np.array_equal(got.astype(object), ref)
    assert meter.macs == m * k * n


@pytest.mark.parametrize("q", [Q30, Q31, P32, Q73])
def test_matmul_extreme_values_no_overflow(q):
    """Every entry at the largest balanced magnitude: partial sums at the 2**53 bound."""
    h = (q - 1) // 2
    k = 2000
    a = np.full((2, k), h, dtype=field_dtype(q))
    b = np.full((k, 3), h + 1, dtype=field_dtype(q))  # h + 1 = -h in balanced form
    got = matmul_mod(a, b, q)
    assert all(int(x) == (h * (h + 1) * k) % q for x in got.ravel())


@pytest.mark.parametrize("q", [Q31, Q73])
def test_prepared_signed_operand(q):
    rng = np.random.default_rng(5)
    a = uniform(rng, q, (6, 300))
    bits = 47 if q > 2**62 else 29
    eps = rng.integers(-(2**bits), 2**bits, size=(300, 4))
    P = prepare(a, q, rhs_bits=bits + 1)
    ref = _np(_galois(a, q) @ _galois(to_field(eps, q), q))
    for _ in range(2):  # prepared form reused across "rounds"
        assert np.array_equal(P.matmul_signed(eps).astype(object), ref)
    assert np.array_equal(P.matmul(to_field(eps, q)).astype(object), ref)
    vec = P.matmul_signed(eps[:, 0])
    assert vec.shape == (6,) and np.array_equal(vec.astype(object), ref[:, 0])
    with pytest.raises(ValueError, match="do not align"):
        P.matmul_signed(eps[:10])
    with pytest.raises(ValueError, match="signed range"):
        P.matmul_signed(np.full((300, 1), (q - 1) // 2 + 1, dtype=object))


@pytest.mark.parametrize("q", [97, Q31, P32, Q73])
def test_elementwise_ops(q):
    rng = np.random.default_rng(1)
    a, b, c = (uniform(rng, q, (5, 7)) for _ in range(3))
    GF = prime_field(q)
    with MacMeter() as meter:
        s = add_mod(a, b, q)
        d = sub_mod(a, b, q)
        t = sum_mod([a, b, c], q)
        sc = scale_mod(-3, a, q)
    assert meter.macs == 35 * (1 + 1 + 2 + 1)
    assert np.array_equal(s.astype(object), _np(GF(a) + GF(b)))
    assert np.array_equal(d.astype(object), _np(GF(a) - GF(b)))
    assert np.array_equal(t.astype(object), _np(GF(a) + GF(b) + GF(c)))
    assert np.array_equal(sc.astype(object), _np(GF(q - 3) * GF(a)))


def test_sum_mod_many_int64_terms_no_overflow():
    q = 2**61 - 1
    arrays = [np.full((3,), q - 1, dtype=np.int64)] * 9
    assert np.array_equal(sum_mod(arrays, q), np.full((3,), (9 * (q - 1)) % q))


def test_signed_int64_refuses_overflow():
    with pytest.raises(OverflowError):
        signed_int64(np.array([2**70], dtype=object), Q73)
    assert signed_int64(np.array([Q73 - 5], dtype=object), Q73)[0] == -5


def test_lagrange_and_vandermonde_interpolate():
    q = Q73
    rng = np.random.default_rng(2)
    coef = uniform(rng, q, (4,))
    src = [3, 5, 7, 11]
    V = vandermonde(src, 4, q)
    vals = lincomb_mod(V, coef[:, None], q)[:, 0]
    L = lagrange_coefficients(src, [0, 2, 5], q)
    out = lincomb_mod(L, vals[:, None], q)[:, 0]
    GF = prime_field(q)
    poly = lambda x: sum((GF(int(c)) * GF(x) ** i for i, c in enumerate(coef)), GF(0))  # noqa: E731
    assert [int(v) for v in out] == [int(poly(0)), int(poly(2)), int(poly(5))]
    with pytest.raises(ValueError, match="distinct"):
        lagrange_coefficients([1, 1], [0], q)


def test_float32_storage_is_exact_and_smaller():
    q = Q73
    rng = np.random.default_rng(9)
    a = uniform(rng, q, (5, 700))
    eps = rng.integers(-(2**47), 2**47, size=(700, 3))
    P64, P32 = prepare(a, q, rhs_bits=48), PreparedMatrix(a, q, rhs_bits=48, storage="float32")
    assert P32.w <= 24 and P32.nbytes < P64.nbytes
    ref = _np(_galois(a, q) @ _galois(to_field(eps, q), q))
    assert np.array_equal(P32.matmul_signed(eps).astype(object), ref)
    with pytest.raises(ValueError, match="storage"):
        PreparedMatrix(a, q, storage="float16")


def test_lagrange_coefficients_against_direct_formula_and_cache():
    q = Q31
    GF = prime_field(q)
    src, dst = [3, 9, 14, 20], [0, 9, 5]
    L = lagrange_coefficients(src, dst, q)
    x = GF(src)
    for t, d in enumerate(dst):
        for j in range(4):
            num, den = GF(1), GF(1)
            for m in range(4):
                if m != j:
                    num *= GF(d) - x[m]
                    den *= x[j] - x[m]
            assert L[t, j] == int(num / den)
    original = int(L[0, 0])
    L[0, 0] = original + 1  # the caller gets a copy: the cache is not affected
    assert int(lagrange_coefficients(src, dst, q)[0, 0]) == original


def test_scale_mod_keeps_storage_dtype():
    q = 2**61 - 1
    a = np.array([q - 1, 5], dtype=np.int64)
    out = scale_mod(q - 2, a, q)
    assert out.dtype == np.int64 and out.tolist() == [((q - 1) * (q - 2)) % q, (5 * (q - 2)) % q]


def test_out_of_range_operands_are_refused():
    q = Q73
    a = np.array([[1, 2 * q]], dtype=object)
    with pytest.raises(ValueError, match=r"\[0, q\)"):
        prepare(a, q)
    P = prepare(np.array([[1, 2]], dtype=object), q)
    with pytest.raises(ValueError, match=r"\[0, q\)"):
        P.matmul(np.array([[q], [0]], dtype=object))
    with pytest.raises(ValueError, match=r"\[0, q\)"):
        prepare(np.array([[-1, 2]]), Q31)


@pytest.mark.parametrize("q", [97, P32, 2**61 - 1])
@pytest.mark.parametrize("count,size", [(1, 3), (901, 2), (40, 30001), (3, 2**20 + 1)])
def test_sum_mod_in_blocks_is_the_sum(q, count, size):
    """Rows summed in blocks (issue 32): the canonical sum, whatever the block size and reductions."""
    rng = np.random.default_rng(count)
    arrays = [uniform(rng, q, size) for _ in range(count)]
    arrays[0][:2] = q - 1
    want = np.sum(np.stack(arrays).astype(object), axis=0) % q
    for given in (arrays, np.stack(arrays)):
        got = sum_mod(given, q)
        assert got.dtype == np.int64 and np.array_equal(got.astype(object), want)
    with pytest.raises(ValueError, match="sum_mod: shapes"):
        sum_mod(arrays + [np.zeros(size + 1, np.int64)], q)
