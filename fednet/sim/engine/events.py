"""The engine's view of SimPy's queue and of the simulation: the facts every backend's ``can_run`` derives from.

A backend may stand for the reference processes only where no other process can act while it runs, nothing it
replays is overridden, and every draw is the engine's own: :func:`plain_engine`, :func:`alone`, :func:`draws_plain`
and :func:`idle_reason` tell, each returning ``True`` or the reason it does not hold.  :func:`event_at`,
:func:`fifo_links` and :func:`event_order` are the arithmetic the replays share.

SimPy internals read here (``Environment._queue`` entries ``(time, priority, id, event)``, ``_eid``, ``NORMAL``,
``Release``, ``Resource.users/queue/put_queue``) are listed in :data:`fednet.sim.simulation.SIMPY_CODE` and
``SIMPY_ATTRIBUTES`` and checked against the installed SimPy by ``tests/test_simpy_contract.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL
from simpy.resources.resource import Release

from fednet.sim.cells import AirTimeout
from fednet.sim.rng import Streams
from fednet.sim.simulation import Node, Simulation

__all__ = ["draws_plain", "plain_engine", "alone", "idle_reason", "fast_reason", "event_at", "spawner",
           "fifo_links", "event_order"]

#: The keyed draws of :class:`fednet.sim.rng.Streams` as defined there: the replays look at draws before taking
#: them, so where one of these is overridden (or patched) they leave the step to the reference.
_STREAM_DRAWS = {name: getattr(Streams, name)
                 for name in ("uniform", "uniforms", "uniforms_in_turn", "uniforms_repeated", "advance")}


def draws_plain(streams: Streams) -> bool:
    """Whether none of the keyed draws of ``streams``' class is overridden (:data:`_STREAM_DRAWS`)."""
    return all(getattr(type(streams), name) is f for name, f in _STREAM_DRAWS.items())



def spawner(env: simpy.Environment, children: list[simpy.Process]) -> Callable[[Generator], simpy.Process]:
    """``spawn(gen)``: start ``gen`` as a SimPy process appended to ``children`` (for cancellation), which ends
    quietly when interrupted."""
    def spawn(gen: Generator) -> simpy.Process:
        """Start ``gen`` as a process tracked in ``children``."""
        def guarded() -> Generator:
            """Run ``gen``, ending quietly when the process is interrupted (cancelled)."""
            try:
                return (yield from gen)
            except simpy.Interrupt:
                return None
        p = env.process(guarded())
        children.append(p)
        return p
    return spawn


def event_at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at the absolute simulated time ``t`` (seconds, ``>= env.now``).

    ``env.timeout(t - env.now)`` would compute ``now + (t - now)``, which can differ from ``t`` in the last bit;
    the fast paths replay times computed arithmetically and must resume at exactly those floats, so the event is
    queued at ``t`` itself (SimPy's own ``(time, priority, id, event)`` queue entry, as ``Environment.schedule``
    writes it).
    """
    event = env.event()
    event._ok, event._value = True, None
    heapq.heappush(env._queue, (t, NORMAL, next(env._eid), event))
    return event


def fifo_links(arrive: np.ndarray, seconds: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each message on capacity-1 FIFO links (a :class:`fednet.sim.network.Link`'s resource).

    The messages are given link by link, each link's in its queue order (``first`` marks the first of each link):
    a message starts when it has arrived and the one before it on its link has ended, ``max(arrive, end before)``,
    and holds the link ``seconds`` (the floats SimPy's grant and ``timeout`` give: ``now + seconds``).

    Parameters
    ----------
    arrive, seconds : ndarray of float, (n,)
        When each message requests its link, and how long it holds it (simulated seconds).
    first : ndarray of bool, (n,)

    Returns
    -------
    start, end : ndarray of float, (n,)
    """
    n = len(arrive)
    at = np.arange(n)
    pos = at - np.maximum.accumulate(np.where(first, at, 0))        # place in its link's queue
    levels = np.argsort(pos, kind="stable")
    start, end = np.empty(n), np.empty(n)
    lo = 0
    for k, count in enumerate(np.bincount(pos).tolist()):           # the k-th message of every link at once
        sel = levels[lo:lo + count]
        lo += count
        s = arrive[sel] if k == 0 else np.maximum(arrive[sel], end[sel - 1])
        start[sel] = s
        end[sel] = s + seconds[sel]
    return start, end


