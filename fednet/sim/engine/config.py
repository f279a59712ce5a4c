"""Which engine backends a :class:`~fednet.sim.simulation.Simulation` may use, and whether it records their paths.

The configuration is an object on the simulation (``Simulation(..., engine=EngineConfig(...))``), never a module
global.  Its default comes from the environment variable ``FEDNET_ENGINE`` (read when the simulation is made):

===========================  ==================================================================================
``FEDNET_ENGINE`` unset       every backend allowed (the default)
``reference``                 none: every step runs on the reference semantics (plain SimPy processes)
``-tree,-batched``            every backend but those named
``gather,batched``            only those named
===========================  ==================================================================================

``FEDNET_ENGINE=reference make test`` runs the whole test suite on the reference path (``.ci/run`` runs a
representative part of it so).  Unknown names are an error naming them, so a typo never silently leaves a backend on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fednet.errors import ConfigError

__all__ = ["BACKENDS", "EngineConfig", "ENV_VAR"]

#: The backends of :mod:`fednet.sim.engine.backends` and what each stands for (the reference semantics of its step
#: kind, replayed or reorganised; every one gives the same times, draws, counters and views, bit for bit).
BACKENDS: dict[str, str] = {
    "gather": "a gather (or an edgeless tree) replayed without a process per node",
    "batched": "within the gather replay: every node's value from one batched kernel call, times as vectors",
    "groups": "the gathers of disjoint groups replayed together without a process per node",
    "tree": "a tree aggregation with edges replayed without a process per node",
    "compute": "compute_each without a process per node (the computations in the nodes' order, one resume)",
    "bundled": "an all-to-all exchange on the bundled schedule moved as arrays (one upload and forward per node)",
    "relays": "the relay_asap / relay_steps exchanges replayed with array arithmetic",
    "cyclic": ("an all-to-all in groups (CyclicSteps) of alike timing-mode shares replayed as index arrays, "
               "no object per pair"),
    "masked": "a masked secure sum (LightSecAgg's round) replayed without a process per user",
    "mailbox": "a mailbox materialises only the events that complete a wait",
    "buffered": "asynchronous clients and the server's buffer (FedBuff) replayed as arrays across rounds",
}

#: The environment variable of the default configuration (module docstring).
ENV_VAR = "FEDNET_ENGINE"


@dataclass(frozen=True)
class EngineConfig:
    """The backends a simulation may use (:data:`BACKENDS`) and whether it records which one ran each step.

    Parameters
    ----------
    allowed : frozenset of str, optional
        The backends that may run (default: all of :data:`BACKENDS`).  A step whose backends are all disallowed
        or decline runs on the reference semantics.
    record_paths : bool
        Count, per step, which backend ran it or why the reference ran (:class:`~fednet.sim.engine.paths.EnginePaths`,
        ``Simulation.engine_paths``; a few dictionary updates per step).

    Raises
    ------
    fednet.errors.ConfigError
        For an unknown backend name.
    """

    allowed: frozenset[str] = field(default_factory=lambda: frozenset(BACKENDS))
    record_paths: bool = True

    def __post_init__(self) -> None:
        allowed = frozenset(self.allowed)
        unknown = sorted(allowed - set(BACKENDS))
        if unknown:
            raise ConfigError(f"engine backends {unknown} are unknown; the backends are {sorted(BACKENDS)}")
        object.__setattr__(self, "allowed", allowed)

    def allows(self, backend: str) -> bool:
        """Whether ``backend`` may run."""
        return backend in self.allowed

    @property
    def reference(self) -> bool:
        """Whether every step runs on the reference semantics (no backend allowed)."""
        return not self.allowed

    def without(self, *backends: str) -> EngineConfig:
        """This configuration with ``backends`` disallowed."""
        return EngineConfig(self.allowed - set(backends), self.record_paths)

    @classmethod
    def parse(cls, text: str | None) -> EngineConfig:
        """The configuration a ``FEDNET_ENGINE`` value names (module docstring); None or ``""``: the default.

        Raises
        ------
        fednet.errors.ConfigError
            For an unknown name, or a list mixing ``-name`` and ``name``.
        """
        text = (text or "").strip()
        if not text or text == "all":
            return cls()
        if text == "reference":
            return cls(frozenset())
        names = [t.strip() for t in text.split(",") if t.strip()]
        off = [n[1:] for n in names if n.startswith("-")]
        on = [n for n in names if not n.startswith("-")]
        if off and on:
            raise ConfigError(f"{ENV_VAR}={text!r} mixes backends to allow and to disallow; give one kind")
        try:
            if off:
                cls(frozenset(off))                      # every name known
                return cls(frozenset(BACKENDS) - set(off))
            return cls(frozenset(on))
        except ConfigError as e:
            raise ConfigError(f"{ENV_VAR}={text!r}: {e}") from None

    @classmethod
    def from_env(cls) -> EngineConfig:
        """The configuration ``$FEDNET_ENGINE`` names (the default of every :class:`Simulation`)."""
        return cls.parse(os.environ.get(ENV_VAR))
