"""Polynomial integer networks over GF(p): exact gradients against float64, MACs, MNIST training."""

import os
import time

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.codes.dresfl import DRESFL_PRIME_200, DRESFL_PRIME_440
from fednet.learning.field_models import FieldOverflowError, FieldPolyMLP, FieldSGD
from fednet.learning.model import Model


def _data(sizes, b, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((b, sizes[0])), rng.integers(0, sizes[-1], b)


def _exact_int_gradient(model, params, xbar, ybar):
    """Python-int reference of the integer network's gradient (App. E chain rule)."""
    W = [np.asarray(params[f"W{i + 1}"]).astype(object) for i in range(model.n_layers)]
    b = [np.asarray(params[f"b{i + 1}"]).astype(object) * model.bias_mult[i] for i in range(model.n_layers)]
    a, zs = [xbar.astype(object)], []
    for i in range(model.n_layers):
        z = a[-1].dot(W[i]) + b[i]
        zs.append(z)
        if i < model.n_layers - 1:
            a.append(z * z)
    dz = 2 * (zs[-1] - model.label_mult * ybar.astype(object))
    g = {}
    for i in reversed(range(model.n_layers)):
        g[f"W{i + 1}"] = a[i].T.dot(dz)
        g[f"b{i + 1}"] = dz.sum(axis=0) * model.bias_mult[i]
        if i > 0:
            dz = 2 * zs[i - 1] * dz.dot(W[i].T)
    return g


@pytest.mark.parametrize("weight_bits", [None, 8])
@pytest.mark.parametrize("q", [DRESFL_PRIME_200, DRESFL_PRIME_440])
def test_field_gradient_exact_and_matches_float(weight_bits, q):
    sizes = (30, 8, 6, 4)
    model = FieldPolyMLP(sizes, q, data_bits=4, weight_bits=weight_bits, init_scale=1.0 if weight_bits else 3.0)
    assert isinstance(model, Model) and model.degree == 8
    params = model.init_params(3)
    rng = np.random.default_rng(4)
    for i in (1, 2):
        params[f"b{i}"] = rng.integers(-20, 21, sizes[i])
    x, y = _data(sizes, 16)
    xbar, ybar = model.transform(x, y)
    with MacMeter() as m:
        g = model.integer_gradient(params, x, y)
    ref = _exact_int_gradient(model, params, xbar, ybar)
    for k in ref:
        assert (g[k] == ref[k]).all(), k  # bit-exact integers
    products = 2 * 16 * (30 * 8 + 8 * 6 + 6 * 4) + 16 * (8 * 6 + 6 * 4)  # forward, weight grads, input grads
    assert products <= m.macs <= 1.2 * products  # plus one MAC per element-wise operation
    # mapped back (psi) and scaled by 2^-G, it is the float64 gradient of the same real network at the
    # dequantised weights and quantised data: only float64 rounding separates them (relative 1e-12)
    gr = model.gradient(params, x, y)
    gf = model.float_gradient(params, x, y)
    for k in gf:
        scale = np.max(np.abs(gf[k])) + 1e-300
        assert np.max(np.abs(gr[k] - gf[k])) <= 1e-12 * scale, k


def test_fixed_point_scales_and_overflow_check():
    model = FieldPolyMLP((784, 64, 64, 10), DRESFL_PRIME_200, data_bits=4, weight_bits=8)
    # s_z1 = f + l = 12, s_a1 = 24, s_z2 = 32, s_a2 = 64, s_out = 72, G = 2*72 - 8
    assert model.bias_mult == [2**4, 2**24, 2**64] and model.out_bits == 72 and model.grad_bits == 136
    big = FieldPolyMLP((20, 4, 4, 2), DRESFL_PRIME_200, data_bits=4, weight_bits=40)
    x, y = _data((20, 4, 4, 2), 4)
    with pytest.raises(FieldOverflowError, match="does not fit"):
        big.integer_gradient(big.init_params(0), x, y)


def _mnist():
    from fednet.learning.datasets import load_dataset
    data_dir = os.environ.get("FEDNET_DATA", "/work/shared/data")
    try:
        return load_dataset("mnist", data_dir)
    except Exception as exc:  # pragma: no cover - data absent
        pytest.skip(f"MNIST not available: {exc}")


@pytest.mark.slow
def test_small_quadratic_field_model_trains_on_mnist():
    """784-32-10 quadratic network (deg(g) = 4), fixed point f = 8, l = 4, exact over GF(2^200 - 75).

    200 SGD steps of batch 64 on 3000 training images, update w <- w - Q(eta/b g 2^-(G-f)) (eq. 7),
    eta = 0.05: test accuracy on 2000 test images must exceed 0.75 (the same network trained in
    float64 reaches about 0.86; chance is 0.10).
    """
    ds = _mnist()
    model = FieldPolyMLP((784, 32, 10), DRESFL_PRIME_200, data_bits=4, weight_bits=8, max_inner=1024)
    params = model.init_params(0)
    opt = FieldSGD(model, 0.05, np.random.default_rng(99))
    rng = np.random.default_rng(1)
    x, y = ds.x_train[:3000], ds.y_train[:3000]
    acc0, _ = model.evaluate(params, ds.x_test[:2000], ds.y_test[:2000])
    t0 = time.perf_counter()
    with MacMeter() as m:
        for t in range(200):
            idx = rng.integers(0, 3000, 64)
            g = model.integer_gradient(params, x[idx], y[idx])
            params = opt.step(params, g, 64, t + 1)
    acc, mse = model.evaluate(params, ds.x_test[:2000], ds.y_test[:2000])
    print(f"field MNIST: acc {acc0:.3f} -> {acc:.3f}, mse {mse:.3f}, {time.perf_counter() - t0:.1f} s, {m.macs} MACs")
    assert acc > 0.75
    assert all(np.asarray(v).dtype == np.int64 for v in params.values())


@pytest.mark.parametrize("weight_bits", [None, 8])
def test_field_model_keeps_model_conventions(weight_bits):
    """W2's conformance check (names, shapes, metering, free evaluation, additivity over rows)."""
    from fednet.learning.model import check_model

    sizes = (12, 5, 4, 3)
    model = FieldPolyMLP(sizes, DRESFL_PRIME_200, weight_bits=weight_bits, init_scale=1.0 if weight_bits else 3.0)
    x, y = _data(sizes, 8)
    p = check_model(model, x, y, rtol=1e-9)
    assert all(np.asarray(v).dtype == np.int64 for v in p.values())
    assert all(v.dtype == np.int64 for v in model.zeros().values())
