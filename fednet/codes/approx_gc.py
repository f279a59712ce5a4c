"""Approximate gradient coding with randomized data sharing (Makkonen et al., Sec. III).

Source: O. Makkonen, S. Niemelä, C. Hollanti, S. Kas Hanna, "Approximate gradient coding for
privacy-flexible federated learning with non-IID data". Pure math, no SimPy: arrays in,
arrays out. Every function accepts a leading batch axis ``S`` (independent simulations), so
thousands of draws run in a few vectorised calls.

Symbols (the paper's): ``N`` clients, ``M`` examples, ``K`` examples per class, ``c`` the
privacy parameter, ``d`` the replication factor, ``p`` the straggling probability,
``S_i`` the set of examples held by client ``i`` after sharing, ``d_j`` the number of clients
holding example ``j``, ``W_j = 1 / ((1 - p) d_j)`` its weight.

A *holding matrix* ``A`` of shape (S, N, M), boolean, says which client holds which example
after sharing (``A[s, i, j]`` iff ``j in S_i``). The gradient estimator of eq. (11) is
``g_hat = sum_i I_i f_i`` with ``f_i = sum_{j in S_i} W_j g_j`` (eq. 10), i.e.
``g_hat = sum_j coef_j g_j`` with ``coef_j = W_j sum_i I_i A_ij`` (:func:`estimator_coefficients`).
It is unbiased, ``E g_hat = sum_j g_j``, with covariance trace
``p / (1 - p) sum_i ||sum_{j in S_i} g_j / d_j||^2`` (:func:`estimator_variance`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.algebra.meter import axpy

__all__ = [
    "PLACEMENTS",
    "share_randomly",
    "replication_counts",
    "example_weights",
    "client_weights",
    "draw_responders",
    "estimator_coefficients",
    "estimate_gradient",
    "sum_responses",
    "received_counts",
    "shared_proportions",
    "theorem1_expected_distance",
    "estimator_variance",
    "estimator_second_moment",
]

#: How :func:`share_randomly` places a non-private example.
#: ``"bernoulli"``: at every other client independently with probability ``d / (N - 1)``
#: (Sec. III-A, second sentence; ``d_j - 1 ~ Binomial(N - 1, d / (N - 1))``).
#: ``"subset"``: at a uniformly random set of exactly ``d`` other clients (Sec. III-A, first
#: sentence; ``d_j = d + 1`` and ``B = d c K`` exactly). Both give
#: ``S_i ~ Binomial(c (1 - X_i) K, d / (N - 1))`` for each client.
PLACEMENTS = ("bernoulli", "subset")


def _check_p(p: float) -> float:
    if not (0.0 <= float(p) < 1.0):
        raise ValueError(f"p must lie in [0, 1), got {p!r}")
    return float(p)


def _holders3(holders: np.ndarray) -> np.ndarray:
    a = np.asarray(holders)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise ValueError(f"holders must have shape (S, N, M) or (N, M), got {a.shape}")
    return a


def share_randomly(
    owner: np.ndarray,
    nonprivate: np.ndarray,
    n_clients: int,
    d: int,
    rng: np.random.Generator | int | None = None,
    placement: str = "bernoulli",
) -> np.ndarray:
    """Randomized offline data sharing (Makkonen et al., Sec. III-A).

    Every example stays at its owner; every non-private example is in addition placed at
    other clients according to ``placement`` (see :data:`PLACEMENTS`).

    Parameters
    ----------
    owner : ndarray, shape (S, M) or (M,), int
        Owner of each example, in ``[0, n_clients)``.
    nonprivate : ndarray, same shape as ``owner``, bool
        Non-private examples (may be shared).
    n_clients : int
        ``N`` (>= 2).
    d : int
        Replication factor in ``{0, ..., N - 1}``.
    rng : Generator or int or None
        Random stream or seed.
    placement : {"bernoulli", "subset"}
        Placement rule.

    Returns
    -------
    ndarray, shape (S, N, M), bool
        Holding matrix ``A`` (a leading axis of 1 is added for 1-D input).

    Raises
    ------
    ValueError
        If ``d`` is outside ``[0, N - 1]``, ``placement`` is unknown or the shapes differ.
    """
    owner = np.atleast_2d(np.asarray(owner, dtype=np.int64))
    nonprivate = np.atleast_2d(np.asarray(nonprivate, dtype=bool))
    if owner.shape != nonprivate.shape:
        raise ValueError(f"owner {owner.shape} and nonprivate {nonprivate.shape} differ in shape")
    n = int(n_clients)
    if n < 2:
        raise ValueError(f"n_clients must be at least 2, got {n_clients!r}")
    if isinstance(d, bool) or int(d) != d or not (0 <= d <= n - 1):
        raise ValueError(f"d must be an integer in [0, {n - 1}], got {d!r}")
    if owner.size and (owner.min() < 0 or owner.max() >= n):
        raise ValueError(f"owner must lie in [0, {n - 1}]")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    rng = np.random.default_rng(rng)
    s, m = owner.shape
    clients = np.arange(n)[None, :, None]
    own = owner[:, None, :] == clients  # (S, N, M)
    u = rng.random((s, n, m))
    if placement == "bernoulli":
        extra = u < d / (n - 1)
    else:
        u[own] = np.inf  # the owner is never among the d receivers
        rank = np.argsort(np.argsort(u, axis=1), axis=1)
        extra = rank < d
    return own | (extra & ~own & nonprivate[:, None, :])


def replication_counts(holders: np.ndarray) -> np.ndarray:
    """``d_j``: number of clients holding each example.

    Parameters
    ----------
    holders : ndarray, shape (S, N, M) or (N, M), bool

    Returns
    -------
    ndarray, shape (S, M), int64
    """
    return _holders3(holders).sum(axis=1).astype(np.int64)


def example_weights(holders: np.ndarray, p: float) -> np.ndarray:
    """Weights ``W_j = 1 / ((1 - p) d_j)`` (Makkonen et al., Sec. III-B).

    Parameters
    ----------
    holders : ndarray, shape (S, N, M) or (N, M), bool
    p : float
        Straggling probability in [0, 1).

    Returns
    -------
    ndarray, shape (S, M), float64

    Raises
    ------
    ValueError
        If ``p`` is outside [0, 1) or some example is held by nobody.
    """
    p = _check_p(p)
    dj = replication_counts(holders)
    if np.any(dj == 0):
        raise ValueError("holders: every example must be held by at least one client")
    return 1.0 / ((1.0 - p) * dj)


def client_weights(holders: np.ndarray, p: float) -> np.ndarray:
    """Per-client weight rows: ``w[s, i, j] = W_j`` if ``j in S_i`` else 0 (eq. 10).

    Client ``i`` sends ``f_i = sum_j w[i, j] g_j``.

    Parameters
    ----------
    holders : ndarray, shape (S, N, M) or (N, M), bool
    p : float

    Returns
    -------
    ndarray, shape (S, N, M), float64
    """
    a = _holders3(holders)
    return a * example_weights(a, p)[:, None, :]


def draw_responders(
    rng: np.random.Generator | int | None, shape: tuple[int, ...], p: float
) -> np.ndarray:
    """Responding clients ``I_i ~ Bernoulli(1 - p)``, independent (Makkonen et al., Sec. II-B).

    Parameters
    ----------
    rng : Generator or int or None
    shape : tuple of int
        E.g. (S, N) or (rounds, S, N).
    p : float
        Straggling probability in [0, 1).

    Returns
    -------
    ndarray of bool, shape ``shape``
    """
    p = _check_p(p)
    return np.random.default_rng(rng).random(shape) >= p


def estimator_coefficients(holders: np.ndarray, responding: np.ndarray, p: float) -> np.ndarray:
    """``coef_j = W_j sum_i I_i A_ij`` so that ``g_hat = sum_j coef_j g_j`` (eqs. 10-11).

    Parameters
    ----------
    holders : ndarray, shape (S, N, M), bool
    responding : ndarray, shape (..., S, N), bool
        ``I_i`` (extra leading axes, e.g. straggler draws, broadcast).
    p : float

    Returns
    -------
    ndarray, shape (..., S, M), float64
    """
    a = _holders3(holders)
    resp = np.asarray(responding, dtype=np.float64)
    if resp.shape[-2:] != a.shape[:2]:
        raise ValueError(f"responding has shape {resp.shape}, expected (..., {a.shape[0]}, {a.shape[1]})")
    cover = np.einsum("...sn,snm->...sm", resp, a.astype(np.float64))
    return cover * example_weights(a, p)


def estimate_gradient(example_grads: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``g_hat = sum_j coef_j g_j`` (eq. 11) from explicit per-example gradients.

    Parameters
    ----------
    example_grads : ndarray, shape (S, M, q)
        Per-example gradients, flattened to ``q`` entries.
    coef : ndarray, shape (..., S, M)
        From :func:`estimator_coefficients`.

    Returns
    -------
    ndarray, shape (..., S, q)
    """
    return np.einsum("...sm,smq->...sq", coef, np.asarray(example_grads))


