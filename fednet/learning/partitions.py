"""Splits of a data set over devices: horizontal (rows) and vertical (feature blocks).

Horizontal splits (every device holds whole examples, the set-up of Schlegel et al. and of
DReS-FL): the paper's sorted non-IID split, Dirichlet, IID. Each returns a list of ``n_devices``
integer index arrays into the training set; together they cover every training example exactly
once (a partition); :func:`horizontal_split` cuts the arrays by them.

Vertical splits (every client holds a block of the features of *every* example, the labels stay
at the server: split vertical FL, FedVS, Li et al., Sec. 3 and 6.1): :class:`VerticalSplit`
holds the feature indices of each client, made by :func:`vertical_split` (features or image
rows/columns split evenly) or from explicit blocks (multi-view data, one view per client). The
input may be raw pixels or any features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "noniid_split",
    "dirichlet_split",
    "iid_split",
    "partition",
    "label_counts",
    "horizontal_split",
    "VerticalSplit",
    "vertical_split",
]


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


def horizontal_split(x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows of ``x`` and ``y`` per device (horizontal FL): ``x[parts[i]], y[parts[i]]``.

    Parameters
    ----------
    x : ndarray, shape (m, ...)
        Inputs (raw pixels or features).
    y : ndarray, shape (m, ...)
        Labels or one-hot rows.
    parts : sequence of ndarray
        Index arrays of the devices (e.g. from :func:`partition`).

    Returns
    -------
    X, Y : list of ndarray
        Contiguous copies, one per device.

    Raises
    ------
    ValueError
        If ``x`` and ``y`` differ in rows or an index is out of range.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    for i, p in enumerate(parts):
        p = np.asarray(p)
        if p.size and (p.min() < 0 or p.max() >= x.shape[0]):
            raise ValueError(f"parts[{i}] indexes outside [0, {x.shape[0] - 1}]")
    return ([np.ascontiguousarray(x[np.asarray(p, dtype=np.int64)]) for p in parts],
            [np.ascontiguousarray(y[np.asarray(p, dtype=np.int64)]) for p in parts])


@dataclass(frozen=True, eq=False)
class VerticalSplit:
    """Feature blocks of the clients of a vertical split (labels stay at the server).

    Client ``n`` holds columns ``blocks[n]`` of every example (FedVS, Li et al., Sec. 3: ``X_n``
    is client n's feature block; the server's embedding averages the clients' outputs).

    Parameters
    ----------
    blocks : tuple of ndarray
        Column indices (int64) of each client; together a partition of ``range(n_features)``.
    n_features : int
        Number of features ``p`` of the full input.

    Raises
    ------
    ValueError
        If the blocks are not a partition of ``range(n_features)`` (an index missing, repeated
        or out of range) or a block is empty.
    """

    blocks: tuple[np.ndarray, ...]
    n_features: int

    def __post_init__(self) -> None:
        blocks = tuple(np.asarray(b, dtype=np.int64).ravel() for b in self.blocks)
        if not blocks:
            raise ValueError("blocks must hold at least one client")
        for n, b in enumerate(blocks):
            if b.size == 0:
                raise ValueError(f"block {n} is empty: every client must hold at least one feature")
            b.flags.writeable = False
        allidx = np.concatenate(blocks)
        if allidx.size != self.n_features or not np.array_equal(np.sort(allidx), np.arange(self.n_features)):
            raise ValueError(f"blocks must partition range({self.n_features}); they hold {allidx.size} indices "
                             f"spanning [{allidx.min()}, {allidx.max()}] with {allidx.size - np.unique(allidx).size} "
                             "repeated")
        object.__setattr__(self, "blocks", blocks)

    @property
    def n_clients(self) -> int:
        """Number of clients ``N``."""
        return len(self.blocks)

    @property
    def sizes(self) -> list[int]:
        """Features per client ``p_n``."""
        return [int(b.size) for b in self.blocks]

    def split(self, x: np.ndarray) -> list[np.ndarray]:
        """Client ``n``'s block ``x[:, blocks[n]]`` of every row.

        Parameters
        ----------
        x : ndarray, shape (m, n_features)

        Returns
        -------
        list of ndarray, each (m, p_n)
            Contiguous copies, in client order.

        Raises
        ------
        ValueError
            If ``x`` does not have ``n_features`` columns.
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"x must have shape (m, {self.n_features}), got {x.shape}")
        return [np.ascontiguousarray(x[:, b]) for b in self.blocks]

    def merge(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """Reassemble the full rows from the clients' blocks (inverse of :meth:`split`).

        Parameters
        ----------
        parts : sequence of ndarray, each (m, p_n)

        Returns
        -------
        ndarray, shape (m, n_features)

        Raises
        ------
        ValueError
            If the number of parts or a part's shape is wrong.
        """
        if len(parts) != self.n_clients:
            raise ValueError(f"parts must hold {self.n_clients} blocks, got {len(parts)}")
        m = np.asarray(parts[0]).shape[0]
        out = np.empty((m, self.n_features), dtype=np.result_type(*[np.asarray(p).dtype for p in parts]))
        for n, (p, b) in enumerate(zip(parts, self.blocks)):
            p = np.asarray(p)
            if p.shape != (m, b.size):
                raise ValueError(f"parts[{n}] has shape {p.shape}, expected ({m}, {b.size})")
            out[:, b] = p
        return out


def vertical_split(n_features: int, n_clients: int, *, by: str = "features",
                   image_shape: Sequence[int] | None = None) -> VerticalSplit:
    """Split the features of every example evenly over ``n_clients`` clients.

    FedVS (Li et al., Sec. 6.1 and App. C): "we evenly partition the features of each data sample
    across the clients" (FashionMNIST over 28 clients). When ``n_clients`` does not divide the
    number of units, the first ones get one more (``numpy.array_split``).

    Parameters
    ----------
    n_features : int
        Number of features ``p`` (784 for a flattened 28x28 image).
    n_clients : int
        Number of clients ``N``.
    by : {"features", "rows", "columns"}
        ``"features"``: consecutive blocks of the flattened input; ``"rows"``: consecutive image
        rows (the same as ``"features"`` when ``N`` divides the number of rows); ``"columns"``:
        consecutive image columns (client ``n`` holds pixels ``r * W + c`` of its columns ``c``,
        every row ``r``, in raster order).
    image_shape : (H, W), optional
        Required for ``"rows"`` and ``"columns"`` (row-major flattening, ``H * W = n_features``).

    Returns
    -------
    VerticalSplit

    Raises
    ------
    ValueError
        For an unknown ``by``, a missing or inconsistent ``image_shape``, or more clients than
        units to split.
    """
    if isinstance(n_features, bool) or int(n_features) != n_features or n_features < 1:
        raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
    if isinstance(n_clients, bool) or int(n_clients) != n_clients or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    n_features, n_clients = int(n_features), int(n_clients)
    if by == "features":
        units = n_features
    elif by in ("rows", "columns"):
        if image_shape is None or len(image_shape) != 2 or int(np.prod(image_shape)) != n_features:
            raise ValueError(f"by={by!r} needs image_shape (H, W) with H * W = {n_features}, got {image_shape!r}")
        H, W = (int(s) for s in image_shape)
        units = H if by == "rows" else W
    else:
        raise ValueError(f"by must be 'features', 'rows' or 'columns', got {by!r}")
    if n_clients > units:
        raise ValueError(f"n_clients = {n_clients} exceeds the {units} {by} to split")
    chunks = np.array_split(np.arange(units, dtype=np.int64), n_clients)
    if by == "features":
        blocks = chunks
    elif by == "rows":
        blocks = [(c[:, None] * W + np.arange(W)).ravel() for c in chunks]
    else:
        blocks = [(np.arange(H)[:, None] * W + c[None, :]).ravel() for c in chunks]
    return VerticalSplit(tuple(blocks), n_features)
