"""Shared cells: devices of one cell share its airtime (issue 28, item 3, first part).

In the papers' star every device has its own full-rate uplink and downlink. In a *cell* the devices attached to it
(node attribute ``cell``) share the air under a named scheduler (:data:`SCHEDULERS`, the graph's ``cell_scheduler``):
``"round_robin"`` (below) or ``"proportional_fair"`` (further below).  Round robin: a cell's uplink (and,
separately, its downlink) serves the transfers in progress by **equal airtime** (round robin with a vanishing slot:
processor sharing).  A transfer needs the airtime its own link would take alone --
:func:`fednet.sim.network.transmission_time` at its device's rate, with the header overhead and the keyed
retransmissions -- and while ``n`` transfers are active each receives ``1/n`` of the time,
so a transfer's rate changes, exactly, whenever another starts or ends (or is cancelled: a transfer whose process is
interrupted leaves the air at that instant, under either scheduler, as a cancelled transfer frees a dedicated
link).  ``n`` equal transfers of ``b`` bits at rate
``R`` that start together all end at ``n b / R``.  A device still sends its own messages one after the other (its
link's FIFO); only different devices' transfers share the air.

:class:`SharedAir` is the discrete-event form: every transfer's finish is tracked in *virtual time* ``V`` (the
service each active transfer has received, growing at ``1/n`` per simulated second), a transfer arriving at ``V_a``
with airtime ``w`` ends when ``V = V_a + w``, and one timeout is pending at a time: that of the smallest finish.

**Proportional fair** (``scheduler = "proportional_fair"``, :class:`ProportionalFairAir`).  Model: the channel of
every device fades i.i.d. Rayleigh from one scheduling slot to the next (normalised gain ``|h_i|^2 ~ Exp(1)``), and
the scheduler serves, in each slot, the active device with the largest ``r_i(t) / avg_i`` (Jalali, Padovani,
Pankaj, "Data throughput of CDMA-HDR", VTC 2000; Viswanath, Tse, Laroia, "Opportunistic beamforming using dumb
antennas", IEEE Trans. IT 48(6), 2002, Sec. II-III; Tse & Viswanath, *Fundamentals of Wireless Communication*,
2005, Sec. 6.6-6.7).  In the fluid (many-slot) limit each of the ``n`` active devices gets airtime ``1 / n``, and
is served in the slots where its *normalised* gain is the largest of the ``n``: the maximum ``M_n`` of ``n`` i.i.d.
``Exp(1)``.  While ``n`` transfers are active, device ``i`` (mean SNR ``snr_i``, bandwidth ``B``) thus moves

    ``(1 / n) E[B log2(1 + snr_i M_n)]``      bit/s                     (multi-user diversity)

where round robin gives ``(1 / n) E[B log2(1 + snr_i M_1)]``.  fednet keeps each device's own link model (its
rate ``R_i`` from link adaptation, :mod:`fednet.topologies.radio`, or as given, and its per-packet loss and keyed
retransmissions, :func:`fednet.sim.network.transmission_time`) and applies the scheduler as the *ratio* of the two:

    ``G_n(snr) = E[log2(1 + snr M_n)] / E[log2(1 + snr M_1)]``         (:func:`pf_gain`, ``G_1 = 1``)

so a transfer whose airtime alone is ``w`` (seconds at ``R_i``) is served at ``G_n(snr_i) / n`` seconds of its
airtime per simulated second while ``n`` transfers are active: ``R_i G_n(snr_i) / n`` bit/s against round robin's
``R_i / n``.  A device alone in its cell sends at ``R_i`` under either scheduler.  The per-packet loss stays the
link's (link adaptation on the scheduled slot's channel keeps the block-error target), and ``snr_i`` is the mean
SNR of the device's link in that direction (node attributes ``snr_up_db`` / ``snr_down_db``: set by
:func:`~fednet.topologies.radio.radio_star`, or by ``snr_db`` of :func:`~fednet.topologies.lte.lte_cells` and
:func:`~fednet.topologies.hierarchy.hierarchy`; a proportional-fair cell without them is refused).  Each rate
changes exactly whenever a transfer starts or ends: the remaining airtime of every active transfer is brought up to
date and the next finish recomputed on every start and end (``O(n)`` per event).  Not modelled: the finite
averaging window of a real PF scheduler (its ``t_c``), and the difference between ``argmax r_i / avg_i`` and
``argmax |h_i|^2`` for devices of *unequal* mean SNR (the two coincide for equal SNRs; for unequal ones a
slot-level ``r_i / avg_i`` scheduler favours the stronger devices a little: measured -3 %, +2 % and +7 % against
the formula for three devices at 0, 10 and 20 dB, tests/test_cells_pf.py).

``E[ln(1 + s M_n)]`` is computed from ``E[ln(1 + s M)] = int_0^inf s / (1 + s x) (1 - (1 - e^{-x})^n) dx``
(integration by parts with ``P(M_n > x) = 1 - (1 - e^{-x})^n``): exactly ``ln(1 + s x0)`` below ``x0 = 10^(-16/n)``
(where the survival function is 1 within ``1e-16``), then composite 12-point Gauss-Legendre in ``t = ln x``
(panels of width ``min(1, 2 / ln n)``, the integrand being smooth in ``t`` apart from the step of the survival
function near ``x = ln n``, of width about ``1 / ln n``) up to ``x = ln n + 47``; relative error about 1e-14 up to
``n = 10^4`` (halving the panels changes no result by more than 5e-16), checked in the tests against
``scipy.integrate.quad`` and the closed form ``sum_k (-1)^(k+1) C(n, k) e^{k/s} E_1(k/s)``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

__all__ = ["AirTimeout", "SharedAir", "ProportionalFairAir", "SCHEDULERS", "make_air", "mean_log2_max", "pf_gain"]

#: The named airtime schedulers of a cell: equal airtime (:class:`SharedAir`) and proportional fair
#: (:class:`ProportionalFairAir`).
SCHEDULERS = ("round_robin", "proportional_fair")


class AirTimeout:
    """The callback of an air's timeout: it fires the air (``air._fire(generation)``), a no-op once the air has
    rescheduled (a transfer arrived, ended or left since: :attr:`stale`).  A named callable, not a lambda, so that the
    engine can tell a stale air timeout (nothing will happen when it fires) from another process's event
    (:func:`fednet.sim.engine.events.alone`): a round the reference ran on cells leaves such timeouts behind."""

    __slots__ = ("air", "generation")

    def __init__(self, air: "SharedAir | ProportionalFairAir", generation: int) -> None:
        self.air, self.generation = air, generation

    def __call__(self, _event: simpy.Event) -> None:
        self.air._fire(self.generation)

    @property
    def stale(self) -> bool:
        """Whether the air has rescheduled since this timeout was armed (firing it does nothing)."""
        return self.generation != self.air._generation


class SharedAir:
    """Equal-airtime processor sharing of one direction of one cell (module docstring).

    Parameters
    ----------
    env : simpy.Environment
    name : str
        For messages (``"cell 0 uplink"``).

    Attributes
    ----------
    active : int
        Transfers in progress.
    """

    def __init__(self, env: simpy.Environment, name: str) -> None:
        self.env, self.name = env, name
        self._heap: list[tuple[float, int, simpy.Event]] = []      # (finish in virtual time, order, event)
        self._virtual = 0.0                                         # V at self._at
        self._at = env.now
        self._order = itertools.count()
        self._generation = 0                                        # the pending timeout's; older ones are stale
        #: Transfers that have asked for the air so far (a replay checks that nobody used it meanwhile).
        self.transfers = 0

    @property
    def active(self) -> int:
        """Transfers in progress."""
        return len(self._heap)

    def _advance(self) -> None:
        now = self.env.now
        if self._heap:
            self._virtual += (now - self._at) / len(self._heap)
        self._at = now

    def transmit(self, airtime: float) -> Generator[Any, Any, None]:
        """Hold the air for ``airtime`` seconds of service (``yield from``): ends once served, sharing with others.

        Raises
        ------
        ValueError
            For a negative or non-finite ``airtime``.
        """
        if not 0.0 <= airtime < float("inf"):
            raise ValueError(f"{self.name}: airtime must be finite and >= 0, got {airtime!r}")
        if airtime == 0.0:
            return
        self.transfers += 1
        self._advance()
        done = self.env.event()
        entry = (self._virtual + airtime, next(self._order), done)
        heapq.heappush(self._heap, entry)
        self._schedule()
        try:
            yield done
        except simpy.Interrupt as stop:  # cancelled (the server stopped waiting): it leaves the air now
            stop.held_s = self._leave(entry, airtime)
            raise

    def _leave(self, entry: tuple[float, int, simpy.Event], airtime: float) -> float:
        """A transfer cancelled before its end leaves the air at once, as a cancelled transfer frees a dedicated
        link: the others share the air among fewer from now on (none left: the air is idle).

        Returns the airtime it was served before it left, simulated seconds (``V(now) - V(arrival)``, its share of
        the air so far, in ``[0, airtime]``; all of it if it ended at this very instant): what its radio was on for
        (:meth:`fednet.sim.simulation.Simulation._hop` charges its energy)."""
        if entry not in self._heap:     # it ended at this very instant
            return airtime
        self._advance()
        served = min(airtime, max(0.0, self._virtual - (entry[0] - airtime)))
        self._heap.remove(entry)
        heapq.heapify(self._heap)
        if not self._heap:
            self._virtual = 0.0
        self._schedule()
        return served

    def _schedule(self) -> None:
        """Arm one timeout for the earliest finish (older timeouts become stale)."""
        self._generation += 1
        if not self._heap:
            return
        finish = self._heap[0][0]
        delay = max(0.0, (finish - self._virtual) * len(self._heap))
        generation = self._generation
        self.env.timeout(delay).callbacks.append(AirTimeout(self, generation))

    def _fire(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        top = self._heap[0][0]
        while self._heap and self._heap[0][0] <= max(top, self._virtual):   # the finish (and any exact tie)
            _, _, done = heapq.heappop(self._heap)
            done.succeed()
        # the air idle: virtual time restarts at 0, so a transfer alone in its cell takes exactly its airtime
        self._virtual = max(self._virtual, top) if self._heap else 0.0
        self._schedule()


# -- proportional fair -------------------------------------------------------------------------------------------

_PANEL = 1.0           # width of a Gauss-Legendre panel in t = ln x (narrower for large n: 2 / ln n)
_GL_T, _GL_W = np.polynomial.legendre.leggauss(12)


def _ln_mean_max(n: int, snr: np.ndarray) -> np.ndarray:
    """``E[ln(1 + snr M_n)]`` (nats) for each entry of ``snr`` (linear, > 0): the quadrature of the module docstring.

    Below ``x0 = 10^(-16/n)`` the survival function ``1 - (1 - e^{-x})^n`` is 1 within ``x0^n = 1e-16``, so that part
    is ``ln(1 + snr x0)`` exactly; above, composite 12-point Gauss-Legendre in ``t = ln x`` up to
    ``x = ln n + 47`` (where ``P(M_n > x) < n e^{-x} < e^{-47}``).
    """
    x0 = 10.0 ** (-16.0 / n)
    t_lo = math.log(x0)
    t_hi = math.log(math.log(n) + 47.0)
    width = min(_PANEL, 2.0 / math.log(n)) if n > 1 else _PANEL    # the step of P(M_n > x) near x = ln n
    k = max(1, math.ceil((t_hi - t_lo) / width))
    edges = np.linspace(t_lo, t_hi, k + 1)
    mid, half = (edges[:-1] + edges[1:]) / 2, (edges[1:] - edges[:-1]) / 2
    t = (mid[:, None] + half[:, None] * _GL_T[None, :]).ravel()
    weight = (half[:, None] * _GL_W[None, :]).ravel()
    x = np.exp(t)
    # log(1 - e^-x), accurate at both ends, then the survival function 1 - (1 - e^-x)^n
    log_cdf1 = np.empty_like(x)
    big = x > math.log(2.0)
    log_cdf1[big] = np.log1p(-np.exp(-x[big]))
    log_cdf1[~big] = np.log(-np.expm1(-x[~big]))
    survival = weight * -np.expm1(n * log_cdf1)
    # s x / (1 + s x) = 1 / (1 + 1 / (s x)): the integrand's dx -> x dt
    body = (survival[None, :] / (1.0 + (1.0 / snr)[:, None] / x[None, :])).sum(axis=1)
    return np.log1p(snr * x0) + body


def mean_log2_max(n: int, snr: float | np.ndarray) -> float | np.ndarray:
    """``E[log2(1 + snr M_n)]``: the spectral efficiency (bit/s/Hz) of the best of ``n`` i.i.d. Rayleigh channels.

    ``M_n`` is the maximum of ``n`` i.i.d. ``Exp(1)`` normalised gains (module docstring: the rate of a
    proportional-fair-scheduled device while it is served; Tse & Viswanath 2005, Sec. 6.6).

    Parameters
    ----------
    n : int
        Devices competing, ``>= 1``.
    snr : float or ndarray
        Mean SNR (linear, not dB), finite and ``> 0``; any shape.

    Returns
    -------
    float or ndarray
        Bit/s/Hz, ``snr``'s shape (a float for a scalar).

    Raises
    ------
    ValueError
        For ``n < 1`` or an SNR that is not finite and positive.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    arr = np.asarray(snr, dtype=np.float64)
    if arr.size and not np.all(np.isfinite(arr) & (arr > 0)):
        bad = arr[~(np.isfinite(arr) & (arr > 0))].flat[0]
        raise ValueError(f"snr must be finite and > 0 (linear), got {bad!r}")
    out = (_ln_mean_max(int(n), arr.reshape(-1)) / math.log(2.0)).reshape(arr.shape) if arr.size else arr * 0.0
    return float(out) if np.ndim(snr) == 0 else out


