"""Capacity checks: does a fixed-point format hold every intermediate an exact computation forms?

Arithmetic in ``Q<k,f>`` is modulo ``2^k`` (DESIGN.md, "Numbers"): a value that leaves
``[-2^(k-f-1), 2^(k-f-1))`` wraps around *silently* -- the exact kernels stay bit-exact modulo
``2^k``, so a decoding check computed from the same wrapped numbers agrees with itself and the
damage shows only as a model that does not learn.  These checks run on the data before any exact
computation (at a protocol's setup) and per round on the values a round forms, and refuse with a
:class:`~fednet.errors.CapacityError` that names the parameter, the bound and the smallest setting
that works.

Bounds are rigorous upper bounds computed in float64 on the *quantised* data, inflated by the
float64 rounding error of their sums (``(n + 2) 2^-52`` relative, Higham, "Accuracy and Stability
of Numerical Algorithms", eq. 3.5) plus one unit ``2^-f`` for the kernels' single floor.

Used by CodedPaddedFL (Schlegel et al., Sec. V: ``X_i^T X_i`` and ``G_i^(1) = -X_i^T Y_i`` in
``Q<k,f>``, eqs. 6-7; the decoded gradients of eq. 12) and CodedSecAgg (Sec. VI, Remark 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from fednet.errors import CapacityError

from .fixed_point import MAX_K, FixedPoint

__all__ = [
    "smallest_k",
    "check_fixed_point_holds",
    "statistics_bounds",
    "devices_statistics_bounds",
    "check_statistics_capacity",
    "check_round_capacity",
    "check_resolution",
    "check_rounding_error",
    "rounding_error",
    "UNDERFLOW_LIMIT",
    "ROUNDING_LIMIT",
]

#: Largest share of a quantity's nonzero values that :func:`check_resolution` lets round to zero.
UNDERFLOW_LIMIT = 0.5
#: Largest relative RMS rounding error (``||round(x) - x|| / ||x||``) that :func:`check_rounding_error` lets a
#: fixed-point format make on the data it carries: 1 %, about seven significant bits.  A coarser format still fits
#: (the capacity checks pass) but trains on other data: ``Q<48,4>`` rounds the quickstart's digits features (2,000
#: random features) with a 99.7 % error (``f = 8``: 4.7 %), and CodedPaddedFL then trains to chance (issue 31).
ROUNDING_LIMIT = 1e-2


def smallest_k(max_abs: float, f: int) -> int:
    """Smallest ``k`` such that ``Q<k,f>`` holds every real of magnitude up to ``max_abs``.

    ``Q<k,f>`` holds the integers ``[-2^(k-1), 2^(k-1))`` scaled by ``2^-f``; a magnitude ``m``
    needs ``ceil(m 2^f) <= 2^(k-1) - 1``.

    Parameters
    ----------
    max_abs : float
        Largest magnitude (reals), finite and non-negative.
    f : int
        Fractional bits.

    Returns
    -------
    int
        The smallest ``k`` (at least ``f + 1``).
    """
    if not (math.isfinite(max_abs) and max_abs >= 0):
        raise ValueError(f"max_abs must be a finite non-negative number, got {max_abs!r}")
    units = math.ceil(math.ldexp(max_abs, f))
    return max(f + 1, units.bit_length() + 1)


def check_fixed_point_holds(q: FixedPoint, max_abs: float, what: str, *, param: str = "k") -> None:
    """Refuse a format ``Q<k,f>`` too narrow for values of magnitude up to ``max_abs``.

    Parameters
    ----------
    q : FixedPoint
        The format.
    max_abs : float
        An upper bound on the magnitude (reals) of the values the computation forms.
    what : str
        What the values are (for the message), e.g. ``"X_i^T X_i of device 3"``.
    param : str
        The configuration parameter to name (``k``).

    Raises
    ------
    fednet.errors.CapacityError
        If ``max_abs`` does not fit: the message gives the bound, ``2^(k-f-1)``, and the smallest
        ``k`` that works with this ``f`` (or says that none up to ``MAX_K`` = 62 does).
    """
    if not math.isfinite(max_abs):
        raise CapacityError(f"{what} is not finite ({max_abs!r}): no {param} can hold it")
    need = smallest_k(max_abs, q.f)
    if need <= q.k:
        return
    limit = math.ldexp(1.0, q.k - q.f - 1)
    fix = (f"the smallest {param} that works with f = {q.f} is {param} = {need}" if need <= MAX_K else
           f"no {param} <= {MAX_K} works with f = {q.f} (it would need {need}); lower f to at most "
           f"{max(0, q.f - (need - MAX_K))} or rescale the data")
    raise CapacityError(
        f"{param} = {q.k} too small: Q<{q.k},{q.f}> holds magnitudes below 2^{q.k - q.f - 1} = {limit:.6g}, "
        f"but {what} reaches {max_abs:.6g}; {fix}")


def _inflate(x: float, n: int, f: int) -> float:
    """Upper bound of a float64 sum of ``n`` non-negative terms, plus one unit of the final floor."""
    return x * (1.0 + (n + 2) * 2.0**-52) + math.ldexp(1.0, -f)


def statistics_bounds(q: FixedPoint, X: np.ndarray, Y: np.ndarray) -> tuple[float, float, float]:
    """Upper bounds on one device's quantised data, ``X^T X`` and ``X^T Y`` (reals).

    Parameters
    ----------
    q : FixedPoint
    X : ndarray, (n, d) float
    Y : ndarray, (n, c) float

    Returns
    -------
    data : float
        ``max(|X|, |Y|)`` after rounding to ``Q<k,f>``.
    gram : float
        Bound on ``max |(X^T X)_ab|``: the largest diagonal entry (Cauchy-Schwarz).
    cross : float
        Bound on ``max |(X^T Y)_ab|``: ``max (|X|^T |Y|)``.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
        raise CapacityError("the data hold non-finite numbers: no fixed-point format can carry them")
    scale = math.ldexp(1.0, q.f)
    xq = np.abs(np.rint(X * scale) / scale)
    yq = np.abs(np.rint(Y * scale) / scale)
    n = X.shape[0]
    data = float(max(xq.max(initial=0.0), yq.max(initial=0.0)))
    gram = _inflate(float((xq * xq).sum(axis=0).max(initial=0.0)), n, q.f)
    cross = _inflate(float((xq.T @ yq).max(initial=0.0)), n, q.f)
    return data, gram, cross



