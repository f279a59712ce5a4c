"""Fixed-point numbers ``Q<k,f>`` over Z_2^k with exact limb kernels on float64 BLAS.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg" (the paper),
Sec. II-B (the set ``Q<k,f>``) and Sec. IV (addition, multiplication, Propositions 1-2);
Catrina and Saxena, FC 2010 (fixed point for secure computation).

A fixed-point number ``x~ = x_bar * 2^-f`` is stored as its integer ``x_bar`` in
``Z<k> = [-2^(k-1), 2^(k-1))`` (an ``int64`` array, ``2 <= k <= 62``, ``0 <= f < k``).

* addition: ``(a + b)`` reduced to ``Z<k>`` (signed wrap, i.e. arithmetic mod 2^k);
* multiplication: ``floor(a * b * 2^-f)`` reduced to ``Z<k>``, with the full ``2k``-bit
  product formed before the shift;
* matrix product: ``floor((A @ B) * 2^-f)`` reduced to ``Z<k>``, the inner sum formed
  *exactly* before the single shift.  Since ``floor(S / 2^f) mod 2^k`` only depends on
  ``S mod 2^(k+f)``, the kernel computes ``S mod 2^(k+f)`` (``2^72`` for ``Q<48,24>``).

Exact kernels
-------------
Operands are split into 16-bit limbs (lower limbs unsigned in ``[0, 2^16)``, the top limb
signed), stored as float64 in a :class:`PreparedOperand` that is built once and reused across
rounds.  A product is one float64 GEMM per pair of limbs whose weight ``2^(16(i+j))`` is below
the output modulus; every partial sum of a GEMM is bounded by ``K * 2^32 < 2^53`` when the inner
dimension ``K`` is at most ``2^21 - 1`` (:data:`MAX_INNER`; longer inner dimensions are chunked),
so BLAS is exact.  The per-weight sums are converted to int64 and recombined with an exact carry
chain (``|partial| < 2^57``), so no int64 overflows.  MACs are charged through
:func:`fednet.algebra.meter.charge` (``m * K * n`` per product, limbs not counted).

The same kernel computes products modulo ``2^bits`` for rings wider than 62 bits
(:func:`ring_matmul`), returning the result as limbs; this is what deferred scaling needs
(see the note on Proposition 2 below).

Note on Proposition 2
---------------------
A public fractional ``c~`` times a padded value ``(x_bar + r_bar) mod 2^k`` with the rule
``floor(c_bar * v * 2^-f) mod 2^k`` is *not* linear in ``v mod 2^k``: a wrap ``v = x + r - 2^k t``
adds ``2^(k-f) * c_bar * t`` (mod 2^k), which is not a multiple of 2^k.  The retrieval of
Proposition 2 is exact up to ``2^-f`` when the padded value lives in the wider ring
``Z_2^(k+f)`` (pad uniform over ``Z_2^(k+f)``): then ``c_bar * v mod 2^(k+f)`` is linear, and one
shift by ``f`` yields ``Z<k>`` values whose difference is off by at most one unit in the last
place.  :meth:`FixedPoint.mul_padded` implements exactly this; the tests check both the failure
of the naive rule and the ``2^-f`` bound of the corrected one.

Examples
--------
>>> import numpy as np
>>> q = FixedPoint(48, 24)
>>> a = q.encode(np.array([[1.5, -2.0]]))
>>> b = q.encode(np.array([[2.0], [0.25]]))
>>> float(q.decode(q.matmul(a, b))[0, 0])
2.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednet.algebra.meter import charge

__all__ = [
    "FixedPointOverflow",
    "LIMB_BITS",
    "MAX_INNER",
    "FixedPoint",
    "PreparedOperand",
    "prepare",
    "ring_matmul",
    "limbs_to_object",
    "object_to_limbs",
    "extract_bits",
    "random_ring_limbs",
    "ring_from_int",
    "ring_add",
    "ring_scaled_sum",
    "ring_shift",
    "prepared_from_limbs",
]

LIMB_BITS = 16
"""Width of one limb in bits."""

_LIMB_MASK = (1 << LIMB_BITS) - 1

MAX_INNER = (1 << 21) - 1
"""Longest inner dimension of one float64 GEMM: ``MAX_INNER * 2^32 < 2^53``."""

MAX_K = 62
"""Largest ``k`` stored in int64 (sums of two values stay below 2^63)."""


# --------------------------------------------------------------------------- limbs
def _check_int_array(name: str, a) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype != np.int64:
        if arr.dtype.kind in "iu" and arr.size and (
            int(arr.max(initial=0)) >= 2**63 or int(arr.min(initial=0)) < -(2**63)
        ):
            raise ValueError(f"{name} does not fit int64")
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr


def _bits_signed(a: np.ndarray) -> int:
    """Smallest ``b`` with every entry in ``[-2^(b-1), 2^(b-1))`` (at least 1)."""
    if a.size == 0:
        return 1
    hi = int(a.max())
    lo = int(a.min())
    return max(hi.bit_length(), (-lo - 1).bit_length() if lo < 0 else 0) + 1


def _int64_to_limbs(a: np.ndarray, nlimbs: int) -> np.ndarray:
    """Split signed int64 ``a`` into ``nlimbs`` limbs, shape ``(nlimbs, *a.shape)`` int64."""
    out = np.empty((nlimbs,) + a.shape, dtype=np.int64)
    for i in range(nlimbs - 1):
        out[i] = (a >> (LIMB_BITS * i)) & _LIMB_MASK
    out[nlimbs - 1] = a >> (LIMB_BITS * (nlimbs - 1))
    return out


def object_to_limbs(a: np.ndarray, nlimbs: int) -> np.ndarray:
    """Split an array of Python ints into ``nlimbs`` 16-bit limbs (top limb signed).

    Parameters
    ----------
    a : ndarray of object (Python int)
        Values in ``[-2^(16 nlimbs - 1), 2^(16 nlimbs - 1))``.
    nlimbs : int
        Number of limbs.

    Returns
    -------
    ndarray, shape (nlimbs, *a.shape), int64

    Raises
    ------
    ValueError
        If a value does not fit in ``nlimbs`` limbs.
    """
    a = np.asarray(a, dtype=object)
    out = np.empty((nlimbs,) + a.shape, dtype=np.int64)
    for i in range(nlimbs - 1):
        out[i] = ((a >> (LIMB_BITS * i)) & _LIMB_MASK).astype(np.int64)
    top = a >> (LIMB_BITS * (nlimbs - 1))
    if top.size and (max(top.flat) >= 1 << (LIMB_BITS - 1) or min(top.flat) < -(1 << (LIMB_BITS - 1))):
        raise ValueError(f"a does not fit in nlimbs={nlimbs} limbs")
    out[nlimbs - 1] = top.astype(np.int64)
    return out


def limbs_to_object(limbs: np.ndarray) -> np.ndarray:
    """Recombine limbs (shape ``(L, ...)``, any signs) into an array of Python ints."""
    limbs = np.asarray(limbs)
    acc = np.zeros(limbs.shape[1:], dtype=object)
    for i in range(limbs.shape[0] - 1, -1, -1):
        acc = acc * (1 << LIMB_BITS) + limbs[i].astype(object)
    return acc


@dataclass(frozen=True, eq=False)
class PreparedOperand:
    """A matrix split once into float64 limbs, reused by every product it enters.

    Attributes
    ----------
    limbs : ndarray, shape (L, m, n), float64
        ``a = sum_i limbs[i] * 2^(16 i)``; limbs ``0..L-2`` in ``[0, 2^16)``, limb ``L-1``
        signed in ``[-2^15, 2^15)``.  Exactly representable in float64.
    shape : tuple of int
        ``(m, n)``, the shape of the matrix.

    Notes
    -----
    Build with :func:`prepare`.  The right-hand (column-concatenated) layout is built lazily
    and cached, so a matrix used on the right in every round is transposed once.
    """

    limbs: np.ndarray
    shape: tuple[int, int]

    @property
    def nlimbs(self) -> int:
        """Number of limbs ``L``."""
        return self.limbs.shape[0]

    def right_layout(self) -> np.ndarray:
        """Limbs side by side, shape ``(m, L * n)`` float64 (cached)."""
        cached = self.__dict__.get("_right")
        if cached is None:
            L, m, n = self.limbs.shape
            cached = np.ascontiguousarray(self.limbs.transpose(1, 0, 2).reshape(m, L * n))
            object.__setattr__(self, "_right", cached)
        return cached

    def to_object(self) -> np.ndarray:
        """The matrix as Python ints, shape ``(m, n)`` (for tests and oracles)."""
        return limbs_to_object(self.limbs.astype(np.int64))


def prepare(a, nlimbs: int | None = None) -> PreparedOperand:
    """Split an integer matrix into float64 limbs for the exact kernels.

    Parameters
    ----------
    a : array_like of int, shape (m, n) or (m,), or PreparedOperand
        int64 values (signed), or Python ints (object dtype) for rings wider than 62 bits, or a
        limb array of shape ``(L, m, n)`` passed as ``PreparedOperand``.  A vector is treated as
        an ``(m, 1)`` column.
    nlimbs : int, optional
        Number of limbs; by default the fewest that hold the largest magnitude present, so small
        data (e.g. features with ``|x| < 1``) costs fewer GEMMs.

    Returns
    -------
    PreparedOperand

    Raises
    ------
    ValueError
        If ``a`` is not 1-D/2-D, or ``nlimbs`` is too small for its values.
    """
    if isinstance(a, PreparedOperand):
        return a
    arr = np.asarray(a)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"a must be a matrix, got shape {arr.shape}")
    if arr.dtype == object:
        bits = max((max(int(v).bit_length(), (-int(v) - 1).bit_length()) for v in arr.flat), default=0) + 1
        need = max(1, math.ceil(bits / LIMB_BITS))
        if nlimbs is None:
            nlimbs = need
        limbs = object_to_limbs(arr, nlimbs)
    else:
        arr = _check_int_array("a", arr)
        need = max(1, math.ceil(_bits_signed(arr) / LIMB_BITS))
        if nlimbs is None:
            nlimbs = need
        if nlimbs < need:
            raise ValueError(f"nlimbs={nlimbs} is too small for values needing {need} limbs")
        limbs = _int64_to_limbs(arr, nlimbs)
    return PreparedOperand(limbs.astype(np.float64), tuple(arr.shape))


def _carry(partials: list[np.ndarray], out_bits: int) -> np.ndarray:
    """Normalise weight-``2^(16 s)`` partial sums into limbs of ``S mod 2^out_bits``.

    Returns limbs, shape ``(ceil(out_bits/16), ...)``, each in ``[0, 2^16)`` (the top one masked
    to the remaining bits): the canonical non-negative residue.
    """
    nout = math.ceil(out_bits / LIMB_BITS)
    shape = partials[0].shape
    out = np.empty((nout,) + shape, dtype=np.int64)
    c = np.zeros(shape, dtype=np.int64)
    for s in range(nout):
        if s < len(partials):
            c = c + partials[s]
        out[s] = c & _LIMB_MASK
        c = c >> LIMB_BITS
    top_bits = out_bits - LIMB_BITS * (nout - 1)
    out[nout - 1] &= (1 << top_bits) - 1
    return out


def extract_bits(limbs: np.ndarray, shift: int, k: int) -> np.ndarray:
    """Bits ``shift .. shift+k-1`` of a non-negative limb number, as signed ``Z<k>`` int64.

    Parameters
    ----------
    limbs : ndarray, shape (L, ...), int64
        Canonical limbs (each in ``[0, 2^16)``) of a residue, e.g. from :func:`ring_matmul`.
    shift : int
        Number of low bits dropped (``f`` for a fixed-point product): a floor division by
        ``2^shift``.
    k : int
        Width of the result, ``1 <= k <= 62``.

    Returns
    -------
    ndarray, shape (...), int64
        ``floor(S / 2^shift)`` reduced to ``[-2^(k-1), 2^(k-1))``.
    """
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in [1, {MAX_K}], got {k}")
    res = np.zeros(limbs.shape[1:], dtype=np.int64)
    kmask = (1 << k) - 1
    for s in range(limbs.shape[0]):
        lo = LIMB_BITS * s - shift  # position of this limb's bit 0 in the result
        if lo + LIMB_BITS <= 0 or lo >= k:
            continue
        piece = limbs[s] >> (-lo) if lo < 0 else limbs[s]
        width = k - max(lo, 0)
        piece = piece & ((1 << min(width, 62)) - 1)
        res |= (piece << max(lo, 0)) & kmask
    return np.where(res >= (1 << (k - 1)), res - (1 << k), res)


def ring_matmul(a, b, out_bits: int) -> np.ndarray:
    """Exact integer matrix product ``a @ b mod 2^out_bits``, as limbs.

    Parameters
    ----------
    a : PreparedOperand or int array, shape (m, K)
    b : PreparedOperand or int array, shape (K, n)
    out_bits : int
        Modulus exponent (any positive size, e.g. 72 for ``Q<48,24>`` products, 96 for the
        deferred-scaling ring of CodedPaddedFL).

    Returns
    -------
    ndarray, shape (ceil(out_bits/16), m, n), int64
        Canonical limbs of the residue in ``[0, 2^out_bits)``.

    Raises
    ------
    ValueError
        If the inner dimensions do not agree or ``out_bits`` is not positive.

    Notes
    -----
    Charges ``m * K * n`` MACs.  One float64 GEMM per limb of ``a`` (against the limbs of ``b``
    that still matter modulo ``2^out_bits``), per chunk of at most :data:`MAX_INNER` inner
    indices; partial sums below ``2^53`` are exact.
    """
    if out_bits <= 0:
        raise ValueError(f"out_bits must be positive, got {out_bits}")
    pa, pb = prepare(a), prepare(b)
    m, K = pa.shape
    K2, n = pb.shape
    if K != K2:
        raise ValueError(f"ring_matmul: shapes {pa.shape} and {pb.shape} do not align")
    charge(m * K * n)
    nout = math.ceil(out_bits / LIMB_BITS)
    La, Lb = pa.nlimbs, pb.nlimbs
    partials = [np.zeros((m, n), dtype=np.int64) for _ in range(min(nout, La + Lb - 1))]
    right = pb.right_layout()  # (K, Lb * n)
    stacked = La + Lb - 1 <= nout  # every limb pair matters: one GEMM on stacked limbs
    for k0 in range(0, max(K, 1), MAX_INNER):
        k1 = min(K, k0 + MAX_INNER)
        if stacked:
            rows = pa.limbs if k1 - k0 == K else pa.limbs[:, :, k0:k1]
            rows = rows.reshape(La * m, k1 - k0)
            prod = (rows @ right[k0:k1]).astype(np.int64)
            for i in range(La):
                for j in range(Lb):
                    partials[i + j] += prod[i * m : (i + 1) * m, j * n : (j + 1) * n]
            continue
        for i in range(min(La, nout)):
            nb = min(Lb, nout - i)
            prod = pa.limbs[i, :, k0:k1] @ right[k0:k1, : nb * n]
            prod = prod.astype(np.int64)
            for j in range(nb):
                partials[i + j] += prod[:, j * n : (j + 1) * n]
    return _carry(partials, out_bits)


def random_ring_limbs(shape, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform elements of ``Z_2^bits`` as canonical limbs.

    Parameters
    ----------
    shape : tuple of int
    bits : int
        Ring size exponent (positive).
    rng : numpy.random.Generator

    Returns
    -------
    ndarray, shape (ceil(bits/16), *shape), int64
        Each limb uniform and independent, hence the number uniform on ``[0, 2^bits)``.
    """
    if bits <= 0:
        raise ValueError(f"bits must be positive, got {bits}")
    nout = math.ceil(bits / LIMB_BITS)
    out = rng.integers(0, 1 << LIMB_BITS, size=(nout,) + tuple(shape), dtype=np.int64)
    out[-1] &= (1 << (bits - LIMB_BITS * (nout - 1))) - 1
    return out


