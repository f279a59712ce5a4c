"""DReS-FL math as pure functions: data transformation, Lagrange data sharing, gradient decoding, psi, Q.

Shao, Sun, Li, Zhang, "DReS-FL: Dropout-Resilient Secure Federated Learning for Non-IID Clients via
Secret Data Sharing" (NeurIPS 2022).  Every client ``i`` transforms its data to the field
(Sec. 4.1, ``X_bar = Round(2^l (X + c))``), splits it into ``K`` shards, appends ``T`` uniform noise
shards and sends ``u_i(alpha_j), v_i(alpha_j)`` (eqs. 2-3) to client ``j``.  In round ``t`` client ``j``
evaluates the gradient polynomial ``g`` of the polynomial integer network (degree
``deg(g) = 2^(L+1)``, App. E) on its coded minibatch, which is the composite polynomial
``g(u_It(z), v_It(z))`` (eqs. 4-5) at ``z = alpha_j``; the server interpolates it from any
``deg(g)(K + T - 1) + 1`` evaluations (Theorem 1, eq. 1), reads the K global gradients at
``z = beta_k``, maps them to integers by ``psi`` (eq. 6) and updates
``w <- w - Q(eta / (b K) sum_k g_k)`` with the unbiased stochastic rounding ``Q`` of eq. (7).

Field elements are stored as in :mod:`fednet.algebra.fields` (int64 below ``2**62``, Python-int object
arrays above); the encodings use :mod:`fednet.codes.lagrange` and charge its MACs.  Secrets (the noise
shards and the rounding of Q) come from generators the caller passes in, never from the public seed.
The gradient function itself lives in :mod:`fednet.learning.field_models` (a higher layer) and is
passed in as a callable.

Choices the paper leaves open, fixed here (and stated in the docstrings): ``Round`` is NumPy's
``rint`` (ties to even); the evaluation points are ``beta_k = k`` and ``alpha_j = K + T + j``;
``psi`` follows eq. (6) literally, so ``(p - 1)/2`` maps to ``-(p + 1)/2``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fednet.algebra.fields import as_field, distinct_points, lagrange_coefficients, to_field, uniform
from fednet.algebra.meter import kernel
from fednet.algebra.modp import lincomb_mod
from fednet.algebra.quantize import stochastic_round  # Q of eq. (7)
from fednet.algebra.rns import RnsArray, RnsContext, rns_context
from fednet.algebra.shape import Shape
from fednet.algebra.wideint import WideInts
from fednet.codes.lagrange import lcc_recovery_threshold

__all__ = [
    "DRESFL_PRIME_200",
    "DRESFL_PRIME_440",
    "DecodeFailure",
    "transform_data",
    "split_shards",
    "global_shards",
    "concat_rows",
    "default_points",
    "gradient_degree",
    "recovery_threshold",
    "max_dropouts",
    "check_clients",
    "parse_prime",
    "shard_rows",
    "share_dataset",
    "share_dataset_macs",
    "DataShare",
    "coded_dataset",
    "check_decoded",
    "evaluate_on_shares",
    "decode_gradients",
    "psi",
    "stochastic_round",
    "clip_factor",
    "dresfl_update",
]

#: Prime of Table 4 for MNIST and Fashion-MNIST (200 bits).
DRESFL_PRIME_200 = 2**200 - 75
#: Prime of Table 4 for EMNIST, CIFAR-10/100 and SVHN (440 bits).
DRESFL_PRIME_440 = 2**440 - 33


class DecodeFailure(ValueError):
    """Too few gradient evaluations for Lagrange decoding (a round below the recovery threshold).

    Attributes
    ----------
    received : int
        Number of distinct evaluations given.
    needed : int
        The recovery threshold ``deg(g)(K + T - 1) + 1``.
    """

    def __init__(self, received: int, needed: int, K: int, T: int, deg: int):
        self.received = int(received)
        self.needed = int(needed)
        super().__init__(
            f"DReS-FL decoding needs deg(g)(K + T - 1) + 1 = {deg}*({K} + {T} - 1) + 1 = {needed} "
            f"gradient evaluations, got {received}"
        )


def transform_data(x: np.ndarray, l: int, c: float = 0.0) -> np.ndarray:
    """Data transformation of Sec. 4.1: ``X_bar = Round(2^l (x + c))`` element-wise.

    Parameters
    ----------
    x : ndarray of float, any shape
        Real data (features, or one-hot labels).
    l : int
        Quantisation bits (Table 4: 4 for MNIST and Fashion-MNIST, 2 for CIFAR and SVHN).
    c : float
        Shift making the data non-negative (footnote 4; 0 in the paper's experiments).

    Returns
    -------
    ndarray of int64, same shape
        ``rint(2^l (x + c))`` (ties to even, NumPy's ``rint``).

    Raises
    ------
    ValueError
        If ``l`` is not an integer or a transformed value does not fit in ``|v| < 2**62``, or the data
        are not finite.
    """
    if isinstance(l, bool) or not isinstance(l, (int, np.integer)):
        raise ValueError(f"l must be an integer, got {l!r}")
    v = np.rint(np.ldexp(np.asarray(x, dtype=np.float64) + float(c), int(l)))
    if v.size and (not np.all(np.isfinite(v)) or np.max(np.abs(v)) >= 2.0**62):
        raise ValueError(f"transformed data must be finite and below 2**62 in magnitude (l = {l}, c = {c})")
    return v.astype(np.int64)


def split_shards(x: np.ndarray, K: int) -> np.ndarray:
    """Split rows into ``K`` equal shards ``X^(1..K)`` (Sec. 4.1: ``m_i`` divisible by K).

    Parameters
    ----------
    x : ndarray, shape (m, *S)
    K : int

    Returns
    -------
    ndarray, shape (K, m / K, *S)

    Raises
    ------
    ValueError
        If ``K < 1`` or ``m`` is not divisible by ``K``.
    """
    x = np.asarray(x)
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K must be a positive integer, got {K!r}")
    if x.shape[0] % K:
        raise ValueError(f"the number of rows m = {x.shape[0]} must be divisible by K = {K}")
    return x.reshape((K, x.shape[0] // K) + x.shape[1:])


def global_shards(xs: Sequence[np.ndarray], shard_rows: Sequence[int], K: int) -> list[np.ndarray]:
    """The ``K`` global data sets ``X^(k) = [X^(k)_1; ...; X^(k)_N]`` (Sec. 4.1, the decoding's target).

    Parameters
    ----------
    xs : sequence of N ndarrays, shapes (m_i, *S)
        Each client's (transformed or plain) rows; ``m_i = K * shard_rows[i]``.
    shard_rows : sequence of N ints
        ``m_i / K``, the rows of one shard of client ``i``.
    K : int
        Shards per client.

    Returns
    -------
    list of K ndarrays, shapes (sum_i m_i / K, *S)
        Shard ``k`` of every client, stacked in client order (row ``k * r_i + j`` of client ``i`` is row
        ``j`` of its shard ``k``, as :func:`split_shards` cuts it).
    """
    return [np.concatenate([x[k * r:(k + 1) * r] for x, r in zip(xs, shard_rows)]) for k in range(K)]


def concat_rows(parts: Sequence[RnsArray]) -> RnsArray:
    """Rows of several RnsArrays of one context stacked: client ``j``'s coded data set ``X~_j`` (Sec. 4.1).

    Parameters
    ----------
    parts : sequence of RnsArray, shapes (r_i, d), one :class:`~fednet.algebra.rns.RnsContext`
        The shares ``X~_{i->j}`` client ``j`` received, in client order.

    Returns
    -------
    RnsArray, shape (sum_i r_i, d)
        Bound: the largest of the parts' bounds.
    """
    return RnsArray(np.concatenate([p.res for p in parts], axis=1), max(p.bound for p in parts), parts[0].ctx)


def default_points(N: int, K: int, T: int) -> tuple[list[int], list[int]]:
    """Evaluation points ``alphas = [K+T+1 .. K+T+N]`` (clients) and ``betas = [1 .. K+T]`` (shards).

    Disjoint by construction, as Sec. 4.1 requires (``{alpha_j} ∩ {beta_k} = ∅``).

    Raises
    ------
    ValueError
        If ``N < 1``, ``K < 1`` or ``T < 0``.
    """
    if N < 1 or K < 1 or T < 0:
        raise ValueError(f"need N >= 1, K >= 1, T >= 0, got N = {N}, K = {K}, T = {T}")
    return list(range(K + T + 1, K + T + N + 1)), list(range(1, K + T + 1))


def gradient_degree(n_hidden: int) -> int:
    """``deg(g) = 2^(L+1)`` for a PINN with ``L`` quadratic activation layers (Sec. 3.1, App. E)."""
    if n_hidden < 0:
        raise ValueError(f"n_hidden must be non-negative, got {n_hidden}")
    return 2 ** (int(n_hidden) + 1)


def recovery_threshold(K: int, T: int, deg: int) -> int:
    """``deg(g)(K + T - 1) + 1``: evaluations the server needs (Sec. 4.2, Alg. 1 line 8)."""
    return lcc_recovery_threshold(K, T, deg)


def max_dropouts(N: int, K: int, T: int, deg: int) -> int:
    """Largest ``D`` with ``D + deg(g)(K + T - 1) + 1 <= N`` (Theorem 1, eq. 1).

    Raises
    ------
    ValueError
        If even ``D = 0`` violates eq. (1) (``N`` below the recovery threshold).
    """
    D = int(N) - recovery_threshold(K, T, deg)
    if D < 0:
        raise ValueError(
            f"N = {N} clients cannot meet the recovery threshold {recovery_threshold(K, T, deg)} "
            f"(K = {K}, T = {T}, deg(g) = {deg}): eq. (1) fails"
        )
    return D


def check_clients(N: int, K: int, T: int, n_hidden: int) -> None:
    """Refuse ``N`` below the recovery threshold ``deg(g)(K + T - 1) + 1`` (Theorem 1, eq. 1; no dropout at all).

    Raises
    ------
    ValueError
        Naming ``K``, ``T``, ``deg(g)`` (:func:`gradient_degree` of ``n_hidden``) and the threshold.
    """
    deg = gradient_degree(n_hidden)
    R = recovery_threshold(K, T, deg)
    if N < R:
        raise ValueError(f"DReS-FL with K = {K}, T = {T}, deg(g) = {deg} needs N >= "
                         f"deg(g)(K + T - 1) + 1 = {R} clients (Theorem 1, eq. 1), got N = {N}")


def parse_prime(v):
    """A prime given as ``"2^a-b"`` (or ``"2**a - b"``) as an int; any other non-string unchanged.

    TOML integers stop at 64 bits, so a study names Table 4's primes this way (``"2^200-75"``).

    Raises
    ------
    ValueError
        For a string of another form.
    """
    m = re.fullmatch(r"\s*2\s*(?:\^|\*\*)\s*(\d+)\s*-\s*(\d+)\s*", v) if isinstance(v, str) else None
    if isinstance(v, str) and not m:
        raise ValueError(f"p must be an integer or '2^a-b', got {v!r}")
    return 2 ** int(m.group(1)) - int(m.group(2)) if m else v


def shard_rows(xs: Sequence[np.ndarray], K: int) -> list[int]:
    """``m_i / K``, the rows of one shard of each client (Sec. 4.1).

    Raises
    ------
    ValueError
        If some client's ``m_i`` is not divisible by ``K`` (naming the clients and their rows).
    """
    bad = [i for i, x in enumerate(xs) if x.shape[0] % K]
    if bad:
        raise ValueError(f"every client's m_i must be divisible by K = {K} (Sec. 4.1); clients {bad} "
                         f"hold {[xs[i].shape[0] for i in bad]} rows")
    return [x.shape[0] // K for x in xs]


def share_dataset_macs(N: int, K: int, T: int, rows: int, d_x: int, d_y: int) -> int:
    """MACs :func:`share_dataset` charges for one client with ``m_i / K = rows``: ``N (K + T) rows (d_x + d_y)``."""
    return N * (K + T) * rows * (d_x + d_y)


def _share_dataset_macs(xbar, ybar, K, T, alphas, *args, **kwargs) -> int:
    """:func:`share_dataset_macs` of a call of :func:`share_dataset` (its declared count)."""
    return share_dataset_macs(len(alphas), K, T, xbar.shape[0] // K, xbar.shape[1], ybar.shape[1])


def _share_dataset_out(xbar, ybar, K, T, alphas, *args, **kwargs) -> tuple:
    """The shapes of :func:`share_dataset`'s outputs, ``(N, m_i / K, d_x)`` and ``(N, m_i / K, d_y)`` (object)."""
    rows = xbar.shape[0] // K
    return Shape((len(alphas), rows, xbar.shape[1]), object), Shape((len(alphas), rows, ybar.shape[1]), object)


@kernel(macs=_share_dataset_macs, out=_share_dataset_out)
def share_dataset(xbar: np.ndarray, ybar: np.ndarray, K: int, T: int, alphas: Sequence[int],
                  betas: Sequence[int], q: int, rng: np.random.Generator, *, as_rns: bool = False,
                  ctx: RnsContext | None = None):
    """One client's coded data for every client: ``(u_i(alpha_j), v_i(alpha_j))`` (eqs. 2-3).

    Computed as the LCC product ``L (K+T -> N) @ [X^(1..K); U^(K+1..K+T)]`` exactly in the residue
    number system of :mod:`fednet.algebra.rns` (the limb kernel of ``lcc_encode`` is ~3x slower here
    on 200-bit elements); the encoding equals :func:`fednet.codes.lagrange.lcc_encode` with the same
    noise.

    Parameters
    ----------
    xbar : ndarray of int, shape (m_i, d_x)
        Transformed features (:func:`transform_data`), signed integers with ``|x| <= (q-1)/2``.
    ybar : ndarray of int, shape (m_i, d_y)
        Transformed labels.
    K, T : int
        Shards and privacy (``T`` uniform noise shards ``U_i^(k), V_i^(k)``, k = K+1..K+T).
    alphas : sequence of int, length N
        Clients' points, disjoint from ``betas``.
    betas : sequence of int, length K + T
    q : int
        The prime.
    rng : numpy.random.Generator
        The client's *secret* stream: draws the noise shards (features first, then labels).
    as_rns : bool
        Return :class:`fednet.algebra.rns.RnsArray` (kept in residue form by the receiving clients)
        instead of canonical field elements.
    ctx : RnsContext, optional
        Residue system to use (default ``rns_context(q)``; pass the model's to reuse the arrays).

    Returns
    -------
    x_shares : ndarray, shape (N, m_i / K, d_x), over GF(q) (or an RnsArray of that shape)
        Row ``j`` is ``X~_{i->j} = u_i(alpha_j)``.
    y_shares : ndarray, shape (N, m_i / K, d_y), over GF(q) (or an RnsArray)
        ``Y~_{i->j} = v_i(alpha_j)``.
        Charges ``N (K + T) (m_i / K)(d_x + d_y)`` MACs (the LCC product; :func:`share_dataset_macs`,
        declared, :func:`fednet.algebra.meter.kernel`).

    Raises
    ------
    ValueError
        If ``m_i`` is not divisible by ``K``, ``T < 0``, ``len(betas) != K + T``, the points are not
        distinct or alphas meet betas.
    """
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 0:
        raise ValueError(f"T must be a non-negative integer, got {T!r}")
    a = distinct_points(alphas, q, name="alphas")
    b = distinct_points(betas, q, name="betas")
    if len(b) != K + T:
        raise ValueError(f"betas must have K + T = {K + T} points, got {len(b)}")
    common = set(a) & set(b)
    if common:
        raise ValueError(f"alphas must be disjoint from betas (T-privacy), common points {sorted(common)}")
    ctx = ctx or rns_context(q)
    coeffs = ctx.from_field(lagrange_coefficients(b, a, q))  # (N, K + T)
    out = []
    for data, name in ((xbar, "xbar"), (ybar, "ybar")):
        shards = split_shards(np.asarray(data), K)
        shape = shards.shape[1:]
        n = int(np.prod(shape, dtype=np.int64))
        X = ctx.from_signed(shards.reshape(K, n)) if np.asarray(data).dtype != object else \
            ctx.from_field(_field(shards.reshape(K, n), q, name))
        if T:
            U = ctx.from_field(uniform(rng, q, (T, n)))
            stacked = RnsArray(np.concatenate([np.broadcast_to(X.res, X.res.shape), U.res], axis=1),
                               max(X.bound, U.bound), ctx)
        else:
            stacked = X
        enc = ctx.matmul(coeffs, stacked)  # (N, n)
        if as_rns:
            out.append(RnsArray(enc.res.reshape((ctx.L, len(a)) + shape), enc.bound, ctx))
        else:
            out.append(enc.to_field().reshape((len(a),) + shape))
    return out[0], out[1]


@dataclass(frozen=True)
class DataShare:
    """The coded data ``(X~_{i->j}, Y~_{i->j})`` client ``i`` sends client ``j`` (eqs. 2-3): rows ``j`` of
    :func:`share_dataset`'s outputs (RnsArrays; timing mode's shape stand-ins)."""

    x: Any
    y: Any

    @property
    def size(self) -> int:
        """Field elements on the wire: ``(m_i / K)(d_x + d_y)``."""
        return int(np.prod(self.x.shape)) + int(np.prod(self.y.shape))


def coded_dataset(parts: Sequence[DataShare]) -> tuple[RnsArray, RnsArray]:
    """Client ``j``'s coded data set ``(X~_j, Y~_j)``: the shares it received from every client, in client order,
    stacked (:func:`concat_rows`)."""
    return concat_rows([g.x for g in parts]), concat_rows([g.y for g in parts])


def _field(x: np.ndarray, q: int, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != object and x.size and int(x.min()) < 0:
        return to_field(x, q, name=name)
    if x.dtype == object and x.size and min(x.flat) < 0:
        return to_field(x, q, name=name)
    return as_field(x, q, name=name)


def evaluate_on_shares(grad_fn: Callable[[np.ndarray, np.ndarray], Mapping[str, np.ndarray]],
                       x_shares: np.ndarray, y_shares: np.ndarray,
                       rows: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """Client computation of Alg. 1 line 5: the gradient polynomial on each client's coded minibatch.

    Parameters
    ----------
    grad_fn : callable ``(x, y) -> Params``
        The gradient over GF(q) of the polynomial network at the current parameters (e.g.
        ``lambda x, y: model.field_gradient(params, x, y)``), metered by its kernels.
    x_shares : ndarray, shape (N, m~, d_x), over GF(q)
        Coded features held by the N clients (``X~_j``).
    y_shares : ndarray, shape (N, m~, d_y), over GF(q)
    rows : ndarray of int, shape (b,), optional
        The common row selection ``I_t`` (all clients use the same ``C^(t)``, Sec. 4.2); all rows by
        default.

    Returns
    -------
    list of Params, length N
        ``g~(X~_j^(I_t), Y~_j^(I_t); w)`` over GF(q) for each client j.
    """
    out = []
    for j in range(x_shares.shape[0]):
        xj = x_shares[j] if rows is None else x_shares[j][rows]
        yj = y_shares[j] if rows is None else y_shares[j][rows]
        out.append(dict(grad_fn(xj, yj)))
    return out


def decode_gradients(results: Sequence[Mapping[str, np.ndarray]], result_alphas: Sequence[int],
                     betas: Sequence[int], K: int, T: int, deg: int, q: int) -> list[dict[str, np.ndarray]]:
    """Server decoding (Alg. 1 line 9): the K global gradients ``g~(X_bar^(k), Y_bar^(k))`` over GF(q).

    Interpolates the composite polynomial ``g(u_It(z), v_It(z))`` of degree ``deg (K + T - 1)`` from the
    first ``deg (K + T - 1) + 1`` evaluations and evaluates it at ``beta_1..beta_K``.

    Parameters
    ----------
    results : sequence of Params, length R
        Uploads ``g~`` of the responding clients (canonical field elements, or RnsArrays of one
        context as returned by ``field_gradient(..., as_rns=True)``; equal names and shapes).
    result_alphas : sequence of int, length R
        The responders' points.
    betas : sequence of int, length >= K
    K, T : int
    deg : int
        ``deg(g)`` (:func:`gradient_degree`).
    q : int

    Returns
    -------
    list of Params, length K
        Canonical field elements; charges ``K * threshold * n_params`` MACs.

    Raises
    ------
    DecodeFailure
        If fewer than the recovery threshold of evaluations are given (names both numbers).
    ValueError
        If the points are not distinct or ``len(result_alphas) != len(results)``.
    """
    need = recovery_threshold(K, T, deg)
    pts = distinct_points(result_alphas, q, name="result_alphas")
    if len(pts) != len(results):
        raise ValueError(f"result_alphas has {len(pts)} points for {len(results)} results")
    if len(results) < need:
        raise DecodeFailure(len(results), need, K, T, deg)
    common = set(pts) & set(int(b) for b in betas)
    if common:
        raise ValueError(f"result_alphas must be disjoint from betas, common points {sorted(common)}")
    names = list(results[0])
    if isinstance(results[0][names[0]], RnsArray):
        return _decode_rns(results[:need], pts[:need], betas, K, q, names)
    sizes = [int(np.asarray(results[0][k]).size) for k in names]
    stacked = np.concatenate([np.concatenate([as_field(np.asarray(r[k]), q, name=f"results[{k}]").reshape(-1)
                                              for k in names])[None] for r in results[:need]], axis=0)
    C = lagrange_coefficients(pts[:need], list(betas)[:K], q)  # (K, need)
    flat = lincomb_mod(C, stacked, q)  # (K, n_params)
    out = []
    for kk in range(K):
        d, o = {}, 0
        for name, s in zip(names, sizes):
            d[name] = flat[kk, o:o + s].reshape(np.asarray(results[0][name]).shape)
            o += s
        out.append(d)
    return out


def _decode_rns(results, pts, betas, K, q, names):
    ctx = results[0][names[0]].ctx
    shapes = [results[0][k].shape for k in names]
    rows = []
    bound = 0
    for r in results:
        parts = []
        for k in names:
            a = ctx.reduce(r[k]) if r[k].n_moduli != ctx.L else r[k]
            bound = max(bound, a.bound)
            parts.append(a.res.reshape(ctx.L, -1))
        rows.append(np.concatenate(parts, axis=1))
    stacked = RnsArray(np.stack(rows, axis=1), bound, ctx)  # (L, need, n_params)
    C = ctx.from_field(lagrange_coefficients(pts, list(betas)[:K], q))  # (K, need)
    flat = ctx.matmul(C, stacked).to_field()  # (K, n_params)
    out = []
    for kk in range(K):
        d, o = {}, 0
        for name, shape in zip(names, shapes):
            size = int(np.prod(shape, dtype=np.int64))
            d[name] = flat[kk, o:o + size].reshape(shape)
            o += size
        out.append(d)
    return out


def check_decoded(decoded: Sequence[Mapping[str, np.ndarray]], plain: Sequence[Mapping[str, np.ndarray]], q: int,
                  names: Sequence[str], *, what: str) -> None:
    """Observer's check: every decoded global gradient, mapped by :func:`psi` (eq. 6), equals the plain one.

    Parameters
    ----------
    decoded : sequence of K Params over GF(q)
        :func:`decode_gradients`' output.
    plain : sequence of K Params of signed integers
        The integer gradients of the same global minibatches.
    q : int
    names : sequence of str
        The parameters to compare.
    what : str
        The round, for the message.

    Raises
    ------
    AssertionError
        Naming the first gradient ``k`` that differs and its parameters.
    """
    for k, (dec, ref) in enumerate(zip(decoded, plain)):
        bad = [n for n in names
               if not np.array_equal(psi(dec[n], q).astype(object), np.asarray(ref[n]).astype(object))]
        if bad:
            raise AssertionError(f"{what}: decoded global gradient {k} differs from the plain integer gradient "
                                 f"in {bad}")


def psi(v: np.ndarray, q: int) -> np.ndarray:
    """Field to integers, eq. (6): ``z`` if ``0 <= z < (p-1)/2``, else ``z - p``.

    Note eq. (6) maps ``(p-1)/2`` to ``-(p+1)/2`` (the image is ``{-(p+1)/2, .., (p-3)/2}``), which is
    what is implemented; it differs from the symmetric map of :func:`fednet.algebra.fields.from_field`
    only at that one value.

    Parameters
    ----------
    v : ndarray, any shape, over GF(q) (canonical)
    q : int

    Returns
    -------
    ndarray, same shape
        Signed integers (int64 for ``q < 2**62``, else Python ints).
    """
    q = int(q)
    a = as_field(v, q, name="v")
    return np.where(a >= (q - 1) // 2, a - q, a)


def clip_factor(g: Mapping[str, np.ndarray] | np.ndarray, max_norm: float | None, scale_bits: int = 0) -> Fraction:
    """Gradient clipping factor ``min(1, max_norm / ||g 2^-scale_bits||_2)`` (Table 4), as an exact Fraction.

    Parameters
    ----------
    g : Params or ndarray of int
        Integer gradient (psi of the decoded one).
    max_norm : float or None
        Maximum L2 norm (Table 4: 2e4 for MNIST, Fashion-MNIST), in the units of ``g 2^-scale_bits``;
        None disables clipping.
    scale_bits : int
        Fixed-point scale of ``g`` (0 for the paper's plain integer network).

    Returns
    -------
    Fraction
        In ``(0, 1]``.
    """
    if max_norm is None:
        return Fraction(1)
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive, got {max_norm!r}")
    arrays = g.values() if isinstance(g, Mapping) else [g]
    sq = 0.0
    for a in arrays:
        f = np.asarray(a).astype(np.float64).ravel() * 2.0 ** (-int(scale_bits))
        sq += float(np.dot(f, f))
    norm = sq ** 0.5
    return Fraction(1) if norm <= max_norm else Fraction(float(max_norm) / norm)


def dresfl_update(params: Mapping[str, np.ndarray], grad_sum: Mapping[str, np.ndarray], lr: float,
                  n_rows: int, q: int, rng: np.random.Generator, *, max_norm: float | None = None,
                  shift: int = 0, clip_bits: int = 0) -> dict[str, np.ndarray]:
    """Model update of Sec. 4.2: ``w <- w - Q(lr / n_rows * c * g / 2^shift)``, exact and in ``Z_p``.

    With ``n_rows = b K`` (the global batch) and ``shift = 0`` this is the paper's update; ``c`` is the
    clipping factor of :func:`clip_factor` (Table 4).  ``shift`` converts the gradient of a fixed-point
    network to parameter units (``G - f`` of :class:`fednet.learning.field_models.FieldPolyMLP`).  The
    argument of Q is evaluated as an exact rational (``lr`` is taken as the exact binary value of the
    float): ``floor`` is exact and the rounding-up probability carries float64's relative error
    (below ``2**-52``).

    Parameters
    ----------
    params : Params
        Signed integer parameters in ``Z_p``.
    grad_sum : Params
        ``sum_k psi(g_k)``, signed integers, same names and shapes: integer arrays, or
        :class:`~fednet.algebra.wideint.WideInts` (timing mode's plain gradient), whose norm, ``floor`` and
        fractional parts are computed on digit columns with the same bits (when ``lr c / (n_rows 2^shift)``
        has a power-of-two denominator; else, and for a floor beyond ``2^62``, through Python ints).
    lr : float
        Learning rate ``eta`` (> 0).
    n_rows : int
        ``b K``.
    q : int
    rng : numpy.random.Generator
        Secret stream of the server's rounding.
    max_norm : float, optional
        Clip the gradient to this L2 norm, measured in units of ``g 2^-clip_bits`` (:func:`clip_factor`).
    shift : int
        Power of two dividing the gradient (may be negative).
    clip_bits : int
        Fixed-point scale of the gradient for the clipping norm (``G`` of a fixed-point network, 0 for
        the paper's integer network).

    Returns
    -------
    Params
        New signed integers (int64 where every value fits, else Python ints).

    Raises
    ------
    ValueError
        If ``lr <= 0``, ``n_rows < 1``, the names differ, or an updated parameter leaves ``Z_p``.
    """
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if n_rows < 1:
        raise ValueError(f"n_rows must be positive, got {n_rows}")
    if set(params) != set(grad_sum):
        raise ValueError(f"grad_sum must name the parameters {list(params)}, got {list(grad_sum)}")
    c = clip_factor({k: v.to_float() if isinstance(v, WideInts) else v for k, v in grad_sum.items()}, max_norm,
                    scale_bits=int(clip_bits))
    factor = Fraction(lr) * c / (int(n_rows) * Fraction(2) ** int(shift))
    E = factor.denominator.bit_length() - 1
    digits = factor.denominator == 1 << E and E <= 1000      # den = 2^E: Q on digit columns (WideInts)
    half = (int(q) - 1) // 2
    out = {}
    for name, w in params.items():
        g, w = grad_sum[name], np.asarray(w)
        parts = None
        if digits and isinstance(g, WideInts) and w.dtype == np.int64 and not (w.size and np.abs(w).max() >= 2**62):
            parts = g.scaled_floor(factor.numerator, E)
        if parts is not None:                        # stochastic_round's floor and frac, the same draws
            fl, frac = parts
            new = w - (fl + (rng.random(fl.shape) < frac))
        else:
            step = stochastic_round(np.asarray(g).astype(object) * factor.numerator, rng, den=factor.denominator)
            new = w.astype(object) - step
        lo, hi = (int(new.min()), int(new.max())) if new.size else (0, 0)
        if lo < -(half + 1) or hi > half:
            raise ValueError(f"parameter {name} left Z_p after the update (values in [{lo}, {hi}])")
        out[name] = new.astype(np.int64) if (lo > -(2**62) and hi < 2**62) else new.astype(object)
    return out