def devices_statistics_bounds(q: FixedPoint, X: Sequence[np.ndarray], Y: Sequence[np.ndarray],
                              memo: Callable[[Hashable, Callable[[], Any]], Any] | None = None
                              ) -> list[tuple[float, float, float]]:
    """:func:`statistics_bounds` of every device, optionally cached per data set.

    Parameters
    ----------
    q : FixedPoint
    X, Y : sequences of ndarray, (n_i, d) and (n_i, c)
        The devices' data.
    memo : callable, optional
        ``memo(key, compute)`` returning a cached ``compute()`` (e.g.
        :meth:`fednet.learning.task.LearningTask.memo`: one computation per task, shared by its runs);
        the key is ``("statistics_bounds", q.f)``.

    Returns
    -------
    list of (float, float, float)
        Per device, as :func:`statistics_bounds`.
    """
    def compute() -> list[tuple[float, float, float]]:
        """Every device's bounds (the cached value)."""
        return [statistics_bounds(q, x, y) for x, y in zip(X, Y)]
    return compute() if memo is None else memo(("statistics_bounds", q.f), compute)


def check_statistics_capacity(q: FixedPoint, Xs: Sequence[np.ndarray], Ys: Sequence[np.ndarray],
                              groups: Sequence[Sequence[int]] | None = None, *, param: str = "k",
                              bounds: Sequence[tuple[float, float, float]] | None = None,
                              memo: Callable[[Hashable, Callable[[], Any]], Any] | None = None) -> None:
    """Refuse ``Q<k,f>`` if the devices' data, Gram sums or first gradients (or their sums) overflow it.

    Checks, on the data, every value the setup of CodedPaddedFL / CodedSecAgg forms in ``Q<k,f>``
    before training: the quantised data, each device's ``X_i^T X_i`` and ``G_i^(1) = -X_i^T Y_i``
    (Schlegel et al., eqs. 6-7 / Remark 3), and for each group the decoded aggregate of the first
    round, ``sum_{i in group} G_i^(1)`` (eq. 12 with ``epsilon = 0``).  Later rounds depend on the
    model and are checked as they are formed (:func:`check_fixed_point_holds`).

    Parameters
    ----------
    q : FixedPoint
    Xs, Ys : sequences of ndarray, (n_i, d) and (n_i, c)
        The devices' data.
    groups : sequence of sequences of int, optional
        Devices whose first gradients are summed exactly (default: all devices).
    param : str
        Parameter to name in the message.
    bounds : sequence of (float, float, float), optional
        :func:`statistics_bounds` of every device at ``q.f``, already computed (they depend on the
        data and ``q.f`` only; a study computes them once per task and reuses them for every run).
    memo : callable, optional
        Without ``bounds``: how :func:`devices_statistics_bounds` caches them (e.g. the task's ``memo``).

    Raises
    ------
    fednet.errors.CapacityError
        Naming ``param``, the offending quantity, its bound and the smallest ``k``.
    ValueError
        If ``bounds`` does not hold one entry per device.
    """
    if bounds is None:
        bounds = devices_statistics_bounds(q, Xs, Ys, memo)
    elif len(bounds) != len(Xs):
        raise ValueError(f"bounds must hold one entry per device ({len(Xs)}), got {len(bounds)}")
    cross = []
    worst: tuple[float, str] = (0.0, "")
    for i, (data, gram, cr) in enumerate(bounds):
        cross.append(cr)
        for value, name in ((data, f"the data of device {i}"), (gram, f"X_i^T X_i of device {i}"),
                            (cr, f"G_i^(1) = -X_i^T Y_i of device {i}")):
            if value > worst[0]:
                worst = (value, name)
    for g, members in enumerate([range(len(cross))] if groups is None else groups):
        total = sum(cross[i] for i in members)
        if total > worst[0]:
            worst = (total, "the decoded first-round gradient (sum of every device's X_i^T Y_i)" if groups is None
                     else f"the decoded first-round gradient of group {g} (sum of its devices' X_i^T Y_i)")
    check_fixed_point_holds(q, worst[0], worst[1], param=param)
    check_rounding_error(Xs, q.f, "f", "the devices' data (X)", memo=memo)


