"""The ``tree`` backends: an aggregation tree's round without a SimPy process per device.

:class:`EdgelessTree` (the ``gather`` backend) runs a tree without edges as a gather; :class:`TreeReplay` (the
``tree`` backend) replays a tree with edges, as follows.

CodedSecAgg's shares climb the inter-group tree of Schlegel et al., Sec. VI-D, eqs. (14)-(15) (Fig. 3): every
device downloads epsilon, computes its share (eq. 13), adds each child's running sum in the order of the tree's
steps, and sends the sum to its parent (relayed by the server: its uplink, then the parent's downlink), or, as a
root (the master group), to the server, which keeps the first ``k'`` roots to arrive. On the process path that is
a process per device and ~14 SimPy events a device-epoch (issue 12: 6,000-10,000 device-epochs/s at D = 1000,
N = 8; replayed: ~100,000).

:func:`replay_tree` computes the same round arithmetically, in two passes:

1. **Times.** Level by level (a node's height above its deepest leaf), every node of a level at once as
   arrays, with the keyed draws *looked at* (not taken,
   :meth:`fednet.sim.rng.Streams.uniforms` with ``advance=False`` and ``ahead``): the download ends at
   ``now + s``; the own computation starts when the download lands; a child's sum is added from
   ``max(end of the previous addition, its arrival)``; a parent's downlink serves the model download, then its
   children's messages first come, first served (a message starts at ``max(request, end of the one before)``).
   Every time is the float sum SimPy's ``now + delay`` gives, and every duration the float operations of the
   compute models and :func:`~fednet.sim.network.transmission_time`. Each key's draws are taken in the order the
   process path takes them: a node's own computation before its additions, a parent's download before its
   children's messages, those in the order its downlink grants them.
2. **Effects.** The server stops at the ``k'``-th root arrival ``t_k``: every stage that started before
   ``t_k`` took its draw and (computations) counted its MACs, every hop that ended before it counted its bits,
   and every download that landed set the device's ``received``; the streams are advanced and the counters
   charged accordingly.

Keyed draws are counter-based, so the order in which different keys are consumed does not matter; what could
depend on SimPy's order of simultaneous events is handled by declining (returning the reason, nothing changed): two
root arrivals at one instant up to the ``(k'+1)``-th, any other event at exactly ``t_k``, two children's
messages requesting one downlink at one instant. Also refused: compute models other than
:class:`~fednet.sim.compute.ShiftedExponential` / :class:`~fednet.sim.compute.Deterministic`, overridden
keyed draws, messages kept in views (``record_views``), direct device-to-device links, message sizes left to the
payloads (``n_elements`` None). The additions run pair by pair through the metered combine, or, given a
``combine_batch`` (CodedSecAgg's timing mode), one call a level and child place. Equality with the process
path, bit for bit (trace, keyed-draw counters, counters): ``tests/test_tree_replay.py`` and
``tests/test_study_modes.py`` and ``tests/test_engine_property.py``.

Shared cells: on a network whose devices share round-robin cells' airtime (:mod:`fednet.sim.cells`) the ``tree``
backend runs :func:`~.tree_cells.replay_tree_cells` instead, an event loop over the nodes' stages and the cells' airs
with the same principle (draws looked at, declined before any effect where SimPy's order would decide); busy or
proportional-fair cells are declined (:func:`~.tree_cells.tree_cells_reason`).

Views: with ``record_views`` the replay declines (recorded in the run's engine paths, ``--explain-engine``) and the
reference runs: a node's view lists its messages in SimPy's delivery order, which the level-by-level pass does not
establish.  Study runs keep no views (``Simulation(record_views=False)``), so they replay.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter, charge
from fednet.sim.compute import compute_seconds
from fednet.sim.network import Message, transmission_times
from fednet.sim.simulation import Node

from .. import wire
from ..events import draws_plain, event_at, fast_reason
from ..results import GatherResult, payload_size, uploaded_elements
from ..step import Backend, Declined, Step
from .gather import fast_rounds, run_batch
from .tree_cells import commit_draws_and_download, replay_tree_cells, tree_cells_reason

__all__ = ["EdgelessTree", "TreeReplay", "replay_tree"]


class EdgelessTree(Backend):
    """A tree without edges (every node its own root) run as a gather without processes (the ``gather`` backend)."""

    name = "gather"
    kind = "tree"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        if not step.edgeless:
            return "the tree has edges"
        return fast_reason(net, [net.sim.devices[v] for v in step.taking_part])

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        devs = net.sim.devices
        return (yield from fast_rounds(net, [devs[v] for v in step.taking_part], step.first, step.absent,
                                       step.download, step.download_kind, None, step.download_bits, step.own, None,
                                       step.root_kind, uploaded_elements(step.n_elements), step.element_bits,
                                       batch=step.batch, charged=not step.free, step=step.name, step_kind="tree"))


class TreeReplay(Backend):
    """A tree with edges replayed level by level (module docstring)."""

    name = "tree"
    kind = "tree"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        sim = net.sim
        if step.edgeless:
            return "the tree has no edges"
        if step.element_bits is None:
            return "the tree messages' width is not declared (element_bits=None: each payload tells its own)"
        if step.batch is None:
            return "the step gives no batch of the nodes' values"
        if not sim.engine.allows("batched"):
            return "the batched backend is not allowed (the replay computes the values in one batch)"
        need = len(step.complete) if step.first is None else int(step.first)
        if not 0 < need <= len(step.complete):
            return "no root to wait for, or fewer complete subtrees than roots awaited (the processes raise)"
        if sim.record_views:
            return "views are recorded (Simulation(record_views=True)); the replay does not file messages in views"
        if sim.d2d:
            return "the network has direct device-to-device links"
        if not draws_plain(sim.streams):
            return "the keyed draws are overridden"
        nodes = [sim.devices[v] for v in step.taking_part]
        if sim.cells:                                         # replay_tree_cells: idle round-robin airs only
            ok = fast_reason(net, nodes, cells=True)
            return ok if ok is not True else tree_cells_reason(net, step.kids, step.parent, step.taking_part)
        return fast_reason(net, nodes)

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        sim = net.sim
        devs = sim.devices
        need = len(step.complete) if step.first is None else int(step.first)
        nodes = [devs[v] for v in step.taking_part]
        values, node_macs = run_batch(net, step.batch, nodes, step.download, not step.free, step.name)
        replay = replay_tree_cells if sim.cells else replay_tree
        got = replay(net, step.kids, step.parent, step.taking_part, need, step.download, step.download_kind,
                     step.download_bits, values, node_macs, step.add, step.kind_of, step.root_kind,
                     step.n_elements, step.element_bits, payload_size, step.combine_batch)
        if isinstance(got, str):
            at = {v: p for p, v in enumerate(step.taking_part)}

            def own(node: Node) -> Any:
                """The batched part of ``node``, charging its MACs (the reference then runs with these values)."""
                charge(node_macs[at[node.index]])
                return values[at[node.index]]
            step.args["own"] = own
            return Declined(got)
        result = GatherResult(dropped=list(step.absent))
        tk, result.results, result.cancelled = got
        yield event_at(sim.env, tk)
        net._note_failures(result)
        return result


def replay_tree(net: Any, kids: Mapping[int, list[int]], parent: Mapping[int, int | None],
                taking_part: Sequence[int], need: int, download: Any,
                download_kind: str, download_bits: int | None, values: Sequence[Any], node_macs: Sequence[int],
                add: Callable[[Any, Any], Any], kind: str, root_kind: str, n_elements: int | None,
                element_bits: int | None, payload_size: Callable[[Any], int],
                combine_batch: Callable[[list, list], tuple[list, list[int]]] | None = None
                ) -> tuple[float, list[tuple[Any, Any]], list[Any]] | str:
    """The round of :meth:`fednet.protocol.primitives.Net.tree_aggregate` over complete subtrees, without processes
    (module docstring).

    The nodes are walked level by level (a node's height above its deepest leaf), each level as arrays.

    Parameters
    ----------
    net : Net
        The protocol's primitives (its simulation, ``element_bits``).
    kids, parent : mappings
        The forest's structure: each node's children in step order, each node's parent (None: a root).
    taking_part : sequence of int
        The devices of the complete subtrees, in the tree's node order.
    need : int
        Root arrivals the server waits for, ``1 <= need <=`` the number of roots taking part.
    download, download_kind, download_bits
        As :meth:`~fednet.protocol.primitives.Net.tree_aggregate`'s (``download`` None: no download).
    values, node_macs : sequences, one per node of ``taking_part``
        Every node's own part and its MACs (from the step's batch).
    add : callable(acc, part)
        The metered combine (run here for every addition, unless ``combine_batch``; its MACs time it).
    kind, root_kind, n_elements, element_bits
        As :meth:`~fednet.protocol.primitives.Net.tree_aggregate`'s; ``n_elements`` None (sizes from the payloads) is
        left to the processes (a reason returned).
    payload_size : callable
        Numbers on the wire of a payload (:func:`fednet.protocol.primitives.payload_size`).
    combine_batch : callable(accs, parts) -> (values, macs), optional
        ``add`` of many pairs at once (each value and MAC count what ``add`` gives for that pair).

    Returns
    -------
    (t_k, arrived, cancelled) or str
        The time the server stops waiting (simulated seconds), the first ``need`` ``(root node, aggregate)``
        in order of arrival, the roots still on their way (in ``taking_part`` order); the reason, with nothing
        changed, where SimPy's order of simultaneous events would decide (module docstring).
    """
    sim = net.sim
    devs, rnd, streams, counters = sim.devices, sim.round, sim.streams, sim.counters
    if n_elements is None:
        return "the message sizes are left to the payloads (n_elements=None)"
    nodes = [devs[v] for v in taking_part]
    table = sim.node_table(nodes)                             # rates, losses, MAC rates, setup fractions (-1: none)
    if table is None:
        return "a compute model other than shifted-exponential or deterministic"
    down_rate, down_loss, up_rate, up_loss, mac_rate, frac = table[:, 1:].T
    now0 = sim.env.now
    n = len(taking_part)
    pos = {v: p for p, v in enumerate(taking_part)}
    kid_lists = [kids[v] for v in taking_part]                # complete subtrees: every child takes part
    max_k = max(map(len, kid_lists))
    K = np.full((n, max(max_k, 1)), -1, dtype=np.intp)        # children's positions, in step order
    for p, ks in enumerate(kid_lists):
        K[p, :len(ks)] = [pos[u] for u in ks]
    is_root = np.array([parent[v] is None for v in taking_part])
    height = np.zeros(n, dtype=np.intp)                       # 1 + the children's largest (0 for a leaf)
    while True:
        h = np.where(K >= 0, height[K] + 1, 0).max(axis=1)
        if (h == height).all():
            break
        height = h
    idx = np.asarray(taking_part, dtype=np.intp)
    first_child = 0 if download is None else 1                # a parent's download draws its downlink first
    U_down = [streams.uniforms(idx, "downlink", rnd, advance=False, ahead=a) for a in range(first_child + max_k)]
    U_comp = np.stack([streams.uniforms(idx, "compute", rnd, advance=False, ahead=a) for a in range(1 + max_k)])
    u_up = streams.uniforms(idx, "uplink", rnd, advance=False)
    where = f"{net.label}: "
    msg_bits = Message(0, 1, kind, None, int(n_elements),                                          # every one
                       wire.declared(element_bits, kind=kind, where=where).bits).bits
    overhead, packet_bits = sim.overhead, sim.packet_bits
    own_macs = np.asarray(node_macs, dtype=np.int64)
    times: list[np.ndarray] = []                              # every event's time, for the check at the cut

    if download is not None:
        down_bits = Message(0, 1, download_kind, None, payload_size(download),
                            wire.width(download, download_bits, download_kind, arg="download_bits",
                                       where=where)).bits
        secs, down_extra = transmission_times(down_bits, down_rate, overhead, down_loss, packet_bits, U_down[0],
                                              arrays=True)
        t1 = now0 + secs                                      # the downloads land; the own computations start
        times.append(t1)
    else:
        down_bits, down_extra, t1 = 0, np.zeros(n, dtype=np.int64), np.full(n, now0, dtype=float)  # int 0 at start
    own_secs, own_drew = compute_seconds(own_macs.astype(float), mac_rate, frac, lambda at: U_comp[0][at])
    t_own = np.where(own_secs > 0, t1 + own_secs, t1)
    times.append(t_own)
    n_drawn = own_drew.astype(np.intp)                        # compute draws taken so far, per node
    adds: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []   # (nodes, starts, MACs, drew)
    grants: list[tuple[np.ndarray, np.ndarray]] = []          # children's messages: (parents, starts on their link)
    downs: list[tuple[np.ndarray, np.ndarray]] = []           # (ends, retransmissions) of the children's messages
    ups: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []    # (nodes, starts, ends, retransmissions)
    acc = list(values)
    e_up = np.full(n, np.inf)                                 # the up hop's end: a parent's request, a root's arrival
    arrive = np.full(n, np.inf)                               # a child's message delivered to its parent

    for level in range(int(height.max()) + 1):
        L = np.flatnonzero(height == level)
        KL = K[L]
        if level:                                             # the parents' downlinks: children first come first served
            req = np.where(KL >= 0, e_up[np.maximum(KL, 0)], np.inf)
            order = np.argsort(req, axis=1, kind="stable")
            req_s = np.take_along_axis(req, order, axis=1)
            kid_s = np.take_along_axis(KL, order, axis=1)
            live = np.isfinite(req_s)
            if ((req_s[:, 1:] == req_s[:, :-1]) & live[:, 1:]).any():
                return "two children's messages request one downlink at one instant (SimPy's order decides)"
            free = t1[L].copy()                               # each downlink once its download has landed
            for k in range(KL.shape[1]):
                ok = live[:, k]
                if not ok.any():                              # (sorted: no later child anywhere either)
                    break
                Lk, r = L[ok], req_s[ok, k]
                g = np.where(r > free[ok], r, free[ok])       # granted at once, or at the release before it
                secs, extra = transmission_times(msg_bits, down_rate[Lk], overhead, down_loss[Lk], packet_bits,
                                                 U_down[first_child + k][Lk], arrays=True)
                end = g + secs
                arrive[kid_s[ok, k]] = end
                free[ok] = end
                grants.append((Lk, g))
                downs.append((end, extra))
                times += (g, end)
        t = t_own[L].copy()
        for c in range(KL.shape[1] if level else 0):          # the children's sums, in step order
            ok = KL[:, c] >= 0
            if not ok.any():
                continue
            Lc, kc = L[ok], KL[ok, c]
            a = arrive[kc]
            start = np.where(a > t[ok], a, t[ok])
            if combine_batch is not None:
                with MacMeter() as meter:
                    got, macs = combine_batch([acc[p] for p in Lc.tolist()], [acc[q] for q in kc.tolist()])
                if len(got) != len(Lc) or len(macs) != len(Lc) or meter.macs != sum(macs):
                    raise AssertionError(f"combine_batch returned {len(got)} values and {len(macs)} MAC counts for "
                                         f"{len(Lc)} pairs, metering {meter.macs} MACs for {sum(macs)}")
            else:
                got, macs = [], []
                for p, q in zip(Lc.tolist(), kc.tolist()):
                    with MacMeter() as meter:
                        got.append(add(acc[p], acc[q]))
                    macs.append(meter.macs)
            macs = np.asarray(macs, dtype=np.int64)
            u_c = U_comp[n_drawn[Lc], Lc]
            secs, drew = compute_seconds(macs.astype(float), mac_rate[Lc], frac[Lc], lambda at: u_c[at])
            end = np.where(secs > 0, start + secs, start)
            for p, value in zip(Lc.tolist(), got):
                acc[p] = value
            n_drawn[Lc] += drew
            t[ok] = end
            adds.append((Lc, start, macs, drew))
            times += (start, end)
        secs, extra = transmission_times(msg_bits, up_rate[L], overhead, up_loss[L], packet_bits, u_up[L], arrays=True)
        e_up[L] = t + secs
        ups.append((L, t, e_up[L], extra))
        times.append(e_up[L])

    roots = np.flatnonzero(is_root)
    by_arrival = roots[np.argsort(e_up[roots], kind="stable")]
    head = e_up[by_arrival[:need + 1]]
    if (head[1:] == head[:-1]).any():
        return "simultaneous root arrivals (SimPy's order decides)"
    tk = float(e_up[by_arrival[need - 1]])
    if not tk > now0 or sum(int((x == tk).sum()) for x in times) != 1:
        return "another event at the last awaited arrival (SimPy's order decides)"

    # -- nothing changed so far; from here on, the step happens --------------------------------------------------
    by_down = np.full(n, 0 if download is None else 1, dtype=np.int64)   # every download started at now0
    for Lk, g in grants:
        by_down[Lk] += g < tk
    started = t1 < tk
    by_comp = (own_drew & started).astype(np.int64)
    macs_done = int(own_macs[started].sum())
    for Lc, start, macs, drew in adds:
        before = start < tk
        by_comp[Lc] += drew & before
        macs_done += int(macs[before].sum())
    sent = np.zeros(n, dtype=np.int64)
    for L, start, _end, _extra in ups:
        sent[L] = start < tk
    commit_draws_and_download(sim, nodes, idx, by_down, by_comp, sent, macs_done, download, down_bits, started,
                              down_extra)
    finished = [(end < tk, extra, "bits_down") for end, extra in downs]
    finished += [(end <= tk, extra, "bits_up") for _L, _start, end, extra in ups]   # the deciding upload lands at t_k
    for done, extra, bits in finished:
        setattr(counters, bits, getattr(counters, bits) + msg_bits * int(done.sum()))
        counters.messages += int(done.sum())
        counters.retransmissions += int(extra[done].sum())
    firsts = by_arrival[:need].tolist()
    got = set(firsts)
    return tk, [(nodes[p], acc[p]) for p in firsts], [nodes[p] for p in roots.tolist() if p not in got]
