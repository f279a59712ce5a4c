"""Tests of fixed-point Q<k,f> arithmetic and its exact limb kernels (paper Sec. II-B, IV)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fednet.algebra import fixed_point as fpmod
from fednet.algebra.fixed_point import (
    FixedPoint,
    extract_bits,
    limbs_to_object,
    prepare,
    random_ring_limbs,
    ring_matmul,
)
from fednet.algebra.meter import MacMeter

Q = FixedPoint(48, 24)


def oracle_matmul(q: FixedPoint, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python-int reference: floor((a @ b) / 2^f) reduced to Z<k>."""
    s = a.astype(object) @ b.astype(object)
    return q.wrap(s >> q.f)


def oracle_mul(q: FixedPoint, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return q.wrap((a.astype(object) * b.astype(object)) >> q.f)


def full_range(q: FixedPoint, shape, rng) -> np.ndarray:
    """Uniform Z<k> values with the extremes planted, so products wrap."""
    a = q.random_pad(shape, rng)
    flat = a.reshape(-1)
    flat[: min(2, flat.size)] = [q.lo, q.hi][: min(2, flat.size)]
    return a


# ----------------------------------------------------------------------------- format
def test_constructor_validates():
    with pytest.raises(ValueError, match="k must be"):
        FixedPoint(63, 10)
    with pytest.raises(ValueError, match="f must be"):
        FixedPoint(48, 48)
    with pytest.raises(ValueError, match="f must be"):
        FixedPoint(48, -1)


def test_encode_decode_roundtrip_and_range():
    x = np.array([0.0, 1.5, -2.25, 2.0**-24, -(2.0**23), 2.0**23 - 2.0**-24])
    a = Q.encode(x)
    assert a.dtype == np.int64
    np.testing.assert_array_equal(Q.decode(a), x)
    # rounding to nearest: error at most half an ulp
    y = np.random.default_rng(0).uniform(-1000, 1000, 1000)
    assert np.abs(Q.decode(Q.encode(y)) - y).max() <= 2.0**-25
    with pytest.raises(ValueError, match="out of range"):
        Q.encode([2.0**23])
    with pytest.raises(ValueError, match="finite"):
        Q.encode([np.nan])
    # wrap: 2^23 is -2^23 mod 2^24 in real units
    assert Q.decode(Q.encode([2.0**23], wrap=True))[0] == -(2.0**23)


def test_validate_names_argument():
    with pytest.raises(ValueError, match="b has values outside"):
        Q.add(np.zeros(2, dtype=np.int64), np.array([0, 2**47]))
    with pytest.raises(TypeError, match="integer"):
        Q.add(np.zeros(2), np.zeros(2, dtype=np.int64))


def test_add_wraps_mod_2k():
    rng = np.random.default_rng(1)
    a, b = full_range(Q, 1000, rng), full_range(Q, 1000, rng)
    ref = Q.wrap(a.astype(object) + b.astype(object))
    np.testing.assert_array_equal(Q.add(a, b), ref)
    np.testing.assert_array_equal(Q.sub(Q.add(a, b), b), a)
    assert Q.add(np.array([Q.hi]), np.array([1]))[0] == Q.lo


@pytest.mark.parametrize("k,f", [(48, 24), (62, 30), (20, 8), (16, 0), (33, 32)])
def test_elementwise_mul_matches_python_ints(k, f):
    q = FixedPoint(k, f)
    rng = np.random.default_rng(k * 100 + f)
    a, b = full_range(q, 2000, rng), full_range(q, 2000, rng)
    np.testing.assert_array_equal(q.mul(a, b), oracle_mul(q, a, b))


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**47), 2**47 - 1), st.integers(-(2**47), 2**47 - 1))
def test_mul_property(x, y):
    got = Q.mul(np.array([x]), np.array([y]))[0]
    want = ((x * y >> 24) + 2**47) % 2**48 - 2**47
    assert got == want


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (40, 300, 10), (3, 64, 1)])
def test_matmul_matches_python_ints_with_wrap(shape):
    m, K, n = shape
    rng = np.random.default_rng(m * K * n)
    a, b = full_range(Q, (m, K), rng), full_range(Q, (K, n), rng)
    np.testing.assert_array_equal(Q.matmul(a, b), oracle_matmul(Q, a, b))


