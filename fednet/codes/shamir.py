"""Shamir secret sharing of matrices over GF(q) with parameters (n', k').

Shamir, "How to share a secret", CACM 1979; as used by Schlegel et al., "CodedPaddedFL and
CodedSecAgg", Sec. II-D and VI: a secret ``x`` is encoded together with ``k' - 1`` independent
uniform matrices ``R_1, ..., R_{k'-1}`` by a non-systematic (n', k') Reed-Solomon code,

    share_i = f(alpha_i),    f(t) = x + R_1 t + ... + R_{k'-1} t**(k'-1),

at distinct nonzero points ``alpha_1..alpha_{n'}`` (default ``alpha_i = i``).  Any ``k'`` shares
determine ``x = f(0)`` by Lagrange interpolation; any ``k' - 1 = z`` shares are independent and
uniform whatever ``x`` (privacy against ``z`` colluders; the paper requires ``k' > z``).

Sharing is linear: the sum of sharings (same points) shares the sum of the secrets, and a public
scalar times a sharing shares the scaled secret; :func:`add_shares` and :func:`scale_shares` are
those operations.  All products go through the exact metered kernels of
:mod:`fednet.algebra.modp` (encoding charges ``n' k' size`` MACs, decoding ``k' size``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fednet.algebra.fields import as_field, distinct_points, field_dtype, lagrange_coefficients, uniform, vandermonde
from fednet.algebra.modp import add_mod, lincomb_mod, scale_mod

__all__ = [
    "default_points",
    "check_shamir_parameters",
    "shamir_share",
    "shamir_reconstruct",
    "reconstruction_coefficients",
    "add_shares",
    "scale_shares",
]


def default_points(n_prime: int) -> list[int]:
    """Evaluation points ``alpha_i = i`` for ``i = 1..n'`` (device ``i`` of a group holds share ``i``)."""
    return list(range(1, int(n_prime) + 1))


def check_shamir_parameters(n_prime: int, k_prime: int, q: int, z: int | None = None) -> None:
    """Validate (n', k') Shamir parameters over GF(q), and ``k' > z`` when ``z`` is given.

    Parameters
    ----------
    n_prime : int
        Number of shares (devices in the group), ``n' >= k'``.
    k_prime : int
        Reconstruction threshold, ``1 <= k' <= n'``.
    q : int
        Field order; needs ``q > n'`` for ``n'`` distinct nonzero points.
    z : int, optional
        Number of colluding agents to protect against (Schlegel et al., Sec. III-C), ``k' > z``.

    Raises
    ------
    ValueError
        Naming the violated parameter and its value.
    """
    if not isinstance(k_prime, (int, np.integer)) or k_prime < 1:
        raise ValueError(f"k_prime must be an integer >= 1, got {k_prime!r}")
    if not isinstance(n_prime, (int, np.integer)) or n_prime < k_prime:
        raise ValueError(f"n_prime must be an integer >= k_prime = {k_prime}, got {n_prime!r}")
    if int(q) <= n_prime:
        raise ValueError(f"q = {q} too small for n_prime = {n_prime} distinct nonzero points")
    if z is not None and not (isinstance(z, (int, np.integer)) and 0 <= z < k_prime):
        raise ValueError(f"z must satisfy 0 <= z < k_prime = {k_prime} (k' > z), got {z!r}")


def shamir_share(
    secret: np.ndarray,
    n_prime: int,
    k_prime: int,
    q: int,
    rng: np.random.Generator,
    points: Sequence[int] | None = None,
) -> np.ndarray:
    """Share a matrix over GF(q) into ``n'`` Shamir shares with threshold ``k'``.

    Parameters
    ----------
    secret : ndarray, any shape S, over GF(q)
        Canonical field elements (e.g. ``to_field(2**f * G_i)``, Remark 3).
    n_prime, k_prime : int
        Number of shares and reconstruction threshold (Sec. II-D).
    q : int
        Field order (prime).
    rng : numpy.random.Generator
        Protocol-secrets stream; draws the ``k' - 1`` uniform matrices ``R_t``.
    points : sequence of int, optional
        ``n'`` distinct nonzero evaluation points; default ``1..n'``.

    Returns
    -------
    ndarray, shape (n', *S), over GF(q)
        ``shares[i] = f(points[i])``.  Charges ``n' * k' * size`` MACs (the Vandermonde product).

    Raises
    ------
    ValueError
        On invalid parameters, points, or secret values.
    """
    check_shamir_parameters(n_prime, k_prime, q)
    secret = as_field(secret, q, name="secret")
    pts = distinct_points(default_points(n_prime) if points is None else points, q, nonzero=True)
    if len(pts) != n_prime:
        raise ValueError(f"points must have n_prime = {n_prime} entries, got {len(pts)}")
    coeffs = np.empty((k_prime,) + secret.shape, dtype=field_dtype(q))
    coeffs[0] = secret
    if k_prime > 1:
        coeffs[1:] = uniform(rng, q, (k_prime - 1,) + secret.shape)
    V = vandermonde(pts, k_prime, q)  # (n', k')
    return lincomb_mod(V, coeffs, q)


def reconstruction_coefficients(points: Sequence[int], q: int, at: int = 0) -> np.ndarray:
    """Lagrange weights ``lambda_j = l_j(at)`` over GF(q) for shares at ``points``.

    Returns
    -------
    ndarray, shape (len(points),), over GF(q)
        ``f(at) = sum_j lambda_j f(points[j])`` for every polynomial of degree ``< len(points)``.
    """
    return lagrange_coefficients(points, [at], q)[0]


def shamir_reconstruct(shares: np.ndarray, points: Sequence[int], k_prime: int, q: int) -> np.ndarray:
    """Recover the secret ``f(0)`` from at least ``k'`` shares.

    Parameters
    ----------
    shares : ndarray, shape (r, *S), over GF(q)
        Shares ``f(points[j])``, ``r >= k'``; only the first ``k'`` are used.
    points : sequence of int, length r
        Their distinct nonzero evaluation points.
    k_prime : int
        Threshold of the sharing.
    q : int

    Returns
    -------
    ndarray, shape S, over GF(q); charges ``k' * size`` MACs.

    Raises
    ------
    ValueError
        If fewer than ``k'`` shares are given, or the points do not match the shares.
    """
    shares = np.asarray(shares)
    pts = distinct_points(points, q, nonzero=True)
    if len(pts) != shares.shape[0]:
        raise ValueError(f"points has {len(pts)} entries for {shares.shape[0]} shares")
    if shares.shape[0] < k_prime:
        raise ValueError(
            f"need at least k_prime = {k_prime} shares to reconstruct, got {shares.shape[0]}"
        )
    lam = reconstruction_coefficients(pts[:k_prime], q)
    return lincomb_mod(lam, as_field(shares[:k_prime], q, name="shares"), q)


def add_shares(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """Share of ``x + y`` from shares of ``x`` and ``y`` at the same point (linearity); ``size`` MACs."""
    return add_mod(a, b, q)


def scale_shares(c: int, a: np.ndarray, q: int) -> np.ndarray:
    """Share of ``c x`` from a share of ``x`` for a public scalar ``c`` (linearity); ``size`` MACs."""
    return scale_mod(c, a, q)
