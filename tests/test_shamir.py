"""Shamir (n', k') sharing over GF(q): threshold reconstruction, linearity, z-privacy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.algebra.fields import fixed_point_field, to_field, uniform
from fednet.algebra.meter import MacMeter
from fednet.codes.shamir import (
    add_shares,
    check_shamir_parameters,
    default_points,
    scale_shares,
    shamir_reconstruct,
    shamir_share,
)

Q73 = fixed_point_field(48, 24)


@pytest.mark.parametrize("q", [97, 2**31 - 1, Q73])
def test_reconstruct_from_every_k_subset(q):
    n_prime, k_prime = 6, 3
    rng = np.random.default_rng(0)
    secret = uniform(rng, q, (2, 3))
    with MacMeter() as meter:
        shares = shamir_share(secret, n_prime, k_prime, q, rng)
    assert shares.shape == (n_prime, 2, 3)
    assert meter.macs == n_prime * k_prime * secret.size
    pts = default_points(n_prime)
    for subset in itertools.combinations(range(n_prime), k_prime):
        got = shamir_reconstruct(shares[list(subset)], [pts[i] for i in subset], k_prime, q)
        assert np.array_equal(got.astype(object), secret.astype(object)), subset
    # more than k' shares also works; fewer is refused
    assert np.array_equal(shamir_reconstruct(shares, pts, k_prime, q).astype(object), secret.astype(object))
    with pytest.raises(ValueError, match="at least k_prime = 3 shares"):
        shamir_reconstruct(shares[:2], pts[:2], k_prime, q)


def test_threshold_one_is_replication():
    """k' = 1 (z = 0): every share is the secret itself; k' = 2: a share differs from the secret."""
    q = 13
    rng = np.random.default_rng(1)
    assert np.all(shamir_share(np.array([5, 6]), 4, 1, q, rng) == [5, 6])
    shares = shamir_share(np.full(200, 5), 4, 2, q, rng)
    assert np.mean(shares[0] == 5) < 0.2  # uniform share: equals the secret w.p. 1/13


def test_linearity_sum_and_public_scalar():
    q = Q73
    rng = np.random.default_rng(2)
    x = to_field(rng.integers(-(2**60), 2**60, size=(3, 2)), q)
    y = to_field(rng.integers(-(2**60), 2**60, size=(3, 2)), q)
    sx = shamir_share(x, 5, 3, q, rng)
    sy = shamir_share(y, 5, 3, q, rng)
    pts = default_points(5)
    ssum = np.stack([add_shares(sx[i], sy[i], q) for i in range(5)])
    sscaled = np.stack([scale_shares(-7, sx[i], q) for i in range(5)])
    got_sum = shamir_reconstruct(ssum[[4, 0, 2]], [pts[4], pts[0], pts[2]], 3, q)
    got_scaled = shamir_reconstruct(sscaled[[1, 3, 4]], [pts[1], pts[3], pts[4]], 3, q)
    assert [int(v) for v in got_sum.ravel()] == [(int(a) + int(b)) % q for a, b in zip(x.ravel(), y.ravel())]
    assert [int(v) for v in got_scaled.ravel()] == [(-7 * int(a)) % q for a in x.ravel()]


def test_any_z_shares_uniform_whatever_the_secret():
    """Statistical test: the joint law of any z = k'-1 shares is uniform on GF(q)^z for every secret.

    q = 7, (n', k') = (4, 3), z = 2: for each secret in {0, 3, 6} and each pair of share indices, draw
    M = 24 500 sharings (500 per cell of the 49-cell joint law) and run a chi-square goodness-of-fit
    test against the uniform law.  Tolerance: reject at p < 1e-4 per test (27 tests, family-wise
    false-alarm rate < 0.3 %); we also require the two secrets' histograms to agree (chi-square
    homogeneity, same threshold).
    """
    from scipy.stats import chi2, chi2_contingency

    q, n_prime, k_prime = 7, 4, 3
    z = k_prime - 1
    M = 500 * q**z
    rng = np.random.default_rng(3)
    hists = {}
    for secret in (0, 3, 6):
        # vectorised: M independent sharings of a scalar secret, as one (M,) "matrix"
        shares = shamir_share(np.full(M, secret), n_prime, k_prime, q, rng)  # (n', M)
        for pair in itertools.combinations(range(n_prime), z):
            cells = shares[pair[0]] * q + shares[pair[1]]
            h = np.bincount(cells.astype(np.int64), minlength=q**z)
            stat = ((h - M / q**z) ** 2 / (M / q**z)).sum()
            assert chi2.sf(stat, q**z - 1) > 1e-4, (secret, pair, stat)
            hists[secret, pair] = h
    for pair in itertools.combinations(range(n_prime), z):
        table = np.stack([hists[0, pair], hists[6, pair]])
        assert chi2_contingency(table)[1] > 1e-4
    # sanity: k' shares are NOT uniform given the secret (they determine it)
    shares = shamir_share(np.full(2000, 3), n_prime, k_prime, q, rng)
    from fednet.codes.shamir import reconstruction_coefficients

    lam = reconstruction_coefficients([1, 2, 3], q)
    rec = (lam[0] * shares[0] + lam[1] * shares[1] + lam[2] * shares[2]) % q
    assert np.all(rec == 3)


def test_parameter_validation():
    with pytest.raises(ValueError, match="n_prime must be an integer >= k_prime"):
        check_shamir_parameters(2, 3, 97)
    with pytest.raises(ValueError, match="k_prime must be an integer >= 1"):
        check_shamir_parameters(2, 0, 97)
    with pytest.raises(ValueError, match=r"k' > z"):
        check_shamir_parameters(5, 3, 97, z=3)
    with pytest.raises(ValueError, match="too small"):
        check_shamir_parameters(10, 3, 7)
    with pytest.raises(ValueError, match="nonzero"):
        shamir_share(np.array([1]), 2, 2, 97, np.random.default_rng(0), points=[0, 1])
