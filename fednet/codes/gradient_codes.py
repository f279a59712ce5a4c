"""Cyclic ``(alpha, D)`` gradient codes over the reals and in fixed point ``Q<k,f>``.

Source: Tandon, Lei, Dimakis, Karampatziakis, "Gradient coding: avoiding stragglers in
distributed learning", ICML 2017, Alg. 1 (decoding) and Alg. 2 (cyclic encoding matrix ``B``);
used by Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. II-C (requirement ``A B = 1``,
eq. 1) and Sec. V-A (assignment matrix ``Omega``).  The paper's ``alpha`` is Tandon's ``s + 1``:
``D`` devices, ``D`` partitions, every device holds ``alpha`` partitions, any ``D - alpha + 1``
responders suffice.

Construction and conditioning
-----------------------------
``H`` (``s x D``, ``s = alpha - 1``) has i.i.d. N(0, 1) columns ``1..D-1`` and a last column that
makes ``H 1 = 0``; row ``i`` of ``B`` is supported on ``S_i = {i, ..., i+s} mod D`` with
``B[i, i] = 1`` and ``B[i, S_i \\ {i}] = -(H[:, S_i \\ {i}])^-1 H[:, i]`` (Alg. 2).  Every row lies in
``null(H)`` (dimension ``D - s``, containing ``1``), so any ``D - s`` rows span it and a decoding
row ``a`` with ``a B_F = 1`` exists (Alg. 1).

Random ``H`` gives ill-conditioned ``B_F`` as ``alpha`` grows.  This module therefore

1. draws ``n_draws`` candidate ``H`` from the given seeded stream and keeps the one whose
   worst-case condition number ``max_F cond_2(B_F)`` over the checked responder sets is smallest
   (all sets when there are at most ``max_patterns``, else the ``D`` cyclic windows plus
   ``max_patterns`` random sets drawn from the same stream);
2. scales each row of ``B`` to a largest magnitude of 1 (the decoding vector absorbs the
   scaling), so encoded data never grows by more than ``alpha`` in magnitude;
3. quantises ``B`` to ``Q<k,f>`` (``B_bar``, integers) and computes every decoding vector
   against the *quantised* code (least squares in float64, then ``Q<k,f>``), so the code is
   exact up to the quantisation of ``a`` alone.

Error bound (stated, and tested)
--------------------------------
Let ``a_bar`` be the quantised decoding row for responder set ``F`` and
``delta_j = (a_bar B_bar_F)_j 2^-2f - 1`` (computed exactly in integers by
:meth:`CyclicGradientCode.decoding_defect`).  If the server applies ``a_bar`` to coded gradients
``P_i = sum_j b_ij g_j + e_i`` (``e_i`` the fixed-point rounding of the devices' results), then

    || sum_i a_i P_i - sum_j g_j ||_max  <=  max_j |delta_j| * sum_j ||g_j||_max
                                            + ||a_bar||_1 * max_i ||e_i||_max + 2^-f

(the last term the rounding of the decoding product).  ``max_j |delta_j|`` is at most
``2^-(f+1) ||B_F||_1`` plus the float64 solve residual; :attr:`CyclicGradientCode.delta_max` and
:attr:`CyclicGradientCode.a_l1_max` hold the worst values over the checked responder sets.

Measured (seed 0; all responder sets when at most 2000, else the D windows plus 2000 random
sets; ``a`` in ``Q<48,24>``)::

    D   alpha   1 draw: cond / delta     best of 16: cond / delta / ||a||_1     B in Q<62,40>: delta
    25    6     2.9e5 / 9.4e-4           8.1e4 / 3.1e-4 / 7.0e4                 1.2e-7
    25   16     1.1e5 / 1.7e-3           3.7e4 / 3.4e-4 / 5.2e4                 1.3e-7
    25   23     2.9e5 / 1.5e-2           3.6e3 / 1.5e-4 / 7.2e3                 7.2e-8
    25   25     1     / 0                1     / 0      / 1                     0
    15   12     3.3e4 / 1.1e-3           4.3e3 / 1.4e-4 / 9.9e3                 8.8e-8
    10    5     6.8e3 / 9.3e-5           5.8e2 / 7.4e-6 / 8.8e2                 7.7e-8

So with ``B`` in the paper's ``Q<48,24>`` the code itself leaves a relative defect of up to
~3e-4 at ``D = 25`` (the quantisation of ``B`` moves its rows off a common subspace, and
``||a||_1`` up to 7e4 amplifies it); the best-of-16 draw gains 3-100x over a single draw; 16
more fractional bits for ``B`` (``fixed_point=FixedPoint(62, 40)``) bring the defect to ~1e-7,
then limited by ``a`` in ``Q<48,24>``.
"""

