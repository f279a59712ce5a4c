"""CodedPaddedFL's math: one-time pads, gradient-code encoding, coded gradients, decoding.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning" (``shared/papers/
codedpaddedfl-codedsecagg.txt``), Sec. V-A (eqs. 6-9, Remark 1), Sec. V-B (eqs. 10-12),
Prop. 3; the ``(alpha, D)`` cyclic gradient codes of Tandon et al. (ICML 2017) in
:mod:`fednet.codes.gradient_codes`. Pure functions: arrays in, arrays out, MACs charged by the
metered kernels of :mod:`fednet.algebra.fixed_point` (no SimPy, no protocol).

The pipeline, for device ``i`` of a group with code ``(A, B)`` and assignment matrix ``Omega``:

1. :func:`local_statistics`: ``X_i^T X_i`` and ``G_i^(1) = -X_i^T Y_i`` in ``Q<k,f>`` (eq. 3 at
   ``Theta^(1) = 0``).
2. :func:`pad`: ``Phi_i = X_i^T X_i + R^X_i`` (eq. 7; upper triangle only, Remark 1) and
   ``Psi_i = G_i^(1) + R^G_i`` (eq. 6), uniform pads in ``Z_2^W``.
3. :func:`encode`: ``Cbar_i = sum_j b_{i, omega_ji} Phi_{omega_ji}`` (eq. 9) and
   ``C_i = sum_j b_{i, omega_ji} Psi_{omega_ji}`` (eq. 8) over the support of row ``i`` of ``B``
   (:func:`support`); the server encodes the pads the same way.
4. :func:`coded_gradient`: ``G~_i = C_i + Cbar_i epsilon`` (eq. 11), ``epsilon = Theta^(e) -
   Theta^(1)`` (eq. 10); the server forms the same expression on the encoded pads.
5. :func:`remove_pads`: ``P_i = G~_i - (R_i + Rbar_i epsilon)`` (Sec. V-B, before eq. 12).
6. :func:`decode`: ``sum_{i in A} a_i P_i = G^(e)`` (eq. 12) from any ``D - alpha + 1``
   responders.

:func:`local_statistics`, :func:`pack_upper` and :func:`unpack_upper` are shared with CodedSecAgg
and live in :mod:`fednet.codes.gram` (re-exported here). :func:`encode_macs`, :func:`epoch_macs`
and :func:`unpad_and_decode_macs` are the closed-form MAC counts of the steps (Sec. V-D), tested
against the metered kernels.

Exactness: the ring of the shares
---------------------------------
Multiplying a padded value by a *fractional* public number (a code coefficient ``b_ij``, then
``epsilon``) is not linear modulo ``2^k`` (:mod:`fednet.algebra.fixed_point`, note on
Proposition 2): every such multiplication consumes ``f`` bits of modulus. The shares therefore
live in ``Z_2^W`` with ``W = k + f_B + f`` (:func:`ring_bits`; ``f_B`` the fractional bits of
``B``): the encoding forms ``sum_j b_bar_ij Phi_j`` exactly mod ``2^W`` and drops ``f_B`` bits
(``Cbar_i`` mod ``2^(k+f)``); the coded gradient forms ``Cbar_i eps_bar`` exactly mod
``2^(k+f)`` and drops ``f`` bits, so the upload is a ``Q<k,f>`` matrix. Every dropped-bit step
commutes with the pad removal up to one unit, so ``P_i`` differs from ``sum_j b_ij G_j`` by at
most ``2^-f (2 + max_col ||eps||_1)`` per entry, and the decoded gradient meets
:meth:`fednet.codes.gradient_codes.CyclicGradientCode.error_bound` (:func:`decode_error`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import ContextManager

import numpy as np

from fednet.algebra.capacity import check_round_capacity
from fednet.algebra.fixed_point import (
    FixedPoint,
    PreparedOperand,
    extract_bits,
    prepared_from_limbs,
    random_ring_limbs,
    ring_add,
    ring_from_int,
    ring_matmul,
    ring_scaled_sum,
    ring_shift,
)
from fednet.algebra.meter import kernel, recharged
from fednet.algebra.shape import Shape
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.codes.gram import local_statistics, pack_upper, unpack_upper

__all__ = [
    "ring_bits",
    "check_wire_bits",
    "share_elements",
    "pack_upper",
    "unpack_upper",
    "local_statistics",
    "pad",
    "support",
    "encode",
    "encoded_operands",
    "encode_prepared",
    "coded_gradient",
    "remove_pads",
    "plain_gradients",
    "decode",
    "unpad_and_decode",
    "decode_error",
    "encode_macs",
    "epoch_macs",
    "unpad_and_decode_macs",
    "group_codes",
    "padded_statistics",
    "padded_statistics_shapes",
    "encoded_shapes",
    "check_decoding",
    "encode_charge",
    "sharing_steps",
    "check_groups",
    "check_dropout",
]


def ring_bits(k: int, f: int, code_fraction_bits: int) -> int:
    """Width ``W = k + f_B + f`` of the ring ``Z_2^W`` in which the shares are exact.

    Parameters
    ----------
    k, f : int
        The fixed-point format ``Q<k,f>`` (48, 24 in Sec. VII).
    code_fraction_bits : int
        ``f_B``, fractional bits of the quantised encoding matrix ``B_bar``.

    Returns
    -------
    int
        ``W`` in bits (96 for ``Q<48,24>`` and ``f_B = 24``).

    Raises
    ------
    ValueError
        If ``f`` is not in ``[0, k)`` or ``code_fraction_bits`` is negative.
    """
    if not 0 <= f < k:
        raise ValueError(f"f must lie in [0, k = {k}), got {f}")
    if code_fraction_bits < 0:
        raise ValueError(f"code_fraction_bits must be >= 0, got {code_fraction_bits}")
    return int(k) + int(code_fraction_bits) + int(f)


def share_elements(d: int, c: int) -> int:
    """Ring elements in one share ``(Phi_i, Psi_i)``: ``d (d+1)/2 + d c`` (Remark 1, Sec. V-D).

    Parameters
    ----------
    d, c : int
        Model shape (features, classes).

    Returns
    -------
    int
    """
    return d * (d + 1) // 2 + d * c


def pad(q: FixedPoint, bits: int, M: np.ndarray, G1: np.ndarray, rng: np.random.Generator):
    """One-time pads and padded data of one device, eqs. (6)-(7), in ``Z_2^bits``.

    Parameters
    ----------
    q : FixedPoint
    bits : int
        The ring width ``W`` (:func:`ring_bits`).
    M : ndarray, (d, d) int64, symmetric
    G1 : ndarray, (d, c) int64
    rng : numpy.random.Generator
        The device's pad stream (its seed is what the server learns; never the public seed).

    Returns
    -------
    Phi, Psi : ndarray
        Canonical limbs of ``pack_upper(M) + R^X`` (``(L, d(d+1)/2)``) and ``G1 + R^G``
        (``(L, d, c)``), ``L = ceil(W/16)``.
    RX, RG : ndarray
        The pads (same shapes): ``R^X`` is the upper triangle of a uniform symmetric matrix.
    """
    d, c = G1.shape
    RX = random_ring_limbs((d * (d + 1) // 2,), bits, rng)
    RG = random_ring_limbs((d, c), bits, rng)
    Phi = ring_add(ring_from_int(pack_upper(M), bits), RX, bits)
    Psi = ring_add(ring_from_int(G1, bits), RG, bits)
    return Phi, Psi, RX, RG


def support(code: CyclicGradientCode, local: int) -> tuple[np.ndarray, np.ndarray]:
    """Support of row ``local`` of ``B`` and its fixed-point coefficients (Sec. V-A).

    Parameters
    ----------
    code : CyclicGradientCode
    local : int
        Device index within the group, ``0 <= local < D``.

    Returns
    -------
    members : ndarray of int, (alpha,)
        Column ``local`` of ``Omega``: the group devices whose padded data device ``local``
        encodes, ``omega_1i = i`` first.
    coefficients : ndarray of int64, (alpha,)
        ``b_bar_{i, omega_ji}`` in ``Q<., f_B>``, in the same order.

    Raises
    ------
    ValueError
        If ``local`` is not a device of the code.
    """
    if not 0 <= local < code.D:
        raise ValueError(f"local must lie in [0, {code.D}), got {local}")
    members = code.Omega[:, local]
    return members, code.B_bar[local, members]


def encode(coefficients, Phis, Psis, bits: int, code_fraction_bits: int, out_bits: int):
    """Local encoding of eqs. (8)-(9) in the ring, then ``f_B`` bits dropped.

    Parameters
    ----------
    coefficients : sequence of int
        ``b_bar_{i, omega_ji}``, the ``Q<., f_B>`` integers of row ``i`` of B on its support.
    Phis, Psis : sequences of canonical limb arrays (``Z_2^bits``)
        The padded data (or the pads) of the devices in the support, in the same order.
    bits, code_fraction_bits, out_bits : int
        ``W``, ``f_B`` and ``k + f``.

    Returns
    -------
    Cbar : ndarray, (L', d(d+1)/2) canonical limbs mod ``2^out_bits``
    C : ndarray, (L', d, c) canonical limbs mod ``2^out_bits``
        Charges ``alpha (d(d+1)/2 + d c)`` MACs.
    """
    Cbar = ring_shift(ring_scaled_sum(coefficients, Phis, bits), code_fraction_bits, out_bits)
    C = ring_shift(ring_scaled_sum(coefficients, Psis, bits), code_fraction_bits, out_bits)
    return Cbar, C


def encoded_operands(Cbar: np.ndarray, C: np.ndarray, d: int) -> tuple[PreparedOperand, np.ndarray]:
    """The encoded pair as kept across epochs: ``Cbar`` unpacked to ``(d, d)`` and prepared once.

    Parameters
    ----------
    Cbar : ndarray, (L', d(d+1)/2) limbs
    C : ndarray, (L', d, c) limbs
    d : int

    Returns
    -------
    (PreparedOperand, ndarray)
        Operands of :func:`coded_gradient` (no MACs: a layout change).
    """
    return prepared_from_limbs(unpack_upper(Cbar, d)), C


@kernel(macs=lambda coefficients, Phis, Psis, bits, code_fraction_bits, out_bits, d:
        encode_macs(len(coefficients), d, Psis[0].shape[-1]),
        out=lambda coefficients, Phis, Psis, bits, code_fraction_bits, out_bits, d:
        tuple(Shape(shape, np.int64) for shape in encoded_shapes(out_bits, d, Psis[0].shape[-1])))
def encode_prepared(coefficients, Phis, Psis, bits: int, code_fraction_bits: int, out_bits: int,
                    d: int) -> tuple[PreparedOperand, np.ndarray]:
    """:func:`encode` then :func:`encoded_operands`: the pair a device (or the server, for the pads) keeps.

    Parameters
    ----------
    coefficients, Phis, Psis, bits, code_fraction_bits, out_bits
        As in :func:`encode`.
    d : int
        Number of features.

    Returns
    -------
    (PreparedOperand, ndarray)
        ``Cbar`` (d, d) prepared, ``C`` (L', d, c) limbs; charges :func:`encode_macs` MACs with
        ``alpha = len(coefficients)`` (declared: :func:`fednet.algebra.meter.kernel`; timing mode's
        stand-ins have :func:`encoded_shapes`).
    """
    return encoded_operands(*encode(coefficients, Phis, Psis, bits, code_fraction_bits, out_bits), d)


@kernel(macs=lambda q, Cbar, C, eps: epoch_macs(*C.shape[-2:]),
        out=lambda q, Cbar, C, eps: Shape(tuple(C.shape[-2:]), np.int64))
def coded_gradient(q: FixedPoint, Cbar, C: np.ndarray, eps) -> np.ndarray:
    """Eq. (11): ``C + Cbar epsilon`` in ``Q<k,f>`` (the product exact mod ``2^(k+f)``, one shift).

    Parameters
    ----------
    q : FixedPoint
    Cbar : PreparedOperand, (d, d), residues mod ``2^(k+f)`` at scale ``2^f``
    C : ndarray, (L', d, c) canonical limbs mod ``2^(k+f)``
    eps : PreparedOperand or int64 (d, c), ``Q<k,f>``
        ``epsilon^(e) = Theta^(e) - Theta^(1)`` (eq. 10).

    Returns
    -------
    ndarray, (d, c) int64, ``Q<k,f>``; charges :func:`epoch_macs`, ``d^2 c`` MACs (Sec. V-D; declared,
    :func:`fednet.algebra.meter.kernel`).
    """
    prod = ring_matmul(Cbar, eps, q.k + q.f)
    return q.add(extract_bits(C, 0, q.k), extract_bits(prod, q.f, q.k))


def remove_pads(q: FixedPoint, received: np.ndarray, pad_part: np.ndarray) -> np.ndarray:
    """``P_i = G~_i - (R_i + Rbar_i epsilon)`` in ``Q<k,f>`` (Sec. V-B, before eq. 12).

    Parameters
    ----------
    q : FixedPoint
    received : ndarray, (d, c) int64
        The device's upload ``G~_i`` (eq. 11).
    pad_part : ndarray, (d, c) int64
        :func:`coded_gradient` of the encoded pads with the same ``epsilon``.

    Returns
    -------
    ndarray, (d, c) int64 (no MACs).
    """
    return q.sub(received, pad_part)


def decode(q: FixedPoint, code: CyclicGradientCode, responders, P: np.ndarray) -> np.ndarray:
    """Eq. (12): ``sum_i a_i P_i`` in ``Q<k,f>`` with the fixed-point decoding row.

    Parameters
    ----------
    q : FixedPoint
    code : CyclicGradientCode
    responders : sequence of int
        Group-local indices of the first ``D_g - alpha + 1`` responders (any order).
    P : ndarray, (len(responders), d, c) int64
        Their unpadded coded gradients, in the order of ``responders``.

    Returns
    -------
    ndarray, (d, c) float64
        The decoded gradient sum (reals); charges ``(D_g - alpha + 1) d c`` MACs.
    """
    order = np.argsort(responders)
    F = [int(responders[i]) for i in order]
    a = code.decoding_vector_fixed(F)
    flat = P[order].reshape(len(F), -1)
    return q.decode(q.matmul(a[None, :], flat)[0]).reshape(P.shape[1:])


@kernel(macs=lambda q, code, responders, received, encoded_pads, eps:
        unpad_and_decode_macs(len(responders), *eps.shape),
        out=lambda q, code, responders, received, encoded_pads, eps: Shape(tuple(eps.shape), np.float64))
def unpad_and_decode(q: FixedPoint, code: CyclicGradientCode, responders: Sequence[int],
                     received: Sequence[np.ndarray], encoded_pads: Sequence[tuple], eps) -> np.ndarray:
    """The server's work on one group per epoch: pads removed (Sec. V-B), then eq. (12).

    Parameters
    ----------
    q : FixedPoint
    code : CyclicGradientCode
    responders : sequence of int
        Group-local indices of the ``D_g - alpha + 1`` responders, in arrival order.
    received : sequence of ndarray, (d, c) int64
        Their uploads ``G~_i`` (eq. 11), in the same order.
    encoded_pads : sequence of (PreparedOperand, ndarray)
        Their encoded pads ``(Rbar_i, R_i)`` (:func:`encode_prepared` of the pads), same order.
    eps : ndarray, (d, c) int64
        ``epsilon`` of this epoch in ``Q<k,f>``.

    Returns
    -------
    ndarray, (d, c) float64
        The group's decoded gradient sum; charges :func:`unpad_and_decode_macs` MACs (declared,
        :func:`fednet.algebra.meter.kernel`).
    """
    P = [remove_pads(q, g, coded_gradient(q, Rbar, R, eps)) for g, (Rbar, R) in zip(received, encoded_pads)]
    return decode(q, code, list(responders), np.stack(P))


def encode_macs(alpha: int, d: int, c: int) -> int:
    """MACs of :func:`encode` (and :func:`encode_prepared`): ``alpha (d(d+1)/2 + d c)``."""
    return alpha * share_elements(d, c)


def epoch_macs(d: int, c: int) -> int:
    """MACs of :func:`coded_gradient`: ``d^2 c`` per device and epoch (Sec. V-D)."""
    return d * d * c


def unpad_and_decode_macs(n_responders: int, d: int, c: int) -> int:
    """MACs of :func:`unpad_and_decode`: ``n (d^2 c + d c)`` for ``n`` responders."""
    return n_responders * (d * d * c + d * c)


def plain_gradients(q: FixedPoint, eps: np.ndarray,
                    stats: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """The plain per-device gradients ``X_j^T X_j epsilon + G_j^(1)`` (eq. 11 before encoding), in reals.

    Formed from the same fixed-point data as the protocol (float64, unmetered: the observer's
    work); :func:`decode_error` compares their sum with the decoded gradient and
    :func:`fednet.algebra.capacity.check_round_capacity` checks that they fit ``Q<k,f>``.

    Parameters
    ----------
    q : FixedPoint
    eps : ndarray, (d, c) int64
        ``epsilon`` in ``Q<k,f>`` (eq. 10).
    stats : sequence of (M, G1)
        :func:`local_statistics` of each device: ``M`` (d, d) and ``G1`` (d, c) int64 in ``Q<k,f>``.

    Returns
    -------
    list of ndarray, each (d, c) float64
    """
    e = q.decode(eps)
    return [q.decode(M) @ e + q.decode(G1) for M, G1 in stats]


def decode_error(q: FixedPoint, code: CyclicGradientCode, responders: Sequence[int], G: np.ndarray,
                 eps: np.ndarray, stats: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """Observer's check of eq. (12): decoded minus plain gradient, and its stated bound.

    The plain gradient is formed from the same fixed-point data, ``sum_j (M_j eps + G1_j)`` in
    reals; the bound is :meth:`CyclicGradientCode.error_bound` with the devices' rounding
    error ``e_max = 2^-f (3 + max_col ||eps||_1)`` (two dropped-bit steps, the pad removal and
    the decoding row; module docstring). Not charged (float, unmetered).

    Parameters
    ----------
    q : FixedPoint
    code : CyclicGradientCode
    responders : sequence of int
        Group-local indices used by :func:`decode`.
    G : ndarray, (d, c) float64
        The decoded gradient.
    eps : ndarray, (d, c) int64
        ``epsilon`` in ``Q<k,f>``.
    stats : sequence of (M, G1)
        :func:`local_statistics` of every device of the group, in group order.

    Returns
    -------
    error : float
        ``max |G - plain|``.
    bound : float
        The stated bound on it.
    """
    e = q.decode(eps)
    parts = plain_gradients(q, eps, stats)
    err = float(np.abs(G - sum(parts)).max())
    g_sum = float(sum(np.abs(p).max() for p in parts))
    e_max = 2.0 ** -q.f * (2 + float(np.abs(e).sum(axis=0).max())) + 2.0 ** -q.f
    return err, code.error_bound(g_sum, e_max, responders)


def encode_charge(alpha: int, encode_count: str) -> ContextManager:
    """The accounting rule of a device's encoding (eqs. 8-9), as a context around its kernels.

    Parameters
    ----------
    alpha : int
        Devices each partition is stored on.
    encode_count : {"alpha", "alpha_minus_1"}
        ``"alpha"``: charge what the kernel executes (:func:`encode_macs`, ``alpha`` scaled terms
        per shared element).  ``"alpha_minus_1"``: the paper's count (Sec. V-D),
        ``(alpha - 1) d ((d+1)/2 + c)``: the metered MACs recharged as ``macs // alpha * (alpha - 1)``.
        The server's encoding of the pads stays metered (it does not use this rule).

    Returns
    -------
    context manager
        :func:`contextlib.nullcontext` or :func:`fednet.algebra.meter.recharged`.

    Raises
    ------
    ValueError
        If ``encode_count`` is neither of the two.
    """
    if encode_count == "alpha":
        return contextlib.nullcontext()
    if encode_count != "alpha_minus_1":
        raise ValueError(f"encode_count must be 'alpha' or 'alpha_minus_1', got {encode_count!r}")
    return recharged(lambda macs: macs // alpha * (alpha - 1))


def sharing_steps(alpha: int, groups: Sequence[Sequence[int]], codes: Sequence[CyclicGradientCode],
                  which: Sequence[int]) -> list[list[tuple[int, int]]]:
    """The ``alpha - 1`` relay steps of phase 1 along ``Omega`` (Sec. V-A/C).

    Parameters
    ----------
    alpha : int
        Devices each partition is stored on.
    groups : sequence of sequence of int
        Device indices of each group.
    codes : sequence of CyclicGradientCode
        The ``(alpha, D_g)`` code of each group.
    which : sequence of int
        The groups taking part.

    Returns
    -------
    list of list of (int, int)
        Step ``r - 1`` (``r = 1 .. alpha - 1``) lists ``(source, destination)`` device indices: row
        ``r`` of ``Omega`` names the device whose padded data each device receives.
    """
    return [[(groups[g][codes[g].Omega[r, local]], dev) for g in which for local, dev in enumerate(groups[g])]
            for r in range(1, alpha)]


def check_groups(alpha: int, sizes: Sequence[int]) -> None:
    """Refuse ``alpha`` above the smallest group size (Sec. V-E: each group is coded on its own).

    Parameters
    ----------
    alpha : int
    sizes : sequence of int
        The group sizes ``D_g`` (:func:`fednet.topologies.groups.group_sizes`).

    Raises
    ------
    ValueError
        Naming ``alpha``, the smallest size, and the number of groups and devices.
    """
    smallest = min(sizes)
    if alpha > smallest:
        raise ValueError(f"alpha must be at most the smallest group size ({smallest} with "
                         f"{len(sizes)} groups of {sum(sizes)} devices), got {alpha}")


def check_dropout(alpha: int, sizes: Sequence[int], dropout: float) -> None:
    """Refuse a dropout that leaves, on average, fewer than ``D_g - alpha + 1`` devices of a group (eq. 12).

    Parameters
    ----------
    alpha : int
    sizes : sequence of int
        The group sizes ``D_g``.
    dropout : float
        Probability that a device is unavailable in a round, in ``[0, 1]``.

    Raises
    ------
    ValueError
        Naming ``network.dropout``, the group and the decoder's need.
    """
    for g, size in enumerate(sizes):
        need, mean = size - alpha + 1, size * (1.0 - dropout)
        if mean < need:
            raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of the {size} devices of group {g} "
                             f"available on average, fewer than the D_g - alpha + 1 = {need} its decoder needs "
                             f"(alpha = {alpha}); raise alpha or lower dropout")


def group_codes(alpha: int, sizes: Sequence[int], rngs: Sequence[np.random.Generator], q: FixedPoint,
                code_fraction_bits: int, code_draws: int, search: bool) -> list[CyclicGradientCode]:
    """The ``(alpha, D_g)`` cyclic gradient code of each group (Sec. V-A, V-E; Tandon et al.).

    Parameters
    ----------
    alpha : int
        Devices each partition is stored on.
    sizes : sequence of int
        The group sizes ``D_g``.
    rngs : sequence of numpy.random.Generator
        One public stream per group (the codes are public).
    q : FixedPoint
        ``Q<k,f>`` of the data (the decoding vectors' format).
    code_fraction_bits : int
        ``f_B``: ``B`` is quantised to ``Q<min(62, f_B + 24), f_B>``.
    code_draws : int
        Candidate ``H`` matrices drawn per code when ``search`` (best conditioned kept).
    search : bool
        Whether to search for well-conditioned codes (exact decoding); False builds one draw and
        one decoding pattern (timing mode needs only the code's shape).

    Returns
    -------
    list of CyclicGradientCode
    """
    bq = FixedPoint(min(62, code_fraction_bits + 24), code_fraction_bits)
    return [CyclicGradientCode(alpha, size, rng, fixed_point=bq, a_format=q, n_draws=code_draws if search else 1,
                               max_patterns=2000 if search else 1) for size, rng in zip(sizes, rngs)]


def padded_statistics(q: FixedPoint, bits: int, X: np.ndarray, Y: np.ndarray, rng: np.random.Generator) -> tuple:
    """A device's offline phase 1 (Sec. VII): :func:`local_statistics`, then :func:`pad` (eqs. 6-7).

    Parameters
    ----------
    q : FixedPoint
    bits : int
        The ring width ``W`` (:func:`ring_bits`).
    X : ndarray, (m_i, d) float
    Y : ndarray, (m_i, c) float
    rng : numpy.random.Generator
        The device's secret pad stream.

    Returns
    -------
    M, G1, Phi, Psi, RX, RG : ndarray
        ``X_i^T X_i`` (d, d) and ``G_i^(1)`` (d, c) int64 in ``Q<k,f>``, then :func:`pad`'s outputs.
    """
    M, G1 = local_statistics(q, X, Y)
    return (M, G1) + tuple(pad(q, bits, M, G1, rng))


def padded_statistics_shapes(bits: int, d: int, c: int) -> tuple:
    """Shapes of :func:`padded_statistics`' outputs (timing mode's stand-ins)."""
    limbs = -(-bits // 16)
    return ((d, d), (d, c)) + ((limbs, d * (d + 1) // 2), (limbs, d, c)) * 2


def encoded_shapes(out_bits: int, d: int, c: int) -> tuple:
    """Shapes of :func:`encode_prepared`'s outputs, ``Cbar`` (d, d) and ``C`` (limbs of ``out_bits``, d, c)."""
    return (d, d), (-(-out_bits // 16), d, c)


def check_decoding(q: FixedPoint, code: CyclicGradientCode, responders: Sequence[int], G: np.ndarray,
                   eps: np.ndarray, stats: Sequence[tuple[np.ndarray, np.ndarray]], *,
                   what: str) -> tuple[float, float]:
    """Observer's check of a group's round (not charged): capacity of eq. (11), then :func:`decode_error`.

    Parameters
    ----------
    q, code, responders, G, eps, stats
        As :func:`decode_error`.
    what : str
        The round and group, for the capacity message.

    Returns
    -------
    error, bound : float
        :func:`decode_error`.

    Raises
    ------
    fednet.errors.CapacityError
        If a device's, a coded or the decoded gradient overflows ``Q<k,f>``
        (:func:`fednet.algebra.capacity.check_round_capacity`).
    """
    check_round_capacity(q, plain_gradients(q, eps, stats), code.B, what=what)
    return decode_error(q, code, responders, G, eps, stats)


def check_wire_bits(config, name: str) -> None:
    """Refuse a wire width set below the ``k`` bits of the ``Q<k,f>`` numbers it carries (the traffic would be
    counted too short; issue 33). Only widths the configuration sets itself are checked (the defaults are the
    papers' 48 bits whatever ``k``). ``name`` is the protocol's, for the message."""
    for key in ("element_bits", "share_element_bits"):
        bits = getattr(config, key, None)
        if key in getattr(config, "model_fields_set", ()) and bits is not None and bits < config.k:
            raise ValueError(f"{key} = {bits} is below the k = {config.k} bits of a Q<{config.k},{config.f}> number "
                             f"that {name} sends: its traffic would be counted too short; use {key} >= {config.k}")
