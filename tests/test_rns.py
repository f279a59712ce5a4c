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
    assert len(set(m)) == len(m) and all(ctx.max_inner * (v // 2 + 1) ** 2 < 2**53 for v in m)
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
