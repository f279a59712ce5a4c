"""A step the engine executes, the backend interface, and the dispatch between backends and the reference.

A primitive (``self.net.gather(...)``, :mod:`fednet.protocol.primitives`) describes its step -- kind, name, nodes,
sizes, timing key, first-k, deadline, kernels -- as a :class:`Step` and asks :func:`execute` to run it.  Each step
kind has reference semantics (:mod:`fednet.sim.engine.reference`: plain SimPy processes) and zero or more backends
(:mod:`fednet.sim.engine.backends`), tried in order, as networkx dispatches to its backends
(``networkx/utils/backends.py``): a backend the configuration allows is asked ``can_run(net, step)``, which returns
``True`` or the reason it cannot (derived from the engine's own state, never promised by the caller); the first that
can runs the step, else the reference does.  Either way the path and every reason are recorded
(:class:`~fednet.sim.engine.paths.EnginePaths`).  A backend may still decline once running, before any simulated
effect, by returning :class:`Declined`; the engine then goes on down the list.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar

from .paths import REFERENCE

__all__ = ["Step", "Backend", "Declined", "execute"]


class Step:
    """One step for the engine: its ``kind`` (``gather``, ``groups``, ``tree``, ``compute``, ``exchange``, ``masked``,
    ``buffered``), a ``name``
    for reports (e.g. ``"gather 'gradient'"``) and its arguments, read as attributes (``step.download``).

    The arguments are what the primitive of that kind takes, already normalised by it (lists of nodes, the charged
    ``fn``, the upload-size function); each kind's keys are documented at its reference function.
    """

    __slots__ = ("kind", "name", "args")

    def __init__(self, kind: str, name: str, **args: Any) -> None:
        self.kind, self.name, self.args = kind, name, args

    def __getattr__(self, key: str) -> Any:
        try:
            return self.args[key]
        except KeyError:
            raise AttributeError(f"a {self.kind} step has no argument {key!r}") from None

    def __repr__(self) -> str:
        return f"Step({self.kind}, {self.name!r})"


@dataclass(frozen=True)
class Declined:
    """What a backend's ``run`` returns, before any simulated effect, when it finds it cannot run the step after all."""

    reason: str


class Backend:
    """A backend: another execution of one step kind's reference semantics, with the same results bit for bit.

    Subclasses set ``name`` (a key of :data:`~fednet.sim.engine.config.BACKENDS`) and ``kind``, and implement
    :meth:`can_run` and :meth:`run`.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference's results for ``step`` now, else the reason (a sentence)."""
        raise NotImplementedError

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (a SimPy sub-generator); may return :class:`Declined` before any simulated effect."""
        raise NotImplementedError


def execute(net: Any, step: Step, backends: list[Backend], reference: Callable[[Any, Step], Generator]) -> Generator:
    """Run ``step`` on the first of ``backends`` that the configuration allows and that can run it, else on
    ``reference``; record the path taken and every reason a backend declined (module docstring)."""
    sim = net.sim
    config = sim.engine
    reasons: list[str] = []
    for backend in backends:
        if not config.allows(backend.name):
            reasons.append(f"{backend.name}: not allowed by the engine configuration")
            continue
        ok = backend.can_run(net, step)
        if ok is not True:
            reasons.append(f"{backend.name}: {ok}")
            continue
        out = yield from backend.run(net, step)
        if isinstance(out, Declined):
            reasons.append(f"{backend.name}: {out.reason}")
            continue
        if config.record_paths:
            sim.engine_paths.record(step.kind, step.name, backend.name, reasons)
        return out
    if config.record_paths:
        sim.engine_paths.record(step.kind, step.name, REFERENCE, reasons)
    return (yield from reference(net, step))