from __future__ import annotations

import itertools
import math
import numpy as np

from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import charge

__all__ = ["CyclicGradientCode", "assignment_matrix", "tandon_encoding_matrix"]


def assignment_matrix(alpha: int, D: int) -> np.ndarray:
    """The assignment matrix ``Omega`` of CodedPaddedFL (paper Sec. V-A), 0-based.

    Parameters
    ----------
    alpha : int
        Replication factor, ``1 <= alpha <= D``.
    D : int
        Number of devices (of the group), ``D >= 1``.

    Returns
    -------
    ndarray, shape (alpha, D), int64
        ``Omega[r, i] = (i + r) mod D``: device ``Omega[r, i]`` shares its padded data with
        device ``i`` (row 0 is the device itself).  Column ``i`` is the support of row ``i`` of
        ``B``.  (The paper numbers devices and rows from 1.)

    Raises
    ------
    ValueError
        If ``D < 1`` or ``alpha`` is not in ``[1, D]``.
    """
    _check(alpha, D)
    return (np.arange(D)[None, :] + np.arange(alpha)[:, None]) % D


def _check(alpha, D) -> None:
    if not isinstance(D, (int, np.integer)) or D < 1:
        raise ValueError(f"D must be a positive integer, got {D!r}")
    if not isinstance(alpha, (int, np.integer)) or not 1 <= alpha <= D:
        raise ValueError(f"alpha must be an integer in [1, D] = [1, {D}], got {alpha!r}")


def tandon_encoding_matrix(H: np.ndarray) -> np.ndarray:
    """Cyclic encoding matrix ``B`` from ``H`` (Tandon et al., Alg. 2).

    Parameters
    ----------
    H : ndarray, shape (s, D), float64
        With ``H 1 = 0``; ``s = alpha - 1`` (may be 0).

    Returns
    -------
    ndarray, shape (D, D), float64
        ``B[i, i] = 1``, ``B[i, S_i \\ {i}] = -(H[:, S_i \\ {i}])^-1 H[:, i]``, zero elsewhere.
    """
    s, D = H.shape
    B = np.zeros((D, D))
    for i in range(D):
        B[i, i] = 1.0
        if s:
            rest = [(i + r) % D for r in range(1, s + 1)]
            B[i, rest] = -np.linalg.solve(H[:, rest], H[:, i])
    return B