# --------------------------------------------------------------------------- Q<k,f>

class FixedPointOverflow(OverflowError, ValueError):
    """A real value that ``Q<k,f>`` cannot hold (out of range, or not finite).

    A ``ValueError`` as before; also an ``OverflowError``, so that a round whose values outgrow the
    format at run time ends as a recorded failure (:mod:`fednet.protocol.finite`).
    """

class FixedPoint:
    """The fixed-point format ``Q<k,f>`` (paper Sec. II-B, Sec. IV).

    Parameters
    ----------
    k : int
        Total length in bits, ``2 <= k <= 62`` (the paper's ``k``; 48 in Sec. VII).
    f : int
        Resolution (fractional bits), ``0 <= f < k`` (the paper's ``f``; 24 in Sec. VII).

    Raises
    ------
    ValueError
        If ``k`` or ``f`` is out of range.

    Notes
    -----
    Values are int64 arrays in ``[-2^(k-1), 2^(k-1))`` representing ``x_bar * 2^-f``; the
    representable reals are ``[-2^(k-f-1), 2^(k-f-1))`` in steps of ``2^-f``.
    """

    def __init__(self, k: int = 48, f: int = 24) -> None:
        if not isinstance(k, (int, np.integer)) or not 2 <= k <= MAX_K:
            raise ValueError(f"k must be an integer in [2, {MAX_K}], got {k!r}")
        if not isinstance(f, (int, np.integer)) or not 0 <= f < k:
            raise ValueError(f"f must be an integer in [0, k) = [0, {k}), got {f!r}")
        self.k = int(k)
        self.f = int(f)
        self.modulus = 1 << self.k
        self.lo = -(1 << (self.k - 1))
        self.hi = (1 << (self.k - 1)) - 1
        self.nlimbs = math.ceil(self.k / LIMB_BITS)

    def __repr__(self) -> str:
        return f"FixedPoint(k={self.k}, f={self.f})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedPoint) and (self.k, self.f) == (other.k, other.f)

    def __hash__(self) -> int:
        return hash((self.k, self.f))

    # ---------------------------------------------------------------- conversions
    def encode(self, x, *, wrap: bool = False) -> np.ndarray:
        """Reals to ``Z<k>`` integers: ``round(x * 2^f)`` (ties to even).

        Parameters
        ----------
        x : array_like of float
            Real values, in ``[-2^(k-f-1), 2^(k-f-1))`` unless ``wrap``.
        wrap : bool
            Reduce out-of-range values mod ``2^k`` instead of raising.

        Returns
        -------
        ndarray, int64, same shape as ``x``

        Raises
        ------
        ValueError
            If ``x`` has non-finite values, or values out of range and not ``wrap``.
        """
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise FixedPointOverflow(f"x must be finite to enter Q<{self.k},{self.f}>")
        scaled = np.rint(np.ldexp(x, self.f))
        if not wrap:
            # compare with exact float64 powers of two: self.hi = 2^(k-1) - 1 rounds up to 2^(k-1) as a
            # float64 for k >= 54, which would let 2^(k-1) through (and wrap)
            bound = math.ldexp(1.0, self.k - 1)
            if x.size and (scaled.max() >= bound or scaled.min() < -bound):
                raise FixedPointOverflow(
                    f"x out of range for Q<{self.k},{self.f}>: values in "
                    f"[{x.min()!r}, {x.max()!r}] exceed [-2^{self.k - self.f - 1}, "
                    f"2^{self.k - self.f - 1})"
                )
            return scaled.astype(np.int64)
        if x.size and np.abs(scaled).max() >= 2.0**63:
            raise ValueError("x too large to wrap through int64")
        return self.wrap(scaled.astype(np.int64))

    def decode(self, a) -> np.ndarray:
        """``Z<k>`` integers to reals ``a * 2^-f`` (float64, exact for ``k <= 53``).

        Parameters
        ----------
        a : array_like of int

        Returns
        -------
        ndarray, float64
        """
        return np.ldexp(np.asarray(a).astype(np.float64), -self.f)

    def wrap(self, a) -> np.ndarray:
        """Reduce integers to the signed representatives ``[-2^(k-1), 2^(k-1))`` mod ``2^k``.

        Parameters
        ----------
        a : array_like of int (int64; object arrays of Python ints are accepted too)

        Returns
        -------
        ndarray, int64
        """
        a = np.asarray(a)
        if a.dtype == object:
            m = self.modulus
            h = 1 << (self.k - 1)
            return np.array(((a + h) % m) - h, dtype=np.int64).reshape(a.shape)
        a = _check_int_array("a", a)
        return ((a - self.lo) & (self.modulus - 1)) + self.lo

    def validate(self, a, name: str = "a") -> np.ndarray:
        """Check that ``a`` holds ``Z<k>`` integers; return it as int64.

        Raises
        ------
        TypeError
            If ``a`` is not an integer array.
        ValueError
            If a value is outside ``[-2^(k-1), 2^(k-1))``.
        """
        arr = _check_int_array(name, a)
        if arr.size and (int(arr.max()) > self.hi or int(arr.min()) < self.lo):
            raise ValueError(
                f"{name} has values outside Z<{self.k}> = [{self.lo}, {self.hi}]: "
                f"[{int(arr.min())}, {int(arr.max())}]"
            )
        return arr

    # ---------------------------------------------------------------- arithmetic
    def add(self, a, b) -> np.ndarray:
        """``(a + b)`` mod ``2^k`` (signed wrap); paper Sec. IV, secure addition."""
        return self.wrap(self.validate(a, "a") + self.validate(b, "b"))

    def sub(self, a, b) -> np.ndarray:
        """``(a - b)`` mod ``2^k`` (signed wrap)."""
        return self.wrap(self.validate(a, "a") - self.validate(b, "b"))

    def mul(self, a, b) -> np.ndarray:
        """Element-wise ``floor(a * b * 2^-f)`` mod ``2^k`` (paper Sec. IV, multiplication).

        The full ``2k``-bit product is formed exactly (16-bit limbs, int64) before the shift.
        Broadcasting follows NumPy.  Charges one MAC per output element.

        Parameters
        ----------
        a, b : array_like of int, ``Z<k>`` values

        Returns
        -------
        ndarray, int64, ``Z<k>`` values
        """
        a = self.validate(a, "a")
        b = self.validate(b, "b")
        a, b = np.broadcast_arrays(a, b)
        charge(a.size)
        la = _int64_to_limbs(a, self.nlimbs)
        lb = _int64_to_limbs(b, self.nlimbs)
        out_bits = self.k + self.f
        nout = math.ceil(out_bits / LIMB_BITS)
        partials = [np.zeros(a.shape, dtype=np.int64) for _ in range(min(nout, 2 * self.nlimbs - 1))]
        for i in range(self.nlimbs):
            for j in range(self.nlimbs):
                if i + j < len(partials):
                    partials[i + j] += la[i] * lb[j]
        return extract_bits(_carry(partials, out_bits), self.f, self.k)

    def prepare(self, a) -> PreparedOperand:
        """Validate ``Z<k>`` integers and split them into limbs once (see :func:`prepare`).

        Parameters
        ----------
        a : array_like of int, shape (m, n), or PreparedOperand (returned as is)

        Returns
        -------
        PreparedOperand
        """
        if isinstance(a, PreparedOperand):
            return a
        return prepare(self.validate(a, "a"))

    def matmul(self, a, b) -> np.ndarray:
        """Exact fixed-point matrix product ``floor((a @ b) * 2^-f)`` mod ``2^k``.

        The inner sum of ``2k``-bit products is exact (computed mod ``2^(k+f)``, which
        determines the result), then shifted once.  Charges ``m * K * n`` MACs.

        Parameters
        ----------
        a : int array (m, K) of ``Z<k>`` values, or PreparedOperand
        b : int array (K, n) or (K,) of ``Z<k>`` values, or PreparedOperand

        Returns
        -------
        ndarray, shape (m, n) (or (m,) for a vector ``b``), int64 ``Z<k>`` values

        Raises
        ------
        ValueError
            If shapes do not align or values are outside ``Z<k>``.
        """
        vec = not isinstance(b, PreparedOperand) and np.ndim(b) == 1
        limbs = ring_matmul(self.prepare(a), self.prepare(b), self.k + self.f)
        out = extract_bits(limbs, self.f, self.k)
        return out[:, 0] if vec else out

    # ---------------------------------------------------------------- one-time pads
    def random_pad(self, shape, rng: np.random.Generator, *, symmetric: bool = False) -> np.ndarray:
        """Uniform one-time pad over ``Z<k>`` (paper Sec. IV, Proposition 1; Sec. V-A).

        Parameters
        ----------
        shape : int or tuple of int
        rng : numpy.random.Generator
            The protocol-secrets stream of the node drawing the pad.
        symmetric : bool
            Draw a symmetric ``(d, d)`` pad (``R^X = R^X^T``, eq. 7): the upper triangle is
            uniform and mirrored.

        Returns
        -------
        ndarray, int64, uniform on ``[-2^(k-1), 2^(k-1))``

        Raises
        ------
        TypeError
            If ``rng`` is not a ``numpy.random.Generator``.
        ValueError
            If ``symmetric`` and ``shape`` is not square.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        r = rng.integers(self.lo, self.hi, size=shape, dtype=np.int64, endpoint=True)
        if symmetric:
            if len(shape) != 2 or shape[0] != shape[1]:
                raise ValueError(f"a symmetric pad needs a square shape, got {shape}")
            r = np.triu(r) + np.triu(r, 1).T
        return r

    def mul_padded(self, c, padded_wide: np.ndarray) -> np.ndarray:
        """Public ``c`` times a value padded in ``Z_2^(k+f)``, shifted to ``Z<k>``.

        The linear form of Proposition 2 that commutes with the pad: ``c_bar * v`` is formed
        modulo ``2^(k+f)`` (where a wrap of ``v`` vanishes), then shifted by ``f``.  For
        ``v = x + r mod 2^(k+f)``, ``mul_padded(c, v) - mul_padded(c, r)`` equals
        ``floor(c_bar x_bar 2^-f)`` or one more, mod ``2^k``: the retrieval error is at most
        ``2^-f`` (plus ``2^-f`` of the ordinary rounding of ``c x``).

        Parameters
        ----------
        c : int array, ``Z<k>`` values (public)
        padded_wide : int array of Python ints (object) or int64, values mod ``2^(k+f)``

        Returns
        -------
        ndarray, int64, ``Z<k>`` values
        """
        c = self.validate(c, "c").astype(object)
        v = np.asarray(padded_wide).astype(object)
        prod = (c * v) % (1 << (self.k + self.f))
        return self.wrap(prod >> self.f)


# --------------------------------------------------------------------------- ring Z_2^bits on limbs
def ring_from_int(a, bits: int) -> np.ndarray:
    """Signed int64 integers as canonical limbs of their residue mod ``2^bits``.

    Parameters
    ----------
    a : array_like of int (int64)
    bits : int
        Ring size exponent (positive, any size).

    Returns
    -------
    ndarray, shape (ceil(bits/16), *a.shape), int64, each limb in ``[0, 2^16)``
    """
    a = _check_int_array("a", a)
    nout = math.ceil(bits / LIMB_BITS)
    limbs = _int64_to_limbs(a, max(nout, 4))  # 4 limbs hold any int64 exactly (top signed)
    return _carry(list(limbs), bits)


def ring_add(a: np.ndarray, b: np.ndarray, bits: int, *, subtract: bool = False) -> np.ndarray:
    """``a + b`` (or ``a - b``) in ``Z_2^bits`` on canonical limbs, shape ``(L, ...)``.

    Parameters
    ----------
    a, b : ndarray, shape (ceil(bits/16), ...), int64
        Canonical limbs (e.g. from :func:`ring_from_int`, :func:`ring_matmul`).
    bits : int
    subtract : bool
        Compute ``a - b`` instead.

    Returns
    -------
    ndarray, canonical limbs of the result.
    """
    if a.shape != b.shape:
        raise ValueError(f"ring_add: limb shapes {a.shape} and {b.shape} differ")
    return _carry(list(a - b if subtract else a + b), bits)


def ring_scaled_sum(coefficients, terms, bits: int) -> np.ndarray:
    """``sum_j c_j * V_j`` in ``Z_2^bits`` with integer scalars ``c_j``, on canonical limbs.

    Used for the local encoding of CodedPaddedFL (eqs. 8-9): ``c_j`` are the ``Q<k,f>``
    integers of a row of the gradient code, ``V_j`` padded ring matrices.  Charges one MAC per
    term and element.

    Parameters
    ----------
    coefficients : sequence of int, length J, each ``|c_j| < 2^31``
    terms : sequence of ndarray, each shape (ceil(bits/16), ...), canonical limbs
    bits : int

    Returns
    -------
    ndarray, canonical limbs of the sum.

    Raises
    ------
    ValueError
        If the lengths differ, a coefficient is too large, or there are more than 2^14 terms.
    """
    coefficients = [int(c) for c in coefficients]
    if len(coefficients) != len(terms) or not terms:
        raise ValueError(f"need as many coefficients as terms (>0), got {len(coefficients)} and {len(terms)}")
    if any(abs(c) >= 1 << 31 for c in coefficients) or len(terms) > 1 << 14:
        raise ValueError("coefficients must satisfy |c| < 2^31 and there may be at most 2^14 terms")
    nout = math.ceil(bits / LIMB_BITS)
    shape = terms[0].shape
    partials = [np.zeros(shape[1:], dtype=np.int64) for _ in range(nout)]
    for c, v in zip(coefficients, terms):
        if v.shape != shape:
            raise ValueError(f"ring_scaled_sum: term shape {v.shape} differs from {shape}")
        charge(int(np.prod(shape[1:], dtype=np.int64)))
        cl = (c & _LIMB_MASK, c >> LIMB_BITS)  # c = cl[0] + cl[1] 2^16, |cl[1]| < 2^15
        for u, cu in enumerate(cl):
            if cu == 0:
                continue
            for s in range(nout - u):
                partials[s + u] += cu * v[s]  # |.| < 2^32 per term, < 2^47 summed
    return _carry(partials, bits)


def ring_shift(limbs: np.ndarray, shift: int, out_bits: int) -> np.ndarray:
    """``floor(v / 2^shift) mod 2^out_bits`` of a canonical residue ``v``, as canonical limbs.

    Dropping the low bits of a padded residue commutes with removing the pad up to one unit:
    ``floor((x + r) / 2^s) - floor(r / 2^s)`` is ``floor(x / 2^s)`` or one more (the carry).
    """
    if shift < 0 or out_bits <= 0:
        raise ValueError(f"shift must be >= 0 and out_bits > 0, got {shift} and {out_bits}")
    nout = math.ceil(out_bits / LIMB_BITS)
    q0, r0 = divmod(shift, LIMB_BITS)
    L = limbs.shape[0]
    out = []
    for s in range(nout):
        lo = limbs[q0 + s] if q0 + s < L else np.zeros(limbs.shape[1:], dtype=np.int64)
        hi = limbs[q0 + s + 1] if q0 + s + 1 < L else np.zeros(limbs.shape[1:], dtype=np.int64)
        out.append((lo >> r0) | ((hi << (LIMB_BITS - r0)) & _LIMB_MASK) if r0 else lo.copy())
    return _carry(out, out_bits)


def prepared_from_limbs(limbs: np.ndarray) -> PreparedOperand:
    """A :class:`PreparedOperand` from canonical limbs of shape ``(L, m, n)`` (no copy of values).

    The matrix is the residue ``sum_i limbs[i] 2^(16 i)``; products with it are meaningful
    modulo ``2^bits`` for ``bits`` at most ``16 L`` and at most the ring it lives in.
    """
    limbs = np.asarray(limbs)
    if limbs.ndim != 3:
        raise ValueError(f"limbs must have shape (L, m, n), got {limbs.shape}")
    return PreparedOperand(limbs.astype(np.float64), tuple(limbs.shape[1:]))
