"""The ``tree`` backend on shared round-robin cells: an aggregation tree's round replayed over the cells' airs.

:func:`~fednet.sim.engine.backends.tree.replay_tree` walks the tree level by level, every link dedicated.  In a cell
(:mod:`fednet.sim.cells`) every transfer on the cell's uplink (or downlink) shares the air with every other one, so a
transfer's end depends on all the transfers of its cell, of every level; :func:`replay_tree_cells` therefore runs
the round as an event loop over the nodes' stages and the cells' airs (:class:`~.airtime.Air`, the float operations of
:class:`~fednet.sim.cells.SharedAir`), as :func:`~fednet.sim.engine.backends.groups.fast_groups_cells` does for
gathers, keeping :func:`~fednet.sim.engine.backends.tree.replay_tree`'s principle: every time is computed with the
keyed draws *looked at* (not taken), the replay decides, and it declines (returns the reason, nothing changed)
wherever SimPy's insertion order at one instant would decide, before any effect; then the effects are committed.

The reference it stands for (:func:`fednet.sim.engine.reference.tree` over :meth:`fednet.sim.Simulation.transfer`),
per node: the download asks for the node's downlink (its FIFO, then its cell's downlink air) at the start; the own
computation starts when it lands; a child's sum is added from ``max(end of the previous computation, its
arrival)``, children in step order; the node's sum then goes up its uplink (FIFO, then its cell's uplink air) and,
for an inner node, down its parent's downlink (FIFO: the parent's download first, then the children's messages first
come, first served; a granted message takes the parent's next keyed downlink draw and goes on the parent's cell's
downlink air).  A device without a cell uses its dedicated link (``now + seconds``).  The server stops at the
``k'``-th root arrival ``t_k``; the rest is cancelled (transfers on an air leave it then, so every replayed air is
left idle, as the reference leaves it: the next step replays again).

Events of the loop: an air's live timeout (:attr:`Air.fire`; the transfers ending then are handled in SimPy's
order), an upload asking for a cell's uplink air, and the ends of transfers on dedicated links; computations are
arithmetic (their boundaries are kept to check the cut).  Two events at one instant whose order SimPy leaves to its
insertion order (a *cause* is an event of the loop with everything it sets off at once) are replayed where the order
changes nothing -- transfers asking for one air at one instant commute (each adds ``0 / n`` to ``V``), and a release
and a request of one downlink at one instant grant alike -- and declined (the reference runs) where it could: a
transfer asking for a cell air at the instant the air's timeout fires (from another cause), two children's messages
requesting one downlink at one instant, two transfers that asked for one air at one instant from different causes
ending together (their order would decide which is handled first), an air whose next timeout falls at the instant
it was armed, two root arrivals at one instant, anything else at exactly ``t_k``, a transfer of no airtime. The caller
(:class:`~fednet.sim.engine.backends.tree.TreeReplay`) declines proportional-fair or busy cells
(:func:`~.airtime.cells_air_reason`) and everything :func:`~fednet.sim.engine.backends.tree.replay_tree` declines.
Equality with the reference, bit for bit (trace, final model, keyed-draw counters, counters, the airs' state):
``tests/test_tree_cells.py``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from heapq import heappop, heappush
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.sim.compute import compute_seconds
from fednet.sim.network import Message, transmission_times
from fednet.sim.stamp import STAMP

from .. import wire
from .airtime import cells_air_reason, replayable_air

__all__ = ["replay_tree_cells", "tree_cells_reason", "commit_draws_and_download"]


class _Undecided(Exception):
    """SimPy's insertion order would decide (the message is the reason the replay declines)."""


