"""The LightSecAgg mask code and mask arithmetic (pure: arrays in, arrays out, metered kernels inside).

Source: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg: a lightweight and versatile design
for secure aggregation in federated learning", MLSys 2022 (summary and test vectors in
``shared/references.md``).  The ``lsa_*`` helpers moved here from ``fednet.codes.lagrange`` (issue 9);
the protocol (``protocols/lightsecagg.py``) moves these values around.

What each party sees: the server sees each survivor's masked gradient (uniform in GF(p)^(dc) for
``T >= 0``: a one-time pad), the ``s_j`` of the survivors (which reveal nothing beyond the aggregate
mask for up to ``T`` colluders) and so learns only ``sum_{i in U1} G_i``; a user sees ``Theta``, the
survivor list and one encoded mask share ``z~_ij`` from each user, which for any ``T`` colluding
users is uniformly distributed (the ``T`` noise pieces).  Device-to-device shares are relayed
through the (encrypted) server; audits drop them from the relay's view.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from fednet.algebra.fields import (
    as_field,
    check_field_capacity,
    check_prime,
    distinct_points,
    field_dtype,
    lagrange_coefficients,
    prepared_lagrange,
    uniform,
)
from fednet.algebra.meter import kernel
from fednet.algebra.modp import PreparedMatrix, add_mod, lincomb_mod, sub_mod, sum_mod
from fednet.algebra.quantize import dequantize, quantize
from fednet.algebra.shape import Shape
from fednet.codes.lagrange import _disjoint
from fednet.learning.models import minibatch_gradient

__all__ = ["default_lsa_points", "check_lsa_parameters", "lsa_piece_length", "lsa_mask_pieces", "lsa_encode_mask",
           "lsa_encoding_matrix", "lsa_aggregate_encoded", "lsa_decode_aggregate_mask", "mask_upload",
           "unmask_aggregate", "masked_gradient", "unmask_shares", "quantised_gradient", "sum_in_order",
           "check_lsa_dropout", "encode_mask_probe", "masked_gradient_probe", "unmask_probe", "encode_mask_macs",
           "masked_gradient_macs", "unmask_macs"]


def default_lsa_points(N: int, U: int) -> tuple[list[int], list[int]]:
    """Default LightSecAgg points: ``betas = 1..U`` (pieces), ``alphas = U+1..U+N`` (users), disjoint."""
    return list(range(U + 1, U + N + 1)), list(range(1, U + 1))


def check_lsa_parameters(N: int, U: int, T: int, q: int, *, quant_bits: int | None = None,
                         param: str = "q") -> None:
    """Validate LightSecAgg parameters: ``0 <= T < U <= N``, ``q`` an odd prime, ``q > N + U``
    (distinct points) and, with ``quant_bits`` = b, room for the sum of ``U`` quantised values of
    magnitude ``2^b`` (one unit of gradient each: ``q > 2 U 2^b``; the data-dependent sums are
    checked again by :func:`fednet.algebra.quantize.quantize` as they are formed).

    Parameters
    ----------
    N : int
        Number of users.
    U : int
        Target number of survivors.
    T : int
        Privacy threshold (colluding users).
    q : int
        The field's prime.
    quant_bits : int, optional
        Fractional bits ``b`` of the quantisation.
    param : str
        Name of the configuration parameter holding the prime (the protocol's ``p``), for messages.

    Raises
    ------
    ValueError
        Naming the violated parameter and its value.
    fednet.errors.CapacityError
        If the field cannot carry ``U`` quantised units (with the smallest prime that works).
    """
    try:
        check_prime(q)
    except ValueError as e:
        raise ValueError(str(e).replace("q must", f"{param} must", 1)) from None
    if int(q) == 2:
        raise ValueError(f"{param} must be an odd prime (the signed map needs {param} > 2), got 2")
    if not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    if not isinstance(T, (int, np.integer)) or T < 0:
        raise ValueError(f"T must be a non-negative integer, got {T!r}")
    if not isinstance(U, (int, np.integer)) or not T < U <= N:
        raise ValueError(f"U must satisfy T = {T} < U <= N = {N}, got {U!r}")
    if int(q) <= N + U:
        raise ValueError(f"{param} = {q} too small for N + U = {N + U} distinct points")
    if quant_bits is not None:
        check_field_capacity(q, int(U) << int(quant_bits),
                             what=f"the sum of U = {U} quantised units 2^quant_bits = 2^{quant_bits}", param=param)


def check_lsa_dropout(N: int, U: int, z: int, dropout: float) -> None:
    """Refuse a dropout probability that leaves fewer than ``U`` of ``N`` users available on average.

    Raises
    ------
    ValueError
        Naming ``network.dropout`` and the largest ``U`` (at least ``z + 1``) the mean availability allows.
    """
    mean = N * (1.0 - dropout)
    if mean < U:
        raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of {N} users available on "
                         f"average, fewer than U = {U} survivors each round needs; set U <= "
                         f"{max(z + 1, int(mean))} or lower dropout")


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


def encode_mask_macs(N: int, U: int, T: int, d: int) -> int:
    """MACs of :func:`lsa_encode_mask` for ``N`` users and a mask of ``d`` elements: ``N U L``,
    ``L = ceil(d / (U - T))`` (the Lagrange encoding of the ``U`` pieces; So et al., MLSys 2022, Sec. 4)."""
    return int(N) * int(U) * lsa_piece_length(d, U, T)


def masked_gradient_macs(n_rows: int, d: int, c: int) -> int:
    """MACs of :func:`masked_gradient`: ``2 b_i d c`` (the minibatch gradient of ``b_i = n_rows`` rows, eq. 3) ``+ d c``
    (adding the mask)."""
    return 2 * int(n_rows) * int(d) * int(c) + int(d) * int(c)


def unmask_macs(n_survivors: int, U: int, T: int, L: int, d: int, c: int) -> int:
    """MACs of :func:`unmask_aggregate`: ``(U - T) U L`` (decoding the aggregate mask) ``+ |U1| d c`` (summing the
    ``|U1| = n_survivors`` masked uploads and removing the mask)."""
    return (int(U) - int(T)) * int(U) * int(L) + int(n_survivors) * int(d) * int(c)


@kernel(macs=lambda z, U, T, q, rng, alphas, betas: encode_mask_macs(len(alphas), U, T, z.shape[0]),
        out=lambda z, U, T, q, rng, alphas, betas: Shape((len(alphas), lsa_piece_length(z.shape[0], U, T)),
                                                         field_dtype(q)))
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
    ndarray, shape (N, L), over GF(q); row j goes to user j.  Charges ``N U L`` MACs (:func:`encode_mask_macs`;
    declared, :func:`fednet.algebra.meter.kernel`).
    """
    C = lsa_encoding_matrix(alphas, betas, U, T, q)
    return lincomb_mod(C, lsa_mask_pieces(z, U, T, q, rng), q)


def lsa_encoding_matrix(alphas: Sequence[int], betas: Sequence[int], U: int, T: int, q: int) -> PreparedMatrix:
    """The ``(N, U)`` Lagrange matrix from the pieces' points ``betas`` to the users' points ``alphas``, prepared.

    Every user encodes its mask with this matrix in every round (So et al., MLSys 2022, Sec. 4: ``f_i`` interpolates
    the ``U`` pieces at ``beta_1..beta_U`` and is evaluated at ``alpha_1..alpha_N``); it depends only on the points,
    so it is validated (:func:`check_lsa_parameters`, distinct and disjoint points), computed and split into limbs once
    per set of points (cached; rebuilding it at each encoding cost most of a full-mode epoch, issue 32).  The encoding
    still charges its ``N U L`` MACs (the product).  Read-only: do not change the returned object.

    Raises
    ------
    ValueError
        As :func:`check_lsa_parameters`; if ``betas`` are not ``U`` distinct points, ``alphas`` not distinct, or they
        meet.
    """
    return _encoding_matrix(tuple(alphas), tuple(betas), U, T, q)


@lru_cache(maxsize=8)
def _encoding_matrix(alphas: tuple, betas: tuple, U: int, T: int, q: int) -> PreparedMatrix:
    check_lsa_parameters(len(alphas), U, T, q)
    b = distinct_points(betas, q, name="betas")
    if len(b) != U:
        raise ValueError(f"betas must have U = {U} points, got {len(b)}")
    a = distinct_points(alphas, q, name="alphas")
    _disjoint(a, b)
    return prepared_lagrange(b, a, q)


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
    return sum_mod(encoded, q)


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
    C = lagrange_coefficients(pts[:U], list(betas)[: U - T], q, cache=False)  # (U - T, U): new responders each round
    pieces = lincomb_mod(C, as_field(s[:U], q, name="s"), q)
    return pieces.reshape(-1)[:d]


def mask_upload(G: np.ndarray, z_mask: np.ndarray, b: int, p: int, n_summands: int) -> np.ndarray:
    """A user's upload ``Q(G) + z_i`` over GF(p).

    Parameters
    ----------
    G : ndarray, (d, c) float64
        Local gradient.
    z_mask : ndarray, (d c,) over GF(p)
    b, p : int
        Quantisation bits and field.
    n_summands : int
        Number of uploads that will be summed (the field must hold their sum).

    Returns
    -------
    ndarray, (d c,) over GF(p); charges ``d c`` MACs.

    Raises
    ------
    ValueError
        If the field is too small for the sum of ``n_summands`` quantised gradients.
    """
    return add_mod(quantize(G.reshape(-1), b, p, n_summands=n_summands), z_mask, p)


def unmask_aggregate(masked: list[np.ndarray], s: np.ndarray, alphas, betas, U: int, T: int,
                     shape: tuple[int, int], b: int, p: int) -> np.ndarray:
    """Server: ``sum x~_i - decode(s)``, dequantised (LightSecAgg, references.md).

    Parameters
    ----------
    masked : list of ndarray, each (d c,) over GF(p)
        Masked uploads of the survivors U1.
    s : ndarray, (R, L) over GF(p)
        Aggregated encoded masks of ``R >= U`` survivors, at points ``alphas``.
    alphas, betas : sequences of int
    U, T : int
    shape : (d, c)
    b, p : int

    Returns
    -------
    ndarray, (d, c) float64
        ``sum_{i in U1} Q(G_i) / 2**b``; charges ``(U - T) U L + |U1| d c`` MACs.
    """
    n = shape[0] * shape[1]
    agg_mask = lsa_decode_aggregate_mask(s, alphas, betas, U, T, n, p)
    total = sum_mod(masked, p)
    return dequantize(sub_mod(total, agg_mask, p), b, p).reshape(shape)


@kernel(macs=lambda X, Y, theta, rows, mask, b, p, n_summands: masked_gradient_macs(len(rows), X.shape[1], Y.shape[1]),
        out=lambda X, Y, theta, rows, mask, b, p, n_summands: Shape((X.shape[1] * Y.shape[1],), field_dtype(p)))
def masked_gradient(X: np.ndarray, Y: np.ndarray, theta: np.ndarray, rows: np.ndarray, mask: np.ndarray, b: int,
                    p: int, n_summands: int) -> np.ndarray:
    """Online phase of a user: its minibatch gradient, quantised and masked, ``(d c,)`` over GF(p); ``2 b d c + d c`` MACs.

    ``theta`` is the model as downloaded (float32 on the wire), widened to float64 here; the gradient is
    :func:`fednet.learning.models.minibatch_gradient`, the upload :func:`mask_upload`.  The count is
    :func:`masked_gradient_macs` (declared, :func:`fednet.algebra.meter.kernel`)."""
    return mask_upload(minibatch_gradient(X, Y, theta.astype(np.float64), rows), mask, b, p, n_summands)


@kernel(macs=lambda masked, s_parts, alphas, betas, U, T, shape, b, p:
        unmask_macs(len(masked), U, T, s_parts[0].shape[-1], *shape),
        out=lambda masked, s_parts, alphas, betas, U, T, shape, b, p: Shape(tuple(shape), np.float64))
def unmask_shares(masked, s_parts, alphas, betas, U: int, T: int, shape, b: int, p: int) -> np.ndarray:
    """:func:`unmask_aggregate` of a list of aggregated encoded masks (each ``(L,)``): ``(d, c)`` float64; charges
    :func:`unmask_macs` (declared, :func:`fednet.algebra.meter.kernel`)."""
    return unmask_aggregate(masked, np.stack(s_parts), alphas, betas, U, T, shape, b, p)


def quantised_gradient(X: np.ndarray, Y: np.ndarray, theta: np.ndarray, rows: np.ndarray, b: int, p: int,
                       n_summands: int) -> np.ndarray:
    """A user's minibatch gradient as its quantised upload carries it, in float64: ``Q(G_i) / 2**b`` (not metered).

    What :func:`mask_upload` quantises, before its mask and the field: ``G_i = (n_i / b_i) X_b^T (X_b Theta - Y_b)``
    with the same BLAS products and floats as the protocol's device step, then ``rint(G_i 2**b) / 2**b``, each
    step in place on the user's own result (the same float operations, without four temporaries of ``d c``
    elements). Timing mode's host stand-in of a survivor's upload (``protocols/lightsecagg.py``).

    Parameters
    ----------
    X, Y : ndarray, (n_i, d) and (n_i, c)
        The user's points.
    theta : ndarray, (d, c) float64
        The model as downloaded (float32 on the wire, widened).
    rows : ndarray of int, (b_i,)
        The minibatch.
    b, p : int
        Quantisation bits and field.
    n_summands : int
        Number of uploads the server sums (the field must hold their sum).

    Returns
    -------
    ndarray, (d, c) float64
        Integers times ``2**-b``.

    Raises
    ------
    fednet.errors.CapacityError
        If ``n_summands`` such values do not fit GF(p) (named by :func:`~fednet.algebra.quantize.quantize`);
        ``ValueError`` for a non-finite gradient.
    """
    scale = 2.0**b
    Xb = X[rows]
    r = Xb @ theta                                  # each in-place step is the operation it replaces
    r -= Y[rows]
    g = Xb.T @ r
    g *= X.shape[0] / len(rows)
    g *= scale
    np.rint(g, out=g)
    top = np.maximum(g.max(), -g.min())             # max |v|; nan propagates: caught below
    g /= scale
    if not (np.isfinite(top) and int(top) * n_summands <= (p - 1) // 2):
        quantize(g, b, p, n_summands=n_summands)    # names the problem
    return g


def sum_in_order(values: Sequence[np.ndarray]) -> np.ndarray:
    """``sum(values)`` (``0 + v_0 + v_1 + ...``, left to right) with one output array: the same floats, bit for bit
    (each ``+=`` is the ``+`` it replaces; ``0 + v_0`` turns a ``-0.0`` into ``0.0`` as ``sum`` does). Not metered
    (timing mode's stand-in of the unmasked sum)."""
    total = np.add(0, values[0])
    for v in values[1:]:
        np.add(total, v, out=total)
    return total


# -- probes: the kernels of a step on zeros at its shapes (how timing mode measures its MACs, once per shape) ------
def encode_mask_probe(N: int, U: int, T: int, dc: int) -> np.ndarray:
    """:func:`lsa_encode_mask` of a zero mask of ``dc`` elements at the default points of ``N`` users, in
    GF(2^31 - 1): the ``N U L`` MACs of the step at these sizes (the count depends on neither field nor values)."""
    return lsa_encode_mask(np.zeros(dc, np.int64), U, T, 2**31 - 1, np.random.default_rng(0), *default_lsa_points(N, U))


def masked_gradient_probe(x_shape: tuple, y_shape: tuple, n_rows: int, d: int, c: int, b: int, p: int,
                          n_summands: int) -> np.ndarray:
    """:func:`masked_gradient` on zeros: a user of ``x_shape``/``y_shape`` points, ``n_rows`` minibatch rows,
    ``(d, c)`` model (``2 b_i d c + d c`` MACs)."""
    return masked_gradient(np.zeros(x_shape), np.zeros(y_shape), np.zeros((d, c)), np.arange(n_rows),
                           np.zeros(d * c, np.int64), b, p, n_summands)


def unmask_probe(n_survivors: int, alphas: Sequence[int], betas: Sequence[int], U: int, T: int, L: int,
                 shape: tuple[int, int]) -> np.ndarray:
    """:func:`unmask_aggregate` on zeros in GF(2^31 - 1): ``n_survivors`` masked uploads, ``U`` aggregated masks
    of length ``L`` at ``alphas`` (``(U - T) U L + |U1| d c`` MACs)."""
    return unmask_aggregate([np.zeros(shape[0] * shape[1], np.int64)] * n_survivors, np.zeros((U, L), np.int64),
                            alphas, betas, U, T, shape, 0, 2**31 - 1)