def received_counts(
    holders: np.ndarray, owner: np.ndarray, labels: np.ndarray, n_classes: int
) -> np.ndarray:
    """``S_i^l``: examples of class ``l`` that client ``i`` received (held but not owned).

    Parameters
    ----------
    holders : ndarray, shape (S, N, M), bool
    owner : ndarray, shape (S, M), int
    labels : ndarray, shape (S, M) or (M,), int
    n_classes : int

    Returns
    -------
    ndarray, shape (S, L, N), int64
    """
    a = _holders3(holders)
    s, n, m = a.shape
    owner = np.broadcast_to(np.asarray(owner), (s, m))
    labels = np.broadcast_to(np.asarray(labels), (s, m))
    got = a & (owner[:, None, :] != np.arange(n)[None, :, None])
    onehot = labels[:, :, None] == np.arange(n_classes)[None, None, :]  # (S, M, L)
    return np.einsum("snm,sml->sln", got.astype(np.int64), onehot.astype(np.int64))


def shared_proportions(
    counts: np.ndarray, received: np.ndarray, b: np.ndarray | float | None = None
) -> np.ndarray:
    """Label proportions after sharing, ``Y = (X K + S) / (K + B)`` (eq. 1).

    Parameters
    ----------
    counts : ndarray, shape (..., L, N)
        ``X_i^l K``: examples of class ``l`` owned by client ``i`` before sharing.
    received : ndarray, shape (..., L, N)
        ``S_i^l``.
    b : float or ndarray, optional
        ``B``; default the realised ``sum_i S_i^l``. Pass ``d c K`` to use the value the proof
        of Theorem 1 uses (exact for ``placement="subset"``).

    Returns
    -------
    ndarray, shape (..., L, N), float64
    """
    counts = np.asarray(counts, dtype=np.float64)
    received = np.asarray(received, dtype=np.float64)
    k = counts.sum(axis=-1, keepdims=True)
    if b is None:
        b = received.sum(axis=-1, keepdims=True)
    else:
        b = np.asarray(b, dtype=np.float64)
        if b.ndim:
            b = b[..., None]
    return (counts + received) / (k + b)


