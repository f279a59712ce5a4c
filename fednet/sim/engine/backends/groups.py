"""The ``groups`` backend: the gathers of disjoint groups, each followed by its own server step, replayed together.

:class:`GroupsReplay` stands for :func:`fednet.sim.engine.reference.groups` (one process per group, each a gather
then ``then(g, result)``) where no other process can act meanwhile: every group's download, compute and upload events
are walked in the order SimPy would process them (:func:`fast_groups`), and each group's ``then`` starts at its
``first[g]``-th arrival, the groups in the order SimPy resumes them.  The same draws, counters, messages and results,
bit for bit (``tests/test_gather_groups.py``; CodedPaddedFL with grouping at D = 1000).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from typing import Any

from fednet.sim.network import Message
from fednet.sim.simulation import Node

from ..events import event_at, fast_reason
from ..results import GatherResult, uploaded_elements
from ..step import Backend, Step
from .gather import replay_start

__all__ = ["GroupsReplay", "fast_groups"]


class GroupsReplay(Backend):
    """Disjoint groups' gathers replayed together (module docstring)."""

    name = "groups"
    kind = "groups"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        if len(step.groups) < 2:
            return "one group (its gather is dispatched on its own)"
        ok = fast_reason(net, [node for group in step.groups for node in group])
        if ok is not True:
            return ok
        # the availability each group's gather would ask (keyed: the same answers when asked again)
        flags = [net.sim.available_many(group) for group in step.groups]
        up = [[n for n, present in zip(group, f) if present] for group, f in zip(step.groups, flags)]
        need = [len(u) if k is None else int(k) for u, k in zip(up, step.first)]
        if not all(0 < k <= len(u) for k, u in zip(need, up)):
            return "a group has no node to wait for or fewer available nodes than it awaits (the processes raise)"
        step.args.update(flags=flags, up=up, need=need)
        return True

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        env = net.sim.env
        fn, kind = step.fn, step.kind_of
        run = None if fn is None else net._charged(fn, f"gather {kind!r}", False)
        results = [GatherResult(dropped=[n for n, ok in zip(group, f) if not ok])
                   for group, f in zip(step.groups, step.flags)]
        outcomes = fast_groups(net, step.up, step.need, results, run, kind=kind, **step.common)
        procs = []
        for g in sorted(range(len(step.groups)), key=lambda g: outcomes[g][1]):   # SimPy's order of the resumptions
            result, done_key = outcomes[g]
            procs.append(env.process(_after(net, done_key[0], result, step.then(g, result))))
        yield env.all_of(procs)


def _after(net: Any, t: float, result: GatherResult, rest: Generator) -> Generator:
    """Resume at ``t`` (a group's last awaited arrival), note its failures, then run ``rest``."""
    yield event_at(net.sim.env, t)
    net._note_failures(result)
    yield from rest


