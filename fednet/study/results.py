"""Results of a study: time to target accuracy, paired speed-ups with confidence intervals.

The time to a target is the simulated time (seconds) at the end of the first round whose test
accuracy reaches the target; ``None`` when the run never reaches it. Speed-ups are paired: for
each seed, ``time(baseline) / time(run)`` (both runs faced the same keyed stragglers and losses),
then averaged over seeds with a Student-t 95 % confidence interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

__all__ = ["time_to_target", "mean_ci", "summarize", "format_summary"]


def time_to_target(rows: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Simulated seconds until the test accuracy first reaches ``target`` (None if never)."""
    for row in rows:
        if row["accuracy"] >= target:
            return float(row["time_s"])
    return None


def mean_ci(values: Iterable[float], level: float = 0.95) -> dict[str, Any]:
    """Mean and Student-t confidence interval of ``values``.

    Returns
    -------
    dict
        ``mean``, ``ci_low``, ``ci_high`` (equal to the mean for a single value), ``n``.
    """
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    mean = float(x.mean())
    if x.size == 1:
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "n": 1}
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": int(x.size)}


def summarize(traces: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]], targets: Sequence[float],
              baseline: str | None, wall_s: Mapping[str, Mapping[int, float]] | None = None) -> dict[str, Any]:
    """Summary of a study.

    Parameters
    ----------
    traces : {run label: {seed: trace rows}}
    targets : accuracies
    baseline : run label the speed-ups are relative to, or None
    wall_s : {run label: {seed: host seconds}}, optional

    Returns
    -------
    dict
        ``{"targets": [...], "baseline": ..., "runs": {label: {...}}}`` where each run holds,
        per target, ``time_s`` per seed and across seeds (mean, 95 % CI), and ``speedup`` per
        seed and across seeds.
    """
    out: dict[str, Any] = {"targets": list(targets), "baseline": baseline, "runs": {}}
    for label, by_seed in traces.items():
        run: dict[str, Any] = {"seeds": sorted(by_seed), "final_accuracy": {}, "max_accuracy": {},
                               "rounds": {}, "per_target": {}}
        for seed, rows in by_seed.items():
            run["final_accuracy"][seed] = float(rows[-1]["accuracy"])
            run["max_accuracy"][seed] = float(max(r["accuracy"] for r in rows))
            run["rounds"][seed] = int(rows[-1]["round"])
        if wall_s and label in wall_s:
            run["wall_s"] = dict(wall_s[label])
        for t in targets:
            times = {seed: time_to_target(rows, t) for seed, rows in by_seed.items()}
            reached = [v for v in times.values() if v is not None]
            entry: dict[str, Any] = {"time_s": times, "reached": f"{len(reached)}/{len(times)}",
                                     "time_s_stats": mean_ci(reached) if len(reached) == len(times) else None}
            if baseline is not None and label != baseline and baseline in traces:
                ratios = {}
                for seed, v in times.items():
                    rows_b = traces[baseline].get(seed)
                    tb = time_to_target(rows_b, t) if rows_b is not None else None
                    ratios[seed] = None if (tb is None or v is None or v == 0) else tb / v
                ok = [r for r in ratios.values() if r is not None]
                entry["speedup"] = ratios
                entry["speedup_stats"] = mean_ci(ok) if ok and len(ok) == len(ratios) else None
            run["per_target"][f"{t:g}"] = entry
        out["runs"][label] = run
    return out


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    return f"{s:.1f} s"


def format_summary(summary: Mapping[str, Any]) -> str:
    """A plain-text table: per run and target, mean time (95 % CI) and speed-up vs the baseline."""
    targets = summary["targets"]
    header = ["run", "final acc"]
    for t in targets:
        header += [f"time to {t:.0%}", f"speed-up @{t:.0%}"]
    lines = [header]
    for label, run in summary["runs"].items():
        accs = list(run["final_accuracy"].values())
        row = [label, f"{np.mean(accs):.4f}"]
        for t in targets:
            e = run["per_target"][f"{t:g}"]
            st = e["time_s_stats"]
            if st is None:
                row.append(f"not reached ({e['reached']})")
            elif st["n"] > 1:
                row.append(f"{_fmt_time(st['mean'])} [{_fmt_time(st['ci_low'])}, {_fmt_time(st['ci_high'])}]")
            else:
                row.append(_fmt_time(st["mean"]))
            sp = e.get("speedup_stats")
            if label == summary.get("baseline"):
                row.append("1 (baseline)")
            elif sp is None:
                row.append("-")
            elif sp["n"] > 1:
                row.append(f"{sp['mean']:.2f} [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]")
            else:
                row.append(f"{sp['mean']:.2f}")
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)
