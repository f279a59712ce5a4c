"""Approximate gradient coding (Makkonen et al.): Theorem 1, unbiasedness, variance."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.codes.approx_gc import (
    client_weights,
    draw_responders,
    estimate_gradient,
    estimator_coefficients,
    estimator_second_moment,
    estimator_variance,
    example_weights,
    received_counts,
    replication_counts,
    share_randomly,
    shared_proportions,
    sum_responses,
    theorem1_expected_distance,
)


def _one_class(x: np.ndarray, k: int, c: float, sims: int):
    """Owner / non-private arrays of one class of K examples with proportions x."""
    counts = np.rint(np.asarray(x) * k).astype(int)
    npriv = np.rint(c * counts).astype(int)
    assert counts.sum() == k and np.allclose(c * counts, npriv), "need integer c X_i K"
    owner = np.repeat(np.arange(len(x)), counts)
    nonprivate = np.concatenate([np.arange(n) < q for n, q in zip(counts, npriv)])
    return np.tile(owner, (sims, 1)), np.tile(nonprivate, (sims, 1)), counts


# (x, K, c, d): single-class, a skewed point, a near-uniform point, an odd N, full replication
POINTS = [
    (np.eye(10)[0], 30, 0.5, 2),
    (np.array([0.5, 0.3, 0.2, 0, 0, 0, 0, 0, 0, 0]), 40, 0.25, 3),
    (np.array([0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.0, 0.0]), 50, 0.2, 5),
    (np.array([0.6, 0.4, 0.0, 0.0, 0.0]), 20, 0.5, 1),
    (np.array([0.6, 0.4, 0.0, 0.0, 0.0]), 20, 1.0, 4),
]


@pytest.mark.parametrize("x,k,c,d", POINTS)
def test_theorem1_monte_carlo_subset_placement(x, k, c, d) -> None:
    """Exact-d placement: B = dcK, Y by eq. (1); MC mean within 4 standard errors + 1e-12."""
    sims, n = 20000, len(x)
    owner, nonprivate, counts = _one_class(x, k, c, sims)
    a = share_randomly(owner, nonprivate, n, d, rng=11, placement="subset")
    dj = replication_counts(a)
    assert np.all(dj[nonprivate] == d + 1) and np.all(dj[~nonprivate] == 1)
    recv = received_counts(a, owner, np.zeros(k, int), 1)[:, 0, :]  # (S, N)
    assert np.all(recv.sum(-1) == d * c * k)  # B = d c K exactly
    y = shared_proportions(np.broadcast_to(counts, recv.shape), recv)
    dist = np.sum((y - 1.0 / n) ** 2, axis=-1)
    theory = float(theorem1_expected_distance(x, k, c, d))
    se = dist.std(ddof=1) / np.sqrt(sims)
    assert abs(dist.mean() - theory) <= 4 * se + 1e-12, (dist.mean(), theory, se)
    if d == n - 1 and c == 1.0:
        assert theory == pytest.approx(0.0) and np.allclose(dist, 0.0)


@pytest.mark.parametrize("x,k,c,d", POINTS[:3])
def test_theorem1_monte_carlo_bernoulli_placement(x, k, c, d) -> None:
    """Independent placement w.p. d/(N-1): S_i ~ Binomial as in the proof; with B = dcK (the
    proof's value) the MC mean matches within 4 SE. With the realised (random) B it deviates
    by O(1/K): checked within 15 % relative."""
    sims, n = 20000, len(x)
    owner, nonprivate, counts = _one_class(x, k, c, sims)
    a = share_randomly(owner, nonprivate, n, d, rng=12, placement="bernoulli")
    recv = received_counts(a, owner, np.zeros(k, int), 1)[:, 0, :]
    c_tilde = c * (k - counts)  # C~_i = c (1 - X_i) K
    # S_i ~ Binomial(C~_i, d/(N-1)): mean and variance within 4 SE / 10 %
    q = d / (n - 1)
    assert np.all(np.abs(recv.mean(0) - c_tilde * q) <= 4 * np.sqrt(c_tilde * q / sims) + 1e-12)
    np.testing.assert_allclose(recv.var(0), c_tilde * q * (1 - q), rtol=0.1, atol=1e-12)
    theory = float(theorem1_expected_distance(x, k, c, d))
    y = shared_proportions(np.broadcast_to(counts, recv.shape), recv, b=d * c * k)
    dist = np.sum((y - 1.0 / n) ** 2, axis=-1)
    se = dist.std(ddof=1) / np.sqrt(sims)
    assert abs(dist.mean() - theory) <= 4 * se + 1e-12
    y_real = shared_proportions(np.broadcast_to(counts, recv.shape), recv)
    real = np.sum((y_real - 1.0 / n) ** 2, axis=-1).mean()
    assert abs(real - theory) <= 0.15 * theory


def test_theorem1_large_k_limit_and_errors() -> None:
    x = np.eye(10)[3]
    big = theorem1_expected_distance(x, 10**9, 0.5, 3)
    assert big == pytest.approx((9 - 1.5) ** 2 / (2.5**2 * 81) * 0.9, rel=1e-8)
    assert theorem1_expected_distance(x, 30, 0.0, 3) == pytest.approx(0.9)  # no sharing
    with pytest.raises(ValueError, match="d must"):
        theorem1_expected_distance(x, 30, 0.5, 10)
    with pytest.raises(ValueError, match="c must"):
        theorem1_expected_distance(x, 30, 1.5, 1)


def _setup(seed: int = 0, n: int = 6, m: int = 24, q: int = 5, c: float = 0.5, d: int = 2):
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, n, m)
    nonprivate = rng.random(m) < c
    a = share_randomly(owner, nonprivate, n, d, rng=rng)
    grads = rng.normal(size=(1, m, q)) + rng.normal(size=(1, 1, q))  # correlated gradients
    return a, grads


@pytest.mark.parametrize("p", [0.3, 0.7])
def test_estimator_unbiased_and_variance(p: float) -> None:
    """Over T = 200000 straggler draws: mean(g_hat) = sum_j g_j within 4 SE per entry, and
    E||g_hat - g||^2 = p/(1-p) sum_i ||sum_{j in S_i} g_j/d_j||^2 within 4 SE."""
    a, grads = _setup()
    g = grads.sum(axis=1)  # (1, q)
    t = 200000
    resp = draw_responders(5, (t, 1, a.shape[1]), p)
    coef = estimator_coefficients(a, resp, p)  # (T, 1, M)
    g_hat = estimate_gradient(grads, coef)[:, 0, :]  # (T, q)
    se = g_hat.std(axis=0, ddof=1) / np.sqrt(t)
    assert np.all(np.abs(g_hat.mean(axis=0) - g[0]) <= 4 * se)
    sq = np.sum((g_hat - g[0]) ** 2, axis=1)
    gram = np.einsum("smq,skq->smk", grads, grads)
    var = float(estimator_variance(a, gram, p)[0])
    # the closed form written out with explicit loops, as in the issue
    dj = a[0].sum(axis=0)
    explicit = p / (1 - p) * sum(
        float(np.sum(np.sum(grads[0][a[0, i]] / dj[a[0, i]][:, None], axis=0) ** 2))
        for i in range(a.shape[1])
    )
    assert var == pytest.approx(explicit, rel=1e-12)
    assert abs(sq.mean() - var) <= 4 * sq.std(ddof=1) / np.sqrt(t)
    m2 = float(estimator_second_moment(a, gram, p)[0])
    assert m2 == pytest.approx(float(np.sum(g**2)) + var, rel=1e-12)


def test_full_replication_removes_variance() -> None:
    """d = N - 1 and c = 1: every client holds every example; the variance left is that of
    the number of responders, p/(1-p) * N * ||g/N||^2."""
    rng = np.random.default_rng(3)
    n, m = 5, 10
    a = share_randomly(rng.integers(0, n, m), np.ones(m, bool), n, n - 1, rng=rng)
    assert a.all()
    grads = rng.normal(size=(1, m, 3))
    gram = np.einsum("smq,skq->smk", grads, grads)
    g = grads.sum(1)[0]
    assert estimator_variance(a, gram, 0.4)[0] == pytest.approx(0.4 / 0.6 * n * np.sum((g / n) ** 2))


def test_weights_and_sharing_rules() -> None:
    rng = np.random.default_rng(4)
    s, n, m = 4000, 10, 30
    owner = rng.integers(0, n, (s, m))
    nonprivate = rng.random((s, m)) < 0.5
    a = share_randomly(owner, nonprivate, n, 3, rng=rng)
    dj = replication_counts(a)
    assert np.all(a[np.arange(s)[:, None], owner, np.arange(m)[None, :]])  # owner keeps it
    assert np.all(dj[~nonprivate] == 1)  # private data never leaves
    # d_j - 1 ~ Binomial(N-1, d/(N-1)): mean d = 3, variance 3 (1 - 3/9) = 2, within 4 SE
    extra = dj[nonprivate] - 1
    assert abs(extra.mean() - 3) < 4 * np.sqrt(2 / extra.size)
    assert abs(extra.var() - 2) < 0.1
    w = example_weights(a, 0.3)
    np.testing.assert_allclose(w, 1 / (0.7 * dj))
    cw = client_weights(a, 0.3)
    # (1 - p) sum_i f_i-weights = 1 for each example: E g_hat = g
    np.testing.assert_allclose(0.7 * cw.sum(axis=1), 1.0)


def test_sharing_errors() -> None:
    with pytest.raises(ValueError, match="d must"):
        share_randomly(np.zeros(3, int), np.ones(3, bool), 4, 4)
    with pytest.raises(ValueError, match="placement"):
        share_randomly(np.zeros(3, int), np.ones(3, bool), 4, 1, placement="x")
    with pytest.raises(ValueError, match="p must"):
        draw_responders(0, (2, 2), 1.0)


def test_reproducible_under_seed() -> None:
    a1, _ = _setup(seed=9)
    a2, _ = _setup(seed=9)
    assert np.array_equal(a1, a2)


def test_sum_responses_is_eq11_metered() -> None:
    rng = np.random.default_rng(0)
    f = [rng.standard_normal((4, 3)) for _ in range(3)]
    with MacMeter() as m:
        g = sum_responses(f, (4, 3))
    assert m.macs == 3 * 12
    np.testing.assert_array_equal(g, ((np.zeros((4, 3)) + f[0]) + f[1]) + f[2])
    with MacMeter() as m:
        np.testing.assert_array_equal(sum_responses([], (2, 2)), np.zeros((2, 2)))
    assert m.macs == 0