def fast_groups(net, nodes: list[list[Node]], need: list[int], results: list[GatherResult],
                 run: Callable[..., Any] | None, *,
                 kind: str, download: Any, download_kind: str, download_elements: int | None,
                 download_bits: int | None, upload_elements: int | None, upload_bits: int | None,
                 timing_key: str) -> list[tuple[GatherResult, tuple]]:
    """The device side of a ``groups`` step without processes: ``(result, key of its end)`` per group.

    ``nodes[g]``: group ``g``'s available nodes; ``need[g]``: the results awaited from it (``1 <= need[g] <=
    len(nodes[g])``); ``results[g]``: its result so far (the unavailable nodes), completed here.

    :func:`~fednet.sim.engine.backends.gather.fast_rounds`'s node-by-node replay over every group at once.  Each node's
    events are keyed as there, ``(time, priority, key of the event that scheduled it)``, from its process's start
    ``(now, 0, (g, p))``: the groups' processes start in order and each starts its nodes' in order, so the keys of
    different groups compare as SimPy's queue orders them.  A group's events from its ``first[g]``-th arrival on never
    happen (its server stops waiting and cancels the rest).  Mutates as the processes would: draws, counters, views;
    returns without yielding (the caller resumes each group at its end).
    """
    sim, env = net.sim, net.sim.env
    now0 = env.now
    t0 = float(now0)
    rnd = sim.round
    server = sim.server
    size_of = uploaded_elements(upload_elements)
    groups = range(len(nodes))
    flat = [(g, p) for g in groups for p in range(len(nodes[g]))]
    downs, starts, up_bits, _, c_key = replay_start(
        net, [nodes[g][p] for g, p in flat], [(now0, 0, gp) for gp in flat], download, download_kind,
        download_elements, download_bits, upload_bits, timing_key, kind)
    down = {gp: d for gp, d in zip(flat, downs) if d is not None}   # (msg, extra, t1, key of the download's end)
    start_key = dict(zip(flat, starts))          # key of the processor request

    def land_download(gp: tuple) -> None:
        """The download of node ``gp`` lands (its payload is set)."""
        got = down.pop(gp, None)
        if got is None:
            return
        msg, extra, t1, _ = got
        node = nodes[gp[0]][gp[1]]
        sim.hop_done(msg, node, "down", extra, t0, float(t1))
        sim.deliver(msg, float(t1))
        node.state.received = msg.payload

    done_key: list[tuple | None] = [None] * len(nodes)
    outcome: dict[tuple, tuple] = {}             # (g, p) -> (value, upload msg, extra, t2, t3)
    arrivals: list[list[tuple]] = [[] for _ in groups]
    pending: dict[tuple, tuple] = {}
    heap = [(start_key[gp], gp, 0) for gp in flat]
    heapq.heapify(heap)
    while heap:
        key, gp, stage = heapq.heappop(heap)
        g, p = gp
        if done_key[g] is not None and not key < done_key[g]:
            continue                             # group g's server stopped waiting: this never happens
        node = nodes[g][p]
        if stage == 0:                           # the processor is granted: compute
            land_download(gp)
            value, seconds = sim.compute_now(node, run, (node,), {}, None, rnd, timing_key=c_key)
            t1 = key[0]
            if seconds > 0:
                t2 = t1 + seconds
                k_up = (t2, 1, (t2, 1, key))
            else:
                t2, k_up = t1, (t1, 1, key)
            pending[gp] = (value, t2)
            heapq.heappush(heap, (k_up, gp, 1))
        elif stage == 1:                         # the upload starts
            value, t2 = pending.pop(gp)
            msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits(value), round=rnd,
                          timing_key=timing_key)
            msg.sent_at = float(t2)
            seconds, extra = sim.hop_draw(msg, node, "up")
            t3 = t2 + seconds
            outcome[gp] = (value, msg, extra, t2, t3)
            heapq.heappush(heap, ((t3, 1, key), gp, 2))
        else:                                    # the upload arrives
            arrivals[g].append((key, p))
            if len(arrivals[g]) == need[g]:
                done_key[g] = (key[0], 1, key)
    for key, gp in sorted((key, (g, p)) for g in groups for key, p in arrivals[g]):
        value, msg, extra, t2, t3 = outcome[gp]  # uploads land at the server in order of arrival
        sim.hop_done(msg, nodes[gp[0]][gp[1]], "up", extra, float(t2), float(t3))
        sim.deliver(msg, float(t3))
    for gp in flat:                              # downloads that ended before their server stopped waiting
        if gp in down and (done_key[gp[0]] is None or down[gp][3] < done_key[gp[0]]):
            land_download(gp)
    out = []
    for g, result in enumerate(results):
        arrived = [(nodes[g][p], outcome[(g, p)][0]) for _, p in arrivals[g]]
        result.results, result.surplus = arrived[:need[g]], arrived[need[g]:]
        got = {p for _, p in arrivals[g]}
        result.cancelled = [node for p, node in enumerate(nodes[g]) if p not in got]
        out.append((result, done_key[g]))
    return out
