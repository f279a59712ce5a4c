"""Torch models behind the Model interface: MNIST training, MACs from the layers run, determinism, gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednet.algebra.meter import MacMeter
from fednet.learning.datasets import load_dataset
from fednet.learning.model import SGD, ConstantSchedule, RidgeModel, flatten
from fednet.learning.torch_models import MLPModel, PolynomialLayer, Square, TorchModel, count_macs, mlp

torch.set_num_threads(1)


def test_mlp_trains_on_mnist_with_macs_from_the_layers_run(data_dir) -> None:
    """784-64-64-10 ReLU MLP (the DReS-FL baselines' shape), 4000 MNIST images, 600 SGD steps of 64 rows.

    Measured (seeds 0-4, 2000 test images): 0.899-0.906 test accuracy; the threshold is 0.88.
    """
    ds = load_dataset("mnist", data_dir)
    rng = np.random.default_rng(0)
    pool = rng.choice(ds.x_train.shape[0], 4000, replace=False)
    x, y = ds.x_train[pool], ds.y_train[pool]
    xt, yt = ds.x_test[:2000], ds.y_test[:2000]
    model = MLPModel((784, 64, 64, 10), "relu")
    opt = SGD(ConstantSchedule(0.2))
    params = model.init_params(0)
    acc0, loss0 = model.evaluate(params, xt, yt)
    assert acc0 < 0.3 and loss0 > 2.0
    b, steps = 64, 600
    with MacMeter() as meter:
        for step in range(1, steps + 1):
            rows = rng.choice(x.shape[0], b, replace=False)
            params = opt.step(params, model.gradient(params, x[rows], y[rows]), b, step)
    acc, loss = model.evaluate(params, xt, yt)
    assert acc > 0.88 and loss < 0.45, (acc, loss)
    # per layer, forward + weight gradient (+ input gradient past the first layer): b*in*out each
    per_layer = model.layer_macs("gradient", b)
    assert per_layer == {"0": 2 * b * 784 * 64, "2": 3 * b * 64 * 64, "4": 3 * b * 64 * 10,
                         "total": 2 * b * 784 * 64 + 3 * b * 64 * 64 + 3 * b * 64 * 10}
    assert per_layer == model.analytic_macs(b, "gradient")
    # the run's total: the gradients plus SGD's two MACs per parameter
    assert meter.macs == steps * (per_layer["total"] + 2 * model.n_params)
    assert model.n_params == 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10


@pytest.mark.parametrize("kind", ["forward", "loss", "gradient", "gradient_with_input", "backward",
                                  "backward_params"])
@pytest.mark.parametrize("cache", [True, False])
def test_metered_calls_match_the_analytic_mlp_counts(kind: str, cache: bool) -> None:
    model = MLPModel((20, 8, 6, 3), "tanh", cache_macs=cache, dtype=torch.float64)
    p = model.init_params(1)
    rng = np.random.default_rng(2)
    for b in (5, 9, 5):  # a new shape is measured, a repeated one reuses (or re-measures) its count
        x, y = rng.normal(size=(b, 20)), rng.integers(0, 3, b)
        with MacMeter() as meter:
            if kind == "forward":
                model.forward(p, x)
            elif kind == "loss":
                model.loss(p, x, y)
            elif kind == "gradient":
                model.gradient(p, x, y)
            elif kind == "gradient_with_input":
                model.gradient_with_input(p, x, y)
            else:
                gp, gx = model.backward(p, x, rng.normal(size=(b, 3)), input_grad=kind == "backward")
                assert (gx is None) == (kind == "backward_params")
        expected = model.analytic_macs(b, kind)
        assert meter.macs == expected["total"]
        assert model.layer_macs(kind, b) == expected
    with MacMeter() as meter:
        model.evaluate(p, x, y)
        model.predict(p, x)
    assert meter.macs == 0


def test_any_user_module_counts_convolutions_from_the_shapes_run() -> None:
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model = TorchModel(cnn, 64, 5, input_shape=(1, 8, 8))
    p = model.init_params(0)
    x = np.random.default_rng(0).random((7, 64))
    with MacMeter() as meter:
        out = model.forward(p, x)
    conv, lin = 7 * 4 * 6 * 6 * 1 * 9, 7 * 144 * 5
    assert out.shape == (7, 5) and meter.macs == conv + lin
    assert model.layer_macs("forward", 7) == {"0": conv, "3": lin, "total": conv + lin}
    with MacMeter() as meter:
        g = model.gradient(p, x, np.arange(7) % 5)
    assert set(g) == {"0.weight", "0.bias", "3.weight", "3.bias"} and g["0.weight"].shape == (4, 1, 3, 3)
    # forward, conv weight gradient (no input gradient at the first layer), linear weight + input gradients
    assert meter.macs == 2 * conv + 3 * lin


def test_init_params_deterministic_under_a_seed_and_leaves_torch_rng_alone() -> None:
    model = MLPModel((10, 7, 4))
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b = model.init_params(5), model.init_params(5)
    assert torch.equal(torch.rand(3), before)  # global torch state untouched
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = model.init_params(6)
    assert not np.array_equal(flatten(a), flatten(c))
    d1 = model.init_params(np.random.default_rng(9))
    d2 = model.init_params(np.random.default_rng(9))
    assert np.array_equal(flatten(d1), flatten(d2))
    assert list(a) == ["0.weight", "0.bias", "2.weight", "2.bias"] and a["0.weight"].dtype == np.float32
    # torch's default Linear init: U(-1/sqrt(in), 1/sqrt(in))
    assert np.abs(a["0.weight"]).max() <= 1 / np.sqrt(10)


def test_linear_mse_torch_model_equals_the_ridge_model() -> None:
    """A bias-free Linear with the MSE loss is the ridge model: same gradient, loss, evaluation."""
    d, c, lam = 6, 3, 0.01
    model = TorchModel(nn.Linear(d, c, bias=False), d, c, loss="mse", weight_decay=lam, dtype=torch.float64)
    ridge = RidgeModel(d, c, lam)
    rng = np.random.default_rng(3)
    theta = rng.normal(size=(d, c))
    x, y = rng.normal(size=(11, d)), rng.integers(0, c, 11)
    p = {"weight": theta.T.copy()}
    np.testing.assert_allclose(model.gradient(p, x, y)["weight"].T, ridge.gradient(theta, x, y)["theta"], rtol=1e-12)
    assert model.loss(p, x, y) == pytest.approx(ridge.loss(theta, x, y), rel=1e-12)
    acc_t, loss_t = model.evaluate(p, x, y)
    acc_r, loss_r = ridge.evaluate(theta, x, y)
    assert acc_t == acc_r and loss_t == pytest.approx(loss_r, rel=1e-12)
    np.testing.assert_array_equal(model.predict(p, x), ridge.predict(theta, x))


def test_backward_and_input_gradient_agree_with_the_loss_gradient() -> None:
    model = MLPModel((5, 4, 3), "quadratic", dtype=torch.float64)
    assert isinstance(model.module[1], Square)
    p = model.init_params(0)
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(6, 5)), rng.integers(0, 3, 6)
    out = model.forward(p, x)
    e = np.exp(out - out.max(axis=1, keepdims=True))
    d_out = e / e.sum(axis=1, keepdims=True) - np.eye(3)[y]  # d(sum CE)/d scores
    gp, gx = model.backward(p, x, d_out)
    g2, gx2 = model.gradient_with_input(p, x, y)
    g3 = model.gradient(p, x, y)
    for k in p:
        np.testing.assert_allclose(gp[k], g2[k], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(g2[k], g3[k])
    np.testing.assert_allclose(gx, gx2, rtol=1e-10, atol=1e-12)
    # central finite differences of the summed loss in one input coordinate
    h = 1e-6
    xp, xm = x.copy(), x.copy()
    xp[2, 1] += h
    xm[2, 1] -= h
    fd = (model.loss(p, xp, y) - model.loss(p, xm, y)) * 6 / (2 * h)
    assert gx2[2, 1] == pytest.approx(fd, rel=1e-6)


def test_count_macs_and_argument_errors() -> None:
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    out, macs, _ = count_macs(lambda: a @ b)
    assert macs == 60 and out.shape == (3, 5)
    with pytest.raises(ValueError, match="activation"):
        mlp((3, 2), "swish")
    with pytest.raises(ValueError, match="layer_sizes"):
        mlp((3,))
    with pytest.raises(ValueError, match="loss"):
        TorchModel(nn.Linear(2, 2), 2, 2, loss="hinge")
    with pytest.raises(ValueError, match="input_shape"):
        TorchModel(nn.Linear(2, 2), 2, 2, input_shape=(3,))
    model = MLPModel((4, 3))
    p = model.init_params(0)
    with pytest.raises(ValueError, match=r"x must have shape \(b, 4\)"):
        model.forward(p, np.zeros((2, 5)))
    with pytest.raises(ValueError, match="0.weight"):
        model.forward({"0.weight": np.zeros((2, 2)), "0.bias": np.zeros(3)}, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="labels"):
        model.gradient(p, np.zeros((2, 4)), np.array([0, 3]))


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_torch_models_keep_the_model_conventions(loss: str) -> None:
    from fednet.learning.model import check_model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 6)), rng.integers(0, 3, 10)
    check_model(MLPModel((6, 5, 3), "relu", loss=loss, dtype=torch.float64), x, y, rtol=1e-10)
    check_model(MLPModel((6, 5, 3), "quadratic", loss=loss), x, y, rtol=1e-4)
    check_model(TorchModel(PolynomialLayer(6, 3, 3), 6, 3, loss=loss, dtype=torch.float64), x, y, rtol=1e-10)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hand_written_mlp_gradient_is_bit_identical_to_autograd(dtype) -> None:
    """The fast MLP path (``fast_mlp``) returns autograd's gradients bit for bit, and charges the same MACs.

    Random depths (1-4 linear layers), widths, batches (1-80 rows, ReLU units exactly at 0 included),
    with and without biases, one-hot and label targets, ``gradient`` and ``gradient_with_input``; and
    the DReS-FL baselines' 784-64-64-10 (the BLAS kernels may differ with the sizes).
    """
    rng = np.random.default_rng(7)
    for trial in range(44):
        sizes = [784, 64, 64, 10] if trial >= 40 else [int(v) for v in rng.integers(1, 40, int(rng.integers(2, 6)))]
        bias = bool(trial % 5)
        with torch.random.fork_rng(devices=[]):
            module = mlp(sizes, "relu", bias=bias)
        fast = TorchModel(module, sizes[0], sizes[-1], dtype=dtype)
        slow = TorchModel(module, sizes[0], sizes[-1], dtype=dtype, fast_mlp=False)
        assert fast._plan is not None and slow._plan is None
        params = fast.init_params(trial)
        if trial % 3 == 0:                      # float64 parameters, converted to the model's dtype per call
            params = {k: v.astype(np.float64) for k, v in params.items()}
        for rep in range(3):
            b = 64 if trial >= 40 and rep == 0 else int(rng.integers(1, 81))
            x = rng.normal(0, 2, (b, sizes[0]))
            x[rng.random(x.shape) < 0.1] = 0.0
            labels = rng.integers(0, sizes[-1], b)
            y = np.eye(sizes[-1])[labels] if trial % 2 else labels
            for method in ("gradient", "gradient_with_input"):
                with MacMeter() as m_slow:
                    want = getattr(slow, method)(params, x, y)
                for _ in range(2):              # the first call measures its MACs through autograd
                    with MacMeter() as m_fast:
                        got = getattr(fast, method)(params, x, y)
                    assert m_fast.macs == m_slow.macs
                    want_p, got_p = (want, got) if method == "gradient" else (want[0], got[0])
                    assert list(got_p) == list(want_p)
                    assert all(_bits_equal(got_p[k], want_p[k]) for k in want_p), (trial, sizes, b, method)
                    if method == "gradient_with_input":
                        assert _bits_equal(got[1], want[1])


def test_fast_mlp_path_only_for_plain_relu_mlps_with_cross_entropy() -> None:
    """Every module, loss or input shape the hand-written path does not cover runs autograd."""
    relu = mlp((4, 3, 2), "relu")
    assert TorchModel(relu, 4, 2)._plan == [("0.weight", "0.bias"), ("2.weight", "2.bias")]
    assert TorchModel(relu, 4, 2, loss="mse")._plan is None
    assert TorchModel(mlp((4, 3, 2), "tanh"), 4, 2)._plan is None
    assert TorchModel(mlp((4, 3, 2), "quadratic"), 4, 2)._plan is None
    assert TorchModel(nn.Sequential(nn.Linear(4, 3), nn.ReLU(inplace=True), nn.Linear(3, 2)), 4, 2)._plan is None
    assert TorchModel(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), 4, 3)._plan is None
    assert TorchModel(nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2)), 4, 2)._plan is None
    assert TorchModel(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), 4, 2, input_shape=(2, 2))._plan is None
    assert TorchModel(PolynomialLayer(4, 2), 4, 2)._plan is None
    hooked = mlp((4, 3, 2), "relu")
    hooked[0].register_forward_hook(lambda *a: None)
    assert TorchModel(hooked, 4, 2)._plan is None
