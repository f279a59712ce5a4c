"""Exact arithmetic modulo a prime q on float64 BLAS: prepared limb operands, element-wise ops.

Why limbs (and not residues) for the >72-bit CodedSecAgg prime
--------------------------------------------------------------
A hot product of CodedSecAgg is ``Phi^(i) @ epsilon`` (Schlegel et al., eq. 13): ``Phi^(i)`` is a
(d, d) matrix of *uniform* elements of GF(q), q = 2**72 + 15, fixed after the sharing phase, and
``epsilon`` is a (d, c) fixed-point update, i.e. a signed integer of at most k = 48 bits.  We keep the
left operand *prepared*: its balanced representative ``a in (-q/2, q/2)`` is split once into
``L_a`` signed limbs of ``w_a`` bits stored as float64, stacked as an ``(L_a * m, k)`` matrix.  A product
splits the right operand into ``L_b`` limbs of ``w_b`` bits (``L_b`` follows from the operand's actual
magnitude, so a 48-bit ``epsilon`` needs 2 limbs where a uniform field element needs 3-4) and runs
**one** float64 GEMM ``(L_a m, k) @ (k, L_b n)``.  With ``w_a + w_b <= 53 - ceil(log2 k)`` every partial
sum is an integer below ``2**53`` and is therefore exact; ``w_a`` is chosen at preparation to minimise
``L_a * L_b`` for the expected right operand (``rhs_bits``).  The ``L_a L_b`` partial products are
folded back modulo q by an int64 carry pass and one short big-integer pass per output element.

A residue number system would need about 8 primes below 2**21 for a uniform 73-bit operand (products
reach ``k q**2 ~ 2**157``) and 8 GEMMs regardless of how small ``epsilon`` is, plus a CRT on every
output; the limb form adapts to the small right operand, needs no CRT and its reduction is a short
carry pass.  Both keep the large operand in prepared form across rounds, which is what matters:
preparing a (2000, 2000) operand costs far more than one product.

Canonical storage of matrices over GF(q) is described in :mod:`fednet.algebra.fields` (int64 below
2**62, Python-int object arrays above).  Products ``(m, k) @ (k, n)`` charge ``m * k * n`` MACs to
the meter (:mod:`fednet.algebra.meter`); limbs are not counted.  Element-wise additions charge one
MAC per element and per added operand, as the paper counts additions in the sharing phase
(Sec. VI-C: "additions (MAC operations where one of the factors is set to 1)"); public-scalar products
charge one MAC per element.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fednet.algebra.fields import as_field, field_dtype
from fednet.algebra.meter import charge

__all__ = [
    "balanced",
    "signed_int64",
    "add_mod",
    "sub_mod",
    "neg_mod",
    "scale_mod",
    "sum_mod",
    "lincomb_mod",
    "PreparedMatrix",
    "prepare",
    "matmul_mod",
    "limb_width",
]

_EXACT_BITS = 53  # float64 integers are exact below 2**53
_WORD = 62  # word size used to move Python ints into int64 arrays


def _check_q(q) -> int:
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 3:
        raise ValueError(f"q must be an odd prime >= 3, got {q!r}")
    return int(q)


def balanced(v: np.ndarray, q: int) -> np.ndarray:
    """Balanced representatives ``v`` or ``v - q`` in ``[-(q-1)/2, (q-1)/2]``.

    Parameters
    ----------
    v : ndarray, any shape, over GF(q) (canonical, storage dtype)
    q : int

    Returns
    -------
    ndarray
        Same shape; int64 for ``q < 2**62``, object otherwise.
    """
    q = _check_q(q)
    half = (q - 1) // 2
    return np.where(v > half, v - q, v)


def signed_int64(v: np.ndarray, q: int) -> np.ndarray:
    """Balanced representatives of ``v`` over GF(q) as int64 (the inverse of the signed map).

    Raises
    ------
    OverflowError
        If some representative does not fit int64 (never silently wraps).
    """
    b = balanced(np.asarray(v), q)
    if b.dtype != object:
        return b.astype(np.int64, copy=False)
    if b.size and (b.min() < -(2**63) + 1 or b.max() > 2**63 - 1):
        raise OverflowError("signed_int64: a balanced representative does not fit int64")
    return b.astype(np.int64)


def _charge_elementwise(n_elements: int) -> None:
    charge(int(n_elements))


def _same_shape(a: np.ndarray, b: np.ndarray, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names}: shapes {a.shape} and {b.shape} differ")


def add_mod(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """``(a + b) mod q`` element-wise; charges ``a.size`` MACs.

    Parameters
    ----------
    a, b : ndarray, same shape, over GF(q) (canonical)
    q : int

    Returns
    -------
    ndarray
        Same shape over GF(q).
    """
    q = _check_q(q)
    _same_shape(a, b, "add_mod")
    _charge_elementwise(a.size)
    s = a + b
    return np.where(s >= q, s - q, s)


def sub_mod(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """``(a - b) mod q`` element-wise; charges ``a.size`` MACs.

    Parameters
    ----------
    a, b : ndarray, same shape, over GF(q) (canonical)
    q : int

    Returns
    -------
    ndarray
        Same shape over GF(q).

    Raises
    ------
    ValueError
        If the shapes differ or ``q`` is not an integer >= 3.
    """
    q = _check_q(q)
    _same_shape(a, b, "sub_mod")
    _charge_elementwise(a.size)
    s = a - b
    return np.where(s < 0, s + q, s)


def neg_mod(a: np.ndarray, q: int) -> np.ndarray:
    """``-a mod q`` element-wise (no MACs: a sign change).

    Parameters
    ----------
    a : ndarray, any shape, over GF(q) (canonical)
    q : int

    Returns
    -------
    ndarray
        Same shape over GF(q).
    """
    q = _check_q(q)
    return np.where(a == 0, a, q - a)


def scale_mod(c: int, a: np.ndarray, q: int) -> np.ndarray:
    """Public scalar times a matrix, ``(c * a) mod q``; charges ``a.size`` MACs.

    Parameters
    ----------
    c : int
        Public scalar (any integer; reduced mod q).
    a : ndarray, any shape, over GF(q)
    q : int
    """
    q = _check_q(q)
    c = int(c) % q
    _charge_elementwise(a.size)
    if q < 2**31:
        return (a.astype(np.int64) * c) % q
    out = (a.astype(object) * c) % q
    return out if field_dtype(q) == object else out.astype(np.int64)


def sum_mod(arrays: Sequence[np.ndarray], q: int) -> np.ndarray:
    """Sum of matrices over GF(q); charges ``(len - 1) * size`` MACs.

    ``arrays`` is a sequence of equal-shape arrays or one stacked ndarray (summed over its first axis; cheapest).

    Raises
    ------
    ValueError
        If ``arrays`` is empty or the shapes differ.
    """
    q = _check_q(q)
    if len(arrays) == 0:
        raise ValueError("sum_mod: arrays is empty")
    first = np.asarray(arrays[0])
    if not isinstance(arrays, np.ndarray):                  # a stacked array's rows share their shape
        odd = next((x for x in arrays[1:] if np.shape(x) != first.shape), None)
        if odd is not None:
            _same_shape(first, np.asarray(odd), "sum_mod")
    _charge_elementwise((len(arrays) - 1) * first.size)
    if first.dtype == object:
        acc = first.copy()
        for x in arrays[1:]:
            acc = acc + x
        return acc % q
    # int64: blocks of rows summed at once (a survivor adds |U1| shares of a few elements: one NumPy call, not
    # |U1|), few enough that a partial sum stays below 2**63 and a block below ~8 MB
    per = max(1, (2**63 - 1) // max(q - 1, 1) - 1)
    step = max(1, min(per, (1 << 20) // max(first.size, 1)))
    acc = np.zeros(first.shape, dtype=np.int64)
    for i in range(0, len(arrays), step):
        acc += np.asarray(arrays[i:i + step]).sum(axis=0, dtype=np.int64)
        acc %= q
    return acc


def limb_width(inner: int) -> int:
    """Limb width ``w`` (bits) for an exact float64 product with inner dimension ``inner``.

    Sign-magnitude limbs satisfy ``|limb| < 2**w``, so a sum of ``inner`` limb products is below
    ``2**(2 w + ceil(log2 inner)) <= 2**53``: ``w = floor((53 - ceil(log2 inner)) / 2)``.

    Raises
    ------
    ValueError
        If ``inner`` < 1 or so large that ``w`` < 4.
    """
    if inner < 1:
        raise ValueError(f"inner dimension must be >= 1, got {inner}")
    w = (_EXACT_BITS - max(0, math.ceil(math.log2(inner)))) // 2
    if w < 4:
        raise ValueError(f"inner dimension {inner} too large for exact float64 limb products")
    return w


def _words(mag: np.ndarray) -> list[np.ndarray]:
    """Split non-negative integers (int64 or object) into int64 words of ``_WORD`` bits, low first."""
    if mag.dtype != object:
        return [mag.astype(np.int64, copy=False)]
    out = []
    rest = mag
    mask = (1 << _WORD) - 1
    while True:
        out.append((rest & mask).astype(np.int64))
        rest = rest >> _WORD
        if not rest.size or not np.any(rest):
            break
    return out


def _limbs(bal: np.ndarray, w: int, n_limbs: int | None = None) -> tuple[np.ndarray, int]:
    """Sign-magnitude limbs of signed integers: ``x = sum_l limb_l 2**(w l)``, ``|limb_l| < 2**w``.

    Returns float64 array of shape ``(L, *bal.shape)`` and ``L``.
    """
    if bal.dtype != object and bal.size and int(bal.min()) == -(2**63):
        bal = bal.astype(object)        # -(-2**63) does not exist in int64: negate exactly
    neg = bal < 0
    mag = np.where(neg, -bal, bal)
    words = _words(mag)
    if n_limbs is None:
        top = 0
        for i, wd in enumerate(words):
            m = int(wd.max()) if wd.size else 0
            if m:
                top = i * _WORD + m.bit_length()
        n_limbs = max(1, -(-top // w))
    sign = np.where(neg, -1.0, 1.0)
    mask = (1 << w) - 1
    out = np.empty((n_limbs,) + bal.shape, dtype=np.float64)
    for l in range(n_limbs):
        lo_bit = l * w
        wi, off = divmod(lo_bit, _WORD)
        if wi >= len(words):
            out[l] = 0.0
            continue
        v = words[wi] >> off
        if off + w > _WORD and wi + 1 < len(words):
            v = v | (words[wi + 1] << (_WORD - off))
        out[l] = (v & mask).astype(np.float64) * sign
    return out, n_limbs


def _fold(terms: list[tuple[int, np.ndarray]], q: int) -> np.ndarray:
    """``sum_t arr_t * 2**e_t mod q`` for exact int64 arrays ``arr_t`` (``|arr_t| < 2**62``).

    Small q (< 2**31): int64 arithmetic; below 2**32, uint64.  Otherwise the terms are carry-normalised into
    32-bit digits, each digit times ``2**(32 t) mod q`` is accumulated in 25-bit chunks (every partial sum below
    2**63), and only the few chunk accumulators go through Python ints for the final ``mod q``.
    """
    shape = terms[0][1].shape
    if q < 2**31:
        acc = np.zeros(shape, dtype=np.int64)
        for e, c in terms:
            acc = (acc + (c % q) * pow(2, e, q)) % q
        return acc
    if q < 2**32:                                  # uint64 holds a product of two residues (32-bit LightSecAgg)
        acc = np.zeros(shape, dtype=np.uint64)
        for e, c in terms:
            acc = (acc + (c % q).astype(np.uint64) * np.uint64(pow(2, e, q)) % q) % q
        return acc.astype(np.int64)
    base = 32
    mask = (1 << base) - 1
    n_dig = -(-(max(e for e, _ in terms) + 64) // base) + 2
    dig = np.zeros((n_dig,) + shape, dtype=np.int64)
    for e, c in terms:
        di, off = divmod(e, base)
        if off:
            lo = c & ((1 << (base - off)) - 1)
            hi = c >> (base - off)
            dig[di] += lo << off
        else:
            lo = c & mask
            hi = c >> base
            dig[di] += lo
        dig[di + 1] += hi & mask
        dig[di + 2] += hi >> base
    for t in range(n_dig - 1):
        dig[t + 1] += dig[t] >> base
        dig[t] &= mask
    # digits are in [0, 2**32) except the top one, a small signed value
    chunk = 25
    n_c = -(-q.bit_length() // chunk)
    if n_dig * 2 ** (base + chunk) >= 2**63:
        raise OverflowError("_fold: too many digits for exact int64 accumulation")
    acc = np.zeros((n_c,) + shape, dtype=np.int64)
    for t in range(n_dig):
        r = pow(2, base * t, q)
        for cidx in range(n_c):
            rc = (r >> (chunk * cidx)) & ((1 << chunk) - 1)
            if rc:
                acc[cidx] += dig[t] * rc
    out = acc[n_c - 1].astype(object)
    for cidx in range(n_c - 2, -1, -1):
        out = out * (1 << chunk) + acc[cidx].astype(object)
    return out % q


class PreparedMatrix:
    """Left operand A over GF(q) kept in limb form for repeated exact products ``A @ B mod q``.

    Prepare once (e.g. ``Phi^(i)`` after the sharing phase of CodedSecAgg, Schlegel et al. Sec. VI-A)
    and multiply every round (eq. 13).  Storage: float64 array of shape ``(L_a * m, k)`` with
    ``L_a = ceil(bits((q-1)/2) / w)``.

    Parameters
    ----------
    a : ndarray, shape (m, k), over GF(q)
        Canonical elements (int64 or object as in :mod:`fednet.algebra.fields`).
    q : int
        Prime modulus (31-bit LightSecAgg fields, the 73-bit CodedSecAgg field, any odd prime).
    rhs_bits : int, optional
        Expected magnitude bits of the right operands (48 for ``Q<48,24>`` updates); picks the limb
        split that minimises the GEMM width.  Default: a full field element.  Any right operand is
        still multiplied exactly; this only tunes speed.
    storage : {"float64", "float32"}
        Storage of the prepared limbs.  ``float32`` halves the memory (limbs of at most 24 bits are
        exact in float32) and converts to float64 for each product (slower); use it when many
        prepared operands must stay resident (e.g. 120 devices' (2000, 2000) ``Phi``).

    Attributes
    ----------
    shape : tuple (m, k)
    q : int
    w, w_b : int
        Limb widths (bits) of the left and right operands, ``w + w_b = 53 - ceil(log2 k)`` rounded
        down to even: every limb partial sum is an exact float64 integer.
    n_limbs : int
        ``L_a``.

    Raises
    ------
    ValueError
        If ``a`` is not a 2-D matrix of elements of GF(q).
    """

    def __init__(self, a: np.ndarray, q: int, *, rhs_bits: int | None = None,
                 storage: str = "float64"):
        q = _check_q(q)
        if storage not in ("float64", "float32"):
            raise ValueError(f"storage must be 'float64' or 'float32', got {storage!r}")
        a = np.asarray(a)
        if a.ndim != 2:
            raise ValueError(f"a must be a 2-D matrix, got shape {a.shape}")
        a = as_field(a, q, name="a")               # validates [0, q): a wrong value never limbs silently
        self.q = q
        self.shape = a.shape
        m, k = a.shape
        a_bits = max(1, ((q - 1) // 2).bit_length())
        if rhs_bits is None:
            rhs_bits = a_bits
        if not isinstance(rhs_bits, (int, np.integer)) or not 1 <= rhs_bits <= a_bits:
            raise ValueError(f"rhs_bits must be an integer in [1, {a_bits}], got {rhs_bits!r}")
        self.budget = 2 * limb_width(max(k, 1))
        # w_a minimises L_a * L_b for the expected right operand; ties go to fewer left limbs (memory)
        best = None
        for w_a in range(4, self.budget - 3):
            l_a = -(-a_bits // w_a)
            l_b = -(-int(rhs_bits) // (self.budget - w_a))
            key = (l_a * l_b, l_a)
            if best is None or key < best[0]:
                best = (key, w_a, l_a)
        _, self.w, n_limbs = best
        self.w_b = self.budget - self.w
        if storage == "float32":
            # float32 holds |limb| < 2**24 exactly: cap w_a at 24 bits
            best32 = None
            for w_a in range(4, min(self.budget - 3, 24) + 1):
                l_a = -(-a_bits // w_a)
                l_b = -(-int(rhs_bits) // (self.budget - w_a))
                key = (l_a * l_b, l_a)
                if best32 is None or key < best32[0]:
                    best32 = (key, w_a, l_a)
            _, self.w, n_limbs = best32
            self.w_b = self.budget - self.w
        limbs, self.n_limbs = _limbs(balanced(a, q), self.w, n_limbs)
        self.storage = storage
        self._stacked = limbs.reshape(self.n_limbs * m, k).astype(np.float32 if storage == "float32" else np.float64)

    @property
    def nbytes(self) -> int:
        """Bytes held by the prepared limbs (``L_a m k`` times 8 or 4)."""
        return self._stacked.nbytes

    def matmul(self, b: np.ndarray) -> np.ndarray:
        """Exact ``A @ B mod q`` for ``B`` over GF(q).

        Parameters
        ----------
        b : ndarray, shape (k, n) or (k,), over GF(q) (canonical)

        Returns
        -------
        ndarray, shape (m, n) or (m,), over GF(q) (storage dtype); charges ``m * k * n`` MACs.

        Raises
        ------
        ValueError
            If the shapes do not align or ``b`` holds non-field values.
        """
        b = as_field(np.asarray(b), self.q, name="b")
        return self._matmul_balanced(balanced(b, self.q))

    def matmul_signed(self, b: np.ndarray) -> np.ndarray:
        """Exact ``A @ to_field(B) mod q`` for a *signed integer* right operand (no field conversion).

        Use for fixed-point operands such as CodedSecAgg's update ``epsilon`` (int64, |x| < 2**63):
        the number of limbs follows the magnitude of ``b``, so small operands cost fewer GEMM columns.

        Parameters
        ----------
        b : ndarray of int64, shape (k, n) or (k,)
            Signed integers with ``|b| <= (q-1)/2``.

        Returns
        -------
        ndarray, shape (m, n) or (m,), over GF(q); charges ``m * k * n`` MACs.

        Raises
        ------
        ValueError
            If ``b`` is not integer, exceeds the signed range of GF(q), or the shapes do not align.
        """
        b = np.asarray(b)
        if b.dtype.kind not in "iu" and b.dtype != object:
            raise ValueError(f"b must hold integers, got dtype {b.dtype}")
        half = (self.q - 1) // 2
        if b.size and (int(b.min()) < -half or int(b.max()) > half):
            raise ValueError(f"b has values outside the signed range [-{half}, {half}] of GF({self.q})")
        if b.dtype.kind == "u":
            b = b.astype(np.int64)
        return self._matmul_balanced(b)

    def _matmul_balanced(self, bal: np.ndarray) -> np.ndarray:
        vec = bal.ndim == 1
        if vec:
            bal = bal[:, None]
        if bal.ndim != 2 or bal.shape[0] != self.shape[1]:
            raise ValueError(f"matmul: shapes {self.shape} and {bal.shape} do not align")
        m, k = self.shape
        n = bal.shape[1]
        charge(m * k * n)
        lb, n_lb = _limbs(bal, self.w_b)
        rhs = np.ascontiguousarray(np.moveaxis(lb, 0, 1).reshape(k, n_lb * n))
        lhs = self._stacked if self.storage == "float64" else self._stacked.astype(np.float64)
        prod = lhs @ rhs  # (L_a m, L_b n): exact integers below 2**53
        prod = prod.reshape(self.n_limbs, m, n_lb, n)
        terms: dict[int, np.ndarray] = {}
        for la in range(self.n_limbs):
            for lb_ in range(n_lb):
                e = la * self.w + lb_ * self.w_b
                part = prod[la, :, lb_, :].astype(np.int64)
                terms[e] = terms[e] + part if e in terms else part
        out = _fold(sorted(terms.items()), self.q)
        if field_dtype(self.q) != object and out.dtype == object:
            out = out.astype(np.int64)
        return out[:, 0] if vec else out


def prepare(a: np.ndarray, q: int, *, rhs_bits: int | None = None, storage: str = "float64") -> PreparedMatrix:
    """Prepare ``a`` (shape (m, k) over GF(q)) for repeated exact products.

    Parameters and Raises as :class:`PreparedMatrix` (``rhs_bits``, ``storage``).

    Returns
    -------
    PreparedMatrix
        The prepared left operand.
    """
    return PreparedMatrix(a, q, rhs_bits=rhs_bits, storage=storage)


def matmul_mod(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """One-off exact ``a @ b mod q`` (prepares ``a`` on the fly; keep a :class:`PreparedMatrix` for reuse).

    Parameters
    ----------
    a : ndarray, shape (m, k), over GF(q)
    b : ndarray, shape (k, n) or (k,), over GF(q)
    q : int

    Returns
    -------
    ndarray, shape (m, n) or (m,), over GF(q); charges ``m * k * n`` MACs.
    """
    return PreparedMatrix(a, q).matmul(b)


def lincomb_mod(coeffs: np.ndarray, arrays: np.ndarray, q: int) -> np.ndarray:
    """Linear combinations of stacked matrices: ``out[t] = sum_j coeffs[t, j] * arrays[j] mod q``.

    Used by Shamir encoding/decoding and the Lagrange codes: an (r, n) @ (n, size) product.

    Parameters
    ----------
    coeffs : ndarray, shape (r, n) or (n,), over GF(q), or PreparedMatrix of shape (r, n)
        A :class:`PreparedMatrix` (over the same ``q``) is used as it is: coefficients that recur (a Lagrange
        matrix every user applies every round) are split into limbs once (:func:`fednet.algebra.fields.
        prepared_lagrange`), not at every call.
    arrays : ndarray, shape (n, *shape), over GF(q)
    q : int

    Returns
    -------
    ndarray, shape (r, *shape) or (*shape,) over GF(q); charges ``r * n * size`` MACs.

    Raises
    ------
    ValueError
        If the shapes do not agree, or a prepared ``coeffs`` is over another modulus.
    """
    arrays = np.asarray(arrays)
    if isinstance(coeffs, PreparedMatrix):
        if coeffs.q != int(q):
            raise ValueError(f"lincomb_mod: the prepared coefficients are over GF({coeffs.q}), not GF({q})")
        prep, vec, rows, n = coeffs, False, coeffs.shape[0], coeffs.shape[1]
    else:
        coeffs = np.asarray(coeffs)
        vec = coeffs.ndim == 1
        c2 = coeffs[None, :] if vec else coeffs
        prep, rows, n = None, c2.shape[0], c2.shape[1]
    if arrays.shape[0] != n:
        raise ValueError(f"lincomb_mod: {n} coefficients for {arrays.shape[0]} arrays")
    inner = arrays.shape[1:]
    flat = arrays.reshape(arrays.shape[0], -1)
    out = (prep or PreparedMatrix(c2, q)).matmul(flat).reshape((rows,) + inner)
    return out[0] if vec else out
