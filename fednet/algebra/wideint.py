"""Arrays of wide signed integers (a few hundred bits) as 16-bit digit columns, exact without Python ints.

Why: DReS-FL's timing mode (:mod:`fednet.protocols.dresfl`) computes, every round, the plain integer
gradient of the global minibatch (~150-bit integers, ``d_w = 55,050`` of them at 784-64-64-10) and the exact
update of eq. (7) on it: a float64 norm for clipping, then ``floor`` and the fractional part of
``g c / 2^E`` for the stochastic rounding Q.  As Python ints (object arrays) that costs tens of milliseconds
per round in per-element interpreter work; on digit columns it is a handful of NumPy passes.

Representation: :class:`WideInts` holds ``digits`` of int64, shape ``(nd, *shape)`` (digit-major, like
:class:`~fednet.algebra.rns.RnsArray`'s residues, so every pass over one digit is contiguous), every digit in
``[0, 2^16)``, low digit first: the two's complement of each value modulo ``2^(16 nd)``, so the values are the
signed integers in ``[-2^(16 nd - 1), 2^(16 nd - 1))``.  Every operation is exact; the float conversions are
correctly rounded (round half to even), i.e. they give the bits ``float(int)`` gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["WideInts", "carry_digits", "signed_digits"]

_B = 16
_MASK = 0xFFFF


def carry_digits(d: np.ndarray) -> np.ndarray:
    """Normalise int64 digit columns (any signs, ``|d| < 2^62``) to ``[0, 2^16)`` modulo ``2^(16 nd)``, in place.

    Parameters
    ----------
    d : ndarray of int64, shape (nd, n)
        ``sum_j d[j] 2^(16 j)`` for any integer digits.

    Returns
    -------
    ndarray
        ``d`` itself, holding the digits of that sum modulo ``2^(16 nd)`` (the carry out of the top digit is
        dropped: two's complement wrap-around).
    """
    for j in range(d.shape[0] - 1):
        d[j + 1] += d[j] >> _B                # arithmetic shift: floor, also for negative digits
        d[j] &= _MASK
    d[-1] &= _MASK
    return d


try:  # one-pass kernels (numba ships with galois); the NumPy functions below compute the same values
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

if _numba is not None:
    @_numba.njit(cache=True)
    def _nb_digits_float(m, nd):  # pragma: no cover - compiled
        """float(v), correctly rounded, of the non-negative digits m[:nd] (a 62-bit window, sticky bit 0)."""
        t = nd - 1
        while t >= 0 and m[t] == 0:
            t -= 1
        if t < 0:
            return 0.0
        top = m[t]
        b = 0
        x = top
        while x:
            b += 1
            x >>= 1
        V = top << (62 - b)                     # most significant bit at bit 61 (int64, no sign issue)
        sh = 46 - b
        sticky = 0
        j = t - 1
        while j >= 0:
            d = m[j]
            if sh >= 0:
                V |= d << sh
            elif sh > -16:
                V |= d >> (-sh)
                if d & ((1 << (-sh)) - 1):
                    sticky = 1
            elif d != 0:
                sticky = 1
                break
            sh -= 16
            j -= 1
        # bits 0..8 lie below float64's mantissa: the sticky bit in bit 0 only breaks ties, as the lost bits would
        return math.ldexp(float(V | sticky), 16 * t + b - 62)

    @_numba.njit(cache=True)
    def _nb_to_float(d, out):  # pragma: no cover - compiled
        nd, n = d.shape
        buf = np.empty(nd, np.int64)
        for c in range(n):
            neg = d[nd - 1, c] >= 0x8000
            carry = 1
            for j in range(nd):                  # |v|: the digits, or their two's complement negation
                v = d[j, c]
                if neg:
                    v = (v ^ 0xFFFF) + carry
                    carry = v >> 16
                    v &= 0xFFFF
                buf[j] = v
            f = _nb_digits_float(buf, nd)
            out[c] = -f if neg else f

    @_numba.njit(cache=True)
    def _nb_scaled_floor(g, nd, Nd, E, fl, frac):  # pragma: no cover - compiled
        """g (ndg, n) digits sign-extended to nd; columns in blocks of 256 (the product vectorises over them)."""
        ndg, n = g.shape
        nN = Nd.shape[0]
        e = E // 16
        r = E % 16
        BS = 256
        P = np.empty((nd, BS), np.int64)
        col = np.empty(nd + 1, np.int64)
        ok = True
        for c0 in range(0, n, BS):
            w = min(BS, n - c0)
            P[:, :w] = 0
            for i in range(nd):                  # schoolbook product, truncated modulo 2^(16 nd)
                for j in range(min(nN, nd - i)):
                    Nj = Nd[j]
                    if Nj == 0:
                        continue
                    if i < ndg:
                        for c in range(w):
                            P[i + j, c] += g[i, c0 + c] * Nj
                    else:                        # sign extension
                        for c in range(w):
                            if g[ndg - 1, c0 + c] >= 0x8000:
                                P[i + j, c] += 0xFFFF * Nj
            for c in range(w):
                for i in range(nd):
                    col[i] = P[i, c]
                for i in range(nd - 1):
                    col[i + 1] += col[i] >> 16
                    col[i] &= 0xFFFF
                col[nd - 1] &= 0xFFFF
                neg = col[nd - 1] >= 0x8000
                sign = 0xFFFF if neg else 0
                col[nd] = sign
                f = 0
                for i in range(nd - e):          # digits of floor(P / 2^E)
                    q = ((col[e + i] >> r) | (col[e + i + 1] << (16 - r))) & 0xFFFF
                    if i < 3:
                        f += q << (16 * i)
                    elif i == 3:
                        f += (q - 0x10000 if q >= 0x8000 else q) << 48
                    elif q != sign:
                        ok = False
                if (f < 0) != neg or f >= 2**62 or f <= -2**62:
                    ok = False
                fl[c0 + c] = f
                col[e] &= (1 << r) - 1
                frac[c0 + c] = math.ldexp(_nb_digits_float(col, e + 1), -E)
        return ok

    @_numba.njit(cache=True)
    def _nb_carry_float(S, R, T, out):  # pragma: no cover - compiled
        """out = carried digits of S + T^T R (exact float64 integers below 2^53); returns the digits needed."""
        nd, n = S.shape
        nr = R.shape[0]
        need = 1
        for c in range(n):
            carry = 0
            for d in range(nd):
                v = S[d, c]
                for k in range(nr):
                    v += T[k, d] * R[k, c]
                x = np.int64(v) + carry
                carry = x >> 16
                out[d, c] = x & 0xFFFF
            sign = 0xFFFF if out[nd - 1, c] >= 0x8000 else 0
            j = nd - 1
            while j > 0 and out[j, c] == sign and (out[j - 1, c] >= 0x8000) == (sign != 0):
                j -= 1
            if j + 1 > need:
                need = j + 1
        return need


def signed_digits(S: np.ndarray, R: np.ndarray, T: np.ndarray) -> "WideInts | None":
    """Two's complement digits of the integers ``S + T^T R``, given as 16-bit digit sums, on the fewest digits.

    Parameters
    ----------
    S : ndarray of float64, shape (nd, n)
        ``S[d]`` is the (unnormalised) digit ``d``: the value is ``sum_d (S + T^T R)[d] 2^(16 d)``.
    R : ndarray of float64, shape (r, n)
    T : ndarray of float64, shape (r, nd)
        A rank-``r`` correction (e.g. ``alpha`` and ``k`` times the digits of two constants).
        Every entry of ``S + T^T R`` and every partial sum is an exact integer below ``2^53``.

    Returns
    -------
    WideInts (shape (n,)) or None
        The values modulo ``2^(16 nd)``, :meth:`WideInts.trimmed`; None if the top digit is not a sign
        extension for some value (the values did not fit ``nd - 1`` digits: a spare digit checks the bound).
    """
    if _numba is not None:
        out = np.empty(S.shape, np.int64)
        need = _nb_carry_float(np.ascontiguousarray(S), np.ascontiguousarray(R), np.ascontiguousarray(T), out)
        return WideInts(out[:need]) if need < S.shape[0] else None
    dig = carry_digits((S + T.T @ R).astype(np.int64))
    if (dig[-1] != np.where(dig[-2] >= 0x8000, _MASK, 0)).any():
        return None
    return WideInts(dig).trimmed()


def _magnitude_to_float(m: np.ndarray) -> np.ndarray:
    """``float(v)`` (correctly rounded, half to even) of non-negative ints given by digits ``m`` (nd, n)."""
    nd, n = m.shape
    if nd == 0:
        return np.zeros(n)
    nz = m != 0
    t = nd - 1 - np.argmax(nz[::-1], axis=0)                 # top non-zero digit (nd - 1 for zero values)
    pad = np.concatenate([np.zeros((4, n), np.int64), m], axis=0).astype(np.uint64)
    cols = np.arange(n)
    top, d1, d2, d3, d4 = (pad[t + 4 - i, cols] for i in range(5))
    b = np.frexp(top.astype(np.float64))[1].astype(np.uint64)   # bit length of the top digit (0 for zero rows)
    zero = b == 0
    b[zero] = 1
    # the top 64 bits, most significant bit at bit 63, then the sticky bit of everything below in bit 0
    # (bit 0 lies below float64's 53-bit mantissa, so it only breaks ties, as the discarded bits would)
    V = (top << (np.uint64(64) - b)) | (d1 << (np.uint64(48) - b)) | (d2 << (np.uint64(32) - b)) \
        | (d3 << (np.uint64(16) - b)) | (d4 >> b)
    below = np.concatenate([np.zeros((1, n), np.int64), np.cumsum(nz, axis=0)], axis=0)  # non-zero digits in [0, j)
    sticky = ((d4 & ((np.uint64(1) << b) - np.uint64(1))) != 0) | (below[np.maximum(t - 4, 0), cols] > 0)
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
    digits : ndarray of int64, shape (nd, *shape)
        Digits in ``[0, 2^16)``, low first.
    """

    digits: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the represented array."""
        return self.digits.shape[1:]

    @property
    def nd(self) -> int:
        """Digits per value (values lie in ``[-2^(16 nd - 1), 2^(16 nd - 1))``)."""
        return self.digits.shape[0]

    def _flat(self) -> np.ndarray:
        return self.digits.reshape(self.nd, -1)

    def _negative(self) -> np.ndarray:
        return self._flat()[-1] >= 0x8000

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
        d = np.array([[((v % mod) >> (_B * j)) & _MASK for v in flat] for j in range(nd)], dtype=np.int64)
        return cls(d.reshape((nd,) + a.shape))

    def to_ints(self) -> np.ndarray:
        """The values as Python ints (object array of :attr:`shape`)."""
        raw = np.ascontiguousarray(self._flat().T, dtype="<u2").tobytes()
        w = 2 * self.nd
        out = np.empty(len(raw) // w if w else 0, dtype=object)
        out[:] = [int.from_bytes(raw[i:i + w], "little", signed=True) for i in range(0, len(raw), w)]
        return out.reshape(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Python ints (object), so that NumPy code written for integer arrays accepts a WideInts."""
        out = self.to_ints()
        return out if dtype is None else out.astype(dtype)

    def widened(self, nd: int) -> np.ndarray:
        """Digits sign-extended to ``nd >= self.nd`` digits, shape (nd, n)."""
        d = self._flat()
        ext = np.where(self._negative(), _MASK, 0)[None, :]
        return np.concatenate([d, np.repeat(ext, nd - self.nd, axis=0)], axis=0)

    def trimmed(self) -> "WideInts":
        """The same values on the fewest digits (>= 1) that hold them all (drops sign-extension digits)."""
        d = self._flat()
        sign = np.where(self._negative(), _MASK, 0)
        keep = self.nd
        while keep > 1 and (d[keep - 1] == sign).all() and ((d[keep - 2] >= 0x8000) == (sign != 0)).all():
            keep -= 1
        return WideInts(self.digits[:keep])

    def __add__(self, other: "WideInts") -> "WideInts":
        """Exact sum (one more digit than the wider operand)."""
        if self.shape != other.shape:
            raise ValueError(f"shapes {self.shape} and {other.shape} differ")
        nd = max(self.nd, other.nd) + 1
        s = carry_digits(self.widened(nd) + other.widened(nd))
        return WideInts(s.reshape((nd,) + self.shape))

    def to_float(self) -> np.ndarray:
        """``float(v)`` of every value, correctly rounded (float64, :attr:`shape`)."""
        d = self._flat()
        if _numba is not None:
            out = np.empty(d.shape[1])
            _nb_to_float(np.ascontiguousarray(d), out)
            return out.reshape(self.shape)
        neg = self._negative()
        mag = np.where(neg, carry_digits(-d), d)
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
        nd = max(nd, e + 4)
        if _numba is not None:
            g = np.ascontiguousarray(self._flat())
            fl, frac = np.empty(g.shape[1], np.int64), np.empty(g.shape[1])
            Nd = np.array([(num >> (_B * j)) & _MASK for j in range(nN)], dtype=np.int64)
            if not _nb_scaled_floor(g, nd, Nd, E, fl, frac):
                return None
            return fl.reshape(self.shape), frac.reshape(self.shape)
        g = self.widened(nd)
        P = np.zeros_like(g)
        for j in range(nN):                       # schoolbook product, truncated modulo 2^(16 nd)
            Nj = (num >> (_B * j)) & _MASK
            if Nj:
                P[j:] += g[:nd - j] * Nj           # each digit sum < nN 2^32
        carry_digits(P)
        neg = P[-1] >= 0x8000
        sign = np.where(neg, _MASK, 0)
        Pe = np.concatenate([P[e:], sign[None, :]], axis=0)              # one more sign digit
        Q = ((Pe[:-1] >> r) | (Pe[1:] << (_B - r))) & _MASK              # digits e.. of floor(P / 2^r)
        u = Q[:4].astype(np.uint64)
        fl = (u[0] | (u[1] << np.uint64(16)) | (u[2] << np.uint64(32)) | (u[3] << np.uint64(48))).view(np.int64)
        if (Q[4:] != sign).any() or ((fl < 0) != neg).any() or (np.abs(fl) >= 2**62).any():
            return None
        rem = P[:e + 1].copy()
        rem[e] &= (1 << r) - 1
        frac = np.ldexp(_magnitude_to_float(rem), -E)
        return fl.reshape(self.shape), frac.reshape(self.shape)
