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
arithmetic (their boundaries are kept to check the cut).  Declined (the reference runs): two events of different
causes touching one air or one node's downlink queue at one instant (SimPy's insertion order would decide: an arrival
at the instant the air's timeout fires, two requests for one downlink); an air whose next timeout falls at the instant
it fired; two root arrivals at one instant; anything else at exactly ``t_k``; a transfer of no airtime.  The caller
(:class:`~fednet.sim.engine.backends.tree.TreeReplay`) declines proportional-fair or busy cells
(:func:`~.airtime.cells_air_reason`) and everything :func:`~fednet.sim.engine.backends.tree.replay_tree` declines.
Equality with the reference, bit for bit (trace, final model, keyed-draw counters, counters, the airs' state):
``tests/test_tree_cells.py``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.sim.compute import compute_seconds
from fednet.sim.network import Message, transmission_times

from .. import wire
from .airtime import Air

__all__ = ["replay_tree_cells"]


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
        The protocol's primitives (its simulation: every cell air of the nodes idle and round robin, checked by the
        caller).
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
    devs, rnd, streams, counters = sim.devices, sim.round, sim.streams, sim.counters
    if n_elements is None:
        return "the message sizes are left to the payloads (n_elements=None)"
    nodes = [devs[v] for v in taking_part]
    table = sim.node_table(nodes)                             # rates, losses, MAC rates, setup fractions (-1: none)
    if table is None:
        return "a compute model other than shifted-exponential or deterministic"
    down_rate, down_loss, up_rate, up_loss, mac_rate, frac = table[:, 1:].T
    now0 = float(sim.env.now)
    n = len(taking_part)
    pos = {v: p for p, v in enumerate(taking_part)}
    kid_l = [[pos[u] for u in kids[v]] for v in taking_part]  # complete subtrees: every child takes part
    par = [-1 if parent[v] is None else pos[parent[v]] for v in taking_part]
    max_k = max(map(len, kid_l))
    K = np.full((n, max(max_k, 1)), -1, dtype=np.intp)        # children's positions, in step order
    for p, ks in enumerate(kid_l):
        K[p, :len(ks)] = ks
    height = np.zeros(n, dtype=np.intp)                       # 1 + the children's largest (0 for a leaf)
    while True:
        h = np.where(K >= 0, height[K] + 1, 0).max(axis=1)
        if (h == height).all():
            break
        height = h

    # -- the airs: one replayed Air per real cell air; -1 a dedicated link ------------------------------------------
    real_airs: list[Any] = []
    index_of: dict[int, int] = {}

    def air_index(link: Any) -> int:
        real = link.air
        if real is None:
            return -1
        a = index_of.get(id(real))
        if a is None:
            a = index_of[id(real)] = len(real_airs)
            real_airs.append(real)
        return a
    dair = [air_index(node.downlink) for node in nodes]
    uair = [air_index(node.uplink) for node in nodes]

    # -- every duration, vectorised, with the keyed draws looked at -------------------------------------------------
    idx = np.asarray(taking_part, dtype=np.intp)
    first_child = 0 if download is None else 1                # a parent's download draws its downlink first
    where = f"{net.label}: "
    msg_bits = Message(0, 1, kind, None, int(n_elements), wire.declared(element_bits, kind=kind, where=where).bits).bits
    overhead, packet_bits = sim.overhead, sim.packet_bits
    dsec: list[list[float]] = []                              # [rank][p]: the downlink's rank-th transfer's airtime
    dextra: list[np.ndarray] = []
    down_bits = 0
    for a in range(first_child + max_k):
        u = streams.uniforms(idx, "downlink", rnd, advance=False, ahead=a)
        if a < first_child:
            down_bits = Message(0, 1, download_kind, None, payload_size(download),
                                wire.width(download, download_bits, download_kind, arg="download_bits",
                                           where=where)).bits
            secs, extra = transmission_times(down_bits, down_rate, overhead, down_loss, packet_bits, u, arrays=True)
        else:
            secs, extra = transmission_times(msg_bits, down_rate, overhead, down_loss, packet_bits, u, arrays=True)
        if not (secs > 0).all():
            return "a transfer of no airtime (it ends without waiting; the replay does not model it)"
        dsec.append(secs.tolist())
        dextra.append(extra)
    usec_a, uextra = transmission_times(msg_bits, up_rate, overhead, up_loss, packet_bits,
                                        streams.uniforms(idx, "uplink", rnd, advance=False), arrays=True)
    if not (usec_a > 0).all():
        return "a transfer of no airtime (it ends without waiting; the replay does not model it)"
    usec = usec_a.tolist()
    U_comp = np.stack([streams.uniforms(idx, "compute", rnd, advance=False, ahead=a) for a in range(1 + max_k)])
    own_macs = np.asarray(node_macs, dtype=np.int64)
    own_secs, own_drew = compute_seconds(own_macs.astype(float), mac_rate, frac, lambda at: U_comp[0][at])
    acc, add_macs = _tree_values(K, height, values, add, combine_batch)
    n_drawn = own_drew.astype(np.intp)                        # compute draws before each addition, per node
    add_secs = np.zeros(K.shape)
    add_drew = np.zeros(K.shape, dtype=bool)
    cols = np.arange(n)
    for c in range(max_k):
        has = K[:, c] >= 0
        u_c = U_comp[n_drawn, cols]
        secs, drew = compute_seconds(add_macs[:, c].astype(float), mac_rate, frac, lambda at: u_c[at])
        add_secs[:, c] = np.where(has, secs, 0.0)
        add_drew[:, c] = drew & has
        n_drawn = n_drawn + add_drew[:, c]
    own_l = own_secs.tolist()
    add_l = add_secs.tolist()

    # -- the event loop (nothing outside this function changes until it has decided) -------------------------------
    inf = math.inf
    n_airs = len(real_airs)
    airs = [Air() for _ in range(n_airs)]
    arrivals = [0] * n_airs                                   # transfers that asked for each air
    t1 = [inf] * n                                            # the download lands, the own computation starts
    arr = [inf] * n                                           # a child's message reaches its parent
    tup = [inf] * n                                           # the upload starts (uplink draw)
    tend = [inf] * n                                          # the upload ends (at the parent's downlink / server)
    add_start = [[inf] * len(ks) for ks in kid_l]             # each addition's start (compute draw, MACs)
    rrank = [0] * n                                           # a child's message: its rank on the parent's downlink
    grants: list[list[float]] = [[] for _ in range(n)]        # when each child's message was granted the downlink
    nxt = [0] * n                                             # the next child to add
    cur = [now0] * n                                          # a waiting node's processor is free from then
    waiting = [False] * n
    dl_free = [download is None] * n                          # the downlink's FIFO (held by the download first)
    dl_queue: list[list[int]] = [[] for _ in range(n)]
    silent: list[float] = []                                  # computation boundaries (no event of the loop)
    heap: list[tuple] = []
    seq = 0
    instant = -inf                                            # the instant being processed
    owner = 0                                                 # the cause being processed at it
    touched: dict[int, int] = {}                              # resource -> its first cause at this instant
    busy_events = 0                                           # causes processed at this instant
    roots_in: list[tuple[float, int]] = []
    tk = inf
    FIRE, UPREQ, UPEND, RELAYEND, DOWNEND = 0, 1, 2, 3, 4
    n2 = 2 * n

    def touch(res: int) -> None:
        """The cause being processed touches a resource (an air: ``a``; node ``p``'s downlink queue: ``n_airs + p``);
        another cause touching it at this instant would leave the order to SimPy's insertion order."""
        by = touched.setdefault(res, owner)
        if by != owner:
            raise _Undecided("two events at one instant touch one cell air or one downlink queue (SimPy's order "
                             "decides)")

    def arrive(a: int, t: float, w: float, tag: int) -> None:
        """A transfer of airtime ``w`` asks for air ``a`` at ``t``; the air's timeout is re-armed."""
        nonlocal seq
        touch(a)
        air = airs[a]
        air.arrive(t, w, tag)
        arrivals[a] += 1
        if air.fire == t:
            raise _Undecided("a cell air's next timeout falls at the instant it was armed (SimPy's order decides)")
        seq += 1
        heapq.heappush(heap, (air.fire, seq, FIRE, a, air.gen))

    def relay(P: int, q: int, t: float) -> None:
        """Child ``q``'s message is granted its parent ``P``'s downlink at ``t`` (P's next downlink draw)."""
        nonlocal seq
        rank = len(grants[P]) + first_child
        grants[P].append(t)
        rrank[q] = rank
        w = dsec[rank][P]
        a = dair[P]
        if a < 0:
            seq += 1
            heapq.heappush(heap, (t + w, seq, RELAYEND, q, 0))
        else:
            arrive(a, t, w, n + q)

    def release(P: int, t: float) -> None:
        """Node ``P``'s downlink is released at ``t``: the next child's message in its queue is granted it."""
        touch(n_airs + P)
        queue = dl_queue[P]
        if queue:
            relay(P, queue.pop(0), t)
        else:
            dl_free[P] = True

    def chain(p: int, t: float, now: float) -> None:
        """Node ``p``'s processor is free from ``t``: add the children's sums that have arrived, in step order,
        then upload (at ``now``, the instant being processed, the upload is part of the present cause)."""
        nonlocal seq
        ks = kid_l[p]
        c = nxt[p]
        while c < len(ks):
            a = arr[ks[c]]
            if a == inf:
                nxt[p], cur[p], waiting[p] = c, t, True
                return
            s = a if a > t else t
            add_start[p][c] = s
            d = add_l[p][c]
            t = s + d if d > 0 else s
            silent.append(s)
            silent.append(t)
            c += 1
        nxt[p], waiting[p] = c, False
        tup[p] = t
        a = uair[p]
        if a < 0:
            silent.append(t)
            seq += 1
            heapq.heappush(heap, (t + usec[p], seq, UPEND, p, 0))
        elif t == now:
            arrive(a, t, usec[p], n2 + p)
        else:
            seq += 1
            heapq.heappush(heap, (t, seq, UPREQ, p, 0))

    def downloaded(p: int, t: float) -> None:
        """Node ``p``'s download lands at ``t``: its downlink is released, its own computation runs."""
        t1[p] = t
        release(p, t)
        d = own_l[p]
        te = t + d if d > 0 else t
        silent.append(te)
        chain(p, te, t)

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
        nonlocal tk
        tend[p] = t
        P = par[p]
        if P < 0:
            if roots_in and roots_in[-1][0] == t:
                raise _Undecided("simultaneous root arrivals (SimPy's order decides)")
            roots_in.append((t, p))
            if len(roots_in) == need:
                tk = t
                return True
            return False
        touch(n_airs + P)
        if dl_free[P]:
            dl_free[P] = False
            relay(P, p, t)
        else:
            dl_queue[P].append(p)
        return False

    try:
        owner = -1 - n_airs                                   # the start: no air's fire
        instant = now0
        if download is not None:                              # every download asks for its downlink now, in order
            for p in range(n):
                a = dair[p]
                if a < 0:
                    seq += 1
                    heapq.heappush(heap, (now0 + dsec[0][p], seq, DOWNEND, p, 0))
                else:
                    air = airs[a]
                    air.arrive(now0, dsec[0][p], p)
                    arrivals[a] += 1
            for a, air in enumerate(airs):
                if air.heap:
                    if air.fire == now0:
                        raise _Undecided("a cell air's next timeout falls at the instant it was armed (SimPy's order "
                                         "decides)")
                    seq += 1
                    heapq.heappush(heap, (air.fire, seq, FIRE, a, air.gen))
        else:                                                 # every node computes at once
            for p in range(n):
                d = own_l[p]
                te = now0 + d if d > 0 else now0
                silent.append(te)
                chain(p, te, now0)
        done = False
        while heap:
            t, number, code, x, gen = heapq.heappop(heap)
            if code == FIRE:
                air = airs[x]
                if gen != air.gen:
                    continue                                  # rescheduled since (SimPy's stale timeouts do nothing)
                by = -1 - x
            else:
                by = number
            if t != instant:
                instant = t
                touched.clear()
                busy_events = 0
            owner = by
            busy_events += 1
            if code == FIRE:
                touch(x)
                ended = air.fire_now()
                if air.heap:
                    if air.fire == t:
                        raise _Undecided("a cell air's next timeout falls at the instant it fired (SimPy's order "
                                         "decides)")
                    seq += 1
                    heapq.heappush(heap, (air.fire, seq, FIRE, x, air.gen))
                for tag in ended:                             # in SimPy's order
                    if tag < n:
                        downloaded(tag, t)
                    elif tag < n2:
                        relayed(tag - n, t)
                    elif uploaded(tag - n2, t):
                        if len(ended) > 1:
                            raise _Undecided("another event at the last awaited arrival (SimPy's order decides)")
                        done = True
                        break
            elif code == UPREQ:
                arrive(uair[x], t, usec[x], n2 + x)
            elif code == UPEND:
                done = uploaded(x, t)
            elif code == RELAYEND:
                relayed(x, t)
            else:
                downloaded(x, t)
            if done:
                break
        if not done:
            return "fewer roots arrive than awaited (the processes raise)"
        if busy_events > 1:
            raise _Undecided("another event at the last awaited arrival (SimPy's order decides)")
        while heap:                                           # the next live event must come after t_k
            t, _, code, x, gen = heap[0]
            if code == FIRE and gen != airs[x].gen:
                heapq.heappop(heap)
                continue
            if t == tk:
                raise _Undecided("another event at the last awaited arrival (SimPy's order decides)")
            break
        if tk in silent or not tk > now0:
            raise _Undecided("another event at the last awaited arrival (SimPy's order decides)")
    except _Undecided as why:
        return str(why)

    # -- nothing changed so far; from here on, the step happens --------------------------------------------------
    t1_a, tup_a, tend_a, arr_a = np.array(t1), np.array(tup), np.array(tend), np.array(arr)
    by_down = np.full(n, first_child, dtype=np.int64)         # every download started at now0
    by_down += np.fromiter((sum(g < tk for g in gs) for gs in grants), dtype=np.int64, count=n)
    started = t1_a < tk if download is not None else np.ones(n, dtype=bool)
    by_comp = (own_drew & started).astype(np.int64)
    macs_done = int(own_macs[started].sum())
    for p, starts in enumerate(add_start):
        for c, s in enumerate(starts):
            if s < tk:
                by_comp[p] += add_drew[p, c]
                macs_done += int(add_macs[p, c])
    sent = (tup_a < tk).astype(np.int64)
    for purpose, by in (("downlink", by_down), ("compute", by_comp), ("uplink", sent)):
        took = by > 0
        if took.any():
            streams.advance(idx[took], purpose, rnd, by[took])
    counters.device_macs += macs_done
    if download is not None:
        landed = t1_a < tk
        counters.bits_down += down_bits * int(landed.sum())
        counters.messages += int(landed.sum())
        counters.retransmissions += int(dextra[0][landed].sum())
        for p in np.flatnonzero(landed).tolist():
            nodes[p].state.received = download
    relays = np.flatnonzero(arr_a < tk)                       # children's messages delivered before t_k
    if relays.size:
        counters.bits_down += msg_bits * int(relays.size)
        counters.messages += int(relays.size)
        P = np.asarray(par, dtype=np.intp)[relays]
        R = np.asarray(rrank, dtype=np.intp)[relays]
        counters.retransmissions += int(sum(int(dextra[r][q]) for r, q in zip(R.tolist(), P.tolist())))
    ups = tend_a <= tk                                        # the deciding upload lands at t_k
    counters.bits_up += msg_bits * int(ups.sum())
    counters.messages += int(ups.sum())
    counters.retransmissions += int(uextra[ups].sum())
    for real, count in zip(real_airs, arrivals):             # the reference's airs counted these transfers; idle now
        real.transfers += count
    firsts = [p for _, p in roots_in[:need]]
    got = set(firsts)
    return tk, [(nodes[p], acc[p]) for p in firsts], [nodes[p] for p in range(n) if par[p] < 0 and p not in got]
