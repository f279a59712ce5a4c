"""Models: one-hot, metered ridge gradient (MAC count 2 b d c), logistic regression."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.learning.models import (
    accuracy,
    logistic_example_gradients,
    logistic_gradient,
    logistic_loss,
    one_hot,
    ridge_gradient,
    ridge_loss,
    ridge_step,
)


def _data(b: int = 37, d: int = 11, c: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, d))
    y = one_hot(rng.integers(0, c, b), c)
    theta = rng.normal(size=(d, c))
    return x, y, theta


def test_one_hot() -> None:
    y = one_hot(np.array([2, 0, 1]), 3)
    assert np.array_equal(y, np.eye(3)[[2, 0, 1]])
    with pytest.raises(ValueError, match="labels"):
        one_hot(np.array([3]), 3)
    with pytest.raises(ValueError, match="n_classes"):
        one_hot(np.array([0]), 0)


@pytest.mark.parametrize("b,d,c", [(1, 5, 3), (37, 11, 4), (480, 200, 10)])
def test_ridge_gradient_mac_count(b: int, d: int, c: int) -> None:
    x, y, theta = _data(b, d, c)
    with MacMeter() as meter:
        ridge_gradient(x, y, theta)
    assert meter.macs == 2 * b * d * c


def test_ridge_gradient_closed_form_and_finite_differences() -> None:
    x, y, theta = _data()
    g = ridge_gradient(x, y, theta)
    np.testing.assert_allclose(g, x.T @ x @ theta - x.T @ y, rtol=1e-12, atol=1e-12)
    # eq. (2)-(4): grad f = G / m + lam Theta; central differences, step 1e-6
    lam, m, h = 0.3, x.shape[0], 1e-6
    num = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        num[idx] = (ridge_loss(x, y, theta + e, lam) - ridge_loss(x, y, theta - e, lam)) / (2 * h)
    np.testing.assert_allclose(num, g / m + lam * theta, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ridge_gradient(x, y, theta, scale=5.0), 5.0 * g)


def test_ridge_step_eq_4_5() -> None:
    x, y, theta = _data()
    g = ridge_gradient(x, y, theta)
    with MacMeter() as meter:
        new = ridge_step(theta, g, 37, 6.0, 9e-6)
    np.testing.assert_allclose(new, theta - 6.0 * (g / 37 + 9e-6 * theta))
    assert meter.macs == 2 * theta.size
    with pytest.raises(ValueError, match="m must"):
        ridge_step(theta, g, 0, 6.0, 9e-6)


def test_ridge_gd_converges_to_normal_equations() -> None:
    x, y, _ = _data(200, 8, 3)
    lam, m = 0.1, 200
    theta = np.zeros((8, 3))
    mu = 1.0 / (np.linalg.eigvalsh(x.T @ x / m)[-1] + lam)
    for _ in range(2000):
        theta = ridge_step(theta, ridge_gradient(x, y, theta), m, mu, lam)
    exact = np.linalg.solve(x.T @ x / m + lam * np.eye(8), x.T @ y / m)
    np.testing.assert_allclose(theta, exact, atol=1e-10)


def test_shape_errors_name_arguments() -> None:
    x, y, theta = _data()
    with pytest.raises(ValueError, match="theta"):
        ridge_gradient(x, y, theta[:-1])
    with pytest.raises(ValueError, match="y has shape"):
        ridge_gradient(x, y[:-1], theta)


def test_logistic_gradient_weighted_sum_and_fd() -> None:
    x, y, beta = _data(23, 6, 5, seed=2)
    w = np.random.default_rng(3).uniform(0.5, 2.0, 23)
    per = logistic_example_gradients(x, y, beta)
    with MacMeter() as meter:
        f = logistic_gradient(x, y, beta, weights=w)
    np.testing.assert_allclose(f, np.einsum("j,jdc->dc", w, per), rtol=1e-12, atol=1e-12)
    assert meter.macs == 2 * 23 * 6 * 5 + 23 * 5
    # finite differences of the summed cross-entropy (= b * mean loss), step 1e-6
    g = logistic_gradient(x, y, beta)
    h, num = 1e-6, np.zeros_like(beta)
    for idx in np.ndindex(beta.shape):
        e = np.zeros_like(beta)
        e[idx] = h
        num[idx] = 23 * (logistic_loss(x, y, beta + e) - logistic_loss(x, y, beta - e)) / (2 * h)
    np.testing.assert_allclose(num, g, rtol=1e-6, atol=1e-7)


def test_accuracy() -> None:
    x = np.eye(3)
    theta = np.eye(3)
    assert accuracy(x, np.array([0, 1, 2]), theta) == 1.0
    assert accuracy(x, np.array([0, 2, 1]), theta) == pytest.approx(1 / 3)
