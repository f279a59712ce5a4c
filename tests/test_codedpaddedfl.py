"""Tests of CodedPaddedFL on the engine (paper Sec. V) and device grouping (Sec. V-E).

The math of eqs. (6)-(12) is tested in tests/test_padded.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.learning.task import LearningTask
from fednet.protocol.modes import Shape
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.protocols.codedpaddedfl import CodedPaddedFL, CodedPaddedFLConfig
from fednet.topologies.groups import alpha_group_grid, equal_groups, group_sizes
from fednet.topologies.lte import lte_star


def make_task(D=6, n=20, d=8, c=3, seed=0, lr=1.0):
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.2, 0.2, (n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.uniform(-0.2, 0.2, (40, d)), rng.integers(0, c, 40), learning_rate=lr)


def make_sim(D=6, seed=1, loss=0.0, deterministic=False, rates=1e6):
    g = lte_star(D, device_mac_rates=[rates] * D, loss=loss)
    return Simulation(g, seed, device_compute=Deterministic() if deterministic else None)


# ----------------------------------------------------------------------------- grouping
def test_group_sizes_as_equal_as_possible():
    assert group_sizes(25, 4) == [7, 6, 6, 6]
    assert group_sizes(120, 8) == [15] * 8
    groups = equal_groups(10, 3)
    assert [len(g) for g in groups] == [4, 3, 3]
    assert sorted(itertools.chain(*groups)) == list(range(10))
    with pytest.raises(ValueError, match="n_groups must be"):
        group_sizes(5, 6)
    grid = alpha_group_grid(6)
    assert (6, 1) in grid and (3, 2) in grid and (4, 2) not in grid and (1, 6) in grid
    assert all(6 % N == 0 for _, N in grid)


# ----------------------------------------------------------------------------- on the engine
@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap", "upload_once"])
def test_sharing_phase_duration_matches_hand_computation(schedule):
    D, alpha, d, c = 6, 4, 8, 3
    task = make_task(D=D, d=d, c=c)
    sim = make_sim(D, deterministic=True)
    p = CodedPaddedFL(sim, task, dict(alpha=alpha, sharing_schedule=schedule, share_element_bits=48,
                                      mode="timing"))
    p.run(0)
    n = d * (d + 1) // 2 + d * c
    up = n * 48 * 1.1 / 5e6
    down = n * 48 * 1.1 / 10e6
    sharing = {"relay_steps": (alpha - 1) * (up + down),
               "relay_asap": (alpha - 1) * up + down,        # downlinks keep up with the uplinks
               "upload_once": up + (alpha - 1) * down}[schedule]
    encode_macs = alpha * n                                 # alpha terms over the packed shares
    server = D * encode_macs / 8.24e12
    assert p.trace[0]["time_s"] == pytest.approx(sharing + encode_macs / 1e6 + server, rel=1e-12)
    assert p.trace[0]["device_macs"] == D * encode_macs


def test_timing_and_full_mode_give_the_same_times_and_exact_updates():
    D = 6
    rows = {}
    for mode in ("full", "timing"):
        sim = make_sim(D, seed=7)
        p = CodedPaddedFL(sim, make_task(D=D), dict(alpha=3, groups=2, mode=mode))
        rows[mode] = p.run(6)
        if mode == "full":
            assert 0 < p.max_decode_error <= p.decode_bound < 1e-4
            full = p
        else:       # timing mode ran no exact math: the state holds shape stand-ins, no observer columns
            assert isinstance(p.devices[0].state.C, Shape) and p.devices[0].state.C.shape == (5, 8, 3)
            assert isinstance(p.server.state.encoded_pads[0][1], Shape) and p.max_decode_error == 0.0
            assert "decode_error" not in rows[mode][1] and "decode_error" in rows["full"][1]
    assert [r["time_s"] for r in rows["full"]] == [r["time_s"] for r in rows["timing"]]
    assert [r["device_macs"] for r in rows["full"]] == [r["device_macs"] for r in rows["timing"]]
    # exact decoding: the model follows plain full-batch gradient descent (Prop. 3)
    task = full.task
    theta = np.zeros((task.d, task.c))
    for e in range(1, 7):
        G = sum(x.T @ (x @ theta - y) for x, y in zip(task.X, task.Y))
        theta = theta - task.step_size(e) * (G / task.m + task.weight_decay * theta)
    assert np.abs(full.theta - theta).max() < 1e-4
    acc_full = [r["accuracy"] for r in rows["full"]]
    assert acc_full == [r["accuracy"] for r in rows["timing"]]


def test_server_waits_for_the_fastest_per_group():
    D = 6
    sim = make_sim(D, seed=3)
    p = CodedPaddedFL(sim, make_task(D=D), dict(alpha=2, groups=2, mode="timing"))
    p.run(3)
    for row in p.trace[1:]:
        used = list(map(int, row["used"].split()))
        assert len(used) == 2 * (3 - 2 + 1)
        assert sum(u < 3 for u in used) == 2 and sum(u >= 3 for u in used) == 2


def test_config_rejects_bad_alpha_and_keys():
    with pytest.raises(ValueError, match="alpha must be at most the smallest group size \\(3"):
        CodedPaddedFL.check(CodedPaddedFLConfig(alpha=4, groups=2), 6)
    with pytest.raises(ValueError, match="groups must be at most"):
        CodedPaddedFL.check(CodedPaddedFLConfig(alpha=1, groups=7), 6)
    with pytest.raises(ValueError):
        CodedPaddedFLConfig(alpha=2, unknown=1)
    with pytest.raises(ValueError, match="f must be less than k"):
        CodedPaddedFLConfig(alpha=2, k=20, f=20)


def test_full_mode_on_digits_features_tracks_plain_gradient_descent():
    """Real data (digits, 200 RBF features, non-IID shards): every epoch decodes within the bound
    and the model follows plain full-batch GD (Prop. 3), with stragglers and losses."""
    from fednet.study.config import DataSpec, NetworkSpec, RunSpec, Study
    from fednet.study.runner import prepare_task

    study = Study(name="t", data=DataSpec(dataset="digits", n_components=200),
                  network=NetworkSpec(n_devices=6), runs=[RunSpec(protocol="conventional")])
    task = prepare_task(study)
    sim = make_sim(6, seed=5, loss=0.1)
    p = CodedPaddedFL(sim, task, dict(alpha=3, groups=2, mode="full"))
    rows = p.run(15)
    assert 0 < p.max_decode_error <= p.decode_bound
    assert all(0 <= r["decode_error"] <= r["decode_bound"] for r in rows[1:])
    theta = np.zeros((task.d, task.c))
    for e in range(1, 16):
        G = sum(x.T @ (x @ theta - y) for x, y in zip(task.X, task.Y))
        theta = theta - task.step_size(e) * (G / task.m + task.weight_decay * theta)
    assert np.abs(p.theta - theta).max() < 1e-4 * max(1.0, np.abs(theta).max())
    assert rows[-1]["accuracy"] == pytest.approx(task.evaluate(theta)[0], abs=0.01)
    assert rows[-1]["accuracy"] > 0.8


@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap", "upload_once"])
def test_the_server_never_reads_a_padded_share(schedule):
    """The server knows every pad (their seeds), so a padded share in its view would reveal X_i^T X_i:
    shares travel end-to-end encrypted on every schedule (Sec. III-B), into ``relayed`` only."""
    D, alpha = 6, 3
    sim = make_sim(D, seed=2)
    p = CodedPaddedFL(sim, make_task(D=D), dict(alpha=alpha, sharing_schedule=schedule, mode="full"))
    p.run(1)
    assert not [m for m in sim.server.view if m.kind == "share"]
    stored = [m for m in sim.server.relayed if m.kind == "share"]
    assert len(stored) == (D if schedule == "upload_once" else D * (alpha - 1))
    for dev in sim.devices:      # each device reads the alpha - 1 shares of its support
        got = sorted(m.src for m in dev.view if m.kind == "share")
        want = sorted(j for j in p.codes[0].Omega[1:, dev.index])
        assert got == (want if schedule != "upload_once" else [D] * (alpha - 1))
