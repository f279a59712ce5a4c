"""WideInts (16-bit two's complement digit columns) and RnsContext.to_signed_wide: bit-exact against Python ints."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from fednet.algebra import wideint
from fednet.algebra.fields import check_prime
from fednet.algebra.quantize import stochastic_round
from fednet.algebra.rns import rns_context
from fednet.algebra.wideint import WideInts
from fednet.codes.dresfl import DRESFL_PRIME_200, DRESFL_PRIME_440
from fednet.learning.field_models import PLAIN_MODULI, FieldPolyMLP


def _values(n=2500, seed=1, bits=180) -> list[int]:
    """Random signed ints up to ``bits`` bits, with float64 rounding ties and near-ties, and the extremes."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        if rnd.random() < 0.35:
            k = rnd.randint(1, max(2, bits - 60))
            v = (rnd.getrandbits(53) | (1 << 52)) << k
            v += rnd.choice([0, 1 << (k - 1), (1 << (k - 1)) + 1, (1 << (k - 1)) - 1, 1 << k, -1, 1])
        else:
            b = rnd.randint(0, bits)
            v = rnd.getrandbits(b) if b else 0
        out.append(v if rnd.random() < 0.5 else -v)
    return out + [0, 1, -1, 2**(bits + 10) - 1, -2**(bits + 10), 2**53 + 1, -(2**53 + 1)]


