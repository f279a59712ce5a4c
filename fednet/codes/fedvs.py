"""FedVS math as pure functions: powers, quantisation, LCC shares of data and models, coded embeddings, decoding.

Li, Yao, Liu, "FedVS: Straggler-Resilient and Privacy-Preserving Vertical Federated Learning for Split
Models" (ICML 2023), Sec. 4 (Algorithm 1).  Client ``n`` holds the feature block ``X_n`` (M, d_n) and a
``D_n``-layer polynomial network ``H_n = sum_i X_n^i W_n^i`` (eq. 1, element-wise powers, W_n^i (d_n, h)).

* Data preparation (Sec. 4.2): ``X_hat_n = (X_n^1, ..., X_n^{D_n})`` side by side, (M, d_n D_n);
  ``X_bar_n = phi(Round(2^{l_x} X_hat_n))``; rows split into K segments; T uniform masks; the LCC
  polynomial ``F_n`` of eq. (2) through ``beta_1..beta_{K+T}``, evaluated at ``alpha_1..alpha_N``.
* Each round (Sec. 4.3): ``W_bar_n = phi(Round_stoc(2^{l_w} W_n))`` (eq. 3), the model polynomial ``G_n``
  of eq. (4) (``W_bar_n`` at every ``beta_k``, k <= K, masks at ``beta_{K+1..K+T}``), client ``n'``'s
  coded embedding ``H~_n' = sum_n X~_{n,n'} W~_{n,n'}`` (eq. 5) = ``psi(alpha_n')`` with ``psi`` of
  eq. (6) of degree ``2(K + T - 1)``; the server interpolates ``psi`` from any ``2(K+T-1)+1`` results,
  reads ``sum_n H_bar_{n,k} = psi(beta_k)`` and dequantises with eq. (7).

Field elements are canonical int64 (the prime must be below ``2**62``, :mod:`fednet.algebra.fields`);
every product goes through the exact limb kernels of :mod:`fednet.algebra.modp` (never int64
accumulation) and charges its MACs to the meter.  Secrets (masks, the stochastic rounding) come from
generators the caller passes in, never from the public seed.

Choices the paper leaves open, fixed here: ``beta_k = k`` (k = 1..K+T) and ``alpha_n = K + T + n``
(n = 1..N), disjoint as eq. (2) requires; ``Round(x) = floor(x + 1/2)`` (the paper's definition: ties up);
eq. (7)'s case split at ``(p - 1)/2`` is read as the usual signed map (values above ``(p-1)/2`` are
negative), which agrees with eq. (7) everywhere except the single point ``x = (p-1)/2`` that a correctly
sized field never produces (:func:`required_modulus` keeps ``|sum| < (p-1)/2``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from fednet.algebra.fields import (
    INT64_FIELD_LIMIT,
    check_prime,
    from_field,
    lagrange_coefficients,
    next_prime_above,
    to_field,
    uniform,
)
from fednet.algebra.capacity import check_resolution
from fednet.algebra.meter import charge, kernel
from fednet.algebra.modp import lincomb_mod, matmul_mod
from fednet.algebra.shape import Shape
from fednet.errors import ConfigError, FednetError
from fednet.algebra.quantize import stochastic_round  # Round_stoc of eq. (3)

try:  # the project-wide error family, where this checkout has it (branch reliability)
    from fednet.errors import CapacityError as _CapacityBase  # type: ignore
    from fednet.errors import DecodeFailure as _DecodeBase  # type: ignore
except ImportError:  # pragma: no cover - depends on the merge state
    _CapacityBase = ValueError
    _DecodeBase = RuntimeError

__all__ = [
    "FedVSDecodeFailure",
    "WeightsOutgrowField",
    "check_fits",
    "FieldTooSmall",
    "default_points",
    "recovery_threshold",
    "max_stragglers",
    "powers",
    "round_half_up",
    "quantize_data",
    "stochastic_round",
    "quantize_model",
    "split_segments",
    "batch_segments",
    "draw_masks",
    "lagrange_shares",
    "share_data",
    "batch_data_shares",
    "share_model",
    "model_shares",
    "coded_embedding",
    "decode_embedding_sum",
    "dequantize",
    "plain_quantized_sum",
    "plain_sum_int64",
    "share_macs",
    "coded_embedding_macs",
    "decode_macs",
    "embedding_bound",
    "required_modulus",
    "check_modulus",
]


class FedVSDecodeFailure(_DecodeBase):
    """Fewer coded embeddings than ``2(K + T - 1) + 1``: ``psi`` cannot be interpolated (Thm. 5.1).

    Subclasses ``fednet.errors.DecodeFailure`` where that module exists, else ``RuntimeError``.

    Attributes
    ----------
    received, needed : int
        Distinct evaluations given and the recovery threshold.
    """

    def __init__(self, received: int, needed: int, K: int, T: int):
        self.received, self.needed = int(received), int(needed)
        super().__init__(
            f"FedVS decoding needs 2(K + T - 1) + 1 = 2({K} + {T} - 1) + 1 = {needed} coded embeddings, "
            f"got {received}"
        )


class FieldTooSmall(_CapacityBase):
    """The prime ``p`` cannot carry the embedding sum; the message names the smallest sufficient prime.

    Subclasses ``fednet.errors.CapacityError`` where that module exists, else ``ValueError``.

    Attributes
    ----------
    p, smallest : int
        The refused prime and the smallest prime that suffices.
    """

    def __init__(self, p: int, bound: int, smallest: int):
        self.p, self.bound, self.smallest = int(p), int(bound), int(smallest)
        super().__init__(
            f"p = {p} ({int(p).bit_length()} bits) is too small for FedVS embedding sums of magnitude up to "
            f"{bound} ({int(bound).bit_length()} bits): need p > 2*bound + 1; the smallest sufficient prime is "
            f"{smallest} ({int(smallest).bit_length()} bits)"
        )


def _int(v, name: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _prime(p) -> int:
    return _prime_cached(_int(p, "p", 3))


@lru_cache(maxsize=64)
def _prime_cached(p: int) -> int:
    p = check_prime(p)
    if p >= INT64_FIELD_LIMIT:
        raise ValueError(f"p must be below 2**62 (int64 storage), got {p} ({p.bit_length()} bits)")
    return p


def default_points(K: int, T: int, N: int) -> tuple[list[int], list[int]]:
    """Evaluation points: ``betas = [1..K+T]`` and ``alphas = [K+T+1..K+T+N]`` (disjoint, eq. 2).

    Returns
    -------
    (alphas, betas) : list of int (length N), list of int (length K + T)
    """
    K, T, N = _int(K, "K", 1), _int(T, "T", 0), _int(N, "N", 1)
    return list(range(K + T + 1, K + T + N + 1)), list(range(1, K + T + 1))


def recovery_threshold(K: int, T: int) -> int:
    """``2(K + T - 1) + 1``: results needed to interpolate ``psi`` of degree ``2(K + T - 1)`` (Thm. 5.1)."""
    return 2 * (_int(K, "K", 1) + _int(T, "T", 0) - 1) + 1


def max_stragglers(N: int, K: int, T: int) -> int:
    """``N - 2(K + T - 1) - 1``: stragglers FedVS tolerates (Thm. 5.1); negative means infeasible."""
    return _int(N, "N", 1) - recovery_threshold(K, T)


def powers(x: np.ndarray, D: int) -> np.ndarray:
    """``X_hat = (X^1, ..., X^D)`` side by side (Alg. 1, line 3; element-wise powers).

    Parameters
    ----------
    x : ndarray of float, shape (M, d)
    D : int
        Number of PN layers ``D_n >= 1``.

    Returns
    -------
    ndarray of float64, shape (M, d D); column block ``i - 1`` holds ``X^i``.
    """
    D = _int(D, "D", 1)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (M, d), got shape {x.shape}")
    return np.concatenate([x**i for i in range(1, D + 1)], axis=1)


def round_half_up(x: np.ndarray) -> np.ndarray:
    """``Round`` of Sec. 4.2: ``floor(x)`` if ``x - floor(x) < 1/2`` else ``floor(x) + 1``; int64."""
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def quantize_data(x_hat: np.ndarray, l_x: int, p: int) -> np.ndarray:
    """``X_bar = phi(Round(2^{l_x} X_hat))`` (Sec. 4.2), element-wise.

    Parameters
    ----------
    x_hat : ndarray of float, any shape
    l_x : int
        Scaling bits of the data.
    p : int
        Prime below 2**62.

    Returns
    -------
    ndarray of int64, same shape, over GF(p).

    Raises
    ------
    ValueError
        If a rounded value falls outside the signed range of GF(p), or the data are not finite.
    """
    p, l_x = _prime(p), _int(l_x, "l_x")
    x_hat = np.asarray(x_hat, dtype=np.float64)
    if x_hat.size and not np.all(np.isfinite(x_hat)):
        raise ValueError("x_hat must be finite")
    return to_field(round_half_up(np.ldexp(x_hat, l_x)), p, name="Round(2^l_x X_hat)")


def quantize_model(w: np.ndarray, l_w: int, p: int, rng: np.random.Generator) -> np.ndarray:
    """``W_bar = phi(Round_stoc(2^{l_w} W))`` (eq. 3).

    Parameters
    ----------
    w : ndarray of float, shape (d D, h)
        The stacked PN weights ``(W^1; ...; W^D)``.
    l_w : int
    p : int
    rng : numpy.random.Generator
        The client's secret rounding stream.

    Returns
    -------
    ndarray of int64, same shape, over GF(p).

    Raises
    ------
    ValueError
        If a value leaves the signed range of GF(p) or is not finite.
    """
    p, l_w = _prime(p), _int(l_w, "l_w")
    w = np.asarray(w, dtype=np.float64)
    if w.size and not np.all(np.isfinite(w)):
        raise ValueError("w must be finite")
    return to_field(stochastic_round(np.ldexp(w, l_w), rng), p, name="Round_stoc(2^l_w W)")


def split_segments(x: np.ndarray, K: int) -> np.ndarray:
    """Horizontal split into ``K`` equal row segments ``X_bar_{n,1..K}`` (Alg. 1, line 5).

    Parameters
    ----------
    x : ndarray, shape (M, c)
    K : int
        ``M`` must be divisible by ``K``.

    Returns
    -------
    ndarray, shape (K, M / K, c); segment ``k`` holds rows ``k M/K .. (k+1) M/K - 1``.
    """
    K = _int(K, "K", 1)
    x = np.asarray(x)
    if x.shape[0] % K:
        raise ValueError(f"the number of rows M = {x.shape[0]} must be divisible by K = {K}")
    return x.reshape((K, x.shape[0] // K) + x.shape[1:])


def batch_segments(x: np.ndarray, rows: np.ndarray, seg_rows: int, K: int, D: int, l_x: int, p: int) -> np.ndarray:
    """``X_bar`` (Sec. 4.2) of a batch: row ``rows[r]`` of each of the ``K`` segments, powers quantised.

    The set-up's data preparation (Alg. 1 lines 3-5) restricted to the rows a round uses, so that the shares of
    a batch can be materialised when the batch is used (:func:`batch_data_shares`).

    Parameters
    ----------
    x : ndarray of float, shape (M, d)
        The client's feature block.
    rows : ndarray of int, shape (b,)
        The batch's rows within a segment, in ``[0, seg_rows)``.
    seg_rows : int
        ``M / K``, the rows of a segment (segment ``k`` starts at row ``k M/K``).
    K, D, l_x, p : int
        Segments, PN layers ``D_n``, data scaling bits and the prime.

    Returns
    -------
    ndarray of int64, shape (K, b, d D), over GF(p) (no MACs metered: the set-up charges the data shares).
    """
    seg = np.stack([x[k * seg_rows + rows] for k in range(K)])  # (K, b, d)
    xh = powers(seg.reshape(-1, x.shape[1]), D)
    return quantize_data(xh, l_x, p).reshape(K, len(rows), -1)


def draw_masks(rng: np.random.Generator, p: int, T: int, shape: Sequence[int]) -> np.ndarray:
    """``T`` independent uniform masks over GF(p) (``Z_{n,K+1..K+T}`` or ``V_{n,K+1..K+T}``); shape (T, *shape)."""
    return uniform(rng, _prime(p), (_int(T, "T"),) + tuple(shape))


def lagrange_shares(blocks: np.ndarray, masks: np.ndarray, alphas: Sequence[int], betas: Sequence[int],
                    p: int) -> np.ndarray:
    """Evaluate the Lagrange polynomial through ``blocks`` (at betas[:K]) and ``masks`` (at betas[K:]) at ``alphas``.

    This is eq. (2) (data) and eq. (4) (models, with the same block repeated K times).

    Parameters
    ----------
    blocks : ndarray, shape (K, *S), over GF(p)
    masks : ndarray, shape (T, *S), over GF(p)
    alphas : sequence of int, length N (disjoint from betas)
    betas : sequence of int, length K + T
    p : int

    Returns
    -------
    ndarray of int64, shape (N, *S); charges ``N (K + T) size(S)`` MACs.

    Raises
    ------
    ValueError
        If the point sets overlap, have the wrong lengths, or the shapes disagree.
    """
    p = _prime(p)
    blocks, masks = np.asarray(blocks), np.asarray(masks)
    K, T = blocks.shape[0], masks.shape[0]
    if masks.shape[1:] != blocks.shape[1:]:
        raise ValueError(f"masks shape {masks.shape} does not match blocks shape {blocks.shape}")
    if len(betas) != K + T:
        raise ValueError(f"betas must have K + T = {K + T} points, got {len(betas)}")
    common = set(map(int, alphas)) & set(map(int, betas))
    if common:
        raise ValueError(f"alphas must be disjoint from betas (T-privacy), common points {sorted(common)}")
    stacked = np.concatenate([blocks.astype(np.int64), masks.astype(np.int64)], axis=0)
    return lincomb_mod(lagrange_coefficients(betas, alphas, p), stacked, p)


def share_data(x_bar: np.ndarray, K: int, T: int, alphas: Sequence[int], betas: Sequence[int], p: int,
               rng: np.random.Generator) -> np.ndarray:
    """Client ``n``'s data shares ``X~_{n,n'} = F_n(alpha_n')`` (eq. 2, Alg. 1 lines 5-7).

    Parameters
    ----------
    x_bar : ndarray of int64, shape (M, d_n D_n), over GF(p)
        Quantised powers of the client's features.
    K, T : int
    alphas, betas : sequences of int (N and K + T points)
    p : int
    rng : numpy.random.Generator
        The client's secret mask stream (draws ``Z_{n,K+1..K+T}``).

    Returns
    -------
    ndarray of int64, shape (N, M / K, d_n D_n); charges ``N (K + T) (M / K) d_n D_n`` MACs.
    """
    seg = split_segments(x_bar, K)
    return lagrange_shares(seg, draw_masks(rng, p, T, seg.shape[1:]), alphas, betas, p)


def batch_data_shares(x_bar: np.ndarray, data_key: int, rows: np.ndarray, T: int, alphas: Sequence[int],
                      betas: Sequence[int], p: int) -> np.ndarray:
    """Eq. (2) for one batch of coded rows: client ``n``'s shares ``F_n(alpha_1..alpha_N)`` of those rows.

    The masks come from a stream keyed by the client's secret ``data_key`` and the block (first row, number of
    rows), so a block's shares are the values the set-up would have sent, whenever they are materialised.

    Parameters
    ----------
    x_bar : ndarray of int64, shape (K, b, d D), over GF(p)
        :func:`batch_segments` of the block.
    data_key : int
        The client's secret key of its data masks.
    rows : ndarray of int, shape (b,)
        The block's rows (``rows[0]`` and ``len(rows)`` key the masks).
    T, alphas, betas, p : as :func:`share_data`

    Returns
    -------
    ndarray of int64, shape (N, b, d D); charges ``N (K + T) b d D`` MACs (:func:`share_macs`).
    """
    key = (data_key, int(rows[0]), len(rows))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))
    return lagrange_shares(x_bar, draw_masks(rng, p, T, x_bar.shape[1:]), alphas, betas, p)


def share_model(w_bar: np.ndarray, K: int, T: int, alphas: Sequence[int], betas: Sequence[int], p: int,
                rng: np.random.Generator) -> np.ndarray:
    """Client ``n``'s model shares ``W~_{n,n'} = G_n(alpha_n')`` (eq. 4, Alg. 1 lines 15-17).

    ``G_n(beta_k) = W_bar_n`` for every ``k <= K`` and ``G_n(beta_{K+t}) = V_{n,K+t}`` (uniform).

    Parameters
    ----------
    w_bar : ndarray of int64, shape (d_n D_n, h), over GF(p)
    K, T, alphas, betas, p : as :func:`share_data`
    rng : numpy.random.Generator
        The client's secret mask stream (draws ``V_{n,K+1..K+T}``).

    Returns
    -------
    ndarray of int64, shape (N, d_n D_n, h); charges ``N (K + T) d_n D_n h`` MACs.
    """
    K = _int(K, "K", 1)
    w_bar = np.asarray(w_bar)
    return model_shares(w_bar, draw_masks(rng, p, T, w_bar.shape), K, alphas, betas, p)


@kernel(macs=lambda w_bar, masks, K, alphas, betas, p: share_macs(len(alphas), K, masks.shape[0], w_bar.size),
        out=lambda w_bar, masks, K, alphas, betas, p: Shape((len(alphas),) + tuple(w_bar.shape), np.dtype(np.int64)))
def model_shares(w_bar: np.ndarray, masks: np.ndarray, K: int, alphas: Sequence[int], betas: Sequence[int],
                 p: int) -> np.ndarray:
    """Eq. (4) with the masks ``V_{n,K+1..K+T}`` already drawn: ``G_n(alpha_1..alpha_N)`` (:func:`share_model`).

    Parameters
    ----------
    w_bar : ndarray of int64, shape (d_n D_n, h), over GF(p)
    masks : ndarray of int64, shape (T, d_n D_n, h), over GF(p)
    K, alphas, betas, p : as :func:`share_model`

    Returns
    -------
    ndarray of int64, shape (N, d_n D_n, h); charges ``N (K + T) d_n D_n h`` MACs (:func:`share_macs`;
    declared, :func:`fednet.algebra.meter.kernel`).
    """
    w_bar = np.asarray(w_bar)
    return lagrange_shares(np.broadcast_to(w_bar, (_int(K, "K", 1),) + w_bar.shape), masks, alphas, betas, p)


@kernel(macs=lambda data_shares, model_shares, p: coded_embedding_macs(
            data_shares[0].shape[0], [w.shape[0] for w in model_shares], model_shares[0].shape[-1]),
        out=lambda data_shares, model_shares, p: Shape((data_shares[0].shape[0], model_shares[0].shape[-1]),
                                                       np.dtype(np.int64)))
def coded_embedding(data_shares: Sequence[np.ndarray], model_shares: Sequence[np.ndarray], p: int) -> np.ndarray:
    """Client ``n'``'s coded embedding ``H~_n' = sum_n X~_{n,n'} W~_{n,n'}`` mod p (eq. 5).

    Parameters
    ----------
    data_shares : sequence over n of ndarray, shape (b, d_n D_n), over GF(p)
        The batch's rows of the data shares client ``n'`` holds from every client ``n``.
    model_shares : sequence over n of ndarray, shape (d_n D_n, h), over GF(p)
        The model shares client ``n'`` holds from every client ``n``.
    p : int

    Returns
    -------
    ndarray of int64, shape (b, h), over GF(p); charges ``b h sum_n d_n D_n`` MACs (one exact product of
    the concatenated operands; :func:`coded_embedding_macs`, declared, :func:`fednet.algebra.meter.kernel`).
    """
    p = _prime(p)
    if len(data_shares) != len(model_shares) or not data_shares:
        raise ValueError(f"need one data and one model share per client, got {len(data_shares)} and "
                         f"{len(model_shares)}")
    X = np.concatenate([np.asarray(x) for x in data_shares], axis=1)
    W = np.concatenate([np.asarray(w) for w in model_shares], axis=0)
    return matmul_mod(X, W, p)


@kernel(macs=lambda results, result_alphas, betas, K, T, p: decode_macs(K, T, *results[0].shape[-2:]),
        out=lambda results, result_alphas, betas, K, T, p: Shape((K * results[0].shape[-2], results[0].shape[-1]),
                                                                 np.dtype(np.int64)))
def decode_embedding_sum(results: np.ndarray, result_alphas: Sequence[int], betas: Sequence[int], K: int,
                         T: int, p: int) -> np.ndarray:
    """Interpolate ``psi`` (eq. 6) and stack ``psi(beta_1..beta_K)``: the quantised embedding sum (Alg. 1, 28-29).

    Parameters
    ----------
    results : ndarray, shape (R, b, h), over GF(p)
        Coded embeddings of the responders; the first ``2(K+T-1)+1`` are used.
    result_alphas : sequence of int, length R
        Their evaluation points.
    betas : sequence of int (at least K)
    K, T : int
    p : int

    Returns
    -------
    ndarray of int64, shape (K b, h), over GF(p): ``sum_n H_bar_n`` of the K b original samples (segment
    k's rows at ``k b .. (k+1) b - 1``); charges ``K R' b h`` MACs with ``R' = 2(K+T-1)+1`` (:func:`decode_macs`;
    declared, :func:`fednet.algebra.meter.kernel`).

    Raises
    ------
    FedVSDecodeFailure
        If fewer than ``2(K + T - 1) + 1`` distinct responders are given.
    ValueError
        If ``result_alphas`` does not match ``results``.
    """
    p = _prime(p)
    results = np.asarray(results)
    need = recovery_threshold(K, T)
    pts = [int(a) for a in result_alphas]
    if len(pts) != results.shape[0]:
        raise ValueError(f"result_alphas has {len(pts)} entries for {results.shape[0]} results")
    if len(set(pts)) != len(pts):
        raise ValueError(f"result_alphas must be distinct, got {pts}")
    if len(pts) < need:
        raise FedVSDecodeFailure(len(pts), need, K, T)
    C = lagrange_coefficients(pts[:need], list(betas)[:K], p)
    seg = lincomb_mod(C, results[:need].astype(np.int64), p)          # (K, b, h)
    return seg.reshape((K * seg.shape[1],) + seg.shape[2:])


def dequantize(h_bar: np.ndarray, l_x: int, l_w: int, N: int, p: int) -> np.ndarray:
    """Eq. (7): ``(1/N) 2^{-(l_x + l_w)} x`` for ``x <= (p-1)/2``, ``(1/N) 2^{-(l_x+l_w)} (x - p)`` above.

    Returns
    -------
    ndarray of float64, same shape: the average embedding ``H`` of the (rounded) data; charges one MAC
    per element.
    """
    p = _prime(p)
    s = from_field(h_bar, p, name="h_bar").astype(np.float64)
    charge(s.size)
    return np.ldexp(s, -(_int(l_x, "l_x") + _int(l_w, "l_w"))) / _int(N, "N", 1)


def plain_quantized_sum(x_bars: Sequence[np.ndarray], w_bars: Sequence[np.ndarray], p: int) -> np.ndarray:
    """Reference ``sum_n X_bar_n W_bar_n`` as exact signed integers (Python ints; the oracle of the tests).

    Parameters
    ----------
    x_bars : sequence over n of ndarray, shape (B, d_n D_n), over GF(p)
    w_bars : sequence over n of ndarray, shape (d_n D_n, h), over GF(p)

    Returns
    -------
    ndarray of object (Python ints), shape (B, h): the sum of the signed products (no reduction).
    """
    p = _prime(p)
    total = None
    for x, w in zip(x_bars, w_bars):
        xs = from_field(x, p).astype(object)
        ws = from_field(w, p).astype(object)
        part = xs.dot(ws)
        total = part if total is None else total + part
    return total


def plain_sum_int64(x_bars, w_bars: Sequence[np.ndarray], p: int) -> np.ndarray:
    """``sum_n X_bar_n W_bar_n`` as signed int64, (B, h): the value the decoding gives (host work, no reduction).

    Exact in int64 when every partial sum is bounded by :func:`embedding_bound` ``< p / 2 < 2**61`` (what
    :func:`check_modulus` and the protocol's ``w_max`` check guarantee); :func:`plain_quantized_sum` is the
    Python-int oracle.

    Parameters
    ----------
    x_bars : iterable over n of ndarray, shape (..., d_n D_n), over GF(p)
        The rows of each client (reshaped to ``(B, d_n D_n)``, e.g. :func:`batch_segments`' ``(K, b, d_n D_n)``).
    w_bars : sequence over n of ndarray, shape (d_n D_n, h), over GF(p)
    p : int

    Returns
    -------
    ndarray of int64, shape (B, h) (plain NumPy products: nothing is metered).
    """
    total = 0
    for x, w in zip(x_bars, w_bars):
        total = total + from_field(x, p).reshape(-1, w.shape[0]) @ from_field(w, p)
    return total


def share_macs(N: int, K: int, T: int, size: int) -> int:
    """MACs :func:`lagrange_shares` meters for ``size`` elements a block (eqs. 2, 4): ``N (K + T) size``."""
    return N * (K + T) * size


def coded_embedding_macs(b: int, widths: Sequence[int], h: int) -> int:
    """MACs of :func:`coded_embedding` on ``b`` rows (eq. 5): ``b h sum_n d_n D_n``."""
    return b * sum(widths) * h


def decode_macs(K: int, T: int, b: int, h: int) -> int:
    """MACs of :func:`decode_embedding_sum` (eq. 6): ``K R b h`` with ``R = 2(K+T-1)+1``."""
    return K * recovery_threshold(K, T) * b * h


def embedding_bound(l_x: int, l_w: int, x_max: float, w_max: float, d: Sequence[int], D: Sequence[int]) -> int:
    """Largest ``|sum_n H_bar_n|`` entry: ``sum_n sum_{i<=D_n} d_n Round(2^{l_x} x_max^i) ceil(2^{l_w} w_max)``.

    Parameters
    ----------
    l_x, l_w : int
        Scaling bits of data and model (Sec. 4.2, eq. 3).
    x_max : float
        Bound on the magnitude of every feature, ``|x| <= x_max`` (1 for pixels in [0, 1]).
    w_max : float
        Bound on the magnitude of every PN weight (the protocol refuses a model that leaves it).
    d, D : sequences of int (length N)
        Feature counts ``d_n`` and PN depths ``D_n``.

    Returns
    -------
    int
        The bound (Python int).
    """
    if not (np.isfinite(x_max) and x_max >= 0):
        raise ValueError(f"x_max must be a finite non-negative number, got {x_max!r}")
    if not (np.isfinite(w_max) and w_max >= 0):
        raise ValueError(f"w_max must be a finite non-negative number, got {w_max!r}")
    if len(d) != len(D):
        raise ValueError(f"d and D must have one entry per client, got {len(d)} and {len(D)}")
    l_x, l_w = _int(l_x, "l_x"), _int(l_w, "l_w")
    wq = int(np.ceil(np.ldexp(float(w_max), l_w)))
    total = 0
    for dn, Dn in zip(d, D):
        dn, Dn = _int(dn, "d_n", 1), _int(Dn, "D_n", 1)
        total += dn * sum(int(np.floor(np.ldexp(float(x_max) ** i, l_x) + 0.5)) for i in range(1, Dn + 1)) * wq
    return total


def required_modulus(l_x: int, l_w: int, x_max: float, w_max: float, d: Sequence[int], D: Sequence[int]) -> int:
    """Smallest prime ``p > 2 B + 1`` with ``B = embedding_bound(...)``: every decoded sum ``s`` has ``|s| < (p-1)/2``.

    Then eq. (7) and the signed map agree on every value the decoding produces.
    """
    return next_prime_above(2 * embedding_bound(l_x, l_w, x_max, w_max, d, D) + 1)


def check_modulus(p: int, l_x: int, l_w: int, x_max: float, w_max: float, d: Sequence[int],
                  D: Sequence[int]) -> int:
    """Refuse a prime too small for the embedding sums.

    Returns
    -------
    int
        ``p``, validated (a prime below 2**62).

    Raises
    ------
    FieldTooSmall
        If ``p <= 2 B + 1`` (``B`` from :func:`embedding_bound`); the message names the smallest
        sufficient prime.
    ValueError
        If ``p`` is not a prime below 2**62.
    """
    p = _prime(p)
    bound = embedding_bound(l_x, l_w, x_max, w_max, d, D)
    if p <= 2 * bound + 1:
        raise FieldTooSmall(p, bound, next_prime_above(2 * bound + 1))
    return p


def check_fits(p: int, l_x: int, l_w: int, x_max: float, w_max: float, d: Sequence[int], D: Sequence[int],
               x_train: Sequence[np.ndarray], W: Sequence[np.ndarray]) -> None:
    """Refuse, before anything runs, a field or resolution that does not fit the data (issue 33).

    ``p`` must be a prime below ``2**62`` above twice the embedding bound (:func:`check_modulus`); ``l_x`` and
    ``l_w`` must not round most nonzero features or initial weights to zero
    (:func:`fednet.algebra.capacity.check_resolution`).

    Parameters
    ----------
    p, l_x, l_w, x_max, w_max, d, D
        As :func:`check_modulus`.
    x_train : sequence of ndarray
        The clients' feature blocks.
    W : sequence of ndarray
        The clients' initial weights.

    Raises
    ------
    fednet.errors.ConfigError, fednet.errors.CapacityError
        Naming the parameter and its value.
    """
    try:
        check_modulus(p, l_x, l_w, x_max, w_max, d, D)
    except ValueError as e:
        if isinstance(e, FednetError):
            raise
        raise ConfigError(f"p = {p}: {e}") from None
    check_resolution(list(x_train), l_x, "l_x", "the clients' features")
    check_resolution(list(W), l_w, "l_w", "the clients' initial weights")


class WeightsOutgrowField(OverflowError, ValueError):
    """A client's PN weights grew past ``w_max``, for which the field was sized (a run-time overflow: the round
    ends the training as a recorded failure, :mod:`fednet.protocol.finite`)."""