def pf_gain(n: int, snr: float | np.ndarray) -> float | np.ndarray:
    """``G_n(snr) = E[log2(1 + snr M_n)] / E[log2(1 + snr M_1)]``: proportional fair's multi-user diversity gain.

    The factor by which a device's share of a cell under proportional fair exceeds its round-robin share
    ``R_i / n`` while ``n`` transfers are active (module docstring); ``G_1 = 1`` and ``G_n`` grows with ``n``:
    towards ``E[M_n] = H_n`` (the harmonic number) at low SNR, while at high SNR a served slot carries about
    ``ln ln n + 0.577`` nats more than round robin's (``M_n`` being about ``ln n``; Tse & Viswanath 2005,
    Sec. 6.6).

    Parameters, Returns, Raises
        As :func:`mean_log2_max` (dimensionless).
    """
    num = mean_log2_max(n, snr)
    return num / mean_log2_max(1, snr)


class _Port:
    """One link's handle on a :class:`ProportionalFairAir`: ``transmit(airtime)`` at that link's mean SNR."""

    __slots__ = ("air", "snr")

    def __init__(self, air: "ProportionalFairAir", snr: float) -> None:
        self.air, self.snr = air, snr

    def transmit(self, airtime: float) -> Generator[Any, Any, float]:
        """:meth:`ProportionalFairAir.transmit` at this link's SNR (``yield from``; returns the airtime held)."""
        return self.air.transmit(airtime, self.snr)


