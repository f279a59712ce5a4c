"""Results of a study: time to target accuracy, paired speed-ups with positive intervals, tidy tables.

The time to a target is the simulated time (seconds) at the end of the first round whose test
accuracy reaches the target; ``None`` when the run never reaches it (counted and shown, with
the reason, never averaged in as a number).

Statistics (computed with :mod:`scipy.stats`, never hand formulas):

* times are positive and skewed, so their centre is the **geometric mean** over seeds, and the
  interval is the Student-t interval of ``log(time)`` mapped back by ``exp``
  (``scipy.stats.ttest_1samp(log t).confidence_interval``): it is always positive;
* a **speed-up** is a ratio, ``time(baseline) / time(run)`` paired by seed (both runs faced the
  same keyed stragglers, losses and, with ``feature_seed = "per_seed"``, the same feature draw);
  its centre is the geometric mean of the paired ratios and its interval the t interval of the
  paired log-ratios, mapped back: always positive, and ``1/x`` of the reverse comparison.

``summary.json`` is strict JSON (``allow_nan=False``; every mapping key a string; an unreached
target is ``null`` with a reason) and holds only reproducible numbers, so two runs at the same
seed give byte-identical files; host timings live in ``timing.json``.

Tidy tables (:func:`load_results`, :func:`rounds_frame`, :func:`targets_frame`) are pandas
DataFrames: one row per (run, seed, round), and one per (run, seed, target).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from fednet.protocol.trace import FAILURE_COLUMN, TEXT_COLUMNS, ends_training

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["time_to_target", "crossing", "mean_ci", "log_interval", "target_table", "summarize",
           "format_summary", "format_per_seed", "dumps_strict", "Results", "load_results", "rounds_frame",
           "targets_frame", "summary_frame", "format_frame", "FORMATS", "LEVEL", "device_indices",
           "INDEX_COLUMNS", "time_cell", "energy_cell", "speedup_cell", "last_accuracy_cell", "summary_note"]

#: Confidence level of every interval in the summaries.
LEVEL = 0.95

Traces = Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]]


def crossing(rows: Sequence[Mapping[str, Any]], target: float) -> tuple[float, int] | None:
    """``(time_s, round)`` of the first trace row whose test accuracy reaches ``target`` (None if never).

    A row that ends the run's training (a non-finite model or a run-time overflow: its ``failure``
    column, :mod:`fednet.protocol.finite`) and every row after it are never credited.
    """
    for row in rows:
        if ends_training(row):
            return None
        if row["accuracy"] >= target:
            return float(row["time_s"]), int(row["round"])
    return None


def training_failure(rows: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
    """``(round, reason)`` of the row where the run's training ended as a recorded failure (None: it did not)."""
    for row in rows:
        if ends_training(row):
            return int(row["round"]), str(row[FAILURE_COLUMN])
    return None


def _accuracies(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The test accuracies of the rows before a training failure (finite numbers only)."""
    out = []
    for row in rows:
        if ends_training(row):
            break
        a = float(row["accuracy"])
        if math.isfinite(a):
            out.append(a)
    return out


def _max_accuracy(rows: Sequence[Mapping[str, Any]]) -> float | None:
    accs = _accuracies(rows)
    return max(accs) if accs else None


def _last_accuracy(rows: Sequence[Mapping[str, Any]]) -> float | None:
    accs = _accuracies(rows)
    return accs[-1] if accs else None


def time_to_target(rows: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Simulated seconds until the test accuracy first reaches ``target`` (None if never)."""
    hit = crossing(rows, target)
    return None if hit is None else hit[0]


def mean_ci(values: Iterable[float], level: float = LEVEL) -> dict[str, Any]:
    """Arithmetic mean and Student-t confidence interval of ``values`` (for quantities of any sign).

    Returns
    -------
    dict
        ``mean``, ``ci_low``, ``ci_high`` (equal to the mean for a single value), ``n``.
    """
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    mean = float(x.mean())
    if x.size == 1 or float(x.std()) == 0.0:
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "n": int(x.size)}
    lo, hi = stats.t.interval(level, x.size - 1, loc=mean, scale=stats.sem(x))
    return {"mean": mean, "ci_low": float(lo), "ci_high": float(hi), "n": int(x.size)}


