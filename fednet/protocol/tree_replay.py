"""An aggregation tree's round without a SimPy process per device (:meth:`Primitives.tree_aggregate`).

CodedSecAgg's shares climb the inter-group tree of Schlegel et al., Sec. VI-D, eqs. (14)-(15) (Fig. 3): every
device downloads epsilon, computes its share (eq. 13), adds each child's running sum in the order of the tree's
steps, and sends the sum to its parent (relayed by the server: its uplink, then the parent's downlink), or, as a
root (the master group), to the server, which keeps the first ``k'`` roots to arrive. On the process path that is
a process per device and ~14 SimPy events a device-epoch (issue 12: ~6,000 device-epochs/s at D = 1000, N = 8).

:func:`replay_tree` computes the same round arithmetically, in two passes:

1. **Times.** Node by node, children before parents, with the keyed draws *looked at* (not taken,
   :meth:`fednet.sim.rng.Streams.uniforms` with ``advance=False`` and ``ahead``): the download ends at
   ``now + s``; the own computation starts when the download lands; a child's sum is added from
   ``max(end of the previous addition, its arrival)``; a parent's downlink serves the model download, then its
   children's messages first come, first served (a message starts at ``max(request, end of the one before)``).
   Every time is the float sum SimPy's ``now + delay`` gives. Each key's draws are taken in the order the
   process path takes them: a node's own computation before its additions, a parent's download before its
   children's messages, those in the order its downlink grants them.
2. **Effects.** The server stops at the ``k'``-th root arrival ``t_k``: every stage that started before
   ``t_k`` took its draw and (computations) counted its MACs, every hop that ended before it counted its bits,
   and every download that landed set the device's ``received``; the streams are advanced and the counters
   charged accordingly.

Keyed draws are counter-based, so the order in which different keys are consumed does not matter; what could
depend on SimPy's order of simultaneous events is handled by refusing (returning None, nothing changed): two
root arrivals at one instant up to the ``(k'+1)``-th, any other event at exactly ``t_k``, two children's
messages requesting one downlink at one instant. Also refused: compute models other than
:class:`~fednet.sim.compute.ShiftedExponential` / :class:`~fednet.sim.compute.Deterministic`, overridden
keyed draws, messages kept in views (``record_views``), direct device-to-device links. Equality with the process
path, bit for bit (trace, keyed-draw counters, counters): ``tests/test_tree_replay.py`` and
``tests/test_study_modes.py`` (the switch :data:`fednet.protocol.primitives.TREE_REPLAY`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.network import Message, transmission_time

__all__ = ["replay_tree"]


def _shape(tree: nx.DiGraph, cache: dict) -> tuple[list[int], dict[int, list[int]], dict[int, int | None]]:
    """The tree's nodes children first, each node's children in step order, each node's parent (kept per tree)."""
    key = (id(tree), tree.number_of_nodes(), tree.number_of_edges())
    got = cache.get(key)
    if got is None or got[0] is not tree:
        order = list(nx.topological_sort(tree))
        kids = {v: sorted(tree.predecessors(v), key=lambda u, v=v: tree.edges[u, v].get("step", 0)) for v in tree}
        parent = {v: next(iter(tree.successors(v)), None) for v in tree}
        got = cache[key] = (tree, order, kids, parent)
    return got[1], got[2], got[3]


