"""Random-Fourier RBF features and the stability of the paper's gradient descent."""

from __future__ import annotations

from pathlib import Path

import dataclasses

import numpy as np
import pytest
from scipy.sparse.linalg import eigsh

from fednet.learning.datasets import load_dataset
from fednet.learning.features import (
    DIGITS_RBF_GAMMA,
    PAPER_RBF_GAMMA,
    default_gamma,
    rbf_features,
)
from fednet.learning.models import accuracy, one_hot, ridge_gradient, ridge_step

MU, LAM = 6.0, 9e-6


def _lam_max(z: np.ndarray) -> float:
    """Largest eigenvalue of z^T z / rows (Lanczos, tolerance 1e-8)."""
    return float(eigsh(z.T @ z / z.shape[0], k=1, which="LA", tol=1e-8)[0][0])


def test_digits_features_shape_and_seed() -> None:
    ds = load_dataset("digits")
    a = rbf_features(ds, n_components=300, seed=4)
    b = rbf_features(ds, n_components=300, seed=4)
    c = rbf_features(ds, n_components=300, seed=5)
    assert a.x_train.shape == (1347, 300) and a.x_test.shape == (450, 300)
    assert a.gamma == DIGITS_RBF_GAMMA
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    # random Fourier features approximate the kernel: <z(x), z(x')> ~ exp(-gamma ||x - x'||^2);
    # with 2000 components the error is O(1/sqrt(2000)) ~ 0.03: allow 0.1
    f = rbf_features(ds, seed=0)
    x = ds.x_train[:50]
    k = np.exp(-DIGITS_RBF_GAMMA * ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    assert np.max(np.abs(f.x_train[:50] @ f.x_train[:50].T - k)) < 0.1


def test_digits_paper_schedule_stable_and_accurate() -> None:
    ds = load_dataset("digits")
    f = rbf_features(ds)
    m = f.x_train.shape[0]
    lam_max = _lam_max(f.x_train)
    assert MU * lam_max < 2.0  # GD of eqs. (4)-(5) stable
    y = one_hot(ds.y_train, 10)
    theta = np.zeros((f.x_train.shape[1], 10))
    for _ in range(40):
        theta = ridge_step(theta, ridge_gradient(f.x_train, y, theta), m, MU, LAM)
    assert accuracy(f.x_test, ds.y_test, theta) >= 0.97  # measured 98 % after ~30 epochs


def test_mnist_gamma_stable(data_dir: Path) -> None:
    ds = load_dataset("mnist", data_dir)
    # the sampler's frequencies depend only on the input dimension and the seed, so 8000 random
    # training rows give an estimate of lambda_max(X^T X / m) (measured 0.160 on all 60000)
    rows = np.random.default_rng(0).choice(60000, 8000, replace=False)
    sub = dataclasses.replace(ds, x_train=ds.x_train[rows], y_train=ds.y_train[rows],
                              x_test=ds.x_test[:10], y_test=ds.y_test[:10])
    f = rbf_features(sub)
    assert f.gamma == PAPER_RBF_GAMMA and f.x_train.shape == (8000, 2000)
    lam_max = _lam_max(f.x_train)
    assert 0.13 < lam_max < 0.19 and MU * lam_max < 2.0


def test_default_gamma_and_errors() -> None:
    assert default_gamma("mnist") == default_gamma("fashion-mnist") == PAPER_RBF_GAMMA
    with pytest.raises(ValueError, match="dataset_name"):
        default_gamma("cifar")
    ds = load_dataset("digits")
    with pytest.raises(ValueError, match="gamma"):
        rbf_features(ds, gamma=-1.0)
    with pytest.raises(ValueError, match="n_components"):
        rbf_features(ds, n_components=0)
