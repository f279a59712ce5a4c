"""The reference semantics of every step kind: plain SimPy processes, one per node (or per message).

These are the definitions: every backend (:mod:`fednet.sim.engine.backends`) must give what these give -- the same
simulated times, keyed draws, counters, messages, views and results, bit for bit -- and ``FEDNET_ENGINE=reference``
runs everything here.  Each function takes the protocol's primitives ``net`` (:class:`fednet.protocol.primitives.Net`:
``sim``, ``send``, ``label``, ``epoch``) and the :class:`~fednet.sim.engine.step.Step` the primitive
built; the keys each kind's step carries are listed in its docstring.  A message's width per number is
:func:`fednet.sim.engine.wire.width`'s: declared, else from the payload (as in every backend).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import simpy

from fednet.sim.simulation import Node

from .events import spawner
from .mailbox import AllToAll, CyclicSteps
from .results import GatherResult, StragglerShortfall, compute_key, payload_size
from .step import Step
from . import wire

__all__ = ["gather", "groups", "tree", "compute", "exchange", "masked", "buffered", "first_k", "expand"]


def gather(net: Any, step: Step) -> Generator:
    """Each available node: receive ``download``, wait for ``wait(node)``, compute ``run(node)``, upload the result;
    the first ``first`` arrivals are kept (:func:`first_k`).

    Step keys: ``nodes`` (the available ones), ``absent``, ``first``, ``download``, ``download_kind``,
    ``download_elements``, ``download_bits``, ``run`` (the charged ``fn``, or None), ``macs``, ``kind_of`` (the
    uploads' kind), ``size_of``, ``upload_bits``, ``timing_key``, ``deadline``, ``cancel``, ``wait`` (and, for the
    backends, ``batch``, ``charged``).
    """
    server, run, macs, size_of = net.sim.server, step.run, step.macs, step.size_of
    download, wait, timing_key = step.download, step.wait, step.timing_key
    down_kind, down_elements, down_bits = step.download_kind, step.download_elements, step.download_bits
    up_kind, up_bits, c_key = step.kind_of, step.upload_bits, compute_key(timing_key)   # read once, not per node
    where = f"{net.label}: "

    def work(node: Node) -> Generator:
        """One node's download, computation and upload."""
        if download is not None:
            msg = yield from net.send(server, node, download, kind=down_kind, n_elements=down_elements,
                                      timing_key=timing_key,
                                      element_bits=wire.resolve(download, down_bits, down_kind, arg="download_bits",
                                                                where=where))
            node.state.received = msg.payload
        if wait is not None:
            yield wait(node)
        result = yield from net.sim.compute(node, run, node, macs=None if macs is None else macs(node),
                                            timing_key=c_key)
        yield from net.send(node, server, result, kind=up_kind, n_elements=size_of(result),
                            element_bits=wire.resolve(result, up_bits, up_kind, arg="upload_bits", where=where),
                            timing_key=timing_key)
        return result

    return (yield from first_k(net, [(n, work(n), True) for n in step.nodes], step.first, deadline=step.deadline,
                               dropped=step.absent, cancel=step.cancel))


def groups(net: Any, step: Step) -> Generator:
    """One process per group: the group's gather (dispatched like any gather), then ``then(g, result)``.

    Step keys: ``groups``, ``fn``, ``first`` (one count per group), ``then``, ``kind_of``, ``common`` (the gather's
    other keyword arguments).
    """
    env = net.sim.env

    def one(g: int) -> Generator:
        """Group ``g``'s gather, then what follows it."""
        result = yield from net.gather(step.groups[g], step.fn, first=step.first[g], kind=step.kind_of, **step.common)
        yield from step.then(g, result)
    yield env.all_of([env.process(one(g)) for g in range(len(step.groups))])


