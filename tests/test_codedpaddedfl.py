"""Tests of CodedPaddedFL (paper Sec. V) and device grouping (Sec. V-E)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.algebra.fixed_point import FixedPoint, prepare, prepared_from_limbs, random_ring_limbs
from fednet.algebra.meter import MacMeter
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.learning.task import LearningTask
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.protocols.codedpaddedfl import (
    CodedPaddedFL,
    CodedPaddedFLConfig,
    coded_gradient,
    decode,
    encode,
    local_statistics,
    pack_upper,
    pad,
    remove_pads,
    unpack_upper,
)
from fednet.topologies.groups import alpha_group_grid, equal_groups, group_sizes
from fednet.topologies.lte import lte_star

Q = FixedPoint(48, 24)


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


# ----------------------------------------------------------------------------- pure math
def test_pack_unpack_roundtrip():
    a = np.arange(16).reshape(4, 4)
    s = a + a.T
    np.testing.assert_array_equal(unpack_upper(pack_upper(s), 4), s)
    with pytest.raises(ValueError, match="d\\(d\\+1\\)/2"):
        unpack_upper(np.zeros(5), 4)


def one_epoch(D=5, alpha=3, d=6, c=2, seed=0, theta_scale=3.0):
    """Pads, shares, encoding and every device's coded gradient of one epoch (pure functions)."""
    rng = np.random.default_rng(seed)
    task = make_task(D=D, d=d, c=c, seed=seed)
    cfg = CodedPaddedFLConfig(alpha=alpha)
    W, out = cfg.ring_bits, Q.k + Q.f
    code = CyclicGradientCode(alpha, D, rng, a_format=Q)
    stats = [local_statistics(Q, x, y) for x, y in zip(task.X, task.Y)]
    padded = [pad(Q, W, M, G1, rng) for M, G1 in stats]
    theta = rng.uniform(-theta_scale, theta_scale, (d, c))
    eps = Q.encode(theta)
    P = []
    for i in range(D):
        sup = code.Omega[:, i]
        coef = code.B_bar[i, sup]
        Cbar, C = encode(coef, [padded[j][0] for j in sup], [padded[j][1] for j in sup], W, 24, out)
        Rbar, R = encode(coef, [padded[j][2] for j in sup], [padded[j][3] for j in sup], W, 24, out)
        sent = coded_gradient(Q, prepared_from_limbs(unpack_upper(Cbar, d)), C, eps)
        pad_part = coded_gradient(Q, prepared_from_limbs(unpack_upper(Rbar, d)), R, eps)
        P.append(remove_pads(Q, sent, pad_part))
    return task, code, stats, theta, eps, np.stack(P)


def test_decoded_gradient_equals_plain_for_every_straggler_pattern():
    """One epoch, D = 5, alpha = 3: every responder set decodes X^T(X Theta - Y) within the bound."""
    D, alpha = 5, 3
    task, code, stats, theta, eps, P = one_epoch(D, alpha)
    e = Q.decode(eps)
    parts = [Q.decode(M) @ e + Q.decode(G1) for M, G1 in stats]     # plain, same fixed-point data
    plain_fp = sum(parts)
    plain_real = sum(x.T @ (x @ e - y) for x, y in zip(task.X, task.Y))
    g_sum = sum(np.abs(p).max() for p in parts)
    e_max = 2.0**-24 * (3 + np.abs(e).sum(axis=0).max())
    for F in itertools.combinations(range(D), D - alpha + 1):
        for order in (list(F), list(reversed(F))):
            G = decode(Q, code, order, P[order])
            assert np.abs(G - plain_fp).max() <= code.error_bound(g_sum, e_max, F)
            # against the real-valued gradient: data quantisation (2^-25 per entry) adds ~1e-6
            assert np.abs(G - plain_real).max() < 1e-4


def test_pads_hide_the_shared_data():
    """Phi and Psi are uniform ring elements: two data sets give the same distribution."""
    rng = np.random.default_rng(3)
    W = CodedPaddedFLConfig(alpha=2).ring_bits
    M = Q.encode(np.eye(3))
    G1 = Q.encode(np.ones((3, 2)))
    phi, psi, RX, RG = pad(Q, W, M, G1, rng)
    assert phi.shape == (6, 6) and psi.shape == (6, 3, 2)   # ceil(96/16) limbs
    assert not np.array_equal(phi, RX)
    # top-limb means of many pads of a zero and of a large secret agree (uniform residues)
    means = []
    for secret in (0, 2**40):
        tops = [pad(Q, W, np.full((3, 3), secret), G1, rng)[0][-1] for _ in range(400)]
        means.append(np.mean(tops))
    assert abs(means[0] - means[1]) < 0.05 * 2**16


def test_device_epoch_costs_d2c_macs():
    d, c = 7, 3
    rng = np.random.default_rng(4)
    Cbar = prepared_from_limbs(random_ring_limbs((d, d), 72, rng))
    C = random_ring_limbs((d, c), 72, rng)
    with MacMeter() as m:
        coded_gradient(Q, Cbar, C, prepare(Q.encode(rng.uniform(-1, 1, (d, c)))))
    assert m.macs == d * d * c      # Sec. V-D: d^2 c per device and epoch


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