def replay_tree(prims: Any, tree: nx.DiGraph, taking_part: Sequence[int], need: int, download: Any,
                download_kind: str, download_bits: int | None, values: Sequence[Any], node_macs: Sequence[int],
                add: Callable[[Any, Any], Any], kind: str, root_kind: str, n_elements: int | None,
                element_bits: int | None, payload_size: Callable[[Any], int]
                ) -> tuple[float, list[tuple[Any, Any]], list[Any]] | None:
    """The round of :meth:`Primitives.tree_aggregate` over complete subtrees, without processes (module docstring).

    Parameters
    ----------
    prims : Primitives
        The protocol (its simulation, ``element_bits``, tree cache).
    tree : networkx.DiGraph
        The forest (edges child -> parent, ``step`` ordering a parent's children).
    taking_part : sequence of int
        The devices of the complete subtrees, in the tree's node order.
    need : int
        Root arrivals the server waits for, ``1 <= need <=`` the number of roots taking part.
    download, download_kind, download_bits
        As :meth:`~Primitives.tree_aggregate`'s (``download`` None: no download).
    values, node_macs : sequences, one per node of ``taking_part``
        Every node's own part and its MACs (from the step's batch).
    add : callable(acc, part)
        The metered combine (run here for every addition; its MACs time it).
    kind, root_kind, n_elements, element_bits
        As :meth:`~Primitives.tree_aggregate`'s.
    payload_size : callable
        Numbers on the wire of a payload (:func:`fednet.protocol.primitives.payload_size`).

    Returns
    -------
    (t_k, arrived, cancelled) or None
        The time the server stops waiting (simulated seconds), the first ``need`` ``(root node, aggregate)``
        in order of arrival, the roots still on their way (in ``taking_part`` order); None, with nothing
        changed, where SimPy's order of simultaneous events would decide (module docstring).
    """
    sim = prims.sim
    devs, rnd, streams, counters = sim.devices, sim.round, sim.streams, sim.counters
    now0 = sim.env.now
    order_all, kids_all, parent = _shape(tree, prims.__dict__.setdefault("_tree_shapes", {}))
    member = set(taking_part)
    pos = {v: p for p, v in enumerate(taking_part)}
    for v in taking_part:
        if type(devs[v].compute_model) not in (ShiftedExponential, Deterministic):
            return None
    idx = np.asarray(taking_part, dtype=np.intp)
    kids = {v: [u for u in kids_all[v] if u in member] for v in taking_part}
    n_kids = max(len(k) for k in kids.values())
    first_child = 0 if download is None else 1                # a parent's download draws its downlink first
    u_down = [streams.uniforms(idx, "downlink", rnd, advance=False, ahead=a) for a in range(first_child + n_kids)]
    u_comp = [streams.uniforms(idx, "compute", rnd, advance=False, ahead=a) for a in range(1 + n_kids)]
    u_up = streams.uniforms(idx, "uplink", rnd, advance=False)
    overhead, packet_bits, bits_of = sim.overhead, sim.packet_bits, {}

    def msg_bits(payload: Any, kind_: str, n: int | None, width: int | None) -> int:
        """Bits of a message, as :class:`~fednet.sim.network.Message` counts them (validated once per size)."""
        size = payload_size(payload) if n is None else int(n)
        if (size, width) not in bits_of:
            bits_of[(size, width)] = Message(0, 1, kind_, None, size, width or prims.element_bits).bits
        return bits_of[(size, width)]

    down_bits = None if download is None else msg_bits(download, download_kind, None, download_bits)
    t1: dict[int, float] = {}
    acc: dict[int, Any] = {}
    e_up: dict[int, float] = {}                # inner node: end of its message's up hop (its parent's request)
    arrive: dict[int, float] = {}              # inner node: its message delivered to the parent; root: at the server
    computes: dict[int, list[tuple[float, int, bool]]] = {}   # (start, MACs, drew) in program order
    hops: list[tuple[int, float, float, int, int, bool]] = []  # (device, start, end, bits, extra, up?)
    down_extra: dict[int, int] = {}
    granted: dict[int, list[float]] = {}       # the children's messages' starts on each parent's downlink
    times: list[float] = []

    for v in order_all:
        if v not in member:
            continue
        p, node = pos[v], devs[v]
        down, up = node.downlink, node.uplink
        if download is not None:
            secs, _, extra = transmission_time(down_bits, down.rate_bps, overhead, down.loss, packet_bits,
                                               float(u_down[0][p]))
            t = now0 + secs
            down_extra[v] = extra
        else:
            t = now0
        t1[v] = t
        times.append(t)
        free = t if download is not None else now0            # the downlink after the download
        reqs = sorted((e_up[u], u) for u in kids[v])          # the children's messages, first come first served
        if any(a[0] == b[0] for a, b in zip(reqs[:-1], reqs[1:])):
            return None                                       # simultaneous requests: SimPy's order decides
        starts = []
        for k, (r, u) in enumerate(reqs):
            g = r if r > free else free
            bits = msg_bits(acc[u], kind, n_elements, element_bits)
            secs, _, extra = transmission_time(bits, down.rate_bps, overhead, down.loss, packet_bits,
                                               float(u_down[first_child + k][p]))
            free = arrive[u] = g + secs
            hops.append((v, g, free, bits, extra, False))
            starts.append(g)
            times += (g, free)
        granted[v] = starts
        steps: list[tuple[float, int, bool]] = []
        model, rate = node.compute_model, node.mac_rate

        def timed(start: float, macs: int, c: int) -> float:
            """A computation of ``macs`` from ``start`` with the node's ``c``-th compute draw; its end."""
            drew = []

            def draw() -> float:
                drew.append(True)
                return -math.log1p(-float(u_comp[c][p]))
            secs = model.duration(v, rnd, macs, rate, draw)
            steps.append((start, macs, bool(drew)))
            end = start + secs if secs > 0 else start
            times.append(end)
            return end

        t = timed(t, int(node_macs[p]), 0)
        value = values[p]
        for c, u in enumerate(kids[v], start=1):
            a = arrive[u]
            start = a if a > t else t
            times.append(start)
            with MacMeter() as meter:
                value = add(value, acc[u])
            t = timed(start, meter.macs, c)
        acc[v], computes[v] = value, steps
        bits = msg_bits(value, kind if parent[v] is not None else root_kind, n_elements, element_bits)
        secs, _, extra = transmission_time(bits, up.rate_bps, overhead, up.loss, packet_bits, float(u_up[p]))
        end = t + secs
        hops.append((v, t, end, bits, extra, True))
        if parent[v] is None:
            arrive[v] = end
        else:
            e_up[v] = end
        times.append(end)

    roots = [v for v in taking_part if parent[v] is None]
    arrivals = sorted((arrive[v], pos[v], v) for v in roots)
    head = [a for a, *_ in arrivals[:need + 1]]
    if any(a == b for a, b in zip(head[:-1], head[1:])):
        return None                                           # simultaneous arrivals: SimPy's order decides
    tk = arrivals[need - 1][0]
    if not tk > now0 or int((np.asarray(times) == tk).sum()) != 1:
        return None                                           # another event at the cut: SimPy's order decides

    # -- nothing changed so far; from here on, the step happens --------------------------------------------------
    by_down = np.array([(0 if download is None else 1) + sum(g < tk for g in granted[v]) for v in taking_part])
    by_comp = np.array([sum(s < tk and drew for s, _, drew in computes[v]) for v in taking_part])
    up_start = {v: s for v, s, _e, _b, _x, is_up in hops if is_up}
    sent = np.array([up_start[v] < tk for v in taking_part])
    for purpose, by in (("downlink", by_down), ("compute", by_comp), ("uplink", sent.astype(np.int64))):
        took = by > 0
        streams.advance(idx[took], purpose, rnd, by[took])
    counters.device_macs += sum(m for v in taking_part for s, m, _ in computes[v] if s < tk)
    if download is not None:
        for v in taking_part:
            if t1[v] < tk:
                counters.bits_down += down_bits
                counters.messages += 1
                counters.retransmissions += down_extra[v]
                devs[v].state.received = download
    for v, _start, end, bits, extra, is_up in hops:
        if end < tk or (end == tk and is_up and parent[v] is None):
            if is_up:
                counters.bits_up += bits
            else:
                counters.bits_down += bits
            counters.messages += 1
            counters.retransmissions += extra
    arrived = [(devs[v], acc[v]) for _, _, v in arrivals[:need]]
    got = {v for _, _, v in arrivals[:need]}
    return tk, arrived, [devs[v] for v in roots if v not in got]