def _tree_values(K: np.ndarray, height: np.ndarray, values: Sequence[Any], add: Callable[[Any, Any], Any],
                 combine_batch: Callable[[list, list], tuple[list, list[int]]] | None) -> tuple[list, np.ndarray]:
    """Every node's aggregate and the MACs of each of its additions, level by level and child place by child place
    (as :func:`~fednet.sim.engine.backends.tree.replay_tree` computes them; the values do not depend on the times).

    Parameters
    ----------
    K : ndarray of intp, (n, max_k)
        Children's positions in step order, -1 past a node's last child.
    height : ndarray of intp, (n,)
        A node's height above its deepest leaf.
    values : sequence, (n,)
        Every node's own part.
    add, combine_batch
        The metered combine, or its batch (``(accs, parts) -> (values, MACs)``).

    Returns
    -------
    acc : list, (n,)
        Each node's aggregate (its own part plus its subtree's).
    macs : ndarray of int64, (n, max_k)
        MACs of node ``p``'s addition of its ``c``-th child (0 where there is none).

    Raises
    ------
    AssertionError
        If ``combine_batch`` returns other than one value and one count per pair, or meters another total.
    """
    acc = list(values)
    macs_out = np.zeros(K.shape, dtype=np.int64)
    for level in range(1, int(height.max()) + 1):
        L = np.flatnonzero(height == level)
        KL = K[L]
        for c in range(KL.shape[1]):
            ok = KL[:, c] >= 0
            if not ok.any():
                continue
            Lc, kc = L[ok].tolist(), KL[ok, c].tolist()
            if combine_batch is not None:
                with MacMeter() as meter:
                    got, macs = combine_batch([acc[p] for p in Lc], [acc[q] for q in kc])
                if len(got) != len(Lc) or len(macs) != len(Lc) or meter.macs != sum(macs):
                    raise AssertionError(f"combine_batch returned {len(got)} values and {len(macs)} MAC counts for "
                                         f"{len(Lc)} pairs, metering {meter.macs} MACs for {sum(macs)}")
            else:
                got, macs = [], []
                for p, q in zip(Lc, kc):
                    with MacMeter() as meter:
                        got.append(add(acc[p], acc[q]))
                    macs.append(meter.macs)
            for p, value in zip(Lc, got):
                acc[p] = value
            macs_out[L[ok], c] = macs
    return acc, macs_out


class _Forest:
    """The parts of a tree step that stay the same from round to round (kept per simulation by :func:`_forest`)."""

    __slots__ = ("kids", "parent", "taking_part", "stamp", "nodes", "idx", "kid_l", "par", "n_kids", "K", "height",
                 "dair", "uair", "real_airs")

    def __init__(self, sim: Any, kids: Mapping[int, list[int]], parent: Mapping[int, int | None],
                 taking_part: Sequence[int]) -> None:
        self.kids, self.parent, self.taking_part, self.stamp = kids, parent, list(taking_part), STAMP.value
        devs = sim.devices
        self.nodes = nodes = [devs[v] for v in taking_part]
        n = len(nodes)
        self.idx = np.asarray(taking_part, dtype=np.intp)
        pos = {v: p for p, v in enumerate(taking_part)}
        #: Each node's children's positions in step order (complete subtrees: every child takes part).
        self.kid_l = kid_l = [[pos[u] for u in kids[v]] for v in taking_part]
        #: Each node's parent's position, -1 for a root.
        self.par = [-1 if parent[v] is None else pos[parent[v]] for v in taking_part]
        self.n_kids = np.fromiter(map(len, kid_l), dtype=np.intp, count=n)
        max_k = int(self.n_kids.max()) if n else 0
        self.K = K = np.full((n, max(max_k, 1)), -1, dtype=np.intp)
        for p, ks in enumerate(kid_l):
            K[p, :len(ks)] = ks
        height = np.zeros(n, dtype=np.intp)                   # 1 + the children's largest (0 for a leaf)
        while True:
            h = np.where(K >= 0, height[K] + 1, 0).max(axis=1)
            if (h == height).all():
                break
            height = h
        self.height = height
        real_airs: list[Any] = []
        index_of: dict[int, int] = {}

        def air_index(link: Any) -> int:
            """The index of ``link``'s cell air among :attr:`real_airs`, -1 for a dedicated link."""
            real = link.air
            if real is None:
                return -1
            a = index_of.get(id(real))
            if a is None:
                a = index_of[id(real)] = len(real_airs)
                real_airs.append(real)
            return a
        #: Each node's downlink and uplink air (an index into ``real_airs``; -1: a dedicated link).
        self.dair = [air_index(node.downlink) for node in nodes]
        self.uair = [air_index(node.uplink) for node in nodes]
        self.real_airs = real_airs


_FORESTS: "weakref.WeakKeyDictionary[Any, _Forest]" = weakref.WeakKeyDictionary()


