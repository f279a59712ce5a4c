"""CFL's math (fednet.codes.parity; Prakash et al., as outlined in shared/references.md)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.codes.parity import (
    load_weights,
    optimise_deadline,
    parity_gram,
    return_probability,
    weighted_gram,
)

PRM = dict(down_s=0.05, up_s=0.1, p_down=0.1, p_up=0.2, seconds_per_point=0.01, setup_fraction=0.5)


def test_return_probability_matches_monte_carlo():
    rng = np.random.default_rng(0)
    n = 200_000
    load = 40
    tries_d = rng.geometric(1 - PRM["p_down"], n)
    tries_u = rng.geometric(1 - PRM["p_up"], n)
    base = PRM["seconds_per_point"] * load
    T = tries_d * PRM["down_s"] + tries_u * PRM["up_s"] + base + rng.exponential(0.5 * base, n)
    for t in (0.5, 0.7, 1.0, 1.5):
        exact = return_probability(t, np.array([load]), **PRM)[0]
        assert abs(exact - np.mean(T <= t)) < 4 * np.sqrt(0.25 / n)   # 4 sd of a proportion
    assert return_probability(0.0, np.array([0]), **PRM)[0] == 1.0


def test_return_probability_deterministic_lossless_is_a_step():
    prm = dict(PRM, p_down=0.0, p_up=0.0, setup_fraction=0.0)
    loads = np.array([0, 10, 20, 30])
    # T(l) = 0.05 + 0.1 + 0.01 l: 0.25 s for 10 points, 0.35 s for 20, 0.45 s for 30
    np.testing.assert_array_equal(return_probability(0.3, loads, **prm), [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(return_probability(0.45, loads, **prm), [1.0, 1.0, 1.0, 1.0])
    # one loss-free try each way, then a geometric number of uploads: P(one try) = 1 - p_up
    p1 = return_probability(0.3, np.array([10]), **dict(prm, p_up=0.2))[0]
    assert p1 == pytest.approx(0.8, abs=1e-15)


def test_deadline_reaches_target_and_is_smallest():
    n_points = [100, 100, 50]
    params = [PRM, dict(PRM, seconds_per_point=0.02), dict(PRM, seconds_per_point=0.05)]
    target = 150.0
    t, loads, probs = optimise_deadline(n_points, params, target)
    assert sum(l * p for l, p in zip(loads, probs)) >= target
    # just below t* the best loads return less than the target
    cands = [np.arange(n + 1) for n in n_points]
    total = sum((c * return_probability(t * 0.99, c, **p)).max() for c, p in zip(cands, params))
    assert total < target * 1.001
    with pytest.raises(ValueError, match="exceeds"):
        optimise_deadline(n_points, params, 1000)


def test_load_weights_and_weighted_gram():
    w = load_weights(5, np.array([1, 3]), 0.75)
    np.testing.assert_array_equal(w, [1.0, 0.5, 1.0, 0.5, 1.0])
    assert load_weights(3, np.array([0]), 1.5)[0] == 0.0          # clipped, never NaN
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    A = np.hstack([X, Y]) * w[:, None]
    np.testing.assert_allclose(weighted_gram(X, Y, w), sum(np.outer(a, a) for a in A), rtol=1e-12)


def test_parity_gram_is_unbiased():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((50, 4))
    AtA = A.T @ A
    for c_p in (3, 20):        # fewer and more parity rows than dimensions
        mean = np.mean([parity_gram(AtA, c_p, rng) for _ in range(4000)], axis=0)
        assert np.abs(mean - AtA).max() < 0.1 * np.abs(AtA).max()


def test_parity_gram_has_the_spread_of_an_explicit_gaussian_encoding():
    """Var of a diagonal entry of (G A)^T (G A) is 2 (A^T A)_ii^2 / c_p for G with N(0, 1/c_p) entries."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((30, 3))
    AtA = A.T @ A
    for c_p in (2, 10):
        draws = np.array([parity_gram(AtA, c_p, rng)[0, 0] for _ in range(6000)])
        expected = 2 * AtA[0, 0] ** 2 / c_p
        assert draws.var() == pytest.approx(expected, rel=0.1)
        G = rng.standard_normal((2000, c_p, 30)) / np.sqrt(c_p)
        explicit = ((G @ A[:, :1]) ** 2).sum(axis=(1, 2))
        assert explicit.var() == pytest.approx(expected, rel=0.15)