def tree(net: Any, step: Step) -> Generator:
    """A process per tree node: download, own part, the children's parts in step order, then up to the parent (or,
    a root, to the server); the first ``first`` roots are kept (:func:`first_k`), inner nodes run beside them.

    Step keys: ``taking_part``, ``complete`` (roots of complete subtrees), ``absent``, ``kids``, ``parent``,
    ``first``, ``download``, ``download_kind``, ``download_bits``, ``own`` and ``add`` (charged), ``kind_of``,
    ``root_kind``, ``n_elements``, ``element_bits`` (and, for the backends, ``edgeless``, ``batch``,
    ``combine_batch``, ``free``).
    """
    sim = net.sim
    env, devs = sim.env, sim.devices
    download, own, add, kids, complete = step.download, step.own, step.add, step.kids, step.complete
    inbox = {(u, v): env.event() for v in step.taking_part for u in kids[v]}
    n_down = None if download is None else payload_size(download)      # the same for every node

    def node_work(v: int) -> Generator:
        """A tree node: compute its part and add its children's parts."""
        node = devs[v]
        if download is not None:
            msg = yield from net.send(sim.server, node, download, kind=step.download_kind, n_elements=n_down,
                                      element_bits=wire.resolve(download, step.download_bits, step.download_kind,
                                                                arg="download_bits", where=f"{net.label}: "))
            node.state.received = msg.payload
        acc = yield from sim.compute(node, own, node)
        for u in kids[v]:                    # in step order
            part = yield inbox[(u, v)]
            acc = yield from sim.compute(node, add, acc, part)
        return acc

    def inner(v: int) -> Generator:
        """An inner tree node: combine the children's parts and send up."""
        acc = yield from node_work(v)
        parent = step.parent[v]
        yield from net.send(devs[v], devs[parent], acc, kind=step.kind_of, n_elements=step.n_elements,
                            element_bits=step.element_bits)
        ev = inbox[(v, parent)]
        if not ev.triggered:
            ev.succeed(acc)

    def root_work(v: int) -> Generator:
        """The root's part of the tree aggregation."""
        acc = yield from node_work(v)
        yield from net.send(devs[v], sim.server, acc, kind=step.root_kind, n_elements=step.n_elements,
                            element_bits=step.element_bits)
        return acc

    items = [(devs[v], root_work(v) if v in complete else inner(v), v in complete) for v in step.taking_part]
    return (yield from first_k(net, items, step.first, dropped=step.absent))


def compute(net: Any, step: Step) -> Generator:
    """Every node computes at once, each on its own processor, a process each; wait for all:
    :meth:`fednet.protocol.primitives.Net.compute_each`.

    Step keys: ``nodes``, ``run`` (the charged ``fn``, or None), ``macs`` (callable or None), ``timing_key`` (the
    compute draw's key).
    """
    env, macs = net.sim.env, step.macs
    procs = [env.process(net.sim.compute(n, step.run, n, macs=None if macs is None else macs(n),
                                         timing_key=step.timing_key)) for n in step.nodes]
    yield env.all_of(procs)
    return {n.index: p.value for n, p in zip(step.nodes, procs)}


def expand(step: Step) -> None:
    """Give an exchange step its pairs step by step (an :class:`AllToAll` or :class:`CyclicSteps` expanded) and a
    per-pair ``payload`` (from ``rows`` where none was given); idempotent."""
    if isinstance(step.steps, (AllToAll, CyclicSteps)):
        step.args["steps"] = step.steps.steps()
    if step.payload is None:
        rows = step.rows

        def payload(src: Node, dst: Node) -> Any:
            """Row ``dst.index`` of ``src``'s table."""
            return rows(src)[dst.index]
        step.args["payload"] = payload


