"""The ``groups`` backend: the gathers of disjoint groups, each followed by its own server step, replayed together.

:class:`GroupsReplay` stands for :func:`fednet.sim.engine.reference.groups` (one process per group, each a gather
then ``then(g, result)``) where no other process can act meanwhile: every group's download, compute and upload events
are walked in the order SimPy would process them (:func:`fast_groups`), and each group's ``then`` starts at its
``first[g]``-th arrival, the groups in the order SimPy resumes them.  The same draws, counters, messages and results,
bit for bit (``tests/test_gather_groups.py``; CodedPaddedFL with grouping at D = 1000).  On shared round-robin cells
:func:`fast_groups_cells` replays the airs instead (``tests/test_cells_replay.py``); a ``then`` that used one of those
airs while a replayed transfer still held it is caught after the step (:class:`~fednet.sim.engine.results.EngineError`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from fednet.sim.compute import ShiftedExponential
from fednet.sim.network import Message, transmission_times
from fednet.sim.simulation import Node

from .. import wire
from ..events import event_at, fast_reason
from ..results import EngineError, GatherResult, compute_key, payload_size, uploaded_elements
from ..step import Backend, Step
from .airtime import Air, cells_air_reason
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
        nodes = [node for group in step.groups for node in group]
        cells = bool(net.sim.cells)
        ok = fast_reason(net, nodes, cells=cells)
        if ok is not True:
            return ok
        if cells:
            why = cells_reason(nodes)
            if why is not True:
                return why
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
        busy: dict[int, float] = {}
        if net.sim.cells:
            airs = {id(a): a for node in (n for group in step.up for n in group)
                    for a in (node.downlink.air, node.uplink.air) if a is not None}
            used = {key: air.transfers for key, air in airs.items()}
            outcomes = fast_groups_cells(net, step.up, step.need, results, run, kind=kind, busy=busy, **step.common)
        else:
            outcomes = fast_groups(net, step.up, step.need, results, run, kind=kind, **step.common)
        procs = []
        for g in sorted(range(len(step.groups)), key=lambda g: outcomes[g][1]):   # SimPy's order of the resumptions
            result, done_key = outcomes[g]
            procs.append(env.process(_after(net, done_key[0], result, step.then(g, result))))
        yield env.all_of(procs)
        if busy:
            first_then = min(done_key[0] for _, done_key in outcomes)
            late = [key for key, air in airs.items() if air.transfers != used[key] and busy.get(key, 0.0) > first_then]
            if late:
                raise EngineError(f"{net.label}: a group's follow-up step used a shared cell while the groups replay "
                                  "still had transfers on it, so their replayed times are wrong; run with the 'groups' "
                                  "backend disallowed")


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


def cells_reason(nodes: list[Node]) -> bool | str:
    """``True`` if :func:`fast_groups_cells` can replay a step over ``nodes`` on shared cells, else the reason: every
    cell idle and round robin, and every node's compute time continuous (a shifted exponential with a random part),
    so that two events that would need SimPy's insertion order to be ordered happen with probability zero."""
    for node in nodes:
        model = node.compute_model
        if type(model) is not ShiftedExponential or not model.setup_fraction > 0:
            return (f"on shared cells the groups replay needs continuous compute times (device {node.index}'s compute "
                    f"model {model!r} has no random part: events could tie)")
    return cells_air_reason(nodes)


