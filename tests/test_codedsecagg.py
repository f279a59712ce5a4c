"""CodedSecAgg (Sec. VI): exact decoding in GF(q), the tree, constraints, timing = full."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.fields import fixed_point_field, to_field
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import MacMeter
from fednet.algebra.modp import PreparedMatrix, add_mod
from fednet.codes.secagg_tree import aggregation_tree
from fednet.codes.shamir import default_points, shamir_share
from fednet.protocols.codedpaddedfl import local_statistics, unpack_upper
from fednet.protocols.codedsecagg import (
    CodedSecAgg,
    CodedSecAggConfig,
    decode_aggregate,
    device_share,
    shamir_share_macs,
    share_secrets,
)
from factories import make_sim, make_task

FP = FixedPoint(48, 24)
Q = fixed_point_field(48, 24)


def test_pure_pipeline_is_exact_in_the_field():
    """Phase 1 + eq. 13 + tree + decode from every k'-subset == sum_i (2^f G1_i + M_i eps) exactly."""
    D, N, kp, d, c = 6, 2, 2, 5, 3
    n1 = D // N
    task = make_task(D=D, d=d, c=c)
    rng = np.random.default_rng(3)
    stats = [local_statistics(FP, x, y) for x, y in zip(task.X, task.Y)]
    pts = default_points(n1)
    Phi, Psi = {}, {}
    for g in range(N):
        shares = []
        for j in range(n1):
            phi, psi = share_secrets(FP, Q, *stats[g * n1 + j])
            shares.append((shamir_share(phi, n1, kp, Q, rng, pts), shamir_share(psi, n1, kp, Q, rng, pts)))
        for i in range(n1):
            phi_i = sum(s[0][i].astype(object) for s in shares) % Q
            Phi[g, i] = PreparedMatrix(unpack_upper(phi_i, d), Q, rhs_bits=48)
            Psi[g, i] = sum(s[1][i].astype(object) for s in shares) % Q
    eps = FP.encode(rng.uniform(-3, 3, (d, c)))
    with MacMeter() as m:
        share = {(g, i): device_share(Phi[g, i], Psi[g, i], eps, Q) for g in range(N) for i in range(n1)}
    assert m.macs == D * (d * d * c + d * c)
    for step in aggregation_tree(N):
        for src, dst in step:
            for i in range(n1):
                share[dst, i] = add_mod(share[dst, i], share[src, i], Q)
    want = sum(M.astype(object).dot(eps.astype(object)) + G1.astype(object) * 2**24 for M, G1 in stats)
    plain = sum(M @ (eps * 2.0**-24) * 2.0**-24 + G1 * 2.0**-24 for M, G1 in stats)
    for cols in [(0, 1), (2, 0), (1, 2)]:
        exact, G = decode_aggregate(np.stack([share[0, i] for i in cols]), [pts[i] for i in cols], kp, Q, 48, 24)
        assert np.array_equal(exact, want)
        # after scaling: float64 rounding of the same fixed-point computation (|G| < 2^8 here)
        assert np.abs(G - plain).max() <= 2.0**-40
    # and the real-valued gradient within the Q<48,24> quantisation bound (loose, stated):
    # each of n points contributes < 2 * 2^-25 |x| per product term of X^T X and X^T Y
    real = sum(x.T @ x @ (eps * 2.0**-24) - x.T @ y for x, y in zip(task.X, task.Y))
    bound = D * (20 * d * 2.0**-24 * (np.abs(eps * 2.0**-24).sum(axis=0).max() + 1) + 2.0**-23 * (d + 1))
    assert np.abs(G - real).max() <= bound


def test_decode_refuses_overflow():
    big = np.full((2, 1, 1), 0, dtype=object)
    big[0, 0, 0] = to_field(np.array([2**71 + 1], dtype=object), Q)[0]  # outside Z_<72>
    big[1, 0, 0] = big[0, 0, 0]  # a constant polynomial: both shares equal the secret
    with pytest.raises(OverflowError, match="Z_<k\\+f>"):
        decode_aggregate(big, [1, 2], 2, Q, 48, 24)


def test_config_constraints():
    with pytest.raises(ValueError, match="groups must divide"):
        CodedSecAgg.check(CodedSecAggConfig(z=1, groups=3), 8)
    with pytest.raises(ValueError, match="at least k_prime = 3"):
        CodedSecAgg.check(CodedSecAggConfig(z=2, groups=4), 8)
    with pytest.raises(ValueError, match="k' > z"):
        CodedSecAggConfig(z=2, k_prime=2)
    with pytest.raises(ValueError, match="extra|Extra"):
        CodedSecAggConfig(z=1, bogus=3)
    CodedSecAgg.check(CodedSecAggConfig(z=1, groups=4), 8)
    assert CodedSecAggConfig(z=60).threshold == 61 and CodedSecAggConfig().q == 2**72 + 15


