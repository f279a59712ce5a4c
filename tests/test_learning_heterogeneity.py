"""Label-heterogeneous partitions with a privacy fraction (Makkonen et al., Sec. II-B)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.learning.heterogeneity import (
    assign_examples,
    dirichlet_proportions,
    heterogeneity,
    make_partition,
    nonprivate_counts,
    proportions_to_counts,
    single_class_proportions,
)


def _recount(part) -> np.ndarray:
    s, m = part.owner.shape
    L = part.counts.shape[1]
    c = np.zeros((s, L, part.n_clients), np.int64)
    np.add.at(c, (np.arange(s)[:, None], part.labels, part.owner), 1)
    return c


def test_single_class() -> None:
    x = single_class_proportions(10, 10)
    assert np.allclose(heterogeneity(x), 0.9)  # (N - 1) / N
    part = make_partition("single-class", 10, 10, 30, 0.5, n_sims=3, rng=0)
    assert np.array_equal(part.owner, part.labels)  # client i holds only class i
    assert np.all(part.nonprivate.sum(axis=1) == 150)  # c X_i^l K = 15 per client
    with pytest.raises(ValueError, match="n_clients == n_classes"):
        single_class_proportions(5, 10)


def test_dirichlet_heterogeneity_mean() -> None:
    # E||X - Theta*||^2 = (1 - 1/N) / (N alpha + 1) for Dir_N(alpha): 0.45 at N=10, alpha=0.1;
    # 20000 draws: SE about 0.002, tolerance 0.01
    x = dirichlet_proportions(10, 10, 0.1, rng=1, size=2000)
    assert x.shape == (2000, 10, 10)
    assert abs(heterogeneity(x).mean() - 0.45) < 0.01


def test_counts_rounding_and_assignment_consistent() -> None:
    x = dirichlet_proportions(10, 10, 0.1, rng=2, size=50)
    counts = proportions_to_counts(x, 30)
    assert np.all(counts.sum(-1) == 30)
    assert np.all(np.abs(counts - 30 * x) < 1.0)  # largest remainder: within one example
    exact = proportions_to_counts(np.array([[0.5, 0.3, 0.2]]), 10)
    assert exact.tolist() == [[5, 3, 2]]
    part = assign_examples(counts, 0.25, rng=3)
    assert np.array_equal(_recount(part), counts)
    npc = nonprivate_counts(counts, 0.25)
    got = np.zeros_like(counts)
    np.add.at(got, (np.arange(50)[:, None], part.labels, part.owner), part.nonprivate.astype(int))
    assert np.array_equal(got, npc)  # floor(c n_i^l) non-private per client and class


def test_iid_and_reproducibility() -> None:
    a = make_partition("iid", 10, 10, 30, 0.1, n_sims=5, rng=7)
    b = make_partition("iid", 10, 10, 30, 0.1, n_sims=5, rng=7)
    assert np.array_equal(a.owner, b.owner) and np.array_equal(a.nonprivate, b.nonprivate)
    assert np.all(np.stack([np.bincount(o, minlength=10) for o in a.owner]) == 30)
    assert np.array_equal(_recount(a), a.counts)
    h = make_partition("homogeneous", 10, 10, 30, 0.0, rng=0)
    assert np.all(h.counts == 3) and not h.nonprivate.any()


def test_errors() -> None:
    with pytest.raises(ValueError, match="c must"):
        make_partition("single-class", 10, 10, 30, 1.5)
    with pytest.raises(ValueError, match="setting"):
        make_partition("bogus", 10, 10, 30, 0.1)
    with pytest.raises(ValueError, match="alpha"):
        make_partition("dirichlet", 10, 10, 30, 0.1)
    with pytest.raises(ValueError, match="proportions"):
        proportions_to_counts(np.array([[0.5, 0.6]]), 10)