class CyclicGradientCode:
    """A cyclic ``(alpha, D)`` gradient code with its ``Q<k,f>`` representation.

    Parameters
    ----------
    alpha : int
        Number of partitions per device (paper's ``alpha``; tolerates ``alpha - 1``
        stragglers), ``1 <= alpha <= D``.
    D : int
        Number of devices and partitions.
    rng : numpy.random.Generator
        Stream the candidate ``H`` (and sampled responder sets) are drawn from.
    fixed_point : FixedPoint, optional
        Format of ``B_bar`` (default ``Q<48,24>``, the paper's).
    a_format : FixedPoint, optional
        Format of the decoding vectors (default: ``fixed_point``).  A wider format such as
        ``Q<62,40>`` holds ``a`` (entries up to about ``10^4``) with more fractional bits.
    n_draws : int
        Number of candidate ``H`` to draw (the best conditioned is kept).
    max_patterns : int
        Check all responder sets when there are at most this many, else the ``D`` cyclic
        windows plus this many random sets.
    B : ndarray, shape (D, D), optional
        Use this encoding matrix instead of drawing one (e.g. the references' test vector);
        no row scaling is applied to it.

    Attributes
    ----------
    B : ndarray, shape (D, D), float64
        The quantised encoding matrix as reals (``B_bar * 2^-f`` exactly).
    B_bar : ndarray, shape (D, D), int64
        ``B`` in ``Q<k,f>``.
    Omega : ndarray, shape (alpha, D), int64
        Assignment matrix (:func:`assignment_matrix`).
    condition_max : float
        Worst ``cond_2(B_F)`` over the checked responder sets.
    delta_max : float
        Worst ``max_j |(a_bar B_bar_F)_j 2^-2f - 1|`` over the checked responder sets.
    a_l1_max : float
        Worst ``||a_F||_1`` over the checked responder sets.

    Raises
    ------
    ValueError
        On invalid ``alpha``, ``D``, ``n_draws``, or a ``B`` of the wrong shape/support.
    """

    def __init__(
        self,
        alpha: int,
        D: int,
        rng: np.random.Generator | None = None,
        *,
        fixed_point: FixedPoint | None = None,
        a_format: FixedPoint | None = None,
        n_draws: int = 16,
        max_patterns: int = 2000,
        B: np.ndarray | None = None,
    ) -> None:
        _check(alpha, D)
        if n_draws < 1:
            raise ValueError(f"n_draws must be >= 1, got {n_draws}")
        self.alpha = int(alpha)
        self.D = int(D)
        self.s = self.alpha - 1
        self.q = fixed_point or FixedPoint(48, 24)
        self.qa = a_format or self.q
        self.Omega = assignment_matrix(self.alpha, self.D)
        if rng is None:
            if B is None:
                raise ValueError("rng is required unless B is given")
            rng = np.random.default_rng(0)
        self._patterns = self._checked_patterns(rng, max_patterns)
        if B is not None:
            B = np.asarray(B, dtype=np.float64)
            if B.shape != (self.D, self.D):
                raise ValueError(f"B must have shape ({D}, {D}), got {B.shape}")
            candidates = [B]
        else:
            candidates = []
            for _ in range(n_draws):
                H = rng.standard_normal((self.s, self.D))
                if self.s:
                    H[:, -1] = -H[:, :-1].sum(axis=1)
                Bc = tandon_encoding_matrix(H)
                candidates.append(Bc / np.abs(Bc).max(axis=1, keepdims=True))
        best = None
        for Bc in candidates:
            self._set_B(Bc)
            conds = [self.condition_number(F) for F in self._patterns]
            worst = max(conds)
            if best is None or worst < best[0]:
                best = (worst, Bc)
        self._set_B(best[1])
        self.condition_max = float(best[0])
        self.delta_max = 0.0
        self.a_l1_max = 0.0
        for F in self._patterns:
            self.delta_max = max(self.delta_max, float(np.abs(self.decoding_defect(F)).max()))
            self.a_l1_max = max(self.a_l1_max, float(np.abs(self.decoding_vector(F)).sum()))

    # ------------------------------------------------------------------ internals
    def _set_B(self, B: np.ndarray) -> None:
        self.B_bar = self.q.encode(B)
        self.B = self.q.decode(self.B_bar)
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def _checked_patterns(self, rng, max_patterns) -> list[tuple[int, ...]]:
        n = self.D - self.s
        total = math.comb(self.D, n)
        if total <= max_patterns:
            return [tuple(F) for F in itertools.combinations(range(self.D), n)]
        pats = {tuple(sorted((i + r) % self.D for r in range(n))) for i in range(self.D)}
        while len(pats) < self.D + max_patterns and len(pats) < total:
            pats.add(tuple(sorted(rng.choice(self.D, size=n, replace=False).tolist())))
        return sorted(pats)

    def _responders(self, responders) -> tuple[int, ...]:
        F = tuple(sorted(int(i) for i in responders))
        if len(set(F)) != len(F) or (F and (F[0] < 0 or F[-1] >= self.D)):
            raise ValueError(f"responders must be distinct devices in [0, {self.D}), got {responders!r}")
        if len(F) < self.D - self.s:
            raise ValueError(
                f"need at least D - alpha + 1 = {self.D - self.s} responders, got {len(F)}"
            )
        return F[: self.D - self.s] if len(F) > self.D - self.s else F

    # ------------------------------------------------------------------ public API
    @property
    def n_responders(self) -> int:
        """``D - alpha + 1``, the number of results the decoder waits for."""
        return self.D - self.s

    def condition_number(self, responders) -> float:
        """2-norm condition number of ``B_F`` (rows ``F`` of the quantised ``B``).

        Parameters
        ----------
        responders : iterable of int
            At least ``D - alpha + 1`` distinct device indices (the first ones are used).

        Returns
        -------
        float
        """
        F = self._responders(responders)
        return float(np.linalg.cond(self.B[list(F)]))

    def decoding_vector(self, responders) -> np.ndarray:
        """Real decoding row ``a`` with ``a B_F = 1`` (Tandon et al., Alg. 1).

        Parameters
        ----------
        responders : iterable of int
            At least ``D - alpha + 1`` distinct devices; the ``D - alpha + 1`` smallest indices
            are used (any such set decodes).

        Returns
        -------
        ndarray, shape (D - alpha + 1,), float64
            Coefficients in the order of the sorted responder indices.

        Raises
        ------
        ValueError
            For too few, repeated, or out-of-range responders, or if ``B_F`` does not span 1.
        """
        F = self._responders(responders)
        a = self._cache.get(F)
        if a is None:
            BF = self.B[list(F)]
            a, *_ = np.linalg.lstsq(BF.T, np.ones(self.D), rcond=None)
            resid = np.abs(a @ BF - 1.0).max()
            # quantising B leaves the rows O(2^-f) off a common subspace: a B_F = 1 holds only
            # to that order; a set that does not span 1 at all has a residual of order 1.
            if not resid < 0.5:
                raise ValueError(f"responder set {F} cannot decode (residual {resid:.3g})")
            self._cache[F] = a
        return a

    def decoding_vector_fixed(self, responders) -> np.ndarray:
        """The decoding row in ``a_format``, shape ``(D - alpha + 1,)`` int64."""
        return self.qa.encode(self.decoding_vector(responders))

    def decoding_defect(self, responders) -> np.ndarray:
        """``delta = a_bar B_bar_F 2^-(f_a + f) - 1``, shape ``(D,)``, exact (Python ints).

        The error of the fixed-point code itself (see the module's error bound).
        """
        F = self._responders(responders)
        a = self.decoding_vector_fixed(F).astype(object)
        prod = a @ self.B_bar[list(F)].astype(object)
        one = 1 << (self.qa.f + self.q.f)
        return np.array([float((int(v) - one) / one) for v in prod])

    def error_bound(self, g_sum_max: float, e_max: float, responders=None) -> float:
        """The stated bound on the decoded gradient's max-norm error (module docstring).

        Parameters
        ----------
        g_sum_max : float
            ``sum_j ||g_j||_max``, a bound on the partition gradients.
        e_max : float
            Bound on the devices' rounding error per entry of ``P_i`` (reals).
        responders : iterable of int, optional
            A specific responder set; by default the worst over the checked sets.

        Returns
        -------
        float
        """
        if responders is None:
            d, a1 = self.delta_max, self.a_l1_max
        else:
            d = float(np.abs(self.decoding_defect(responders)).max())
            a1 = float(np.abs(self.decoding_vector(responders)).sum())
        return d * g_sum_max + a1 * e_max + 2.0**-self.qa.f

    def encode(self, partitions: np.ndarray) -> np.ndarray:
        """Coded results ``P_i = sum_j B[i, j] g_j`` for every device (reals).

        Parameters
        ----------
        partitions : ndarray, shape (D, ...)
            The per-partition quantities ``g_j``.

        Returns
        -------
        ndarray, shape (D, ...)
            Charges ``alpha`` MACs per device and output entry (the support of a row).
        """
        g = np.asarray(partitions, dtype=np.float64)
        if g.shape[0] != self.D:
            raise ValueError(f"partitions must have leading dimension D={self.D}, got {g.shape}")
        charge(self.D * self.alpha * int(np.prod(g.shape[1:], dtype=np.int64)))
        return np.tensordot(self.B, g, axes=1)

    def decode(self, responders, results: np.ndarray) -> np.ndarray:
        """Sum of all partition gradients from the responders' results (Alg. 1; eq. 12).

        Parameters
        ----------
        responders : sequence of int
            Devices whose results are given, in the order of ``results``.
        results : ndarray, shape (len(responders), ...)
            Their coded results ``P_i``.

        Returns
        -------
        ndarray, shape (...), float64
            ``sum_i a_i P_i`` over the ``D - alpha + 1`` smallest responder indices; charges
            ``(D - alpha + 1)`` MACs per output entry.
        """
        responders = [int(i) for i in responders]
        results = np.asarray(results, dtype=np.float64)
        if results.shape[0] != len(responders):
            raise ValueError(
                f"results has {results.shape[0]} rows for {len(responders)} responders"
            )
        F = self._responders(responders)
        a = self.decoding_vector(F)
        rows = results[[responders.index(i) for i in F]]
        charge(len(F) * int(np.prod(rows.shape[1:], dtype=np.int64)))
        return np.tensordot(a, rows, axes=1)
