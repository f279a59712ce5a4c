"""The ``gather`` and ``batched`` backends: a download-compute-upload step without a process per node.

:class:`GatherReplay` stands for :func:`fednet.sim.engine.reference.gather` (and for an edgeless tree,
:class:`fednet.sim.engine.backends.tree.EdgelessTree`) where no other process can act during the step: the nodes' events
are replayed in SimPy's order (:func:`fast_rounds`), with a batch of every node's values and vectorised times where the
step gives one (:func:`replay_vectorised`, the ``batched`` backend).  The same draws, counters, messages, views and
results, bit for bit (``tests/test_fast_path.py``, ``tests/test_batched.py``, ``tests/test_engine_property.py``).
On shared round-robin cells the vectorised replay takes each transfer's end from its cell's replayed air
(:mod:`.airtime`; :func:`cells_reason` says when it can, ``tests/test_cells_replay.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter, charge
from fednet.sim.compute import compute_seconds
from fednet.sim.network import Message, transmission_times
from fednet.sim.simulation import Node

from .. import wire
from ..events import draws_plain, event_at, fast_reason
from ..results import Batch, GatherResult, StragglerShortfall, UnchargedCompute, compute_key, payload_size
from ..step import Backend, Declined, Step
from .airtime import cells_air_reason, shared_finishes

__all__ = ["GatherReplay", "fast_rounds", "replay_start", "run_batch", "replay_vectorised"]


class GatherReplay(Backend):
    """A gather replayed without a process per node (module docstring)."""

    name = "gather"
    kind = "gather"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        if step.deadline is not None:
            return "the step has a deadline"
        if not step.cancel:
            return "cancel=False (the late nodes' work goes on beside the caller)"
        if step.wait is not None:
            return "the nodes wait for an event (wait=...)"
        if net.sim.cells:
            ok = fast_reason(net, step.nodes, cells=True)
            return ok if ok is not True else cells_reason(net, step)
        return fast_reason(net, step.nodes)

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        return (yield from fast_rounds(net, step.nodes, step.first, step.absent, step.download, step.download_kind,
                                       step.download_elements, step.download_bits, step.run, step.macs, step.kind_of,
                                       step.size_of, step.upload_bits, timing_key=step.timing_key,
                                       batch=step.batch, charged=step.charged, step=step.name))


def cells_reason(net: Any, step: Step) -> bool | str:
    """``True`` if the vectorised gather can replay ``step`` on a network with shared cells
    (:mod:`fednet.sim.engine.backends.airtime`), else the reason: it needs the step's batch (the node-by-node replay
    assumes dedicated links) and every node's cell idle and round robin.  A first-k step is replayed too: the
    transfers cancelled at the ``k``-th arrival leave the air then (:meth:`fednet.sim.cells.SharedAir.transmit`), after
    every awaited one has ended, so the awaited ones' times are those of all the step's transfers sharing the air
    (processor sharing is causal: a later arrival or departure changes no earlier finish)."""
    if step.batch is None or not net.sim.engine.allows("batched"):
        return ("shared cells are replayed by the vectorised (batched) gather only, and this step has no batch or "
                "the batched backend is not allowed")
    return cells_air_reason(step.nodes)


def _through_cells(nodes: Sequence[Node], direction: str, starts: np.ndarray, airtimes: np.ndarray,
                   ends: np.ndarray) -> np.ndarray | None:
    """``ends`` (each transfer on its dedicated link: ``starts + airtimes``) with the transfers that share a cell's
    air (``direction``: ``"downlink"`` or ``"uplink"``) ending as :func:`~.airtime.shared_finishes` says; None where
    it cannot decide."""
    cells: dict[int, list[int]] = {}
    for p, node in enumerate(nodes):
        air = getattr(getattr(node, direction), "air", None)
        if air is not None:
            cells.setdefault(id(air), []).append(p)
    if not cells:
        return ends
    ends = np.array(ends, dtype=np.float64)
    for members in cells.values():
        P = np.array(members, dtype=np.intp)
        got = shared_finishes(starts[P], airtimes[P])
        if got is None:
            return None
        ends[P] = got
    return ends


def replay_start(net, nodes: Sequence[Node], roots: Sequence[Any], download: Any, download_kind: str,
                  download_elements: int | None, download_bits: Any, upload_bits: Any,
                  timing_key: str, kind: str) -> tuple[list, list, Callable[[Any], int], str, str]:
    """The start of a replayed download-compute-upload step (:func:`fast_rounds`,
    :func:`fednet.sim.engine.backends.groups.fast_groups`).

    Every download starts now, with one vector of keyed draws.  ``roots[p]`` is the key of node ``p``'s
    process start (``(now, 0, rank)``).  Returns ``down`` (per node ``(msg, extra, t1, key of the download's
    end)``, or None without a download), ``start_key`` (per node, the key of its processor request), the upload
    element width (a function of the value, :func:`fednet.sim.engine.wire.widths`) and the upload and compute draw
    purposes (``"uplink[:key]"``, ``"compute-<key>"``).
    """
    sim = net.sim
    now0 = sim.env.now
    up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"   # as Simulation.hop_draw
    where = f"{net.label}: "
    up_bits = wire.widths(upload_bits, kind, arg="upload_bits", where=where)
    if download is None:
        return ([None] * len(nodes), [(now0, 1, root) for root in roots], up_bits, up_purpose,
                compute_key(timing_key))
    n_down = payload_size(download) if download_elements is None else int(download_elements)
    bits = wire.width(download, download_bits, download_kind, arg="download_bits", where=where)
    msgs = [Message(sim.server.index, node.index, download_kind, download, n_down,
                    bits, round=sim.round, timing_key=timing_key) for node in nodes]
    secs, extras = transmission_times(
        msgs[0].bits, np.array([node.downlink.rate_bps for node in nodes]), sim.overhead,
        np.array([node.downlink.loss for node in nodes]), sim.packet_bits,
        sim.streams.uniforms(np.array([node.index for node in nodes]),
                             f"downlink:{timing_key}" if timing_key else "downlink", sim.round))
    down, start_key = [], []
    for msg, sec, extra, root in zip(msgs, secs, extras, roots):
        msg.sent_at = float(now0)
        t1 = now0 + sec
        k_end = (t1, 1, (now0, 1, root))
        down.append((msg, extra, t1, k_end))
        start_key.append((t1, 1, k_end))
    return down, start_key, up_bits, up_purpose, compute_key(timing_key)

def fast_rounds(net, nodes: list[Node], first: int | None, absent: list[Node], download: Any,
                 download_kind: str, download_elements: int | None, download_bits: int | None,
                 run: Callable[..., Any] | None, macs: Callable[[Node], int] | None, kind: str,
                 size_of: Callable[[Any], int], upload_bits: int | None, *,
                 timing_key: str = "", batch: Batch | None = None, charged: bool = True,
                 step: str = "", step_kind: str = "gather") -> Generator:
    """:meth:`first_k` over :meth:`gather`'s per-node work, computed without per-device processes.

    Each node's events (download request and end, processor request and end, upload request and
    end) are replayed arithmetically in the order SimPy would process them: an event's place is
    ``(time, priority, place of the event that scheduled it)`` -- SimPy orders events by time,
    priority and insertion, and an event is inserted while its parent is processed -- so nested
    tuples compare exactly as SimPy's heap does. Times are the same float sums (``now + delay``),
    the keyed draws are drawn for the same stages (a node cancelled before its upload starts draws
    no upload), ``fn`` runs at its place, and the caller resumes at the ``k``-th arrival with one
    event. ``timing_key`` names the draws as :meth:`gather`'s (``"downlink:<key>"``,
    ``"compute-<key>"``, ``"uplink:<key>"``; the shared ones for ``""``). Used only when
    :class:`GatherReplay` can run.

    With a ``batch`` (and the ``batched`` backend allowed), every node's value comes from one batched call and the
    step is replayed with vectorised draws (:func:`replay_vectorised`); where that cannot decide
    SimPy's order from the times alone (exact ties) the values feed the node-by-node replay below.
    ``charged``: a node whose step metered no MAC raises :class:`UnchargedCompute` (``step`` names it).
    """
    sim, env = net.sim, net.sim.env
    n_counted = len(nodes)
    need = n_counted if first is None else int(first)
    result = GatherResult(dropped=list(absent))
    if need > n_counted:
        net._note_failures(result)
        raise StragglerShortfall(f"{net.label}: round {net.epoch} needs {need} results but only "
                                 f"{n_counted} devices are available")
    if need == 0 or not n_counted:
        net._note_failures(result)
        return result
    batched = batch is not None and sim.engine.allows("batched")
    if sim.cells and not batched:                      # GatherReplay.can_run: cells_reason
        return Declined("shared cells are replayed by the vectorised (batched) gather only")
    if batch is not None and not batched and sim.engine.record_paths:
        sim.engine_paths.decline(step_kind, step, "batched: not allowed by the engine configuration")
    if batched:
        values, node_macs = run_batch(net, batch, nodes, download, charged, step)
        done = replay_vectorised(net, nodes, need, result, download, download_kind, download_elements,
                                 download_bits, values, node_macs, macs, kind, size_of, upload_bits,
                                 timing_key)
        if sim.engine.record_paths:
            if isinstance(done, str):
                sim.engine_paths.decline(step_kind, step, f"batched: {done}")
            else:
                sim.engine_paths.record(step_kind, step, "batched")
        if not isinstance(done, str):
            yield event_at(env, done)
            net._note_failures(result)
            return result
        if sim.cells:                                  # the node-by-node replay below assumes dedicated links
            return Declined(f"batched on shared cells: {done}")
        position = {id(node): p for p, node in enumerate(nodes)}

        def run(node: Node) -> Any:
            """The batched value of ``node``, charging its MACs."""
            p = position[id(node)]
            charge(node_macs[p])
            return values[p]
    now0 = env.now
    t0 = float(now0)
    rnd = sim.round
    server = sim.server
    down, start_key, up_bits, up_purpose, c_key = replay_start(net, 
        nodes, [(now0, 0, p) for p in range(n_counted)], download, download_kind, download_elements,
        download_bits, upload_bits, timing_key, kind)
    outcome: dict[int, tuple] = {}             # p -> (value, upload msg, extra, t2, t3, key of arrival)

    def land_download(p: int) -> None:
        """Fast path: the download of device ``p`` lands (its payload is set)."""
        if down[p] is None:
            return
        msg, extra, t1, _ = down[p]
        node = nodes[p]
        sim.hop_done(msg, node, "down", extra, t0, float(t1))
        sim.deliver(msg, float(t1))
        node.state.received = msg.payload
        down[p] = None

    def start_compute(p: int) -> tuple:
        """Fast path: device ``p`` computes; returns its value and compute time."""
        node = nodes[p]
        land_download(p)
        k_req = start_key[p]
        t1 = k_req[0]
        value, seconds = sim.compute_now(node, run, (node,), {}, None if macs is None else macs(node), rnd,
                                         timing_key=c_key)
        if seconds > 0:
            t2 = t1 + seconds
            return value, t2, (t2, 1, (t2, 1, k_req))
        return value, t1, (t1, 1, k_req)

    def start_upload(p: int, value: Any, t2: Any) -> tuple:
        """Fast path: device ``p`` starts its upload; returns its arrival record."""
        node = nodes[p]
        msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits(value), round=rnd,
                      timing_key=timing_key)
        msg.sent_at = float(t2)
        seconds, extra = sim.hop_draw(msg, node, "up")
        return msg, extra, t2 + seconds

    arrivals: list[tuple] = []                # (key of arrival, p)
    if need >= n_counted:                      # everyone is waited for: no cancellation
        started = []
        for p in sorted(range(n_counted), key=start_key.__getitem__):
            value, t2, k_up = start_compute(p)
            node = nodes[p]
            msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits(value), round=rnd,
                          timing_key=timing_key)
            msg.sent_at = float(t2)
            started.append((p, value, t2, k_up, msg))
        order = [nodes[p] for p, *_ in started]        # every upload starts: one vector of keyed draws
        secs, extras = transmission_times(
            np.array([m.bits for *_, m in started], dtype=np.int64), np.array([n.uplink.rate_bps for n in order]),
            sim.overhead, np.array([n.uplink.loss for n in order]), sim.packet_bits,
            sim.streams.uniforms(np.array([n.index for n in order]), up_purpose, rnd))
        for (p, value, t2, k_up, msg), seconds, extra in zip(started, secs, extras):
            t3 = t2 + seconds
            outcome[p] = (value, msg, extra, t2, t3)
            arrivals.append(((t3, 1, k_up), p))
        arrivals.sort()
        done_key = None
    else:                                      # SimPy's order over the three stage events, until done
        heap = [(start_key[p], p, 0) for p in range(n_counted)]
        heapq.heapify(heap)
        pending: dict[int, tuple] = {}
        done_key = None
        while heap:
            key, p, stage = heap[0]
            if done_key is not None and not key < done_key:
                break
            heapq.heappop(heap)
            if stage == 0:
                value, t2, k_up = start_compute(p)
                pending[p] = (value, t2)
                heapq.heappush(heap, (k_up, p, 1))
            elif stage == 1:
                value, t2 = pending.pop(p)
                msg, extra, t3 = start_upload(p, value, t2)
                outcome[p] = (value, msg, extra, t2, t3)
                heapq.heappush(heap, ((t3, 1, key), p, 2))
            else:
                arrivals.append((key, p))
                if len(arrivals) == need:
                    done_key = (key[0], 1, key)
    for k_arr, p in arrivals:                  # uploads land in order of arrival
        value, msg, extra, t2, t3 = outcome[p]
        sim.hop_done(msg, nodes[p], "up", extra, float(t2), float(t3))
        sim.deliver(msg, float(t3))
    for p in range(n_counted):                 # downloads that ended before the server stopped waiting
        if down[p] is not None and (done_key is None or down[p][3] < done_key):
            land_download(p)
    arrived = [(nodes[p], outcome[p][0]) for _, p in arrivals]
    result.results, result.surplus = arrived[:need], arrived[need:]
    got = {p for _, p in arrivals}
    result.cancelled = [node for p, node in enumerate(nodes) if p not in got]
    tc = arrivals[need - 1][0][0]
    yield event_at(env, tc)
    net._note_failures(result)
    return result


def run_batch(net, batch: Batch, nodes: list[Node], received: Any, charged: bool,
               step: str) -> tuple[Sequence[Any], list[int]]:
    """Run ``batch`` over ``nodes`` under a meter; check its count and each node's charge.

    Raises
    ------
    ValueError
        If ``batch`` returns other than one value and one MAC count per node.
    AssertionError
        If the batched kernels metered other than the sum of the nodes' counts.
    UnchargedCompute
        If ``charged`` and a node was charged no MAC.
    """
    with MacMeter() as meter:
        values, node_macs = batch(nodes, received)
    node_macs = [int(m) for m in node_macs]
    if len(values) != len(nodes) or len(node_macs) != len(nodes):
        raise ValueError(f"{net.label}: the batch of step {step!r} returned {len(values)} values and "
                         f"{len(node_macs)} MAC counts for {len(nodes)} nodes")
    if meter.macs != sum(node_macs):
        raise AssertionError(f"{net.label}: the batch of step {step!r} metered {meter.macs} MACs but charged "
                             f"its nodes {sum(node_macs)}")
    if charged and min(node_macs) == 0:
        raise UnchargedCompute(f"{net.label}: step {step!r} charged 0 MACs to a node; compute with metered "
                               f"kernels (fednet.algebra.meter) or pass free=True")
    return values, node_macs

def replay_vectorised(net, nodes: list[Node], need: int, result: GatherResult, download: Any,
                       download_kind: str, download_elements: int | None, download_bits: int | None,
                       values: Sequence[Any], node_macs: list[int], macs: Callable[[Node], int] | None,
                       kind: str, size_of: Callable[[Any], int], upload_bits: int | None,
                       timing_key: str) -> float | str:
    """:func:`fast_rounds` with every node's times as vectors; returns the resume time, or why not (untouched).

    Each node's download end ``t1``, compute end ``t2`` and upload end ``t3`` are computed from its
    keyed draws, looked at without consuming them (:meth:`fednet.sim.rng.Streams.uniforms` with
    ``advance=False``). An event of a node is processed in SimPy iff its key is below the key at which
    the server stops waiting, the ``need``-th arrival at ``tk``; without exact ties at ``tk`` (and
    among the arrival times) that is ``t < tk``, so the draws of the stages that ran are consumed,
    the counters charged and the messages filed as :func:`fast_rounds` does, arrivals in order of
    ``t3``. Returns the reason, having changed nothing, where a tie, a compute model other than
    :class:`~fednet.sim.compute.ShiftedExponential` / :class:`~fednet.sim.compute.Deterministic`
    or the server among ``nodes`` needs the node-by-node replay, as does a ``Streams`` whose draws are
    overridden (an override sees each draw as it is taken).
    """
    sim, env = net.sim, net.sim.env
    n = len(nodes)
    if not draws_plain(sim.streams):
        return "the keyed draws are overridden (an override must see each draw as it is drawn)"
    # (index, downlink rate, loss, uplink rate, loss, MAC rate, setup fraction or -1) of each node
    table = sim.node_table(nodes)
    if table is None:
        return "a node is the server or has a compute model other than shifted-exponential or deterministic"
    now0 = env.now
    t0 = float(now0)
    rnd = sim.round
    streams = sim.streams
    idx = table[:, 0].astype(np.intp)
    where = f"{net.label}: "
    up_bits = wire.widths(upload_bits, kind, arg="upload_bits", where=where)
    c_key = compute_key(timing_key)
    down_purpose = f"downlink:{timing_key}" if timing_key else "downlink"
    up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"
    if download is not None:                               # every download starts now
        bits = wire.width(download, download_bits, download_kind, arg="download_bits", where=where)
        n_down = payload_size(download) if download_elements is None else int(download_elements)
        probe = Message(sim.server.index, nodes[0].index, download_kind, download, n_down, bits,
                        round=rnd, timing_key=timing_key)          # validates the sizes as every message does
        u_down = streams.uniforms(idx, down_purpose, rnd, advance=False)
        secs_d, extra_d = transmission_times(
            probe.bits, table[:, 1], sim.overhead, table[:, 2], sim.packet_bits, u_down, arrays=True)
        t1 = now0 + secs_d
        if sim.cells:
            t1 = _through_cells(nodes, "downlink", np.full(n, float(now0)), secs_d, t1)
            if t1 is None:
                return "a download asks for its cell's air as the air's timeout fires (SimPy's order decides)"
    else:
        t1 = np.full(n, now0, dtype=float)
    totals = node_macs if macs is None else [m + int(macs(node)) for m, node in zip(node_macs, nodes)]
    work = np.array(totals, dtype=float)                   # as Python's int / float divides
    rates = table[:, 5]
    seconds, shifted = compute_seconds(work, rates, table[:, 6],
                                       lambda at: streams.uniforms(idx[at], c_key, rnd, advance=False))
    t2 = np.where(seconds > 0, t1 + seconds, t1)
    if getattr(size_of, "by_shape", False) and (isinstance(values, np.ndarray) or
                                                all(v is values[0] for v in values)):
        sizes = [int(size_of(values[0]))] * n              # one shape (a stack, or one stand-in for all)
    else:
        sizes = [int(size_of(v)) for v in values]
    if min(sizes) < 0:
        return "an upload of negative size (the node-by-node replay raises Message's error)"
    if up_bits.constant is not None or isinstance(values, np.ndarray):    # one width for every upload: resolved once
        width = up_bits.constant or up_bits(values[0])
        widths = None
        bits_up = np.array(sizes, dtype=np.int64) * int(width)
    else:
        widths = [up_bits(v) for v in values]
        bits_up = np.array(sizes, dtype=np.int64) * np.array(widths, dtype=np.int64)
    u_up = streams.uniforms(idx, up_purpose, rnd, advance=False)
    secs_u, extra_u = transmission_times(
        bits_up, table[:, 3], sim.overhead, table[:, 4], sim.packet_bits, u_up, arrays=True)
    t3 = t2 + secs_u
    if sim.cells:
        t3 = _through_cells(nodes, "uplink", t2, secs_u, t3)
        if t3 is None:
            return "an upload asks for its cell's air as the air's timeout fires (SimPy's order decides)"
    order = np.argsort(t3, kind="stable")
    t3_sorted = t3[order]
    if n > 1 and not (np.diff(t3_sorted) > 0).all():
        return "tied arrival times (SimPy's insertion order decides: replayed node by node)"
    tk = t3_sorted[need - 1]
    if need < n:
        if int((t1 == tk).sum() + (t2 == tk).sum()) or (download is None and now0 == tk):
            return "a stage starts at the last awaited arrival (the full keys decide: replayed node by node)"
        started = t1 < tk                                    # processor request (and download landed)
        uploading = t2 < tk
        arrived = order[:need]
    else:
        started = uploading = np.ones(n, dtype=bool)
        arrived = order
    # -- nothing changed so far; from here on, the step happens --------------------------------
    counters = sim.counters
    record = sim.record_views
    landed = started if download is not None else np.zeros(n, dtype=bool)
    if download is not None:
        streams.advance(idx, down_purpose, rnd)           # every download started
        n_landed = int(landed.sum())
        counters.bits_down += probe.bits * n_landed
        counters.messages += n_landed
        counters.retransmissions += int(extra_d[landed].sum())
        for p in np.flatnonzero(landed).tolist():
            node = nodes[p]
            if record:
                msg = Message(sim.server.index, node.index, download_kind, download, n_down, bits,
                              round=rnd, timing_key=timing_key)
                msg.sent_at = t0
                end = float(t1[p])
                msg.hops.append(("down", node.index, t0, end))
                sim.deliver(msg, end)
            node.state.received = download
    drew = started & shifted
    streams.advance(idx[drew], c_key, rnd)
    counters.device_macs += sum(totals[p] for p in np.flatnonzero(started).tolist())
    streams.advance(idx[uploading], up_purpose, rnd)
    arrived_l = arrived.tolist()
    counters.bits_up += int(bits_up[arrived].sum())
    counters.messages += len(arrived_l)
    counters.retransmissions += int(extra_u[arrived].sum())
    if record:
        for p in arrived_l:
            node = nodes[p]
            msg = Message(node.index, sim.server.index, kind, values[p], sizes[p],
                          width if widths is None else widths[p], round=rnd,
                          timing_key=timing_key)
            start, end = float(t2[p]), float(t3[p])
            msg.sent_at = start
            msg.hops.append(("up", node.index, start, end))
            sim.deliver(msg, end)
    result._arrived(nodes, values, arrived_l, idx[arrived].tolist())
    if isinstance(values, np.ndarray):
        result.stack_rows = (values, arrived)           # GatherResult.stacked copies it on first use
    got = np.zeros(n, dtype=bool)
    got[arrived] = True
    result.cancelled = [nodes[p] for p in np.flatnonzero(~got).tolist()]
    return float(tk)
