"""Capacity checks before exact computation, and exact paths for every accepted size (issue 14, item 1)."""

from __future__ import annotations

import galois
import numpy as np
import pytest

from factories import make_sim, make_task
from fednet.algebra.capacity import (
    check_fixed_point_holds,
    check_round_capacity,
    check_statistics_capacity,
    smallest_k,
    statistics_bounds,
)
from fednet.algebra.fields import check_field_capacity
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.modp import PreparedMatrix
from fednet.algebra.quantize import dequantize, quantize
from fednet.codes.lightsecagg import check_lsa_parameters
from fednet.errors import CapacityError, ConfigError
from fednet.protocols.codedpaddedfl import CodedPaddedFL, local_statistics
from fednet.protocols.codedsecagg import CodedSecAgg
from fednet.protocols.lightsecagg import LightSecAgg


def wide_task(scale=4.0, D=6, n=200):
    """Features in [-2, 2): X^T X reaches about 270, sum over 6 devices of |X^T Y| about 700."""
    task = make_task(D=D, n=n, d=5, c=2, lr=0.5)
    for X in task.X:
        X *= scale
    return task


# -- the arithmetic of the bound -------------------------------------------------------------
@pytest.mark.parametrize("m, f, k", [(0.0, 8, 9), (127.99, 8, 16), (128.0, 8, 17), (2.0**-9, 8, 9),
                                     (1.0, 24, 26), (2.0**23 - 2.0**-24, 24, 48)])
def test_smallest_k_is_the_boundary(m, f, k):
    assert smallest_k(m, f) == k
    q = FixedPoint(k, f)
    q.encode(np.array([m, -m]))                               # holds m ...
    if k > f + 1:
        with pytest.raises(ValueError):
            FixedPoint(k - 1, f).encode(np.array([m]))        # ... and k - 1 does not


def test_refusal_names_k_the_bound_and_the_smallest_k():
    with pytest.raises(CapacityError, match=r"k = 16 too small: Q<16,8> holds magnitudes below 2\^7 = 128, "
                                            r"but X reaches 700; the smallest k that works with f = 8 is k = 19"):
        check_fixed_point_holds(FixedPoint(16, 8), 700.0, "X")
    with pytest.raises(CapacityError, match=r"no k <= 62 works with f = 40 .*lower f to at most 39"):
        check_fixed_point_holds(FixedPoint(62, 40), 2.0**21 + 1, "X")
    with pytest.raises(CapacityError, match="not finite"):
        check_fixed_point_holds(FixedPoint(62, 40), float("inf"), "X")
    assert issubclass(CapacityError, ConfigError) and issubclass(CapacityError, ValueError)


def test_statistics_bounds_are_upper_bounds_of_the_exact_values_and_tight():
    q = FixedPoint(40, 12)
    rng = np.random.default_rng(3)
    X, Y = rng.uniform(-3, 3, (300, 7)), np.eye(3)[rng.integers(0, 3, 300)]
    M, G1 = local_statistics(q, X, Y)                          # exact, no wrap in Q<40,12>
    data, gram, cross = statistics_bounds(q, X, Y)
    m_exact, g_exact = float(np.abs(q.decode(M)).max()), float(np.abs(q.decode(G1)).max())
    assert m_exact <= gram <= m_exact * 1.001 + 2**-12
    assert g_exact <= cross and data == pytest.approx(3.0, abs=1e-2)


# -- the known silent failure: Q<k,f> too narrow for X^T X -------------------------------------
def test_too_narrow_fixed_point_is_refused_before_training_with_the_smallest_k():
    task = wide_task()
    proto = CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, k=16, f=8))
    with pytest.raises(CapacityError, match=r"k = 16 too small.*smallest k that works with f = 8 is k = 19") as err:
        proto.run(3)
    assert proto.trace == [] and proto.sim.now == 0.0           # refused before any round or transfer
    assert "group 0" in str(err.value)
    # at the smallest k the setup passes and the decoded gradients meet their bound
    rows = CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, k=19, f=8)).run(1)
    assert rows[1]["decode_error"] <= rows[1]["decode_bound"]


def test_too_narrow_fixed_point_is_refused_in_timing_mode_and_for_codedsecagg():
    task = wide_task()
    with pytest.raises(CapacityError, match="smallest k that works with f = 8 is k = 19"):
        CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, k=16, f=8, mode="timing")).run(1)
    with pytest.raises(CapacityError, match=r"k = 16 too small.*is k = 19"):
        CodedSecAgg(make_sim(D=6), task, dict(z=1, groups=2, k=16, f=8)).run(1)


