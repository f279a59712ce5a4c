"""Partitions: the paper's sorted non-IID split, Dirichlet and IID splits."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.learning.partitions import (
    dirichlet_split,
    iid_split,
    label_counts,
    noniid_split,
    partition,
)


def _is_partition(parts: list[np.ndarray], m: int) -> bool:
    allidx = np.concatenate(parts)
    return allidx.size == m and np.array_equal(np.sort(allidx), np.arange(m))


def test_noniid_sorted_equal_shards() -> None:
    labels = np.repeat(np.arange(10), 60)[np.random.default_rng(1).permutation(600)]
    parts = noniid_split(labels, 25)
    assert [p.size for p in parts] == [24] * 25 and _is_partition(parts, 600)
    concat = labels[np.concatenate(parts)]
    assert np.all(np.diff(concat) >= 0)  # consecutive shards of the sorted order
    counts = label_counts(labels, parts, 10)
    assert np.all((counts > 0).sum(axis=1) <= 2)  # 24-row shards of 60-row classes: <= 2 labels


def test_noniid_uneven_sizes_documented() -> None:
    labels = np.arange(103) % 10
    parts = noniid_split(labels, 10)
    assert [p.size for p in parts] == [11, 11, 11] + [10] * 7 and _is_partition(parts, 103)


def test_noniid_stable_within_class() -> None:
    labels = np.array([1, 0, 1, 0])
    assert [p.tolist() for p in noniid_split(labels, 2)] == [[1, 3], [0, 2]]


def test_iid_split_reproducible() -> None:
    a, b = iid_split(1000, 7, 3), iid_split(1000, 7, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert _is_partition(a, 1000) and sorted({p.size for p in a}) == [142, 143]


def test_dirichlet_partition_and_heterogeneity() -> None:
    labels = np.repeat(np.arange(10), 500)
    parts = dirichlet_split(labels, 10, 0.1, rng=0)
    assert _is_partition(parts, 5000)
    counts = label_counts(labels, parts, 10)
    assert np.array_equal(counts.sum(axis=0), np.full(10, 500))
    # E||X^l - Theta*||^2 for Dir_N(alpha) is (1 - 1/N)/(N alpha + 1) = 0.45 for N=10, alpha=0.1;
    # averaged over 10 classes x 20 seeds the sample mean must be within 0.1 of it.
    d2 = []
    for seed in range(20):
        c = label_counts(labels, dirichlet_split(labels, 10, 0.1, rng=seed), 10)
        d2.extend(((c / 500.0 - 0.1) ** 2).sum(axis=0))
    assert abs(np.mean(d2) - 0.45) < 0.1
    big = label_counts(labels, dirichlet_split(labels, 10, 1e4, rng=0), 10)
    assert np.all(np.abs(big / 500.0 - 0.1) < 0.05)  # alpha -> infinity: homogeneous


def test_partition_dispatch_and_errors() -> None:
    labels = np.arange(20) % 4
    assert _is_partition(partition(labels, 4, "iid", rng=0), 20)
    assert _is_partition(partition(labels, 4, "dirichlet", alpha=1.0, rng=0), 20)
    with pytest.raises(ValueError, match="kind"):
        partition(labels, 4, "bogus")
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_split(labels, 4, -1.0)
    with pytest.raises(ValueError, match="n_devices.*21"):
        noniid_split(labels, 21)
    with pytest.raises(ValueError, match="n_devices"):
        noniid_split(labels, 0)
