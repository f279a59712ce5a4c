"""The share math of CodedSecAgg (pure: arrays in, arrays out, metered kernels inside).

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler mitigation
and secure aggregation in federated learning", Sec. VI (eq. 13, Remark 3), Sec. VI-D (the inter-group
tree, eqs. 14-15, Fig. 3).  The protocol (``protocols/codedsecagg.py``) moves these values around.

Number system (Remark 3)
    Data are ``Q<k,f>`` integers; all share arithmetic is over GF(q) with q the smallest prime
    above ``2**(k+f)`` (``2**72 + 15`` for ``Q<48,24>``), signed integers mapped ``-x -> q - x``.
    Scaling is postponed until after decoding: ``X_i^T X_i`` is shared at scale ``2**f`` and the
    first gradient at scale ``2**(2f)`` (``G_i^(1)`` multiplied by ``2**f`` before encoding), so
    ``Psi + Phi epsilon`` is an exact integer at scale ``2**(2f)`` and the decoded aggregate equals
    ``sum_i (2**f G_i^(1) + M_i epsilon)`` *exactly* in the field.  A decoded value outside
    ``Z_<k+f>`` raises (never wraps silently).  Field elements travel as ``share_element_bits``
    bits (default ``q.bit_length()`` = 73; the paper counts ``k + f`` = 72).

What each party sees
    A device sees ``epsilon`` (public in FL), one share of every group-mate's ``M_j`` and
    ``2**f G_j^(1)`` (any ``z < k'`` colluders learn nothing: Shamir), and in phase 2 running sums
    of one share of other groups' gradients.  The server sees only the ``k'`` master-group shares of
    ``G^(e)`` per round, which determine ``G^(e)`` and nothing else (relayed messages are
    encrypted: the engine keeps them in the server's ``relayed`` list, not its view).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import ContextManager

import networkx as nx
import numpy as np

from fednet.algebra.capacity import check_fixed_point_holds
from fednet.algebra.fields import (check_field_capacity, field_dtype, fixed_point_field, from_field, paper_field,
                                   to_field)
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import kernel, recharged
from fednet.algebra.modp import PreparedMatrix, add_mod, sum_mod
from fednet.algebra.shape import Repeated, Shape
from fednet.codes.gram import local_statistics, pack_upper, unpack_upper
from fednet.codes.shamir import check_shamir_parameters, shamir_reconstruct, shamir_share

__all__ = ["shamir_share_macs", "share_secrets", "device_secrets", "secret_shapes", "share_device_secrets",
           "combine_shares", "device_share",
           "add_shares", "decode_aggregate", "decode_shares", "column_tree",
           "check_aggregate", "field_prime", "share_size", "combine_macs", "device_share_macs", "add_macs",
           "decode_macs", "widened", "check_groups", "check_dropout"]


def shamir_share_macs(n_prime: int, k_prime: int, size: int) -> int:
    """MACs :func:`fednet.codes.shamir.shamir_share` meters for ``size`` elements (``n' k' size``).

    The closed form timing mode charges (full mode checks it against the metered kernel every call).
    """
    return int(n_prime) * int(k_prime) * int(size)


def share_secrets(fp: FixedPoint, q: int, M: np.ndarray, G1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two secrets of device i (Remark 3): ``pack_upper(M_i)`` and ``2**f G_i^(1)`` over GF(q).

    Parameters
    ----------
    fp : FixedPoint
        ``Q<k,f>``.
    q : int
        The field, ``q > 2**(k+f)``.
    M : ndarray, (d, d) int64
        ``X_i^T X_i`` in ``Q<k,f>`` (scale ``2**f``).
    G1 : ndarray, (d, c) int64
        ``G_i^(1)`` in ``Q<k,f>``.

    Returns
    -------
    phi : ndarray, (d(d+1)/2,) over GF(q)
    psi : ndarray, (d, c) over GF(q)
        ``G1 * 2**f`` (scale ``2**(2f)``).

    Raises
    ------
    ValueError
        If ``q`` cannot hold ``Z_<k+f>`` integers (``q > 2**(k+f)``), or, for a smaller field such
        as the 72-bit :func:`fednet.algebra.fields.paper_field`, the secrets themselves (a
        capacity message naming the largest magnitude).
    """
    if q > 2 ** (fp.k + fp.f):
        check_field_capacity(q, 2 ** (fp.k + fp.f - 1), what=f"Z_<k+f> integers (Q<{fp.k},{fp.f}>, Remark 3)")
    else:                                   # a (k+f)-bit field: check the values actually shared
        top = max([0] + [int(abs(int(v))) for v in (M.min(), M.max())] +
                  [int(abs(int(v))) << fp.f for v in (G1.min(), G1.max())])
        check_field_capacity(q, top, what=f"the secrets X_i^T X_i and 2**f G_i^(1) (Q<{fp.k},{fp.f}>, Remark 3)")
    phi = to_field(pack_upper(M), q, name="M")
    psi = to_field(G1.astype(object) * (1 << fp.f), q, name="G1 * 2**f")
    return phi, psi