def rounding_error(values: Sequence[np.ndarray], bits: int) -> float:
    """Relative RMS error ``||round(2^bits x) 2^-bits - x|| / ||x||`` of rounding ``values`` to ``2^-bits``.

    Parameters
    ----------
    values : sequence of ndarray
        The real values (every array of a device's data, say); computed array by array (no copy of all).
    bits : int
        Fractional bits.

    Returns
    -------
    float
        0.0 when every value is zero.
    """
    scale = 2.0 ** int(bits)
    err = sig = 0.0
    for a in values:
        x = np.asarray(a, dtype=np.float64)
        r = np.rint(x * scale)
        r /= scale
        r -= x
        err += float(np.vdot(r, r))
        sig += float(np.vdot(x, x))
    return math.sqrt(err / sig) if sig > 0 else 0.0


def check_rounding_error(values: Sequence[np.ndarray], bits: int, param: str, what: str, *,
                         limit: float = ROUNDING_LIMIT, high: int = 62,
                         memo: Callable[[Hashable, Callable[[], Any]], Any] | None = None) -> None:
    """Refuse a fixed-point resolution ``2^-bits`` whose rounding error on ``values`` exceeds ``limit`` (relative RMS,
    :func:`rounding_error`), naming the smallest sufficient setting (issue 31, item 6).

    Parameters
    ----------
    values : sequence of ndarray
        The real values the format carries (the devices' data).
    bits : int
        The fractional bits (``f``).
    param, what : str
        The parameter's name and what the values are, for the message.
    limit : float
        The largest relative RMS error accepted (:data:`ROUNDING_LIMIT`).
    high : int
        The largest setting searched.
    memo : callable(key, make) -> value, optional
        A cache of the errors (a study's task memo: the data do not change between runs).

    Raises
    ------
    fednet.errors.CapacityError
        Naming ``param``, its value, the error, the limit and the smallest ``bits`` that meets it.
    """
    def error(b: int) -> float:
        if memo is None:
            return rounding_error(values, b)
        return memo(("fednet.algebra.capacity.rounding_error", b), lambda: rounding_error(values, b))

    err = error(bits)
    if err <= limit:
        return
    need = int(bits) + 1
    while need < high and error(need) > limit:
        need += 1
    raise CapacityError(f"{param} = {bits} rounds {what} with a relative RMS error of {err:.3g} (resolution "
                        f"2^{-int(bits)}; at most {limit:g} accepted, or the model trains on other data): use "
                        f"{param} >= {need}")