def test_protocol_full_matches_plain_gradient_descent():
    D, d, c = 8, 6, 3
    task = make_task(D=D, d=d, c=c)
    p = CodedSecAgg(make_sim(D), task, dict(z=1, groups=2))  # n' = 4, k' = 2: tolerates 2 stragglers
    rows = p.run(4)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    # plain GD on the same data (float64): equal up to Q<48,24> quantisation
    theta = np.zeros((d, c))
    XtX = sum(x.T @ x for x in task.X)
    XtY = sum(x.T @ y for x, y in zip(task.X, task.Y))
    for e in range(1, 5):
        G = XtX @ theta - XtY
        theta = theta - task.step_size(e) * (G / task.m + task.weight_decay * theta)
    assert np.abs(p.theta - theta).max() < 1e-5
    assert p.max_decode_error <= 1e-9  # vs float64 on the same fixed-point data (exact check also ran)
    # k' = 2 columns of N = 2 groups were used each round
    for r in rows[1:]:
        assert len(r["used"].split()) == 2 * 2


def test_tree_messages_and_views():
    D, N = 8, 4  # n' = 2 devices per group, tree depth 2
    p = CodedSecAgg(make_sim(D, deterministic=True), make_task(D=D), dict(z=1, groups=N))
    p.run(1)
    tree_in = {dev.index: [m for m in dev.view if m.kind == "tree_share" and m.round == 1] for dev in p.devices}
    # group 0 (devices 0, 1) receives from groups 1 and 2; group 2 (4, 5) from group 3; others nothing
    assert [len(tree_in[i]) for i in range(D)] == [2, 2, 0, 0, 1, 1, 0, 0]
    for dev in p.devices:  # device i of a group only talks to device i of another group
        for m in tree_in[dev.index]:
            assert p.group_of[m.src][1] == p.group_of[m.dst][1]
    server_plain = [m for m in p.server.view if m.dst == p.server.index]
    assert {m.kind for m in server_plain} == {"master_share"}
    assert len([m for m in server_plain if m.round == 1]) == 2
    # phase 1: every device received n' - 1 = 1 share, from its group-mate
    for dev in p.devices:
        got = [m for m in dev.view if m.kind == "shamir_share"]
        assert len(got) == 1 and p.group_of[got[0].src][0] == p.group_of[dev.index][0]


@pytest.mark.parametrize("schedule", ["relay_steps", "relay_asap"])
def test_timing_mode_equals_full_mode(schedule):
    D = 8
    rows = {}
    for mode in ("full", "timing"):
        p = CodedSecAgg(make_sim(D, seed=7, loss=0.1), make_task(D=D),
                        dict(z=1, groups=2, mode=mode, sharing_schedule=schedule))
        rows[mode] = p.run(3)
    for a, b in zip(rows["full"], rows["timing"]):
        for key in ("time_s", "bits_up", "bits_down", "device_macs", "server_macs", "used"):
            assert a[key] == pytest.approx(b[key]) if key == "time_s" else a[key] == b[key], key


def test_setup_traffic_and_encoding_macs():
    D, N, d, c = 8, 2, 6, 3
    n1, kp = 4, 2
    p = CodedSecAgg(make_sim(D, deterministic=True), make_task(D=D, d=d, c=c), dict(z=1, groups=N))
    rows = p.run(0)
    size = d * (d + 1) // 2 + d * c
    q_bits = Q.bit_length()
    assert rows[0]["bits_up"] == D * (n1 - 1) * size * q_bits
    assert rows[0]["bits_down"] == D * (n1 - 1) * size * q_bits
    assert rows[0]["device_macs"] == D * (shamir_share_macs(n1, kp, size) + (n1 - 1) * size)
    rng = np.random.default_rng(0)
    with MacMeter() as m:
        shamir_share(np.zeros(size, dtype=np.int64), n1, kp, 97, rng)
    assert m.macs == shamir_share_macs(n1, kp, size)


def test_large_d_check_path_runs(monkeypatch):
    """The d > 256 observer check (mod an independent prime) accepts a correct decode."""
    D, d, c = 4, 260, 2
    task = make_task(D=D, n=30, d=d, c=c)
    p = CodedSecAgg(make_sim(D, deterministic=True), task, dict(z=1, groups=1))
    p.run(1)
    assert p.max_decode_error <= 1e-9
    import fednet.codes.secagg as csa

    real = csa.decode_aggregate

    def off_by_one(*args, **kwargs):
        exact, G = real(*args, **kwargs)
        exact = exact.copy()
        exact[3, 1] += 1
        return exact, G

    monkeypatch.setattr(csa, "decode_aggregate", off_by_one)
    q = CodedSecAgg(make_sim(D, deterministic=True), task, dict(z=1, groups=1))
    with pytest.raises(AssertionError, match="differs from the exact"):
        q.run(1)
