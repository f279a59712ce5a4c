"""Quantisation of real vectors into a prime field: ``round(x 2**b)``, negatives to ``q + v``.

Source: So et al., "LightSecAgg" (MLSys 2022), the quantisation of the model updates before masking
(summary in ``shared/references.md``); moved here from ``fednet.codes.lagrange`` (issue 9).
"""

from __future__ import annotations

import numpy as np

from fednet.algebra.fields import check_field_capacity, from_field, to_field

__all__ = ["quantize", "dequantize", "stochastic_round"]


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
        If ``x`` holds a non-finite number.
    fednet.errors.CapacityError
        (a ``ValueError``) If ``n_summands * max|round(x 2**b)|`` does not fit the signed range of
        GF(q) (needs ``|sum x| 2**b < q / 2``); the message gives the smallest prime that works.
        Values beyond int64 are quantised exactly (Python ints).
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


def stochastic_round(z, rng: np.random.Generator, *, den: int = 1) -> np.ndarray:
    """Unbiased stochastic rounding (DReS-FL ``Q``, eq. 7; FedVS ``Round_stoc``, eq. 3): ``floor(z)`` w.p. ``1 - frac(z)``, else ``floor(z) + 1``.

    Parameters
    ----------
    z : ndarray of float, or of int (Python or int64) numerators when ``den`` is given
        Values to round; with ``den > 1`` the value is the exact rational ``z / den``.
    rng : numpy.random.Generator
        The server's secret stream (one uniform draw per element).
    den : int
        Positive common denominator for exact rational input.

    Returns
    -------
    ndarray, same shape
        Integers: int64 for float input, Python ints (object) for integer numerators.
        ``E[Q(z)] = z`` up to the float64 rounding of ``frac(z)``; ``|Q(z) - z| < 1``.

    Raises
    ------
    ValueError
        If ``den < 1`` or a float input is not finite.
    """
    den = int(den)
    if den < 1:
        raise ValueError(f"den must be a positive integer, got {den}")
    z = np.asarray(z)
    u = rng.random(z.shape)
    if z.dtype.kind == "f":
        if den != 1:
            z = z / den
        if z.size and not np.all(np.isfinite(z)):
            raise ValueError("z must be finite")
        fl = np.floor(z)
        return (fl + (u < (z - fl))).astype(np.int64)
    num = z.astype(object)
    fl = num // den
    rem = num - fl * den
    frac = rem.astype(np.float64) / float(den)  # rem < den: probability to float64 precision
    return fl + (u < frac).astype(np.int64).astype(object)