def exchange(net: Any, step: Step) -> Generator:
    """Device-to-device shares through the server on the step's schedule, a process per message (or per sender
    and per destination on ``upload_once`` / ``bundled``): :meth:`fednet.protocol.primitives.Net.exchange`.

    Step keys: ``steps`` (or an :class:`AllToAll` or :class:`CyclicSteps`), ``payload``, ``rows``, ``kind_of``,
    ``schedule``, ``n_elements``, ``element_bits``, ``prepare``, ``mailbox``, ``timing_key``, ``exclusive`` (and, for
    the ``cyclic`` backend, ``alike``).
    """
    expand(step)
    steps, payload, schedule, prepare, mailbox = step.steps, step.payload, step.schedule, step.prepare, step.mailbox
    kind, n_elements, element_bits, timing_key = step.kind_of, step.n_elements, step.element_bits, step.timing_key
    env = net.sim.env
    delivered: dict[tuple[int, int], Any] = {}
    children: list[simpy.Process] = []
    senders: dict[int, Node] = {}
    dsts: dict[int, list[Node]] = {}
    for step in steps:
        for src, dst in step:
            senders.setdefault(src.index, src)
            dsts.setdefault(src.index, []).append(dst)
    if not senders:
        return delivered

    spawn = spawner(env, children)

    def post(src: Node, dst: Node, value: Any) -> None:
        """Deliver ``value`` from ``src`` to ``dst``'s mailbox."""
        delivered[(src.index, dst.index)] = value
        if mailbox is not None:
            mailbox.put(src.index, dst.index, value)

    def relay(src: Node, dst: Node, value: Any) -> Generator:
        """Send ``value`` from ``src`` to ``dst`` through the server (upload, then download)."""
        msg = yield from net.send(src, dst, value, kind=kind, n_elements=n_elements, element_bits=element_bits,
                                   timing_key=timing_key)
        post(src, dst, msg.payload)

    def upload(src: Node) -> Generator:
        """Upload ``src``'s shares to the server once (``upload_once`` / ``bundled``)."""
        if prepare is not None:
            yield from prepare(src)
        if schedule == "bundled":
            value = {dst.index: payload(src, dst) for dst in dsts[src.index]}
            size = None if n_elements is None else n_elements * len(value)
        else:
            value = payload(src, dsts[src.index][0])
            size = n_elements
        msg = yield from net.send(src, net.sim.server, value, kind=kind, n_elements=size,
                                   element_bits=element_bits, encrypted=True, timing_key=timing_key)
        return msg.payload

    def forward(dst: Node, parts: list[tuple[Node, Any]]) -> Generator:
        """Forward the shares the server holds for ``dst`` in one download."""
        size = None if n_elements is None else n_elements * len(parts)
        msg = yield from net.send(net.sim.server, dst, [v for _, v in parts], kind=kind, n_elements=size,
                                   element_bits=element_bits, timing_key=timing_key)
        for (src, _), value in zip(parts, msg.payload):
            post(src, dst, value)

    def forward_copy(src: Node, dst: Node, value: Any) -> Generator:
        """Forward one stored share of ``src`` to ``dst``."""
        msg = yield from net.send(net.sim.server, dst, value, kind=kind, n_elements=n_elements,
                                   element_bits=element_bits, timing_key=timing_key)
        post(src, dst, msg.payload)

    def prepared_sends(src: Node) -> Generator:
        """Wait until ``src`` is prepared, then send its shares by the schedule."""
        if prepare is not None:
            yield from prepare(src)
        sends = [spawn(relay(src, dst, payload(src, dst))) for dst in dsts[src.index]]
        yield env.all_of(sends)

    try:
        if schedule == "relay_asap" and prepare is None:       # every message at once, step by step
            yield env.all_of([spawn(relay(src, dst, payload(src, dst))) for step in steps for src, dst in step])
        elif schedule == "relay_asap":
            yield env.all_of([spawn(prepared_sends(src)) for src in senders.values()])
        elif schedule == "relay_steps":
            if prepare is not None:
                yield env.all_of([spawn(prepare(src)) for src in senders.values()])
            for step in steps:
                yield env.all_of([spawn(relay(src, dst, payload(src, dst))) for src, dst in step])
        else:
            order = sorted(senders) if schedule == "upload_once" else list(senders)
            ups = {i: spawn(upload(senders[i])) for i in order}
            yield env.all_of(list(ups.values()))
            if schedule == "upload_once":
                yield env.all_of([spawn(forward_copy(src, dst, ups[src.index].value))
                                  for step in steps for src, dst in step])
            else:
                by_dst: dict[int, list[tuple[Node, Any]]] = {}
                dst_nodes: dict[int, Node] = {}
                for i in sorted(senders):
                    for dst in dsts[i]:
                        by_dst.setdefault(dst.index, []).append((senders[i], ups[i].value[dst.index]))
                        dst_nodes[dst.index] = dst
                yield env.all_of([spawn(forward(dst_nodes[j], by_dst[j])) for j in sorted(by_dst)
                                  if net.available(dst_nodes[j])])
    except simpy.Interrupt:
        for p in children:
            if p.is_alive:
                p.interrupt("cancelled: the exchange is no longer needed")
    if schedule != "bundled":
        order_keys = [(src.index, dst.index) for step in steps for src, dst in step]
        delivered = {k: delivered[k] for k in order_keys if k in delivered}
    return delivered