class ProportionalFairAir:
    """Proportional-fair sharing of one direction of one cell (module docstring), exact in the discrete-event sense.

    A transfer of airtime ``w`` (simulated seconds at its link's own rate) from a device of mean SNR ``snr``
    is served at ``G_n(snr) / n`` seconds of airtime per simulated second while ``n`` transfers are active
    (:func:`pf_gain`). On every start and end the remaining airtime of each active transfer is brought up to date
    and one timeout is armed for the earliest finish (older ones become stale): ``O(n)`` array operations per event.
    The gains ``G_n`` are computed once per ``n`` for all the SNRs of the cell's links (:meth:`port`).

    Parameters
    ----------
    env : simpy.Environment
    name : str
        For messages (``"cell 0 uplink"``).

    Attributes
    ----------
    active : int
        Transfers in progress.
    """

    def __init__(self, env: simpy.Environment, name: str) -> None:
        self.env, self.name = env, name
        self._at = env.now
        self._generation = 0
        self._snrs: list[float] = []                 # the distinct SNRs of the links, by index
        self._snr_index: dict[float, int] = {}
        self._tables: dict[int, np.ndarray] = {}     # n -> G_n of every SNR, by index
        # the active transfers in arrival order, as parallel arrays: remaining airtime (s), airtime, airtime held so
        # far (s), SNR index, current speed; and their events
        self._rem = np.empty(0)
        self._work = np.empty(0)
        self._held = np.empty(0)
        self._idx = np.empty(0, dtype=np.intp)
        self._speed = np.empty(0)
        self._events: list[simpy.Event] = []
        self._next: simpy.Event | None = None        # the transfer the pending timeout is for

    @property
    def active(self) -> int:
        """Transfers in progress."""
        return len(self._events)

    def port(self, snr: float) -> _Port:
        """The handle a link of mean SNR ``snr`` (linear) transmits through (:attr:`fednet.sim.network.Link.air`).

        Raises
        ------
        ValueError
            For an SNR that is not finite and positive.
        """
        if isinstance(snr, bool) or not isinstance(snr, (int, float)) or not (math.isfinite(snr) and snr > 0):
            raise ValueError(f"{self.name}: snr must be finite and > 0 (linear), got {snr!r}")
        self._index(float(snr))
        return _Port(self, float(snr))

    def _index(self, snr: float) -> int:
        """The index of ``snr`` among the cell's SNRs (a new one makes the gain tables start over)."""
        k = self._snr_index.get(snr)
        if k is None:
            k = self._snr_index[snr] = len(self._snrs)
            self._snrs.append(snr)
            self._tables.clear()
        return k

    def _table(self, n: int) -> np.ndarray:
        """``G_n`` of every SNR of the cell, by index (computed once per ``n``)."""
        table = self._tables.get(n)
        if table is None:
            snrs = np.array(self._snrs)
            if 1 not in self._tables:
                self._tables[1] = np.ones(len(snrs))
                self._alone = mean_log2_max(1, snrs)
            table = self._tables[n] = self._tables[1] if n == 1 else mean_log2_max(n, snrs) / self._alone
        return table

    def transmit(self, airtime: float, snr: float) -> Generator[Any, Any, float]:
        """Hold the air for ``airtime`` seconds of service at mean SNR ``snr`` (linear) (``yield from``).

        Returns
        -------
        float
            The airtime the transfer really held, simulated seconds: ``int 1 / n(t) dt`` over its transfer (its
            share of the slots), ``airtime`` alone and ``airtime / G_n`` among ``n`` equal ones (PF serves it in its
            good slots, at a higher rate): what its radio's energy is counted on
            (:meth:`fednet.sim.simulation.Simulation.transfer`).

        Raises
        ------
        ValueError
            For a negative or non-finite ``airtime`` or an SNR that is not finite and positive.
        """
        if not 0.0 <= airtime < float("inf"):
            raise ValueError(f"{self.name}: airtime must be finite and >= 0, got {airtime!r}")
        if not (math.isfinite(snr) and snr > 0):
            raise ValueError(f"{self.name}: snr must be finite and > 0 (linear), got {snr!r}")
        if airtime == 0.0:
            return 0.0
        k = self._index(float(snr))
        self._advance()
        done = self.env.event()
        self._rem = np.append(self._rem, float(airtime))
        self._work = np.append(self._work, float(airtime))
        self._held = np.append(self._held, 0.0)
        self._idx = np.append(self._idx, k)
        self._events.append(done)
        self._schedule()
        try:
            held = yield done
        except simpy.Interrupt as stop:  # cancelled: it leaves the air now (SharedAir._leave)
            stop.held_s = self._leave(done)
            raise
        return held

    def _leave(self, done: simpy.Event) -> float:
        """A transfer cancelled before its end leaves the air at once; the others' speeds are recomputed.

        Returns the slots it held before it left, simulated seconds (its radio's on-time, as a finished transfer's
        ``held``; ``done``'s value if it ended at this very instant)."""
        at = next((i for i, e in enumerate(self._events) if e is done), None)
        if at is None:                  # it ended at this very instant
            return float(done.value)
        self._advance()
        held = float(self._held[at])
        keep = np.arange(len(self._events)) != at
        self._rem, self._work, self._held = self._rem[keep], self._work[keep], self._held[keep]
        self._idx = self._idx[keep]
        del self._events[at]
        self._schedule()
        return held

    def _advance(self) -> None:
        """Serve every active transfer at its current speed from ``self._at`` to now."""
        now = self.env.now
        dt = now - self._at
        if dt > 0 and self._events:
            self._rem -= dt * self._speed
            self._held += dt / len(self._events)        # each active transfer's slots since the last event
        self._at = now

    def _schedule(self) -> None:
        """Recompute the speeds ``G_n(snr) / n`` and arm one timeout for the earliest finish."""
        self._generation += 1
        n = len(self._events)
        if not n:
            self._next = None
            return
        self._speed = self._table(n)[self._idx] / n
        finish = self._rem / self._speed
        k = int(np.argmin(finish))                      # the earliest; among equals, the first to arrive
        self._next = self._events[k]
        generation = self._generation
        self.env.timeout(max(0.0, float(finish[k]))).callbacks.append(AirTimeout(self, generation))

    def _fire(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        # the finish this timeout was for, and any exact tie (remaining airtime within rounding of 0)
        ended = self._rem <= 1e-12 * self._work
        ended[next(i for i, e in enumerate(self._events) if e is self._next)] = True
        done = [(e, float(h)) for e, h, end in zip(self._events, self._held, ended) if end]
        keep = ~ended
        self._rem, self._work, self._held = self._rem[keep], self._work[keep], self._held[keep]
        self._idx = self._idx[keep]
        self._events = [e for e, end in zip(self._events, ended) if not end]
        for event, held in done:
            event.succeed(held)
        self._schedule()


def make_air(scheduler: str, env: simpy.Environment, name: str) -> SharedAir | ProportionalFairAir:
    """The air of one direction of a cell under the named scheduler (:data:`SCHEDULERS`).

    Raises
    ------
    ValueError
        For an unknown ``scheduler``.
    """
    if scheduler == "round_robin":
        return SharedAir(env, name)
    if scheduler == "proportional_fair":
        return ProportionalFairAir(env, name)
    raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