def device_secrets(fp: FixedPoint, q: int, X: np.ndarray, Y: np.ndarray) -> tuple:
    """A device's offline phase 1 (Sec. VII): :func:`~fednet.codes.gram.local_statistics`, then :func:`share_secrets`.

    Parameters
    ----------
    fp : FixedPoint
        ``Q<k,f>``.
    q : int
        The field (:func:`field_prime`).
    X : ndarray, (m_i, d) float
    Y : ndarray, (m_i, c) float

    Returns
    -------
    M, G1, phi, psi : ndarray
        ``X_i^T X_i`` (d, d) and ``G_i^(1)`` (d, c) int64 in ``Q<k,f>`` (the observer's), then the two
        secrets of :func:`share_secrets` over GF(q).
    """
    M, G1 = local_statistics(fp, X, Y)
    return (M, G1) + share_secrets(fp, q, M, G1)


def secret_shapes(d: int, c: int) -> tuple:
    """Shapes of the two secrets of :func:`share_secrets`, ``(d(d+1)/2,)`` and ``(d, c)`` (timing mode's stand-ins)."""
    return (d * (d + 1) // 2,), (d, c)


@kernel(macs=lambda phi, psi, n_prime, k_prime, q, rng, points: shamir_share_macs(n_prime, k_prime,
                                                                                 phi.size + psi.size),
        out=lambda phi, psi, n_prime, k_prime, q, rng, points:
        Repeated((Shape(tuple(phi.shape), field_dtype(q)), Shape(tuple(psi.shape), field_dtype(q))), n_prime))
def share_device_secrets(phi: np.ndarray, psi: np.ndarray, n_prime: int, k_prime: int, q: int,
                         rng: np.random.Generator, points: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sec. VI-A: Shamir ``(n', k')`` shares of both secrets of one device.

    Returns
    -------
    list of (phi_j, psi_j), one per device ``j`` of the group
        Each of the secrets' shapes over GF(q); charges ``n' k' (d(d+1)/2 + d c)`` MACs
        (:func:`shamir_share_macs`; declared, :func:`fednet.algebra.meter.kernel`).  Timing mode's stand-in: a
        :class:`~fednet.algebra.shape.Repeated` of ``n'`` references to one pair of stand-ins (``O(1)`` memory).
    """
    sp = shamir_share(phi, n_prime, k_prime, q, rng, points)
    sg = shamir_share(psi, n_prime, k_prime, q, rng, points)
    return [(sp[j], sg[j]) for j in range(n_prime)]


@kernel(macs=lambda shares, q, d, rhs_bits: combine_macs(len(shares), shares[0][0].size + shares[0][1].size),
        out=lambda shares, q, d, rhs_bits: (None, Shape(tuple(shares[0][1].shape), field_dtype(q))))
def combine_shares(shares: Sequence[tuple[np.ndarray, np.ndarray]], q: int, d: int,
                   rhs_bits: int) -> tuple[PreparedMatrix, np.ndarray]:
    """Sec. VI-A: a device sums the ``n'`` shares it holds into ``Phi^(i)`` (prepared, ``(d, d)``) and ``Psi^(i)``.

    Parameters
    ----------
    shares : sequence of (phi_j, psi_j)
        Its own share and those received, each ``((d(d+1)/2,), (d, c))`` over GF(q).
    q, d : int
    rhs_bits : int
        Bits of the signed right-hand operands ``Phi`` will multiply (``k``).

    Returns
    -------
    Phi : PreparedMatrix, (d, d) over GF(q)
    Psi : ndarray, (d, c) over GF(q)
        Charges ``(n' - 1)(d(d+1)/2 + d c)`` MACs (:func:`combine_macs`; declared,
        :func:`fednet.algebra.meter.kernel`; timing mode carries no stand-in of ``Phi``, only ``Psi``'s).
    """
    phi = sum_mod([s[0] for s in shares], q)
    psi = sum_mod([s[1] for s in shares], q)
    return PreparedMatrix(unpack_upper(phi, d), q, rhs_bits=rhs_bits), psi


@kernel(macs=lambda Phi, Psi, eps, q: device_share_macs(*Psi.shape),
        out=lambda Phi, Psi, eps, q: Shape(tuple(Psi.shape), field_dtype(q)))
def device_share(Phi: PreparedMatrix, Psi: np.ndarray, eps: np.ndarray, q: int) -> np.ndarray:
    """Eq. (13): ``G~ = Psi + Phi epsilon`` over GF(q).

    Parameters
    ----------
    Phi : PreparedMatrix, (d, d) over GF(q)
    Psi : ndarray, (d, c) over GF(q)
    eps : ndarray, (d, c) int64
        ``epsilon`` in ``Q<k,f>`` (signed integers, mapped to the field by the kernel).
    q : int

    Returns
    -------
    ndarray, (d, c) over GF(q); charges ``d^2 c + d c`` MACs (:func:`device_share_macs`; declared,
    :func:`fednet.algebra.meter.kernel`).
    """
    return add_mod(Psi, Phi.matmul_signed(eps), q)


@kernel(macs=lambda acc, part, q: add_macs(*acc.shape), out=lambda acc, part, q: Shape(tuple(acc.shape), field_dtype(q)))
def add_shares(acc: np.ndarray, part: np.ndarray, q: int) -> np.ndarray:
    """Eq. (15): a device adds the running sum it received from the child group, ``(d, c)`` over GF(q); charges
    ``d c`` MACs (:func:`add_macs`; declared, :func:`fednet.algebra.meter.kernel`)."""
    return add_mod(acc, part, q)


def decode_aggregate(shares: np.ndarray, points, k_prime: int, q: int, k: int, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Server: interpolate ``G^(e)`` from ``k'`` shares and scale it (Remark 3).

    Parameters
    ----------
    shares : ndarray, (k', d, c) over GF(q)
    points : sequence of int
        The shares' evaluation points.
    k_prime, q, k, f : int

    Returns
    -------
    exact : ndarray, (d, c) object
        The signed integer aggregate (scale ``2**(2f)``), exactly ``sum_i (2**f G_i^(1) + M_i eps)``.
    G : ndarray, (d, c) float64
        ``exact * 2**(-2f)``.  Charges ``k' d c`` MACs.

    Raises
    ------
    OverflowError
        If the decoded value leaves ``Z_<k+f>`` (the aggregate overflowed ``Q<k,f>``).
    """
    field = shamir_reconstruct(shares, points, k_prime, q)
    exact = from_field(field, q).astype(object)
    lim = 1 << (k + f - 1)
    if exact.size and (exact.max() >= lim or exact.min() < -lim):
        raise OverflowError(f"decoded aggregate leaves Z_<k+f> = Z_<{k + f}>: the gradient overflowed Q<{k},{f}>")
    G = np.array([float(v) for v in exact.ravel()], dtype=np.float64).reshape(exact.shape) * 2.0 ** (-2 * f)
    return exact, G


@kernel(macs=lambda shares, points, k_prime, q, k, f: decode_macs(k_prime, *shares[0].shape),
        out=lambda shares, points, k_prime, q, k, f: (Shape(tuple(shares[0].shape), object),
                                                      Shape(tuple(shares[0].shape), np.float64)))
def decode_shares(shares: Sequence[np.ndarray], points, k_prime: int, q: int, k: int, f: int):
    """:func:`decode_aggregate` of a list of ``k'`` shares (each ``(d, c)``): ``(exact, G)``, (d, c) object and
    float64; charges :func:`decode_macs` (declared, :func:`fednet.algebra.meter.kernel`)."""
    return decode_aggregate(np.stack(shares), points, k_prime, q, k, f)


def column_tree(groups: Sequence[Sequence[int]], steps: Sequence[Sequence[tuple[int, int]]]) -> nx.DiGraph:
    """The device-level aggregation forest of Sec. VI-D: device ``i`` of a sending group feeds device ``i`` of its receiver.

    Parameters
    ----------
    groups : sequence of sequences of int
        Device indices of each group (equal sizes ``n'``); group 0 is the master group.
    steps : sequence of sequences of (int, int)
        The group-level steps (sender group, receiver group), e.g.
        :func:`fednet.codes.secagg_tree.aggregation_tree`.

    Returns
    -------
    networkx.DiGraph
        Nodes: device indices, group by group (attributes ``group``, ``column``); edges child ->
        parent with attribute ``step``. The roots are the master group's devices, one per column.
    """
    tree = nx.DiGraph()
    for g, members in enumerate(groups):
        for i, dev in enumerate(members):
            tree.add_node(dev, group=g, column=i)
    for s, step in enumerate(steps):
        for src, dst in step:
            for i in range(len(groups[src])):
                tree.add_edge(groups[src][i], groups[dst][i], step=s)
    return tree


def check_aggregate(exact: np.ndarray, G: np.ndarray, Ms: Sequence[np.ndarray], G1s: Sequence[np.ndarray],
                    eps: np.ndarray, f: int, *, fp: FixedPoint | None = None,
                    what: str = "the aggregate gradient") -> float:
    """The observer's check of a decoded aggregate against an independent computation (not charged).

    ``d <= 256``: Python-int arithmetic, exact.  Larger ``d``: the same identity modulo the
    independent prime ``2**61 - 1`` (sum of the ``M_i`` in int64, then one exact modular product),
    which a wrong entry passes with probability about ``2**-61``.  With ``fp``, the plain
    aggregate is first checked to fit ``Q<k,f>`` (:func:`fednet.algebra.capacity.check_fixed_point_holds`):
    an aggregate beyond ``q / 2`` wraps *into* ``Z_<k+f>`` modulo ``q`` and would otherwise be
    reported as a wrong decoding rather than a too-narrow format.

    Parameters
    ----------
    exact : ndarray, (d, c) object
        The decoded integer aggregate (scale ``2**(2f)``).
    G : ndarray, (d, c) float64
        Its scaled value.
    Ms, G1s : sequences of ndarray, (d, d) and (d, c) int64
        Every device's ``X_i^T X_i`` and ``G_i^(1)`` in ``Q<k,f>``.
    eps : ndarray, (d, c) int64
    f : int
    fp : FixedPoint, optional
        The format ``Q<k,f>`` the aggregate must fit (Remark 3).
    what : str
        The aggregate, for the capacity message (e.g. ``"the aggregate gradient of round 3"``).

    Returns
    -------
    float
        Max-norm difference between ``G`` and the float64 plain computation on the same data.

    Raises
    ------
    fednet.errors.CapacityError
        With ``fp``, if the plain aggregate does not fit ``Q<k,f>`` (naming ``k``, the bound and
        the smallest ``k``).
    AssertionError
        If the decoded integers differ from the exact aggregate.
    """
    d = Ms[0].shape[0]
    M_total = np.zeros((d, d), dtype=np.int64)
    for M in Ms:                            # |M_i| < 2**(k-1), D < 2**14: no int64 overflow
        M_total += M
    G1_total = sum(g.astype(object) for g in G1s) * (1 << f)
    plain = (M_total.astype(np.float64) @ (eps.astype(np.float64) * 2.0**-f) * 2.0**-f
             + np.array([float(v) for v in G1_total.ravel()]).reshape(G.shape) * 2.0 ** (-2 * f))
    if fp is not None:
        check_fixed_point_holds(fp, float(np.abs(plain).max()), what)
    if d <= 256:
        want = M_total.astype(object).dot(eps.astype(object)) + G1_total
        ok = np.array_equal(exact, want)
    else:
        p2 = 2**61 - 1
        lhs = (exact % p2).astype(np.int64)
        prod = PreparedMatrix(M_total % p2, p2).matmul(eps % p2)   # canonical residues mod p2
        rhs = (prod.astype(object) + G1_total) % p2
        ok = np.array_equal(lhs.astype(object), rhs)
    if not ok:
        raise AssertionError("decoded CodedSecAgg aggregate differs from the exact fixed-point aggregate")
    return float(np.abs(G - plain).max())


def field_prime(k: int, f: int, choice: str = "next_above") -> int:
    """The prime q of Remark 3 for ``Q<k,f>`` data.

    Parameters
    ----------
    k, f : int
        The fixed-point format.
    choice : {"next_above", "largest_below"}
        ``"next_above"``: the smallest prime above ``2**(k+f)`` (``2**72 + 15``, 73 bits for
        ``Q<48,24>``); the signed map is a bijection on all of ``Z_<k+f>``.  ``"largest_below"``:
        the largest prime below ``2**(k+f)`` (``2**72 - 93``, 72 bits: the ``k + f`` bits the paper
        counts, Remark 3 and Sec. VI-C).  It carries signed integers up to ``(q-1)/2 = 2**71 - 47``
        in magnitude, i.e. all of ``Z_<k+f>`` but the 47 values nearest each end: a secret outside
        that range is refused with a capacity message when it is shared (:func:`share_secrets`).
        At the paper's sizes it decodes exactly: on fig7_mnist (D = 120, d = 2000, c = 10) the
        secrets reach ``|M_i| = 0.42`` and ``|G_i^(1)| = 14.3`` and the aggregate ``|G| = 189.5``
        over 600 epochs of the trajectory, 44,000 times below the field's ``(q-1)/2 / 2**(2f) =
        2**23`` (measured when this option landed).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``choice`` is neither of the two.
    """
    if choice == "largest_below":
        return paper_field(k, f)
    if choice != "next_above":
        raise ValueError(f"field_prime must be 'next_above' or 'largest_below', got {choice!r}")
    return fixed_point_field(k, f)


def share_size(d: int, c: int) -> int:
    """Field elements of a device's two secrets: ``d(d+1)/2`` (upper triangle, Remark 1) ``+ d c``."""
    return d * (d + 1) // 2 + d * c


def combine_macs(n_prime: int, size: int) -> int:
    """MACs of :func:`combine_shares`: ``(n' - 1) size`` additions (Sec. VI-A)."""
    return (n_prime - 1) * size


def device_share_macs(d: int, c: int) -> int:
    """MACs of :func:`device_share` (eq. 13): ``d^2 c + d c``."""
    return d * d * c + d * c


def add_macs(d: int, c: int) -> int:
    """MACs of :func:`add_shares` (a tree addition, eq. 15): ``d c``."""
    return d * c


def decode_macs(k_prime: int, d: int, c: int) -> int:
    """MACs of :func:`decode_shares` (interpolation at 0 from ``k'`` shares): ``k' d c``."""
    return k_prime * d * c


def widened(k: int, f: int, on: bool) -> ContextManager:
    """Remark 3's cost of integer work in ``Z_<k+f>``, as a context around a device's kernels.

    Parameters
    ----------
    k, f : int
        The fixed-point format.
    on : bool
        ``widen_compute``: charge ``ceil(macs (k + f) / k)`` for the block's metered MACs
        (:func:`fednet.algebra.meter.recharged`); False charges them as metered.

    Returns
    -------
    context manager
    """
    if not on:
        return contextlib.nullcontext()
    return recharged(lambda macs: -(-macs * (k + f) // k))


def check_groups(n_devices: int, n_groups: int, k_prime: int, q: int, z: int) -> None:
    """Refuse N not dividing D, groups smaller than k', or k' <= z (Sec. VI-D).

    Parameters
    ----------
    n_devices, n_groups : int
        D and N.
    k_prime, z : int
        The Shamir threshold and the number of colluders.
    q : int
        The field (:func:`field_prime`).

    Raises
    ------
    ValueError
        Naming the offending parameter and its value.
    """
    if n_groups > n_devices or n_devices % n_groups:
        raise ValueError(f"groups must divide the number of devices ({n_devices}), got {n_groups}")
    n_prime = n_devices // n_groups
    if n_prime < k_prime:
        raise ValueError(f"every group needs at least k_prime = {k_prime} devices; groups = {n_groups} gives {n_prime}")
    check_shamir_parameters(n_prime, k_prime, q, z=z)


def check_dropout(n_devices: int, n_groups: int, k_prime: int, dropout: float) -> None:
    """Refuse a dropout that leaves fewer than k' complete columns on average (Sec. VI-D).

    A column (device ``i`` of every group) reaches the server only if all its ``N`` devices are
    present: on average ``n' (1 - dropout)^N`` columns of ``n' = D / N``.

    Parameters
    ----------
    n_devices, n_groups, k_prime : int
        D, N and k'.
    dropout : float
        Probability that a device is unavailable in a round, in ``[0, 1]``.

    Raises
    ------
    ValueError
        Naming ``network.dropout`` and the decoder's need.
    """
    n_prime = n_devices // n_groups
    mean = n_prime * (1.0 - dropout) ** n_groups
    if mean < k_prime:
        raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of {n_prime} share columns complete on "
                         f"average (all {n_groups} groups present), fewer than the k_prime = {k_prime} the decoder "
                         f"needs; lower k_prime, groups or dropout")
