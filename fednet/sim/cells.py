"""Shared cells: devices of one cell share its airtime (issue 28, item 3, first part).

In the papers' star every device has its own full-rate uplink and downlink. In a *cell* the devices attached to it
(node attribute ``cell``) share the air: a cell's uplink (and, separately, its downlink) serves the transfers in
progress by **equal airtime** (round robin with a vanishing slot: processor sharing).  A transfer needs the airtime
its own link would take alone -- :func:`fednet.sim.network.transmission_time` at its device's rate, with the header
overhead and the keyed retransmissions -- and while ``n`` transfers are active each receives ``1/n`` of the time,
so a transfer's rate changes, exactly, whenever another starts or ends (or is cancelled: a transfer whose process is
interrupted leaves the air at that instant, as a cancelled transfer frees a dedicated link).  ``n`` equal transfers of ``b`` bits at rate
``R`` that start together all end at ``n b / R``.  A device still sends its own messages one after the other (its
link's FIFO); only different devices' transfers share the air.

:class:`SharedAir` is the discrete-event form: every transfer's finish is tracked in *virtual time* ``V`` (the
service each active transfer has received, growing at ``1/n`` per simulated second), a transfer arriving at ``V_a``
with airtime ``w`` ends when ``V = V_a + w``, and one timeout is pending at a time: that of the smallest finish.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator
from typing import Any

import simpy

__all__ = ["SharedAir", "SCHEDULERS"]

#: The named airtime schedulers of a cell.
SCHEDULERS = ("round_robin",)


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
        self._advance()
        done = self.env.event()
        entry = (self._virtual + airtime, next(self._order), done)
        heapq.heappush(self._heap, entry)
        self._schedule()
        try:
            yield done
        except simpy.Interrupt:         # cancelled (the server stopped waiting): it leaves the air now
            self._leave(entry)
            raise

    def _leave(self, entry: tuple[float, int, simpy.Event]) -> None:
        """A transfer cancelled before its end leaves the air at once, as a cancelled transfer frees a dedicated
        link: the others share the air among fewer from now on (none left: the air is idle)."""
        if entry not in self._heap:     # it ended at this very instant
            return
        self._advance()
        self._heap.remove(entry)
        heapq.heapify(self._heap)
        if not self._heap:
            self._virtual = 0.0
        self._schedule()

    def _schedule(self) -> None:
        """Arm one timeout for the earliest finish (older timeouts become stale)."""
        self._generation += 1
        if not self._heap:
            return
        finish = self._heap[0][0]
        delay = max(0.0, (finish - self._virtual) * len(self._heap))
        generation = self._generation
        self.env.timeout(delay).callbacks.append(lambda _ev: self._fire(generation))

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