def theorem1_expected_distance(
    x: np.ndarray, k: int, c: float, d: int
) -> np.ndarray:
    """Closed form of ``E[||Y - Theta*||^2 | X]`` (Makkonen et al., Theorem 1).

    ``dc (N-1-d) / ((1+dc)^2 (N-1) K) + (N-1-dc)^2 / ((1+dc)^2 (N-1)^2) ||X - Theta*||^2``.

    Parameters
    ----------
    x : ndarray, shape (..., N)
        Proportions of one class before sharing (rows on the simplex).
    k : int
        ``K``, examples per class.
    c : float
        Privacy parameter in [0, 1].
    d : int
        Replication factor in ``{0, ..., N - 1}``.

    Returns
    -------
    ndarray, shape (...,)

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < 2:
        raise ValueError(f"x must have at least 2 clients on its last axis, got {n}")
    if not (0.0 <= c <= 1.0):
        raise ValueError(f"c must lie in [0, 1], got {c!r}")
    if int(d) != d or not (0 <= d <= n - 1):
        raise ValueError(f"d must be an integer in [0, {n - 1}], got {d!r}")
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    dc = d * c
    dist0 = np.sum((x - 1.0 / n) ** 2, axis=-1)
    return dc * (n - 1 - d) / ((1 + dc) ** 2 * (n - 1) * k) + (n - 1 - dc) ** 2 / (
        (1 + dc) ** 2 * (n - 1) ** 2
    ) * dist0


def _client_sums_sq(gram: np.ndarray, a_over_d: np.ndarray) -> np.ndarray:
    # ||sum_j a_ij g_j||^2 = a_i^T G a_i
    return np.einsum("snm,smk,snk->sn", a_over_d, gram, a_over_d)


def estimator_variance(holders: np.ndarray, gram: np.ndarray, p: float) -> np.ndarray:
    """``E||g_hat - g||^2 = p / (1 - p) sum_i ||sum_{j in S_i} g_j / d_j||^2``.

    Over the straggler draws, for fixed holdings and gradients (Makkonen et al., Sec. III-B:
    ``Var(I_i) = p (1 - p)`` and ``f_i = (1/(1-p)) sum_{j in S_i} g_j / d_j``).

    Parameters
    ----------
    holders : ndarray, shape (S, N, M), bool
    gram : ndarray, shape (S, M, M)
        Gram matrix of the per-example gradients, ``gram[s, j, k] = <g_j, g_k>``.
    p : float

    Returns
    -------
    ndarray, shape (S,)
    """
    p = _check_p(p)
    a = _holders3(holders)
    a_over_d = a / replication_counts(a)[:, None, :]
    return p / (1.0 - p) * _client_sums_sq(np.asarray(gram), a_over_d).sum(axis=-1)


def estimator_second_moment(holders: np.ndarray, gram: np.ndarray, p: float) -> np.ndarray:
    """``E||g_hat||^2 = ||sum_j g_j||^2 + estimator_variance`` (unbiasedness).

    Parameters
    ----------
    holders : ndarray, shape (S, N, M), bool
    gram : ndarray, shape (S, M, M)
    p : float

    Returns
    -------
    ndarray, shape (S,)
    """
    gram = np.asarray(gram)
    return gram.sum(axis=(-1, -2)) + estimator_variance(holders, gram, p)


def sum_responses(responses: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The server's estimate ``g_hat = sum_i I_i f_i`` (eq. 11) from the responses that arrived.

    Parameters
    ----------
    responses : sequence of ndarray, each of shape ``shape``
        The present clients' weighted sums ``f_i`` (eq. 10), in order of arrival.
    shape : tuple of int
        Shape of the model (``(F, L)``).

    Returns
    -------
    ndarray, ``shape``, float64
        Zeros plus every response in the given order; charges one MAC per element and response
        (:func:`fednet.algebra.meter.axpy`).
    """
    total = np.zeros(shape)
    for f in responses:
        total = axpy(1.0, f, total)
    return total
