"""Availability from a trace of per-device on/off times (issue 30, item 7).

A trace lists, for some devices, the intervals of simulated time in which each is *on* (reachable and willing to
train: charging, idle, on Wi-Fi, as in the device-availability traces of cross-device FL studies). A device takes
part in a round when it is on at the simulated time at which the protocol first asks about it in that round (usually
when the server starts the round); the answer is kept for the rest of the round, as every availability model's is
(:meth:`fednet.sim.simulation.Simulation.available`). A device the trace does not list is always on. Nothing is
drawn: the trace is the same for every protocol and seed, so runs stay paired.

File format (CSV with a header; ``#`` starts a comment line)::

    device,on_s,off_s
    0,0,3600
    0,7200,inf
    3,120.5,980

``device`` is a device index ``0 .. D-1``; the device is on for ``on_s <= t < off_s`` (simulated seconds, ``off_s``
may be ``inf``); a device's intervals must not overlap. In a study: ``[network] availability = "trace"`` and
``availability_trace = "on_off.csv"`` (a path relative to the study file's folder, then the working folder).
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from fednet.errors import ConfigError

from .compute import Availability, UniformDraw

__all__ = ["TraceAvailability", "read_availability_trace"]

#: The header a trace file starts with.
COLUMNS = ("device", "on_s", "off_s")


class TraceAvailability(Availability):
    """Devices on during the intervals of a trace, always on when not listed (module docstring).

    Parameters
    ----------
    intervals : mapping of int to sequence of (float, float)
        For each listed device, its on-intervals ``[on_s, off_s)`` in simulated seconds: ``0 <= on_s < off_s``,
        ``off_s`` may be ``inf``, non-overlapping (any order).
    n_devices : int, optional
        D; when given, every listed device must be below it.

    Raises
    ------
    fednet.errors.ConfigError
        If an interval is empty, negative, not a number or overlaps another of its device, or a device index is
        negative or (with ``n_devices``) not below D; the message names the device and interval.
    """

    def __init__(self, intervals: Mapping[int, Sequence[tuple[float, float]]], n_devices: int | None = None) -> None:
        self.starts: dict[int, list[float]] = {}
        self.ends: dict[int, list[float]] = {}
        for device, spans in intervals.items():
            d = int(device)
            if d < 0 or (n_devices is not None and d >= n_devices):
                raise ConfigError(f"availability trace: device {device!r} is not a device index 0 .. "
                                  f"{'D-1' if n_devices is None else n_devices - 1}")
            ordered = sorted((float(a), float(b)) for a, b in spans)
            for a, b in ordered:
                if not (math.isfinite(a) and a >= 0 and b > a and not math.isnan(b)):
                    raise ConfigError(f"availability trace: device {d}: interval ({a!r}, {b!r}) must have "
                                      f"0 <= on_s < off_s (finite on_s; off_s may be inf)")
            for (a0, b0), (a1, b1) in zip(ordered, ordered[1:]):
                if a1 < b0:
                    raise ConfigError(f"availability trace: device {d}: intervals ({a0}, {b0}) and ({a1}, {b1}) "
                                      f"overlap")
            self.starts[d] = [a for a, _ in ordered]
            self.ends[d] = [b for _, b in ordered]
        self._clock: Callable[[], float] | None = None

    def bind(self, clock: Callable[[], float]) -> None:
        """Read simulated time from ``clock`` (the simulation's ``env.now``; :class:`~fednet.sim.Simulation` binds
        it). One model serves one simulation: binding a second clock raises :class:`ValueError`."""
        if self._clock is not None and self._clock is not clock:
            raise ValueError("a TraceAvailability is bound to one simulation; build one per Simulation")
        self._clock = clock

    def on(self, node: int, t: float) -> bool:
        """True when ``node`` is on at simulated time ``t`` (always for a device the trace does not list)."""
        starts = self.starts.get(node)
        if starts is None:
            return True
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t < self.ends[node][i]

    def available(self, node: int, round: int, draw: UniformDraw) -> bool:
        """:meth:`on` at the simulation's current time (``draw`` is not used: nothing random)."""
        if self._clock is None:
            raise RuntimeError("TraceAvailability is not bound to a simulation's clock (Simulation binds it)")
        return self.on(node, self._clock())

    def __repr__(self) -> str:
        return f"TraceAvailability({len(self.starts)} devices listed)"


def read_availability_trace(path: str | Path, n_devices: int) -> TraceAvailability:
    """Read a trace file (module docstring) into a :class:`TraceAvailability` for ``n_devices`` devices.

    Parameters
    ----------
    path : str or Path
        The CSV file.
    n_devices : int
        D: every listed device must be below it.

    Returns
    -------
    TraceAvailability

    Raises
    ------
    fednet.errors.ConfigError
        If the file cannot be read, lacks the header ``device,on_s,off_s``, or holds a row that is not an integer
        device and two numbers, or an interval :class:`TraceAvailability` refuses; the message names the file and
        line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"availability_trace {str(p)!r}: cannot read it: {e}") from None
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")]
    if not rows or tuple(c.strip() for c in next(csv.reader([rows[0][1]]))) != COLUMNS:
        raise ConfigError(f"availability_trace {str(p)!r}: the first line must be the header {','.join(COLUMNS)}")
    intervals: dict[int, list[tuple[float, float]]] = {}
    for n, fields in _records(rows[1:]):
        if len(fields) != 3:
            raise ConfigError(f"availability_trace {str(p)!r}, line {n}: expected 3 fields (device,on_s,off_s), "
                              f"got {len(fields)}")
        try:
            device, on_s, off_s = int(fields[0]), float(fields[1]), float(fields[2])
        except ValueError:
            raise ConfigError(f"availability_trace {str(p)!r}, line {n}: {','.join(fields)!r} is not an integer "
                              f"device and two numbers of seconds") from None
        intervals.setdefault(device, []).append((on_s, off_s))
    try:
        return TraceAvailability(intervals, n_devices)
    except ConfigError as e:
        raise ConfigError(f"{str(p)!r}: {e}") from None


def _records(rows: Iterable[tuple[int, str]]) -> Iterable[tuple[int, list[str]]]:
    for n, line in rows:
        yield n, [f.strip() for f in next(csv.reader([line]))]