def check_round_capacity(q: FixedPoint, parts: Sequence[np.ndarray], B: np.ndarray | None = None, *,
                         what: str, param: str = "k") -> None:
    """Refuse a round whose per-device, coded or decoded values overflow ``Q<k,f>``.

    Parameters
    ----------
    q : FixedPoint
    parts : sequence of ndarray, each (d, c) float
        The plain per-device values of the round (e.g. ``X_j^T X_j epsilon + G_j^(1)``, eq. 11 before
        encoding), in the order of the columns of ``B``.
    B : ndarray, (n, len(parts)), optional
        Encoding matrix: the coded values ``sum_j B_ij parts_j`` must fit too (bounded by
        ``sum_j |B_ij| max|parts_j|``).
    what : str
        The round, for the message.
    param : str

    Raises
    ------
    fednet.errors.CapacityError
        As :func:`check_fixed_point_holds`.
    """
    mags = np.array([float(np.abs(p).max(initial=0.0)) for p in parts])
    worst = (float(mags.max(initial=0.0)), f"a device's gradient in {what}")
    total = float(np.abs(sum(parts)).max(initial=0.0)) if len(parts) else 0.0
    if total > worst[0]:
        worst = (total, f"the decoded gradient sum in {what}")
    if B is not None and len(parts):
        coded = float((np.abs(np.asarray(B, dtype=np.float64)) @ mags).max(initial=0.0))
        if coded > worst[0]:
            worst = (coded, f"a coded gradient (bound sum_j |B_ij| max|G_j|) in {what}")
    check_fixed_point_holds(q, worst[0], worst[1], param=param)


def check_resolution(values: Any, bits: int, param: str, what: str, *, low: int = -64, high: int = 64) -> None:
    """Refuse a fixed-point resolution ``2^-bits`` that rounds most of the values it must carry to zero.

    ``Round(2^bits v)`` is zero exactly when ``|v| < 2^-(bits+1)``; a setting that does this to more
    than :data:`UNDERFLOW_LIMIT` of the nonzero values (the overflow checks above do not look at it)
    silently stops learning: negative or tiny fractional bits on data or weights of magnitude below one.

    Parameters
    ----------
    values : array_like or sequence of array_like
        The real values (data, initial weights) before quantisation.
    bits : int
        The fractional bits (``l``, ``f``, ``l_x``, ...).
    param : str
        The parameter's name in messages (``"data_bits"``).
    what : str
        What the values are (``"the training features"``).
    low, high : int
        The range searched for the smallest sufficient setting.

    Raises
    ------
    fednet.errors.CapacityError
        Naming ``param``, its value, the share rounded to zero and the smallest sufficient setting.
    """
    arrays = values if isinstance(values, (list, tuple)) else [values]
    mags = [np.abs(np.asarray(a, dtype=np.float64)).ravel() for a in arrays]
    mags = [m[(m > 0) & np.isfinite(m)] for m in mags]
    nz = np.concatenate(mags) if mags else np.zeros(0)
    if nz.size == 0:
        return
    zero = float(np.count_nonzero(nz < 2.0 ** (-(int(bits) + 1)))) / nz.size
    if zero <= UNDERFLOW_LIMIT:
        return
    # smallest b with share(|v| < 2^-(b+1)) <= limit: from the quantile of the magnitudes
    q = float(np.quantile(nz, UNDERFLOW_LIMIT, method="higher"))
    need = min(max(math.ceil(-math.log2(q) - 1), low), high)
    while need < high and float(np.count_nonzero(nz < 2.0 ** (-(need + 1)))) / nz.size > UNDERFLOW_LIMIT:
        need += 1
    raise CapacityError(f"{param} = {bits} rounds {zero:.1%} of the nonzero values of {what} to zero (resolution "
                        f"2^{-int(bits)}; at most {UNDERFLOW_LIMIT:.0%} may vanish): use {param} >= {need}")
