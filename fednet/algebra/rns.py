"""Exact matrix arithmetic modulo a huge prime q (200, 440 bits) in a residue number system on float64 BLAS.

Why residues here (and limbs in :mod:`fednet.algebra.modp`)
-----------------------------------------------------------
DReS-FL (Shao et al., Sec. 3.1, Table 4) computes a whole polynomial network over GF(q) with
``q = 2**200 - 75`` or ``2**440 - 33`` on Lagrange-coded data, i.e. on *uniform* field elements: both
operands of most products are full-width.  Limb splitting (``modp``) would then need
``ceil(199 / 21)**2 = 100`` GEMMs per product at inner dimension 784; a residue number system (RNS)
needs one GEMM per word-size modulus, about 22 at 200 bits, and keeps every operand in residue form
between products, so a forward/backward pass never leaves float64 arrays.

Representation
--------------
A :class:`RnsContext` fixes ``q``, the largest inner dimension ``max_inner`` and a base of ``L`` distinct
primes ``m_1 > m_2 > ... > m_L`` (all below ``2 sqrt(2**53 / max_inner)``, so that a length-``max_inner``
dot product of balanced residues ``|r| <= m/2 + 1`` is an exact float64 integer).  An
:class:`RnsArray` holds an integer array ``x`` (any integer congruent to the field element it represents)
as float64 balanced residues ``x mod m_i`` of shape ``(n_moduli, *shape)``, together with a proven bound
``|x| <= bound`` (a Python int).  ``x`` is determined by its residues while ``4 bound < M = prod m_i``.

* A product ``A @ B`` of inner dimension ``k`` has ``|C| <= k A.bound B.bound``; it is computed on the
  shortest prefix of the base with ``M' > 4 |C|`` (small right operands such as model weights need fewer
  moduli), one float64 GEMM per modulus, each residue reduced by ``r - m rint(r / m)``.
* The result is then reduced modulo q and extended back to the full base in one step (Kawamura /
  Bajard base extension): with ``sigma_i = C_i (M'/m_i)^{-1} mod m_i`` (balanced) and
  ``alpha = rint(sum_i sigma_i / m_i)`` (exact because ``|C| < M'/4``),
  ``C = sum_i sigma_i M'/m_i - alpha M'``, so ``y = sum_i sigma_i h_i - alpha H`` with
  ``h_i = (M'/m_i) mod q``, ``H = M' mod q`` is congruent to ``C`` modulo q, bounded by
  ``R = (L' max(m)/2 + L'/2 + 1) q`` and its residues in the full base are one small exact GEMM.
  ``L`` is chosen so that ``4 max_inner R**2 < M``: any two reduced operands multiply without overflow.
* Conversion from canonical elements (Python ints) uses 16-bit digits and a digit-to-residue GEMM;
  conversion back (CRT) uses the same ``sigma, alpha`` and a digit-level carry pass.  Values known to be
  small (``|x mod q| < q / 8``) also convert to :class:`~fednet.algebra.wideint.WideInts` (two's
  complement digit columns modulo ``2^(16 nd)``) without building Python ints (:meth:`RnsContext.to_signed_wide`).

Every capacity condition is checked before computing (:class:`RnsCapacityError` names the numbers).
The element-wise parts of a base extension (residue reduction, ``sigma``, ``alpha``, the final
reduction) run as two fused single-pass numba kernels when numba is importable (it ships with galois),
else as NumPy expressions computing the same values; the ``L' x L`` extension itself is a float64 GEMM.

MAC metering follows :mod:`fednet.algebra.meter` and :mod:`fednet.algebra.modp`: an ``(m, k) @ (k, n)``
product charges ``m k n`` MACs, an element-wise product or scaled addition one MAC per element;
residues, base extensions and conversions are host implementation details and are not charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fednet.algebra.meter import charge
from fednet.algebra.wideint import WideInts, signed_digits

__all__ = [
    "RnsCapacityError",
    "RnsContext",
    "RnsArray",
    "rns_context",
]

_EXACT = 2**53  # float64 holds every integer of magnitude below 2**53 exactly
_DIGIT = 16  # digit width used to move big integers in and out of residues


class RnsCapacityError(ValueError):
    """An exact RNS computation would exceed its residue range (raised before computing)."""


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in small:  # deterministic for n < 3.3e24
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


try:  # fused single-pass kernels (numba ships with galois); NumPy fallbacks below compute the same values
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

_RND = 6755399441055744.0  # 1.5 * 2**52: (x + _RND) - _RND rounds |x| < 2**51 to the nearest integer

if _numba is not None:
    @_numba.njit(cache=True)
    def _nb_sigma_alpha(C, m, minv, inv, sigma, alpha):  # pragma: no cover - compiled
        Lp, n = C.shape
        for e in range(n):
            alpha[e] = 0.0
        for i in range(Lp):
            mi = m[i]
            mii = minv[i]
            ii = inv[i]
            for e in range(n):
                c = C[i, e]
                r = c - mi * ((c * mii + _RND) - _RND)  # exact: |c| < 2**53
                s = r * ii  # |r ii| < 2**45
                s = s - mi * ((s * mii + _RND) - _RND)
                sigma[i, e] = s
                alpha[e] += s * mii
        for e in range(n):
            alpha[e] = (alpha[e] + _RND) - _RND

    @_numba.njit(cache=True)
    def _nb_finish(r, elast, alpha, m, minv):  # pragma: no cover - compiled
        L, n = r.shape
        for j in range(L):
            mj = m[j]
            mji = minv[j]
            ej = elast[j]
            for e in range(n):
                v = r[j, e] + ej * alpha[e]
                r[j, e] = v - mj * ((v * mji + _RND) - _RND)


def _mod_balanced(x: np.ndarray, m: np.ndarray, minv: np.ndarray) -> np.ndarray:
    """``x mod m`` in ``[-m/2 - 1, m/2 + 1]`` for exact float64 integers ``|x| < 2**53`` (broadcast m)."""
    t = np.multiply(x, minv)
    np.rint(t, out=t)
    t *= m
    return np.subtract(x, t, out=t)


@dataclass
class RnsArray:
    """An integer array in residue form over a prefix of an :class:`RnsContext` base.

    Attributes
    ----------
    res : ndarray of float64, shape (n_moduli, *shape)
        Balanced residues ``x mod m_i`` (``|r| <= m_i/2 + 1``), exact integers.
    bound : int
        Proven bound ``|x| <= bound`` on the integer represented (congruent to the field element).
    ctx : RnsContext
        The context (prime q and base) the residues belong to.
    """

    res: np.ndarray
    bound: int
    ctx: "RnsContext"

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the represented array (without the moduli axis)."""
        return self.res.shape[1:]

    @property
    def n_moduli(self) -> int:
        """Number of base moduli the residues cover (a prefix of the base)."""
        return self.res.shape[0]

    @property
    def T(self) -> "RnsArray":
        """Transpose of a matrix (residues stay exact; no MACs)."""
        if self.res.ndim != 3:
            raise ValueError(f"T needs a matrix, got shape {self.shape}")
        return RnsArray(np.swapaxes(self.res, 1, 2), self.bound, self.ctx)

    def __getitem__(self, idx) -> "RnsArray":
        """Row/column selection (any NumPy index on the array axes); no MACs."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        return RnsArray(self.res[(slice(None),) + idx], self.bound, self.ctx)

    def to_field(self) -> np.ndarray:
        """Canonical elements in ``[0, q)`` (see :meth:`RnsContext.to_field`)."""
        return self.ctx.to_field(self)


class RnsContext:
    """A residue number system for exact arithmetic modulo a prime ``q`` on float64 BLAS.

    Parameters
    ----------
    q : int
        Odd prime modulus (any size; designed for 200- and 440-bit DReS-FL primes).
    max_inner : int
        Largest inner dimension of a product (default 4096).  Fixes the modulus width:
        every modulus satisfies ``max_inner (m/2 + 1)**2 < 2**53``.

    Attributes
    ----------
    q : int
    max_inner : int
    moduli : ndarray of int64, shape (L,)
        The base, largest first.
    L : int
        Number of moduli, the smallest with ``4 max_inner R**2 < prod(moduli)``.
    reduced_bound : int
        ``R``: bound on a representative after reduction modulo q from the full base.

    Raises
    ------
    ValueError
        If ``q`` is not an odd integer >= 3 or ``max_inner`` is not in ``[1, 2**30]``.
    """

    def __init__(self, q: int, max_inner: int = 4096):
        if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or int(q) < 3 or int(q) % 2 == 0:
            raise ValueError(f"q must be an odd prime >= 3, got {q!r}")
        if isinstance(max_inner, bool) or not isinstance(max_inner, (int, np.integer)) or not 1 <= max_inner <= 2**30:
            raise ValueError(f"max_inner must be an integer in [1, 2**30], got {max_inner!r}")
        self.q = int(q)
        self.max_inner = int(max_inner)
        # largest m with max_inner * (m // 2 + 1)**2 <= 2**53 - 2**25: a dot product of balanced residues
        # is an exact float64 integer, and so is m * rint(c / m) in its reduction (|c| + m < 2**53);
        # max_inner is taken >= 64 so that every base-extension sum of up to 64 terms
        # sigma_i E_ij (|.| <= (m/2 + 1)**2 each) stays below 2**53 as well.
        half = math.isqrt((_EXACT - 2**25) // max(self.max_inner, 64)) - 1
        top = 2 * half
        self._half_cap = half
        moduli: list[int] = []
        cand = top if top % 2 else top - 1
        M = 1
        while True:
            # reduced bound for a base extension from the full base
            L = len(moduli)
            if L:
                R = self._ext_bound(L, moduli[0])
                if 4 * self.max_inner * R * R < M:
                    break
            while not _is_prime(cand) or (self.q % cand == 0):
                cand -= 2
            moduli.append(cand)
            M *= cand
            cand -= 2
        if len(moduli) + 1 > 64:
            raise ValueError(f"q = {self.q.bit_length()} bits needs {len(moduli)} moduli; at most 63 are supported")
        self.moduli = np.array(moduli, dtype=np.int64)
        self.L = len(moduli)
        self._small = min(moduli) // 2
        self._mf = self.moduli.astype(np.float64)
        self._minv = 1.0 / self._mf
        self._prefix_M = [1]
        for m in moduli:
            self._prefix_M.append(self._prefix_M[-1] * m)
        self.reduced_bound = self._ext_bound(self.L, moduli[0])
        self._nd = -(-self.q.bit_length() // _DIGIT) + 1  # digits of a balanced field element
        # digit -> residue table: T[d, i] = balanced(2**(16 d) mod m_i)
        T = np.empty((self._nd, self.L), dtype=np.float64)
        for d in range(self._nd):
            for i, m in enumerate(moduli):
                v = pow(2, _DIGIT * d, m)
                T[d, i] = v - m if v > m // 2 else v
        self._digit_table = T
        self._ext_cache: dict[int, tuple] = {}

    def _ext_bound(self, Lp: int, m_max: int) -> int:
        # |sum sigma_i h_i - alpha H| with |sigma_i| <= m/2, 0 <= h_i, H < q, |alpha| <= Lp/2 + 1
        return (Lp * (m_max // 2 + 1) + Lp // 2 + 2) * self.q

    def __repr__(self) -> str:
        return (f"RnsContext(q: {self.q.bit_length()} bits, max_inner={self.max_inner}, L={self.L} moduli "
                f"of {int(self.moduli[0]).bit_length()} bits)")

    # ------------------------------------------------------------------ capacity
    def moduli_for(self, bound: int) -> int:
        """Smallest prefix length ``L'`` with ``4 bound < m_1 ... m_L'``.

        Raises
        ------
        RnsCapacityError
            If even the full base is too small for ``bound``.
        """
        need = 4 * int(bound)
        for Lp in range(1, self.L + 1):
            if self._prefix_M[Lp] > need:
                return Lp
        raise RnsCapacityError(
            f"RNS capacity exceeded: a value bound of {int(bound).bit_length()} bits needs a residue range above "
            f"{need.bit_length()} bits, the base of {self.L} moduli has {self._prefix_M[-1].bit_length() - 1} bits"
        )

    def _check_inner(self, k: int) -> None:
        if k > self.max_inner:
            raise RnsCapacityError(
                f"inner dimension {k} exceeds max_inner = {self.max_inner} of this RNS context "
                f"(moduli of {int(self.moduli[0]).bit_length()} bits); build RnsContext(q, max_inner >= {k})"
            )

    def _col(self, Lp: int, ndim: int):
        shape = (Lp,) + (1,) * ndim
        return self._mf[:Lp].reshape(shape), self._minv[:Lp].reshape(shape)

    # ------------------------------------------------------------------ conversion in
    def from_field(self, a) -> RnsArray:
        """Residue form of canonical elements of GF(q) (values in ``[0, q)``), as balanced representatives.

        Parameters
        ----------
        a : array_like of int (int64 or Python-int object), any shape
            Canonical elements.

        Returns
        -------
        RnsArray
            Over the full base, ``bound = (q - 1) / 2``.

        Raises
        ------
        ValueError
            If an element is not an integer in ``[0, q)``.
        """
        a = np.asarray(a)
        q = self.q
        if a.dtype != object and a.dtype.kind not in "iu":
            raise ValueError(f"a must hold integers, got dtype {a.dtype}")
        if a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= q:
                raise ValueError(f"a must hold elements of GF(q) in [0, q), got values in [{lo}, {hi}]")
        half = (q - 1) // 2
        if a.dtype != object:
            a64 = a.astype(np.int64)
            if q < 2**62:
                return self.from_signed(np.where(a64 > half, a64 - q, a64))
            a = a64.astype(object)
        flat = [int(v) for v in a.ravel()]
        bal = [v - q if v > half else v for v in flat]
        return self._from_python_ints(bal, a.shape, half)

    def from_signed(self, x) -> RnsArray:
        """Residue form of signed integers (int64 or Python ints), e.g. model parameters in ``Z_p``.

        The bound is the actual ``max |x|``, so small operands make products use fewer moduli.

        Parameters
        ----------
        x : array_like of int, any shape
            Signed integers with ``|x| <= (q - 1) / 2``.

        Returns
        -------
        RnsArray
            Over the full base.

        Raises
        ------
        ValueError
            If ``x`` is not integer or some ``|x| > (q - 1) / 2``.
        """
        x = np.asarray(x)
        half = (self.q - 1) // 2
        if x.dtype == object:
            flat = [int(v) for v in x.ravel()]
            mx = max((abs(v) for v in flat), default=0)
            if mx > half:
                raise ValueError(f"x has magnitude {mx} above (q-1)/2 = {half}")
            return self._from_python_ints(flat, x.shape, mx)
        if x.dtype.kind not in "iub":
            raise ValueError(f"x must hold integers, got dtype {x.dtype}")
        x = x.astype(np.int64)
        mx = int(np.abs(x).max()) if x.size else 0
        if x.size and int(x.min()) == -(2**63):
            raise ValueError("x holds -2**63, whose magnitude does not fit int64")
        if mx > half:
            raise ValueError(f"x has magnitude {mx} above (q-1)/2 = {half}")
        if mx <= self._small:  # already a balanced residue for every modulus
            return RnsArray(np.broadcast_to(x.astype(np.float64), (self.L,) + x.shape), mx, self)
        if mx < 2**53:  # exact in float64: one balanced float reduction per modulus
            mf, minv = self._col(self.L, x.ndim)
            return RnsArray(_mod_balanced(np.broadcast_to(x.astype(np.float64), (self.L,) + x.shape), mf, minv),
                            mx, self)
        m = self.moduli.reshape((self.L,) + (1,) * x.ndim)
        r = x[None] % m
        r = np.where(r > m // 2, r - m, r).astype(np.float64)
        return RnsArray(r, mx, self)

    def _from_python_ints(self, flat: list[int], shape: tuple, bound: int) -> RnsArray:
        n = len(flat)
        nbytes = 2 * self._nd
        neg = np.fromiter((v < 0 for v in flat), dtype=bool, count=n)
        buf = b"".join((-v if v < 0 else v).to_bytes(nbytes, "little") for v in flat)
        dig = np.frombuffer(buf, dtype="<u2").reshape(n, self._nd).astype(np.float64)
        r = (dig @ self._digit_table).T  # (L, n); |.| < nd 2**16 2**21 < 2**53
        mf, minv = self._col(self.L, 1)
        r = _mod_balanced(r, mf, minv)
        r = np.where(neg[None, :], -r, r)
        return RnsArray(np.ascontiguousarray(r.reshape((self.L,) + tuple(shape))), int(bound), self)

    # ------------------------------------------------------------------ conversion out
    def _sigma_alpha(self, x: RnsArray, exact: bool = False):
        Lp = x.n_moduli
        if 4 * x.bound >= self._prefix_M[Lp]:
            raise RnsCapacityError(
                f"value bound of {x.bound.bit_length()} bits does not fit the {Lp} moduli it is stored on"
            )
        ext = self._extension(Lp, exact)
        sigma, alpha = self._sigma_alpha_raw(x.res, ext["inv"])
        return sigma, alpha, ext

    def _sigma_alpha_raw(self, res: np.ndarray, inv: np.ndarray):
        """``sigma_i = (res_i mod m_i) inv_i mod m_i`` (balanced) and ``alpha = rint(sum sigma_i / m_i)``.

        ``res`` may be unreduced (exact integers below 2**53, e.g. GEMM outputs).
        """
        Lp = res.shape[0]
        C = np.ascontiguousarray(res.reshape(Lp, -1))
        if _numba is not None:
            sigma = np.empty_like(C)
            alpha = np.empty(C.shape[1])
            _nb_sigma_alpha(C, self._mf[:Lp], self._minv[:Lp], inv, sigma, alpha)
            return sigma, alpha
        mf, minv = self._col(Lp, 1)
        r = _mod_balanced(C, mf, minv)
        sigma = _mod_balanced(r * inv[:, None], mf, minv)  # |r inv| < 2**22 * 2**23
        alpha = np.rint(self._minv[:Lp] @ sigma)  # sum_i sigma_i / m_i = alpha + C / M', |C / M'| < 1/4
        return sigma, alpha

    def _extension(self, Lp: int, exact: bool = False) -> dict:
        if (Lp, exact) in self._ext_cache:
            return self._ext_cache[(Lp, exact)]
        q = self.q
        ms = [int(m) for m in self.moduli[:Lp]]
        M = self._prefix_M[Lp]
        Mi = [M // m for m in ms]
        inv = np.array([pow(Mi[i] % ms[i], -1, ms[i]) for i in range(Lp)], dtype=np.float64)
        if exact:  # the integer itself: y = sum sigma_i M_i - alpha M
            h = Mi + [-M]
        else:  # y = sum sigma_i h_i + alpha (-M mod q), congruent modulo q
            h = [v % q for v in Mi] + [(-M) % q]
        # table to the full base: E[i, j] = balanced(h_i mod m_j)
        E = np.empty((Lp + 1, self.L), dtype=np.float64)
        for i, hv in enumerate(h):
            for j, mj in enumerate(self.moduli):
                v = hv % int(mj)
                E[i, j] = v - int(mj) if v > int(mj) // 2 else v
        # digits of h_i (non-negative, < q) for the exact CRT back to integers
        nd = -(-q.bit_length() // _DIGIT)
        D = None if exact else np.array([[(hv >> (_DIGIT * d)) & 0xFFFF for d in range(nd)] for hv in h],
                                        dtype=np.float64)
        out = {"inv": inv, "E": E, "D": D, "nd": nd,
               "bound": (Lp * (int(self.moduli[0]) // 2 + 1) + Lp // 2 + 2) * q}
        self._ext_cache[(Lp, exact)] = out
        return out

    def reduce(self, x: RnsArray) -> RnsArray:
        """Reduce modulo q and extend to the full base: the result has ``bound = R`` (:attr:`reduced_bound`).

        A value already bounded by ``R`` is extended exactly (its integer and bound are kept), so the
        products of small operands (plain fixed-point data, model weights) stay on few moduli.

        Parameters
        ----------
        x : RnsArray
            On any prefix of the base with ``4 bound < M'``.

        Returns
        -------
        RnsArray
            Congruent to ``x`` modulo q, over the full base.  No MACs are charged.

        Raises
        ------
        RnsCapacityError
            If ``x.bound`` does not fit the moduli ``x`` is stored on.
        """
        exact = x.bound <= self.reduced_bound
        if exact and x.n_moduli == self.L:
            return x
        return self._reduce_raw(x.res, x.bound)

    def _reduce_raw(self, res: np.ndarray, bound: int) -> RnsArray:
        """:meth:`reduce` of residues that may be unreduced (exact integers below 2**53)."""
        Lp = res.shape[0]
        shape = res.shape[1:]
        if 4 * bound >= self._prefix_M[Lp]:
            raise RnsCapacityError(
                f"value bound of {int(bound).bit_length()} bits does not fit the {Lp} moduli it is stored on"
            )
        exact = bound <= self.reduced_bound
        ext = self._extension(Lp, exact)
        sigma, alpha = self._sigma_alpha_raw(res, ext["inv"])
        E = ext["E"]
        r = E[:Lp].T @ sigma  # (L, n): |.| < (Lp+1) 2**22 2**22 < 2**53 with the alpha term
        if _numba is not None:
            _nb_finish(r, np.ascontiguousarray(E[Lp]), alpha, self._mf, self._minv)
        else:
            r += np.outer(E[Lp], alpha)
            mf, minv = self._col(self.L, 1)
            r = _mod_balanced(r, mf, minv)
        return RnsArray(r.reshape((self.L,) + shape), bound if exact else ext["bound"], self)

    def to_field(self, x: RnsArray, _signed: bool = False) -> np.ndarray:
        """Canonical elements ``x mod q`` in ``[0, q)`` (exact CRT).

        A value with a small bound is reconstructed exactly from the shortest prefix of moduli that
        holds it (fewer digits); otherwise the CRT is taken modulo q.  Big integers are assembled from
        48-bit words with vectorised object operations.

        Returns
        -------
        ndarray, shape ``x.shape``
            int64 for ``q < 2**62``, else Python-int object array (the storage of
            :mod:`fednet.algebra.fields`).

        Raises
        ------
        RnsCapacityError
            If ``x.bound`` does not fit the moduli ``x`` is stored on.
        """
        Lp = x.n_moduli
        if 4 * x.bound >= self._prefix_M[Lp]:
            raise RnsCapacityError(
                f"value bound of {x.bound.bit_length()} bits does not fit the {Lp} moduli it is stored on"
            )
        q = self.q
        exact = x.bound <= self.reduced_bound
        if exact:
            Lp = min(Lp, self.moduli_for(x.bound))
            off = self._prefix_M[Lp]  # > 4 |x|: x + off > 0
        ext = self._extension(Lp, exact)
        sigma, alpha = self._sigma_alpha_raw(x.res[:Lp], ext["inv"])
        n = sigma.shape[1]
        if exact:
            D = ext.get("Dx")
            if D is None:
                M = self._prefix_M[Lp]
                h = [M // int(m) for m in self.moduli[:Lp]] + [M * (2 ** (_DIGIT * 0))]
                nd0 = -(-M.bit_length() // _DIGIT)
                # y = sum sigma_i M_i - alpha M: rows M_i and -M (negative digits are fine before carrying)
                D = np.array([[(hv >> (_DIGIT * d)) & 0xFFFF for d in range(nd0)] for hv in h], dtype=np.float64)
                D[-1] *= -1
                ext["Dx"] = D
        else:
            D = ext["D"]
            off = ext["bound"]
        S = np.concatenate([sigma, alpha.reshape(1, -1)], axis=0)  # (Lp+1, n)
        dig = (S.T @ D).astype(np.int64)  # (n, nd): |.| < (Lp+1) 2**22 2**16, exact
        nd = max(D.shape[1], -(-off.bit_length() // _DIGIT)) + 2
        nd += (-nd) % 3
        full = np.zeros((n, nd), dtype=np.int64)
        full[:, : dig.shape[1]] = dig
        for d in range(nd):
            full[:, d] += (off >> (_DIGIT * d)) & 0xFFFF
        for d in range(nd - 1):
            full[:, d + 1] += full[:, d] >> _DIGIT
            full[:, d] &= 0xFFFF
        if n and ((full[:, -1] >= 2**_DIGIT).any() or (full[:, -1] < 0).any()):
            raise AssertionError("to_field: carry pass overflowed (internal error)")
        words = full[:, 0::3] | (full[:, 1::3] << 16) | (full[:, 2::3] << 32)  # 48-bit words, low first
        top = words.shape[1] - 1
        while top > 0 and not words[:, top].any():
            top -= 1
        signed = _signed and exact and 2 * x.bound <= q - 1
        if top == 0 and q < 2**62:
            val = words[:, 0] - off if exact else words[:, 0]
            return (val if signed else val % q).astype(np.int64).reshape(x.shape)
        out = _digits_to_ints(full[:, : 3 * (top + 1)])
        if signed:
            out = out - off
        else:
            out = (out - off) % q if exact else out % q
        if q < 2**62:
            return out.astype(np.int64).reshape(x.shape)
        return out.reshape(x.shape)

    def to_signed(self, x: RnsArray) -> np.ndarray:
        """Balanced representatives in ``[-(q-1)/2, (q-1)/2]`` (the symmetric signed map).

        When ``x.bound <= (q-1)/2`` the integer is reconstructed directly (no reduction modulo q).
        It agrees with DReS-FL's ``psi`` (eq. 6) except at ``(q-1)/2`` itself.

        Returns
        -------
        ndarray, shape ``x.shape``, of Python ints (object) for ``q >= 2**62``, else int64.
        """
        half = (self.q - 1) // 2
        if x.bound <= half:
            return self.to_field(x, _signed=True)
        v = self.to_field(x)
        return np.where(v > half, v - self.q, v)

    def to_signed_wide(self, x: RnsArray, bound: int) -> WideInts | None:
        """The integers ``g = x mod q`` known to satisfy ``|g| <= bound``, as :class:`WideInts` (no Python ints).

        With ``sigma, alpha`` of the CRT (module docstring), ``y = sum_i sigma_i h_i + alpha h_L'`` (``h`` of
        the extension modulo q, ``0 <= h < q``) is congruent to ``g``; ``k = rint(y / q)``, from the float64
        sum ``sum sigma_i (h_i / q)`` (absolute error below ``2^-20``, while ``|g / q| < 1/8``), gives
        ``g = y - k q`` exactly, which is computed modulo ``2^(16 nd)`` with one float64 GEMM of 16-bit digits
        (every partial sum an exact integer below ``2^53``) and a carry pass.

        Parameters
        ----------
        x : RnsArray
        bound : int
            A proven bound on ``|g|`` (the symmetric representative), ``8 bound < q``.

        Returns
        -------
        WideInts or None
            Computed on ``ceil((bits(bound) + 2) / 16) + 1`` digits, returned on the fewest that hold the values
            (:meth:`WideInts.trimmed`); None when a check fails (``y / q``
            not within ``1/4`` of an integer, or the spare top digit is not a sign extension: ``bound`` was
            wrong), so the caller can fall back to :meth:`to_signed`.

        Raises
        ------
        RnsCapacityError
            If ``x.bound`` does not fit the moduli ``x`` is stored on.
        ValueError
            If ``8 bound >= q``.
        """
        q, bound = self.q, int(bound)
        if 8 * bound >= q:
            raise ValueError(f"bound of {bound.bit_length()} bits is not below q / 8")
        Lp = x.n_moduli
        if 4 * x.bound >= self._prefix_M[Lp]:
            raise RnsCapacityError(
                f"value bound of {x.bound.bit_length()} bits does not fit the {Lp} moduli it is stored on"
            )
        nd = -(-(bound.bit_length() + 2) // _DIGIT) + 1
        ext = self._extension(Lp, False)
        tab = ext.setdefault(("wide", nd), None)
        if tab is None:
            M = self._prefix_M[Lp]
            h = [(M // int(m)) % q for m in self.moduli[:Lp]] + [(-M) % q]    # as in _extension(Lp, False)
            mod = 1 << (_DIGIT * nd)
            rows = [v % mod for v in h] + [(-q) % mod]                     # the last row multiplies k
            D = np.array([[(v >> (_DIGIT * d)) & 0xFFFF for d in range(nd)] for v in rows], dtype=np.float64)
            tab = ext[("wide", nd)] = (np.array([v / q for v in h]), D)
        hq, D = tab
        sigma, alpha = self._sigma_alpha_raw(x.res, ext["inv"])          # (Lp, n), (n,)
        t = hq[:Lp] @ sigma + hq[Lp] * alpha                             # y / q
        k = np.rint(t)
        if k.size and np.abs(t - k).max() >= 0.25:
            return None
        # digit sums |.| < 2^50: every partial sum exact
        w = signed_digits(D[:Lp].T @ sigma, np.stack([alpha, k]), D[Lp:Lp + 2])
        return None if w is None else WideInts(w.digits.reshape((w.nd,) + x.shape))

    # ------------------------------------------------------------------ arithmetic
    def _full(self, x: RnsArray) -> RnsArray:
        if x.ctx is not self:
            raise ValueError("RnsArray belongs to a different RnsContext")
        if x.n_moduli != self.L or x.bound > self.reduced_bound:
            return self.reduce(x)
        return x

    def matmul(self, a: RnsArray, b: RnsArray, *, reduce: bool = True) -> RnsArray:
        """Exact ``a @ b`` modulo q for matrices in residue form.

        Parameters
        ----------
        a : RnsArray, shape (m, k)
        b : RnsArray, shape (k, n)
        reduce : bool
            Reduce the product modulo q onto the full base (default); otherwise return the exact
            integer product on the prefix of moduli it needs.

        Returns
        -------
        RnsArray, shape (m, n)
            Charges ``m k n`` MACs.

        Raises
        ------
        ValueError
            If the shapes do not align.
        RnsCapacityError
            If ``k > max_inner``.
        """
        a, b = self._full(a), self._full(b)
        if a.res.ndim != 3 or b.res.ndim != 3 or a.shape[1] != b.shape[0]:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
        m, k = a.shape
        n = b.shape[1]
        self._check_inner(k)
        bound = k * a.bound * b.bound
        Lp = self.moduli_for(bound)
        charge(m * k * n)
        c = np.matmul(a.res[:Lp], b.res[:Lp])  # exact integers below 2**53
        if reduce:
            return self._reduce_raw(c, bound)
        mf, minv = self._col(Lp, 2)
        return RnsArray(_mod_balanced(c, mf, minv), bound, self)

    def multiply(self, a: RnsArray, b: RnsArray, *, reduce: bool = True) -> RnsArray:
        """Exact element-wise ``a * b`` modulo q (same shapes); charges one MAC per element.

        Raises
        ------
        ValueError
            If the shapes differ.
        """
        a, b = self._full(a), self._full(b)
        if a.shape != b.shape:
            raise ValueError(f"multiply: shapes {a.shape} and {b.shape} differ")
        bound = a.bound * b.bound
        Lp = self.moduli_for(bound)
        charge(int(np.prod(a.shape, dtype=np.int64)))
        c = a.res[:Lp] * b.res[:Lp]  # |.| <= (m/2 + 1)**2 < 2**53
        if reduce:
            return self._reduce_raw(c, bound)
        mf, minv = self._col(Lp, len(a.shape))
        return RnsArray(_mod_balanced(c, mf, minv), bound, self)

    def square(self, a: RnsArray) -> RnsArray:
        """Element-wise ``a**2`` modulo q (the quadratic activation); charges one MAC per element."""
        return self.multiply(a, a)

    def add(self, a: RnsArray, b: RnsArray, *, scale_b: int = 1, count: bool = True) -> RnsArray:
        """``a + scale_b * b`` modulo q (broadcasting ``b``); charges one MAC per output element.

        Parameters
        ----------
        a, b : RnsArray
            ``b`` broadcasts against ``a`` (e.g. a bias row).
        scale_b : int
            Public integer multiplier of ``b`` (``-1`` subtracts), ``|scale_b| < 2**20``.
        count : bool
            Charge the MACs (a deliberately free addition passes False).

        Raises
        ------
        ValueError
            If ``|scale_b| >= 2**20`` or the shapes do not broadcast.
        """
        scale_b = int(scale_b)
        if abs(scale_b) >= 2**20:
            raise ValueError(f"scale_b must satisfy |scale_b| < 2**20, got {scale_b}")
        a, b = self._full(a), self._full(b)
        out_shape = np.broadcast_shapes(a.shape, b.shape)
        bound = a.bound + abs(scale_b) * b.bound
        if 4 * bound >= self._prefix_M[self.L]:
            a, b = self.reduce(a), self.reduce(b)
            bound = a.bound + abs(scale_b) * b.bound
        if count:
            charge(int(np.prod(out_shape, dtype=np.int64)))
        mf, minv = self._col(self.L, len(out_shape))
        ares = a.res.reshape((self.L,) + (1,) * (len(out_shape) - len(a.shape)) + a.shape)
        bres = b.res.reshape((self.L,) + (1,) * (len(out_shape) - len(b.shape)) + b.shape)
        r = _mod_balanced(ares + scale_b * bres, mf, minv)  # |.| <= (m/2 + 1)(1 + 2**20) < 2**53
        return RnsArray(r, bound, self)

    def scale(self, c: int, a: RnsArray) -> RnsArray:
        """Public small integer times ``a`` (``|c| < 2**20``); charges one MAC per element.

        Raises
        ------
        ValueError
            If ``|c| >= 2**20``.
        """
        c = int(c)
        if abs(c) >= 2**20:
            raise ValueError(f"c must satisfy |c| < 2**20, got {c}")
        a = self._full(a)
        charge(int(np.prod(a.shape, dtype=np.int64)))
        mf, minv = self._col(self.L, len(a.shape))
        bound = abs(c) * a.bound
        if 4 * bound >= self._prefix_M[self.L]:
            a = self.reduce(a)
            bound = abs(c) * a.bound
        return RnsArray(_mod_balanced(c * a.res, mf, minv), bound, self)

    def sum_rows(self, a: RnsArray) -> RnsArray:
        """Column sums of a matrix ``(m, n) -> (n,)``, as ``ones(1, m) @ a``; charges ``m n`` MACs."""
        ones = RnsArray(np.ones((self.L, 1, a.shape[0])), 1, self)
        return self.matmul(ones, a)[0]


def _digits_to_ints(digits: np.ndarray) -> np.ndarray:
    """Python ints from base-2^16 digits, low digit first: ``sum_d digits[:, d] 2^(16 d)``.

    Parameters
    ----------
    digits : ndarray of int64, shape (n, nd)
        Every digit in ``[0, 2^16)``.

    Returns
    -------
    ndarray of object, shape (n,)
        One ``int.from_bytes`` per row of the little-endian 16-bit digits: the same integers as the
        shift-and-add over words, about 6x faster at 55,050 rows of 480 bits (measured).
    """
    n, nd = digits.shape
    raw = np.ascontiguousarray(digits, dtype="<u2").tobytes()
    width, frombytes = 2 * nd, int.from_bytes
    out = np.empty(n, dtype=object)
    out[:] = [frombytes(raw[i * width:(i + 1) * width], "little") for i in range(n)]
    return out


@lru_cache(maxsize=16)
def rns_context(q: int, max_inner: int = 4096) -> RnsContext:
    """Cached :class:`RnsContext` for ``(q, max_inner)`` (building one costs milliseconds)."""
    return RnsContext(int(q), int(max_inner))
