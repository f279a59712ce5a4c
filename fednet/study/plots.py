"""Accuracy against simulated wall-clock time (the papers' Figs. 4-8), and speed-ups with their intervals.

Drawn with matplotlib's object API (:class:`matplotlib.figure.Figure`, rendered by the Agg
canvas into a file): importing fednet or this module never selects a matplotlib backend, so a
notebook's or a user's backend choice stands.
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = ["plot_accuracy_vs_time", "plot_results", "plot_speedups", "plot_speedup_results", "DPI"]


#: Resolution of raster figures (PNG); PDF and SVG (chosen by the file's extension) are vector graphics.
DPI = 300


def _seconds_unit(longest: float) -> tuple[float, str]:
    """The time unit of the summary table (:func:`fednet.study.results.format_summary`): seconds, or hours for
    studies of three hours or more, so a figure and its table read alike."""
    return (3600.0, "h") if longest >= 3 * 3600 else (1.0, "s")


def _step_mean(curves: list[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """The accuracy of each seed's model at each time of ``grid``, stacked (seeds, grid): that of its last row at or
    before the time; before its first row (the set-up) its first row's (the initial model's), after its last row
    its last (a run that stopped keeps its model)."""
    out = np.empty((len(curves), len(grid)))
    for i, (t, a) in enumerate(curves):
        idx = np.searchsorted(t, grid, side="right") - 1
        out[i] = a[np.clip(idx, 0, None)]
    return out


def plot_accuracy_vs_time(traces: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                          targets: Sequence[float], path: str | Path, *, title: str = "", log_x: bool = False,
                          dpi: int = DPI) -> Path:
    """Plot test accuracy against simulated time: per run the mean over its seeds with their range as a band, each
    seed a thin line.

    Seeds are compared at equal simulated times: each seed's accuracy at a time is that of its last row at or
    before it (its initial model's during its set-up, its last model's after it stopped).  The targets are dashed
    lines labelled at the right.  The time unit is the summary table's (seconds, or hours for long studies).

    Parameters
    ----------
    traces : {run label: {seed: trace rows}}
    targets : accuracies drawn as labelled dashed lines
    path : output file; its extension picks the format (``.png``, ``.pdf``, ``.svg``)
    title : str
        Figure title (the number of seeds is appended).
    log_x : bool
        Logarithmic time axis (set-up phases of very different lengths).
    dpi : int
        Resolution of a PNG (300 by default).

    Returns
    -------
    Path
        ``path``.
    """
    longest = max((rows[-1]["time_s"] for by_seed in traces.values() for rows in by_seed.values()), default=0.0)
    scale, unit = _seconds_unit(longest)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    n_seeds = max((len(by_seed) for by_seed in traces.values()), default=0)
    for i, (label, by_seed) in enumerate(traces.items()):
        color = f"C{i % 10}"
        curves = []
        for rows in (by_seed[s] for s in sorted(by_seed)):
            t = np.array([r["time_s"] for r in rows], dtype=float) / scale
            a = np.array([r["accuracy"] for r in rows], dtype=float)
            ax.plot(t, a, color=color, lw=0.6, alpha=0.35)
            curves.append((t, a))
        if not curves:
            continue
        end = max(t[-1] for t, _ in curves)
        start = min(t[0] for t, _ in curves)
        if log_x:
            lo = max(min((x for t, _ in curves for x in t if x > 0), default=1e-9), 1e-12)
            grid = np.geomspace(lo, max(end, lo * 1.0001), 800)
        else:
            grid = np.linspace(start, end, 800)
        acc = _step_mean(curves, grid)
        ax.plot(grid, acc.mean(axis=0), color=color, lw=1.8,
                label=f"{label} (mean of {len(curves)})" if len(curves) > 1 else label)
        if len(curves) > 1:
            ax.fill_between(grid, acc.min(axis=0), acc.max(axis=0), color=color, alpha=0.15, lw=0)
    for t in targets:
        ax.axhline(t, color="0.5", ls="--", lw=0.8)
        ax.annotate(f"{t:.0%}", xy=(1.0, t), xycoords=("axes fraction", "data"), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7, color="0.4")
    lows = [t for t in targets] + [0.5]
    ax.set_ylim(max(0.0, min(lows) - 0.15), 1.0)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(f"simulated time [{unit}]" + (" (log scale)" if log_x else ""))
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{title} ({n_seeds} seed{'s' if n_seeds != 1 else ''}; band: range over seeds)" if title
                 else f"{n_seeds} seed{'s' if n_seeds != 1 else ''}; band: range over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return Path(path)


def plot_results(out_dir: str | Path, path: str | Path | None = None, *, log_x: bool = False,
                 dpi: int = DPI) -> Path:
    """Redraw ``accuracy_vs_time.png`` of a saved study from its traces (``fednet plot DIR``).

    Parameters
    ----------
    out_dir : path-like
        A study's output directory (:func:`fednet.study.results.load_results`).
    path : path-like, optional
        Output file, PNG, PDF or SVG by its extension (default ``out_dir/accuracy_vs_time.png``).
    log_x, dpi
        As :func:`plot_accuracy_vs_time`.
    """
    from .results import load_results

    res = load_results(out_dir)
    path = Path(out_dir) / "accuracy_vs_time.png" if path is None else Path(path)
    traces = res.traces()
    for label, by_seed in traces.items():             # a damaged trace is refused, not drawn
        for seed, rows in by_seed.items():
            bad = [r["time_s"] for r in rows if not (isinstance(r["time_s"], (int, float))
                                                     and math.isfinite(r["time_s"]) and r["time_s"] >= 0)]
            if bad:
                raise ValueError(f"run {label!r}, seed {seed}: time_s = {bad[0]!r} is not a simulated time "
                                 f"(finite, >= 0 s)")
    return plot_accuracy_vs_time(traces, res.summary["targets"], path, title=res.summary.get("study", ""),
                                 log_x=log_x, dpi=dpi)


def plot_speedups(summary: Mapping[str, Any], path: str | Path, *, title: str = "", log_y: bool = True,
                  dpi: int = DPI) -> Path:
    """Plot each run's speed-up over the baseline per target, with its interval (taken from ``summary.json``).

    The points are the summary's ``speedup_stats`` (:func:`fednet.study.results.summarize`: geometric mean over
    the seeds of the paired ratios ``time(baseline) / time(run)``) and the error bars its Student-t interval of
    the log-ratios; nothing is recomputed.  A run that did not reach a target at every seed (together with the
    baseline) has no point there; a run with one seed has a point without a bar.  The dotted line marks 1 (as fast
    as the baseline).

    Parameters
    ----------
    summary : dict
        ``summary.json`` of a study with a ``baseline``.
    path : output file; its extension picks the format (``.png``, ``.pdf``, ``.svg``)
    title : str
        Figure title.
    log_y : bool
        Logarithmic speed-up axis (default: ratios).
    dpi : int
        Resolution of a PNG (300 by default).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        If the summary has no baseline, or no run other than it.
    """
    baseline = summary.get("baseline")
    runs = [label for label in summary["runs"] if label != baseline]
    if baseline is None or not runs:
        raise ValueError(f"a speed-up plot needs a baseline and another run, got baseline={baseline!r} "
                         f"and runs {list(summary['runs'])!r}")
    targets = list(summary["targets"])
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    width = 0.8 / len(runs)
    for i, label in enumerate(runs):
        xs, ys, lo, hi = [], [], [], []
        for j, t in enumerate(targets):
            st = summary["runs"][label]["per_target"][f"{t:g}"].get("speedup_stats")
            if not st or st.get("geomean") is None:
                continue
            g = st["geomean"]
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(g)
            lo.append(g - st["ci_low"] if st.get("ci_low") is not None else 0.0)
            hi.append(st["ci_high"] - g if st.get("ci_high") is not None else 0.0)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", color=f"C{(i + 1) % 10}", capsize=3, label=label)
    ax.axhline(1.0, color="0.4", ls=":", lw=1.0)
    ax.set_xticks(range(len(targets)), [f"{t:.0%}" for t in targets])
    ax.set_xlim(-0.5, len(targets) - 0.5)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("target test accuracy")
    ax.set_ylabel(f"speed-up over {baseline} [x]")
    level = summary.get("level", 0.95)
    note = f"geometric mean over seeds, {level:.0%} interval (paired log-ratios)"
    ax.set_title(f"{title} ({note})" if title else note, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return Path(path)


def plot_speedup_results(out_dir: str | Path, path: str | Path | None = None, *, dpi: int = DPI) -> Path:
    """Draw ``speedup.png`` of a saved study from its ``summary.json`` (``fednet plot DIR --speedup``).

    Parameters
    ----------
    out_dir : path-like
        A study's output directory.
    path : path-like, optional
        Output file, PNG, PDF or SVG by its extension (default ``out_dir/speedup.png``).
    dpi
        As :func:`plot_speedups`.
    """
    import json

    summary = json.loads((Path(out_dir) / "summary.json").read_text(encoding="utf-8"))
    path = Path(out_dir) / "speedup.png" if path is None else Path(path)
    return plot_speedups(summary, path, title=summary.get("study", ""), dpi=dpi)
