"""Accuracy at fixed simulated times and time to fixed accuracies for the FedVS studies (Figs. 2-4).

Usage: ``python studies/fedvs_report.py OUT_DIR [OUT_DIR ...] [--times 5 10 20] [--accuracies 0.5 0.6 0.7]
[--from-training]``, where each ``OUT_DIR`` is a study's output folder (``<run>/trace.csv`` per run; several
folders, e.g. one per seed, are pooled).  Prints a Markdown table.

* Accuracy at time t: that of the last trace row (round or asynchronous update) at or before t.  Cell:
  the arithmetic mean over the seeds and a 95 % interval that stays inside (0, 1): a t-interval on the
  logits ``log(a / (1 - a))`` of the seeds' accuracies (accuracies clipped to [1e-4, 1 - 1e-4]), mapped
  back with the logistic function (one seed: the value alone; equal values: that value).  A run that
  ended before t counts as missing (the count is shown).
* Time to an accuracy: the first row reaching it; geometric mean over the seeds that reach it with a 95 %
  t-interval on the log times, and the count of seeds.
* ``s/row``: simulated seconds per trace row after row 0 (a round; for VAFL an asynchronous update), mean
  over the seeds.
* ``--from-training``: times are measured from the end of each run's set-up phase (trace row 0: FedVS's
  data sharing, VAFL's initial embeddings), instead of from 0.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
from scipy import stats

#: Accuracies are clipped to [EPS, 1 - EPS] before the logit.
EPS = 1e-4


def load(out_dirs: list[Path], from_training: bool = False) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """``{run label: {seed: [(time_s, accuracy), ...]}}`` from every ``<run>/trace.csv`` of the folders."""
    runs: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for path in sorted(p for d in out_dirs for p in d.glob("*/trace.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                runs.setdefault(row["protocol"], {}).setdefault(int(row["seed"]), []).append(
                    (float(row["time_s"]), float(row["accuracy"])))
    if from_training:
        runs = {k: {s: [(t - rows[0][0], a) for t, a in rows] for s, rows in v.items()} for k, v in runs.items()}
    return runs


def acc_at(rows: list[tuple[float, float]], t: float) -> float | None:
    """Accuracy of the last row at or before ``t`` (None when the run ended before ``t``; 0.1 before row 0)."""
    if rows[-1][0] < t:
        return None
    before = [a for s, a in rows if s <= t]
    return before[-1] if before else None


def logit_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """95 % t-interval of the mean logit, mapped back to (0, 1) (module docstring).

    Raises
    ------
    ValueError
        For fewer than two values or a value outside [0, 1].
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        raise ValueError(f"an interval needs at least two values, got {v.size}")
    if np.any((v < 0) | (v > 1)):
        raise ValueError(f"accuracies must lie in [0, 1], got {values}")
    z = np.log(np.clip(v, EPS, 1 - EPS) / (1 - np.clip(v, EPS, 1 - EPS)))
    h = stats.t.ppf(0.5 + level / 2, v.size - 1) * z.std(ddof=1) / math.sqrt(v.size)
    expit = lambda x: 1.0 / (1.0 + math.exp(-x))                                      # noqa: E731
    return expit(z.mean() - h), expit(z.mean() + h)


def acc_cell(values: list[float]) -> str:
    """``mean [lo, hi]`` with :func:`logit_interval`, or the single value, or ``-``."""
    if not values:
        return "-"
    m = float(np.mean(values))
    if len(values) == 1 or np.ptp(values) == 0:
        return f"{m:.3f}"
    lo, hi = logit_interval(values)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def time_cell(hits: list[float], n: int) -> str:
    """Geometric mean [95 % log-t interval] (count) of the times to an accuracy, or ``not reached``."""
    if not hits:
        return "not reached"
    lg = np.log(np.maximum(hits, 1e-9))
    g = math.exp(lg.mean())
    if len(hits) == 1 or np.ptp(lg) == 0:
        return f"{g:.1f} ({len(hits)}/{n})"
    h = stats.t.ppf(0.975, len(hits) - 1) * lg.std(ddof=1) / math.sqrt(len(hits))
    return f"{g:.1f} [{math.exp(lg.mean() - h):.1f}, {math.exp(lg.mean() + h):.1f}] ({len(hits)}/{n})"


def table(runs: dict[str, dict[int, list[tuple[float, float]]]], times: list[float],
          accuracies: list[float]) -> list[list[str]]:
    """Header and one row per run (see the module docstring for the cells)."""
    head = ["run", "seeds", "horizon [s]", "s/row"] + [f"acc@{t:g}s" for t in times] + [f"t->{a:.0%} [s]" for a in accuracies]
    lines = [head]
    for label, by_seed in runs.items():
        per_row = [(r[-1][0] - r[0][0]) / max(1, len(r) - 1) for r in by_seed.values()]
        cells = [label, str(len(by_seed)), f"{min(r[-1][0] for r in by_seed.values()):.0f}", f"{np.mean(per_row):.3f}"]
        for t in times:
            vals = [v for v in (acc_at(r, t) for r in by_seed.values()) if v is not None]
            cells.append(acc_cell(vals) + ("" if len(vals) == len(by_seed) else f" ({len(vals)}/{len(by_seed)})"))
        for a in accuracies:
            hits = [next((s for s, acc in r if acc >= a), None) for r in by_seed.values()]
            cells.append(time_cell([h for h in hits if h is not None], len(by_seed)))
        lines.append(cells)
    return lines


def main(argv: list[str] | None = None) -> None:
    """Command line: print a Markdown table of accuracy at ``--times`` and time to ``--accuracies``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path, nargs="+")
    ap.add_argument("--times", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    ap.add_argument("--accuracies", type=float, nargs="+", default=[0.5, 0.6, 0.7])
    ap.add_argument("--from-training", action="store_true")
    args = ap.parse_args(argv)
    lines = table(load(args.out_dir, args.from_training), args.times, args.accuracies)
    for i, row in enumerate(lines):
        print("| " + " | ".join(row) + " |")
        if i == 0:
            print("|" + "---|" * len(row))


if __name__ == "__main__":
    main()