def log_interval(values: Iterable[float], level: float = LEVEL) -> dict[str, Any]:
    """Geometric mean and log-scale Student-t interval of positive ``values`` (times, ratios).

    Parameters
    ----------
    values : iterable of float
        Strictly positive numbers (simulated seconds, or paired ratios).
    level : float
        Confidence level (0.95).

    Returns
    -------
    dict
        ``geomean``, ``ci_low``, ``ci_high`` (``exp`` of the t interval of ``log(values)``:
        positive, ``None`` for fewer than two values), ``n``.

    Raises
    ------
    ValueError
        If a value is not finite and positive (names it).
    """
    x = np.asarray(list(values), dtype=float)
    bad = [v for v in x.tolist() if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"log_interval needs finite positive values, got {bad[0]!r}")
    if x.size == 0:
        return {"geomean": None, "ci_low": None, "ci_high": None, "n": 0}
    logs = np.log(x)
    g = float(np.exp(logs.mean()))
    if x.size == 1:
        return {"geomean": g, "ci_low": None, "ci_high": None, "n": 1}
    if float(np.ptp(logs)) == 0.0:
        return {"geomean": g, "ci_low": g, "ci_high": g, "n": int(x.size)}
    ci = stats.ttest_1samp(logs, 0.0).confidence_interval(confidence_level=level)
    return {"geomean": g, "ci_low": float(np.exp(ci.low)), "ci_high": float(np.exp(ci.high)), "n": int(x.size)}