def event_order(times: np.ndarray, pred: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Ranks of events in the order SimPy processes them, where each was scheduled by processing its predecessor.

    Events at one time are processed in the order they were scheduled (SimPy's heap key ``(time, priority, id)``,
    the id counting up): event ``m`` was scheduled when its predecessor ``pred[m]`` was processed (through a chain
    of same-instant events that keeps the order), or, where ``pred[m] < 0``, at the start, in the order
    ``base[-1 - pred[m]]``.  So ``m`` comes before ``m'`` iff the string ``times[m], times[pred[m]], ...,`` (ending
    in its start symbol) is lexicographically smaller, a start symbol coming before any time; the strings are
    ranked by prefix doubling (``O(n log n log depth)``).

    Parameters
    ----------
    times : ndarray of float, (n,)
        Each event's time, later than its predecessor's (and than the start).
    pred : ndarray of int, (n,)
        The predecessor's index in ``[0, n)``, or ``-1 - c`` for the start symbol ``c``.
    base : ndarray of int, (c,)
        Distinct ranks of the start symbols.

    Returns
    -------
    ndarray of int, (n,)
        Distinct ranks, 0 first.
    """
    n, c = len(times), len(base)
    rank = np.empty(n + c, dtype=np.int64)
    rank[:n] = c + np.unique(times, return_inverse=True)[1].reshape(-1)
    rank[n:] = np.argsort(np.argsort(base, kind="stable"), kind="stable")
    jump = np.concatenate([np.where(pred >= 0, pred, n - 1 - pred), np.arange(n, n + c)])
    while rank.max() < n + c - 1:                          # some ranks still shared
        nxt = rank[jump]
        o = np.lexsort((nxt, rank))
        r, x = rank[o], nxt[o]
        rank[o] = np.cumsum(np.r_[True, (r[1:] != r[:-1]) | (x[1:] != x[:-1])]) - 1
        jump = jump[jump]
    return rank[:n] - c                  # the start symbols hold ranks 0 .. c - 1


#: The simulation's methods the backends replay: an override of one must see every message and computation.
SIM_METHODS = ("transfer", "compute", "_hop", "hop_draw", "hop_done", "deliver", "compute_now")


def plain_engine(net: Any, *, cells: bool = False) -> bool | str:
    """``True`` if none of the methods a backend replays is overridden -- the net's ``send`` / ``_message``
    (:meth:`fednet.protocol.primitives.Net.overridden`) and the simulation's :data:`SIM_METHODS` -- else the reason.

    ``cells``: the caller replays shared cells' airtime itself (:mod:`fednet.sim.engine.backends.airtime`), so cells
    are no reason to decline."""
    if getattr(net.sim, "energy", None):
        return ("the devices have an energy model: the backends do not account energy, so the reference processes "
                "run")
    if getattr(net.sim, "hop_latency", 0.0):
        return ("every hop has a latency floor (hop_latency_s): the backends replay hops without it, so the "
                "reference processes run")
    if getattr(net.sim, "edge_servers", None):
        return ("devices reach the server through edge servers and their backhaul (a hierarchy): the backends "
                "replay a one-server star, so the reference processes run")
    if getattr(net.sim, "cells", None) and not cells:
        return ("devices share a cell's airtime (fednet.sim.cells): this backend replays dedicated links (only the "
                "vectorised gather, the groups, masked and tree backends replay shared airtime), so the reference "
                "processes run")
    sim_type = type(net.sim)
    over = list(net.overridden()) + [f"Simulation.{name}" for name in SIM_METHODS
                                     if getattr(sim_type, name) is not getattr(Simulation, name)]
    if over:
        return f"{', '.join(over)} overridden (an override must see every message and computation)"
    return True


def alone(sim: Simulation) -> bool | str:
    """``True`` if nothing else is scheduled -- every event still queued has no callbacks (leftovers of interrupted
    work), releases a resource nobody queues for, or is a stale timeout of a cell's air
    (:class:`fednet.sim.cells.AirTimeout`: the reference leaves them behind on cells), so no other process can act
    before the caller's next yield -- else the reason."""
    for entry in sim.env._queue:
        ev = entry[3]
        if (ev.callbacks and not (type(ev) is Release and not ev.resource.put_queue)
                and not all(type(cb) is AirTimeout and cb.stale for cb in ev.callbacks)):
            return "another process is scheduled (its events could interleave with the step)"
    return True


def idle_reason(sim: Simulation, nodes: Sequence[Node]) -> bool | str:
    """``True`` if every link and processor of ``nodes`` is idle (:meth:`Simulation.idle`), else the reason."""
    return True if sim.idle(nodes, settled=True) else "a link or processor of the step's nodes is busy"


def fast_reason(net: Any, nodes: Sequence[Node], *, cells: bool = False) -> bool | str:
    """``True`` if a step over ``nodes`` may run without SimPy processes: :func:`plain_engine` (``cells`` passed on),
    :func:`alone` and :func:`idle_reason` all hold; else the first reason."""
    for check in (plain_engine(net, cells=cells), alone(net.sim)):
        if check is not True:
            return check
    return idle_reason(net.sim, nodes)
