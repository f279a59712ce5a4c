"""Mailboxes and exchange patterns: payloads delivered from node to node, and who sends to whom.

:class:`Mailbox` keeps what an exchange delivered with events to wait for a set of senders (lazily materialised,
the ``mailbox`` backend of :data:`~fednet.sim.engine.config.BACKENDS`); :func:`cyclic_steps`, :class:`CyclicSteps` and
:class:`AllToAll` describe exchanges; :class:`AlikeDelivered` is what an exchange of alike shares delivered, without an
object per pair (:func:`received_by`, :func:`prepend` read it).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from fednet.algebra.shape import Repeated, Shape
from fednet.sim.simulation import Node

__all__ = ["Mailbox", "AllToAll", "cyclic_steps", "CyclicSteps", "Repeated", "AlikeDelivered", "received_by", "prepend"]


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

    :meth:`fednet.protocol.primitives.Net.exchange` posts every delivered payload here when given one; a protocol may
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
    lazy : bool
        Materialise only the events that complete a wait (in a :class:`fednet.sim.simulation.Environment`);
        False: one event per pair (the reference).  A protocol gets its mailboxes from ``self.net.mailbox()``,
        which passes the simulation's engine configuration (the ``mailbox`` backend).
    """

    def __init__(self, env: simpy.Environment, *, lazy: bool = True) -> None:
        self.env = env
        self._box: dict[tuple[int, int], Any] = {}
        self._lazy = lazy and hasattr(env, "current")
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
        """The payloads ``srcs`` delivered to ``dst`` as one array, row ``k`` from ``srcs[k]`` (KeyError if one is
        missing).

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
                pieces.append((np.flatnonzero(found), take(block.rows, at[found])))
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


def take(rows: Any, at: np.ndarray) -> Any:
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


class CyclicSteps:
    """The steps of :func:`cyclic_steps` kept as an index array, so that they need not be formed pair by pair.

    Step ``r`` (``r = 1 .. n - 1``): local node ``i`` of every group sends to local node ``(i + r) mod n`` of its
    group, groups in order, senders in local order -- the pairs :func:`cyclic_steps` lists.  The ``cyclic`` backend
    (:mod:`fednet.sim.engine.backends.cyclic`) moves them as arrays; elsewhere :meth:`steps` forms the pairs.

    Parameters
    ----------
    groups : sequence of sequences of Node
        Groups of equal size ``n``, no node twice.

    Attributes
    ----------
    groups : list of list of Node
    index : ndarray of int64, (N, n)
        The groups' node indices.

    Raises
    ------
    ValueError
        If the groups' sizes differ.
    """

    __slots__ = ("groups", "index")

    def __init__(self, groups: Sequence[Sequence[Node]]) -> None:
        self.groups = [list(members) for members in groups]
        sizes = {len(g) for g in self.groups}
        if len(sizes) > 1:
            raise ValueError(f"groups must have equal sizes, got sizes {sorted(sizes)}")
        n = sizes.pop() if sizes else 0
        self.index = np.array([[node.index for node in members] for members in self.groups],
                              dtype=np.int64).reshape(len(self.groups), n)

    @property
    def n(self) -> int:
        """Nodes per group."""
        return int(self.index.shape[1])

    def __len__(self) -> int:
        """Number of steps, ``n - 1`` (0 for groups of one node or none)."""
        return max(self.n - 1, 0)

    def steps(self) -> list[list[tuple[Node, Node]]]:
        """The pairs, step by step: :func:`cyclic_steps` of the groups."""
        return cyclic_steps(self.groups)

    def receivers(self, r: int | np.ndarray) -> np.ndarray:
        """Receivers of step ``r`` (or of each step of an array of them), in the senders' order.

        Returns
        -------
        ndarray of int64, (N n,) or (len(r), N n)
            Element ``g n + i`` (of row ``k``): the node local node ``i`` of group ``g`` sends to in step ``r``
            (``r[k]``), ``index[g, (i + r) mod n]``.
        """
        N, n = self.index.shape
        r = np.asarray(r, dtype=np.int64)
        cols = (np.arange(n)[None, :] + r.reshape(-1, 1)) % n                 # (steps, n)
        out = self.index[np.arange(N)[None, :, None], cols[:, None, :]]      # (steps, N, n)
        return out.reshape(-1, N * n) if r.ndim else out.reshape(N * n)


def prepend(first: Any, rest: Sequence[Any]) -> Sequence[Any]:
    """``[first, *rest]``; a :class:`Repeated` (``O(1)``) where ``rest`` is one."""
    if isinstance(rest, Repeated):
        return Repeated(rest.value, rest.n, (first, *rest.head))
    return [first, *rest]


class AlikeDelivered(Mapping):
    """What an exchange of :class:`CyclicSteps` whose every share is one ``value`` delivered: ``{(src, dst): value}``
    over the steps' pairs, in the order of the steps, without an object per pair (the ``cyclic`` backend).

    Parameters
    ----------
    pairs : CyclicSteps
    value : Any
        The payload of every pair (timing mode's stand-in).
    """

    def __init__(self, pairs: CyclicSteps, value: Any) -> None:
        self.pairs, self.value = pairs, value
        self._group = {int(i): (g, k) for g, row in enumerate(pairs.index.tolist()) for k, i in enumerate(row)}

    def __getitem__(self, pair: tuple[int, int]) -> Any:
        src, dst = pair
        a, b = self._group.get(int(src)), self._group.get(int(dst))
        if a is None or b is None or a[0] != b[0] or a[1] == b[1]:
            raise KeyError(pair)
        return self.value

    def __iter__(self) -> Iterator[tuple[int, int]]:
        senders = self.pairs.index.reshape(-1).tolist()
        for r in range(1, self.pairs.n):
            yield from zip(senders, self.pairs.receivers(r).tolist())

    def __len__(self) -> int:
        return self.pairs.index.size * len(self.pairs)

    def received(self) -> dict[int, Repeated]:
        """Receiver -> the payloads it received (``n - 1`` references to ``value``), receivers in node order of the
        groups."""
        many = len(self.pairs)
        return {} if not many else {i: Repeated(self.value, many) for i in self.pairs.index.reshape(-1).tolist()}


def received_by(delivered: Mapping[tuple[int, int], Any]) -> dict[int, Sequence[Any]]:
    """An exchange's ``{(src, dst): payload}`` grouped by receiver: ``{dst: [payloads, in the mapping's order]}``;
    in ``O(receivers)`` for an :class:`AlikeDelivered` (its :meth:`~AlikeDelivered.received`)."""
    if isinstance(delivered, AlikeDelivered):
        return delivered.received()
    out: dict[int, list[Any]] = {}
    for (_, dst), value in delivered.items():
        out.setdefault(dst, []).append(value)
    return out


@dataclass(frozen=True)
class AllToAll:
    """One step of :meth:`fednet.protocol.primitives.Net.exchange`: every sender to every receiver but itself.

    The step ``[(src, dst) for src in senders for dst in receivers if dst is not src]``, kept as the two
    lists so that the bundled schedule can move it without forming its ``N^2`` pairs (the ``bundled`` backend).

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


class Bundles(Mapping):
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


def stack(tables: Sequence[Any]) -> Any:
    """Equal arrays stacked on a new first axis, or the :class:`~fednet.protocol.modes.Shape` of that stack."""
    if all(isinstance(t, Shape) for t in tables):
        shapes = {(t.shape, np.dtype(t.dtype)) for t in tables}
        if len(shapes) > 1:
            raise ValueError(f"the rows of an exchange must have one shape, got {sorted(shapes, key=str)}")
        return Shape((len(tables), *tables[0].shape), tables[0].dtype)
    if any(isinstance(t, Shape) for t in tables) or not all(isinstance(t, np.ndarray) for t in tables):
        raise TypeError("the rows of an exchange must all be ndarrays or all timing-mode Shape stand-ins")
    return np.stack(tables)