@pytest.mark.parametrize("k,f", [(62, 31), (24, 12), (40, 0)])
def test_matmul_other_formats(k, f):
    q = FixedPoint(k, f)
    rng = np.random.default_rng(k + f)
    a, b = full_range(q, (9, 50), rng), full_range(q, (50, 4), rng)
    np.testing.assert_array_equal(q.matmul(a, b), oracle_matmul(q, a, b))


def test_matmul_vector_prepared_and_small_operands():
    rng = np.random.default_rng(5)
    a = full_range(Q, (20, 30), rng)
    x = rng.integers(-(2**20), 2**20, size=30)  # small: fewer limbs
    pa = Q.prepare(a)
    assert pa.nlimbs == 3 and prepare(x).nlimbs == 2
    for _ in range(2):  # reuse of the prepared form
        np.testing.assert_array_equal(Q.matmul(pa, x), oracle_matmul(Q, a, x[:, None])[:, 0])
    np.testing.assert_array_equal(pa.to_object(), a.astype(object))


def test_matmul_chunks_long_inner_dimension(monkeypatch):
    monkeypatch.setattr(fpmod, "MAX_INNER", 7)
    rng = np.random.default_rng(6)
    a, b = full_range(Q, (4, 30), rng), full_range(Q, (30, 3), rng)
    np.testing.assert_array_equal(Q.matmul(a, b), oracle_matmul(Q, a, b))


def test_matmul_partial_sums_stay_exact_for_large_inner_dimension():
    # 60000-long inner dimension (X^T X of MNIST), all limbs at their maximum magnitude:
    # every float64 partial sum must stay below 2^53.
    K = 60000
    a = np.full((2, K), Q.lo, dtype=np.int64)
    a[1] = Q.hi
    b = np.full((K, 2), Q.hi, dtype=np.int64)
    b[:, 1] = Q.lo
    np.testing.assert_array_equal(Q.matmul(a, b), oracle_matmul(Q, a, b))


def test_matmul_shapes_checked_and_metered():
    with pytest.raises(ValueError, match="do not align"):
        Q.matmul(np.zeros((2, 3), dtype=np.int64), np.zeros((4, 1), dtype=np.int64))
    rng = np.random.default_rng(7)
    with MacMeter() as meter:
        Q.matmul(full_range(Q, (6, 8), rng), full_range(Q, (8, 5), rng))
        Q.mul(np.ones(10, dtype=np.int64), np.ones(10, dtype=np.int64))
    assert meter.macs == 6 * 8 * 5 + 10


def test_fixed_point_product_approximates_real_product():
    rng = np.random.default_rng(8)
    A = rng.uniform(-1, 1, (30, 200))
    B = rng.uniform(-1, 1, (200, 10))
    got = Q.decode(Q.matmul(Q.encode(A), Q.encode(B)))
    # input rounding (2^-25 each) times the 1-norms, plus one ulp of the final floor
    bound = 2.0**-25 * (np.abs(A).sum(1)[:, None] + np.abs(B).sum(0)[None, :]) + 2.0**-24 + 1e-12
    assert np.all(np.abs(got - A @ B) <= bound)


def test_ring_matmul_wide_modulus_python_int_oracle():
    rng = np.random.default_rng(9)
    bits = 96
    a = limbs_to_object(random_ring_limbs((5, 40), bits, rng)) - (1 << (bits - 1))
    b = rng.integers(-(2**47), 2**47, size=(40, 3))
    limbs = ring_matmul(prepare(a), b, bits)
    want = (a @ b.astype(object)) % (1 << bits)
    np.testing.assert_array_equal(limbs_to_object(limbs), want)
    # shifting by 48 bits of the wide result gives its Z<48> top part
    np.testing.assert_array_equal(
        extract_bits(limbs, 48, 48), Q.wrap(want >> 48)
    )


# ----------------------------------------------------------------------------- pads
def test_pads_are_uniform_over_the_full_range():
    rng = np.random.default_rng(10)
    r = Q.random_pad(200_000, rng)
    assert r.min() >= Q.lo and r.max() <= Q.hi
    bits = ((r[:, None] >> np.arange(48)) & 1).mean(axis=0)
    # each of the 48 bits is a fair coin: sd 0.0011 per bit, allow 5 sd
    assert np.all(np.abs(bits - 0.5) < 5 * 0.5 / np.sqrt(r.size))
    s = Q.random_pad((5, 5), rng, symmetric=True)
    np.testing.assert_array_equal(s, s.T)
    with pytest.raises(TypeError, match="Generator"):
        Q.random_pad(3, 42)
    with pytest.raises(ValueError, match="square"):
        Q.random_pad((2, 3), rng, symmetric=True)


