"""Declared kernel costs (``fednet.algebra.meter.kernel``): full mode checks the declaration on every call, timing
mode charges it without running the kernel, the host's value is never billed, and the built-in kernels' declarations
equal what they meter."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.meter import (DeclaredCostError, MacMeter, charge, declared_cost, kernel, matmul, unmetered)
from fednet.algebra.shape import Shape
from fednet.protocol.modes import Full, Timing


def _product_macs(a, b) -> int:
    return a.shape[0] * a.shape[1] * b.shape[1]


@kernel(macs=_product_macs, out=lambda a, b: Shape((a.shape[0], b.shape[1]), np.float64),
        value=lambda a, b: "host value")
def product(a, b):
    """``a @ b``, declared."""
    return matmul(a, b)


@kernel(macs=lambda a, b: _product_macs(a, b) - 1, out=lambda a, b: Shape((a.shape[0], b.shape[1]), np.float64))
def short_product(a, b):
    """``a @ b``, declaring one MAC too few."""
    return matmul(a, b)


@kernel(macs=_product_macs, out=lambda a, b: Shape((b.shape[1], a.shape[0]), np.float64))
def transposed_product(a, b):
    """``a @ b``, declaring the transposed shape."""
    return matmul(a, b)


A, B = np.ones((5, 7)), np.ones((7, 3))


def test_full_mode_runs_and_checks_a_declared_kernel() -> None:
    with MacMeter() as m:
        out = Full().run(product, A, B)
    assert m.macs == 105 and np.array_equal(out, A @ B)
    assert declared_cost(product).count((A, B), {}) == 105 and declared_cost(matmul) is None


def test_full_mode_refuses_an_under_declared_kernel_on_every_call() -> None:
    for _ in range(2):                                         # no cache: every call is checked
        with pytest.raises(DeclaredCostError, match=r"short_product metered 105 MACs but declares 104") as err:
            Full().run(short_product, A, B)
        assert isinstance(err.value, AssertionError) and err.value.kernel.endswith("short_product")


def test_full_mode_refuses_outputs_of_another_shape() -> None:
    with pytest.raises(DeclaredCostError, match=r"shape \(5, 3\).*declares Shape\(3, 5\)"):
        Full().run(transposed_product, A, B)


def test_timing_mode_charges_the_declaration_without_running_the_kernel() -> None:
    calls = []

    @kernel(macs=lambda a, b: 11, out=lambda a, b: Shape((2, 2), np.int64))
    def never_run(a, b):
        calls.append(1)
        return matmul(a, b)
    with MacMeter() as m:
        out = Timing().run(never_run, Shape((2, 9), np.int64), Shape((9, 2), np.int64))
    assert m.macs == 11 and not calls and out.shape == (2, 2) and out.value is None


def test_timing_mode_host_values_are_never_billed() -> None:
    """The declared ``value`` hook and a call's ``stand_in`` run unmetered, whatever they compute."""
    def billing_stand_in():
        charge(1_000_000)                                      # host arithmetic that must not reach the clock
        return "stand-in"
    with MacMeter() as m:
        declared = Timing().run(product, Shape.like(A), Shape.like(B))
        overridden = Timing().run(product, Shape.like(A), Shape.like(B), stand_in=billing_stand_in)
        undeclared = Timing().run(matmul, Shape.like(A), Shape.like(B), stand_in=billing_stand_in)
    assert m.macs == 3 * 105
    assert (declared.value, overridden.value, undeclared.value) == ("host value", "stand-in", "stand-in")


def test_cost_keywords_are_refused_for_a_declared_kernel() -> None:
    for mode in (Full(), Timing()):
        with pytest.raises(TypeError, match=r"declares its costs.*no macs, like"):
            mode.run(product, A, B, macs=105, like=Shape((5, 3), np.float64))


def test_full_mode_checks_a_measuring_closure_too() -> None:
    """An undeclared step's ``macs`` closure (measured once per key, what timing mode charges) is checked against
    the metered count of every full-mode call."""
    with pytest.raises(DeclaredCostError, match=r"metered 105 MACs but its measuring closure .* says 6"):
        Full().run(matmul, A, B, macs=lambda: matmul(np.ones((1, 2)), np.ones((2, 3))), key=("closure-test", 1))
    assert Full().run(matmul, A, B, macs=lambda: matmul(A, B), key=("closure-test", 2)).shape == (5, 3)