def target_table(traces: Traces, targets: Sequence[float], baseline: str | None = None,
                 feature_seeds: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """One record per (run, seed, target): the tidy form of the time-to-target results.

    Parameters
    ----------
    traces : {run label: {seed: trace rows}}
    targets : accuracies
    baseline : run label the speed-ups are relative to, or None
    feature_seeds : {seed: random-Fourier random_state}, optional

    Returns
    -------
    list of dict
        Keys ``run, seed, feature_seed, target, reached, time_s, round, speedup, max_accuracy,
        last_round``; ``time_s``/``round`` are None when not reached; ``speedup`` is
        ``time(baseline)/time(run)`` at that seed (None without a baseline, for the baseline
        itself, or when either run misses the target); ``max_accuracy`` over the rows before a
        training failure (None if there are none).
    """
    out = []
    for label, by_seed in traces.items():
        for seed in sorted(by_seed):
            rows = by_seed[seed]
            for t in targets:
                hit = crossing(rows, t)
                sp = None
                if hit is not None and baseline is not None and label != baseline and baseline in traces:
                    rb = traces[baseline].get(seed)
                    hb = crossing(rb, t) if rb is not None else None
                    if hb is not None and hit[0] > 0 and hb[0] > 0:
                        sp = hb[0] / hit[0]
                out.append({
                    "run": label, "seed": int(seed),
                    "feature_seed": None if feature_seeds is None else feature_seeds.get(seed),
                    "target": float(t), "reached": hit is not None,
                    "time_s": None if hit is None else hit[0], "round": None if hit is None else hit[1],
                    "speedup": sp, "max_accuracy": _max_accuracy(rows),
                    "last_round": int(rows[-1]["round"]),
                })
    return out


def _key(t: float) -> str:
    return f"{t:g}"


def summarize(traces: Traces, targets: Sequence[float], baseline: str | None,
              wall_s: Mapping[str, Mapping[int, float]] | None = None, *,
              feature_seeds: Mapping[int, int] | None = None, level: float = LEVEL) -> dict[str, Any]:
    """Summary of a study: strict-JSON-ready (string keys, no NaN/inf), reproducible numbers only.

    Parameters
    ----------
    traces : {run label: {seed: trace rows}}
    targets : accuracies
    baseline : run label the speed-ups are relative to, or None
    wall_s : ignored (host timings belong in ``timing.json``; kept for old callers)
    feature_seeds : {seed: random-Fourier random_state}, optional
    level : confidence level

    Returns
    -------
    dict
        ``targets``, ``baseline``, ``level``, ``statistics`` (how the numbers were computed),
        ``feature_seeds`` and ``runs``: per run label, ``seeds``, ``accuracy_last_round``,
        ``accuracy_max`` (over the rows before a training failure; null without any), ``last_round`` (per
        seed), ``setup_s`` (simulated seconds of the set-up phase, per seed), ``round_s`` (mean simulated seconds per
        round after the set-up, per seed; null without a round), ``energy_j_total`` (only with an energy model),
        ``failed`` (only when some seed's training ended as a recorded failure: seed: ``round``,
        ``reason``; :mod:`fednet.protocol.finite`) and ``per_target``: per target key
        (``"0.95"``), ``reached`` ("k/n"), ``n_reached``, ``time_s`` and ``round`` per seed
        (null when not reached), ``not_reached`` (seed: reason), ``time_s_stats``
        (:func:`log_interval` over the seeds, null unless every seed reached it, with
        ``time_s_stats_reason``), ``time_s_range`` ([min, max] over reaching seeds) and
        ``time_s_spread`` (max/min), ``energy_j`` per seed (joules until the target; only with an energy
        model), and for non-baseline runs ``speedup`` per seed and
        ``speedup_stats``.
    """
    del wall_s
    table = target_table(traces, targets, baseline, feature_seeds)
    out: dict[str, Any] = {
        "targets": [float(t) for t in targets], "baseline": baseline, "level": level,
        "statistics": ("time: geometric mean over seeds, Student-t interval of log(time); speed-up: "
                       "time(baseline)/time(run) paired by seed, geometric mean, Student-t interval of the "
                       "log-ratios (scipy.stats.ttest_1samp); not-reached seeds are counted, never averaged"),
        "feature_seeds": None if feature_seeds is None else {str(s): int(v) for s, v in sorted(feature_seeds.items())},
        "runs": {},
    }
    for label, by_seed in traces.items():
        seeds = sorted(by_seed)
        run: dict[str, Any] = {
            "seeds": [int(s) for s in seeds],
            "accuracy_last_round": {str(s): _last_accuracy(by_seed[s]) for s in seeds},
            "accuracy_max": {str(s): _max_accuracy(by_seed[s]) for s in seeds},
            "last_round": {str(s): int(by_seed[s][-1]["round"]) for s in seeds},
            "setup_s": {str(s): _setup_seconds(by_seed[s]) for s in seeds},
            "round_s": {str(s): _round_seconds(by_seed[s]) for s in seeds},
            "per_target": {},
        }
        failures = {s: training_failure(by_seed[s]) for s in seeds}
        failures = {s: f for s, f in failures.items() if f is not None}
        if failures:            # only then: the summaries of runs that never fail keep their bytes
            run["failed"] = {str(s): {"round": r, "reason": why} for s, (r, why) in failures.items()}
        energy = all(any("energy_j" in r for r in by_seed[s]) for s in seeds) and bool(seeds)
        if energy:              # the devices' energy model (issue 28, item 4): joules per seed, in all
            run["energy_j_total"] = {str(s): _energy_through(by_seed[s], None) for s in seeds}
        decoding = _decode_errors(by_seed)
        if decoding is not None:  # full mode's observer measured the decoding (issue 31, item 6)
            run["decode_error"] = decoding
        for t in targets:
            recs = [r for r in table if r["run"] == label and r["target"] == float(t)]
            reached = [r for r in recs if r["reached"]]
            times = [r["time_s"] for r in reached if r["time_s"] > 0]
            entry: dict[str, Any] = {
                "reached": f"{len(reached)}/{len(recs)}", "n_reached": len(reached),
                "time_s": {str(r["seed"]): r["time_s"] for r in recs},
                "round": {str(r["seed"]): r["round"] for r in recs},
                "not_reached": {str(r["seed"]): _not_reached(r, t, failures.get(r["seed"]))
                                for r in recs if not r["reached"]},
            }
            if len(reached) == len(recs) and len(times) == len(recs):
                entry["time_s_stats"], entry["time_s_stats_reason"] = log_interval(times, level), None
            else:
                entry["time_s_stats"] = None
                entry["time_s_stats_reason"] = (f"reached by {len(reached)} of {len(recs)} seeds"
                                                if len(reached) < len(recs) else
                                                "reached at simulated time 0 at some seed (no log-scale interval)")
            if energy:                       # joules the devices spent until the target was reached
                entry["energy_j"] = {str(r["seed"]): _energy_through(by_seed[r["seed"]], r["round"]) if r["reached"]
                                     else None for r in recs}
            entry["time_s_range"] = [min(times), max(times)] if times else None
            entry["time_s_spread"] = max(times) / min(times) if times else None
            if baseline is not None and label != baseline and baseline in traces:
                ratios = {str(r["seed"]): r["speedup"] for r in recs}
                ok = [v for v in ratios.values() if v is not None]
                entry["speedup"] = ratios
                if ok and len(ok) == len(ratios):
                    entry["speedup_stats"], entry["speedup_stats_reason"] = log_interval(ok, level), None
                else:
                    entry["speedup_stats"] = None
                    entry["speedup_stats_reason"] = f"both runs reached {t:g} at {len(ok)} of {len(ratios)} seeds"
            run["per_target"][_key(t)] = entry
        out["runs"][label] = run
    return out


def _energy_through(rows: Sequence[Mapping[str, Any]], last_round: int | None) -> float:
    """The devices' joules of ``rows`` up to and including round ``last_round`` (all rows for None)."""
    return float(sum(float(r.get("energy_j", 0.0)) for r in rows
                     if last_round is None or int(r["round"]) <= int(last_round)))


def _setup_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    """Simulated seconds of the set-up phase: the time of the round-0 row (0.0 without one)."""
    for r in rows:
        if int(r.get("round", -1)) == 0:
            return float(r["time_s"])
    return 0.0


def _round_seconds(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Mean simulated seconds per training round after the set-up: ``(time of the last row - set-up) / last
    round`` over the rows of finite time (None without such a round after the set-up: a run whose first round
    failed with a non-finite clock has no mean)."""
    timed = [r for r in rows if math.isfinite(float(r["time_s"]))]
    last = int(timed[-1]["round"]) if timed else 0
    if last <= 0:
        return None
    return (float(timed[-1]["time_s"]) - _setup_seconds(timed)) / last


def _decode_errors(by_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any] | None:
    """Per seed, the largest ``decode_error`` the observer measured and its stated ``decode_bound`` (None when no
    row has them: timing mode, or a protocol without an observer); ``exceeded``: the seeds where it passed it."""
    out: dict[str, Any] = {"max": {}, "bound": {}}
    for s in sorted(by_seed):
        pairs = [(r["decode_error"], r.get("decode_bound")) for r in by_seed[s]
                 if isinstance(r.get("decode_error"), (int, float)) and r["decode_error"] == r["decode_error"]]
        if pairs:
            out["max"][str(s)] = max(float(e) for e, _ in pairs)
            bounds = [float(b) for _, b in pairs if isinstance(b, (int, float)) and b == b]
            out["bound"][str(s)] = max(bounds) if bounds else None
    if not out["max"]:
        return None
    out["exceeded"] = [s for s, e in out["max"].items() if out["bound"][s] is not None and e > out["bound"][s]]
    return out


def _not_reached(rec: Mapping[str, Any], t: float, failure: tuple[int, str] | None) -> str:
    """Why a (run, seed) did not reach target ``t``."""
    best = "no finite accuracy" if rec["max_accuracy"] is None else f"max test accuracy {rec['max_accuracy']:.4f}"
    if failure is not None:
        return f"training failed at round {failure[0]} ({failure[1]}); before it {best} < {t:g}"
    return f"{best} < {t:g} in {rec['last_round']} rounds"


def dumps_strict(obj: Any) -> str:
    """JSON text of ``obj``, refusing NaN and infinities (``ValueError``); stable and newline-terminated."""
    return json.dumps(obj, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


# -- text --------------------------------------------------------------------------------------

def _time_unit(values: Iterable[float | None]) -> tuple[float, str]:
    vals = [v for v in values if v is not None]
    top = max(vals, default=0.0)
    return (3600.0, "h") if top >= 3 * 3600 else (1.0, "s")


def _num(v: float, scale: float = 1.0) -> str:
    x = v / scale
    return f"{x:.3g}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


#: Mark of a zero-width interval (every seed gave the same value), explained under the table.
SAME = "*"

#: Widest line of the text tables (:func:`format_summary`): wider tables are folded into blocks.
WIDTH = 120


def _interval(st: Mapping[str, Any] | None, centre: str, scale: float = 1.0) -> str:
    if st is not None and st.get(centre) is None and st.get("mean") is not None:
        centre = "mean"  # a summary.json written before the log-scale statistics
    if st is None or st.get(centre) is None:
        return "-"
    s = _num(st[centre], scale)
    if st.get("ci_low") is not None:
        if st["ci_low"] == st["ci_high"]:   # not a precise estimate: the seeds agree exactly
            return s + " " + SAME
        s += f" [{_num(st['ci_low'], scale)}, {_num(st['ci_high'], scale)}]"
    return s


def _table(lines: list[list[str]], width: int | None = None) -> str:
    """Columns padded to their widest cell; a header cell may hold two lines (``"a\nb"``).  With ``width``, a
    table wider than it is folded into blocks, each repeating the first column, separated by a blank line."""
    heads = [c.split("\n") for c in lines[0]]
    depth = max(len(h) for h in heads)
    heads = [h + [""] * (depth - len(h)) for h in heads]
    widths = [max([len(x) for x in heads[i]] + [len(r[i]) for r in lines[1:]]) for i in range(len(heads))]
    blocks, cur = [], [0]
    for i in range(1, len(widths)):
        if width is not None and len(cur) > 1 and sum(widths[j] + 2 for j in cur) + widths[i] > width:
            blocks.append(cur)
            cur = [0]
        cur.append(i)
    blocks.append(cur)
    out = []
    for cols in blocks:
        text = ["  ".join(heads[i][k].ljust(widths[i]) for i in cols).rstrip() for k in range(depth)]
        text.append("  ".join("-" * widths[i] for i in cols))
        text += ["  ".join(r[i].ljust(widths[i]) for i in cols).rstrip() for r in lines[1:]]
        out.append("\n".join(text))
    return "\n\n".join(out)


def _wrap(text: str, width: int = WIDTH) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False))


def _geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def last_accuracy_cell(run: Mapping[str, Any]) -> str:
    """A run's test accuracy at its last round, the mean over its seeds (``"-"`` without a finite one)."""
    accs = [a for a in run.get("accuracy_last_round", run.get("final_accuracy", {})).values() if a is not None]
    return f"{np.mean(accs):.4f}" if accs else "-"


def time_cell(entry: Mapping[str, Any], scale: float = 1.0) -> str:
    """One run's time to one target (an entry of ``summary.json``'s ``per_target``), in units of ``scale`` seconds.

    The geometric mean over the seeds with its interval when every seed reached the target (``*``: zero width);
    the reaching seeds' geometric mean followed by ``(k/n)`` when only some did; ``not reached (0/n)`` when none did.
    """
    n_reached = entry.get("n_reached", sum(v is not None for v in entry["time_s"].values()))
    n = len(entry["time_s"])
    if n_reached == 0:
        return f"not reached (0/{n})"
    if entry.get("time_s_stats") is not None:
        return _interval(entry["time_s_stats"], "geomean", scale)
    got = [v for v in entry["time_s"].values() if v is not None and v > 0]
    part = _num(_geomean(got), scale) if got else "-"
    return f"{part} ({n_reached}/{n})"


def energy_cell(entry: Mapping[str, Any]) -> str:
    """The devices' mean joules until one target over the seeds that reached it (``(k/n)`` when not all did)."""
    n = len(entry["time_s"])
    joules = [v for v in (entry.get("energy_j") or {}).values() if v is not None]
    cell = _num(float(np.mean(joules))) if joules else "-"
    return cell if len(joules) == n or not joules else f"{cell} ({len(joules)}/{n})"


def speedup_cell(entry: Mapping[str, Any], baseline: bool) -> str:
    """One run's paired speed-up over the baseline at one target: geometric mean [interval], or ``(k/n)``."""
    if baseline:
        return "1 (baseline)"
    if "speedup" not in entry:
        return "-"
    if entry.get("speedup_stats") is not None:
        return _interval(entry["speedup_stats"], "geomean")
    ok = [v for v in entry["speedup"].values() if v is not None]
    return f"{_num(_geomean(ok))} ({len(ok)}/{len(entry['speedup'])})" if ok else f"- (0/{len(entry['speedup'])})"


def summary_note(summary: Mapping[str, Any], marked: bool, setup: str = "set-up included") -> str:
    """The line under a summary table saying how its numbers were computed (``marked``: a ``*`` cell is shown)."""
    level = summary.get("level", LEVEL)
    n_seeds = max((len(r["seeds"]) for r in summary["runs"].values()), default=0)
    return (f"times: geometric mean over seeds [{level:.0%} interval, log scale], {setup}; speed-up: "
            f"time(baseline) / time(run), paired by seed, geometric mean [{level:.0%} interval]; (k/n): reached at k "
            f"of n seeds; n = {n_seeds} seed{'s' if n_seeds != 1 else ''}"
            + ("; one seed: no intervals" if n_seeds == 1 else "")
            + (f"; {SAME}: zero-width interval (every seed gave the same value)" if marked else ""))


def format_summary(summary: Mapping[str, Any]) -> str:
    """A plain-text table: per run and target, time (geometric mean [interval]) and speed-up.

    One unit per column (named in the header); "not reached (k/n)" where a seed missed a target;
    a run that reached a target at only some seeds shows the reaching seeds' geometric mean
    followed by "(k/n)".  With a set-up phase, the mean set-up time and the mean time per round after it
    are columns of their own (a one-off set-up can dominate the time to a target of a short study).  With an
    energy model, the mean joules until each target stand beside its time.  An interval of zero width (every seed
    gave the same value) is shown as the value marked ``*``; with one seed there are no intervals (the note says
    so).  Lines are at most :data:`WIDTH` characters: a wider table is folded into blocks of columns.
    """
    targets = summary["targets"]
    runs = summary["runs"]
    header = ["run", "test acc, last\nround (mean)"]
    setups = {label: [v for v in run.get("setup_s", {}).values() if v is not None] for label, run in runs.items()}
    rounds = {label: [v for v in run.get("round_s", {}).values() if v is not None] for label, run in runs.items()}
    show_setup = any(v > 0 for vals in setups.values() for v in vals)
    if show_setup:          # a one-off set-up that dominates a short study should not hide in the time to target
        setup_scale, setup_unit = _time_unit(v for vals in setups.values() for v in vals)
        header.append(f"set-up [{setup_unit}]\n(mean)")
        round_scale, round_unit = _time_unit(v for vals in rounds.values() for v in vals)
        header.append(f"per round [{round_unit}]\n(mean, after set-up)")
    energy = any("energy_j" in e for r in runs.values() for e in r["per_target"].values())
    units = {}
    for t in targets:
        k = _key(t)
        units[k] = _time_unit(v for r in runs.values() for v in r["per_target"][k]["time_s"].values())
        header += [f"time to {t:.0%} [{units[k][1]}]"]
        if energy:
            header += [f"energy to {t:.0%}\n[J] (mean)"]
        header += [f"speed-up\n@{t:.0%} [x]"]
    lines = [header]
    marked = False
    for label, run in runs.items():
        row = [label, last_accuracy_cell(run)]
        if show_setup:
            row.append(_num(float(np.mean(setups[label])), setup_scale) if setups[label] else "-")
            row.append(_num(float(np.mean(rounds[label])), round_scale) if rounds[label] else "-")
        for t in targets:
            e = run["per_target"][_key(t)]
            row.append(time_cell(e, units[_key(t)][0]))
            if energy:
                row.append(energy_cell(e))
            row.append(speedup_cell(e, label == summary.get("baseline")))
        marked = marked or any(c.endswith(" " + SAME) for c in row)
        lines.append(row)
    note = summary_note(summary, marked)
    failed = [f"{label} seed {seed}: training failed at round {f['round']}: {f['reason']}"
              for label, run in runs.items() for seed, f in run.get("failed", {}).items()]
    return _table(lines, WIDTH) + "\n" + _wrap(note) + "".join("\n" + _wrap(line) for line in failed)


def format_per_seed(summary: Mapping[str, Any]) -> str:
    """Per-seed crossings: for each run and target, the round and time at each seed and their spread.

    With ``feature_seed = "per_seed"`` the seeds differ in their random-Fourier draw, so this shows
    how much the time to each target moves with the feature draw (``spread`` = max / min time).
    """
    fs = summary.get("feature_seeds") or {}
    seeds = sorted({int(s) for r in summary["runs"].values() for s in r["seeds"]})
    header = ["run", "target"] + [f"seed {s}" + (f" (RFF {fs[str(s)]})" if str(s) in fs else "") for s in seeds]
    header.append("spread [max/min]")
    lines = [header]
    for label, run in summary["runs"].items():
        for t in summary["targets"]:
            e = run["per_target"][_key(t)]
            row = [label, f"{t:.0%}"]
            for s in seeds:
                ts, rd = e["time_s"].get(str(s)), e["round"].get(str(s))
                row.append("not reached" if ts is None else f"round {rd}, {_num(ts)} s")
            row.append("-" if e.get("time_s_spread") is None else f"{e['time_s_spread']:.2f}")
            lines.append(row)
    return _table(lines)


# -- tidy tables and reading results back ---------------------------------------------------------

#: The trace columns that list device indices (space-separated in ``trace.csv``, lists of ints in the tables).
INDEX_COLUMNS = ("used", "dropped")


def device_indices(value: Any) -> list[int]:
    """The device indices of a ``used``/``dropped`` cell: ``"0 3 7"`` (as in ``trace.csv``), a list, or empty.

    Raises
    ------
    ValueError
        If ``value`` is not a space-separated list of integers (names it).
    """
    if isinstance(value, (list, tuple, np.ndarray)):
        return [int(v) for v in value]
    if value is None or (isinstance(value, float) and value != value):
        return []
    try:
        return [int(v) for v in str(value).split()]
    except ValueError:
        raise ValueError(f"a used/dropped cell must list device indices, got {value!r}") from None


def rounds_frame(traces: Traces) -> "pd.DataFrame":
    """One row per (run, seed, round): the trace rows with the run label in column ``run``.

    ``used`` and ``dropped`` (:data:`INDEX_COLUMNS`) are lists of device indices (ints, sorted), not the
    space-separated text of ``trace.csv``.
    """
    import pandas as pd

    rows = [{"run": label, **{k: device_indices(v) if k in INDEX_COLUMNS else v
                              for k, v in r.items() if k != "protocol"}}
            for label, by_seed in traces.items() for seed in sorted(by_seed) for r in by_seed[seed]]
    return pd.DataFrame(rows)


def targets_frame(traces: Traces, targets: Sequence[float], baseline: str | None = None,
                  feature_seeds: Mapping[int, int] | None = None) -> "pd.DataFrame":
    """One row per (run, seed, target) (:func:`target_table`); unreached times are NaN."""
    import pandas as pd

    cols = ["run", "seed", "feature_seed", "target", "reached", "time_s", "round", "speedup", "max_accuracy",
            "last_round"]
    df = pd.DataFrame(target_table(traces, targets, baseline, feature_seeds), columns=cols)
    df["round"] = df["round"].astype("Int64")
    for c in ("time_s", "speedup"):
        df[c] = df[c].astype(float)
    return df


def summary_frame(summary: Mapping[str, Any]) -> "pd.DataFrame":
    """``summary.json`` as one tidy row per (run, target), for papers and notebooks.

    Columns: ``run``, ``target``, ``seeds`` (how many), ``reached`` (how many reached it), ``accuracy_last``
    (mean over seeds), ``setup_s`` (mean simulated seconds of the set-up phase), ``time_s``, ``time_s_low``,
    ``time_s_high`` (geometric mean over the seeds and its interval, simulated seconds; NaN unless every seed
    reached the target), ``speedup``, ``speedup_low``, ``speedup_high`` (paired against the baseline; NaN for the
    baseline and where not every seed of both reached it) and ``note`` (why an interval is missing: one seed, or
    not every seed reached the target; or that it has zero width: every seed gave the same value).  With a
    ``round_s`` in the summary (written since it has one), ``round_s`` (mean simulated seconds per round after the
    set-up) follows ``setup_s``.  With an energy model (``energy_j`` in the summary's targets), ``energy_j`` (mean
    joules the devices spent until the target, NaN unless every seed reached it) and ``energy_j_total`` (mean
    joules of the whole run) follow ``time_s_high``.
    """
    import pandas as pd

    rows = []
    nan = float("nan")
    has_round = any("round_s" in run for run in summary["runs"].values())
    has_energy = any("energy_j" in e for run in summary["runs"].values() for e in run["per_target"].values())
    for label, run in summary["runs"].items():
        accs = [a for a in run.get("accuracy_last_round", {}).values() if a is not None]
        setup = [v for v in run.get("setup_s", {}).values() if v is not None]
        per_round = [v for v in run.get("round_s", {}).values() if v is not None]
        total = [v for v in run.get("energy_j_total", {}).values() if v is not None]
        for t in summary["targets"]:
            e = run["per_target"][_key(t)]
            st, sp = e.get("time_s_stats") or {}, e.get("speedup_stats") or {}
            note = e.get("time_s_stats_reason") or e.get("speedup_stats_reason") or ""
            if not note and len(run["seeds"]) == 1:
                note = "n = 1: one seed, no interval"
            for stat in (st, sp):
                if stat and stat.get("ci_low") is not None and stat["ci_low"] == stat["ci_high"]:
                    note = note or "zero-width interval: every seed gave the same value"
            row = {
                "run": label, "target": float(t), "seeds": len(run["seeds"]),
                "reached": int(e.get("n_reached", sum(v is not None for v in e["time_s"].values()))),
                "accuracy_last": float(np.mean(accs)) if accs else nan,
                "setup_s": float(np.mean(setup)) if setup else nan,
            }
            if has_round:
                row["round_s"] = float(np.mean(per_round)) if per_round else nan
            row.update({
                "time_s": st.get("geomean", nan) if st else nan,
                "time_s_low": st.get("ci_low", nan) if st else nan,
                "time_s_high": st.get("ci_high", nan) if st else nan,
            })
            if has_energy:
                joules = list((e.get("energy_j") or {}).values())
                row["energy_j"] = (float(np.mean(joules)) if joules and all(v is not None for v in joules)
                                   else nan)
                row["energy_j_total"] = float(np.mean(total)) if total else nan
            row.update({
                "speedup": sp.get("geomean", nan) if sp else nan,
                "speedup_low": sp.get("ci_low", nan) if sp else nan,
                "speedup_high": sp.get("ci_high", nan) if sp else nan,
                "note": note,
            })
            rows.append(row)
    floats = ["time_s", "time_s_low", "time_s_high", "speedup", "speedup_low", "speedup_high", "setup_s"]
    floats += (["round_s"] if has_round else []) + (["energy_j", "energy_j_total"] if has_energy else [])
    return pd.DataFrame(rows).astype(dict.fromkeys(floats, float))


#: The formats ``fednet summarize --format`` writes (:func:`format_frame`).
FORMATS = ("text", "markdown", "latex", "csv")


def format_frame(frame: "pd.DataFrame", fmt: str) -> str:
    """A summary frame (:func:`summary_frame`) as Markdown (a GitHub table), LaTeX (booktabs, via pandas) or CSV.

    Raises
    ------
    ValueError
        For a format other than ``markdown``, ``latex`` or ``csv``.
    """
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "latex":
        style = frame.style.hide(axis="index").format(precision=4, na_rep="--", escape="latex")
        return style.format_index(escape="latex", axis=1).to_latex(hrules=True)
    if fmt == "markdown":
        def cell(v: Any) -> str:
            if isinstance(v, float):
                return "" if v != v else f"{v:.4g}"
            return str(v).replace("|", "\\|")
        lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
        return "\n".join(lines) + "\n"
    raise ValueError(f"format must be one of {FORMATS[1:]} here, got {fmt!r}")


@dataclass
class Results:
    """A study's results as tidy tables (:func:`load_results`, :meth:`StudyResult.frames`).

    Attributes
    ----------
    rounds : pandas.DataFrame
        One row per (run, seed, round): ``run`` (label), ``seed``, ``round``, ``time_s``
        (simulated seconds), ``accuracy``, ``loss``, ``bits_up``, ``bits_down``, ``device_macs``,
        ``server_macs``, ``retransmissions``, ``used`` and ``dropped`` (lists of device indices, ints:
        :func:`device_indices` of ``trace.csv``'s space-separated text) and protocol-specific columns.
    targets : pandas.DataFrame
        One row per (run, seed, target): ``reached``, ``time_s``, ``round``, ``speedup``, ...
    summary : dict
        ``summary.json``.
    study : dict
        The validated study as run (``study.json``), or empty.
    """

    rounds: "pd.DataFrame"
    targets: "pd.DataFrame"
    summary: dict[str, Any]
    study: dict[str, Any] = field(default_factory=dict)

    def summary_table(self) -> str:
        """:func:`format_summary` of :attr:`summary`."""
        return format_summary(self.summary)

    def summary_frame(self) -> "pd.DataFrame":
        """:func:`summary_frame` of :attr:`summary`: one tidy row per (run, target)."""
        return summary_frame(self.summary)

    def traces(self) -> dict[str, dict[int, list[dict[str, Any]]]]:
        """``{run label: {seed: rows}}`` rebuilt from :attr:`rounds` (for plots); ``used``/``dropped`` are lists of
        ints, as in :attr:`rounds`."""
        out: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for label in self.rounds["run"].drop_duplicates():
            sub = self.rounds[self.rounds["run"] == label]
            out[label] = {int(s): g.drop(columns="run").to_dict("records") for s, g in sub.groupby("seed", sort=True)}
        return out


def load_results(out_dir: str | Path) -> Results:
    """Read a study's output directory back as tidy tables.

    Parameters
    ----------
    out_dir : path-like
        A directory written by :func:`fednet.study.runner.run_study` (``summary.json``,
        ``study.json``, ``<run>/trace.csv``).

    Returns
    -------
    Results

    Raises
    ------
    FileNotFoundError
        If ``summary.json`` or a run's ``trace.csv`` is missing (names the file).
    """
    import pandas as pd

    out_dir = Path(out_dir)
    summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    study_path = out_dir / "study.json"
    study = json.loads(study_path.read_text(encoding="utf-8")) if study_path.exists() else {}
    frames = []
    for label, run in summary["runs"].items():
        csv_path = out_dir / run.get("trace_csv", "")
        if not csv_path.is_file():
            raise FileNotFoundError(f"{csv_path}: trace of run {label!r} is missing")
        df = pd.read_csv(csv_path, dtype=dict.fromkeys(TEXT_COLUMNS, str))
        for col in TEXT_COLUMNS:
            if col in df:
                df[col] = df[col].fillna("").astype(object)
        for col in INDEX_COLUMNS:
            if col in df:
                df[col] = [device_indices(v) for v in df[col]]
        frames.append(df.rename(columns={"protocol": "run"}).assign(run=label))
    rounds = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    res = Results(rounds, pd.DataFrame(), summary, study)
    fs = summary.get("feature_seeds")
    res.targets = targets_frame(res.traces(), summary["targets"], summary.get("baseline"),
                                None if fs is None else {int(k): v for k, v in fs.items()})
    return res
