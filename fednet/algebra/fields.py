"""Prime fields GF(q) through galois: choosing q, signed encodings, Lagrange and Vandermonde tools.

Representation of field elements on the host
--------------------------------------------
A matrix over GF(q) is a plain NumPy array holding the canonical representatives in ``[0, q)``:

* ``q < 2**62``: dtype ``int64`` (the 31-bit LightSecAgg fields and any "small" prime),
* ``q >= 2**62``: dtype ``object`` holding Python ``int`` (the >72-bit CodedSecAgg prime of Remark 3,
  whose elements do not fit one int64).  This is the same storage galois uses for such fields, so
  galois ``FieldArray`` views are free and galois remains the test oracle.

Hot matrix products never run on these arrays element by element: they go through
:class:`fednet.algebra.modp.PreparedMatrix`, which keeps an operand split into signed limbs
(float64) across rounds and multiplies with float64 BLAS exactly.  Element-wise work on the object
arrays (sums of shares, public-scalar products) is linear in the size and is done on the small
(d, c) gradients of each round, or once at set-up.

Lagrange and Vandermonde matrices are computed with Python integers (exact for any q): no galois
field is built on the hot path, because ``galois.GF(q)`` factors ``q - 1`` to find a primitive
element, which takes tens of seconds for DReS-FL's ``2**200 - 75``.  Huge-prime products run in
:mod:`fednet.algebra.rns`.

Signed integers are mapped as in Schlegel et al., "CodedPaddedFL and CodedSecAgg", Remark 3:
``0 .. (q-1)/2`` map to themselves and ``-1 -> q-1, -2 -> q-2, ...``; the inverse map reads a
value above ``(q-1)/2`` as negative.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

import galois
import numpy as np

from fednet.errors import CapacityError

__all__ = [
    "INT64_FIELD_LIMIT",
    "next_prime_above",
    "prime_field",
    "fixed_point_field",
    "paper_field",
    "field_dtype",
    "check_prime",
    "check_field_capacity",
    "as_field",
    "to_field",
    "from_field",
    "uniform",
    "vandermonde",
    "lagrange_coefficients",
    "prepared_lagrange",
    "distinct_points",
]

#: Primes below this bound are stored as int64; above it as Python-int object arrays.
INT64_FIELD_LIMIT = 2**62


@lru_cache(maxsize=4096)
def next_prime_above(bound: int) -> int:
    """Smallest prime strictly greater than ``bound``.

    Parameters
    ----------
    bound : int
        Non-negative integer.

    Returns
    -------
    int
        The prime ``q > bound`` (via :func:`galois.next_prime`).

    Raises
    ------
    ValueError
        If ``bound`` is negative or not an integer.
    """
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0:
        raise ValueError(f"bound must be a non-negative integer, got {bound!r}")
    return int(galois.next_prime(int(bound)))


def check_prime(q: int) -> int:
    """Validate that ``q`` is a prime; return it as a Python int.

    Raises
    ------
    ValueError
        If ``q`` is not an integer prime >= 2.
    """
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 2:
        raise ValueError(f"q must be a prime >= 2, got {q!r}")
    q = int(q)
    if not _is_prime(q):
        raise ValueError(f"q must be a prime, got {q} (not prime)")
    return q


@lru_cache(maxsize=1024)
def _is_prime(q: int) -> bool:
    """``galois.is_prime``, cached: the same few fields are checked at every encoding of every user (issue 32)."""
    return bool(galois.is_prime(q))


@lru_cache(maxsize=32)
def prime_field(q: int) -> type[galois.FieldArray]:
    """The galois field class GF(q) (cached), used as a test oracle.

    Building it for a large q (e.g. DReS-FL's ``2**200 - 75``) factors ``q - 1`` to find a primitive
    element, which takes seconds to minutes; no fednet kernel calls it (Lagrange and Vandermonde
    matrices use Python integers, products use :mod:`fednet.algebra.modp` and
    :mod:`fednet.algebra.rns`).

    Parameters
    ----------
    q : int
        A prime.

    Raises
    ------
    ValueError
        If ``q`` is not prime.
    """
    return galois.GF(check_prime(q))


@lru_cache(maxsize=1024)
def fixed_point_field(k: int, f: int) -> int:
    """Prime ``q > 2**(k+f)`` for CodedSecAgg over ``Q<k,f>`` (Schlegel et al., Remark 3).

    Integer operations run in ``Z_<k+f>`` (scaling postponed until after decoding), so the field must
    hold every signed (k+f)-bit integer: ``q > 2**(k+f)``.  For ``Q<48,24>`` this is
    ``q = 2**72 + 15`` (73 bits).

    Parameters
    ----------
    k, f : int
        Total bits and fractional bits of the fixed-point type, ``0 <= f < k``.

    Raises
    ------
    ValueError
        If ``k`` or ``f`` is out of range.
    """
    _check_fixed_point_format(k, f)
    return next_prime_above(2 ** (int(k) + int(f)))


@lru_cache(maxsize=256)
def paper_field(k: int, f: int) -> int:
    """Largest prime ``q < 2**(k+f)``: a ``(k+f)``-bit field, the width Schlegel et al. count (Remark 3).

    For ``Q<48,24>`` this is ``q = 2**72 - 93`` (72 bits).  Unlike :func:`fixed_point_field` it
    cannot carry every signed ``(k+f)``-bit integer: its signed map (Remark 3) covers
    ``[-(q-1)/2, (q-1)/2]``, missing the ``(2**(k+f) - q + 1) / 2`` values nearest each end of
    ``Z_<k+f>``; callers check the values they share (:func:`check_field_capacity`).

    Parameters
    ----------
    k, f : int
        Total bits and fractional bits of the fixed-point type, ``0 <= f < k``.

    Raises
    ------
    ValueError
        If ``k`` or ``f`` is out of range.
    """
    _check_fixed_point_format(k, f)
    return int(galois.prev_prime(2 ** (int(k) + int(f)) - 1))


def _check_fixed_point_format(k: int, f: int) -> None:
    """Raise ``ValueError`` naming ``k`` or ``f`` unless ``k >= 2`` and ``0 <= f < k`` are integers."""
    if not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    if not isinstance(f, (int, np.integer)) or not 0 <= f < k:
        raise ValueError(f"f must satisfy 0 <= f < k = {k}, got {f!r}")


def field_dtype(q: int) -> np.dtype:
    """Storage dtype of canonical elements of GF(q): int64 below 2**62, object above."""
    return np.dtype(np.int64) if int(q) < INT64_FIELD_LIMIT else np.dtype(object)


def check_field_capacity(q: int, max_abs: int, *, what: str = "values", param: str = "q") -> None:
    """Refuse a field too small to carry signed integers of magnitude up to ``max_abs``.

    The signed map of Remark 3 is a bijection on ``[-(q-1)/2, (q-1)/2]``; a decoded value outside it
    would wrap around silently, so this check belongs at configuration time.

    Parameters
    ----------
    q : int
        Field order (a prime).
    max_abs : int
        Largest magnitude the field must represent (e.g. ``2**(k+f-1)`` for ``Z_<k+f>``, or
        ``D * max|x| * 2**b`` for a quantised sum).
    what : str
        Name of the carried quantity, used in the error message.
    param : str
        Name of the configuration parameter that sets the field (``q``, ``p``, ...), for the message.

    Raises
    ------
    fednet.errors.CapacityError
        (a ``ValueError``) If ``2 * max_abs + 1 > q``; the message names ``param``, the bound and the
        smallest prime that works.
    """
    q = int(q)
    max_abs = int(max_abs)
    if max_abs < 0:
        raise ValueError(f"max_abs must be non-negative, got {max_abs}")
    if 2 * max_abs + 1 > q:
        smallest = int(galois.next_prime(2 * max_abs))
        raise CapacityError(
            f"field too small: {param} = {q} ({q.bit_length()} bits) cannot carry {what} of magnitude up to "
            f"{max_abs} ({max_abs.bit_length()} bits); need {param} > 2*max_abs = {2 * max_abs}: the smallest "
            f"prime that works is {param} = {smallest} ({smallest.bit_length()} bits)"
        )


def _as_int_array(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == object:
        return a
    if a.dtype.kind not in "iub":
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False) if a.dtype.kind != "u" or a.dtype.itemsize < 8 else a


def as_field(x, q: int, *, name: str = "x") -> np.ndarray:
    """Validate canonical elements of GF(q) (values in ``[0, q)``) and return them in storage dtype.

    Parameters
    ----------
    x : array_like of int, any shape
        Canonical representatives (galois arrays are accepted).
    q : int
        Field order.
    name : str
        Argument name for error messages.

    Returns
    -------
    ndarray
        Same shape, dtype :func:`field_dtype` ``(q)``.

    Raises
    ------
    ValueError
        If an element is not an integer in ``[0, q)``.
    """
    q = int(q)
    a = _as_int_array(np.asarray(x).view(np.ndarray) if isinstance(x, galois.FieldArray) else x, name)
    if a.size:
        lo, hi = a.min(), a.max()
        if lo < 0 or hi >= q:
            raise ValueError(f"{name} must hold elements of GF({q}) in [0, q), got values in [{lo}, {hi}]")
    dt = field_dtype(q)
    if dt == object:
        if a.dtype == object:
            if a.size and all(type(v) is int for v in a.flat[:1]) and all(type(v) is int for v in a.flat[-1:]):
                return a
            return np.array([int(v) for v in a.ravel()], dtype=object).reshape(a.shape)
        return a.astype(object)
    return a.astype(np.int64, copy=False)


def to_field(x, q: int, *, name: str = "x") -> np.ndarray:
    """Map signed integers to GF(q): ``x >= 0`` to ``x``, ``x < 0`` to ``q + x`` (Remark 3).

    Parameters
    ----------
    x : array_like of int, any shape
        Signed integers with ``|x| <= (q-1)/2`` (int64 or Python ints).
    q : int
        Field order (odd prime).

    Returns
    -------
    ndarray
        Same shape over GF(q), dtype :func:`field_dtype` ``(q)``.

    Raises
    ------
    ValueError
        If some ``|x| > (q-1)/2`` (the field is too small for the value), or ``x`` is not integer.
    """
    q = int(q)
    a = _as_int_array(x, name)
    half = (q - 1) // 2
    if a.size:
        lo, hi = a.min(), a.max()
        if int(lo) < -half or int(hi) > half:
            raise ValueError(
                f"{name} has values in [{lo}, {hi}] outside the signed range [-{half}, {half}] of GF({q}); "
                "the field is too small"
            )
    if field_dtype(q) == object:
        a = a.astype(object)
        return np.where(a < 0, a + q, a)
    a = a.astype(np.int64)
    return np.where(a < 0, a + q, a)


def from_field(v, q: int, *, name: str = "v") -> np.ndarray:
    """Inverse of :func:`to_field`: values above ``(q-1)/2`` become ``v - q``.

    Parameters
    ----------
    v : array_like of int, any shape
        Canonical elements of GF(q).

    Returns
    -------
    ndarray
        Signed integers; int64 when ``q < 2**62``, else Python ints (object).  Callers that know the
        values are small may cast to int64 (see ``fednet.algebra.modp.signed_int64``).
    """
    q = int(q)
    a = as_field(v, q, name=name)
    half = (q - 1) // 2
    return np.where(a > half, a - q, a)


def uniform(rng: np.random.Generator, q: int, shape) -> np.ndarray:
    """Independent uniform elements of GF(q).

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of randomness (a protocol-secrets stream).
    q : int
        Field order.
    shape : int or tuple of int
        Output shape.

    Returns
    -------
    ndarray
        ``shape`` over GF(q) in storage dtype.  For ``q >= 2**62`` the value is drawn as 62-bit
        words with rejection (exactly uniform).
    """
    q = int(q)
    if q < INT64_FIELD_LIMIT:
        return rng.integers(0, q, size=shape, dtype=np.int64)
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    n = int(np.prod(shape, dtype=np.int64))
    nbits = q.bit_length()
    words = -(-nbits // 62)
    top_bits = nbits - 62 * (words - 1)
    out = np.empty(n, dtype=object)
    todo = np.arange(n)
    while todo.size:
        v = rng.integers(0, 2**top_bits, size=todo.size, dtype=np.int64).astype(object)
        for _ in range(words - 1):
            v = v * (2**62) + rng.integers(0, 2**62, size=todo.size, dtype=np.int64).astype(object)
        ok = v < q
        out[todo[ok]] = v[ok]
        todo = todo[~ok]
    return out.reshape(shape)


def distinct_points(points: Iterable[int], q: int, *, name: str = "points", nonzero: bool = False) -> list[int]:
    """Validate evaluation points: distinct elements of GF(q) (optionally nonzero).

    Raises
    ------
    ValueError
        If a point is outside ``[0, q)``, repeated, or zero when ``nonzero``.
    """
    pts = [int(p) for p in points]
    for p in pts:
        if not 0 <= p < int(q):
            raise ValueError(f"{name} must lie in [0, q) for q = {q}, got {p}")
        if nonzero and p == 0:
            raise ValueError(f"{name} must be nonzero (0 is where the secret lives), got {pts}")
    if len(set(pts)) != len(pts):
        raise ValueError(f"{name} must be distinct, got {pts}")
    return pts


def vandermonde(points: Iterable[int], n_columns: int, q: int) -> np.ndarray:
    """Vandermonde matrix ``V[i, j] = points[i] ** j`` over GF(q).

    Parameters
    ----------
    points : sequence of int, length n
        Distinct evaluation points in GF(q).
    n_columns : int
        Number of powers (polynomial degree + 1).
    q : int

    Returns
    -------
    ndarray, shape (n, n_columns)
        Over GF(q), storage dtype.  Computed with Python integers (exact for any q).
    """
    if n_columns < 1:
        raise ValueError(f"n_columns must be >= 1, got {n_columns}")
    q = int(q)
    pts = distinct_points(points, q)
    V = [[pow(x, j, q) for j in range(int(n_columns))] for x in pts]
    return as_field(np.array(V, dtype=field_dtype(q)).reshape(len(pts), int(n_columns)), q, name="vandermonde")


def lagrange_coefficients(src_points: Iterable[int], dst_points: Iterable[int], q: int, *,
                          cache: bool = True) -> np.ndarray:
    """Interpolation matrix: evaluations at ``src_points`` to evaluations at ``dst_points``.

    ``L[t, j] = l_j(dst_t) = prod_{m != j} (dst_t - src_m) / (src_j - src_m)`` over GF(q), so that for
    any polynomial ``p`` of degree ``< len(src_points)``, ``p(dst) = L @ p(src)``.  This is the decoding
    matrix of Shamir sharing (``dst = [0]``), of Lagrange coded computing and of the LightSecAgg mask
    code (``dst = betas``).  Computed exactly without building a galois field (so a 200-bit q costs no
    factorisation of q - 1; galois is the test oracle): :func:`_lagrange_matrix`, ``O(n (n + r))``
    vectorised field products and ``n`` inverses.

    Parameters
    ----------
    src_points : sequence of int, length n
        Distinct points in GF(q).
    dst_points : sequence of int, length r
        Points in GF(q) (may overlap ``src_points``).
    q : int
    cache : bool
        Keep the matrix for the next call with the same points (default: the same points recur every
        round).  ``False`` for points that rarely recur, e.g. LightSecAgg's decoding from the responders
        of one round in arrival order: an (r, n) matrix per round would fill the cache for nothing.

    Returns
    -------
    ndarray, shape (r, n)
        Over GF(q), storage dtype (a fresh copy).

    Raises
    ------
    ValueError
        If the source points are not distinct elements of GF(q).
    """
    src = tuple(distinct_points(src_points, q, name="src_points"))
    dst = tuple(int(p) % int(q) for p in dst_points)
    if not cache:
        return _lagrange_matrix(src, dst, int(q))
    return _lagrange_cached(src, dst, int(q)).copy()


def prepared_lagrange(src_points: Iterable[int], dst_points: Iterable[int], q: int) -> Any:
    """:func:`lagrange_coefficients` as a :class:`fednet.algebra.modp.PreparedMatrix` (limbs split once), cached:
    the left operand of :func:`fednet.algebra.modp.lincomb_mod` that every user applies every round (LightSecAgg's
    mask encoding, So et al. Sec. 4; split anew at every call it cost 78 % of a full-mode epoch at D = 1,000,
    issue 32).  Read-only: do not change the returned object.

    Raises
    ------
    ValueError
        As :func:`lagrange_coefficients`.
    """
    src = tuple(distinct_points(src_points, q, name="src_points"))
    dst = tuple(int(p) % int(q) for p in dst_points)
    return _prepared_cached(src, dst, int(q))


@lru_cache(maxsize=64)
def _prepared_cached(src: tuple[int, ...], dst: tuple[int, ...], q: int) -> Any:
    from fednet.algebra.modp import PreparedMatrix

    return PreparedMatrix(_lagrange_cached(src, dst, q), q)


@lru_cache(maxsize=256)
def _lagrange_cached(src: tuple[int, ...], dst: tuple[int, ...], q: int) -> np.ndarray:
    res = _lagrange_matrix(src, dst, q)
    res.setflags(write=False)
    return res


def _lagrange_matrix(src: tuple[int, ...], dst: tuple[int, ...], q: int) -> np.ndarray:
    """:func:`lagrange_coefficients` of validated points: ``L[t, j] = w_j prod_{m != j} (dst_t - src_m)``.

    ``w_j = 1 / prod_{m != j} (src_j - src_m)`` (``n`` inverses); the products leaving out one factor are
    prefix times suffix products (no inverse per entry, and ``dst_t = src_j`` needs no special case:
    ``L[t, j] = w_j / w_j = 1`` and the other entries of the row hold the zero factor).  Exact: ``uint64``
    arithmetic for ``q < 2**32`` (a product of two elements is below ``2**64``), Python integers otherwise.
    """
    if not src:
        return np.zeros((len(dst), 0), dtype=field_dtype(q))
    x, to = (np.array(v, dtype=field_dtype(q)) for v in (src, dst))     # int64 differences below 2**62
    dtype = np.dtype(np.uint64) if q < 2**32 else np.dtype(object)
    diff = ((to[None, :] - x[:, None]) % q).astype(dtype)       # (n, r): dst_t - src_m
    gap = ((x[None, :] - x[:, None]) % q).astype(dtype)         # (n, n): src_j - src_m
    np.fill_diagonal(gap, 1)
    den = _prod_mod(gap, q)
    w = np.array([pow(int(v), -1, q) for v in den], dtype=object).astype(dtype)
    res = (_leave_one_out_products(diff, q) * w[:, None] % q).T
    return as_field(np.ascontiguousarray(res).astype(field_dtype(q)), q, name="lagrange")


def _prod_mod(a: np.ndarray, q: int) -> np.ndarray:
    """``prod_m a[m] mod q`` over the first axis (``uint64`` for ``q < 2**32``, else object)."""
    acc = a[0] % q
    for row in a[1:]:
        acc = acc * row % q
    return acc


def _leave_one_out_products(a: np.ndarray, q: int) -> np.ndarray:
    """``out[j] = prod_{m != j} a[m] mod q`` over the first axis: prefix times suffix products."""
    out = np.empty_like(a)
    acc = np.ones_like(a[0])
    for j in range(a.shape[0]):
        out[j] = acc
        acc = acc * a[j] % q
    acc = np.ones_like(a[0])
    for j in range(a.shape[0] - 1, -1, -1):
        out[j] = out[j] * acc % q
        acc = acc * a[j] % q
    return out