def test_a_round_that_would_wrap_is_refused():
    """Setup fits, but a diverging model makes X^T X epsilon overflow Q<k,f> in a later round."""
    task = wide_task(scale=2.0)
    task.learning_rate = 40.0
    proto = CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, k=20, f=8))
    with pytest.raises(CapacityError, match=r"k = 20 too small.*in round \d+, group 0"):
        proto.run(30)
    assert len(proto.trace) >= 2                                 # setup and at least one round passed


def test_round_capacity_bounds_coded_values():
    q = FixedPoint(16, 8)
    parts = [np.full((2, 2), 60.0), np.full((2, 2), -60.0)]
    check_round_capacity(q, parts, what="r")                      # 60 and a sum of 0 fit below 128
    with pytest.raises(CapacityError, match="coded gradient"):
        check_round_capacity(q, parts, np.array([[1.5, 1.0], [0.0, 1.0]]), what="r")   # 150 > 128


def test_statistics_capacity_names_the_device():
    q = FixedPoint(16, 8)                                         # holds magnitudes below 128
    X = [np.full((4, 2), 0.5), np.full((4, 2), 8.0)]
    Y = [np.zeros((4, 1)), np.zeros((4, 1))]
    with pytest.raises(CapacityError, match=r"X_i\^T X_i of device 1 reaches 256\.00.*is k = 18"):
        check_statistics_capacity(q, X, Y)


# -- fields ------------------------------------------------------------------------------------
def test_field_refusal_gives_the_smallest_prime():
    with pytest.raises(CapacityError, match=r"p = 101 .*smallest prime that works is p = 211 \(8 bits\)"):
        check_field_capacity(101, 105, what="sums", param="p")


def test_lightsecagg_validates_its_prime_like_the_others():
    with pytest.raises(ValueError, match="q must be a prime"):
        check_lsa_parameters(5, 4, 1, 2**32)
    with pytest.raises(ValueError, match="odd prime"):
        check_lsa_parameters(1, 1, 0, 2)
    with pytest.raises(CapacityError, match="U = 4 quantised units"):
        check_lsa_parameters(5, 4, 1, 65537, quant_bits=16)
    task = make_task(D=5, n=10, d=4, c=2)
    with pytest.raises(CapacityError, match="smallest prime that works"):
        LightSecAgg(make_sim(D=5), task, dict(z=1, U=4, p=65537, quant_bits=16))


@pytest.mark.parametrize("mode", ["full", "timing"])
def test_lightsecagg_gradients_beyond_the_field_raise(mode):
    """Gradients too large for U summands of GF(p) at 2^16 units: both modes stop with the capacity error (timing
    mode checks the survivors' gradients, the ones the aggregate sums, when it sums them)."""
    task = make_task(D=5, n=10, d=4, c=2)
    for X in task.X:
        X *= 1.0e4                                        # |G| up to ~5e4, ~3e9 units of 2^-16: beyond 2^31 / U
    proto = LightSecAgg(make_sim(D=5, seed=2), task, dict(z=1, U=4, mode=mode))
    with pytest.raises(CapacityError, match="sums of 4 quantised values"):
        proto.run(2)


@pytest.mark.parametrize("bits", [62, 63, 64, 65, 101])
def test_lightsecagg_runs_exactly_for_every_prime_size(bits):
    """Masks cancel and quantised sums are exact: the trace is that of the 32-bit prime."""
    p = int(galois.next_prime(2**bits))
    task = make_task(D=5, n=12, d=5, c=2, lr=0.5)
    ref = LightSecAgg(make_sim(D=5, seed=2), task, dict(z=1, U=4)).run(2)
    got = LightSecAgg(make_sim(D=5, seed=2), task, dict(z=1, U=4, p=p)).run(2)
    assert [(r["accuracy"], r["loss"], r["time_s"]) for r in got] == [(r["accuracy"], r["loss"], r["time_s"]) for r in ref]


@pytest.mark.parametrize("k, f", [(20, 8), (40, 22), (48, 15), (48, 16), (62, 41)])
def test_codedsecagg_runs_exactly_for_every_field_size(k, f):
    """q from 29 to 104 bits (int64 and object paths): every decoded aggregate is checked exactly."""
    proto = CodedSecAgg(make_sim(D=4, seed=2), make_task(D=4, n=12, d=4, c=2, lr=0.5), dict(z=1, k=k, f=f))
    proto.run(2)
    assert proto.max_decode_error < 2.0**-(f - 8)