def test_invalid_declarations_are_refused() -> None:
    with pytest.raises(TypeError, match="macs must be a non-negative int or a callable, got -1"):
        kernel(macs=-1)
    with pytest.raises(TypeError, match="value must be a callable"):
        kernel(macs=1, value=3)

    @kernel(macs=lambda a: 2.5)
    def fractional(a):
        return a
    with pytest.raises(TypeError, match=r"fractional: declared macs must be a non-negative int, got 2.5"):
        Timing().run(fractional, Shape((1,), np.int64))


def test_unmetered_lives_in_the_meter_module() -> None:
    from fednet.learning import model

    assert model.unmetered is unmetered
    with MacMeter() as outer:
        with unmetered():
            with MacMeter() as inner:
                matmul(A, B)
    assert (outer.macs, inner.macs) == (0, 105)


# -- the built-in kernels' declarations equal what they meter -----------------------------------------------------------
def test_lightsecagg_declarations_equal_the_metered_counts() -> None:
    from fednet.codes import lightsecagg as lsa

    p = 2**31 - 1
    for N, U, T, d, c, rows in [(8, 5, 1, 6, 3, 7), (10, 6, 2, 9, 4, 1)]:
        alphas, betas = lsa.default_lsa_points(N, U)
        rng = np.random.default_rng(0)
        mask = rng.integers(0, p, d * c)
        X, Y = rng.uniform(-0.5, 0.5, (20, d)), np.eye(c)[rng.integers(0, c, 20)]
        shares = Full().run(lsa.lsa_encode_mask, mask, U, T, p, rng, alphas, betas)
        assert shares.shape == (N, lsa.lsa_piece_length(d * c, U, T))
        masked = [Full().run(lsa.masked_gradient, X, Y, np.zeros((d, c), np.float32), np.arange(rows), mask, 8, p, U)
                  for _ in range(U)]
        s_parts = [shares[j] for j in range(U)]                 # the pieces users 0..U-1 hold (values irrelevant)
        Full().run(lsa.unmask_shares, masked, s_parts, alphas[:U], betas, U, T, (d, c), 8, p)


def test_the_error_survives_being_rebuilt_from_its_args() -> None:
    """SimPy re-raises a process's exception as ``type(e)(*e.args)``: the message, kernel and step survive."""
    err = DeclaredCostError("kernel k metered 2 MACs but declares 1", "k").in_step("p: step 'gather'")
    again = type(err)(*err.args)
    assert str(again) == str(err) == "p: step 'gather': kernel k metered 2 MACs but declares 1"
    assert (again.kernel, again.step) == ("k", "p: step 'gather'")


def test_big_prime_outputs_are_declared_with_their_storage_dtype() -> None:
    """Above 2**62 the field's elements are Python ints (object arrays): the declaration says so, and full mode
    checks it (it found LightSecAgg's encoded masks declared int64 at a 63-bit prime)."""
    from fednet.algebra.fields import field_dtype
    from fednet.codes import lightsecagg as lsa

    p = 2**63 + 29                                             # the next prime above 2**63
    alphas, betas = lsa.default_lsa_points(5, 4)
    mask = np.arange(12, dtype=object)
    out = Full().run(lsa.lsa_encode_mask, mask, 4, 1, p, np.random.default_rng(0), alphas, betas)
    assert out.dtype == field_dtype(p) == np.dtype(object)
    assert Timing().run(lsa.lsa_encode_mask, Shape((12,), object), 4, 1, p, None, alphas, betas).dtype == object


@pytest.mark.parametrize("N, U, T, d, c, rows", [(8, 5, 1, 6, 3, 7), (20, 12, 3, 100, 10, 30), (5, 5, 0, 7, 1, 1)])
def test_lightsecagg_closed_forms_equal_the_probes_they_replace(N, U, T, d, c, rows) -> None:
    """The probes timing mode used to measure (in GF(2^31 - 1)) meter exactly the declared closed forms."""
    from fednet.codes import lightsecagg as lsa

    def metered(fn, *args) -> int:
        with MacMeter() as m:
            fn(*args)
        return m.macs
    L = lsa.lsa_piece_length(d * c, U, T)
    alphas, betas = lsa.default_lsa_points(N, U)
    assert metered(lsa.encode_mask_probe, N, U, T, d * c) == lsa.encode_mask_macs(N, U, T, d * c)
    assert (metered(lsa.masked_gradient_probe, (40, d), (40, c), rows, d, c, 16, 2**31 - 1, U)
            == lsa.masked_gradient_macs(rows, d, c))
    assert metered(lsa.unmask_probe, U + 1, alphas[:U], betas, U, T, L, (d, c)) == lsa.unmask_macs(U + 1, U, T, L, d, c)
