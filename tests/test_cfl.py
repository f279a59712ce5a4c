"""Tests of the CFL baseline of Prakash et al. on the engine (as read in protocols/cfl.py).

The deadline planning and parity math are tested in tests/test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.learning.task import LearningTask
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.protocols.cfl import CFL, CFLConfig
from fednet.topologies.lte import lte_star


def make_task(D=6, n=100, d=12, c=3, seed=0):
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.3, 0.3, (n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.uniform(-0.3, 0.3, (30, d)), rng.integers(0, c, 30), learning_rate=1.0)


def test_epochs_last_the_deadline_and_loaded_devices_return():
    D = 6
    g = lte_star(D, device_mac_rates=[1e6, 1e6, 5e5, 5e5, 2e5, 2e5], loss=0.0)
    sim = Simulation(g, 0, device_compute=Deterministic())
    p = CFL(sim, make_task(D), dict(redundancy=0.3))
    rows = p.run(4)
    # deterministic and lossless: a device either returns its load surely or not at all
    assert all(pr in (0.0, 1.0) or l == 0 for pr, l in zip(p.plan.return_probabilities, p.plan.loads))
    times = [r["time_s"] for r in rows]
    np.testing.assert_allclose(np.diff(times), p.plan.t_star, rtol=1e-9)
    returning = {i for i, (l, pr) in enumerate(zip(p.plan.loads, p.plan.return_probabilities)) if l > 0 and pr == 1.0}
    for r in rows[1:]:
        assert set(map(int, r["used"].split())) == returning
        assert r["returned"] == len(returning) and r["deadline_s"] == p.plan.t_star
    # parity upload once: c_p (d + c) float32 per device
    d, c = p.task.d, p.task.c
    assert rows[0]["bits_up"] == D * p.plan.c_p * (d + c) * 32


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
