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
    check_field_capacity,
    check_prime,
    distinct_points,
    field_dtype,
    from_field,
    lagrange_coefficients,
    to_field,
    uniform,
)
from fednet.algebra.modp import lincomb_mod, sum_mod

__all__ = [
    "lcc_encode",
    "lcc_decode",
    "lcc_recovery_threshold",
    "default_lsa_points",
    "check_lsa_parameters",
    "lsa_piece_length",
    "lsa_mask_pieces",
    "lsa_encode_mask",
    "lsa_aggregate_encoded",
    "lsa_decode_aggregate_mask",
    "quantize",
    "dequantize",
]


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


def default_lsa_points(N: int, U: int) -> tuple[list[int], list[int]]:
    """Default LightSecAgg points: ``betas = 1..U`` (pieces), ``alphas = U+1..U+N`` (users), disjoint."""
    return list(range(U + 1, U + N + 1)), list(range(1, U + 1))


def check_lsa_parameters(N: int, U: int, T: int, q: int, *, quant_bits: int | None = None) -> None:
    """Validate LightSecAgg parameters: ``0 <= T < U <= N``, ``q`` an odd prime, ``q > N + U``
    (distinct points) and, with ``quant_bits`` = b, room for the sum of ``U`` quantised values of
    magnitude ``2^b`` (one unit of gradient each: ``q > 2 U 2^b``; the data-dependent sums are
    checked again by :func:`quantize` as they are formed).

    Raises
    ------
    ValueError
        Naming the violated parameter and its value.
    fednet.errors.CapacityError
        If the field cannot carry ``U`` quantised units (with the smallest prime that works).
    """
    check_prime(q)
    if int(q) == 2:
        raise ValueError("q must be an odd prime (the signed map needs q > 2), got 2")
    if not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    if not isinstance(T, (int, np.integer)) or T < 0:
        raise ValueError(f"T must be a non-negative integer, got {T!r}")
    if not isinstance(U, (int, np.integer)) or not T < U <= N:
        raise ValueError(f"U must satisfy T = {T} < U <= N = {N}, got {U!r}")
    if int(q) <= N + U:
        raise ValueError(f"q = {q} too small for N + U = {N + U} distinct points")
    if quant_bits is not None:
        check_field_capacity(q, int(U) << int(quant_bits),
                             what=f"the sum of U = {U} quantised units 2^quant_bits = 2^{quant_bits}")


