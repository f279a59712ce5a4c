"""Arrays of wide signed integers (a few hundred bits) as 16-bit digit columns, exact without Python ints.

Why: DReS-FL's timing mode (:mod:`fednet.protocols.dresfl`) computes, every round, the plain integer
gradient of the global minibatch (~150-bit integers, ``d_w = 55,050`` of them at 784-64-64-10) and the exact
update of eq. (7) on it: a float64 norm for clipping, then ``floor`` and the fractional part of
``g c / 2^E`` for the stochastic rounding Q.  As Python ints (object arrays) that costs tens of milliseconds
per round in per-element interpreter work; on digit columns it is a handful of NumPy passes.

Representation: :class:`WideInts` holds ``digits`` of int64, shape ``(*shape, nd)``, every digit in
``[0, 2^16)``, low digit first: the two's complement of each value modulo ``2^(16 nd)``, so the values are the
signed integers in ``[-2^(16 nd - 1), 2^(16 nd - 1))``.  Every operation is exact; the float conversions are
correctly rounded (round half to even), i.e. they give the bits ``float(int)`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WideInts", "carry_digits"]

_B = 16
_MASK = 0xFFFF


def carry_digits(d: np.ndarray) -> np.ndarray:
    """Normalise int64 digit columns (any signs, ``|d| < 2^62``) to ``[0, 2^16)`` modulo ``2^(16 nd)``, in place.

    Parameters
    ----------
    d : ndarray of int64, shape (n, nd)
        ``sum_j d[:, j] 2^(16 j)`` for any integer digits.

    Returns
    -------
    ndarray
        ``d`` itself, holding the digits of that sum modulo ``2^(16 nd)`` (the carry out of the top digit is
        dropped: two's complement wrap-around).
    """
    for j in range(d.shape[1] - 1):
        d[:, j + 1] += d[:, j] >> _B          # arithmetic shift: floor, also for negative digits
        d[:, j] &= _MASK
    d[:, -1] &= _MASK
    return d


def _magnitude_to_float(m: np.ndarray) -> np.ndarray:
    """``float(v)`` (correctly rounded, half to even) of non-negative ints given by digits ``m`` (n, nd)."""
    n, nd = m.shape
    if nd == 0:
        return np.zeros(n)
    nz = m != 0
    t = nd - 1 - np.argmax(nz[:, ::-1], axis=1)              # top non-zero digit (nd - 1 for zero rows)
    pad = np.concatenate([np.zeros((n, 4), np.int64), m], axis=1).astype(np.uint64)
    rows = np.arange(n)
    top, d1, d2, d3, d4 = (pad[rows, t + 4 - i] for i in range(5))
    b = np.frexp(top.astype(np.float64))[1].astype(np.uint64)   # bit length of the top digit (0 for zero rows)
    zero = b == 0
    b[zero] = 1
    # the top 64 bits, most significant bit at bit 63, then the sticky bit of everything below in bit 0
    # (bit 0 lies below float64's 53-bit mantissa, so it only breaks ties, as the discarded bits would)
    V = (top << (np.uint64(64) - b)) | (d1 << (np.uint64(48) - b)) | (d2 << (np.uint64(32) - b)) \
        | (d3 << (np.uint64(16) - b)) | (d4 >> b)
    below = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(nz, axis=1)], axis=1)  # non-zero digits in [0, j)
    sticky = ((d4 & ((np.uint64(1) << b) - np.uint64(1))) != 0) | (below[rows, np.maximum(t - 4, 0)] > 0)
    V |= sticky.astype(np.uint64)
    # hi 2^32 + lo: both exact in float64, one correctly rounded addition
    f = (V >> np.uint64(32)).astype(np.float64) * 2.0**32 + (V & np.uint64(0xFFFFFFFF)).astype(np.float64)
    f[zero] = 0.0
    return np.ldexp(f, (16 * t + b.astype(np.int64) - 64))


@dataclass
class WideInts:
    """Signed integers as 16-bit two's complement digits (module docstring).

    Attributes
    ----------
    digits : ndarray of int64, shape (*shape, nd)
        Digits in ``[0, 2^16)``, low first.
    """

    digits: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the represented array."""
        return self.digits.shape[:-1]

    @property
    def nd(self) -> int:
        """Digits per value (values lie in ``[-2^(16 nd - 1), 2^(16 nd - 1))``)."""
        return self.digits.shape[-1]

    def _flat(self) -> np.ndarray:
        return self.digits.reshape(-1, self.nd)

    def _negative(self) -> np.ndarray:
        return self._flat()[:, -1] >= 0x8000

    @classmethod
    def from_ints(cls, a, nd: int) -> "WideInts":
        """From integers (int64 or Python ints) with ``|a| < 2^(16 nd - 1)``.

        Raises
        ------
        ValueError
            If a value does not fit ``nd`` digits.
        """
        a = np.asarray(a)
        flat = [int(v) for v in a.ravel()]
        lim = 1 << (_B * nd - 1)
        if any(not -lim <= v < lim for v in flat):
            raise ValueError(f"a value does not fit {nd} 16-bit digits (two's complement)")
        mod = 1 << (_B * nd)
        d = np.array([[((v % mod) >> (_B * j)) & _MASK for j in range(nd)] for v in flat], dtype=np.int64)
        return cls(d.reshape(a.shape + (nd,)))

    def to_ints(self) -> np.ndarray:
        """The values as Python ints (object array of :attr:`shape`)."""
        raw = np.ascontiguousarray(self._flat(), dtype="<u2").tobytes()
        w = 2 * self.nd
        out = np.empty(len(raw) // w if w else 0, dtype=object)
        out[:] = [int.from_bytes(raw[i:i + w], "little", signed=True) for i in range(0, len(raw), w)]
        return out.reshape(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Python ints (object), so that NumPy code written for integer arrays accepts a WideInts."""
        out = self.to_ints()
        return out if dtype is None else out.astype(dtype)

    def widened(self, nd: int) -> np.ndarray:
        """Digits sign-extended to ``nd >= self.nd`` digits, shape (n, nd)."""
        d = self._flat()
        ext = np.where(self._negative(), _MASK, 0)[:, None]
        return np.concatenate([d, np.repeat(ext, nd - self.nd, axis=1)], axis=1)

    def __add__(self, other: "WideInts") -> "WideInts":
        """Exact sum (one more digit than the wider operand)."""
        if self.shape != other.shape:
            raise ValueError(f"shapes {self.shape} and {other.shape} differ")
        nd = max(self.nd, other.nd) + 1
        s = carry_digits(self.widened(nd) + other.widened(nd))
        return WideInts(s.reshape(self.shape + (nd,)))

    def to_float(self) -> np.ndarray:
        """``float(v)`` of every value, correctly rounded (float64, :attr:`shape`)."""
        d = self._flat()
        neg = self._negative()
        mag = np.where(neg[:, None], carry_digits(-d), d)
        f = _magnitude_to_float(mag)
        return np.where(neg, -f, f).reshape(self.shape)

    def scaled_floor(self, num: int, E: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``floor(v num / 2^E)`` and ``float(rem) / 2^E`` for ``rem = v num - 2^E floor(.)``, exactly.

        This is :func:`fednet.algebra.quantize.stochastic_round`'s ``floor`` and ``frac`` for the rational
        ``v num / 2^E`` (``den = 2^E``): ``frac`` has the bits of ``rem.astype(float64) / float(2^E)``.

        Parameters
        ----------
        num : int
            Positive multiplier (a Python int of any size).
        E : int
            Power of two of the denominator, ``0 <= E <= 1000`` (so ``frac`` is never subnormal).

        Returns
        -------
        (ndarray of int64, ndarray of float64), each of :attr:`shape`, or None
            None when some floor does not satisfy ``|floor| < 2^62`` (the caller then uses Python ints).

        Raises
        ------
        ValueError
            If ``num < 1`` or ``E`` is outside ``[0, 1000]``.
        """
        num, E = int(num), int(E)
        if num < 1 or not 0 <= E <= 1000:
            raise ValueError(f"need num >= 1 and 0 <= E <= 1000, got num = {num}, E = {E}")
        nN = -(-num.bit_length() // _B)
        nd = self.nd + nN
        e, r = divmod(E, _B)
        g = self.widened(max(nd, e + 4))
        nd = g.shape[1]
        P = np.zeros_like(g)
        for j in range(nN):                       # schoolbook product, truncated modulo 2^(16 nd)
            Nj = (num >> (_B * j)) & _MASK
            if Nj:
                P[:, j:] += g[:, :nd - j] * Nj     # each digit sum < nN 2^32
        carry_digits(P)
        neg = P[:, -1] >= 0x8000
        Pe = np.concatenate([P, np.where(neg, _MASK, 0)[:, None]], axis=1)   # one more sign digit
        Q = ((Pe[:, :-1] >> r) | (Pe[:, 1:] << (_B - r))) & _MASK         # floor(P / 2^r), nd digits
        u = Q[:, e:e + 4].astype(np.uint64)
        fl = (u[:, 0] | (u[:, 1] << np.uint64(16)) | (u[:, 2] << np.uint64(32)) | (u[:, 3] << np.uint64(48))).view(np.int64)
        if (Q[:, e + 4:] != np.where(neg, _MASK, 0)[:, None]).any() or ((fl < 0) != neg).any() \
                or (np.abs(fl) >= 2**62).any():
            return None
        rem = P[:, :e + 1].copy()
        rem[:, e] &= (1 << r) - 1
        frac = np.ldexp(_magnitude_to_float(rem), -E)
        return fl.reshape(self.shape), frac.reshape(self.shape)
