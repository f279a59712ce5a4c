"""Small tasks and networks shared by the protocol tests (plain functions, imported by test modules)."""

from __future__ import annotations

import numpy as np

from fednet.learning.task import LearningTask
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star


def make_task(D=8, n=20, d=6, c=3, seed=0, lr=1.0) -> LearningTask:
    """D devices with n points each: features uniform in [-0.5, 0.5)^d, random one-hot labels over c classes."""
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.5, 0.5, (n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.uniform(-0.5, 0.5, (40, d)), rng.integers(0, c, 40), learning_rate=lr)


def make_sim(D=8, seed=1, deterministic=False, loss=0.0) -> Simulation:
    """LTE star of D devices at 1e6 MAC/s (deterministic compute on request)."""
    g = lte_star(D, device_mac_rates=[1e6] * D, loss=loss)
    return Simulation(g, seed, device_compute=Deterministic() if deterministic else None)
