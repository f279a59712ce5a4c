"""Progress of a study with an ETA that follows cost, not rounds.

The rounds of a study cost very different host times: a coded protocol's set-up (round 0) can take 97 % of its
run, one protocol's epoch can be a hundred times another's. An ETA counted in rounds (the bar before issue 30,
item 5) showed 11:36:46 left for a study that took 2:33. :class:`StudyProgress` instead estimates each
(run, seed) pair's host cost from what was measured so far::

    cost(pair of run r) = setup_r + (E_r - 1) * round_r

with ``E_r`` the rows a pair of ``r`` is expected to write (``epochs + 1``, lowered to the rows of a finished pair
stopped early by ``stop_at``), ``setup_r`` the host seconds to its first row (building the protocol and its
set-up) and ``round_r`` the host seconds per later row, each the mean over the pairs of run ``r`` measured so far;
a run with no measurement yet takes the mean of the runs of the same protocol, else of every run (per-protocol
estimates). A running pair counts what is left of its own estimate (its own rate per row once it has two rows).
The ETA is the estimated host seconds left divided by the number of pairs that can run at once
(``workers``: 1 serially, the Dask workers in parallel). These are host-clock figures for the user's patience
only: nothing simulated depends on them.

On a terminal (``stream.isatty()``) the progress is a tqdm bar in percent of the estimated work; elsewhere (a
log file, CI) it is quiet and line-based: one line when a pair finishes at most every ``interval`` host seconds
(and at least every ``interval`` while a long pair runs), and a last line at the end, never a carriage return.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["StudyProgress", "Pair", "format_eta", "study_progress"]


#: The tqdm bar on a terminal: the share of the estimated host work (the pairs done, the ETA and the status follow).
_BAR = "{desc}: {percentage:3.0f}%|{bar}|"


def format_eta(seconds: float | None) -> str:
    """``H:MM:SS`` (or ``MM:SS``) of host seconds, ``"?"`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(max(0.0, seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


@dataclass
class Pair:
    """One (run, seed) pair of the plan.

    Attributes
    ----------
    key : hashable
        ``(run index, seed)``.
    run : str
        The run's label (pairs of one run share their estimates).
    protocol : str
        The run's protocol (runs of one protocol lend each other estimates).
    """

    key: Hashable
    run: str
    protocol: str


@dataclass
class _Running:
    rows: int = 0
    elapsed: float = 0.0
    setup: float | None = None
    started: float | None = None


@dataclass
class _Samples:
    setup: list[float] = field(default_factory=list)
    round: list[float] = field(default_factory=list)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


class StudyProgress:
    """Progress and cost-weighted ETA of a study's (run, seed) pairs (module docstring).

    Parameters
    ----------
    pairs : sequence of Pair
        Every pair of the study, in any order.
    expect : dict of str to int
        Rows a pair of each run is expected to write (``epochs + 1``).
    desc : str
        The study's name, leading every line.
    enabled : bool
        False: nothing is shown (the estimates still work).
    stream : file, optional
        Where to write (default ``sys.stderr``); a TTY gets a tqdm bar, anything else lines.
    clock : callable, optional
        Host seconds (default ``time.perf_counter``); tests feed a fake one.
    workers : int
        How many pairs run at once (the ETA divides the work left by ``min(workers, pairs left)``).
    interval : float
        Host seconds between two lines when not on a TTY.
    """

    def __init__(self, pairs: Sequence[Pair], expect: dict[str, int], *, desc: str, enabled: bool = True,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.perf_counter, workers: int = 1,
                 interval: float = 30.0) -> None:
        self.pairs = {p.key: p for p in pairs}
        self.expect = dict(expect)
        self.desc, self.enabled, self.clock = desc, enabled, clock
        self.stream = sys.stderr if stream is None else stream
        self.workers = max(1, int(workers))
        self.interval = float(interval)
        self.done: dict[Hashable, float] = {}            # key -> host seconds spent now (0 for a resumed pair)
        self.running: dict[Hashable, _Running] = {}
        self.samples: dict[str, _Samples] = {}
        self.status = ""
        self.t0 = clock()
        self._last_line: float | None = None
        self._last_draw = -1.0
        self._lock = threading.RLock()
        try:
            tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            tty = False
        self.tty = tty
        self._bar = None
        if enabled and tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=1000, desc=desc, file=self.stream, leave=False, dynamic_ncols=True,
                             bar_format=_BAR)

    # -- events ---------------------------------------------------------------------------------------------

    def start(self, key: Hashable) -> None:
        """Pair ``key`` starts now (serial runs: its elapsed time is then taken from the clock)."""
        with self._lock:
            self.running[key] = _Running(started=self.clock())

    def update(self, key: Hashable, rows: int, elapsed: float | None = None, setup: float | None = None) -> None:
        """Pair ``key`` has written ``rows`` rows after ``elapsed`` host seconds (default: since :meth:`start`).

        ``setup`` is the host seconds to its first row when known (a Dask worker's report); otherwise it is taken
        as the elapsed time when the first row is reported.
        """
        with self._lock:
            if key in self.done:                        # a late report of a finished pair (Dask events race)
                return
            st = self.running.setdefault(key, _Running(started=self.clock()))
            if elapsed is None:
                elapsed = self.clock() - (st.started if st.started is not None else self.t0)
            if setup is not None:
                st.setup = setup
            elif st.setup is None and rows >= 1:
                st.setup = elapsed
            st.rows, st.elapsed = int(rows), float(elapsed)
            self._show(force=False)

    def finish(self, key: Hashable, rows: int, wall_s: float, *, resumed: bool = False) -> None:
        """Pair ``key`` finished with ``rows`` rows in ``wall_s`` host seconds (``resumed``: from a checkpoint,
        taken now at no cost; its time still informs the estimates)."""
        with self._lock:
            st = self.running.pop(key, None)
            run = self.pairs[key].run
            smp = self.samples.setdefault(run, _Samples())
            setup = st.setup if st is not None and st.setup is not None else None
            if setup is None:                             # no row reported: spread the time evenly over the rows
                setup = wall_s / max(rows, 1)
            smp.setup.append(setup)
            if rows > 1:
                smp.round.append(max(wall_s - setup, 0.0) / (rows - 1))
            self.expect[run] = min(self.expect[run], rows)  # stopped early by stop_at: its other seeds likely too
            self.done[key] = 0.0 if resumed else float(wall_s)
            self._show(force=not resumed)

    def set_status(self, text: str) -> None:
        """What happens now (``"loading mnist"``, ``"CodedSecAgg seed 1"``), shown after the ETA."""
        with self._lock:
            self.status = text
            self._show(force=False)

    # -- estimates ------------------------------------------------------------------------------------------

    def _estimate(self, run: str, what: str) -> float | None:
        """Mean ``setup`` or ``round`` host seconds of ``run``, else of its protocol's runs, else of every run."""
        own = self.samples.get(run)
        if own is not None and getattr(own, what):
            return _mean(getattr(own, what))
        proto = self.pairs_protocol(run)
        same = [x for r, s in self.samples.items() if self.pairs_protocol(r) == proto for x in getattr(s, what)]
        if same:
            return _mean(same)
        return _mean([x for s in self.samples.values() for x in getattr(s, what)])

    def pairs_protocol(self, run: str) -> str | None:
        """The protocol of the run labelled ``run``."""
        return next((p.protocol for p in self.pairs.values() if p.run == run), None)

    def remaining(self) -> float | None:
        """Estimated host seconds of work left (summed over the pairs not finished), or None while unknown."""
        with self._lock:
            total = 0.0
            for key, pair in self.pairs.items():
                if key in self.done:
                    continue
                E = self.expect[pair.run]
                st = self.running.get(key)
                setup, rnd = self._estimate(pair.run, "setup"), self._estimate(pair.run, "round")
                if st is not None and st.rows >= 2 and st.setup is not None:
                    own = (st.elapsed - st.setup) / (st.rows - 1)
                    total += max(E - st.rows, 0) * own
                    continue
                if rnd is None and E > 1:
                    return None
                rnd = rnd or 0.0
                if st is not None and st.rows >= 1:
                    total += max(E - st.rows, 0) * rnd
                    continue
                if setup is None:
                    return None
                total += max(setup - (st.elapsed if st is not None else 0.0), 0.0) + (E - 1) * rnd
            return total

    def spent(self) -> float:
        """Host seconds of work done so far (finished pairs run now, and the running pairs' elapsed time)."""
        with self._lock:
            return sum(self.done.values()) + sum(st.elapsed for st in self.running.values())

    def eta(self) -> float | None:
        """Estimated host seconds until the study ends: :meth:`remaining` over the pairs that can run at once."""
        left = self.remaining()
        if left is None:
            return None
        n_left = sum(1 for k in self.pairs if k not in self.done)
        return left / max(1, min(self.workers, n_left)) if n_left else 0.0

    def fraction(self) -> float | None:
        """Share of the estimated work done, in [0, 1] (None while unknown)."""
        left = self.remaining()
        if left is None:
            return None
        spent = self.spent()
        return 1.0 if spent + left <= 0 else spent / (spent + left)

    def line(self) -> str:
        """One line of progress: share of the estimated work, pairs done, host time elapsed and ETA, status."""
        frac = self.fraction()
        pct = "  ?%" if frac is None else f"{100 * frac:3.0f}%"
        n = len(self.pairs)
        text = (f"{self.desc}: {pct} | {len(self.done)}/{n} runs x seeds | elapsed "
                f"{format_eta(self.clock() - self.t0)} | ETA {format_eta(self.eta())}")
        return text + (f" | {self.status}" if self.status else "")

    # -- display --------------------------------------------------------------------------------------------

    def _show(self, force: bool) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self._bar is not None:
            if not force and now - self._last_draw < 0.5:
                return
            self._last_draw = now
            frac = self.fraction()
            self._bar.n = 0 if frac is None else int(round(1000 * frac))
            text = (f"{len(self.done)}/{len(self.pairs)} runs x seeds, ETA {format_eta(self.eta())}"
                    + (f", {self.status}" if self.status else ""))
            self._bar.bar_format = _BAR + " " + text.replace("{", "{{").replace("}", "}}")
            self._bar.refresh()
            return
        if now - (self.t0 if self._last_line is None else self._last_line) >= self.interval:
            self._write()

    def _write(self) -> None:
        self._last_line = self.clock()
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the display: a tty bar is removed, a line-based one writes its last line."""
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self.enabled and self.pairs:
                self._write()

    def __enter__(self) -> "StudyProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def study_progress(study: Any, *, enabled: bool = True, workers: int = 1, **kwargs: Any) -> StudyProgress:
    """The :class:`StudyProgress` of every (run index, seed) pair of a validated study.

    Parameters
    ----------
    study : fednet.study.config.Study
    enabled : bool
        Show it (``progress`` of :func:`~fednet.study.runner.run_study`).
    workers : int
        Pairs running at once (Dask workers; 1 serially).
    **kwargs
        ``stream``, ``clock``, ``interval`` of :class:`StudyProgress`.
    """
    pairs = [Pair((i, seed), run.name, run.protocol) for i, run in enumerate(study.runs) for seed in study.seeds]
    expect = {run.name: study.run_epochs(run) + 1 for run in study.runs}
    return StudyProgress(pairs, expect, desc=study.name, enabled=enabled, workers=workers, **kwargs)
