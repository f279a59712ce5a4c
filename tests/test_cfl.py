"""Tests of the CFL baseline of Prakash et al. (as read in protocols/cfl.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.learning.task import LearningTask
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.protocols.cfl import CFL, CFLConfig, optimise_deadline, parity_gram, return_probability
from fednet.topologies.lte import lte_star

PRM = dict(down_s=0.05, up_s=0.1, p_down=0.1, p_up=0.2, seconds_per_point=0.01, setup_fraction=0.5)


def make_task(D=6, n=100, d=12, c=3, seed=0):
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.3, 0.3, (n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.uniform(-0.3, 0.3, (30, d)), rng.integers(0, c, 30), learning_rate=1.0)


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


def test_parity_gram_is_unbiased():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((50, 4))
    AtA = A.T @ A
    for c_p in (3, 20):        # fewer and more parity rows than dimensions
        mean = np.mean([parity_gram(AtA, c_p, rng) for _ in range(4000)], axis=0)
        assert np.abs(mean - AtA).max() < 0.1 * np.abs(AtA).max()


def test_epochs_last_the_deadline_and_loaded_devices_return():
    D = 6
    g = lte_star(D, device_mac_rates=[1e6, 1e6, 5e5, 5e5, 2e5, 2e5], loss=0.0)
    sim = Simulation(g, 0, device_compute=Deterministic())
    p = CFL(sim, make_task(D), dict(redundancy=0.3))
    rows = p.run(4)
    # deterministic and lossless: a device either returns its load surely or not at all
    assert all(pr in (0.0, 1.0) or l == 0 for pr, l in zip(p.return_probabilities, p.loads))
    times = [r["time_s"] for r in rows]
    np.testing.assert_allclose(np.diff(times), p.t_star, rtol=1e-9)
    returning = {i for i, (l, pr) in enumerate(zip(p.loads, p.return_probabilities)) if l > 0 and pr == 1.0}
    for r in rows[1:]:
        assert set(map(int, r["used"].split())) == returning
        assert r["returned"] == len(returning) and r["deadline_s"] == p.t_star
    # parity upload once: c_p (d + c) float32 per device
    d, c = p.task.d, p.task.c
    assert rows[0]["bits_up"] == D * p.c_p * (d + c) * 32


def test_cfl_learns_on_easy_data():
    D = 4
    rng = np.random.default_rng(2)
    theta_true = rng.standard_normal((10, 3))
    X = [rng.standard_normal((80, 10)) for _ in range(D)]
    Y = [np.eye(3)[np.argmax(x @ theta_true, axis=1)] for x in X]
    xt = rng.standard_normal((200, 10))
    task = LearningTask(X, Y, xt, np.argmax(xt @ theta_true, axis=1), learning_rate=0.5)
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), 3)
    rows = CFL(sim, task, dict(redundancy=0.5)).run(60)
    assert rows[-1]["accuracy"] > 0.8


def test_config_validation():
    with pytest.raises(ValueError):
        CFLConfig(redundancy=1.0)
    with pytest.raises(ValueError):
        CFLConfig(redundancy=0.1, deadline=3)
