"""Shared airtime without processes: the finish times :class:`fednet.sim.cells.SharedAir` gives a set of transfers.

A replay of a step on a network with cells (the vectorised gather, :func:`fednet.sim.engine.backends.gather.
replay_vectorised`) knows when each transfer asks for its cell's air and how much airtime it needs (its dedicated
link's :func:`~fednet.sim.network.transmission_time`).  :func:`shared_finishes` runs the air's events -- every
arrival (:meth:`SharedAir.transmit`) and every firing of its one live timeout (:meth:`SharedAir._fire`) -- in time
order as a scalar loop with the same float operations in the same order (``V += (now - at) / n``, ``finish = V +
w``, ``delay = max(0, (finish - V) n)``, ``now + delay`` as SimPy's timeout adds it), so the times are the reference's
bit for bit; stale timeouts, which the reference leaves to fire as no-ops, are not made.

What decides SimPy's order but not the times is not modelled: an arrival at the very instant the air's timeout fires
(SimPy's insertion order decides which runs first) makes :func:`shared_finishes` return ``None``, and the caller runs
the reference.  Arrivals at one instant commute (each adds ``0 / n`` to ``V``), as do finishes at one instant (they
end together).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

import numpy as np

from fednet.sim.cells import SharedAir

__all__ = ["Air", "shared_finishes", "replayable_air", "cells_air_reason", "airs_reason"]


def replayable_air(air: object) -> bool:
    """Whether :func:`shared_finishes` stands for ``air``: an idle equal-airtime :class:`SharedAir` (no transfer in
    progress, so no live timeout) of the round-robin scheduler."""
    return (type(air) is SharedAir and getattr(air, "scheduler", "round_robin") == "round_robin"
            and air.active == 0)


class Air:
    """One cell direction's :class:`SharedAir` state and float operations, driven by a replay: arrivals
    (:meth:`arrive`, ``SharedAir.transmit``), the live timeout (:attr:`fire`, :meth:`fire_now`, ``SharedAir._fire``)
    and cancellations (:meth:`leave`, ``SharedAir._leave``); ``tag`` names a transfer.  Stale timeouts are not made:
    :attr:`fire` is the one live timeout's time (inf when idle) and :attr:`gen` changes whenever it is rescheduled."""

    __slots__ = ("heap", "V", "at", "fire", "seq", "gen")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, object]] = []      # (finish in virtual time, arrival number, tag)
        self.V, self.at, self.fire, self.seq, self.gen = 0.0, 0.0, math.inf, 0, 0

    def _advance(self, now: float) -> None:
        if self.heap:
            self.V += (now - self.at) / len(self.heap)
        self.at = now

    def _schedule(self, now: float) -> None:
        self.gen += 1
        heap = self.heap
        self.fire = now + max(0.0, (heap[0][0] - self.V) * len(heap)) if heap else math.inf

    def arrive(self, now: float, airtime: float, tag: object) -> None:
        """A transfer of ``airtime > 0`` seconds asks for the air at ``now``."""
        self._advance(now)
        self.seq += 1
        heapq.heappush(self.heap, (self.V + airtime, self.seq, tag))
        self._schedule(now)

    def fire_now(self) -> list:
        """The live timeout fires (at :attr:`fire`): the tags of the transfers that end then, in SimPy's order."""
        T = self.fire
        self._advance(T)
        heap = self.heap
        top = heap[0][0]
        lim = max(top, self.V)
        out = []
        while heap and heap[0][0] <= lim:
            out.append(heapq.heappop(heap)[2])
        self.V = max(self.V, top) if heap else 0.0
        self._schedule(T)
        return out

    def leave(self, now: float, tag: object) -> bool:
        """The transfer ``tag`` is cancelled at ``now`` and leaves the air; False if it is not on the air."""
        at = next((i for i, e in enumerate(self.heap) if e[2] == tag), None)
        if at is None:
            return False
        self._advance(now)
        del self.heap[at]
        heapq.heapify(self.heap)
        if not self.heap:
            self.V = 0.0
        self._schedule(now)
        return True


def cells_air_reason(nodes: Sequence[object]) -> bool | str:
    """``True`` if every cell air the links of ``nodes`` share is :func:`replayable_air`, else the reason (a busy cell,
    or a scheduler other than round robin): the check the cell replays of the gather, groups and masked backends
    share."""
    for node in nodes:
        for link in (node.downlink, node.uplink):
            air = getattr(link, "air", None)
            if air is not None and not replayable_air(air):
                return _air_reason(air)
    return True


def airs_reason(airs: Iterable[object]) -> bool | str:
    """:func:`cells_air_reason` for the airs themselves (a simulation's ``cells``, both directions of each): for a
    step over every device, one check per cell instead of one per link."""
    for air in airs:
        if not replayable_air(air):
            return _air_reason(air)
    return True


def _air_reason(air: object) -> str:
    """Why ``air`` is not :func:`replayable_air`."""
    return ("a node's cell has a transfer in progress" if type(air) is SharedAir else
            f"a node's cell shares its air under another scheduler than round robin ({type(air).__name__}: only "
            "round-robin cells are replayed)")


def shared_finishes(starts: Sequence[float] | np.ndarray, airtimes: Sequence[float] | np.ndarray) -> np.ndarray | None:
    """When each of a set of transfers on one idle cell direction ends under equal-airtime processor sharing.

    Parameters
    ----------
    starts : array of float, (m,)
        Simulated seconds at which each transfer asks for the air (:meth:`SharedAir.transmit`).
    airtimes : array of float, (m,)
        Seconds each would take alone (finite, >= 0; 0 ends at once, as ``transmit`` returns without waiting).

    Returns
    -------
    ndarray of float64, (m,), or None
        Each transfer's end, the times the reference's ``SharedAir`` gives (bit for bit); None where an arrival
        coincides with a firing of the air's timeout (SimPy's insertion order would decide; module docstring).

    Raises
    ------
    ValueError
        For inputs of different lengths or a negative or non-finite airtime.
    """
    s = np.asarray(starts, dtype=np.float64)
    w = np.asarray(airtimes, dtype=np.float64)
    if s.shape != w.shape or s.ndim != 1:
        raise ValueError(f"starts and airtimes must be 1-d of one length, got shapes {s.shape} and {w.shape}")
    if w.size and not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("airtimes must be finite and >= 0 seconds")
    m = s.size
    out = np.empty(m)
    order = np.argsort(s, kind="stable").tolist()
    s_l, w_l = s.tolist(), w.tolist()
    air = Air()
    i = 0
    while i < m or air.heap:
        a = s_l[order[i]] if i < m else math.inf
        if a < air.fire:                           # an arrival: SharedAir.transmit
            k = order[i]
            i += 1
            if w_l[k] == 0.0:
                out[k] = a
            else:
                air.arrive(a, w_l[k], k)
        elif air.fire < a:                         # the live timeout fires: SharedAir._fire
            T = air.fire
            for k in air.fire_now():
                out[k] = T
        else:                                      # an arrival at the instant the timeout fires
            return None
    return out