def lsa_piece_length(d: int, U: int, T: int) -> int:
    """Length ``L = ceil(d / (U - T))`` of a mask piece (LightSecAgg)."""
    if U <= T:
        raise ValueError(f"U must exceed T, got U = {U}, T = {T}")
    return -(-int(d) // (int(U) - int(T)))


def lsa_mask_pieces(z: np.ndarray, U: int, T: int, q: int, rng: np.random.Generator) -> np.ndarray:
    """Split a mask into ``U - T`` pieces and append ``T`` uniform noise pieces.

    Parameters
    ----------
    z : ndarray, shape (d,), over GF(q)
        The user's mask.
    U, T : int
    q : int
    rng : numpy.random.Generator
        Draws the noise pieces (uniform over GF(q), never zero-filled).

    Returns
    -------
    ndarray, shape (U, L), over GF(q)
        Rows ``0..U-T-1``: the zero-padded mask pieces; rows ``U-T..U-1``: noise.
    """
    z = as_field(z, q, name="z")
    if z.ndim != 1:
        raise ValueError(f"z must be a vector, got shape {z.shape}")
    L = lsa_piece_length(z.size, U, T)
    pieces = np.zeros((U, L), dtype=field_dtype(q))
    flat = pieces[: U - T].reshape(-1)
    flat[: z.size] = z
    pieces[: U - T] = flat.reshape(U - T, L)
    if T:
        pieces[U - T :] = uniform(rng, q, (T, L))
    return pieces


def lsa_encode_mask(
    z: np.ndarray,
    U: int,
    T: int,
    q: int,
    rng: np.random.Generator,
    alphas: Sequence[int],
    betas: Sequence[int],
) -> np.ndarray:
    """Encoded mask shares ``z~_ij = f_i(alpha_j)`` of one user for all N users (offline phase).

    Parameters
    ----------
    z : ndarray, shape (d,), over GF(q)
    U, T : int
        Target number of survivors and privacy (``T < U <= N``).
    q : int
    rng : numpy.random.Generator
    alphas : sequence of int, length N
        Users' points, disjoint from ``betas``.
    betas : sequence of int, length U
        Pieces' points.

    Returns
    -------
    ndarray, shape (N, L), over GF(q); row j goes to user j.  Charges ``N U L`` MACs.
    """
    check_lsa_parameters(len(alphas), U, T, q)
    b = distinct_points(betas, q, name="betas")
    if len(b) != U:
        raise ValueError(f"betas must have U = {U} points, got {len(b)}")
    a = distinct_points(alphas, q, name="alphas")
    _disjoint(a, b)
    pieces = lsa_mask_pieces(z, U, T, q, rng)
    return lincomb_mod(lagrange_coefficients(b, a, q), pieces, q)


def lsa_aggregate_encoded(encoded: Sequence[np.ndarray] | np.ndarray, q: int) -> np.ndarray:
    """Survivor ``j``'s upload ``s_j = sum_{i in U1} z~_ij``.

    Parameters
    ----------
    encoded : ndarray, shape (|U1|, L), over GF(q) (or a list of (L,) arrays)
        The encoded mask shares user j received from the users in U1 (its own included).

    Returns
    -------
    ndarray, shape (L,), over GF(q); charges ``(|U1| - 1) L`` MACs.
    """
    return sum_mod(list(encoded), q)


def lsa_decode_aggregate_mask(
    s: np.ndarray,
    responder_alphas: Sequence[int],
    betas: Sequence[int],
    U: int,
    T: int,
    d: int,
    q: int,
) -> np.ndarray:
    """Server: decode ``sum_{i in U1} z_i`` from the aggregated encoded masks of any ``U`` survivors.

    Parameters
    ----------
    s : ndarray, shape (R, L), over GF(q)
        Uploads ``s_j`` of ``R >= U`` responders (the first U are used).
    responder_alphas : sequence of int, length R
        Their points.
    betas : sequence of int, length U
    U, T : int
    d : int
        Model length (the padding is cut).
    q : int

    Returns
    -------
    ndarray, shape (d,), over GF(q); charges ``(U - T) U L`` MACs.

    Raises
    ------
    ValueError
        If fewer than ``U`` responders are given ("need at least U = ...").
    """
    s = np.asarray(s)
    pts = distinct_points(responder_alphas, q, name="responder_alphas")
    if len(pts) != s.shape[0]:
        raise ValueError(f"responder_alphas has {len(pts)} entries for {s.shape[0]} uploads")
    if s.shape[0] < U:
        raise ValueError(
            f"LightSecAgg decoding needs at least U = {U} aggregated encoded masks, got {s.shape[0]}"
        )
    C = lagrange_coefficients(pts[:U], list(betas)[: U - T], q)  # (U - T, U)
    pieces = lincomb_mod(C, as_field(s[:U], q, name="s"), q)
    return pieces.reshape(-1)[:d]


def quantize(x: np.ndarray, b: int, q: int, *, n_summands: int = 1) -> np.ndarray:
    """LightSecAgg quantisation ``round(x 2**b)`` mapped to GF(q) (negatives to ``q + v``).

    Parameters
    ----------
    x : ndarray of float, any shape
    b : int
        Fractional bits.
    q : int
    n_summands : int
        Number of such vectors that will be summed; the field must hold the sum without wrap-around.

    Returns
    -------
    ndarray, same shape, over GF(q).

    Raises
    ------
    ValueError
        If ``n_summands * max|round(x 2**b)|`` does not fit the signed range of GF(q) (needs
        ``|sum x| 2**b < q / 2``).
    """
    v = np.rint(np.asarray(x, dtype=np.float64) * 2.0**b)
    if v.size and not np.all(np.isfinite(v)):
        raise ValueError("quantize: x must be finite")
    m = int(np.max(np.abs(v))) if v.size else 0
    check_field_capacity(q, m * int(n_summands), what=f"sums of {n_summands} quantised values")
    if m >= 2**62:                       # beyond int64: exact Python ints (every float64 here is an integer)
        return to_field(np.array([int(t) for t in v.ravel()], dtype=object).reshape(v.shape), q)
    return to_field(v.astype(np.int64), q)


def dequantize(v: np.ndarray, b: int, q: int) -> np.ndarray:
    """Inverse of :func:`quantize`: values above ``(q-1)/2`` read as negative, divided by ``2**b``."""
    return from_field(v, q).astype(np.float64) / 2.0**b