def masked(net: Any, step: Step) -> Generator:
    """A masked secure sum over ``nodes`` (LightSecAgg, So et al., MLSys 2022, Sec. 4): processes per user and step.

    Offline, each user runs ``prepare(dev)`` (free: its secret mask), encodes its mask shares on its processor
    (``encode(dev)``, an ``(N, L)`` table kept in ``dev.state.encoded``) and sends row ``j`` to user ``j`` through the
    server (an all-to-all exchange on the ``relay`` schedule, in the background if ``parallel``, else before the
    online phase).  Online, every user downloads ``download``, computes ``local(dev)`` and uploads it; the server
    keeps the first ``first`` = U (the survivors U1, ascending) and the others' work goes on.  Then each survivor
    downloads the survivor list, waits for the encoded masks of every member of U1, computes ``aggregate(dev, U1,
    mailbox)`` and uploads it; whatever is still running is cancelled.

    Step keys: ``nodes``, ``prepare``, ``encode``, ``local``, ``aggregate``, ``first``, ``piece_length`` (L),
    ``download``, ``upload_elements``, ``element_bits`` (the field's numbers), ``download_bits`` (the model's),
    ``relay`` (``"bundled"`` or ``"per_message"``), ``parallel``,
    ``timing_key``, ``kinds`` (message kinds: encoded masks, masked uploads, survivor list, aggregated masks),
    ``precomputed``.

    Returns
    -------
    (U1, online, replies)
        The survivors' indices (ascending), their uploads ``(node, value)`` in order of arrival, and their aggregated
        masks ``(node, value)`` in index order.
    """
    nodes, U, L, key, kinds = step.nodes, step.first, step.piece_length, step.timing_key, step.kinds
    masks = net.mailbox()

    def encode(dev: Node) -> Generator:
        """Offline phase of user ``dev``: its mask and its N encoded shares."""
        step.prepare(dev)
        dev.state.encoded = yield from net.compute(dev, step.encode, dev, timing_key=key)
        masks.put(dev.index, dev.index, dev.state.encoded[dev.index])

    offline = net.exchange(AllToAll(nodes, net.sim.devices), None, rows=lambda src: src.state.encoded,
                           prepare=encode, mailbox=masks, kind=kinds[0],
                           schedule="relay_asap" if step.relay == "per_message" else "bundled",
                           n_elements=L, element_bits=step.element_bits, timing_key=key)
    if step.parallel:
        offline = net.background(offline)
    else:
        yield from offline                            # every mask delivered before the model goes out
        offline = None
    online = yield from net.gather(nodes, step.local, kind=kinds[1], first=U, download=step.download,
                                   download_bits=step.download_bits, upload_elements=step.upload_elements,
                                   upload_bits=step.element_bits, cancel=False)
    U1 = sorted(dev.index for dev in online.nodes)    # the others are dropped this round; their work goes on
    senders, U1_at = frozenset(U1), np.asarray(U1, dtype=np.int64)     # one array for every survivor's read
    devices = net.sim.devices
    survivors = yield from net.gather(
        [devices[i] for i in U1], lambda dev: step.aggregate(dev, U1_at, masks), kind=kinds[3],
        download=np.asarray(U1), download_kind=kinds[2], download_bits=step.element_bits, upload_elements=L,
        upload_bits=step.element_bits,
        wait=lambda dev: masks.wait(dev.index, senders), free=len(U1) == 1,       # |U1| = 1: nothing to add
        timing_key=key)
    net.cancel(online, offline)                       # whatever is still running is not needed
    return U1, online.results, sorted(survivors, key=lambda r: r[0].index)