@pytest.fixture(params=["numba", "numpy"])
def path(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(wideint, "_numba", None)
    return request.param


def test_round_trip_float_sum_and_trim(path):
    vals = _values()
    a = np.array(vals, dtype=object)
    w = WideInts.from_ints(a, 13)
    assert w.shape == (len(vals),) and w.nd == 13
    assert list(w.to_ints()) == vals
    assert np.array_equal(w.to_float(), np.array([float(v) for v in vals]))     # correctly rounded, ties to even
    s = w + WideInts.from_ints(a[::-1].copy(), 12)
    assert list(s.to_ints()) == [x + y for x, y in zip(vals, vals[::-1])]
    small = WideInts.from_ints(np.array([-5, 3, 0, 2**20], dtype=object), 9).trimmed()
    assert small.nd == 2 and list(small.to_ints()) == [-5, 3, 0, 2**20]
    with pytest.raises(ValueError):
        WideInts.from_ints(np.array([2**15]), 1)


@pytest.mark.parametrize("num, E", [(3602879701896397, 190), (1, 200), (12345678901234567890123456789, 280),
                                    (7, 250), (2**100 + 1, 250), (2**106 - 3, 300), (5, 1000), (3, 0), (1, 16)])
def test_scaled_floor_is_stochastic_rounds_floor_and_frac(path, num, E):
    vals = _values(bits=180 if E > 100 else 40)
    a = np.array(vals, dtype=object)
    out = WideInts.from_ints(a, 13).scaled_floor(num, E)
    den = 1 << E
    fl = (a * num) // den
    rem = a * num - fl * den
    assert out is not None
    assert list(out[0]) == list(fl)
    assert np.array_equal(out[1], rem.astype(np.float64) / float(den))          # stochastic_round's frac
    # so the same draws give stochastic_round's result
    u = np.random.default_rng(3).random(a.shape)
    assert list(out[0] + (u < out[1])) == list(stochastic_round(a * num, np.random.default_rng(3), den=den))


def test_scaled_floor_refuses_a_floor_beyond_int64(path):
    w = WideInts.from_ints(np.array([2**150, 1], dtype=object), 11)
    assert w.scaled_floor(1, 60) is None
    assert w.scaled_floor(1, 100) is not None
    with pytest.raises(ValueError):
        w.scaled_floor(0, 10)


@pytest.mark.parametrize("q", [DRESFL_PRIME_200, DRESFL_PRIME_440, *PLAIN_MODULI])
def test_to_signed_wide_matches_to_signed(path, q):
    ctx = rns_context(q, 4096)
    rnd = random.Random(q % 1000)
    A = np.array([rnd.randint(-2**60, 2**60) for _ in range(64 * 30)], dtype=object).reshape(64, 30)
    B = np.array([rnd.randint(-2**40, 2**40) for _ in range(64 * 20)], dtype=object).reshape(64, 20)
    C = ctx.matmul(ctx.from_signed(A).T, ctx.from_signed(B))                  # reduced modulo q (bound ~ R)
    ref = A.T.dot(B)
    bound = max(abs(int(v)) for v in ref.flat)
    w = ctx.to_signed_wide(C, bound)
    assert np.array_equal(w.to_ints(), ref) and np.array_equal(ctx.to_signed(C), ref)
    assert w.nd == -(-(bound.bit_length() + 1) // 16)                           # trimmed
    assert ctx.to_signed_wide(C, 2**40) is None                                  # a wrong bound is caught
    with pytest.raises(ValueError):
        ctx.to_signed_wide(C, (q + 7) // 8)


def test_plain_moduli_are_prime():
    assert [check_prime(m) for m in PLAIN_MODULI] == list(PLAIN_MODULI)


@pytest.mark.parametrize("q", [DRESFL_PRIME_200, DRESFL_PRIME_440])
def test_wide_integer_gradient_equals_the_python_int_one(q):
    model = FieldPolyMLP((12, 5, 4, 3), q, data_bits=4, weight_bits=8, max_inner=4096)
    rng = np.random.default_rng(0)
    params = model.init_params(1)
    params["b2"] = rng.integers(-300, 300, 4)
    x, y = rng.random((16, 12)), rng.integers(0, 3, 16)
    plain = model.integer_gradient(params, x, y)
    wide = model.integer_gradient(params, x, y, wide=True)
    for k in plain:
        assert isinstance(wide[k], WideInts)
        assert np.array_equal(wide[k].to_ints(), np.asarray(plain[k]).astype(object)), k


@pytest.mark.parametrize("max_norm, n_rows", [(None, 64), (64.0, 64), (1e-3, 64), (64.0, 48)])
def test_dresfl_update_on_wideints_equals_python_ints(path, max_norm, n_rows):
    """The same new parameters and the same draws (n_rows = 48: not a power of two, the Python-int route)."""
    from fednet.codes.dresfl import dresfl_update

    rnd = random.Random(7)
    shapes = {"W1": (30, 8), "b1": (8,), "W2": (8, 3), "b2": (3,)}
    params = {k: np.random.default_rng(1).integers(-400, 400, s) for k, s in shapes.items()}
    grads = {k: np.array([rnd.randint(-2**140, 2**140) for _ in range(int(np.prod(s)))], dtype=object).reshape(s)
             for k, s in shapes.items()}
    kw = dict(lr=0.1, n_rows=n_rows, q=DRESFL_PRIME_440, max_norm=max_norm, shift=128, clip_bits=136)
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    ref = dresfl_update(params, grads, rng=r1, **kw)
    got = dresfl_update(params, {k: WideInts.from_ints(g, 10) for k, g in grads.items()}, rng=r2, **kw)
    for k in shapes:
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k]), k
    assert r1.random() == r2.random()
    assert any(not np.array_equal(ref[k], params[k]) for k in shapes) or max_norm == 1e-3   # 1e-3: steps ~1e-7


def test_wide_integer_gradient_falls_back_over_the_field_when_a_check_fails(monkeypatch):
    from fednet.algebra.rns import RnsContext

    model = FieldPolyMLP((12, 5, 4, 3), DRESFL_PRIME_440, data_bits=4, weight_bits=8)
    rng = np.random.default_rng(2)
    params, x, y = model.init_params(3), rng.random((16, 12)), rng.integers(0, 3, 16)
    plain = model.integer_gradient(params, x, y)
    monkeypatch.setattr(RnsContext, "to_signed_wide", lambda self, v, bound: None)
    wide = model.integer_gradient(params, x, y, wide=True)
    for k in plain:
        assert np.array_equal(wide[k].to_ints(), np.asarray(plain[k]).astype(object)), k
