"""The ``relays`` backend: the ``relay_asap`` and ``relay_steps`` exchanges replayed with array arithmetic.

:class:`RelayReplay` stands for the per-message processes of :func:`fednet.sim.engine.reference.exchange` (an upload
and a download through the server per share): the links' FIFO queues, the keyed draws in SimPy's order, the
counters, the server's relay list and the views (when recorded), bit for bit (``tests/test_codedsecagg_setup.py``,
``tests/test_engine_property.py``); CodedSecAgg's set-up at D = 1000.

It runs where no other process can act (nothing else scheduled), or where the caller passes ``exclusive=True``
(other groups' exchanges running beside it, on other links): that is checked after the fact, not trusted
(:func:`replay_relays`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from fednet.sim.network import transmission_times
from fednet.sim.simulation import Node

from .. import wire
from ..events import alone, draws_plain, event_at, event_order, fifo_links, plain_engine
from ..results import EngineError
from ..step import Backend, Step
from ..reference import expand

__all__ = ["RelayReplay", "replay_relays", "relay_reason", "relay_batch", "link_arrays", "link_grants",
           "resume_at"]


class RelayReplay(Backend):
    """The relay schedules' exchanges without a process per message (module docstring)."""

    name = "relays"
    kind = "exchange"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        if step.schedule not in ("relay_asap", "relay_steps"):
            return f"schedule {step.schedule!r} is not a relay schedule"
        if step.prepare is not None or step.mailbox is not None:
            return "the senders prepare (prepare=...) or the shares go to a mailbox"
        expand(step)
        pairs = [p for s in step.steps for p in s]
        if not pairs:
            return "no message to send"
        s = np.fromiter((src.index for src, _ in pairs), np.int64, len(pairs))
        d = np.fromiter((dst.index for _, dst in pairs), np.int64, len(pairs))
        keys = np.sort(s * len(net.sim.nodes) + d)
        if (s == d).any() or (keys[1:] == keys[:-1]).any():
            return "a node sends to itself or a pair repeats"
        ok = relay_reason(net, step, np.flatnonzero(np.bincount(s)), np.flatnonzero(np.bincount(d)))
        if ok is True:
            step.args["ends"] = (s, d)
        return ok

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        return (yield from replay_relays(net, step.steps, step.payload, step.ends, kind=step.kind_of,
                                         schedule=step.schedule, n_elements=step.n_elements,
                                         element_bits=step.element_bits, timing_key=step.timing_key,
                                         name=step.name, verify=step.args.get("verify", False)))


def relay_reason(net: Any, step: Step, senders: np.ndarray, receivers: np.ndarray) -> bool | str:
    """``True`` if an exchange step relayed through the server may be replayed now, else the reason: one positive
    declared share size, no direct device-to-device links, the plain engine and keyed draws, nothing else scheduled
    (or ``exclusive=True`` without views recorded: then ``step.args["verify"]`` is set, :func:`replay_relays`), every
    end a device with idle links.

    Parameters
    ----------
    senders, receivers : ndarray of int, (k,)
        The distinct indices of the nodes that send and that receive.
    """
    sim = net.sim
    n_elements = step.n_elements
    if n_elements is None or int(n_elements) <= 0:
        return "the shares' size is not one positive n_elements"
    if step.element_bits is None:
        return "the shares' width is not declared (element_bits=None: each payload tells its own)"
    if sim.d2d:
        return "the network has direct device-to-device links"
    for check in (plain_engine(net), "the keyed draws are overridden" if not draws_plain(sim.streams) else True):
        if check is not True:
            return check
    if alone(sim) is not True:
        if not step.exclusive:
            return "another process is scheduled and the caller did not pass exclusive=True"
        if sim.record_views:
            return ("another process is scheduled and views are recorded (the server's relay list interleaves "
                    "every process's messages in time)")
        step.args["verify"] = True
    nodes = sim.nodes
    if (any(nodes[i].role != "device" or nodes[i].uplink.resource.users or nodes[i].uplink.resource.queue
            for i in senders.tolist())
            or any(nodes[j].role != "device" or nodes[j].downlink.resource.users or nodes[j].downlink.resource.queue
                   for j in receivers.tolist())):
        return "an end is not a device or one of its links is busy"
    return True


