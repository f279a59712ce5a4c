"""Split (vertical) models: gradients through the split equal one monolithic network's, MACs, training on MNIST."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednet.algebra.meter import MacMeter
from fednet.learning.datasets import load_dataset
from fednet.learning.model import SGD, ConstantSchedule, RidgeModel, flatten
from fednet.learning.partitions import vertical_split
from fednet.learning.split_model import SplitModel
from fednet.learning.torch_models import MLPModel, PolynomialLayer, TorchModel

torch.set_num_threads(1)


def _split_model(N=3, p=10, e=4, degree=2, c=3):
    split = vertical_split(p, N)
    bottoms = [TorchModel(PolynomialLayer(s, e, degree), s, e, dtype=torch.float64) for s in split.sizes]
    top = MLPModel((e, 6, c), "relu", dtype=torch.float64)
    return SplitModel(bottoms, top, split), split


def test_split_gradient_equals_the_monolithic_network_and_macs_add_up() -> None:
    N, p, e, D, c, b = 3, 10, 4, 2, 3, 7
    model, split = _split_model(N, p, e, D, c)
    params = model.init_params(0)
    assert list(params)[0] == "bottom0/powers.0.weight" and list(params)[-1] == "top/2.bias"
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(b, p)), rng.integers(0, c, b)
    with MacMeter() as meter:
        g = model.gradient(params, x, y)
    # bottoms: D products forward + D weight gradients; scaling of H and dL/dH; the top's gradient with input
    top_macs = model.top.analytic_macs(b, "gradient_with_input")["total"]
    assert meter.macs == sum(2 * D * b * s * e for s in split.sizes) + 2 * b * e + top_macs
    # the same function as one torch graph, differentiated by autograd
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    xt = torch.tensor(x)
    H = 0
    for n, blk in enumerate(split.blocks):
        xn = xt[:, torch.tensor(blk)]
        H = H + xn @ t[f"bottom{n}/powers.0.weight"].T + (xn * xn) @ t[f"bottom{n}/powers.1.weight"].T
    H = H / N
    z = torch.relu(H @ t["top/0.weight"].T + t["top/0.bias"]) @ t["top/2.weight"].T + t["top/2.bias"]
    nn.functional.cross_entropy(z, torch.as_tensor(y), reduction="sum").backward()
    for k in params:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.forward(params, x), z.detach().numpy(), rtol=1e-12)
    with MacMeter() as meter:
        model.evaluate(params, x, y)
        model.predict(params, x)
    assert meter.macs == 0


def test_split_parts_and_errors() -> None:
    model, split = _split_model()
    params = model.init_params(3)
    again = model.init_params(3)
    assert np.array_equal(flatten(params), flatten(again))
    assert not np.array_equal(flatten(params), flatten(model.init_params(4)))
    assert set(model.bottom_params(params, 1)) == {"powers.0.weight", "powers.1.weight"}
    assert model.top_params(params)["0.weight"].shape == (6, 4)
    # a ridge (linear) bottom works too
    SplitModel([RidgeModel(s, 4) for s in split.sizes], model.top, split)
    with pytest.raises(ValueError, match="client 1 holds 3"):
        SplitModel([RidgeModel(4, 4), RidgeModel(4, 4), RidgeModel(3, 4)], model.top, split)
    with pytest.raises(ValueError, match="bottoms lists 2"):
        SplitModel([RidgeModel(4, 4)] * 2, model.top, split)
    with pytest.raises(ValueError, match="aggregate"):
        SplitModel(model.bottoms, model.top, split, aggregate="max")


def test_vertical_split_model_trains_on_mnist(data_dir) -> None:
    """7 clients hold 4 image columns each, 1-term PN bottoms to e = 32 (FedVS, eq. 1), summed, a 32-64-10 ReLU top.

    Measured: 0.8495 test accuracy (2000 test images) after 300 steps of 64 rows, lr 0.1; threshold 0.8.
    """
    ds = load_dataset("mnist", data_dir)
    rng = np.random.default_rng(0)
    pool = rng.choice(ds.x_train.shape[0], 4000, replace=False)
    x, y = ds.x_train[pool], ds.y_train[pool]
    split = vertical_split(784, 7, by="columns", image_shape=(28, 28))
    model = SplitModel([TorchModel(PolynomialLayer(s, 32, 1), s, 32) for s in split.sizes],
                       MLPModel((32, 64, 10)), split, aggregate="sum")
    opt = SGD(ConstantSchedule(0.1))
    params = model.init_params(0)
    acc0, _ = model.evaluate(params, ds.x_test[:2000], ds.y_test[:2000])
    for step in range(1, 301):
        rows = rng.choice(x.shape[0], 64, replace=False)
        params = opt.step(params, model.gradient(params, x[rows], y[rows]), 64, step)
    acc, loss = model.evaluate(params, ds.x_test[:2000], ds.y_test[:2000])
    assert acc0 < 0.3 and acc > 0.8, (acc0, acc, loss)


def test_split_model_keeps_the_model_conventions() -> None:
    from fednet.learning.model import check_model

    model, _ = _split_model()
    rng = np.random.default_rng(0)
    check_model(model, rng.normal(size=(8, 10)), rng.integers(0, 3, 8), rtol=1e-10)