def buffered(net: Any, step: Step) -> Generator:
    """Asynchronous clients and the server's buffer: at the first take every client of ``nodes`` starts
    ``owner.client_loop(dev)`` as a process of its own (living across rounds: wait for a model version not trained
    on, download, compute, upload, repeat); each take waits for the next ``K`` arrivals ``(dev, version, update)``
    of ``owner.arrivals``, in arrival order.

    Step keys: ``owner`` (a :class:`fednet.protocol.buffered.BufferedAsync`), ``nodes``, ``K`` (and, for the
    backend, ``base``, ``fn``, ``download``, ``download_kind``, ``download_bits``, ``upload_kind``, ``upload_bits``,
    ``concurrency``: what ``client_loop`` uses).
    """
    owner = step.owner
    if owner.clients is None:
        owner.clients = "reference"
        for dev in step.nodes:
            net.background(owner.client_loop(dev))
    buffer = []
    while len(buffer) < step.K:
        buffer.append((yield owner.arrivals.get()))
    return buffer


def first_k(net, items: Sequence[tuple[Node, Generator, bool]], k: int | None, *,
             deadline: float | None = None, dropped: Sequence[Node] = (), cancel: bool = True) -> Generator:
    """:meth:`first_k` over ``(node, generator, counted)``, launched in order; uncounted work
    (inner nodes of a tree) runs beside the counted and is interrupted with the late ones."""
    if deadline is not None and not deadline >= 0:
        raise ValueError(f"deadline must be >= 0 seconds, got {deadline}")
    env = net.sim.env
    n_counted = sum(1 for *_, counted in items if counted)
    need = n_counted if k is None else int(k)
    result = GatherResult(dropped=list(dropped))
    if deadline is None and need > n_counted:
        net._note_failures(result)
        raise StragglerShortfall(f"{net.label}: round {net.epoch} needs {need} results but only "
                                 f"{n_counted} devices are available")
    arrived: list[tuple[Node, Any]] = []
    done = env.event()
    finished = 0

    def wrap(node: Node, gen: Generator) -> Generator:
        """Run one node's work and record its arrival; trigger the wait when enough arrived."""
        nonlocal finished
        try:
            value = yield from gen
            arrived.append((node, value))
        except simpy.Interrupt:
            return
        finally:
            finished += 1
        if not done.triggered and (len(arrived) >= need or finished == n_counted):
            done.succeed()

    def background(gen: Generator) -> Generator:
        """Run ``gen`` to completion unless it is cancelled."""
        try:
            yield from gen
        except simpy.Interrupt:
            return

    if need == 0 or not n_counted:
        net._note_failures(result)
        return result
    procs = [(node, env.process(wrap(node, gen) if counted else background(gen)), counted)
             for node, gen, counted in items]
    yield done if deadline is None else done | env.timeout(deadline)
    late = result.cancelled if done.triggered else result.missed_deadline
    result.results, result.surplus = arrived[:need], arrived[need:]
    for node, p, counted in procs:
        if p.is_alive and not cancel:
            result.pending.append((node, p))
        elif p.is_alive:
            p.interrupt("cancelled: enough results arrived, or the deadline passed")
            if counted:
                late.append(node)
    net._note_failures(result)
    if deadline is None and len(arrived) < need:
        raise StragglerShortfall(f"{net.label}: round {net.epoch} needs {need} results, got {len(arrived)}")
    return result
