"""Exact RNS kernels modulo the DReS-FL primes: bit-exact against Python integers."""

import numpy as np
import pytest

from fednet.algebra.fields import uniform
from fednet.algebra.meter import MacMeter
from fednet.algebra.rns import RnsCapacityError, RnsContext, rns_context
from fednet.codes.dresfl import DRESFL_PRIME_200, DRESFL_PRIME_440
from fednet.algebra.fields import check_prime

PRIMES = [DRESFL_PRIME_200, DRESFL_PRIME_440]


def _ref_matmul(A, B, q):
    A = np.asarray(A, dtype=object)
    B = np.asarray(B, dtype=object)
    return (A.dot(B)) % q


def test_dresfl_primes_are_prime():
    assert check_prime(DRESFL_PRIME_200) == 2**200 - 75
    assert check_prime(DRESFL_PRIME_440) == 2**440 - 33


@pytest.mark.parametrize("q", PRIMES)
def test_context_capacity_invariants(q):
    ctx = rns_context(q)
    m = [int(v) for v in ctx.moduli]
    assert len(set(m)) == len(m) and all(max(ctx.max_inner, 64) * (v // 2 + 1) ** 2 + v < 2**53 for v in m)
    M = 1
    for v in m:
        M *= v
    assert 4 * ctx.max_inner * ctx.reduced_bound**2 < M
    assert ctx.L == {200: 22, 440: 44}[q.bit_length()]


@pytest.mark.parametrize("q", PRIMES)
def test_roundtrip_and_random_products_exact(q):
    ctx = rns_context(q)
    rng = np.random.default_rng(1)
    A = uniform(rng, q, (6, 33))
    B = uniform(rng, q, (33, 5))
    a = ctx.from_field(A)
    assert (a.to_field() == A).all()
    with MacMeter() as m:
        C = ctx.matmul(a, ctx.from_field(B))
    assert m.macs == 6 * 33 * 5
    assert (C.to_field() == _ref_matmul(A, B, q)).all()
    # chained: (A B) * (A B) element-wise, then times a signed small matrix, then transpose product
    D = ctx.multiply(C, C)
    W = rng.integers(-(2**40), 2**40, (5, 4))
    E = ctx.matmul(D, ctx.from_signed(W))
    ref = (_ref_matmul(A, B, q) ** 2 % q).dot(W.astype(object)) % q
    assert (E.to_field() == ref).all()
    F = ctx.matmul(E.T, ctx.from_field(A[:, :3]))
    assert (F.to_field() == _ref_matmul(ref.T, A[:, :3], q)).all()


@pytest.mark.parametrize("q", PRIMES)
@pytest.mark.parametrize("k", [1, 784, 4096])
def test_adversarial_all_p_minus_one(q, k):
    """Every entry p - 1 (balanced -1 is easy; canonical p-1 read as -1) and p - 1 >> 1 (largest magnitude)."""
    ctx = rns_context(q)
    half = (q - 1) // 2
    for v in (q - 1, half, half + 1):
        A = np.full((2, k), v, dtype=object)
        B = np.full((k, 3), v, dtype=object)
        C = ctx.matmul(ctx.from_field(A), ctx.from_field(B)).to_field()
        assert (C == (k * v * v) % q).all()
        # a second product on the reduced result (largest reduced representatives)
        C2 = ctx.matmul(ctx.from_field(np.full((1, 2), v, dtype=object)),
                        ctx.matmul(ctx.from_field(A), ctx.from_field(B))).to_field()
        assert (C2 == (2 * k * v**3) % q).all()


def test_inner_dimension_capacity_error():
    ctx = RnsContext(DRESFL_PRIME_200, max_inner=64)
    a = ctx.from_signed(np.ones((2, 65), dtype=np.int64))
    b = ctx.from_signed(np.ones((65, 2), dtype=np.int64))
    with pytest.raises(RnsCapacityError, match="inner dimension 65 exceeds max_inner = 64"):
        ctx.matmul(a, b)


def test_value_capacity_error_names_bits():
    ctx = RnsContext(DRESFL_PRIME_200, max_inner=64)
    with pytest.raises(RnsCapacityError, match="capacity exceeded"):
        ctx.moduli_for(2**2000)


def test_signed_input_validation():
    ctx = rns_context(DRESFL_PRIME_200)
    with pytest.raises(ValueError, match="magnitude"):
        ctx.from_signed(np.array([DRESFL_PRIME_200 // 2 + 1], dtype=object))
    with pytest.raises(ValueError, match=r"\[0, q\)"):
        ctx.from_field(np.array([-1]))


def test_small_prime_matches_int64():
    q = 2**31 - 1
    ctx = RnsContext(q, max_inner=256)
    rng = np.random.default_rng(0)
    A = rng.integers(0, q, (4, 256))
    B = rng.integers(0, q, (256, 3))
    C = ctx.matmul(ctx.from_field(A), ctx.from_field(B)).to_field()
    assert C.dtype == np.int64 and (C == _ref_matmul(A, B, q).astype(np.int64)).all()


def test_numpy_fallback_matches_numba(monkeypatch):
    """The fused numba kernels and the NumPy fallback give identical residues and values."""
    import fednet.algebra.rns as rns

    q = DRESFL_PRIME_200
    rng = np.random.default_rng(8)
    A = uniform(rng, q, (5, 40))
    B = uniform(rng, q, (40, 6))
    ctx1 = RnsContext(q, 64)
    C1 = ctx1.matmul(ctx1.from_field(A), ctx1.from_field(B))
    monkeypatch.setattr(rns, "_numba", None)
    ctx2 = RnsContext(q, 64)
    C2 = ctx2.matmul(ctx2.from_field(A), ctx2.from_field(B))
    assert (C1.to_field() == C2.to_field()).all() and (C2.to_field() == _ref_matmul(A, B, q)).all()


def test_to_signed_small_and_large_bounds():
    q = DRESFL_PRIME_200
    ctx = rns_context(q)
    x = np.array([[-(2**100), 5, 0], [2**120 + 3, -1, 7]], dtype=object)
    a = ctx.from_signed(x)
    assert (ctx.to_signed(a) == x).all() and (a.to_field() == np.where(x < 0, x + q, x)).all()
    b = ctx.matmul(a, ctx.from_signed(np.ones((3, 2), dtype=np.int64)))  # small exact bound
    assert (ctx.to_signed(b) == x.dot(np.ones((3, 2), dtype=object))).all()
    u = ctx.from_field(np.array([q - 1, (q - 1) // 2, (q + 1) // 2], dtype=object))
    big = ctx.multiply(u, u)  # reduced: bound above q / 2, goes through the canonical path
    ref = [(v * v) % q for v in (q - 1, (q - 1) // 2, (q + 1) // 2)]
    assert ctx.to_signed(big).tolist() == [v - q if v > (q - 1) // 2 else v for v in ref]


def test_add_scale_sum_rows_broadcast():
    q = DRESFL_PRIME_200
    ctx = rns_context(q)
    rng = np.random.default_rng(5)
    A = uniform(rng, q, (3, 4))
    b = uniform(rng, q, (4,))
    a_r, b_r = ctx.from_field(A), ctx.from_field(b)
    with MacMeter() as m:
        s1 = ctx.add(a_r, b_r, scale_b=-3).to_field()
        s2 = ctx.add(b_r, a_r).to_field()  # the smaller operand first
        s3 = ctx.scale(7, a_r).to_field()
        s4 = ctx.sum_rows(a_r).to_field()
    assert m.macs == 12 + 12 + 12 + 12
    Ao, bo = A.astype(object), b.astype(object)
    assert (s1 == (Ao - 3 * bo) % q).all() and (s2 == (Ao + bo) % q).all()
    assert (s3 == (7 * Ao) % q).all() and (s4 == Ao.sum(axis=0) % q).all()
    with pytest.raises(ValueError, match="scale_b"):
        ctx.add(a_r, b_r, scale_b=2**20)
