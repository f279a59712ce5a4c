"""Partitions of a training set over devices: the paper's sorted non-IID split, Dirichlet, IID.

Every function returns a list of ``n_devices`` integer index arrays into the training set;
together they cover every training example exactly once (a partition).
"""

from __future__ import annotations

import numpy as np

__all__ = ["noniid_split", "dirichlet_split", "iid_split", "partition", "label_counts"]


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        raise ValueError("labels must be non-negative integers")
    return labels


def _check_devices(n_devices: int, m: int) -> int:
    if isinstance(n_devices, bool) or int(n_devices) != n_devices or n_devices < 1:
        raise ValueError(f"n_devices must be a positive integer, got {n_devices!r}")
    if n_devices > m:
        raise ValueError(f"n_devices must not exceed the number of examples {m}, got {n_devices}")
    return int(n_devices)


def noniid_split(labels: np.ndarray, n_devices: int) -> list[np.ndarray]:
    """The non-IID split of Schlegel et al., Sec. VII: sort by label, cut into equal shards.

    The training set is sorted by label with a *stable* sort (ties keep their original order),
    then cut into ``n_devices`` consecutive shards. When ``n_devices`` does not divide ``m``,
    the shards are as equal as possible: the first ``m % n_devices`` shards hold
    ``m // n_devices + 1`` examples, the others ``m // n_devices`` (``numpy.array_split``);
    no example is dropped.

    Parameters
    ----------
    labels : ndarray, shape (m,), int
        Training labels.
    n_devices : int
        Number of devices ``D`` (1 <= D <= m).

    Returns
    -------
    list of ndarray
        ``D`` index arrays (int64), device ``i`` holding shard ``i`` of the sorted order.

    Raises
    ------
    ValueError
        If ``labels`` is not 1-D non-negative integers or ``n_devices`` is out of range.
    """
    labels = _check_labels(labels)
    n_devices = _check_devices(n_devices, labels.size)
    order = np.argsort(labels, kind="stable").astype(np.int64)
    return [np.ascontiguousarray(s) for s in np.array_split(order, n_devices)]


def iid_split(
    n_samples: int, n_devices: int, rng: np.random.Generator | int | None = None
) -> list[np.ndarray]:
    """IID split: a uniformly random permutation cut into ``n_devices`` near-equal shards.

    Parameters
    ----------
    n_samples : int
        Number of training examples ``m``.
    n_devices : int
        Number of devices ``D`` (1 <= D <= m); shard sizes as in :func:`noniid_split`.
    rng : Generator or int or None
        Random stream or seed.

    Returns
    -------
    list of ndarray
        ``D`` index arrays (int64).

    Raises
    ------
    ValueError
        If ``n_samples`` or ``n_devices`` is out of range.
    """
    if int(n_samples) != n_samples or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    n_devices = _check_devices(n_devices, int(n_samples))
    rng = np.random.default_rng(rng)
    perm = rng.permutation(int(n_samples)).astype(np.int64)
    return [np.ascontiguousarray(s) for s in np.array_split(perm, n_devices)]


def dirichlet_split(
    labels: np.ndarray,
    n_devices: int,
    alpha: float,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """Label-heterogeneous split with per-class Dirichlet proportions (Yurochkin et al.).

    For every class ``l`` the proportions ``X^l ~ Dir_D(alpha)`` are drawn and the class's
    examples (in random order) are dealt to the devices in counts
    ``Multinomial(K_l, X^l)`` (Makkonen et al., Sec. II-B, model 2). Small ``alpha`` means
    strong heterogeneity; a device may receive no example at all.

    Parameters
    ----------
    labels : ndarray, shape (m,), int
        Training labels.
    n_devices : int
        Number of devices ``D``.
    alpha : float
        Concentration parameter (> 0).
    rng : Generator or int or None
        Random stream or seed.

    Returns
    -------
    list of ndarray
        ``D`` index arrays (int64, sorted).

    Raises
    ------
    ValueError
        If ``alpha`` is not positive, or ``labels`` / ``n_devices`` are invalid.
    """
    labels = _check_labels(labels)
    n_devices = _check_devices(n_devices, labels.size)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    rng = np.random.default_rng(rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        props = rng.dirichlet(np.full(n_devices, float(alpha)))
        counts = rng.multinomial(idx.size, props)
        for dev, chunk in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            parts[dev].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.empty(0, np.int64) for p in parts]


def partition(
    labels: np.ndarray,
    n_devices: int,
    kind: str = "noniid",
    alpha: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """Dispatch to :func:`noniid_split`, :func:`dirichlet_split` or :func:`iid_split`.

    Parameters
    ----------
    labels : ndarray, shape (m,), int
        Training labels.
    n_devices : int
        Number of devices.
    kind : {"noniid", "dirichlet", "iid"}
        Which split.
    alpha : float, optional
        Dirichlet concentration (required for ``kind="dirichlet"``).
    rng : Generator or int or None
        Random stream or seed (``"dirichlet"`` and ``"iid"``).

    Returns
    -------
    list of ndarray
        ``n_devices`` index arrays.

    Raises
    ------
    ValueError
        For an unknown ``kind`` or a missing ``alpha``.
    """
    if kind == "noniid":
        return noniid_split(labels, n_devices)
    if kind == "iid":
        return iid_split(np.asarray(labels).size, n_devices, rng)
    if kind == "dirichlet":
        if alpha is None:
            raise ValueError("alpha is required for kind='dirichlet'")
        return dirichlet_split(labels, n_devices, alpha, rng)
    raise ValueError(f"kind must be 'noniid', 'dirichlet' or 'iid', got {kind!r}")


def label_counts(labels: np.ndarray, parts: list[np.ndarray], n_classes: int) -> np.ndarray:
    """Number of examples of each class on each device.

    Parameters
    ----------
    labels : ndarray, shape (m,), int
        Training labels.
    parts : list of ndarray
        Index arrays, one per device.
    n_classes : int
        Number of classes ``L``.

    Returns
    -------
    ndarray, shape (len(parts), n_classes), int64
        ``counts[i, l]`` examples of class ``l`` on device ``i``.
    """
    labels = _check_labels(labels)
    return np.stack(
        [np.bincount(labels[p], minlength=n_classes)[:n_classes] for p in parts]
    ).astype(np.int64)
