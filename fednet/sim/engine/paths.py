"""Which backend ran each step of a run, or why the reference semantics ran it (``Simulation.engine_paths``).

A slow run is explained without a profiler: ``fednet run --explain-engine`` prints :meth:`EnginePaths.explain`
for every run, and every study run writes :meth:`EnginePaths.as_dict` to ``timing.json`` (host facts, like the
host seconds beside them: the backend chosen never changes a simulated number).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["EnginePaths", "REFERENCE"]

#: The path name of the reference semantics (plain SimPy processes).
REFERENCE = "reference"

log = logging.getLogger("fednet.engine")


class EnginePaths:
    """Counts of ``(step kind, step name) -> path`` and, for each declined backend, of its reasons.

    A path is a backend's name (:data:`~fednet.sim.engine.config.BACKENDS`) or :data:`REFERENCE`.  The first time a
    step falls back for a given reason the reason is logged on the ``fednet.engine`` logger (level INFO).
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.reasons: Counter[tuple[str, str, str]] = Counter()

    def record(self, kind: str, name: str, path: str, reasons: Iterable[str] = ()) -> None:
        """Count one step of ``kind`` named ``name`` run by ``path``; ``reasons``: why the backends before it
        declined."""
        self.counts[(kind, name, path)] += 1
        for reason in reasons:
            self.decline(kind, name, reason)

    def decline(self, kind: str, name: str, reason: str) -> None:
        """Count one reason a backend declined a step (that another path then ran, recorded by :meth:`record`)."""
        key = (kind, name, reason)
        if key not in self.reasons:
            log.info("engine: %s %s declined: %s", kind, name, reason)
        self.reasons[key] += 1

    def count(self, path: str, kind: str | None = None) -> int:
        """How many steps ``path`` ran (of ``kind``, if given)."""
        return sum(n for (k, _, p), n in self.counts.items() if p == path and (kind is None or k == kind))

    def merge(self, other: EnginePaths | Mapping[str, Any]) -> None:
        """Add ``other``'s counts (an :class:`EnginePaths` or its :meth:`as_dict`)."""
        if isinstance(other, EnginePaths):
            self.counts.update(other.counts)
            self.reasons.update(other.reasons)
            return
        for row in other.get("steps", []):
            self.counts[(row["kind"], row["step"], row["path"])] += int(row["count"])
        for row in other.get("declined", []):
            self.reasons[(row["kind"], row["step"], row["reason"])] += int(row["count"])

    def as_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The counts as JSON-ready rows, sorted: ``{"steps": [...], "declined": [...]}``."""
        return {"steps": [{"kind": k, "step": s, "path": p, "count": n}
                          for (k, s, p), n in sorted(self.counts.items())],
                "declined": [{"kind": k, "step": s, "reason": r, "count": n}
                             for (k, s, r), n in sorted(self.reasons.items())]}

    def explain(self) -> str:
        """A table: per step, how often each path ran it, then each reason a backend declined it."""
        if not self.counts:
            return "  (no engine step ran)"
        lines = []
        steps = sorted({(k, s) for k, s, _ in self.counts})
        width = max(len(f"{k} {s}") for k, s in steps)
        for k, s in steps:
            paths = ", ".join(f"{p} x{n}" for (k2, s2, p), n in sorted(self.counts.items()) if (k2, s2) == (k, s))
            lines.append(f"  {f'{k} {s}':<{width}}  {paths}")
            for (k2, s2, r), n in sorted(self.reasons.items()):
                if (k2, s2) == (k, s):
                    lines.append(f"  {'':<{width}}    declined x{n}: {r}")
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return bool(self.counts)
