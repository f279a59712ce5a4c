"""The batched Monte Carlo driver agrees with a plain per-simulation implementation."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.codes.approx_gc import estimator_second_moment, example_weights
from fednet.learning.approx_gc_batch import AGCSetting, prepare_pixels, simulate_batch
from fednet.learning.datasets import load_dataset
from fednet.learning.models import logistic_example_gradients, logistic_gradient, one_hot


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return prepare_pixels(ds.x_train, np.float64), ds.y_train, prepare_pixels(ds.x_test, np.float64), ds.y_test


@pytest.mark.parametrize("setting", [AGCSetting("single c=.5 d=3", "single-class", 0.5, 3),
                                     AGCSetting("dirichlet", "dirichlet", 0.25, 2, alpha=0.1, placement="subset"),
                                     AGCSetting("iid", "iid")])
def test_batched_dual_form_matches_reference(digits, setting) -> None:
    """Replay the batch's draws with the plain eq. (10)-(11) pipeline in float64: the final
    models agree within 1e-3 relative (float32 batch), the accuracies within one test image,
    and the exact second moments within 1e-3 relative."""
    xtr, ytr, xte, yte = digits
    p, rounds = 0.4, 6
    res = simulate_batch(xtr, ytr, xte, yte, setting, p=p, n_sims=6, rounds=rounds, k=12, n_test=50,
                         chunk=4, seed=3, keep_draws=True)
    ex = res.extra
    assert res.accuracy.shape == (6, rounds + 1) and res.second_moment.shape == (6, rounds)
    for s in range(6):
        x = xtr[ex["idx"][s]]
        y = one_hot(np.repeat(np.arange(10), 12), 10)
        a = ex["holders"][s]
        w = example_weights(a, p)[0]
        beta = np.zeros((x.shape[1], 10))
        for t in range(rounds):
            g = logistic_example_gradients(x, y, beta).reshape(x.shape[0], -1)
            m2 = estimator_second_moment(a[None], (g @ g.T)[None], p)[0] / x.shape[0] ** 2
            assert res.second_moment[s, t] == pytest.approx(m2, rel=1e-3)
            g_hat = np.zeros_like(beta)
            for i in np.flatnonzero(ex["responding"][t, s]):  # eq. (11): sum of the f_i
                held = a[i]
                g_hat += logistic_gradient(x[held], y[held], beta, weights=w[held])  # eq. (10)
            beta = beta - 0.1 * 0.97**t * g_hat / x.shape[0]
        np.testing.assert_allclose(ex["beta"][s], beta, rtol=1e-3, atol=1e-4)
        acc = np.mean(np.argmax(xte[ex["test_idx"][s]] @ beta, 1) == yte[ex["test_idx"][s]])
        assert abs(res.accuracy[s, rounds] - acc) <= 1 / 50 + 1e-12


def test_batched_reproducible_and_paired(digits) -> None:
    xtr, ytr, xte, yte = digits
    kw = dict(p=0.5, n_sims=8, rounds=3, k=10, n_test=40, chunk=8, seed=5)
    a = simulate_batch(xtr, ytr, xte, yte, AGCSetting("s", "single-class", 0.5, 3), **kw)
    b = simulate_batch(xtr, ytr, xte, yte, AGCSetting("s", "single-class", 0.5, 3), **kw)
    c = simulate_batch(xtr, ytr, xte, yte, AGCSetting("base", "single-class"), **kw)
    np.testing.assert_array_equal(a.accuracy, b.accuracy)
    np.testing.assert_array_equal(a.responders, c.responders)  # same straggler draws
    assert np.all(c.shared_examples == 0) and np.all(a.shared_examples > 0)
    # E||g_hat||^2 >= ||g||^2 > 0 and the sharing lowers it in the single-class setting at t = 0
    assert np.all(a.second_moment > 0)
    assert a.second_moment[:, 0].mean() < c.second_moment[:, 0].mean()


def test_batched_errors(digits) -> None:
    xtr, ytr, xte, yte = digits
    with pytest.raises(ValueError, match="p must"):
        simulate_batch(xtr, ytr, xte, yte, AGCSetting("x", "iid"), p=1.0, n_sims=1)
    with pytest.raises(ValueError, match="d must be at most"):
        simulate_batch(xtr, ytr, xte, yte, AGCSetting("x", "iid", 0.5, 10), p=0.5, n_sims=1)
    with pytest.raises(ValueError, match="alpha"):
        AGCSetting("x", "dirichlet")