def fast_groups_cells(net, nodes: list[list[Node]], need: list[int], results: list[GatherResult],
                      run: Callable[..., Any] | None, *,
                      kind: str, download: Any, download_kind: str, download_elements: int | None,
                      download_bits: int | None, upload_elements: int | None, upload_bits: int | None,
                      timing_key: str, busy: dict[int, float] | None = None) -> list[tuple[GatherResult, tuple]]:
    """:func:`fast_groups` on a network whose devices share cells' airtime: ``(result, (end,))`` per group.

    ``busy`` (filled if given): per cell air (``id`` of its ``SharedAir``), the last instant a replayed transfer held it.

    The groups' processes, without SimPy: every node's download asks for its cell's downlink air at the start (in
    order), its computation starts when the download ends (:meth:`Simulation.compute_now`, the keyed compute draw)
    and its upload asks for its cell's uplink air when the computation ends (:meth:`Simulation.hop_draw`, the keyed
    uplink draw); each air is an :class:`~.airtime.Air` (``SharedAir``'s float operations), a device without a cell
    its dedicated link.  At group ``g``'s ``need[g]``-th arrival its server stops waiting: the group's transfers
    still on the air leave it then (the reference interrupts them, :meth:`fednet.sim.cells.SharedAir.transmit`), so
    the other groups' transfers in the same cells speed up, and its nodes' later events never happen.  Events are
    processed in time order; two at one instant that touch the same air or the same group (where SimPy's insertion
    order would decide) raise :class:`~fednet.sim.engine.results.EngineError` -- never a silently wrong time
    (:func:`cells_reason` admits only continuous compute times, which make them events of probability zero).  Mutates
    as the processes would: draws, counters, views.
    """
    sim = net.sim
    now0 = float(sim.env.now)
    rnd = sim.round
    server = sim.server
    where = f"{net.label}: "
    size_of = uploaded_elements(upload_elements)
    up_bits = wire.widths(upload_bits, kind, arg="upload_bits", where=where)
    c_key = compute_key(timing_key)
    flat = [(g, p) for g in range(len(nodes)) for p in range(len(nodes[g]))]
    fnodes = [nodes[g][p] for g, p in flat]
    airs: dict[int, Air] = {}

    def air_of(link: Any) -> tuple[int, Air] | None:
        """``(key, replayed air)`` of ``link``'s cell (one :class:`Air` per real air), or None on a dedicated link."""
        real = getattr(link, "air", None)
        return None if real is None else (id(real), airs.setdefault(id(real), Air()))

    down_air = [air_of(node.downlink) for node in fnodes]
    up_air = [air_of(node.uplink) for node in fnodes]
    queue: list[tuple[float, int, str, Any]] = []
    order = itertools.count()

    def push(t: float, what: str, data: Any) -> None:
        """Queue an event at ``t`` seconds (ties in time broken by the order of queueing)."""
        heapq.heappush(queue, (t, next(order), what, data))

    def arm(key: int) -> None:
        """Queue the live timeout of air ``key`` (its generation marks it stale once rescheduled)."""
        air = airs[key]
        if air.fire < math.inf:
            push(air.fire, "fire", (key, air.gen))

    last: dict[int, float] = {} if busy is None else busy     # per air, when a replayed transfer last held it
    done_at: list[float | None] = [None] * len(nodes)
    arrivals: list[list[tuple[float, int]]] = [[] for _ in nodes]
    outcome: dict[int, tuple] = {}               # i -> (value, upload msg, extra, t2, t3)
    pending: dict[int, tuple] = {}               # i -> (value, msg, extra, t2): an upload in progress
    downloading: dict[int, tuple] = {}           # i -> (msg, extra): a download in progress
    stage = [0] * len(flat)                      # 0 download, 1 compute, 2 upload, 3 arrived, 4 cancelled
    touched: dict[tuple, Any] = {}
    instant = [now0]
    owner: list[Any] = [None]                    # the event being processed: ("fire", air) or ("event", number)

    def touch(what: tuple) -> None:
        """The event being processed touches a resource at this instant (with all it causes at once: a group's end
        cancelling its transfers); another event touching it at the same instant is an ambiguity -- but an air's fire
        that follows its own fire at one instant is not: the air's timeouts come one after the other."""
        by = owner[0]
        if what in touched and touched[what] != by:
            raise EngineError(f"{where}two events of the groups step at {instant[0]!r} s touch {what[0]} "
                              f"{what[1]}: their order is SimPy's insertion order, which the cells replay does not "
                              "model (run with the 'groups' backend disallowed)")
        touched[what] = by

    def start_upload(i: int, value: Any, t2: float) -> None:
        """Node ``i``'s upload starts at ``t2`` (its keyed uplink draw): onto its cell's air or its own link."""
        node = fnodes[i]
        msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits(value), round=rnd,
                      timing_key=timing_key)
        msg.sent_at = t2
        seconds, extra = sim.hop_draw(msg, node, "up")
        stage[i] = 2
        pending[i] = (value, msg, extra, t2)
        ua = up_air[i]
        if ua is None or seconds == 0.0:
            if seconds == 0.0:
                arrived(i, t2)
            else:
                push(t2 + seconds, "up", i)
            return
        touch(("air", ua[0]))
        ua[1].arrive(t2, seconds, i)
        arm(ua[0])

    def downloaded(i: int, t1: float) -> None:
        """Node ``i``'s download lands at ``t1``; it computes (keyed compute draw), then uploads."""
        msg, extra = downloading.pop(i)
        node = fnodes[i]
        sim.hop_done(msg, node, "down", extra, now0, t1)
        sim.deliver(msg, t1)
        node.state.received = msg.payload
        stage[i] = 1
        value, seconds = sim.compute_now(node, run, (node,), {}, None, rnd, timing_key=c_key)
        if seconds > 0:
            push(t1 + seconds, "computed", (i, value))
        else:
            start_upload(i, value, t1)

    def arrived(i: int, t3: float) -> None:
        """Node ``i``'s upload arrives at ``t3``; at its group's ``need``-th the group's other work is cancelled."""
        g, p = flat[i]
        touch(("group", g))
        value, msg, extra, t2 = pending.pop(i)
        outcome[i] = (value, msg, extra, t2, t3)
        stage[i] = 3
        arrivals[g].append((t3, i))
        if len(arrivals[g]) == need[g]:          # the server stops waiting: the group's other work is cancelled
            done_at[g] = t3
            for j, (h, _) in enumerate(flat):
                if h != g or stage[j] >= 3:
                    continue
                if stage[j] == 0 and down_air[j] is not None and downloading.get(j) is not None:
                    key, air = down_air[j]
                    if air.leave(t3, j):
                        touch(("air", key))
                        arm(key)
                        last[key] = t3
                elif stage[j] == 2 and up_air[j] is not None:
                    key, air = up_air[j]
                    if air.leave(t3, j):
                        touch(("air", key))
                        arm(key)
                        last[key] = t3
                pending.pop(j, None)
                downloading.pop(j, None)
                stage[j] = 4

    # every download starts now, in order (one vector of keyed draws)
    if download is not None:
        n_down = payload_size(download) if download_elements is None else int(download_elements)
        bits = wire.width(download, download_bits, download_kind, arg="download_bits", where=where)
        msgs = [Message(server.index, node.index, download_kind, download, n_down, bits, round=rnd,
                        timing_key=timing_key) for node in fnodes]
        secs, extras = transmission_times(
            msgs[0].bits, np.array([node.downlink.rate_bps for node in fnodes]), sim.overhead,
            np.array([node.downlink.loss for node in fnodes]), sim.packet_bits,
            sim.streams.uniforms(np.array([node.index for node in fnodes]),
                                 f"downlink:{timing_key}" if timing_key else "downlink", rnd))
        zero = []
        for i, (msg, sec, extra) in enumerate(zip(msgs, secs, extras)):
            msg.sent_at = now0
            downloading[i] = (msg, extra)
            da = down_air[i]
            if sec == 0.0 and da is not None:
                zero.append(i)
            elif da is None:
                push(now0 + sec, "down", i)
            else:
                da[1].arrive(now0, sec, i)
        for key in airs:
            arm(key)
        for i in zero:                           # a transfer of no airtime ends at once, in order
            downloaded(i, now0)
    else:
        for i in range(len(flat)):
            stage[i] = 1
            node = fnodes[i]
            value, seconds = sim.compute_now(node, run, (node,), {}, None, rnd, timing_key=c_key)
            if seconds > 0:
                push(now0 + seconds, "computed", (i, value))
            else:
                start_upload(i, value, now0)
    while queue:
        t, number, what, data = heapq.heappop(queue)
        if what == "fire":
            key, gen = data
            air = airs[key]
            if gen != air.gen:
                continue                         # rescheduled since
        if t != instant[0]:
            instant[0] = t
            touched.clear()
        owner[0] = ("fire", data[0]) if what == "fire" else ("event", number)
        if what == "fire":
            touch(("air", key))
            ended = air.fire_now()
            last[key] = t
            arm(key)
            for i in ended:                      # (a cancelled transfer has left the air)
                if stage[i] == 0:
                    downloaded(i, t)
                elif stage[i] == 2:
                    arrived(i, t)
        elif what == "down":
            if stage[data] == 0:
                downloaded(data, t)
        elif what == "computed":
            i, value = data
            if stage[i] == 1:
                start_upload(i, value, t)
        elif what == "up":
            if stage[data] == 2:
                arrived(data, t)
    for t3, i in sorted((t3, i) for g in range(len(nodes)) for t3, i in arrivals[g]):
        value, msg, extra, t2, _ = outcome[i]    # uploads land at the server in order of arrival
        sim.hop_done(msg, fnodes[i], "up", extra, t2, t3)
        sim.deliver(msg, t3)
    out = []
    for g, result in enumerate(results):
        if done_at[g] is None:
            raise EngineError(f"{where}group {g} of the groups step never had its {need[g]} arrivals in the cells "
                              "replay")
        got = [i for _, i in arrivals[g]]
        result.results = [(fnodes[i], outcome[i][0]) for i in got]
        result.surplus = []
        arrived_p = {flat[i][1] for i in got}
        result.cancelled = [node for p, node in enumerate(nodes[g]) if p not in arrived_p]
        out.append((result, (done_at[g],)))
    ends = sorted(t for t in done_at)
    if any(a == b for a, b in zip(ends, ends[1:])):
        raise EngineError(f"{where}two groups end at one time on shared cells: the order SimPy resumes them in is its "
                          "insertion order, which the cells replay does not model")
    return out
