"""Privacy audit of CodedSecAgg (Sec. III-C threat model) with small fields, statistically.

Trick: every operation of the protocol acts coordinate-wise on the shared matrices with fresh
randomness per coordinate, so a vector of M coordinates holding the same secrets is M independent
trials of the protocol.  The pipeline is the protocol's own code (``shamir_share``, ``add_mod``,
``aggregation_tree``, ``shamir_reconstruct``) over GF(q) with a small q; ``eps = 0`` (the shares of
eq. 13 are then those of ``Psi``; ``Phi eps`` only adds another share of a secret).

Tolerance: each chi-square test rejects at p < 1e-4; with the handful of tests below the family-wise
false-alarm rate is below 0.1 %.  Power: a sanity check shows the test rejects when the secret
really changes.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2, chi2_contingency

from fednet.algebra.modp import add_mod
from fednet.codes.secagg_tree import aggregation_tree
from fednet.codes.shamir import default_points, shamir_reconstruct, shamir_share

ALPHA = 1e-4


def run_codedsecagg(secrets, N, n1, kp, q, M, rng):
    """Phase 1 in each group, eq. 13 shares (eps = 0), the tree; returns views.

    secrets : list over groups of lists over devices of ints (one scalar secret per device,
    repeated over the M coordinates).
    Returns (share[g, i] after phase 1, tree messages received {(g, i): [arrays]}, master shares).
    """
    pts = default_points(n1)
    own = {}
    phase1_in = {}
    for g in range(N):
        sh = [shamir_share(np.full(M, secrets[g][j]), n1, kp, q, rng, pts) for j in range(n1)]
        for i in range(n1):
            phase1_in[g, i] = [sh[j][i] for j in range(n1) if j != i]
            acc = sh[0][i]
            for j in range(1, n1):
                acc = add_mod(acc, sh[j][i], q)
            own[g, i] = acc
    tree_in = {key: [] for key in own}
    share = dict(own)
    for step in aggregation_tree(N):
        for src, dst in step:
            for i in range(n1):
                tree_in[dst, i].append(share[src, i])
                share[dst, i] = add_mod(share[dst, i], share[src, i], q)
    master = [share[0, i] for i in range(n1)]
    return phase1_in, tree_in, master


def cells(values, q):
    idx = np.zeros_like(values[0], dtype=np.int64)
    for v in values:
        idx = idx * q + v.astype(np.int64)
    return idx


def homogeneous(h1, h2):
    table = np.stack([h1, h2])
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table)[1]


def uniform_p(h):
    e = h.sum() / h.size
    return chi2.sf(((h - e) ** 2 / e).sum(), h.size - 1)


def test_server_view_depends_only_on_the_global_aggregate():
    """(a) The server's plaintext view (k' master shares) determines G = sum of all secrets, and its
    law is the same for datasets with equal G but different device secrets and group aggregates."""
    q, N, n1, kp, M = 11, 2, 3, 2, 40_000
    rng = np.random.default_rng(0)
    A = [[1, 2, 0], [3, 1, 1]]        # group aggregates 3, 5; total 8
    B = [[7, 0, 0], [0, 0, 1]]        # group aggregates 7, 1; total 8
    C = [[1, 2, 0], [3, 1, 2]]        # total 9: a different aggregate
    hist = {}
    for name, sec in (("A", A), ("B", B), ("C", C)):
        _, _, master = run_codedsecagg(sec, N, n1, kp, q, M, rng)
        view = master[:kp]                 # the k' fastest master devices (here 1 and 2)
        rec = shamir_reconstruct(np.stack(view), default_points(n1)[:kp], kp, q)
        assert np.all(rec == sum(map(sum, sec)) % q)       # the view determines G ...
        hist[name] = np.bincount(cells(view, q), minlength=q**kp)
    assert homogeneous(hist["A"], hist["B"]) > ALPHA       # ... and nothing else
    assert homogeneous(hist["A"], hist["C"]) < 1e-12       # power: a different G is visible
    # given G the view is uniform over the q consistent pairs
    occupied = hist["A"][hist["A"] > 0]
    assert occupied.size == q and uniform_p(occupied) > ALPHA


def test_z_colluding_devices_see_uniform_shares():
    """(b) z = 2 colluders (devices 0 and 1 of the master group, k' = 3): their phase-1 shares of the
    third group-mate's secret and the tree sums they receive are jointly uniform, whatever the secrets."""
    q, N, n1, kp, M = 5, 2, 3, 3, 100 * 5**4
    rng = np.random.default_rng(1)
    hist = {}
    for name, sec in (("A", [[0, 0, 0], [0, 0, 0]]), ("B", [[1, 4, 2], [3, 0, 4]])):
        phase1_in, tree_in, _ = run_codedsecagg(sec, N, n1, kp, q, M, rng)
        # device 0 holds its share of S_2 as phase1_in[0, 0][1]; device 1 as phase1_in[0, 1][1]
        view = [phase1_in[0, 0][1], phase1_in[0, 1][1], tree_in[0, 0][0], tree_in[0, 1][0]]
        h = np.bincount(cells(view, q), minlength=q**4)
        assert uniform_p(h) > ALPHA, name
        hist[name] = h
    assert homogeneous(hist["A"], hist["B"]) > ALPHA