@pytest.mark.parametrize("secret", [-8, -3, 0, 5, 7])
def test_proposition_1_padded_secret_is_uniform(secret):
    """Prop. 1 on Q<4,2>: x + r mod 2^4 is uniform whatever x (chi-square, p = 1e-4)."""
    q = FixedPoint(4, 2)
    rng = np.random.default_rng(100 + secret)
    n = 160_000
    v = q.add(np.full(n, secret, dtype=np.int64), q.random_pad(n, rng))
    counts = np.bincount(v - q.lo, minlength=16)
    expected = n / 16
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 44.26  # 1 - 1e-4 quantile of chi-square with 15 degrees of freedom


def test_proposition_2_retrieval_error_is_order_2_minus_f():
    """Prop. 2: c(x + r) - c r = c x + O(2^-f), with the pad in the wide ring Z_2^(k+f)."""
    rng = np.random.default_rng(11)
    n = 5000
    c = Q.encode(rng.uniform(-50, 50, n))
    x = Q.encode(rng.uniform(-50, 50, n))
    wide = 1 << (Q.k + Q.f)
    r = limbs_to_object(random_ring_limbs((n,), Q.k + Q.f, rng))
    v = (x.astype(object) + r) % wide
    got = Q.sub(Q.mul_padded(c, v), Q.mul_padded(c, r))
    err = np.abs(Q.decode(got) - Q.decode(c) * Q.decode(x))
    assert err.max() <= 2.0**-Q.f
    # and c x itself must be representable: the same values through the plain product
    assert np.abs(Q.decode(Q.mul(c, x)) - Q.decode(got)).max() <= 2.0**-Q.f


def test_naive_padded_product_in_z2k_is_not_linear():
    """With the pad only in Z_2^k, floor(c v 2^-f) mod 2^k does not commute with the wrap."""
    rng = np.random.default_rng(12)
    n = 1000
    c = Q.encode(rng.uniform(-1, 1, n))
    x = Q.encode(rng.uniform(-(2.0**22), 2.0**22, n))  # x + r wraps with probability ~1/4
    r = Q.random_pad(n, rng)
    got = Q.sub(Q.mul(c, Q.add(x, r)), Q.mul(c, r))
    err = np.abs(Q.decode(got) - Q.decode(c) * Q.decode(x))
    assert np.mean(err > 1.0) > 0.1  # a wrap of x + r leaks 2^(k-f) c t into the result
    # the wide-ring product retrieves the same products to 2^-f
    wide = 1 << (Q.k + Q.f)
    rw = limbs_to_object(random_ring_limbs((n,), Q.k + Q.f, rng))
    good = Q.sub(Q.mul_padded(c, (x.astype(object) + rw) % wide), Q.mul_padded(c, rw))
    assert np.abs(Q.decode(good) - Q.decode(c) * Q.decode(x)).max() <= 2.0**-Q.f


def test_ring_helpers_match_python_ints():
    from fednet.algebra.fixed_point import ring_add, ring_from_int, ring_scaled_sum, ring_shift

    rng = np.random.default_rng(13)
    bits = 96
    mod = 1 << bits
    a = rng.integers(-(2**62), 2**62, size=(3, 4))
    la = ring_from_int(a, bits)
    np.testing.assert_array_equal(limbs_to_object(la), a.astype(object) % mod)
    terms = [random_ring_limbs((3, 4), bits, rng) for _ in range(5)]
    coef = [int(c) for c in rng.integers(-(2**30), 2**30, size=5)]
    with MacMeter() as meter:
        got = ring_scaled_sum(coef, terms, bits)
    assert meter.macs == 5 * 12
    want = sum(c * limbs_to_object(t) for c, t in zip(coef, terms)) % mod
    np.testing.assert_array_equal(limbs_to_object(got), want)
    s = ring_add(got, la, bits, subtract=True)
    np.testing.assert_array_equal(limbs_to_object(s), (want - a.astype(object)) % mod)
    for shift, out in [(24, 72), (16, 80), (0, 40), (37, 48)]:
        np.testing.assert_array_equal(
            limbs_to_object(ring_shift(got, shift, out)), (want >> shift) % (1 << out)
        )
