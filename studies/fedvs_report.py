"""Accuracy at fixed simulated times and time to fixed accuracies for the FedVS studies (Figs. 2-4).

Usage: ``python studies/fedvs_report.py OUT_DIR [OUT_DIR ...] [--times 25 50 100] [--accuracies 0.5 0.6 0.7]``,
where each ``OUT_DIR`` is a study's output folder (``<run>/trace.csv`` per run; several folders, e.g. one per
seed, are pooled).  Accuracy at time t is that of the
last trace row (round or asynchronous update) at or before t; mean and a 95 % t-interval over the seeds
(one seed: the value alone).  Time to an accuracy is the first row reaching it (geometric mean over the
seeds that reach it, with the count).
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
from scipy import stats


def load(out_dirs: list[Path]) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """``{run label: {seed: [(time_s, accuracy), ...]}}`` from every ``<run>/trace.csv`` of the folders."""
    runs: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for path in sorted(p for d in out_dirs for p in d.glob("*/trace.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                runs.setdefault(row["protocol"], {}).setdefault(int(row["seed"]), []).append(
                    (float(row["time_s"]), float(row["accuracy"])))
    return runs


def acc_at(rows: list[tuple[float, float]], t: float) -> float | None:
    """Accuracy of the last row at or before ``t`` (None when the run ended before ``t``)."""
    if rows[-1][0] < t:
        return None
    before = [a for s, a in rows if s <= t]
    return before[-1] if before else None


def mean_ci(values: list[float]) -> str:
    """``mean [lo, hi]`` (95 % t-interval) or the single value."""
    if not values:
        return "-"
    m = float(np.mean(values))
    if len(values) == 1:
        return f"{m:.3f}"
    h = stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"


def main() -> None:
    """Command line: print accuracy at ``--times`` (simulated s) and time to ``--accuracies`` (FedVS, Figs. 2-4)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path, nargs="+")
    ap.add_argument("--times", type=float, nargs="+", default=[25.0, 50.0, 100.0])
    ap.add_argument("--accuracies", type=float, nargs="+", default=[0.5, 0.6, 0.7])
    args = ap.parse_args()
    runs = load(args.out_dir)
    head = ["run", "seeds", "horizon [s]"] + [f"acc@{t:g}s" for t in args.times] + \
        [f"t->{a:.0%} [s]" for a in args.accuracies]
    lines = [head]
    for label, by_seed in runs.items():
        cells = [label, str(len(by_seed)), f"{min(r[-1][0] for r in by_seed.values()):.0f}"]
        for t in args.times:
            vals = [v for v in (acc_at(r, t) for r in by_seed.values()) if v is not None]
            cells.append(mean_ci(vals) + ("" if len(vals) == len(by_seed) else f" ({len(vals)}/{len(by_seed)})"))
        for a in args.accuracies:
            hits = [next((s for s, acc in r if acc >= a), None) for r in by_seed.values()]
            hits = [h for h in hits if h is not None]
            cells.append("not reached" if not hits else
                         f"{math.exp(np.mean(np.log(np.maximum(hits, 1e-9)))):.1f} ({len(hits)}/{len(by_seed)})")
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for row in lines:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