# -- int64 edges ---------------------------------------------------------------------------------
def test_fixed_point_encode_bounds_are_exact_for_wide_k():
    for k, f in ((54, 0), (60, 4), (62, 10)):
        q = FixedPoint(k, f)
        top = 2.0 ** (k - f - 1)
        assert int(q.encode(np.array([-top]))[0]) == -(2 ** (k - 1))
        assert int(q.encode(np.array([top - 2.0 ** (k - f - 54)]))[0]) <= q.hi
        with pytest.raises(ValueError, match="out of range"):
            q.encode(np.array([top]))                           # 2^(k-1) units: one past the top


def test_signed_product_with_minus_two_to_the_63_is_exact():
    p = int(galois.next_prime(2**64))
    rng = np.random.default_rng(0)
    A = rng.integers(0, 2**62, (3, 2)).astype(object)
    b = np.array([[-(2**63), 5], [2**63 - 1, -(2**63)]], dtype=np.int64)
    got = PreparedMatrix(A, p).matmul_signed(b)
    want = (A.dot(b.astype(object))) % p
    assert np.array_equal(got.astype(object), want)


def test_quantize_beyond_int64_is_exact():
    p = int(galois.next_prime(2**80))
    x = np.array([2.0**63.5, -(2.0**70), 3.25, -1.5])
    v = quantize(x, 2, p)
    want = [int(t) for t in np.rint(x * 4)]
    assert [int(t) for t in v] == [w % p for w in want]
    assert np.array_equal(dequantize(v, 2, p), np.rint(x * 4) / 4)
    with pytest.raises(CapacityError, match="smallest prime that works"):
        quantize(x, 2, p, n_summands=2**20)


def test_codedsecagg_round_that_would_wrap_is_refused():
    """Here the aggregate (about 4800 > 2^11) exceeds q/2 and wraps *into* Z_<k+f> modulo q, so the
    range check of decode_aggregate passes: only the capacity check catches it."""
    task = wide_task(scale=2.0)
    task.learning_rate = 40.0
    proto = CodedSecAgg(make_sim(D=6), task, dict(z=1, groups=2, k=20, f=8))
    with pytest.raises(CapacityError, match=r"k = 20 too small.*the aggregate gradient of round \d+ reaches"):
        proto.run(30)
    assert len(proto.trace) >= 2


# -- resolution: a format that fits but rounds the data away (issue 31, item 6) ---------------
def test_rounding_error_is_the_relative_rms_error() -> None:
    from fednet.algebra.capacity import rounding_error

    x = [np.array([0.3, -0.2]), np.array([[1.0]])]          # at 2^-2: 0.25, -0.25, 1.0
    expected = np.sqrt((0.05**2 + 0.05**2 + 0.0) / (0.09 + 0.04 + 1.0))
    assert rounding_error(x, 2) == pytest.approx(expected, rel=1e-12)
    assert rounding_error([np.zeros(3)], 2) == 0.0


def test_a_format_that_rounds_the_data_away_is_refused_with_the_smallest_sufficient_f() -> None:
    from fednet.algebra.capacity import ROUNDING_LIMIT, rounding_error

    task = make_task(D=6)
    assert rounding_error(task.X, 6) > ROUNDING_LIMIT >= rounding_error(task.X, 7)   # so f = 7 is the smallest
    with pytest.raises(CapacityError, match=r"f = 4 rounds the devices' data \(X\) with a relative RMS error of "
                                            r"0\.06.*use f >= 7"):
        CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, f=4, mode="timing")).run(1)
    with pytest.raises(CapacityError, match=r"use f >= 7"):
        CodedSecAgg(make_sim(D=6), task, dict(z=1, groups=2, f=6, mode="timing")).run(1)
    CodedPaddedFL(make_sim(D=6), task, dict(alpha=2, f=7, mode="timing")).run(1)          # accepted


def test_the_summary_reports_the_observed_decode_error() -> None:
    from fednet.study.results import summarize

    proto = CodedPaddedFL(make_sim(D=6), make_task(D=6), dict(alpha=2, mode="full"))
    rows = proto.run(2)
    got = summarize({"padded": {0: rows}}, [0.5], None)["runs"]["padded"]["decode_error"]
    assert got["max"]["0"] == max(r["decode_error"] for r in rows if "decode_error" in r) and got["exceeded"] == []
    assert got["bound"]["0"] >= got["max"]["0"]
    bad = [dict(r) for r in rows]
    bad[-1]["decode_error"] = 2 * got["bound"]["0"] + 1.0                   # past its bound: named in the summary
    assert summarize({"padded": {0: bad}}, [0.5], None)["runs"]["padded"]["decode_error"]["exceeded"] == ["0"]
    timing = CodedPaddedFL(make_sim(D=6), make_task(D=6), dict(alpha=2, mode="timing")).run(2)
    assert "decode_error" not in summarize({"padded": {0: timing}}, [0.5], None)["runs"]["padded"]
