"""The delay pattern of FedVS Sec. 6.2 (fednet.sim.delays): means, keying, sharing delay."""

import math

import numpy as np
import pytest

from fednet.sim.delays import FEDVS_LINK_BPS, FedVSDelays, straggler_means


def test_means_follow_the_pattern():
    m = straggler_means(28)
    assert m[:14].tolist() == [0.1] * 14
    np.testing.assert_allclose(m[14:], 2 + 4 * np.arange(1, 15) / 28)
    assert straggler_means(5).tolist()[:3] == [0.1] * 3 and len(straggler_means(5)) == 5
    assert FEDVS_LINK_BPS == 300e6


def test_sample_means_match_within_tolerance():
    """4000 rounds per client: the standard error of an exponential mean is mean/sqrt(4000) = 1.6 %;
    tolerance 7 % (4.4 standard errors) per client, and 2 % on the pooled ratio (28 x 4000 draws)."""
    N, R = 28, 4000
    d = FedVSDelays(N, seed=7)
    up = np.array([[d.upload_delay(n, r) for n in range(N)] for r in range(R)])
    sh = np.array([[d.sharing_delay(n, r, 256) for n in range(N)] for r in range(R)])
    means = straggler_means(N)
    assert np.all(np.abs(up.mean(axis=0) / means - 1) < 0.07), up.mean(axis=0) / means
    ratio = math.log2(N) ** 2 / 256
    assert np.all(np.abs(sh.mean(axis=0) / (ratio * means) - 1) < 0.07)
    assert abs((up / means).mean() - 1) < 0.02 and abs((sh / (ratio * means)).mean() - 1) < 0.02
    # exponential: the coefficient of variation is 1
    assert abs(up[:, 0].std() / up[:, 0].mean() - 1) < 0.1
    # sharing and upload delays are independent draws
    assert abs(np.corrcoef((up / means).ravel(), (sh / means).ravel())[0, 1]) < 0.02


def test_keyed_draws_are_paired_and_order_free():
    a, b = FedVSDelays(6, seed=3), FedVSDelays(6, seed=3)
    x = [a.upload_delay(n, 5) for n in range(6)]
    _ = [b.sharing_delay(n, r, 8) for r in range(10) for n in range(6)]   # other draws first
    assert [b.upload_delay(n, 5) for n in reversed(range(6))][::-1] == x
    assert FedVSDelays(6, seed=4).upload_delay(0, 5) != x[0]
    assert FedVSDelays(6, seed=3, scale=0.5).upload_delay(2, 5) == pytest.approx(0.5 * x[2])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_clients"):
        straggler_means(0)
    d = FedVSDelays(4, seed=0)
    with pytest.raises(ValueError, match="client must be in \\[0, 4\\), got 4"):
        d.upload_delay(4, 0)
    with pytest.raises(ValueError, match="batch"):
        d.sharing_delay(0, 0, 0)
    with pytest.raises(ValueError, match="round"):
        d.upload_delay(0, -1)


def test_straggler_fraction_keeps_the_pattern_and_the_default():
    """Sec. 2.2's "60% clients as stragglers" of 16 is 10 (9.6 rounded); 0.5 is Sec. 6.2's floor(N/2), odd N too."""
    from fednet.sim.delays import n_stragglers
    assert n_stragglers(16, 0.6) == 10 and n_stragglers(28, 0.5) == 14 and n_stragglers(7, 0.5) == 3
    assert n_stragglers(16, 0.0) == 0 and n_stragglers(16, 1.0) == 16
    m = straggler_means(16, fraction=0.6)
    assert m[:6].tolist() == [0.1] * 6
    np.testing.assert_allclose(m[6:], 2 + 4 * np.arange(1, 11) / 16)
    d, d60 = FedVSDelays(16, seed=3), FedVSDelays(16, seed=3, straggler_fraction=0.6)
    assert d.stragglers == list(range(8, 16)) and d60.stragglers == list(range(6, 16))
    np.testing.assert_array_equal(d.upload_means, straggler_means(16))
    # the same keyed exponential behind every client: only the means of clients 6 and 7 change
    for n in range(16):
        assert d60.upload_delay(n, 5) / d60.upload_means[n] == pytest.approx(d.upload_delay(n, 5) / d.upload_means[n])
    assert FedVSDelays(16, seed=3, scale=0.0, straggler_fraction=0.6).upload_delay(15, 1) == 0.0
    with pytest.raises(ValueError, match=r"straggler fraction must be a number in \[0, 1\], got 1.2"):
        FedVSDelays(16, seed=3, straggler_fraction=1.2)
