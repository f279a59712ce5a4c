"""Accuracy against simulated wall-clock time (the papers' Figs. 4-8).

Drawn with matplotlib's object API (:class:`matplotlib.figure.Figure`, rendered by the Agg
canvas into a file): importing fednet or this module never selects a matplotlib backend, so a
notebook's or a user's backend choice stands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

__all__ = ["plot_accuracy_vs_time", "plot_results"]


def plot_accuracy_vs_time(traces: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                          targets: Sequence[float], path: str | Path, *, title: str = "") -> Path:
    """Plot test accuracy against simulated time for every run (one colour) and seed (one line).

    Parameters
    ----------
    traces : {run label: {seed: trace rows}}
    targets : accuracies drawn as dashed horizontal lines
    path : output PNG

    Returns
    -------
    Path
        ``path``.
    """
    longest = max((rows[-1]["time_s"] for by_seed in traces.values() for rows in by_seed.values()), default=0.0)
    scale, unit = (3600.0, "h") if longest > 3 * 3600 else (60.0, "min") if longest > 180 else (1.0, "s")
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    for i, (label, by_seed) in enumerate(traces.items()):
        color = f"C{i % 10}"
        for j, (seed, rows) in enumerate(sorted(by_seed.items())):
            ax.plot([r["time_s"] / scale for r in rows], [r["accuracy"] for r in rows], color=color,
                    lw=1.4 if j == 0 else 0.7, alpha=1.0 if j == 0 else 0.45, label=label if j == 0 else None)
    for t in targets:
        ax.axhline(t, color="0.5", ls="--", lw=0.8)
    lows = [t for t in targets] + [0.5]
    ax.set_ylim(max(0.0, min(lows) - 0.15), 1.0)
    ax.set_xlabel(f"simulated time [{unit}]")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def plot_results(out_dir: str | Path, path: str | Path | None = None) -> Path:
    """Redraw ``accuracy_vs_time.png`` of a saved study from its traces (``fednet plot DIR``).

    Parameters
    ----------
    out_dir : path-like
        A study's output directory (:func:`fednet.study.results.load_results`).
    path : path-like, optional
        Output PNG (default ``out_dir/accuracy_vs_time.png``).
    """
    from .results import load_results

    res = load_results(out_dir)
    path = Path(out_dir) / "accuracy_vs_time.png" if path is None else Path(path)
    return plot_accuracy_vs_time(res.traces(), res.summary["targets"], path, title=res.summary.get("study", ""))
