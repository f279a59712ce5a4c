"""The SimPy primitives a protocol's round is written with (``yield from self.<primitive>(...)``).

They move messages, charge computation time and report what happened; they do no protocol math.
:class:`Primitives` is a mixin of :class:`fednet.protocol.base.Protocol`; it needs ``sim``,
``label``, ``epoch`` and ``element_bits`` on the object.

==============================  =========================================================================
:meth:`~Primitives.send`         one message (device to server, server to device, or device to device
                                 relayed through the server)
:meth:`~Primitives.broadcast`    the server sends one payload to many devices in parallel
:meth:`~Primitives.send_all`     many messages: in steps with a barrier between steps, or all at once
:meth:`~Primitives.compute_each` a computation on each of a set of nodes, in parallel
:meth:`~Primitives.server_compute`  a computation on the server
:meth:`~Primitives.first_k`      run a piece of work on many nodes, keep the first ``k`` to finish,
                                 cancel the rest (or stop at a deadline)
:meth:`~Primitives.gather`       download, compute, upload on each node; the first ``k`` results
:meth:`~Primitives.exchange`     device-to-device share exchange along given steps, with the sharing
                                 schedules ``relay_steps``, ``relay_asap``, ``upload_once``
:meth:`~Primitives.tree_aggregate`  partial sums climb a :class:`networkx.DiGraph` (child -> parent)
                                 to its roots, which upload to the server; the first ``k`` roots
==============================  =========================================================================

``first_k``, ``gather`` and ``tree_aggregate`` return a :class:`GatherResult`: the results in
order of arrival *and* the failures (who was unavailable, who was cancelled, who missed the
deadline). Failures are never silent: the run loop writes the round's unavailable devices to the
trace's ``dropped`` column.

Paired draws: every primitive takes a ``timing_key``.  The default (``""``) draws a message's losses
from the shared keyed streams ``(device, "uplink" / "downlink", round)`` and a computation's random
delay from ``(node, "compute", round)``; a step that only some protocols have (LightSecAgg's mask
encoding and mask messages, say) names its own key, so that the steps every protocol shares (the
model download, the training step, the gradient upload) take the same draws in each of them
(:class:`fednet.sim.network.Message`, :meth:`fednet.sim.Simulation.compute`).

Charged compute is never silently free: a computation run by ``compute_each``, ``server_compute``,
``gather`` or ``tree_aggregate`` that executes but meters zero MACs raises
:class:`UnchargedCompute` naming the step, unless the call says ``free=True``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import networkx as nx
import numpy as np
import simpy
from simpy.events import NORMAL, URGENT
from simpy.resources.resource import Release

from fednet.errors import DecodeFailure
from fednet.algebra.meter import MacMeter, charge
from fednet.protocol.modes import Shape
from fednet.sim.compute import AlwaysAvailable, compute_seconds
from fednet.sim.network import Message, transmission_times
from fednet.sim.rng import Streams
from fednet.sim.simulation import Node, Simulation

from .tree_replay import replay_tree

__all__ = ["Primitives", "GatherResult", "Outgoing", "Mailbox", "StragglerShortfall", "UnchargedCompute",
           "payload_size", "SCHEDULES", "cyclic_steps", "AllToAll", "compute_key", "compute_seconds", "Batch"]

#: ``batch(nodes, received) -> (values, macs)``: the step ``fn`` of :meth:`Primitives.gather` for many nodes at
#: once, ``values[p]`` being what ``fn(nodes[p])`` returns once ``nodes[p].state.received`` is ``received`` and
#: ``macs[p]`` the MACs that call meters; the batched kernels meter ``sum(macs)`` in all (checked).  It must not
#: change any state (it runs for every node, also those cancelled before they would have computed).
Batch = Callable[[list, Any], tuple[Sequence[Any], Sequence[int]]]

#: Whether :meth:`Primitives.gather` and :meth:`Primitives.tree_aggregate` (without tree edges) may take the
#: event-free path of :meth:`Primitives._fast_rounds` when nothing else is scheduled (same results, bit for bit).
FAST_PATH = True

#: Whether a :class:`Mailbox` materialises only the events that complete a wait (same results, O(N) events).
LAZY_MAILBOX = True

#: Whether a :meth:`Primitives.gather` or edgeless :meth:`Primitives.tree_aggregate` given a ``batch`` (the
#: same math for many nodes at once) on the event-free path computes every node's value with one batched call
#: and replays the step with vectorised draws and bookkeeping (:meth:`Primitives._replay_vectorised`; same
#: results, bit for bit: ``tests/test_batched.py``).  False: ``fn`` runs node by node.
BATCHED = True

#: Whether :meth:`Primitives.exchange` of an :class:`AllToAll` on the ``bundled`` schedule, given ``rows``, moves each
#: sender's and each destination's shares as one array (one :meth:`Mailbox.put_many` per destination) instead of
#: one object per pair: the same messages, draws, events and results, bit for bit (``tests/test_bulk_exchange.py``),
#: with ``O(N)`` Python work instead of ``O(N^2)`` for ``N`` devices (LightSecAgg at D = 1000: issue 12); and
#: whether the ``relay_asap`` / ``relay_steps`` schedules, where no other process can act meanwhile, are replayed
#: with array arithmetic instead of two SimPy hops per message (:meth:`Primitives._replay_relays`; the same
#: results, bit for bit: ``tests/test_codedsecagg_setup.py``; CodedSecAgg's set-up at D = 1000: issue 12).
BULK_EXCHANGE = True

#: Whether the forwards of :meth:`Primitives._bulk_bundled` (one download per destination once every upload is in),
#: on idle downlinks with nothing else due at that instant, run without a process each: every forward's draw, link
#: hold and end are taken at once and its end is one event (:meth:`Primitives._replay_forwards`; the same results,
#: bit for bit: ``tests/test_replay_forwards.py``; LightSecAgg at D = 1000: issue 12).
REPLAY_FORWARDS = True

#: Whether :meth:`Primitives.gather_groups` of two or more disjoint groups, where no other process can act meanwhile,
#: replays every group's download, compute and upload without a process per device, the groups interleaved in SimPy's
#: order (:meth:`Primitives._fast_groups`; the same results, bit for bit: ``tests/test_gather_groups.py``;
#: CodedPaddedFL with grouping at D = 1000: issue 12).
GROUPS_REPLAY = True

#: Whether :meth:`Primitives.tree_aggregate` over a tree with edges, given a ``batch``, where no other process can
#: act meanwhile, replays the round arithmetically instead of a process per device
#: (:func:`fednet.protocol.tree_replay.replay_tree`; the same results, bit for bit: ``tests/test_tree_replay.py``;
#: CodedSecAgg with grouping at D = 1000: issue 12).
TREE_REPLAY = True

#: The keyed draws of :class:`fednet.sim.rng.Streams` as defined there: the vectorised replay looks at draws
#: before taking them, so where one of these is overridden (or patched) it leaves the step to the node-by-node one.
_STREAM_DRAWS = {name: getattr(Streams, name) for name in ("uniform", "uniforms", "uniforms_in_turn", "advance")}


def _draws_plain(streams: Streams) -> bool:
    """Whether none of the keyed draws of ``streams``' class is overridden (:data:`_STREAM_DRAWS`)."""
    return all(getattr(type(streams), name) is f for name, f in _STREAM_DRAWS.items())

#: The sharing schedules of :meth:`Primitives.exchange`.
SCHEDULES = ("relay_steps", "relay_asap", "upload_once", "bundled")


class StragglerShortfall(DecodeFailure):
    """Fewer nodes responded than a :meth:`Primitives.gather` (or ``first_k``, ``tree_aggregate``) needed.

    A :class:`fednet.errors.DecodeFailure` (hence a ``RuntimeError``): in a study the round is
    recorded with ``decode_failed = True`` unless the study sets ``strict = true``.
    """


class UnchargedCompute(RuntimeError):
    """A charged computation step executed but metered zero MACs (pass ``free=True`` if deliberate)."""


def payload_size(payload: Any) -> int:
    """Number of numbers in a payload: an array's size, or the sum over a tuple/list/dict of arrays.

    Objects with a ``size`` attribute (the timing mode's shape stand-ins) count ``size``.

    Raises
    ------
    TypeError
        For a payload of a type without a size (pass ``n_elements``).
    """
    if isinstance(payload, np.ndarray):
        return int(payload.size)
    if isinstance(payload, (tuple, list)):
        return sum(payload_size(p) for p in payload)
    if isinstance(payload, dict):
        return sum(payload_size(p) for p in payload.values())
    if isinstance(payload, (int, float, np.number)):
        return 1
    if hasattr(payload, "size"):
        return int(payload.size)
    raise TypeError(f"cannot size a payload of type {type(payload).__name__}; pass n_elements")


@dataclass
class Outgoing:
    """A message to be sent by :meth:`Primitives.send_all`.

    Attributes
    ----------
    src, dst : Node
    payload : Any
    kind : str
    n_elements : int or None
        Defaults to :func:`payload_size` of the payload.
    element_bits : int or None
        Defaults to the protocol's ``element_bits``.
    encrypted : bool
        A message to the server that it only stores and forwards (see :meth:`Primitives.send`).
    timing_key : str
        Key of the message's loss draws (see :meth:`Primitives.send`).
    """

    src: Node
    dst: Node
    payload: Any
    kind: str
    n_elements: int | None = None
    element_bits: int | None = None
    encrypted: bool = False
    timing_key: str = ""


@dataclass
class GatherResult:
    """What a :meth:`Primitives.gather`, ``first_k`` or ``tree_aggregate`` step produced.

    Iterating, indexing and ``len`` act on :attr:`results` (so ``for node, value in result`` works).

    Attributes
    ----------
    results : list of (Node, Any)
        The results that were kept, in order of arrival at the server (at most ``k``).
    dropped : list of Node
        Nodes that took no part: unavailable this round (availability model), or, in a tree, in a
        root's subtree that holds an unavailable node.
    cancelled : list of Node
        Nodes still working when enough results had arrived; their work was interrupted.
    missed_deadline : list of Node
        Nodes still working when the deadline passed; their work was interrupted.
    surplus : list of (Node, Any)
        Results that arrived at the same simulated instant as the ``k``-th but after it (not used).
    pending : list of (Node, simpy.Process)
        With ``cancel=False``: the work still running when the ``k``-th result arrived (it goes on
        until :meth:`Primitives.cancel`; later results are not collected).
    stacked : ndarray or None
        When a batch produced the values as one array: :attr:`values` as one array, rows in order
        of arrival (the same numbers; saves the server stacking them again). Made on first use from
        :attr:`stack_rows`.
    stack_rows : (ndarray, ndarray of int) or None
        The batch's array (rows in the nodes' order) and the rows of :attr:`values` in it, in order of
        arrival: :attr:`stacked` without the copy (``stack[rows]``), for a server that reads the rows in order.
    """

    results: list[tuple[Node, Any]] = field(default_factory=list)  # a property below (made on first use)
    dropped: list[Node] = field(default_factory=list)
    cancelled: list[Node] = field(default_factory=list)
    missed_deadline: list[Node] = field(default_factory=list)
    surplus: list[tuple[Node, Any]] = field(default_factory=list)
    pending: list[tuple[Node, Any]] = field(default_factory=list)
    stack_rows: tuple[np.ndarray, np.ndarray] | None = None
    _stacked: Any = field(default=None, init=False, repr=False)
    #: (nodes, values, positions, indices): :attr:`results` not made yet (see :meth:`_arrived`)
    _lazy: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def _arrived(self, nodes: Sequence[Node], values: Sequence[Any], positions: list[int],
                 indices: list[int]) -> None:
        """Set :attr:`results` to ``(nodes[p], values[p])`` for ``p`` in ``positions``, made on first use
        (a server that reads only :attr:`stack_rows` and :attr:`indices` never makes a thousand row views);
        ``indices`` are those nodes' indices."""
        self._lazy = (nodes, values, positions, indices)

    @property
    def indices(self) -> list[int]:
        """The indices of the nodes of :attr:`results`, in order of arrival."""
        if self._lazy is not None:
            return list(self._lazy[3])
        return [n.index for n, _ in self.results]

    @property
    def stacked(self) -> Any:
        """The kept values as one array in order of arrival, or None (class docstring)."""
        if self._stacked is None and self.stack_rows is not None:
            stack, rows = self.stack_rows
            self._stacked = stack[rows]
        return self._stacked

    @property
    def nodes(self) -> list[Node]:
        """The nodes of :attr:`results`, in order of arrival."""
        return [n for n, _ in self.results]

    @property
    def values(self) -> list[Any]:
        """The values of :attr:`results`, in order of arrival."""
        return [v for _, v in self.results]

    def __iter__(self) -> Iterator[tuple[Node, Any]]:
        return iter(self.results)

    def _get_results(self) -> list[tuple[Node, Any]]:
        if self._lazy is not None:
            nodes, values, positions, _ = self._lazy
            self._results = [(nodes[p], values[p]) for p in positions]
            self._lazy = None
        return self._results

    def _set_results(self, results: list[tuple[Node, Any]]) -> None:
        self._lazy = None
        self._results = results

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i):
        return self.results[i]



