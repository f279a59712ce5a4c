"""What the engine's steps take and give: results, failures, message sizes (no SimPy here but the types).

:class:`GatherResult` is what ``gather``, ``first_k``, ``gather_groups`` and ``tree_aggregate`` return; the failures
:class:`StragglerShortfall` and :class:`UnchargedCompute`; :func:`payload_size` sizes a payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from fednet.algebra.meter import charged_alike
from fednet.errors import DecodeFailure
from fednet.sim.simulation import Node

__all__ = ["GatherResult", "Outgoing", "StragglerShortfall", "UnchargedCompute", "EngineError", "payload_size",
           "Batch", "batched", "batch_of", "alike_batches", "SCHEDULES", "compute_key", "uploaded_elements"]

#: ``batch(nodes, received) -> (values, macs)``: the step ``fn`` of a gather for many nodes at once, ``values[p]``
#: being what ``fn(nodes[p])`` returns once ``nodes[p].state.received`` is ``received`` and ``macs[p]`` the MACs that
#: call meters; the batched kernels meter ``sum(macs)`` in all (checked).  It must not change any state (it runs for
#: every node, also those cancelled before they would have computed).
Batch = Callable[[list, Any], tuple[Sequence[Any], Sequence[int]]]


def batched(many: Callable[..., tuple[Sequence[Any], Sequence[int]]]) -> Callable[[Callable], Callable]:
    """Declare ``many`` the batched form of a step function or method (what the engine's backends pick).

    ``many(nodes, received)`` for a function, ``many(owner, nodes, received)`` for a method (``owner`` being the
    object the method is bound to) must be a :data:`Batch` of the step: the values and MAC counts the step gives
    node by node, computed at once (the batched kernels live beside their scalar kernels, in ``fednet.learning``
    or ``fednet.codes``).  The declaration belongs to that function only: a subclass that overrides the method
    without declaring it again runs node by node, so a batch can never stand in for code it does not compute.
    ``fednet.testing.check_engine`` compares the two.

    Examples
    --------
    >>> @batched(minibatch_gradients_of)            # doctest: +SKIP
    ... def local_gradient(self, dev): ...
    """
    def declare(fn: Callable) -> Callable:
        fn.many = many
        return fn
    return declare


def batch_of(fn: Callable | None) -> Batch | None:
    """The :data:`Batch` declared for step ``fn`` with :func:`batched` (bound to ``fn``'s owner), or None."""
    many = getattr(fn, "many", None)
    if many is None:
        return None
    owner = getattr(fn, "__self__", None)
    return many if owner is None else partial(many, owner)


def alike_batches(fn: Callable, combine: Callable | None = None) -> tuple[Batch, Callable[[list, list], Any]]:
    """Batches of a step whose every call charges the same MACs and gives the same value (timing mode's
    stand-ins of one shape): ``fn`` (and ``combine``) run once per batch (:func:`fednet.algebra.meter.charged_alike`).

    Returns
    -------
    batch : Batch
        ``batch(nodes, received)``.
    combine_batch : callable(accs, parts) -> (values, macs) or None
    """
    def batch(nodes: list, received: Any) -> tuple[list, list[int]]:
        return charged_alike(len(nodes), fn, nodes[0], received)

    def combine_batch(accs: list, parts: list) -> tuple[list, list[int]]:
        return charged_alike(len(accs), combine, accs[0], parts[0])
    return batch, (None if combine is None else combine_batch)


class EngineError(RuntimeError):
    """A precondition a backend relied on was violated while it ran: the times it gave would be wrong."""


SCHEDULES = ("relay_steps", "relay_asap", "upload_once", "bundled")


class StragglerShortfall(DecodeFailure):
    """Fewer nodes responded than a :meth:`fednet.protocol.primitives.Net.gather` (or ``first_k``, ``tree_aggregate``)
    needed.

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
    """A message to be sent by :meth:`fednet.protocol.primitives.Net.send_all`.

    Attributes
    ----------
    src, dst : Node
    payload : Any
    kind : str
    n_elements : int or None
        Defaults to :func:`payload_size` of the payload.
    element_bits : int, fednet.sim.engine.wire.Width or None
        Bits per number; None: from the payload (:mod:`fednet.sim.engine.wire`; an error where it cannot tell).
    encrypted : bool
        A message to the server that it only stores and forwards (see :meth:`fednet.protocol.primitives.Net.send`).
    timing_key : str
        Key of the message's loss draws (see :meth:`fednet.protocol.primitives.Net.send`).
    """

    src: Node
    dst: Node
    payload: Any
    kind: str
    n_elements: int | None = None
    element_bits: Any = None
    encrypted: bool = False
    timing_key: str = ""


@dataclass
class GatherResult:
    """What a :meth:`fednet.protocol.primitives.Net.gather`, ``first_k`` or ``tree_aggregate`` step produced.

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
        until :meth:`fednet.protocol.primitives.Net.cancel`; later results are not collected).
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


def compute_key(timing_key: str) -> str:
    """The engine's compute-draw key for a primitive's ``timing_key``: ``"compute"`` or ``"compute-<key>"``."""
    return f"compute-{timing_key}" if timing_key else "compute"



def uploaded_elements(upload_elements: int | Callable[[Any], int] | None) -> Callable[[Any], int]:
    """The number of elements a node uploads for its result: ``upload_elements(result)``, the given count, or
    :func:`payload_size` of the result; marked ``by_shape`` when it depends only on the result's shape."""
    def size_of(result: Any) -> int:
        """Number of uploaded elements of ``result``."""
        if callable(upload_elements):
            return upload_elements(result)
        return upload_elements if upload_elements is not None else payload_size(result)
    size_of.by_shape = not callable(upload_elements)     # the same for values of one shape
    return size_of