def link_arrays(sim: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every node's uplink rate (bit/s) and loss, and downlink rate and loss (0 where it has no such link).

    Returns
    -------
    up_rate, up_loss, down_rate, down_loss : ndarray of float, (len(sim.nodes),)
    """
    nodes = sim.nodes
    return (np.array([n.uplink.rate_bps if n.uplink else 0.0 for n in nodes]),
            np.array([n.uplink.loss if n.uplink else 0.0 for n in nodes]),
            np.array([n.downlink.rate_bps if n.downlink else 0.0 for n in nodes]),
            np.array([n.downlink.loss if n.downlink else 0.0 for n in nodes]))


def relay_batch(sim: Any, s: np.ndarray, d: np.ndarray, now: float, bits_each: int,
                links: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], up_purpose: str, down_purpose: str,
                record: bool) -> tuple[np.ndarray, ...]:
    """One batch of relayed messages, all launched at ``now`` in launch order (:func:`replay_relays`): their keyed
    draws taken, the counters charged, their times.

    Parameters
    ----------
    s, d : ndarray of int, (m,)
        Sender and receiver of each message, in launch order.
    now : float
        The batch's start (simulated seconds).
    bits_each : int
        Payload bits of each message.
    links : tuple of ndarray
        :func:`link_arrays`.
    up_purpose, down_purpose : str
        The keys of the uplink and downlink draws.
    record : bool
        Views are recorded (the upload ends' processing order is then needed exactly).

    Returns
    -------
    up_start, up_end, down_start, down_end : ndarray of float, (m,)
        Each message's upload and download on its links (simulated seconds).
    order : ndarray of int, (m,)
        Each message's rank in the order SimPy processes the upload ends.
    by_dst : ndarray of int, (m,)
        The messages receiver by receiver, each receiver's in its downlink's queue order.
    """
    up_rate, up_loss, down_rate, down_loss = links
    rnd = sim.round
    m = len(s)
    # uplinks: queues in launch order, all requested now
    by_src = np.argsort(s, kind="stable")
    s_sorted = s[by_src]
    first_s = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    u_up = sim.streams.uniforms_in_turn(s_sorted, up_purpose, rnd)
    secs_up, extra_up = transmission_times(bits_each, up_rate[s_sorted], sim.overhead, up_loss[s_sorted],
                                           sim.packet_bits, u_up, arrays=True)
    up_start, up_end = np.empty(m), np.empty(m)
    up_start[by_src], up_end[by_src] = fifo_links(np.full(m, now), secs_up, first_s)
    # the order SimPy processes the upload ends in (needed only where two at one instant matter)
    pred = np.empty(m, dtype=np.int64)
    pred[by_src] = np.where(first_s, -1 - np.cumsum(first_s) + 1, np.r_[0, by_src[:-1]])
    firsts = by_src[first_s]                                   # each sender's first message: launch order
    o = np.lexsort((up_end, d))
    tied_dst = bool(((d[o][1:] == d[o][:-1]) & (up_end[o][1:] == up_end[o][:-1])).any())
    if tied_dst or (record and len(np.unique(up_end)) < m):
        order = event_order(up_end, pred, firsts)
    else:
        order = np.argsort(np.argsort(up_end, kind="stable"), kind="stable")
    # downlinks: queues in that order
    by_dst = np.lexsort((order, d))
    d_sorted = d[by_dst]
    first_d = np.r_[True, d_sorted[1:] != d_sorted[:-1]]
    u_down = sim.streams.uniforms_in_turn(d_sorted, down_purpose, rnd)
    secs_down, extra_down = transmission_times(bits_each, down_rate[d_sorted], sim.overhead,
                                               down_loss[d_sorted], sim.packet_bits, u_down, arrays=True)
    down_start, down_end = np.empty(m), np.empty(m)
    down_start[by_dst], down_end[by_dst] = fifo_links(up_end[by_dst], secs_down, first_d)
    counters = sim.counters
    counters.bits_up += bits_each * m
    counters.bits_down += bits_each * m
    counters.messages += 2 * m
    counters.retransmissions += int(extra_up.sum()) + int(extra_down.sum())
    return up_start, up_end, down_start, down_end, order, by_dst


def link_grants(sim: Any, senders: np.ndarray, receivers: np.ndarray) -> tuple[list, list[int]]:
    """The uplinks of ``senders`` and downlinks of ``receivers`` (distinct node indices), and their grant counters
    now (:class:`fednet.sim.simulation.Slot`), for :func:`resume_at`'s check."""
    links = [sim.nodes[i].uplink.resource for i in senders.tolist()]
    links += [sim.nodes[j].downlink.resource for j in receivers.tolist()]
    return links, [link.grants for link in links]


def resume_at(net: Any, now: float, name: str, grants: tuple[list, list[int]] | None, backend: str) -> Generator:
    """Resume the caller of a replayed exchange at ``now`` (its last delivery); with ``grants``
    (:func:`link_grants` at the start, the caller's ``exclusive=True``) check that no other process was granted one
    of its links meanwhile.

    Raises
    ------
    EngineError
        If the exchange is interrupted (cancelled) while it waits, or another process used one of its links.
    """
    try:
        yield event_at(net.sim.env, now)
    except simpy.Interrupt:
        raise EngineError(f"{net.label}: {name} was replayed without its processes (exclusive=True) and cannot be "
                          f"cancelled; run it without exclusive=True") from None
    if grants is not None:
        links, before = grants
        used = [k for k, link in enumerate(links) if link.grants != before[k]]
        if used:
            raise EngineError(f"{net.label}: {name} was replayed under exclusive=True, but another process used "
                              f"{len(used)} of its links meanwhile, so its replayed times are wrong; drop "
                              f"exclusive=True (or run with the {backend!r} backend disallowed)")


def replay_relays(net, steps: Sequence[Sequence[tuple[Node, Node]]], payload: Callable[[Node, Node], Any],
                  ends: tuple[np.ndarray, np.ndarray], *, kind: str, schedule: str, n_elements: int,
                  element_bits: int | None, timing_key: str, name: str = "exchange",
                  verify: bool = False) -> Generator:
    """An exchange on ``relay_asap`` or ``relay_steps`` without its per-message processes.

    Replays what the processes do, with array arithmetic: every message of a batch (``relay_asap``: all of them;
    ``relay_steps``: one step, starting when the previous one is delivered) requests its sender's uplink at the batch's
    start, in launch order; each uplink serves its queue first come, first served
    (:func:`~fednet.sim.engine.events.fifo_links`), the keyed uplink draws taken in that order; an upload's end puts the
    message in its receiver's downlink queue, which is served the same way.  Upload ends at one instant are processed in
    SimPy's order (:func:`~fednet.sim.engine.events.event_order`: an uplink's next grant is scheduled by processing its
    previous upload's end, the first ones at the start in launch order), which decides the order of a downlink's queue
    and so its draws.  The same draws, times (the same float operations), counters, messages in the server's relay list
    and the receivers' views (when recorded) and returned mapping, bit for bit (``tests/test_codedsecagg_setup.py``);
    the caller resumes at the last delivery, with ``O(n' log n')`` array work per batch of ``n'`` messages instead of a
    SimPy process each.  ``ends``: the senders' and receivers' indices of the pairs of ``steps`` in order
    (:meth:`RelayReplay.can_run`).

    ``verify``: other processes were scheduled at the start (the caller's ``exclusive=True``), so once the replay
    has ended it checks that none of them was granted one of the exchange's links meanwhile (the links' grant
    counters, :class:`fednet.sim.simulation.Slot`): if one was, the replayed times are wrong and
    :class:`~fednet.sim.engine.results.EngineError` names the step -- never a silently wrong time.
    """
    sim, env = net.sim, net.sim.env
    record = sim.record_views
    grants = link_grants(sim, np.unique(ends[0]), np.unique(ends[1])) if verify else None
    bits_each = int(n_elements) * wire.declared(element_bits, kind=kind, where=f"{net.label}: ").bits
    up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"
    down_purpose = f"downlink:{timing_key}" if timing_key else "downlink"
    sizes = [len(step) for step in steps]
    if schedule == "relay_asap":
        batches, bounds = [[p for step in steps for p in step]], [0, sum(sizes)]
    else:
        batches, bounds = [list(step) for step in steps if step], np.cumsum([0] + [k for k in sizes if k]).tolist()
    rates = link_arrays(sim)
    delivered: dict[tuple[int, int], Any] = {}
    now = float(env.now)
    for batch, lo, hi in zip(batches, bounds[:-1], bounds[1:]):
        values = [payload(src, dst) for src, dst in batch]       # formed at the batch's start, in launch order
        s, d = ends[0][lo:hi], ends[1][lo:hi]
        up_start, up_end, down_start, down_end, order, by_dst = relay_batch(
            sim, s, d, now, bits_each, rates, up_purpose, down_purpose, record)
        if record:
            msgs = []
            for (src, dst), value, t0, t1, t2, t3 in zip(batch, values, up_start.tolist(), up_end.tolist(),
                                                         down_start.tolist(), down_end.tolist()):
                msg = net._message(src, dst, value, kind, n_elements, element_bits, timing_key=timing_key)
                msg.sent_at, msg.encrypted = now, True
                msg.hops += [("up", src.index, t0, t1), ("down", dst.index, t2, t3)]
                msgs.append(msg)
            sim.server.relayed.extend(msgs[k] for k in np.argsort(order).tolist())
            for k in by_dst.tolist():
                sim.deliver(msgs[k], msgs[k].hops[1][3])
        delivered.update(zip(zip(s.tolist(), d.tolist()), values))
        now = float(down_end.max())
    yield from resume_at(net, now, name, grants, "relays")
    return delivered
