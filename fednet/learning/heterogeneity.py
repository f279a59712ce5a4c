"""Label-heterogeneous partitions with a privacy fraction (Makkonen et al., Sec. II-B).

Source: O. Makkonen, S. Niemelä, C. Hollanti, S. Kas Hanna, "Approximate gradient coding for
privacy-flexible federated learning with non-IID data", Sec. II-B (system model) and footnote 1.

Notation (the paper's): ``N`` clients, ``L`` classes, ``K`` examples per class (``M = K L``),
``X[l, i] = X_i^l`` the proportion of class ``l`` owned by client ``i`` (each row of ``X`` lies
on the simplex ``Delta^{N-1}``), ``c`` the privacy parameter: client ``i`` marks
``C_i^l = c X_i^l K`` of its class-``l`` examples as non-private.

Everything is batched: a leading axis ``S`` (simulations) is allowed on every array so that
thousands of independent draws are made with a few vectorised calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "single_class_proportions",
    "dirichlet_proportions",
    "iid_proportions",
    "proportions_to_counts",
    "nonprivate_counts",
    "heterogeneity",
    "HeterogeneousPartition",
    "assign_examples",
    "make_partition",
]


def _check_pos_int(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_c(c: float) -> float:
    if not (0.0 <= float(c) <= 1.0):
        raise ValueError(f"c must lie in [0, 1], got {c!r}")
    return float(c)


def single_class_proportions(n_clients: int, n_classes: int) -> np.ndarray:
    """Single-class setting: client ``i`` holds only class ``i`` (``X^l = e^l``, ``N = L``).

    Source: Makkonen et al., Sec. II-B, model 1; ``||X^l - Theta*||^2 = (N-1)/N``.

    Parameters
    ----------
    n_clients : int
        Number of clients ``N``.
    n_classes : int
        Number of classes ``L``; must equal ``N``.

    Returns
    -------
    ndarray, shape (L, N), float64
        The identity matrix.

    Raises
    ------
    ValueError
        If ``n_clients != n_classes``.
    """
    n = _check_pos_int("n_clients", n_clients)
    L = _check_pos_int("n_classes", n_classes)
    if n != L:
        raise ValueError(
            f"the single-class setting needs n_clients == n_classes, got {n} and {L}"
        )
    return np.eye(L)


def dirichlet_proportions(
    n_clients: int,
    n_classes: int,
    alpha: float,
    rng: np.random.Generator | int | None = None,
    size: int | None = None,
) -> np.ndarray:
    """Per-class Dirichlet proportions ``X^l ~ Dir_N(alpha)`` (Makkonen et al., Sec. II-B, model 2).

    Parameters
    ----------
    n_clients : int
        Number of clients ``N``.
    n_classes : int
        Number of classes ``L``.
    alpha : float
        Concentration (> 0); small values are strongly heterogeneous.
    rng : Generator or int or None
        Random stream or seed.
    size : int, optional
        Number of independent draws ``S`` (leading axis).

    Returns
    -------
    ndarray, shape (L, N) or (S, L, N), float64
        Rows on the simplex.

    Raises
    ------
    ValueError
        If ``alpha`` is not positive.
    """
    n = _check_pos_int("n_clients", n_clients)
    L = _check_pos_int("n_classes", n_classes)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    rng = np.random.default_rng(rng)
    shape = (L,) if size is None else (_check_pos_int("size", size), L)
    return rng.dirichlet(np.full(n, float(alpha)), size=shape)


def iid_proportions(n_clients: int, n_classes: int) -> np.ndarray:
    """Perfectly homogeneous proportions ``X^l = Theta* = (1/N, ..., 1/N)``.

    Returns
    -------
    ndarray, shape (L, N), float64
    """
    n = _check_pos_int("n_clients", n_clients)
    L = _check_pos_int("n_classes", n_classes)
    return np.full((L, n), 1.0 / n)


def proportions_to_counts(proportions: np.ndarray, k: int) -> np.ndarray:
    """Integer example counts ``n[..., l, i]`` summing to ``K`` per class, closest to ``X K``.

    Largest-remainder (Hamilton) rounding: floor ``X K``, then give the remaining examples of
    each class to the clients with the largest fractional parts (ties to the lower index).
    Exact when ``X K`` is integer.

    Parameters
    ----------
    proportions : ndarray, shape (..., L, N)
        Rows on the simplex.
    k : int
        Examples per class ``K``.

    Returns
    -------
    ndarray, shape (..., L, N), int64
        Counts; every row sums to ``K``.

    Raises
    ------
    ValueError
        If a row is not on the simplex (tolerance 1e-9) or ``k`` is not positive.
    """
    k = _check_pos_int("k", k)
    x = np.asarray(proportions, dtype=np.float64)
    if np.any(x < -1e-12) or np.any(np.abs(x.sum(axis=-1) - 1.0) > 1e-9):
        raise ValueError("proportions: every row must be non-negative and sum to 1")
    target = np.clip(x, 0.0, None) * k
    base = np.floor(target + 1e-9).astype(np.int64)
    missing = k - base.sum(axis=-1)  # (..., L), in [0, N)
    frac = target - base
    order = np.argsort(-frac, axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1)  # position of each client in the order
    return base + (rank < missing[..., None])


def nonprivate_counts(counts: np.ndarray, c: float) -> np.ndarray:
    """Non-private examples per client and class, ``C_i^l = floor(c n_i^l)``.

    Footnote 1 of Makkonen et al. assumes ``c X_i^l K`` integer; otherwise we round *down*
    (never mark more than the fraction ``c`` as non-private).

    Parameters
    ----------
    counts : ndarray, shape (..., L, N), int
        Examples of class ``l`` at client ``i``.
    c : float
        Privacy parameter in [0, 1].

    Returns
    -------
    ndarray, same shape, int64

    Raises
    ------
    ValueError
        If ``c`` is outside [0, 1].
    """
    c = _check_c(c)
    return np.floor(c * np.asarray(counts) + 1e-9).astype(np.int64)


def heterogeneity(proportions: np.ndarray) -> np.ndarray:
    """Squared distance ``||X^l - Theta*||^2`` of each class's proportions from uniform.

    Parameters
    ----------
    proportions : ndarray, shape (..., N)
        Rows on the simplex.

    Returns
    -------
    ndarray, shape (...,)
    """
    x = np.asarray(proportions, dtype=np.float64)
    return np.sum((x - 1.0 / x.shape[-1]) ** 2, axis=-1)


@dataclass(frozen=True)
class HeterogeneousPartition:
    """Batched assignment of ``M`` examples to ``N`` owners with a non-private mask.

    Attributes
    ----------
    labels : ndarray, shape (S, M), int64
        Class of each example (examples sorted by class: ``K`` of class 0, then class 1, ...).
    owner : ndarray, shape (S, M), int64
        Client that initially owns each example.
    nonprivate : ndarray, shape (S, M), bool
        Whether the example is non-private (may be shared).
    counts : ndarray, shape (S, L, N), int64
        ``n_i^l``: examples of class ``l`` owned by client ``i``.
    n_clients : int
        ``N``.
    """

    labels: np.ndarray
    owner: np.ndarray
    nonprivate: np.ndarray
    counts: np.ndarray
    n_clients: int

    @property
    def n_sims(self) -> int:
        """Number of simulations ``S``."""
        return int(self.owner.shape[0])

    @property
    def n_examples(self) -> int:
        """Number of examples ``M``."""
        return int(self.owner.shape[1])

    def holders(self) -> np.ndarray:
        """Ownership as a (S, N, M) boolean matrix (before any sharing)."""
        return self.owner[:, None, :] == np.arange(self.n_clients)[None, :, None]


def assign_examples(
    counts: np.ndarray, c: float, rng: np.random.Generator | int | None = None
) -> HeterogeneousPartition:
    """Assign ``M = K L`` class-sorted examples to owners and mark non-private ones.

    Within each class the ``K`` examples are dealt in a uniformly random order: client ``i``
    gets ``n_i^l`` of them, of which ``floor(c n_i^l)`` (:func:`nonprivate_counts`), chosen
    uniformly at random, are non-private (Makkonen et al., Sec. II-B: the non-private
    fraction is spread evenly over the classes).

    Parameters
    ----------
    counts : ndarray, shape (S, L, N) or (L, N), int
        ``n_i^l`` per simulation; every class row must sum to the same ``K``.
    c : float
        Privacy parameter in [0, 1].
    rng : Generator or int or None
        Random stream or seed.

    Returns
    -------
    HeterogeneousPartition

    Raises
    ------
    ValueError
        If rows do not all sum to the same ``K`` or ``c`` is outside [0, 1].
    """
    c = _check_c(c)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim == 2:
        counts = counts[None]
    if counts.ndim != 3 or np.any(counts < 0):
        raise ValueError(f"counts must be non-negative of shape (S, L, N), got {counts.shape}")
    k = counts.sum(axis=-1)
    if np.any(k != k.flat[0]):
        raise ValueError("counts: every class must have the same number K of examples")
    s, L, n = counts.shape
    k = int(k.flat[0])
    rng = np.random.default_rng(rng)
    npriv = nonprivate_counts(counts, c)
    # per (sim, class): a random permutation of the K slots; slot r goes to the client whose
    # cumulative range contains r, and is non-private if it is among the first C_i^l of that
    # client's range.
    ends = np.cumsum(counts, axis=-1)  # (S, L, N)
    starts = ends - counts
    slots = np.arange(k)
    owner_sorted = (slots[None, None, :, None] >= ends[..., None, :]).sum(-1)  # (S, L, K)
    start_of_owner = np.take_along_axis(starts, owner_sorted, axis=-1)
    np_of_owner = np.take_along_axis(npriv, owner_sorted, axis=-1)
    nonpriv_sorted = (slots[None, None, :] - start_of_owner) < np_of_owner
    perm = np.argsort(rng.random((s, L, k)), axis=-1)
    owner = np.take_along_axis(owner_sorted, perm, axis=-1).reshape(s, L * k)
    nonpriv = np.take_along_axis(nonpriv_sorted, perm, axis=-1).reshape(s, L * k)
    labels = np.broadcast_to(np.repeat(np.arange(L), k), (s, L * k)).astype(np.int64)
    return HeterogeneousPartition(
        labels=np.ascontiguousarray(labels),
        owner=owner.astype(np.int64),
        nonprivate=nonpriv,
        counts=counts,
        n_clients=n,
    )


def make_partition(
    setting: str,
    n_clients: int,
    n_classes: int,
    k: int,
    c: float,
    n_sims: int = 1,
    alpha: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> HeterogeneousPartition:
    """Draw ``n_sims`` partitions of ``M = K L`` examples in one of the paper's settings.

    Parameters
    ----------
    setting : {"single-class", "dirichlet", "iid", "homogeneous"}
        ``"single-class"``: ``X^l = e^l`` (``N = L``); ``"dirichlet"``: ``X^l ~ Dir_N(alpha)``,
        counts by :func:`proportions_to_counts`; ``"iid"``: the ``M`` examples shuffled and
        dealt ``M / N`` to each client (Makkonen et al., Sec. IV-A (i)); ``"homogeneous"``:
        ``K / N`` of every class to each client.
    n_clients, n_classes, k : int
        ``N``, ``L``, ``K``.
    c : float
        Privacy parameter in [0, 1].
    n_sims : int
        Number of independent draws ``S``.
    alpha : float, optional
        Dirichlet concentration (``"dirichlet"`` only).
    rng : Generator or int or None
        Random stream or seed.

    Returns
    -------
    HeterogeneousPartition

    Raises
    ------
    ValueError
        For an unknown ``setting`` or invalid parameters.
    """
    rng = np.random.default_rng(rng)
    n = _check_pos_int("n_clients", n_clients)
    L = _check_pos_int("n_classes", n_classes)
    k = _check_pos_int("k", k)
    s = _check_pos_int("n_sims", n_sims)
    if setting == "single-class":
        counts = np.broadcast_to(proportions_to_counts(single_class_proportions(n, L), k), (s, L, n))
    elif setting == "dirichlet":
        if alpha is None:
            raise ValueError("alpha is required for setting='dirichlet'")
        counts = proportions_to_counts(dirichlet_proportions(n, L, alpha, rng, size=s), k)
    elif setting == "homogeneous":
        counts = np.broadcast_to(proportions_to_counts(iid_proportions(n, L), k), (s, L, n))
    elif setting == "iid":
        m = k * L
        if m % n:
            raise ValueError(f"setting='iid' needs n_clients to divide M = {m}, got {n}")
        per = m // n
        slots = np.argsort(rng.random((s, m)), axis=-1)  # slot of each example
        owner = slots // per
        labels = np.repeat(np.arange(L), k)
        counts = np.zeros((s, L, n), np.int64)
        np.add.at(counts, (np.arange(s)[:, None], labels[None, :], owner), 1)
        return assign_examples(counts, c, rng)
    else:
        raise ValueError(
            "setting must be 'single-class', 'dirichlet', 'iid' or 'homogeneous', "
            f"got {setting!r}"
        )
    return assign_examples(np.ascontiguousarray(counts), c, rng)