def _forest(sim: Any, kids: Mapping[int, list[int]], parent: Mapping[int, int | None],
            taking_part: Sequence[int]) -> _Forest:
    """The :class:`_Forest` of a tree step, made again when the tree, the nodes taking part or any node's, link's or
    compute model's attribute (:data:`~fednet.sim.stamp.STAMP`: a link's cell air among them) changed."""
    got = _FORESTS.get(sim)
    if (got is None or got.kids is not kids or got.parent is not parent or got.stamp != STAMP.value
            or got.taking_part != taking_part):
        got = _FORESTS[sim] = _Forest(sim, kids, parent, taking_part)
    return got


def tree_cells_reason(net: Any, kids: Mapping[int, list[int]], parent: Mapping[int, int | None],
                      taking_part: Sequence[int]) -> bool | str:
    """``True`` if every cell air the tree's nodes use is idle and round robin (:func:`~.airtime.replayable_air`), else
    the reason (:func:`~.airtime.cells_air_reason`'s): the cells' state, checked on the step's few distinct airs."""
    forest = _forest(net.sim, kids, parent, taking_part)
    if all(map(replayable_air, forest.real_airs)):
        return True
    return cells_air_reason(forest.nodes)


def commit_draws_and_download(sim: Any, nodes: Sequence[Any], idx: np.ndarray, by_down: np.ndarray,
                              by_comp: np.ndarray, sent: np.ndarray, macs_done: int, download: Any, down_bits: int,
                              landed: np.ndarray, down_extra: np.ndarray) -> None:
    """The effects a tree replay (star or cells) commits once the round is decided: each node's keyed downlink,
    compute and uplink draws taken before ``t_k`` (counts per node, positions of ``idx``), the MACs computed, and
    the downloads that ``landed`` (bits, messages, retransmissions, each device's ``received``)."""
    for purpose, by in (("downlink", by_down), ("compute", by_comp), ("uplink", sent)):
        took = by > 0
        if took.any():
            sim.streams.advance(idx[took], purpose, sim.round, by[took])
    counters = sim.counters
    counters.device_macs += macs_done
    if download is not None:
        counters.bits_down += down_bits * int(landed.sum())
        counters.messages += int(landed.sum())
        counters.retransmissions += int(down_extra[landed].sum())
        for p in np.flatnonzero(landed).tolist():
            nodes[p].state.received = download


