"""Partitions: the paper's sorted non-IID split, Dirichlet and IID splits; horizontal and vertical splits."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.learning.partitions import (
    VerticalSplit,
    dirichlet_split,
    horizontal_split,
    iid_split,
    label_counts,
    noniid_split,
    partition,
    vertical_split,
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


# -- horizontal and vertical splits ----------------------------------------------------------------

def test_horizontal_split_cuts_rows_by_the_partition() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 4)), rng.integers(0, 3, 30)
    parts = partition(y, 4, kind="iid", rng=1)
    X, Y = horizontal_split(x, y, parts)
    assert [a.shape for a in X] == [(8, 4), (8, 4), (7, 4), (7, 4)]
    for p, a, b in zip(parts, X, Y):
        assert np.array_equal(a, x[p]) and np.array_equal(b, y[p])
    with pytest.raises(ValueError, match="rows"):
        horizontal_split(x, y[:-1], parts)
    with pytest.raises(ValueError, match=r"parts\[0\]"):
        horizontal_split(x, y, [np.array([30])])


@pytest.mark.parametrize("by", ["features", "rows", "columns"])
@pytest.mark.parametrize("n_clients", [1, 3, 28])
def test_vertical_split_of_images_reassembles_exactly(by: str, n_clients: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((13, 784))
    vs = vertical_split(784, n_clients, by=by, image_shape=(28, 28))
    parts = vs.split(x)
    assert vs.n_clients == n_clients == len(parts)
    assert sum(vs.sizes) == 784 and max(vs.sizes) - min(vs.sizes) <= (1 if by == "features" else 28)
    assert np.array_equal(vs.merge(parts), x)
    assert np.array_equal(np.sort(np.concatenate(vs.blocks)), np.arange(784))
    for p, b in zip(parts, vs.blocks):
        assert np.array_equal(p, x[:, b])


def test_vertical_split_by_columns_gives_each_client_its_image_columns() -> None:
    img = np.arange(28 * 28).reshape(28, 28)
    x = img.reshape(1, -1).astype(float)
    vs = vertical_split(784, 28, by="columns", image_shape=(28, 28))
    for n, part in enumerate(vs.split(x)):
        assert np.array_equal(part[0], img[:, n])  # client n holds image column n
    vs = vertical_split(784, 4, by="rows", image_shape=(28, 28))
    assert np.array_equal(vs.split(x)[1][0], img[7:14].ravel())
    assert vertical_split(10, 3).sizes == [4, 3, 3]


def test_vertical_split_from_views_and_errors() -> None:
    views = VerticalSplit((np.arange(0, 3), np.arange(3, 5), np.array([6, 5])), 7)  # multi-view: one view each
    x = np.arange(14.0).reshape(2, 7)
    merged = views.merge(views.split(x))
    assert np.array_equal(merged, x) and merged.dtype == x.dtype
    with pytest.raises(ValueError, match="partition"):
        VerticalSplit((np.arange(3), np.arange(2, 5)), 5)
    with pytest.raises(ValueError, match="empty"):
        VerticalSplit((np.arange(3), np.array([], dtype=int)), 3)
    with pytest.raises(ValueError, match="image_shape"):
        vertical_split(784, 4, by="columns")
    with pytest.raises(ValueError, match="exceeds"):
        vertical_split(784, 29, by="columns", image_shape=(28, 28))
    with pytest.raises(ValueError, match="by must"):
        vertical_split(784, 4, by="diagonal")
    with pytest.raises(ValueError, match=r"x must have shape \(m, 7\)"):
        views.split(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="parts"):
        views.merge(views.split(x)[:2])


def test_vertical_split_of_mnist_pixels_over_28_clients(data_dir) -> None:
    from fednet.learning.datasets import load_dataset

    ds = load_dataset("mnist", data_dir)
    x = ds.x_train[:500]
    vs = vertical_split(784, 28, by="columns", image_shape=(28, 28))  # FedVS, App. C: 28 clients
    parts = vs.split(x)
    assert [p.shape for p in parts] == [(500, 28)] * 28
    assert np.array_equal(vs.merge(parts), x)
    assert np.array_equal(parts[14], x.reshape(500, 28, 28)[:, :, 14])