GatherResult.results = property(GatherResult._get_results, GatherResult._set_results,  # type: ignore[assignment]
                                doc="The kept ``(node, value)`` pairs, in order of arrival (class docstring).")


def _spawner(env: simpy.Environment, children: list[simpy.Process]) -> Callable[[Generator], simpy.Process]:
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

class _Block:
    """Payloads delivered to one node at once by :meth:`Mailbox.put_many`: row ``k`` of ``rows`` from ``srcs[k]``.

    The pair of ``srcs[k]`` is stamped ``(time, priority, eid0 + k)``, the key its event would have had had
    the pairs been put one by one in the order of ``srcs``.  Membership is looked up in the sorted senders
    (no Python set of them is built: ``O(N)`` senders per block, ``N`` blocks a round at D = N = 1000).
    """

    __slots__ = ("srcs", "sorted", "order", "key", "rows", "ascending")

    def __init__(self, srcs: np.ndarray, key: tuple, rows: Any) -> None:
        self.srcs, self.key, self.rows = srcs, key, rows
        self.ascending = bool((srcs[1:] > srcs[:-1]).all())
        self.order = np.arange(len(srcs)) if self.ascending else np.argsort(srcs, kind="stable")
        self.sorted = srcs if self.ascending else srcs[self.order]

    def holds(self, src: int) -> bool:
        """Whether ``src`` sent a row of this block."""
        at = int(np.searchsorted(self.sorted, src))
        return at < len(self.sorted) and int(self.sorted[at]) == src

    def among(self, srcs: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(senders, found, position)``: ``srcs`` as an array, which of them this block holds, and their rows
        (where found)."""
        m = np.fromiter(srcs, np.int64)
        return (m, *self.positions(m))

    def positions(self, srcs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, position)``: which of ``srcs`` this block holds, and their rows (where found)."""
        at = np.minimum(np.searchsorted(self.sorted, srcs), len(self.sorted) - 1)
        return self.sorted[at] == srcs, self.order[at]

    def stamp(self, position: int) -> tuple:
        """The heap key of the pair at row ``position``."""
        t, prio, eid0 = self.key
        return (t, prio, eid0 + position)


class Mailbox:
    """Payloads delivered from node to node, with events to wait for a given set of senders.

    :meth:`Primitives.exchange` posts every delivered payload here when given one; a protocol may
    post a node's own share itself. Nodes are named by index.

    The behaviour is that of one SimPy event per ``(src, dst)`` pair, triggered by :meth:`put`, and of
    :meth:`wait` as ``env.all_of`` over a receiver's pairs -- but in an
    :class:`fednet.sim.simulation.Environment` only the event that completes a wait is materialised:
    :meth:`put` stamps the pair with the heap key its event would have had (its time, priority and
    a fresh id); a wait completes when the event of its last delivered pair is processed, which is
    pushed at exactly that key (or, if that key is below the event being processed, the wait
    completes at once). Processing the other pairs' events had no effect but counting, so an
    all-to-all exchange of ``N`` devices costs ``O(N)`` events instead of ``N^2`` and everything
    happens in the same order (LightSecAgg at D = 1000: issue 12).

    :meth:`put_many` delivers many payloads to one node as one block (what :meth:`put` of each, in
    order, would do, with ``O(1)`` Python work per block and per waiter), :meth:`get_many` reads
    many as one array: with them the bundled exchange of ``N`` devices costs ``O(N)`` Python work.

    Parameters
    ----------
    env : simpy.Environment
    """

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._box: dict[tuple[int, int], Any] = {}
        self._lazy = LAZY_MAILBOX and hasattr(env, "current")
        self._events: dict[tuple[int, int], simpy.Event] = {}      # eager mode: one event per pair
        self._stamp: dict[tuple[int, int], tuple] = {}             # pair put alone -> heap key of its (virtual) event
        self._singles: dict[int, set[int]] = {}                    # dst -> the srcs of its pairs put alone
        self._blocks: dict[int, list[_Block]] = {}                 # dst -> its blocks, in order of delivery
        self._relay: dict[tuple[int, int], simpy.Event] = {}       # pair -> its event, once materialised
        self._waiting: dict[int, list[list]] = {}                  # dst -> waiters [srcs still missing, done event,
        #                                                            the same srcs as an array, or None]
        self._arrays: dict[int, tuple[frozenset, np.ndarray]] = {}  # id -> a frozenset waited for, as an array

    def _event(self, src: int, dst: int) -> simpy.Event:
        if (src, dst) not in self._events:
            self._events[(src, dst)] = self.env.event()
        return self._events[(src, dst)]

    def _materialise(self, pair: tuple[int, int], key: tuple, then: Callable[[Any], None]) -> None:
        """Put the pair's event in the heap at its key (once) and call ``then`` when it is processed."""
        ev = self._relay.get(pair)
        if ev is None:
            ev = self._relay[pair] = simpy.Event(self.env)
            ev._ok, ev._value = True, None
            heapq.heappush(self.env._queue, (*key, ev))
        ev.callbacks.append(then)

    def _delivered(self, dst: int, srcs: set[int], block: _Block | None = None) -> None:
        """Strike ``srcs`` (just delivered to ``dst``: one pair put alone, or ``block``) from its waiters;
        complete those that now hold every pair, at the key of the last of their pairs delivered."""
        waiters = self._waiting.get(dst)
        if not waiters:
            return
        for waiter in waiters:                     # in order of registration, as SimPy would call them
            if block is None:
                hit = waiter[0] & srcs
                if not hit:
                    continue
                waiter[0] -= hit
                waiter[2] = None                   # its array would need the same strike: made again if needed
                if waiter[0]:
                    continue
                (src,) = hit                       # the last pair it needed: its event completes the wait
                key = self._stamp[(src, dst)]
            else:
                m = waiter[2] if waiter[2] is not None else np.fromiter(waiter[0], np.int64)
                found, at = block.positions(m)
                if not found.all():                # some pairs it needs are still to come
                    if found.any():
                        waiter[0] -= set(m[found].tolist())
                        m = m[~found]
                    waiter[2] = m
                    continue
                waiter[0] = set()                  # the last of its pairs in this block completes the wait
                k = int(at.max())
                src, key = int(block.srcs[k]), block.stamp(k)
            self._materialise((src, dst), key, lambda _ev, done=waiter[1]: done.succeed())
        self._waiting[dst] = [w for w in waiters if w[0]]

    def put(self, src: int, dst: int, payload: Any) -> None:
        """Deliver ``payload`` from ``src`` to ``dst`` (once per pair).

        Raises
        ------
        ValueError
            If ``(src, dst)`` was already delivered.
        """
        if (src, dst) in self._box or any(b.holds(src) for b in self._blocks.get(dst, ())):
            raise ValueError(f"a payload from {src} to {dst} was already delivered")
        self._box[(src, dst)] = payload
        if not self._lazy:
            self._event(src, dst).succeed()
            return
        self._stamp[(src, dst)] = (self.env.now, NORMAL, next(self.env._eid))
        self._singles.setdefault(dst, set()).add(src)
        self._delivered(dst, {src})

    def put_many(self, srcs: Sequence[int] | np.ndarray, dst: int, rows: Any) -> None:
        """Deliver row ``k`` of ``rows`` from ``srcs[k]`` to ``dst``, for every ``k``: :meth:`put` of each in order.

        Parameters
        ----------
        srcs : sequence or ndarray of int, (n,)
            Distinct senders.
        dst : int
        rows : ndarray (n, ...) or :class:`~fednet.protocol.modes.Shape` of shape (n, ...)
            The payloads, one row per sender (:meth:`get` returns ``rows[k]``).

        Raises
        ------
        ValueError
            If a pair was already delivered or ``srcs`` repeats a sender.
        """
        srcs = np.asarray(srcs, dtype=np.int64).reshape(-1)
        if not self._lazy:
            for k, src in enumerate(srcs.tolist()):
                self.put(src, dst, rows[k])
            return
        if not len(srcs):
            return
        env = self.env
        eid0 = next(env._eid)
        block = _Block(srcs, (env.now, NORMAL, eid0), rows)
        again: set[int] = set()
        singles = self._singles.get(dst)
        if singles:
            m, found, _ = block.among(singles)
            again.update(m[found].tolist())
        for other in self._blocks.get(dst, ()):
            again.update(block.sorted[other.positions(block.sorted)[0]].tolist())
        twice = np.flatnonzero(np.diff(block.sorted) == 0)
        if again or len(twice):
            src = min(again) if again else int(block.sorted[twice[0]])
            raise ValueError(f"a payload from {src} to {dst} was already delivered")
        env._eid = itertools.count(eid0 + len(srcs))       # one id per pair, as len(srcs) puts would draw
        self._blocks.setdefault(dst, []).append(block)
        self._delivered(dst, set(), block)

    def get(self, src: int, dst: int) -> Any:
        """The payload ``src`` delivered to ``dst`` (KeyError if none)."""
        try:
            return self._box[(src, dst)]
        except KeyError:
            for block in self._blocks.get(dst, ()):
                if block.holds(src):
                    _, at = block.positions(np.array([src], dtype=np.int64))
                    return block.rows[int(at[0])]
            raise

    def get_many(self, srcs: Sequence[int] | np.ndarray, dst: int) -> Any:
        """The payloads ``srcs`` delivered to ``dst`` as one array, row ``k`` from ``srcs[k]`` (KeyError if one is missing).

        Returns
        -------
        ndarray (len(srcs), ...) or Shape
            The rows stacked (their common dtype); a :class:`~fednet.protocol.modes.Shape` of that shape
            where the payloads are timing-mode stand-ins.
        """
        srcs = np.asarray(srcs, dtype=np.int64).reshape(-1)
        todo = np.ones(len(srcs), dtype=bool)
        pieces: list[tuple[np.ndarray, Any]] = []          # (rows of the result, the same rows of a block)
        for block in self._blocks.get(dst, ()):
            found, at = block.positions(srcs)
            found &= todo
            if found.any():
                pieces.append((np.flatnonzero(found), _take(block.rows, at[found])))
                todo &= ~found
        where = np.flatnonzero(todo)
        singles = [self._box[(src, dst)] for src in srcs[where].tolist()]
        parts = [rows for _, rows in pieces] + singles
        if not parts:
            return np.empty((0,))
        if all(isinstance(p, Shape) for p in parts):
            first = parts[0]
            row = first.shape[1:] if pieces else first.shape
            return Shape((len(srcs), *row), first.dtype)
        if not pieces:
            return np.stack(singles)
        first = pieces[0][1]
        out = np.empty((len(srcs), *first.shape[1:]), dtype=np.result_type(*parts))
        for at, rows in pieces:
            out[at] = rows
        for k, value in zip(where.tolist(), singles):
            out[k] = value
        return out

    def wait(self, dst: int, srcs: Iterable[int]) -> simpy.Event:
        """An event that fires once ``dst`` holds a payload from every node of ``srcs`` (a frozenset of
        ints is taken as it is: pass one when many nodes wait for the same senders).

        It fires when the event of the last of these pairs to be delivered is processed, as
        ``env.all_of`` over the pairs' events would (its value is None, not a condition value).
        """
        if not self._lazy:
            return self.env.all_of([self._event(int(i), dst) for i in srcs])
        env = self.env
        done = env.event()
        if isinstance(srcs, frozenset):            # one sorted array for every waiter on these senders
            want = srcs
            held = self._arrays.get(id(srcs))
            if held is None or held[0] is not srcs:
                held = self._arrays[id(srcs)] = (srcs, np.sort(np.fromiter(srcs, np.int64, len(srcs))))
            arr = held[1]
        else:
            want = set(map(int, srcs))
            arr = np.sort(np.fromiter(want, np.int64, len(want)))
        best: tuple[int, tuple] | None = None      # the delivered pair of the largest key: (src, key)
        alone = want & self._singles.get(dst, set())
        for src in alone:
            key = self._stamp[(src, dst)]
            if best is None or key > best[1]:
                best = (src, key)
        if alone:                                  # the senders still to look for
            arr = np.delete(arr, np.searchsorted(arr, np.fromiter(alone, np.int64, len(alone))))
        struck = False                             # whether a block held some of them
        for block in self._blocks.get(dst, ()):
            if not len(arr):
                break
            found, at = block.positions(arr)
            if found.any():
                k = int(at[found].max())
                if best is None or block.stamp(k) > best[1]:
                    best = (int(block.srcs[k]), block.stamp(k))
                arr, struck = arr[~found], True
        if len(arr):                               # some pairs are still to come
            self._waiting.setdefault(dst, []).append([set(arr.tolist()) if struck else want - alone, done, arr])
            return done
        if best is None:                           # no senders
            done.succeed()
            return done
        src, key = best
        if key < env.current:                       # every pair's event was processed already
            done.succeed()
        else:                                       # the last one is still in SimPy's queue
            self._materialise((src, dst), key, lambda _ev: done.succeed())
        return done


def _take(rows: Any, at: np.ndarray) -> Any:
    """Rows ``at`` of an array, or the :class:`~fednet.protocol.modes.Shape` of those rows of a stand-in."""
    if isinstance(rows, Shape):
        return Shape((len(at), *rows.shape[1:]), rows.dtype)
    return rows[at]


def cyclic_steps(groups: Sequence[Sequence[Node]]) -> list[list[tuple[Node, Node]]]:
    """All-to-all inside each group in ``n - 1`` steps: in step ``r`` local node ``i`` sends to ``(i + r) mod n``.

    Parameters
    ----------
    groups : sequence of sequences of Node
        Groups of equal size ``n``.

    Returns
    -------
    list of list of (src, dst)
        Step ``r - 1`` for ``r = 1 .. n - 1``, groups in order, senders in local order.
    """
    sizes = {len(g) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"groups must have equal sizes, got sizes {sorted(sizes)}")
    n = sizes.pop() if sizes else 0
    groups = [list(members) for members in groups]
    return [[pair for members in groups for pair in zip(members, members[r:] + members[:r])] for r in range(1, n)]


@dataclass(frozen=True)
class AllToAll:
    """One step of :meth:`Primitives.exchange`: every sender to every receiver but itself.

    The step ``[(src, dst) for src in senders for dst in receivers if dst is not src]``, kept as the two
    lists so that the bundled schedule can move it without forming its ``N^2`` pairs (:data:`BULK_EXCHANGE`).

    Attributes
    ----------
    senders, receivers : sequence of Node
        Each without repeats.
    """

    senders: Sequence[Node]
    receivers: Sequence[Node]

    def steps(self) -> list[list[tuple[Node, Node]]]:
        """The pairs, as the one step they stand for."""
        return [[(src, dst) for src in self.senders for dst in self.receivers if dst is not src]]


class _Bundles(Mapping):
    """What a bulk bundled exchange delivered, ``{(src, dst): payload}`` in order of delivery, kept by block."""

    def __init__(self) -> None:
        self._blocks: list[tuple[int, np.ndarray, Any]] = []
        self._index: dict[int, int] = {}

    def add(self, dst: int, srcs: np.ndarray, rows: Any) -> None:
        """``dst`` received row ``k`` of ``rows`` from ``srcs[k]``, ``srcs`` ascending."""
        self._index[dst] = len(self._blocks)
        self._blocks.append((dst, srcs, rows))

    def __getitem__(self, pair: tuple[int, int]) -> Any:
        src, dst = pair
        if dst in self._index:
            _, srcs, rows = self._blocks[self._index[dst]]
            k = int(np.searchsorted(srcs, src))
            if k < len(srcs) and srcs[k] == src:
                return rows[k]
        raise KeyError(pair)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((src, dst) for dst, srcs, _ in self._blocks for src in srcs.tolist())

    def __len__(self) -> int:
        return sum(len(srcs) for _, srcs, _ in self._blocks)


def _stack(tables: Sequence[Any]) -> Any:
    """Equal arrays stacked on a new first axis, or the :class:`~fednet.protocol.modes.Shape` of that stack."""
    if all(isinstance(t, Shape) for t in tables):
        shapes = {(t.shape, np.dtype(t.dtype)) for t in tables}
        if len(shapes) > 1:
            raise ValueError(f"the rows of an exchange must have one shape, got {sorted(shapes, key=str)}")
        return Shape((len(tables), *tables[0].shape), tables[0].dtype)
    if any(isinstance(t, Shape) for t in tables) or not all(isinstance(t, np.ndarray) for t in tables):
        raise TypeError("the rows of an exchange must all be ndarrays or all timing-mode Shape stand-ins")
    return np.stack(tables)


def compute_key(timing_key: str) -> str:
    """The engine's compute-draw key for a primitive's ``timing_key``: ``"compute"`` or ``"compute-<key>"``."""
    return f"compute-{timing_key}" if timing_key else "compute"



def _uploaded_elements(upload_elements: int | Callable[[Any], int] | None) -> Callable[[Any], int]:
    """The number of elements a node uploads for its result: ``upload_elements(result)``, the given count, or
    :func:`payload_size` of the result; marked ``by_shape`` when it depends only on the result's shape."""
    def size_of(result: Any) -> int:
        """Number of uploaded elements of ``result``."""
        if callable(upload_elements):
            return upload_elements(result)
        return upload_elements if upload_elements is not None else payload_size(result)
    size_of.by_shape = not callable(upload_elements)     # the same for values of one shape
    return size_of


def _event_at(env: simpy.Environment, t: float) -> simpy.Event:
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


def _fifo_links(arrive: np.ndarray, seconds: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _event_order(times: np.ndarray, pred: np.ndarray, base: np.ndarray) -> np.ndarray:
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


class Primitives:
    """SimPy sub-generators that move messages and charge time (module docstring)."""

    sim: Any
    label: str
    epoch: int

    # -- bookkeeping -----------------------------------------------------------------------
    def available(self, node: Node) -> bool:
        """Whether ``node`` takes part in the current round (availability model).

        A shorthand for :meth:`fednet.sim.Simulation.available`, which draws each device's
        availability once per round and answers every later question from that draw, so every
        primitive, protocol and the setup-phase reaction see the same set of present devices.
        """
        return self.sim.available(node)

    def _note_failures(self, result: GatherResult) -> None:
        """Add the unavailable nodes of a step to this round's ``dropped`` set."""
        dropped = getattr(self, "round_dropped", None)
        if dropped is not None:
            dropped.update(n.index for n in result.dropped)

    def _charged(self, fn: Callable[..., Any], step: str, free: bool) -> Callable[..., Any]:
        """``fn`` wrapped so that executing it without metering a MAC raises (unless ``free``)."""
        if free:
            return fn

        def run(*args: Any, **kwargs: Any) -> Any:
            """Run ``fn`` under a MAC meter; raise :class:`UnchargedCompute` if it charged none."""
            with MacMeter() as meter:
                out = fn(*args, **kwargs)
            if meter.macs == 0:
                name = getattr(fn, "__qualname__", repr(fn))
                raise UnchargedCompute(f"{self.label}: step {step!r} ran {name} but it charged 0 MACs; "
                                       f"compute with metered kernels (fednet.algebra.meter) or pass free=True")
            return out
        return run

    # -- messages --------------------------------------------------------------------------
    def _message(self, src: Node, dst: Node, payload: Any, kind: str, n_elements: int | None,
                 element_bits: int | None, encrypted: bool = False, timing_key: str = "") -> Message:
        return Message(src.index, dst.index, kind, payload,
                       payload_size(payload) if n_elements is None else int(n_elements),
                       element_bits or self.element_bits, round=self.sim.round, encrypted=encrypted,
                       timing_key=timing_key)

    def send(self, src: Node, dst: Node, payload: Any, *, kind: str, n_elements: int | None = None,
             element_bits: int | None = None, encrypted: bool = False,
             timing_key: str = "") -> Generator[Any, Any, Message]:
        """Send one message and wait until it is delivered; returns the :class:`Message`.

        Parameters
        ----------
        src, dst : Node
        payload : Any
        kind : str
            The message's kind (traces and views).
        n_elements : int, optional
            Numbers on the wire (default :func:`payload_size`).
        element_bits : int, optional
            Bits per number (default the protocol's ``element_bits``).
        encrypted : bool
            Marks a message to the server that the server only stores and forwards (end-to-end
            encrypted for other devices): it goes to the server's ``relayed`` list, not its view.
            Device-to-device messages are always encrypted.
        timing_key : str
            ``""`` (default): the message's losses come from the shared keyed draws of
            ``(device, "uplink" / "downlink", round)``; a message only this protocol sends (mask
            shares, say) names its own key and draws from ``"uplink:<key>"`` / ``"downlink:<key>"``,
            leaving the shared draws to the messages every protocol sends (module docstring).
        """
        msg = self._message(src, dst, payload, kind, n_elements, element_bits, encrypted, timing_key)
        return (yield from self.sim.transfer(msg))

    def broadcast(self, payload: Any, *, kind: str, to: Iterable[Node] | None = None,
                  n_elements: int | None = None, element_bits: int | None = None) -> Generator:
        """Send ``payload`` from the server to every device in ``to`` (default: all) in parallel.

        Each device's downlink is its own resource, so this lasts as long as the slowest
        download. Returns the delivered messages, in the order of ``to``.
        """
        env = self.sim.env
        targets = list(self.sim.devices if to is None else to)
        procs = [env.process(self.send(self.sim.server, dev, payload, kind=kind, n_elements=n_elements,
                                       element_bits=element_bits)) for dev in targets]
        yield env.all_of(procs)
        return [p.value for p in procs]

    def _launch(self, o: Outgoing) -> simpy.Process:
        return self.sim.env.process(self.send(o.src, o.dst, o.payload, kind=o.kind, n_elements=o.n_elements,
                                              element_bits=o.element_bits, encrypted=o.encrypted,
                                              timing_key=o.timing_key))

    def send_all(self, steps: Sequence[Sequence[Outgoing]], *, barrier: bool = True) -> Generator:
        """Send messages in steps.

        Parameters
        ----------
        steps : sequence of sequences of Outgoing
            With ``barrier=True`` every message of a step is sent in parallel and the next step
            starts when the whole step is delivered (a synchronous schedule). With
            ``barrier=False`` all messages are launched at once, in order, and each link serves
            its queue first come, first served (each transfer starts as soon as its link is free).

        Returns
        -------
        list of list of Message
            The delivered messages, step by step.
        """
        env = self.sim.env
        out: list[list[Message]] = []
        if barrier:
            for step in steps:
                procs = [self._launch(o) for o in step]
                yield env.all_of(procs)
                out.append([p.value for p in procs])
        else:
            launched = [[self._launch(o) for o in step] for step in steps]
            yield env.all_of([p for step in launched for p in step])
            out = [[p.value for p in step] for step in launched]
        return out

    def background(self, gen: Generator) -> simpy.Process:
        """Start ``gen`` as a process beside the caller (cancel it with :meth:`cancel`)."""
        return self.sim.env.process(gen)

    def cancel(self, *items: Any) -> None:
        """Interrupt what is still running: processes, or the ``pending`` work of a :class:`GatherResult` (None: skipped)."""
        for item in items:
            if item is None:
                continue
            procs = [p for _, p in item.pending] if isinstance(item, GatherResult) else [item]
            for p in procs:
                if p.is_alive:
                    p.interrupt("cancelled: the round is over")

    def exchange(self, steps: Sequence[Sequence[tuple[Node, Node]]] | AllToAll,
                 payload: Callable[[Node, Node], Any] | None, *,
                 kind: str, schedule: Literal["relay_steps", "relay_asap", "upload_once", "bundled"] = "relay_steps",
                 n_elements: int | None = None, element_bits: int | None = None,
                 prepare: Callable[[Node], Generator] | None = None, mailbox: Mailbox | None = None,
                 rows: Callable[[Node], Any] | None = None, timing_key: str = "",
                 exclusive: bool = False) -> Generator:
        """Device-to-device exchange of shares, relayed through the server, on a sharing schedule.

        Parameters
        ----------
        steps : sequence of sequences of (src, dst), or AllToAll
            Who sends to whom, step by step (e.g. :func:`cyclic_steps` for all-to-all in groups,
            or the rows of a gradient code's support matrix); an :class:`AllToAll` is its one step.
        payload : callable(src, dst) -> Any, or None
            The share ``src`` sends to ``dst`` (evaluated once ``src`` is prepared); None: ``rows(src)[dst.index]``.
        kind : str
        schedule : {"relay_steps", "relay_asap", "upload_once", "bundled"}
            ``relay_steps``: the steps in turn, each an upload and a download per message, the next
            step starting when the slowest message of the step is delivered. ``relay_asap``: every
            message launched as soon as its sender is prepared; each link serves its queue first
            come, first served. ``upload_once``: every sender uploads once (encrypted: the server
            only stores it), then, when all uploads are in, the server forwards it to each of its
            destinations, all forwards launched at once (one upload and ``len(dsts)`` downloads per
            sender; meant for a payload that does not depend on ``dst``: the upload carries
            ``payload(src, first dst)``). ``bundled``: every sender uploads one message holding its
            shares for all its destinations (``n_elements`` each); when all uploads are in, the
            server sends each destination *available this round* one message holding the shares
            addressed to it (senders in index order).
        n_elements, element_bits : int, optional
            Size of each share (default :func:`payload_size`) and bits per number.
        prepare : callable(src) -> generator, optional
            Run for each sender (in parallel, in order of first appearance) before its shares are
            formed, e.g. its encoding on its processor.
        mailbox : Mailbox, optional
            Every delivered share is also posted here as it arrives.
        rows : callable(src) -> ndarray or Shape, optional
            All of ``src``'s shares as one table (evaluated once ``src`` is prepared), row ``dst.index``
            being ``payload(src, dst)``: an ndarray, or a timing-mode :class:`~fednet.protocol.modes.Shape`.
            With an :class:`AllToAll` on the ``bundled`` schedule, the shares then travel as arrays
            (:data:`BULK_EXCHANGE`): a sender's upload carries its rows for its destinations (in the order
            of ``receivers``), a forward the rows addressed to its destination (senders in index order),
            each posted to ``mailbox`` with one :meth:`Mailbox.put_many`.
        timing_key : str
            Key of the messages' loss draws (:meth:`send`); ``prepare`` names its own compute key.
        exclusive : bool
            The caller's word that, until the exchange ends, no other process uses the links of its devices or
            cancels it (other processes may run beside it, e.g. other groups' exchanges): the ``relay_*``
            schedules may then be replayed without their processes even then (:data:`BULK_EXCHANGE`,
            :meth:`_replay_relays`; without views recorded).  Without it they are only where nothing else is
            scheduled.

        Returns
        -------
        dict of (int, int) -> Any
            ``{(src.index, dst.index): delivered payload}``; for ``relay_*``/``upload_once`` in the
            order of ``steps``, for ``bundled`` in order of delivery (a read-only mapping in the bulk
            case). If the exchange is cancelled (interrupted: run it with :meth:`background`), what was
            delivered by then.

        Raises
        ------
        ValueError
            For an unknown ``schedule``.
        """
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if payload is None and rows is None:
            raise ValueError("exchange needs payload or rows")
        if isinstance(steps, AllToAll):
            if BULK_EXCHANGE and schedule == "bundled" and rows is not None:
                return (yield from self._bulk_bundled(steps, rows, kind=kind, n_elements=n_elements,
                                                      element_bits=element_bits, prepare=prepare, mailbox=mailbox,
                                                      timing_key=timing_key))
            steps = steps.steps()
        if payload is None:
            def payload(src: Node, dst: Node) -> Any:
                """Row ``dst.index`` of ``src``'s table."""
                return rows(src)[dst.index]
        if schedule in ("relay_asap", "relay_steps") and prepare is None and mailbox is None:
            ends = self._relay_replay_ok([p for step in steps for p in step], n_elements, element_bits, exclusive)
            if ends is not None:
                return (yield from self._replay_relays(steps, payload, ends, kind=kind, schedule=schedule,
                                                       n_elements=n_elements, element_bits=element_bits,
                                                       timing_key=timing_key))
        env = self.sim.env
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

        spawn = _spawner(env, children)

        def post(src: Node, dst: Node, value: Any) -> None:
            """Deliver ``value`` from ``src`` to ``dst``'s mailbox."""
            delivered[(src.index, dst.index)] = value
            if mailbox is not None:
                mailbox.put(src.index, dst.index, value)

        def relay(src: Node, dst: Node, value: Any) -> Generator:
            """Send ``value`` from ``src`` to ``dst`` through the server (upload, then download)."""
            msg = yield from self.send(src, dst, value, kind=kind, n_elements=n_elements, element_bits=element_bits,
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
            msg = yield from self.send(src, self.sim.server, value, kind=kind, n_elements=size,
                                       element_bits=element_bits, encrypted=True, timing_key=timing_key)
            return msg.payload

        def forward(dst: Node, parts: list[tuple[Node, Any]]) -> Generator:
            """Forward the shares the server holds for ``dst`` in one download."""
            size = None if n_elements is None else n_elements * len(parts)
            msg = yield from self.send(self.sim.server, dst, [v for _, v in parts], kind=kind, n_elements=size,
                                       element_bits=element_bits, timing_key=timing_key)
            for (src, _), value in zip(parts, msg.payload):
                post(src, dst, value)

        def forward_copy(src: Node, dst: Node, value: Any) -> Generator:
            """Forward one stored share of ``src`` to ``dst``."""
            msg = yield from self.send(self.sim.server, dst, value, kind=kind, n_elements=n_elements,
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
                                      if self.available(dst_nodes[j])])
        except simpy.Interrupt:
            for p in children:
                if p.is_alive:
                    p.interrupt("cancelled: the exchange is no longer needed")
        if schedule != "bundled":
            order_keys = [(src.index, dst.index) for step in steps for src, dst in step]
            delivered = {k: delivered[k] for k in order_keys if k in delivered}
        return delivered

    def _bulk_bundled(self, pairs: AllToAll, rows: Callable[[Node], Any], *, kind: str, n_elements: int | None,
                      element_bits: int | None, prepare: Callable[[Node], Generator] | None, mailbox: Mailbox | None,
                      timing_key: str) -> Generator:
        """:meth:`exchange` of ``pairs`` on the ``bundled`` schedule with the shares as arrays (:data:`BULK_EXCHANGE`).

        The same processes, messages (kinds, ends, sizes, in the same order) and mailbox keys as the per-pair
        code, which it replaces: only the containers differ (a sender's upload is its rows for its
        destinations, a forward the rows addressed to it, senders in index order), so the Python work is
        ``O(N)`` per exchange for ``N`` devices (the arrays' own work is numpy's).
        """
        env, server = self.sim.env, self.sim.server
        receivers = list(pairs.receivers)
        r_idx = np.array([dst.index for dst in receivers], dtype=np.int64)
        r_set = set(r_idx.tolist())
        senders = [src for src in pairs.senders if len(receivers) > (src.index in r_set)]  # someone to send to
        delivered = _Bundles()
        if not senders:
            return delivered
        children: list[simpy.Process] = []

        spawn = _spawner(env, children)

        def upload(src: Node) -> Generator:
            """Upload ``src``'s shares for its destinations to the server in one message."""
            if prepare is not None:
                yield from prepare(src)
            table = rows(src)
            to = r_idx[r_idx != src.index]
            yield from self.send(src, server, _take(table, to), kind=kind,
                                 n_elements=None if n_elements is None else n_elements * len(to),
                                 element_bits=element_bits, encrypted=True, timing_key=timing_key)
            return table

        def forward(dst: Node, srcs: np.ndarray, block: Any) -> Generator:
            """Forward the rows the server holds for ``dst`` (from ``srcs``) in one download."""
            msg = yield from self.send(server, dst, block, kind=kind,
                                       n_elements=None if n_elements is None else n_elements * len(srcs),
                                       element_bits=element_bits, timing_key=timing_key)
            delivered.add(dst.index, srcs, msg.payload)
            if mailbox is not None:
                mailbox.put_many(srcs, dst.index, msg.payload)

        try:
            ups = [spawn(upload(src)) for src in senders]
            yield env.all_of(ups)
            s_idx = np.array([src.index for src in senders], dtype=np.int64)
            order = np.argsort(s_idx, kind="stable")
            s_sorted = s_idx[order]
            held = _stack([ups[k].value for k in order.tolist()])    # (senders by index, N, ...)
            s_set = set(s_sorted.tolist())
            targets = sorted((dst for dst in receivers if len(senders) > (dst.index in s_set)),
                             key=lambda dst: dst.index)                   # someone sent to them
            fwd = []
            for dst in targets:
                if self.available(dst):
                    sel = s_sorted != dst.index
                    block = (Shape((int(sel.sum()), *held.shape[2:]), held.dtype) if isinstance(held, Shape)
                             else held[sel, dst.index])
                    fwd.append((dst, s_sorted[sel], block))
            if self._forward_replay_ok([dst for dst, _, _ in fwd], n_elements, element_bits):
                return (yield from self._replay_forwards(fwd, delivered, mailbox, kind=kind, n_elements=n_elements,
                                                         element_bits=element_bits, timing_key=timing_key))
            yield env.all_of([spawn(forward(dst, srcs, block)) for dst, srcs, block in fwd])
        except simpy.Interrupt:
            for p in children:
                if p.is_alive:
                    p.interrupt("cancelled: the exchange is no longer needed")
        return delivered

    def _forward_replay_ok(self, dsts: list[Node], n_elements: int | None, element_bits: int | None) -> bool:
        """Whether :meth:`_replay_forwards` may stand for the forward processes of :meth:`_bulk_bundled` to ``dsts``
        (:data:`REPLAY_FORWARDS`).

        That is, for messages of a positive size, the engine's transfers and keyed draws not overridden, no direct
        link, every destination a device whose downlink is idle (so each forward is granted its link at once), and
        nothing else due at this instant (every event queued for now has no callbacks or releases a resource
        nobody queues for): then, in SimPy, only the forwards' own start and grant events are processed between
        now and their links' grants, so no other process can draw, use those links or schedule anything meanwhile.
        """
        sim = self.sim
        if (not REPLAY_FORWARDS or not dsts or n_elements is None or int(n_elements) <= 0
                or (element_bits or self.element_bits) <= 0 or sim.d2d or not self._plain_engine()
                or not _draws_plain(sim.streams)):
            return False
        now = sim.env.now
        for entry in sim.env._queue:
            ev = entry[3]
            if entry[0] == now and ev.callbacks and not (type(ev) is Release and not ev.resource.put_queue):
                return False
        return all(dst.role == "device" and not dst.downlink.resource.users and not dst.downlink.resource.queue
                   for dst in dsts)

    def _replay_forwards(self, fwd: list[tuple[Node, np.ndarray, Any]], delivered: _Bundles, mailbox: Mailbox | None,
                         *, kind: str, n_elements: int, element_bits: int | None, timing_key: str) -> Generator:
        """The forwards of :meth:`_bulk_bundled` without a process each (:data:`REPLAY_FORWARDS`); returns ``delivered``.

        ``fwd``: ``(destination, senders, rows)`` in launch order.  What each forward's process would do, at the
        same heap keys relative to every other event: its message is formed and its destination's downlink
        requested now (granted at once: :meth:`_forward_replay_ok`), its keyed downlink draw taken (all at once,
        :meth:`fednet.sim.rng.Streams.uniforms`), and one event at ``now + seconds`` (the float SimPy's timeout
        gives) does what the process does when its transfer ends -- release the link, account the hop, deliver,
        file the rows in ``delivered`` and ``mailbox``; the last of them then triggers a stand-in for its process's
        end, whose processing completes the wait as ``all_of`` over the processes does (the other processes' end
        events do nothing but count).  These ends are created before the processes'
        timeouts would be, but no other event is created in between (nothing else is due now), so they keep
        their order to every other event.  If interrupted (cancelled), each forward still under way is cut as its
        interrupted process would be: an urgent event releases its link and ends it, its hop uncounted.
        """
        sim, env, server = self.sim, self.sim.env, self.sim.server
        now = env.now
        msgs = []
        for dst, srcs, block in fwd:                    # send() forms each message, transfer() stamps it
            msg = self._message(server, dst, block, kind, n_elements * len(srcs), element_bits, False, timing_key)
            msg.sent_at = now
            msgs.append(msg)
        reqs = [dst.downlink.resource.request() for dst, _, _ in fwd]        # granted at once (idle links)
        purpose = f"downlink:{timing_key}" if timing_key else "downlink"
        u = sim.streams.uniforms(np.array([dst.index for dst, _, _ in fwd], dtype=np.intp), purpose, sim.round)
        seconds, extra = transmission_times(
            np.array([msg.bits for msg in msgs], dtype=np.int64), np.array([dst.downlink.rate_bps for dst, _, _ in fwd]),
            sim.overhead, np.array([dst.downlink.loss for dst, _, _ in fwd]), sim.packet_bits, u)
        live = [True] * len(fwd)
        left = [len(fwd)]
        last, all_done = env.event(), env.event()             # the last process's end; all_of's condition
        last.callbacks.append(lambda _ev: all_done.succeed())

        def finish() -> None:
            """A forward's process ends (only the last end's event has an effect: it completes the wait)."""
            left[0] -= 1
            if not left[0]:
                last.succeed()
        ends = []
        for k, ((dst, srcs, _), msg, req, secs, ex) in enumerate(zip(fwd, msgs, reqs, seconds, extra)):
            def end(_ev: simpy.Event, k: int = k, dst: Node = dst, srcs: np.ndarray = srcs, msg: Message = msg,
                    req: simpy.Event = req, ex: int = ex) -> None:
                """The forward's transfer ends: as its process would on its timeout."""
                live[k] = False
                req.__exit__(None, None, None)
                sim.hop_done(msg, dst, "down", ex, float(now), sim.now)
                sim.deliver(msg, sim.now)
                delivered.add(dst.index, srcs, msg.payload)
                if mailbox is not None:
                    mailbox.put_many(srcs, dst.index, msg.payload)
                finish()
            ev = _event_at(env, now + secs)
            ev.callbacks.append(end)
            ends.append((ev, end))
        try:
            yield all_done
        except simpy.Interrupt:
            for k in range(len(fwd)):
                if live[k]:                              # as process.interrupt: an urgent event cuts it
                    def cut(_ev: simpy.Event, k: int = k) -> None:
                        """The forward's process takes the interrupt: its link is released, its hop uncounted."""
                        if not live[k]:
                            return
                        live[k] = False
                        ev, end = ends[k]
                        ev.callbacks.remove(end)
                        reqs[k].__exit__(simpy.Interrupt, None, None)
                        finish()
                    stand_in = env.event()
                    stand_in._ok, stand_in._value = True, None
                    stand_in.callbacks.append(cut)
                    env.schedule(stand_in, URGENT)
        return delivered

    def _relay_replay_ok(self, pairs: list[tuple[Node, Node]], n_elements: int | None, element_bits: int | None,
                         exclusive: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """The senders' and receivers' indices of ``pairs`` if :meth:`_replay_relays` may stand for the relay
        schedules' processes (:data:`BULK_EXCHANGE`), else None.

        That is, for device-to-device pairs (no direct link, no repeated pair) of one positive size, on links that
        are idle, with the engine's transfers not overridden, when no other process can act during the exchange:
        nothing else is scheduled (:meth:`_alone`), or the caller says so (``exclusive``) and views are not
        recorded (the server's relay list interleaves every process's messages in time).
        """
        sim = self.sim
        if (not BULK_EXCHANGE or not pairs or n_elements is None or int(n_elements) <= 0
                or (element_bits or self.element_bits) <= 0 or sim.d2d or not self._plain_engine()
                or not _draws_plain(sim.streams)
                or not (self._alone() or (exclusive and not sim.record_views))):
            return None
        s = np.fromiter((src.index for src, _ in pairs), np.int64, len(pairs))
        d = np.fromiter((dst.index for _, dst in pairs), np.int64, len(pairs))
        nodes = sim.nodes
        keys = np.sort(s * len(nodes) + d)
        if ((s == d).any() or (keys[1:] == keys[:-1]).any()
                or any(nodes[i].role != "device" or nodes[i].uplink.resource.users or nodes[i].uplink.resource.queue
                       for i in np.flatnonzero(np.bincount(s)).tolist())
                or any(nodes[j].role != "device" or nodes[j].downlink.resource.users
                       or nodes[j].downlink.resource.queue for j in np.flatnonzero(np.bincount(d)).tolist())):
            return None
        return s, d

    def _replay_relays(self, steps: Sequence[Sequence[tuple[Node, Node]]], payload: Callable[[Node, Node], Any],
                       ends: tuple[np.ndarray, np.ndarray], *, kind: str, schedule: str, n_elements: int,
                       element_bits: int | None, timing_key: str) -> Generator:
        """:meth:`exchange` on ``relay_asap`` or ``relay_steps`` without its per-message processes (:data:`BULK_EXCHANGE`).

        Replays what the processes do, with array arithmetic: every message of a batch (``relay_asap``: all of
        them; ``relay_steps``: one step, starting when the previous one is delivered) requests its sender's uplink
        at the batch's start, in launch order; each uplink serves its queue first come, first served
        (:func:`_fifo_links`), the keyed uplink draws taken in that order; an upload's end puts the message in
        its receiver's downlink queue, which is served the same way.  Upload ends at one instant are processed in
        SimPy's order (:func:`_event_order`: an uplink's next grant is scheduled by processing its previous upload's
        end, the first ones at the start in launch order), which decides the order of a downlink's queue and so
        its draws.  The same draws, times (the same float operations), counters, messages in the server's relay
        list and the receivers' views (when recorded) and returned mapping, bit for bit
        (``tests/test_codedsecagg_setup.py``); the caller resumes at the last delivery, with ``O(n' log n')``
        array work per batch of ``n'`` messages instead of a SimPy process each.  ``ends``: the senders' and
        receivers' indices of the pairs of ``steps`` in order (:meth:`_relay_replay_ok`).
        """
        sim, env = self.sim, self.sim.env
        rnd, record = sim.round, sim.record_views
        bits_each = int(n_elements) * int(element_bits or self.element_bits)
        up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"
        down_purpose = f"downlink:{timing_key}" if timing_key else "downlink"
        sizes = [len(step) for step in steps]
        if schedule == "relay_asap":
            batches, bounds = [[p for step in steps for p in step]], [0, sum(sizes)]
        else:
            batches, bounds = [list(step) for step in steps if step], np.cumsum([0] + [k for k in sizes if k]).tolist()
        nodes = sim.nodes
        up_rate = np.array([n.uplink.rate_bps if n.uplink else 0.0 for n in nodes])
        up_loss = np.array([n.uplink.loss if n.uplink else 0.0 for n in nodes])
        down_rate = np.array([n.downlink.rate_bps if n.downlink else 0.0 for n in nodes])
        down_loss = np.array([n.downlink.loss if n.downlink else 0.0 for n in nodes])
        delivered: dict[tuple[int, int], Any] = {}
        now = float(env.now)
        for batch, lo, hi in zip(batches, bounds[:-1], bounds[1:]):
            values = [payload(src, dst) for src, dst in batch]       # formed at the batch's start, in launch order
            m = len(batch)
            s, d = ends[0][lo:hi], ends[1][lo:hi]
            # uplinks: queues in launch order, all requested now
            by_src = np.argsort(s, kind="stable")
            s_sorted = s[by_src]
            first_s = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
            u_up = sim.streams.uniforms_in_turn(s_sorted, up_purpose, rnd)
            secs_up, extra_up = transmission_times(bits_each, up_rate[s_sorted], sim.overhead, up_loss[s_sorted],
                                                   sim.packet_bits, u_up, arrays=True)
            up_start, up_end = np.empty(m), np.empty(m)
            up_start[by_src], up_end[by_src] = _fifo_links(np.full(m, now), secs_up, first_s)
            # the order SimPy processes the upload ends in (needed only where two at one instant matter)
            pred = np.empty(m, dtype=np.int64)
            pred[by_src] = np.where(first_s, -1 - np.cumsum(first_s) + 1, np.r_[0, by_src[:-1]])
            firsts = by_src[first_s]                                   # each sender's first message: launch order
            o = np.lexsort((up_end, d))
            tied_dst = bool(((d[o][1:] == d[o][:-1]) & (up_end[o][1:] == up_end[o][:-1])).any())
            if tied_dst or (record and len(np.unique(up_end)) < m):
                order = _event_order(up_end, pred, firsts)
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
            down_start[by_dst], down_end[by_dst] = _fifo_links(up_end[by_dst], secs_down, first_d)
            counters = sim.counters
            counters.bits_up += bits_each * m
            counters.bits_down += bits_each * m
            counters.messages += 2 * m
            counters.retransmissions += int(extra_up.sum()) + int(extra_down.sum())
            if record:
                msgs = []
                for (src, dst), value, t0, t1, t2, t3 in zip(batch, values, up_start.tolist(), up_end.tolist(),
                                                             down_start.tolist(), down_end.tolist()):
                    msg = self._message(src, dst, value, kind, n_elements, element_bits, timing_key=timing_key)
                    msg.sent_at, msg.encrypted = now, True
                    msg.hops += [("up", src.index, t0, t1), ("down", dst.index, t2, t3)]
                    msgs.append(msg)
                sim.server.relayed.extend(msgs[k] for k in np.argsort(order).tolist())
                for k in by_dst.tolist():
                    sim.deliver(msgs[k], msgs[k].hops[1][3])
            delivered.update(zip(zip(s.tolist(), d.tolist()), values))
            now = float(down_end.max())
        try:
            yield _event_at(env, now)
        except simpy.Interrupt:
            raise RuntimeError(f"{self.label}: an exchange run without its processes cannot be cancelled") from None
        return delivered

    # -- computation -----------------------------------------------------------------------
    def compute_each(self, nodes: Iterable[Node], fn: Callable[[Node], Any] | None, *,
                     macs: Callable[[Node], int] | None = None, free: bool = False,
                     step: str | None = None, timing_key: str = "") -> Generator:
        """Run ``fn(node)`` on every node in parallel (each on its own processor); wait for all.

        Parameters
        ----------
        nodes : iterable of Node
        fn : callable(Node) -> Any, or None
            The computation (metered); None computes nothing (only ``macs`` are charged).
        macs : callable(Node) -> int, optional
            A known MAC count added to the metered one.
        free : bool
            The step deliberately charges nothing (otherwise zero metered MACs raise).
        step : str, optional
            Name of the step in errors (default ``fn``'s name).
        timing_key : str
            ``""``: the random delay is the shared ``(node, "compute", round)`` draw; a step only
            this protocol has names its own key (drawn as ``"compute-<key>"``).

        Returns
        -------
        dict of int -> Any
            ``{node.index: result}``.

        Raises
        ------
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        env = self.sim.env
        nodes = list(nodes)
        run = None if fn is None else self._charged(fn, step or getattr(fn, "__name__", "compute_each"),
                                                     free or macs is not None)
        procs = [env.process(self.sim.compute(n, run, n, macs=None if macs is None else macs(n),
                                              timing_key=compute_key(timing_key))) for n in nodes]
        yield env.all_of(procs)
        return {n.index: p.value for n, p in zip(nodes, procs)}

    def compute(self, node: Node, fn: Callable[..., Any], *args: Any, free: bool = False, step: str | None = None,
                timing_key: str = "", **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on ``node``'s processor (metered); returns its result.

        ``timing_key`` names the step's own compute draw (see :meth:`compute_each`).

        Raises
        ------
        UnchargedCompute
            If ``fn`` metered no MAC and ``free`` is False.
        """
        run = self._charged(fn, step or getattr(fn, "__name__", "compute"), free)
        return (yield from self.sim.compute(node, run, *args, timing_key=compute_key(timing_key), **kwargs))

    def server_compute(self, fn: Callable[..., Any] | None, *args: Any, macs: int | None = None,
                       free: bool = False, step: str | None = None, **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on the server (metered, plus ``macs``); returns its result.

        Raises
        ------
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        run = None if fn is None else self._charged(fn, step or getattr(fn, "__name__", "server_compute"),
                                                     free or macs is not None)
        return (yield from self.sim.compute(self.sim.server, run, *args, macs=macs, **kwargs))

    # -- first k -----------------------------------------------------------------------------
    def first_k(self, work: Sequence[tuple[Node, Generator]], k: int | None = None, *,
                deadline: float | None = None, dropped: Sequence[Node] = (), cancel: bool = True) -> Generator:
        """Run each ``(node, generator)`` in parallel; keep the first ``k`` to finish, cancel the rest.

        Parameters
        ----------
        work : sequence of (Node, generator)
            A generator's return value is the node's result; it finishes when its result has
            reached the server. Cancelled work is interrupted (``simpy.Interrupt`` is thrown into
            it: its transfers and computations end).
        k : int, optional
            Results to wait for (default: all).
        deadline : float, optional
            Simulated seconds after which the server stops waiting: the results in by then are
            returned (possibly fewer than ``k``), the rest are cancelled as ``missed_deadline``.
        dropped : sequence of Node
            Nodes that took no part (copied to the result).
        cancel : bool
            False leaves the work still running when ``k`` results are in going on (in the
            result's ``pending``; end it with :meth:`cancel`): it keeps its links and processors busy.

        Returns
        -------
        GatherResult

        Raises
        ------
        StragglerShortfall
            Without a deadline, if fewer than ``k`` pieces of work are given or finish.
        ValueError
            For a negative deadline.
        """
        return (yield from self._first_k([(node, gen, True) for node, gen in work], k, deadline=deadline,
                                         dropped=dropped, cancel=cancel))

    def _first_k(self, items: Sequence[tuple[Node, Generator, bool]], k: int | None, *,
                 deadline: float | None = None, dropped: Sequence[Node] = (), cancel: bool = True) -> Generator:
        """:meth:`first_k` over ``(node, generator, counted)``, launched in order; uncounted work
        (inner nodes of a tree) runs beside the counted and is interrupted with the late ones."""
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, got {deadline}")
        env = self.sim.env
        n_counted = sum(1 for *_, counted in items if counted)
        need = n_counted if k is None else int(k)
        result = GatherResult(dropped=list(dropped))
        if deadline is None and need > n_counted:
            self._note_failures(result)
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs {need} results but only "
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
            self._note_failures(result)
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
        self._note_failures(result)
        if deadline is None and len(arrived) < need:
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs {need} results, got {len(arrived)}")
        return result

    def gather(self, nodes: Iterable[Node], fn: Callable[[Node], Any] | None, *, kind: str,
               first: int | None = None, download: Any = None, download_kind: str = "model",
               download_elements: int | None = None, download_bits: int | None = None,
               upload_elements: int | Callable[[Any], int] | None = None, upload_bits: int | None = None,
               macs: Callable[[Node], int] | None = None, deadline: float | None = None,
               free: bool = False, cancel: bool = True,
               wait: Callable[[Node], simpy.Event] | None = None, timing_key: str = "",
               batch: Batch | None = None) -> Generator:
        """Each node: receive ``download`` (if given), compute ``fn(node)``, upload the result.

        Nodes work in parallel, each starting its computation as soon as its own download
        arrives; the downloaded payload is in ``node.state.received`` when ``fn`` runs.
        Devices that the availability model marks absent this round (:meth:`available`) take no part
        (``dropped``).
        When ``first`` results have reached the server the remaining nodes are cancelled (their
        partial transfers and computations end; the round does not wait for them).

        Parameters
        ----------
        nodes : iterable of Node
        fn : callable(Node) -> Any, or None
            The node's computation (metered; its result is uploaded). None computes nothing.
        kind : str
            Kind of the uploaded messages.
        first : int, optional
            How many results to wait for (default: every available node).
        download : Any, optional
            Payload the server sends to each node first.
        download_kind, download_elements, download_bits
            Kind, size and element width of the download.
        upload_elements : int or callable(result) -> int, optional
            Size of an upload (default: :func:`payload_size` of the result).
        upload_bits : int, optional
        macs : callable(Node) -> int, optional
            MACs to charge in addition to those metered in ``fn``.
        deadline : float, optional
            Simulated seconds after which the server stops waiting (see :meth:`first_k`).
        free : bool
            ``fn`` deliberately charges nothing.
        cancel : bool
            False lets the nodes still working when ``first`` results are in go on (see :meth:`first_k`).
        wait : callable(Node) -> simpy.Event, optional
            An event a node waits for after its download and before computing (e.g. the shares
            it needs, :meth:`Mailbox.wait`).
        timing_key : str
            ``""`` (default): the download, computation and upload take the shared keyed draws; a
            gather only this protocol has (LightSecAgg's aggregated masks) names its own key, used
            for its messages (:meth:`send`) and its computation (:meth:`compute_each`).
        batch : callable(nodes, received) -> (values, macs), optional
            ``fn`` for many nodes at once (:data:`Batch`): used on the event-free path when
            :data:`BATCHED` is on (each node is still charged its own MACs and its own keyed time).

        Returns
        -------
        GatherResult
            ``results``: ``(node, result)`` in order of arrival at the server; and the failures.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` nodes are available or finish (without a deadline).
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        nodes = list(nodes)
        flags = self.sim.available_many(nodes)
        if flags.all():
            up, absent = nodes, []
        else:
            up = [n for n, ok in zip(nodes, flags) if ok]
            absent = [n for n, ok in zip(nodes, flags) if not ok]
        run = None if fn is None else self._charged(fn, f"gather {kind!r}", free or macs is not None)
        size_of = _uploaded_elements(upload_elements)

        def work(node: Node) -> Generator:
            """One node's download, computation and upload."""
            if download is not None:
                msg = yield from self.send(self.sim.server, node, download, kind=download_kind,
                                           n_elements=download_elements, element_bits=download_bits,
                                           timing_key=timing_key)
                node.state.received = msg.payload
            if wait is not None:
                yield wait(node)
            result = yield from self.sim.compute(node, run, node, macs=None if macs is None else macs(node),
                                                 timing_key=compute_key(timing_key))
            yield from self.send(node, self.sim.server, result, kind=kind, n_elements=size_of(result),
                                 element_bits=upload_bits, timing_key=timing_key)
            return result

        if deadline is None and cancel and wait is None and self._fast_ok(up):
            return (yield from self._fast_rounds(up, first, absent, download, download_kind, download_elements,
                                                 download_bits, run, macs, kind, size_of, upload_bits,
                                                 timing_key=timing_key, batch=None if fn is None else batch,
                                                 charged=not (free or macs is not None), step=f"gather {kind!r}"))
        return (yield from self.first_k([(n, work(n)) for n in up], first, deadline=deadline, dropped=absent,
                                        cancel=cancel))

    # -- the event-free path of gather ------------------------------------------------------
    def _fast_ok(self, nodes: Sequence[Node]) -> bool:
        """Whether a download-compute-upload step over ``nodes`` may skip SimPy's per-device processes.

        True when :data:`FAST_PATH` is on, neither the protocol's ``send`` / ``_message`` nor the
        simulation's ``transfer``, ``_hop``, ``hop_draw``, ``hop_done``, ``deliver``, ``compute`` or
        ``compute_now`` is overridden, nothing else is scheduled (every event still queued has no
        callbacks -- leftovers of interrupted work -- or releases a resource nobody queues for) and every
        link and processor involved is idle; then no other process can interact with the step and
        :meth:`_fast_rounds` gives the same results.
        """
        if not FAST_PATH or not self._plain_engine() or not self._alone():
            return False
        return self.sim.idle(nodes, settled=True)

    def _plain_engine(self) -> bool:
        """Whether neither the protocol's ``send`` / ``_message`` nor the simulation's ``transfer``, ``_hop``,
        ``hop_draw``, ``hop_done``, ``deliver``, ``compute`` or ``compute_now`` is overridden (an override must see
        every message and computation: it keeps the process path)."""
        sim_type = type(self.sim)
        return (type(self).send is Primitives.send and type(self)._message is Primitives._message
                and all(getattr(sim_type, name) is getattr(Simulation, name)
                        for name in ("transfer", "compute", "_hop", "hop_draw", "hop_done", "deliver", "compute_now")))

    def _alone(self) -> bool:
        """Whether nothing else is scheduled: every event still queued has no callbacks (leftovers of interrupted
        work) or releases a resource nobody queues for, so no other process can act before the caller's next yield."""
        for entry in self.sim.env._queue:
            ev = entry[3]
            if ev.callbacks and not (type(ev) is Release and not ev.resource.put_queue):
                return False
        return True

    def _replay_start(self, nodes: Sequence[Node], roots: Sequence[Any], download: Any, download_kind: str,
                      download_elements: int | None, download_bits: int | None, upload_bits: int | None,
                      timing_key: str) -> tuple[list, list, int, str, str]:
        """The start of a replayed download-compute-upload step (:meth:`_fast_rounds`, :meth:`_fast_groups`).

        Every download starts now, with one vector of keyed draws.  ``roots[p]`` is the key of node ``p``'s
        process start (``(now, 0, rank)``).  Returns ``down`` (per node ``(msg, extra, t1, key of the download's
        end)``, or None without a download), ``start_key`` (per node, the key of its processor request), the upload
        element width and the upload and compute draw purposes (``"uplink[:key]"``, ``"compute-<key>"``).
        """
        sim = self.sim
        now0 = sim.env.now
        up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"   # as Simulation.hop_draw
        up_bits = upload_bits or self.element_bits
        if download is None:
            return ([None] * len(nodes), [(now0, 1, root) for root in roots], up_bits, up_purpose,
                    compute_key(timing_key))
        n_down = payload_size(download) if download_elements is None else int(download_elements)
        msgs = [Message(sim.server.index, node.index, download_kind, download, n_down,
                        download_bits or self.element_bits, round=sim.round, timing_key=timing_key) for node in nodes]
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

    def _fast_rounds(self, nodes: list[Node], first: int | None, absent: list[Node], download: Any,
                     download_kind: str, download_elements: int | None, download_bits: int | None,
                     run: Callable[..., Any] | None, macs: Callable[[Node], int] | None, kind: str,
                     size_of: Callable[[Any], int], upload_bits: int | None, *,
                     timing_key: str = "", batch: Batch | None = None, charged: bool = True,
                     step: str = "") -> Generator:
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
        :meth:`_fast_ok` holds.

        With a ``batch`` (and :data:`BATCHED`), every node's value comes from one batched call and the
        step is replayed with vectorised draws (:meth:`_replay_vectorised`); where that cannot decide
        SimPy's order from the times alone (exact ties) the values feed the node-by-node replay below.
        ``charged``: a node whose step metered no MAC raises :class:`UnchargedCompute` (``step`` names it).
        """
        sim, env = self.sim, self.sim.env
        n_counted = len(nodes)
        need = n_counted if first is None else int(first)
        result = GatherResult(dropped=list(absent))
        if need > n_counted:
            self._note_failures(result)
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs {need} results but only "
                                     f"{n_counted} devices are available")
        if need == 0 or not n_counted:
            self._note_failures(result)
            return result
        if batch is not None and BATCHED:
            values, node_macs = self._run_batch(batch, nodes, download, charged, step)
            done = self._replay_vectorised(nodes, need, result, download, download_kind, download_elements,
                                           download_bits, values, node_macs, macs, kind, size_of, upload_bits,
                                           timing_key)
            if done is not None:
                yield _event_at(env, done)
                self._note_failures(result)
                return result
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
        down, start_key, up_bits, up_purpose, c_key = self._replay_start(
            nodes, [(now0, 0, p) for p in range(n_counted)], download, download_kind, download_elements,
            download_bits, upload_bits, timing_key)
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
            msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits, round=rnd,
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
                msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits, round=rnd,
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
        yield _event_at(env, tc)
        self._note_failures(result)
        return result

    # -- gathers of disjoint groups at once ------------------------------------------------------
    def gather_groups(self, groups: Sequence[Sequence[Node]], fn: Callable[[Node], Any] | None, *, kind: str,
                      first: Sequence[int | None], then: Callable[[int, GatherResult], Generator],
                      download: Any = None, download_kind: str = "model", download_elements: int | None = None,
                      download_bits: int | None = None, upload_elements: int | None = None,
                      upload_bits: int | None = None, timing_key: str = "") -> Generator:
        """:meth:`gather` over each of several disjoint groups in parallel, each followed by ``then(g, result)``.

        The same as running, for every group ``g`` at once, a process that does ``result = yield from
        self.gather(groups[g], fn, first=first[g], ...)`` and then ``yield from then(g, result)`` (CodedPaddedFL's
        groups, each decoded by the server as soon as its own gather ends, Sec. V-E); returns when all have ended.

        Where no other process can act meanwhile (:meth:`_fast_ok` over every node, :data:`GROUPS_REPLAY` on,
        two groups or more), the gathers are replayed without a process per device
        (:meth:`_fast_groups`): every group's download, compute and upload events are walked in the order SimPy
        would process them (the groups' node-by-node replays of :meth:`_fast_rounds`, interleaved), and each
        group's ``then`` starts at its ``first[g]``-th arrival, the groups in the order SimPy resumes them.  The
        same draws, counters, messages and results, bit for bit (``tests/test_gather_groups.py``).

        Parameters
        ----------
        groups : sequence of sequences of Node
            Disjoint groups of devices.
        fn, kind, download, download_kind, download_elements, download_bits, upload_elements, upload_bits,
        timing_key
            As :meth:`gather` (the same for every group).
        first : sequence of int or None
            Results to wait for in each group (None: every available node of it).
        then : callable(int, GatherResult) -> generator
            What follows group ``g``'s gather (e.g. the server decoding it).

        Raises
        ------
        ValueError
            If ``first`` does not give one count per group, or a node is in two groups.
        StragglerShortfall
            As :meth:`gather`, for a group with fewer than ``first[g]`` available nodes.
        """
        groups = [list(g) for g in groups]
        first = list(first)
        if len(first) != len(groups):
            raise ValueError(f"first gives {len(first)} counts for {len(groups)} groups")
        everyone = [node for group in groups for node in group]
        if len({id(node) for node in everyone}) != len(everyone):
            raise ValueError("gather_groups needs disjoint groups: a node is in two of them")
        env = self.sim.env
        common = dict(kind=kind, download=download, download_kind=download_kind, download_elements=download_elements,
                      download_bits=download_bits, upload_elements=upload_elements, upload_bits=upload_bits,
                      timing_key=timing_key)
        fast = GROUPS_REPLAY and FAST_PATH and len(groups) > 1 and self._fast_ok(everyone)
        if fast:                                     # the availability each group's gather would ask (keyed: the
            flags = [self.sim.available_many(group) for group in groups]     # same answers when asked again)
            up = [[n for n, ok in zip(group, f) if ok] for group, f in zip(groups, flags)]
            need = [len(u) if k is None else int(k) for u, k in zip(up, first)]
            fast = all(0 < k <= len(u) for k, u in zip(need, up))   # else: the processes (and their errors)
        if not fast:
            def one(g: int) -> Generator:
                """Group ``g``'s gather, then what follows it."""
                result = yield from self.gather(groups[g], fn, first=first[g], **common)
                yield from then(g, result)
            yield env.all_of([env.process(one(g)) for g in range(len(groups))])
            return
        run = None if fn is None else self._charged(fn, f"gather {kind!r}", False)
        results = [GatherResult(dropped=[n for n, ok in zip(group, f) if not ok]) for group, f in zip(groups, flags)]
        outcomes = self._fast_groups(up, need, results, run, **common)
        procs = []
        for g in sorted(range(len(groups)), key=lambda g: outcomes[g][1]):     # SimPy's order of the resumptions
            result, done_key = outcomes[g]
            procs.append(env.process(self._after(done_key[0], result, then(g, result))))
        yield env.all_of(procs)

    def _after(self, t: float, result: GatherResult, rest: Generator) -> Generator:
        """Resume at ``t`` (a group's last awaited arrival), note its failures, then run ``rest``."""
        yield _event_at(self.sim.env, t)
        self._note_failures(result)
        yield from rest

    def _fast_groups(self, nodes: list[list[Node]], need: list[int], results: list[GatherResult],
                     run: Callable[..., Any] | None, *,
                     kind: str, download: Any, download_kind: str, download_elements: int | None,
                     download_bits: int | None, upload_elements: int | None, upload_bits: int | None,
                     timing_key: str) -> list[tuple[GatherResult, tuple]]:
        """The device side of :meth:`gather_groups` without processes: ``(result, key of its end)`` per group.

        ``nodes[g]``: group ``g``'s available nodes; ``need[g]``: the results awaited from it (``1 <= need[g] <=
        len(nodes[g])``); ``results[g]``: its result so far (the unavailable nodes), completed here.

        :meth:`_fast_rounds`'s node-by-node replay over every group at once.  Each node's events are keyed as
        there, ``(time, priority, key of the event that scheduled it)``, from its process's start ``(now, 0,
        (g, p))``: the groups' processes start in order and each starts its nodes' in order, so the keys of
        different groups compare as SimPy's queue orders them.  A group's events from its ``first[g]``-th arrival
        on never happen (its server stops waiting and cancels the rest).  Mutates as the processes would: draws,
        counters, views; returns without yielding (the caller resumes each group at its end).
        """
        sim, env = self.sim, self.sim.env
        now0 = env.now
        t0 = float(now0)
        rnd = sim.round
        server = sim.server
        size_of = _uploaded_elements(upload_elements)
        groups = range(len(nodes))
        flat = [(g, p) for g in groups for p in range(len(nodes[g]))]
        downs, starts, up_bits, _, c_key = self._replay_start(
            [nodes[g][p] for g, p in flat], [(now0, 0, gp) for gp in flat], download, download_kind,
            download_elements, download_bits, upload_bits, timing_key)
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
                msg = Message(node.index, server.index, kind, value, int(size_of(value)), up_bits, round=rnd,
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

    def _run_batch(self, batch: Batch, nodes: list[Node], received: Any, charged: bool,
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
            raise ValueError(f"{self.label}: the batch of step {step!r} returned {len(values)} values and "
                             f"{len(node_macs)} MAC counts for {len(nodes)} nodes")
        if meter.macs != sum(node_macs):
            raise AssertionError(f"{self.label}: the batch of step {step!r} metered {meter.macs} MACs but charged "
                                 f"its nodes {sum(node_macs)}")
        if charged and min(node_macs) == 0:
            raise UnchargedCompute(f"{self.label}: step {step!r} charged 0 MACs to a node; compute with metered "
                                   f"kernels (fednet.algebra.meter) or pass free=True")
        return values, node_macs

    def _replay_vectorised(self, nodes: list[Node], need: int, result: GatherResult, download: Any,
                           download_kind: str, download_elements: int | None, download_bits: int | None,
                           values: Sequence[Any], node_macs: list[int], macs: Callable[[Node], int] | None,
                           kind: str, size_of: Callable[[Any], int], upload_bits: int | None,
                           timing_key: str) -> float | None:
        """:meth:`_fast_rounds` with every node's times as vectors; returns the resume time, or None untouched.

        Each node's download end ``t1``, compute end ``t2`` and upload end ``t3`` are computed from its
        keyed draws, looked at without consuming them (:meth:`fednet.sim.rng.Streams.uniforms` with
        ``advance=False``). An event of a node is processed in SimPy iff its key is below the key at which
        the server stops waiting, the ``need``-th arrival at ``tk``; without exact ties at ``tk`` (and
        among the arrival times) that is ``t < tk``, so the draws of the stages that ran are consumed,
        the counters charged and the messages filed as :meth:`_fast_rounds` does, arrivals in order of
        ``t3``. Returns None, having changed nothing, where a tie, a compute model other than
        :class:`~fednet.sim.compute.ShiftedExponential` / :class:`~fednet.sim.compute.Deterministic`
        or the server among ``nodes`` needs the node-by-node replay, as does a ``Streams`` whose draws are
        overridden (an override sees each draw as it is taken).
        """
        sim, env = self.sim, self.sim.env
        n = len(nodes)
        if not _draws_plain(sim.streams):
            return None                        # an override must see each draw as it is drawn: node by node
        # (index, downlink rate, loss, uplink rate, loss, MAC rate, setup fraction or -1) of each node
        table = sim.node_table(nodes)
        if table is None:
            return None
        now0 = env.now
        t0 = float(now0)
        rnd = sim.round
        streams = sim.streams
        idx = table[:, 0].astype(np.intp)
        up_bits = upload_bits or self.element_bits
        c_key = compute_key(timing_key)
        down_purpose = f"downlink:{timing_key}" if timing_key else "downlink"
        up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"
        if download is not None:                               # every download starts now
            bits = download_bits or self.element_bits
            n_down = payload_size(download) if download_elements is None else int(download_elements)
            probe = Message(sim.server.index, nodes[0].index, download_kind, download, n_down, bits,
                            round=rnd, timing_key=timing_key)          # validates the sizes as every message does
            u_down = streams.uniforms(idx, down_purpose, rnd, advance=False)
            secs_d, extra_d = transmission_times(
                probe.bits, table[:, 1], sim.overhead, table[:, 2], sim.packet_bits, u_down, arrays=True)
            t1 = now0 + secs_d
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
        if min(sizes) < 0 or up_bits <= 0:
            return None                                         # let Message raise its error node by node
        bits_up = np.array(sizes, dtype=np.int64) * int(up_bits)
        u_up = streams.uniforms(idx, up_purpose, rnd, advance=False)
        secs_u, extra_u = transmission_times(
            bits_up, table[:, 3], sim.overhead, table[:, 4], sim.packet_bits, u_up, arrays=True)
        t3 = t2 + secs_u
        order = np.argsort(t3, kind="stable")
        t3_sorted = t3[order]
        if n > 1 and not (np.diff(t3_sorted) > 0).all():
            return None                                         # tied arrivals: SimPy's insertion order decides
        tk = t3_sorted[need - 1]
        if need < n:
            if int((t1 == tk).sum() + (t2 == tk).sum()) or (download is None and now0 == tk):
                return None                                     # a stage starting at tk: the full keys decide
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
                msg = Message(node.index, sim.server.index, kind, values[p], sizes[p], up_bits, round=rnd,
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

    def tree_aggregate(self, tree: nx.DiGraph, fn: Callable[[Node], Any], combine: Callable[[Any, Any], Any], *,
                       kind: str, root_kind: str, first: int | None = None, download: Any = None,
                       download_kind: str = "model", download_bits: int | None = None,
                       n_elements: int | None = None, element_bits: int | None = None,
                       free: bool = False, batch: Batch | None = None,
                       combine_batch: Callable[[list, list], tuple[list, list[int]]] | None = None) -> Generator:
        """Partial aggregates climb a tree, children to parents, to its roots, which upload to the server.

        Every node of ``tree`` (device indices; an edge ``u -> v`` makes ``v`` the parent of ``u``)
        receives ``download`` (if given), computes ``fn(node)`` (metered), then for each child in
        the order of the edges' ``step`` attribute waits for the child's message and computes
        ``combine(acc, part)`` (metered); a node with a parent then sends its aggregate to it, a
        root uploads it to the server. A transfer starts as soon as its sender holds its own value
        and its children's (no barrier between the levels). When ``first`` roots' uploads have
        arrived the rest is cancelled.

        A root takes part only if every node of its subtree is available this round (otherwise its
        aggregate could never be complete): the nodes of other subtrees are ``dropped``.

        Parameters
        ----------
        tree : networkx.DiGraph
            A forest over device indices, edges child -> parent with an integer ``step``
            attribute (default 0) ordering a parent's children. Nodes are launched in the graph's
            node order.
        fn : callable(Node) -> Any
            A node's own contribution (computed on the node after its download).
        combine : callable(acc, part) -> Any
            Adds a child's aggregate (computed on the parent).
        kind, root_kind : str
            Kinds of the messages to a parent and of the roots' uploads.
        first : int, optional
            Roots to wait for (default: every complete root).
        download, download_kind, download_bits
            The payload the server sends to every node first.
        n_elements, element_bits : int, optional
            Size and width of every tree message and upload.
        free : bool
            ``fn`` and ``combine`` deliberately charge nothing.
        batch : callable(nodes, received) -> (values, macs), optional
            ``fn`` for many nodes at once (:data:`Batch`), used when :data:`BATCHED` is on: for a tree
            without edges on the event-free path, and for a tree with edges where no other process can
            act meanwhile, whose round is then replayed without a process per node (:data:`TREE_REPLAY`,
            :func:`fednet.protocol.tree_replay.replay_tree`; the same results).
        combine_batch : callable(accs, parts) -> (values, macs), optional
            ``combine`` of many pairs at once (value ``i`` and MAC count ``i`` what ``combine(accs[i],
            parts[i])`` gives and meters; the call meters their sum, checked), for the replay; without it the
            replay calls ``combine`` pair by pair.

        Returns
        -------
        GatherResult
            ``results``: ``(root node, aggregate)`` in order of arrival at the server.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` roots have a complete available subtree, or finish.
        ValueError
            If ``tree`` has a cycle or a node with two parents.
        """
        edgeless = tree.number_of_edges() == 0
        env = self.sim.env
        devs = self.sim.devices
        roots, members, root_of, kids, parent, tree_nodes = self._tree_parts(tree, edgeless)
        if edgeless:                         # every node is its own root
            complete = {r for r, ok in zip(roots, self.sim.available_many([devs[r] for r in roots])) if ok}
        elif type(self.sim.availability) is AlwaysAvailable and type(self.sim).available is Simulation.available:
            self.sim.available_many([devs[u] for r in roots for u in members[r]])   # nobody absent: asked at once
            complete = set(roots)
        else:                                # each root's subtree, walked once (the order available() is asked in)
            complete = {r for r in roots if all(self.available(devs[u]) for u in members[r])}
        if len(complete) == len(roots):
            taking_part, absent = list(tree_nodes), []
        else:
            taking_part = [v for v in tree_nodes if root_of[v] in complete]
            absent = [devs[v] for v in tree_nodes if root_of[v] not in complete]
        inbox: dict[tuple[int, int], simpy.Event] = {}     # filled for the processes, if they run
        own = self._charged(fn, f"tree_aggregate {kind!r}", free)
        add = self._charged(combine, f"tree_aggregate {kind!r} combine", free)

        n_down = None if download is None else payload_size(download)      # the same for every node

        def node_work(v: int) -> Generator:
            """A tree node: compute its part and add its children's parts."""
            node = devs[v]
            if download is not None:
                msg = yield from self.send(self.sim.server, node, download, kind=download_kind, n_elements=n_down,
                                           element_bits=download_bits)
                node.state.received = msg.payload
            acc = yield from self.sim.compute(node, own, node)
            for u in kids[v]:                    # in step order
                part = yield inbox[(u, v)]
                acc = yield from self.sim.compute(node, add, acc, part)
            return acc

        def inner(v: int) -> Generator:
            """An inner tree node: combine the children's parts and send up."""
            acc = yield from node_work(v)
            (parent,) = tree.successors(v)
            yield from self.send(devs[v], devs[parent], acc, kind=kind, n_elements=n_elements,
                                 element_bits=element_bits)
            ev = inbox[(v, parent)]
            if not ev.triggered:
                ev.succeed(acc)

        def root_work(v: int) -> Generator:
            """The root's part of the tree aggregation."""
            acc = yield from node_work(v)
            yield from self.send(devs[v], self.sim.server, acc, kind=root_kind, n_elements=n_elements,
                                 element_bits=element_bits)
            return acc

        if tree.number_of_edges() == 0 and self._fast_ok([devs[v] for v in taking_part]):
            return (yield from self._fast_rounds([devs[v] for v in taking_part], first, absent, download,
                                                 download_kind, None, download_bits, own, None, root_kind,
                                                 _uploaded_elements(n_elements), element_bits, batch=batch, charged=not free,
                                                 step=f"tree_aggregate {kind!r}"))
        need = len(complete) if first is None else int(first)
        if (TREE_REPLAY and BATCHED and batch is not None and 0 < need <= len(complete) and not self.sim.record_views
                and not self.sim.d2d and self._fast_ok([devs[v] for v in taking_part])
                and _draws_plain(self.sim.streams)):
            values, node_macs = self._run_batch(batch, [devs[v] for v in taking_part], download, not free,
                                                f"tree_aggregate {kind!r}")
            got = replay_tree(self, kids, parent, taking_part, need, download, download_kind, download_bits, values,
                              node_macs, add, kind, root_kind, n_elements, element_bits, payload_size, combine_batch)
            if got is not None:
                result = GatherResult(dropped=list(absent))
                tk, result.results, result.cancelled = got
                yield _event_at(env, tk)
                self._note_failures(result)
                return result
            at = {v: p for p, v in enumerate(taking_part)}

            def own(node: Node) -> Any:                  # noqa: F811 - the batch's value, charged where it is computed
                """The batched part of ``node``, charging its MACs."""
                charge(node_macs[at[node.index]])
                return values[at[node.index]]
        inbox.update({(u, v): env.event() for u, v in tree.edges if root_of[v] in complete})
        items = [(devs[v], root_work(v) if v in complete else inner(v), v in complete) for v in taking_part]
        return (yield from self._first_k(items, first, dropped=absent))

    def _tree_parts(self, tree: nx.DiGraph, edgeless: bool) -> tuple[list, dict, dict, dict, dict, tuple]:
        """A forest's roots, each root's subtree (a set, the same object each call), each node's root, each node's
        children in step order, each node's parent and its nodes in order, checked and computed once per tree (kept
        while its nodes, edges and steps stay the same).

        Raises
        ------
        ValueError
            If ``tree`` has a cycle or a node with two parents.
        """
        cache = self.__dict__.setdefault("_tree_parts_of", {})
        key = (id(tree), tuple(tree.nodes), tuple(tree.edges(data="step")))
        got = cache.get(key)
        if got is None or got[0] is not tree:
            if not edgeless and (not nx.is_directed_acyclic_graph(tree) or any(d > 1 for _, d in tree.out_degree())):
                raise ValueError("tree must be a forest with edges child -> parent (acyclic, one parent per node)")
            roots = list(tree.nodes) if edgeless else [v for v in tree.nodes if tree.out_degree(v) == 0]
            members = {r: {r} for r in roots} if edgeless else {r: nx.ancestors(tree, r) | {r} for r in roots}
            kids = {v: sorted(tree.predecessors(v), key=lambda u, v=v: tree.edges[u, v].get("step", 0)) for v in tree}
            parent = {v: next(iter(tree.successors(v)), None) for v in tree}
            if len(cache) >= 8:                  # a protocol keeps a few trees; one built anew each round is not kept
                cache.clear()
            got = cache[key] = (tree, roots, members, {u: r for r in roots for u in members[r]}, kids, parent,
                                key[1])
        return got[1:]