def replay_tree_cells(net: Any, kids: Mapping[int, list[int]], parent: Mapping[int, int | None],
                      taking_part: Sequence[int], need: int, download: Any,
                      download_kind: str, download_bits: int | None, values: Sequence[Any],
                      node_macs: Sequence[int], add: Callable[[Any, Any], Any], kind: str, root_kind: str,
                      n_elements: int | None, element_bits: int | None, payload_size: Callable[[Any], int],
                      combine_batch: Callable[[list, list], tuple[list, list[int]]] | None = None
                      ) -> tuple[float, list[tuple[Any, Any]], list[Any]] | str:
    """:func:`~fednet.sim.engine.backends.tree.replay_tree` on a network whose devices share round-robin cells'
    airtime (module docstring): the same parameters and returns.

    Parameters
    ----------
    net : Net
        The protocol's primitives (its simulation: every cell air of the nodes idle and round robin,
        :func:`tree_cells_reason`, checked by the caller).
    kids, parent, taking_part, need, download, download_kind, download_bits, values, node_macs, add, kind,
    root_kind, n_elements, element_bits, payload_size, combine_batch
        As :func:`~fednet.sim.engine.backends.tree.replay_tree`'s.

    Returns
    -------
    (t_k, arrived, cancelled) or str
        The time the server stops waiting (simulated seconds), the first ``need`` ``(root node, aggregate)`` in
        order of arrival, the roots still on their way (in ``taking_part`` order); else the reason, with nothing
        changed (module docstring).
    """
    sim = net.sim
    rnd, streams, counters = sim.round, sim.streams, sim.counters
    if n_elements is None:
        return "the message sizes are left to the payloads (n_elements=None)"
    forest = _forest(sim, kids, parent, taking_part)
    nodes = forest.nodes
    table = sim.node_table(nodes)                             # rates, losses, MAC rates, setup fractions (-1: none)
    if table is None:
        return "a compute model other than shifted-exponential or deterministic"
    down_rate, down_loss, up_rate, up_loss, mac_rate, frac = table[:, 1:].T
    now0 = float(sim.env.now)
    n = len(nodes)
    idx, kid_l, par, n_kids, K = forest.idx, forest.kid_l, forest.par, forest.n_kids, forest.K
    dair, uair = forest.dair, forest.uair
    mk = K.shape[1]                                           # child places (>= 1)
    max_k = int(n_kids.max())

    # -- every duration, vectorised, with the keyed draws looked at (a link's or processor's a-th next draw) ---------
    first_child = 0 if download is None else 1                # a parent's download draws its downlink first
    where = f"{net.label}: "
    msg_bits = Message(0, 1, kind, None, int(n_elements), wire.declared(element_bits, kind=kind, where=where).bits).bits
    overhead, packet_bits = sim.overhead, sim.packet_bits
    no_air = "a transfer of no airtime (it ends without waiting; the replay does not model it)"
    down_bits = 0
    dsec: list[list[float]] = []                              # [rank][p]: the rank-th transfer on p's downlink
    dextra = np.zeros((first_child + max_k, n), dtype=np.int64)
    if download is not None:
        down_bits = Message(0, 1, download_kind, None, payload_size(download),
                            wire.width(download, download_bits, download_kind, arg="download_bits",
                                       where=where)).bits
        secs, dextra[0] = transmission_times(down_bits, down_rate, overhead, down_loss, packet_bits,
                                             streams.uniforms(idx, "downlink", rnd, advance=False), arrays=True)
        if not (secs > 0).all():
            return no_air
        dsec.append(secs.tolist())
    for c in range(max_k):                                    # the c-th child's message: parents of > c children
        P = np.flatnonzero(n_kids > c)
        secs, dextra[first_child + c, P] = transmission_times(
            msg_bits, down_rate[P], overhead, down_loss[P], packet_bits,
            streams.uniforms(idx[P], "downlink", rnd, advance=False, ahead=first_child + c), arrays=True)
        if not (secs > 0).all():
            return no_air
        full = np.zeros(n)
        full[P] = secs
        dsec.append(full.tolist())
    usec_a, uextra = transmission_times(msg_bits, up_rate, overhead, up_loss, packet_bits,
                                        streams.uniforms(idx, "uplink", rnd, advance=False), arrays=True)
    if not (usec_a > 0).all():
        return no_air
    usec = usec_a.tolist()
    own_macs = np.asarray(node_macs, dtype=np.int64)
    own_secs, own_drew = compute_seconds(own_macs.astype(float), mac_rate, frac,
                                         lambda at: streams.uniforms(idx[at], "compute", rnd, advance=False))
    acc, add_macs = _tree_values(K, forest.height, values, add, combine_batch)
    n_drawn = own_drew.astype(np.intp)                        # compute draws before each addition, per node
    add_secs = np.zeros((n, mk))
    add_drew = np.zeros((n, mk), dtype=bool)
    for c in range(max_k):                                    # the c-th addition: its node's n_drawn-th next draw
        P = np.flatnonzero(n_kids > c)
        ahead = n_drawn[P]

        def looked(at: np.ndarray, P: np.ndarray = P, ahead: np.ndarray = ahead) -> np.ndarray:
            """The keyed compute uniforms of the nodes ``P[at]``, each ``ahead`` draws past its next one."""
            out = np.empty(int(at.sum()))
            for a in np.unique(ahead[at]).tolist():
                sel = ahead[at] == a
                out[sel] = streams.uniforms(idx[P[at][sel]], "compute", rnd, advance=False, ahead=a)
            return out
        secs, drew = compute_seconds(add_macs[P, c].astype(float), mac_rate[P], frac[P], looked)
        add_secs[P, c] = secs
        add_drew[P, c] = drew
        n_drawn[P] += drew
    own_l = own_secs.tolist()
    add_l = add_secs.ravel().tolist()                         # [p * mk + c]

    # -- the event loop (nothing outside this function changes until it has decided) -------------------------------
    inf = math.inf
    real_airs = forest.real_airs
    n_airs = len(real_airs)
    # each air as SharedAir's state and float operations (fednet.sim.engine.backends.airtime.Air, inlined): the heap
    # of (finish in virtual time, arrival number, tag), V, the time V was brought up to, the live timeout's generation
    aheap: list[list[tuple[float, int, int]]] = [[] for _ in range(n_airs)]
    aV = [0.0] * n_airs
    aat = [0.0] * n_airs
    agen = [0] * n_airs
    arrivals = [0] * n_airs                                   # transfers that asked for each air
    t1 = [inf] * n                                            # the download lands, the own computation starts
    arr = [inf] * n                                           # a child's message reaches its parent
    tup = [inf] * n                                           # the upload starts (the uplink draw)
    tend = [inf] * n                                          # the upload ends (at the parent's downlink / server)
    add_start = [inf] * (n * mk)                              # each addition's start (compute draw, MACs): p * mk + c
    rrank = [0] * n                                           # a child's message: its rank on its parent's downlink
    g_par: list[int] = []                                     # every grant of a parent's downlink to a child ...
    g_time: list[float] = []                                  # ... and when
    n_grants = [first_child] * n
    nxt = [0] * n                                             # the next child to add
    cur = [now0] * n                                          # a waiting node's processor is free from then
    waiting = [False] * n
    dl_free = [download is None] * n                          # the downlink's FIFO (held by the download first)
    dl_queue: list[list[int]] = [[] for _ in range(n)]
    heap: list[tuple] = []                                    # (time, number, code, node or air, generation)
    # what each cause did at the instant being processed (SimPy's order of two causes at one instant is its insertion
    # order): air a fired (key a), had arrivals (n_airs + a: the first cause, and arrived[a] the tags), node P's
    # downlink was requested (2 n_airs + P)
    touched: dict[int, int] = {}
    arrived: dict[int, list[int]] = {}
    unsure: set[int] = set()                                  # transfers whose place among simultaneous arrivals is not
                                                              # known (arrived at one instant from different causes)
    roots_in: list[tuple[float, int]] = []
    FIRE, UPREQ, UPEND, RELAYEND, DOWNEND = 0, 1, 2, 3, 4
    n2 = 2 * n
    state = [0, -1 - n_airs]                                  # [numbering of events, the cause being processed]
    fire_and_arrival = "a transfer asks for a cell air at the instant its timeout fires (SimPy's order decides)"
    two_requests = "two children's messages request one downlink at one instant (SimPy's order decides)"
    unsure_order = ("transfers that asked for a cell air at one instant from different causes end together (SimPy's "
                    "order decides which is handled first)")
    zero_delay = "a cell air's next timeout falls at the instant it was armed (SimPy's order decides)"
    at_tk = "another event at the last awaited arrival (SimPy's order decides)"

    def arrive(a: int, t: float, w: float, tag: int) -> None:
        """A transfer of airtime ``w`` asks for air ``a`` at ``t`` (``SharedAir.transmit``); its timeout re-armed."""
        by = state[1]
        if touched.get(a, by) != by:
            raise _Undecided(fire_and_arrival)
        first = touched.setdefault(n_airs + a, by)
        group = arrived.setdefault(a, [])
        group.append(tag)
        if first != by or (unsure and group[0] in unsure):    # arrivals at one instant commute, but for their order
            unsure.update(group)
        h = aheap[a]
        V = aV[a] + (t - aat[a]) / len(h) if h else aV[a]
        aat[a] = t
        state[0] = number = state[0] + 1
        heappush(h, (V + w, number, tag))
        aV[a] = V
        d = (h[0][0] - V) * len(h)
        f = t + d if d > 0.0 else t
        if f == t:
            raise _Undecided(zero_delay)
        agen[a] = gen = agen[a] + 1
        arrivals[a] += 1
        heappush(heap, (f, number, FIRE, a, gen))

    def relay(P: int, q: int, t: float) -> None:
        """Child ``q``'s message is granted its parent ``P``'s downlink at ``t`` (P's next downlink draw)."""
        rank = n_grants[P]
        n_grants[P] = rank + 1
        g_par.append(P)
        g_time.append(t)
        rrank[q] = rank
        w = dsec[rank][P]
        a = dair[P]
        if a < 0:
            state[0] += 1
            heappush(heap, (t + w, state[0], RELAYEND, q, 0))
        else:
            arrive(a, t, w, n + q)

    def release(P: int, t: float) -> None:
        """Node ``P``'s downlink is released at ``t``: the next child's message in its queue is granted it."""
        queue = dl_queue[P]
        if queue:
            relay(P, queue.pop(0), t)
        else:
            dl_free[P] = True

    def chain(p: int, t: float, now: float) -> None:
        """Node ``p``'s processor is free from ``t``: add the children's sums that have arrived, in step order,
        then upload (at ``now``, the instant being processed, the upload is part of the present cause)."""
        ks = kid_l[p]
        c = nxt[p]
        base = p * mk
        while c < len(ks):
            a = arr[ks[c]]
            if a == inf:
                nxt[p] = c
                cur[p] = t
                waiting[p] = True
                return
            s = a if a > t else t
            add_start[base + c] = s
            d = add_l[base + c]
            t = s + d if d > 0 else s
            c += 1
        nxt[p] = c
        waiting[p] = False
        tup[p] = t
        a = uair[p]
        if a < 0:
            state[0] += 1
            heappush(heap, (t + usec[p], state[0], UPEND, p, 0))
        elif t == now:
            arrive(a, t, usec[p], n2 + p)
        else:
            state[0] += 1
            heappush(heap, (t, state[0], UPREQ, p, 0))

    def downloaded(p: int, t: float) -> None:
        """Node ``p``'s download lands at ``t``: its downlink is released, its own computation runs."""
        t1[p] = t
        release(p, t)
        d = own_l[p]
        chain(p, t + d if d > 0 else t, t)

    def relayed(q: int, t: float) -> None:
        """Child ``q``'s message reaches its parent at ``t`` (the parent's downlink released, its sum added)."""
        P = par[q]
        arr[q] = t
        release(P, t)
        if waiting[P] and kid_l[P][nxt[P]] == q:
            chain(P, cur[P], t)

    def uploaded(p: int, t: float) -> bool:
        """Node ``p``'s upload ends at ``t``: a root's reaches the server (True at the ``need``-th), an inner
        node's asks for its parent's downlink."""
        tend[p] = t
        P = par[p]
        if P < 0:
            if roots_in and roots_in[-1][0] == t:
                raise _Undecided("simultaneous root arrivals (SimPy's order decides)")
            roots_in.append((t, p))
            return len(roots_in) == need
        by = state[1]
        if touched.setdefault(2 * n_airs + P, by) != by:     # (a release at that instant grants the same way)
            raise _Undecided(two_requests)
        if dl_free[P]:
            dl_free[P] = False
            relay(P, p, t)
        else:
            dl_queue[P].append(p)
        return False

    try:
        if download is not None:                              # every download asks for its downlink now, in order
            first = dsec[0]
            for p in range(n):
                a = dair[p]
                state[0] += 1
                if a < 0:
                    heappush(heap, (now0 + first[p], state[0], DOWNEND, p, 0))
                else:
                    h = aheap[a]
                    V = aV[a] + (now0 - aat[a]) / len(h) if h else aV[a]
                    aat[a] = now0
                    heappush(h, (V + first[p], state[0], p))
                    aV[a] = V
                    arrivals[a] += 1
            for a, h in enumerate(aheap):                     # each air's one live timeout
                if h:
                    d = (h[0][0] - aV[a]) * len(h)
                    f = now0 + d if d > 0.0 else now0
                    if f == now0:
                        raise _Undecided(zero_delay)
                    agen[a] += 1
                    state[0] += 1
                    heappush(heap, (f, state[0], FIRE, a, agen[a]))
        else:                                                 # every node computes at once
            for p in range(n):
                d = own_l[p]
                chain(p, now0 + d if d > 0 else now0, now0)
        instant = now0
        causes = 0                                            # causes processed at this instant
        done = False
        while heap:
            t, number, code, x, gen = heappop(heap)
            if code == FIRE and gen != agen[x]:
                continue                                      # rescheduled since (SimPy's stale timeouts do nothing)
            if t != instant:
                instant = t
                if touched:
                    touched.clear()
                    arrived.clear()
                causes = 0
            causes += 1
            if code == FIRE:                                  # SharedAir._fire
                by = state[1] = -1 - x
                if touched.setdefault(x, by) != by or touched.get(n_airs + x, by) != by:
                    raise _Undecided(fire_and_arrival)
                h = aheap[x]
                V = aV[x] + (t - aat[x]) / len(h)
                aat[x] = t
                top = h[0][0]
                lim = V if V > top else top                   # max(top, V)
                ended = []
                while h and h[0][0] <= lim:
                    ended.append(heappop(h)[2])
                if unsure and len(ended) > 1 and sum(tag in unsure for tag in ended) > 1:
                    raise _Undecided(unsure_order)
                if h:
                    V = aV[x] = top if top > V else V         # max(V, top)
                    d = (h[0][0] - V) * len(h)
                    f = t + d if d > 0.0 else t
                    if f == t:
                        raise _Undecided(zero_delay)
                    agen[x] = gen = agen[x] + 1
                    state[0] += 1
                    heappush(heap, (f, state[0], FIRE, x, gen))
                else:
                    aV[x] = 0.0
                    agen[x] += 1
                for tag in ended:                             # in SimPy's order
                    if tag < n:                               # downloaded(tag, t), inlined
                        t1[tag] = t
                        queue = dl_queue[tag]
                        if queue:
                            relay(tag, queue.pop(0), t)
                        else:
                            dl_free[tag] = True
                        d = own_l[tag]
                        chain(tag, t + d if d > 0 else t, t)
                    elif tag < n2:                            # relayed(tag - n, t), inlined
                        q = tag - n
                        P = par[q]
                        arr[q] = t
                        queue = dl_queue[P]
                        if queue:
                            relay(P, queue.pop(0), t)
                        else:
                            dl_free[P] = True
                        if waiting[P] and kid_l[P][nxt[P]] == q:
                            chain(P, cur[P], t)
                    elif uploaded(tag - n2, t):
                        if len(ended) > 1:
                            raise _Undecided(at_tk)
                        done = True
                        break
                if done:
                    break
                continue
            state[1] = number
            if code == UPREQ:
                arrive(uair[x], t, usec[x], n2 + x)
            elif code == UPEND:
                if uploaded(x, t):
                    done = True
                    break
            elif code == RELAYEND:
                relayed(x, t)
            else:
                downloaded(x, t)
        if not done:
            return "fewer roots arrive than awaited (the processes raise)"
        tk = roots_in[-1][0]
        if causes > 1 or not tk > now0:
            raise _Undecided(at_tk)
        while heap:                                           # the next live event must come after t_k
            t, _, code, x, gen = heap[0]
            if code == FIRE and gen != agen[x]:
                heappop(heap)
                continue
            if t == tk:
                raise _Undecided(at_tk)
            break
    except _Undecided as why:
        return str(why)

    # the computations' boundaries (no event of the loop) must not fall at t_k either
    t1_a, tup_a, tend_a, arr_a = np.array(t1), np.array(tup), np.array(tend), np.array(arr)
    starts = np.array(add_start).reshape(n, mk)
    t_own = t1_a if download is not None else np.full(n, now0)
    t_own = np.where(own_secs > 0, t_own + own_secs, t_own)
    if ((t_own == tk).any() or (starts == tk).any() or (np.where(add_secs > 0, starts + add_secs, starts) == tk).any()
            or (tup_a == tk).any()):
        return at_tk

    # -- nothing changed so far; from here on, the step happens --------------------------------------------------
    by_down = np.full(n, first_child, dtype=np.int64)         # every download started at now0
    g_par_a = np.asarray(g_par, dtype=np.intp)
    by_down += np.bincount(g_par_a[np.asarray(g_time) < tk], minlength=n)
    landed = t1_a < tk if download is not None else np.ones(n, dtype=bool)
    added = starts < tk
    by_comp = (own_drew & landed).astype(np.int64) + (add_drew & added).sum(axis=1)
    macs_done = int(own_macs[landed].sum()) + int(add_macs[added].sum())
    sent = (tup_a < tk).astype(np.int64)
    commit_draws_and_download(sim, nodes, idx, by_down, by_comp, sent, macs_done, download, down_bits, landed,
                              dextra[0] if download is not None else None)
    relays = np.flatnonzero(arr_a < tk)                       # children's messages delivered before t_k
    counters.bits_down += msg_bits * int(relays.size)
    counters.messages += int(relays.size)
    counters.retransmissions += int(dextra[np.asarray(rrank, dtype=np.intp)[relays],
                                           np.asarray(par, dtype=np.intp)[relays]].sum())
    ups = tend_a <= tk                                        # the deciding upload lands at t_k
    counters.bits_up += msg_bits * int(ups.sum())
    counters.messages += int(ups.sum())
    counters.retransmissions += int(uextra[ups].sum())
    for real, count in zip(real_airs, arrivals):             # the reference's airs counted these transfers; idle now
        real.transfers += count
    firsts = [p for _, p in roots_in[:need]]
    got = set(firsts)
    return tk, [(nodes[p], acc[p]) for p in firsts], [nodes[p] for p in range(n) if par[p] < 0 and p not in got]
