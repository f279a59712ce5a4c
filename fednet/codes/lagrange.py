"""Lagrange coded computing and the LightSecAgg mask code over GF(q).

Lagrange coded computing (LCC): Yu, Li, Raviv, Kalan, Soltanolkotabi, Avestimehr, "Lagrange coded
computing", AISTATS 2019.  ``K`` data blocks and ``T`` uniform noise blocks are interpolated by a
polynomial ``u`` of degree ``K + T - 1`` through points ``beta_1..beta_{K+T}``; worker ``j`` gets
``u(alpha_j)``.  The alphas must be disjoint from the betas (a systematic choice is not T-private).
A polynomial ``f`` of degree ``deg_f`` applied by the workers gives ``f(u(alpha_j))``, from which any
``deg_f (K + T - 1) + 1`` results interpolate ``f(X_k) = f(u(beta_k))``.

LightSecAgg mask code: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg", MLSys 2022
(summary and test vectors in ``shared/references.md``).  User ``i``'s mask ``z_i`` in GF(q)^d is
split into ``U - T`` pieces of length ``L = ceil(d / (U - T))`` (zero padded), ``T`` uniform noise
pieces are appended, the ``U`` pieces are interpolated at ``beta_1..beta_U`` (degree ``U - 1``) and
evaluated at the users' points ``alpha_j``: ``z~_ij = f_i(alpha_j)``.  A surviving user ``j`` uploads
``s_j = sum_{i in U1} z~_ij``; from any ``U`` of them the server interpolates the first ``U - T``
pieces of ``sum_{i in U1} z_i``.  This is LCC with ``K = U - T`` blocks and ``deg f = 1``.

Known pitfalls avoided here: dot products are exact for any q (limb kernels, never int64
accumulation); noise pieces are drawn uniformly (never zero); ``U`` is a parameter (``T < U <= N``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fednet.algebra.fields import (
    as_field,
    distinct_points,
    field_dtype,
    lagrange_coefficients,
    uniform,
)
from fednet.algebra.modp import lincomb_mod

__all__ = [
    "lcc_encode",
    "lcc_decode",
    "lcc_recovery_threshold",
]

# The LightSecAgg mask code moved to fednet.codes.lightsecagg and the quantisation to
# fednet.algebra.quantize (issue 9); import them from there.


def _disjoint(alphas: Sequence[int], betas: Sequence[int]) -> None:
    common = set(int(a) for a in alphas) & set(int(b) for b in betas)
    if common:
        raise ValueError(f"alphas must be disjoint from betas (T-privacy), common points {sorted(common)}")


def lcc_recovery_threshold(K: int, T: int, deg_f: int) -> int:
    """Number of worker results needed by LCC: ``deg_f * (K + T - 1) + 1`` (Yu et al., Thm. 1)."""
    return int(deg_f) * (int(K) + int(T) - 1) + 1


def lcc_encode(
    blocks: np.ndarray,
    T: int,
    alphas: Sequence[int],
    betas: Sequence[int],
    q: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """LCC-encode ``K`` blocks with ``T``-privacy for ``N = len(alphas)`` workers.

    Parameters
    ----------
    blocks : ndarray, shape (K, *S), over GF(q)
        Data blocks ``X_1..X_K``.
    T : int
        Privacy parameter (number of colluding workers), ``T >= 0``.
    alphas : sequence of int, length N
        Workers' evaluation points, disjoint from ``betas``.
    betas : sequence of int, length K + T
        Interpolation points of the data (first K) and noise (last T) blocks.
    q : int
    rng : numpy.random.Generator
        Draws the T uniform noise blocks.

    Returns
    -------
    ndarray, shape (N, *S), over GF(q)
        ``u(alpha_j)``; charges ``N (K + T) size`` MACs.

    Raises
    ------
    ValueError
        If ``len(betas) != K + T``, points are not distinct, or alphas meet betas.
    """
    blocks = as_field(blocks, q, name="blocks")
    K = blocks.shape[0]
    if not isinstance(T, (int, np.integer)) or T < 0:
        raise ValueError(f"T must be a non-negative integer, got {T!r}")
    b = distinct_points(betas, q, name="betas")
    a = distinct_points(alphas, q, name="alphas")
    if len(b) != K + T:
        raise ValueError(f"betas must have K + T = {K + T} points, got {len(b)}")
    _disjoint(a, b)
    stacked = np.empty((K + T,) + blocks.shape[1:], dtype=field_dtype(q))
    stacked[:K] = blocks
    if T:
        stacked[K:] = uniform(rng, q, (T,) + blocks.shape[1:])
    return lincomb_mod(lagrange_coefficients(b, a, q), stacked, q)


def lcc_decode(
    results: np.ndarray,
    result_alphas: Sequence[int],
    betas: Sequence[int],
    K: int,
    T: int,
    deg_f: int,
    q: int,
) -> np.ndarray:
    """Recover ``f(X_1..X_K)`` from LCC results ``f(u(alpha_j))``.

    Parameters
    ----------
    results : ndarray, shape (R, *S'), over GF(q)
        Results of the responding workers, ``R >= deg_f (K + T - 1) + 1`` (the first that many are used).
    result_alphas : sequence of int, length R
        The responders' points.
    betas : sequence of int, length >= K
        The encoding's interpolation points (the first K are the data points).
    K, T, deg_f : int
        Number of data blocks, privacy, degree of the computed polynomial.
    q : int

    Returns
    -------
    ndarray, shape (K, *S'), over GF(q); charges ``K * threshold * size`` MACs.

    Raises
    ------
    ValueError
        If fewer results than the recovery threshold are given.
    """
    results = np.asarray(results)
    need = lcc_recovery_threshold(K, T, deg_f)
    pts = distinct_points(result_alphas, q, name="result_alphas")
    if len(pts) != results.shape[0]:
        raise ValueError(f"result_alphas has {len(pts)} entries for {results.shape[0]} results")
    if results.shape[0] < need:
        raise ValueError(
            f"LCC decoding needs deg_f (K + T - 1) + 1 = {need} results, got {results.shape[0]}"
        )
    C = lagrange_coefficients(pts[:need], list(betas)[:K], q)
    return lincomb_mod(C, as_field(results[:need], q, name="results"), q)
