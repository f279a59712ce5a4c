"""Figs. 7 and 8 of Schlegel et al. beside fednet's: each scheme at its best setting, and the paper's ratios.

Usage: python studies/secagg_report.py RESULT_DIR [RESULT_DIR ...] [--target 0.95]
(directories written by ``fednet run studies/fig7_mnist.toml`` or ``studies/fig8_mnist.toml``, whole or with
``--runs``; seeds of one study are pooled over folders, a (run, seed) found twice must agree).

What is compared (Schlegel et al., Sec. VII-D): for each privacy level ``z`` and accounting, the setting of
each scheme (CodedSecAgg's N, CodedPaddedFL's N and alpha, LightSecAgg's U) with the smallest geometric-mean
time to the target over the seeds that every run reached it at -- one fixed setting per scheme, not the best
per seed, so a lucky seed does not pick its own winner.  The paper minimises over the same grid for one
realisation.  Then, paired by seed:

* speed-up of CodedSecAgg over LightSecAgg at each ``z``: ``T_LSA / T_CSA`` (paper, at 95 %: D = 120: 18.7x at
  z = 1, 6.6x at z = 60; D = 1000: 38.9x at z = 1, 10.4x at z = 600);
* cost of secure aggregation: ``T_CSA(z = 1) / T_CPFL`` (paper: 1.34 at D = 120, 1.15 at D = 1000).

Each is a geometric mean over seeds with a Student-t interval of the log-ratios
(:func:`fednet.study.results.log_interval`, 95 %), and the ratio fednet / paper is flagged where it is off
by more than 30 %.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

from fednet.study.results import log_interval

#: Schlegel et al., Sec. VII-D, at 95 % test accuracy: speed-ups of CodedSecAgg over LightSecAgg per z, and
#: CodedSecAgg's time over CodedPaddedFL's at z = 1.
PAPER = {
    "fig7_mnist": {"D": 120, "speedup": {1: 18.7, 60: 6.6}, "csa_over_cpfl": 1.34},
    "fig8_mnist": {"D": 1000, "speedup": {1: 38.9, 600: 10.4}, "csa_over_cpfl": 1.15},
}
#: Relative difference from the paper above which a ratio is flagged (issue 12).
FLAG = 0.30

_LABEL = re.compile(r"^(?P<scheme>CodedSecAgg|CodedPaddedFL|LightSecAgg)(?: z=(?P<z>\d+))?(?P<setting>.*?)"
                    r"(?: (?P<accounting>fednet|paper))?$")


class Label(NamedTuple):
    """A run label of fig7_mnist/fig8_mnist, parsed: scheme, privacy ``z`` (None for CodedPaddedFL), setting
    (``"N=2 relay_asap"``, ``"U=96"``) and accounting (None: the same under both, as LightSecAgg)."""

    scheme: str
    z: int | None
    setting: str
    accounting: str | None


def parse_label(label: str) -> Label | None:
    """The parts of a run label, or None for a label of another form (ignored by the report)."""
    m = _LABEL.match(label)
    if m is None:
        return None
    return Label(m["scheme"], None if m["z"] is None else int(m["z"]), m["setting"].strip(), m["accounting"])


def collect(directories: list[Path], target: float) -> tuple[str, dict[str, dict[int, float | None]]]:
    """``(study name, {label: {seed: simulated seconds to target, None if not reached}})`` over folders.

    Raises
    ------
    ValueError
        If the folders hold different studies, or one (run, seed) twice with different times.
    """
    name, out = None, {}
    for directory in directories:
        study = json.loads((directory / "study.json").read_text(encoding="utf-8"))
        if name is not None and study["name"] != name:
            raise ValueError(f"{directory}: study {study['name']!r}, the others are {name!r}")
        name = study["name"]
        summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
        for label, run in summary["runs"].items():
            entry = run["per_target"].get(f"{target:g}")
            if entry is None:
                raise ValueError(f"{directory}: target {target:g} not in summary.json (targets {summary['targets']})")
            for seed, t in entry["time_s"].items():
                seeds = out.setdefault(label, {})
                if int(seed) in seeds and seeds[int(seed)] != t:
                    raise ValueError(f"{label!r} seed {seed}: {seeds[int(seed)]} and {t} in two folders")
                seeds[int(seed)] = t
    if name is None:
        raise ValueError("no result folders given")
    return name, out


def best(times: dict[str, dict[int, float | None]], scheme: str, z: int | None, accounting: str | None,
         seeds: list[int]) -> tuple[str, dict[int, float]] | None:
    """The run of ``scheme`` at ``z`` and ``accounting`` with the smallest geometric-mean time over ``seeds``.

    Only runs that reached the target at every seed of ``seeds`` compete (a run that misses it at one seed
    cannot be averaged).  Runs without an accounting (LightSecAgg) compete under either.  Returns the label
    and its times per seed, or None when no run qualifies.
    """
    found = []
    for label, by_seed in times.items():
        lab = parse_label(label)
        if lab is None or lab.scheme != scheme or lab.z != z or lab.accounting not in (None, accounting):
            continue
        ts = [by_seed.get(s) for s in seeds]
        if all(t is not None and t > 0 for t in ts):
            found.append((log_interval(ts)["geomean"], label))
    if not found:
        return None
    _, label = min(found)
    return label, {s: times[label][s] for s in seeds}


def paired(num: dict[int, float], den: dict[int, float]) -> dict:
    """:func:`log_interval` of ``num[s] / den[s]`` over the seeds both have."""
    return log_interval(num[s] / den[s] for s in sorted(num) if s in den)


def _cell(st: dict, fmt: str = "{:.3g}") -> str:
    g = fmt.format(st["geomean"])
    if st["ci_low"] is None:
        return f"{g} (n = {st['n']})"
    return f"{g} [{fmt.format(st['ci_low'])}, {fmt.format(st['ci_high'])}]"


def _flag(fednet: float, paper: float) -> str:
    r = fednet / paper
    return f"{r:.2f}x the paper" + (" (off by > 30 %)" if abs(r - 1) > FLAG else "")


def report(directories: list[Path], target: float = 0.95) -> str:
    """The markdown tables of a Fig. 7 or Fig. 8 study (module docstring), as text.

    Parameters
    ----------
    directories : list of Path
        Output folders of one study (``study.json``, ``summary.json``).
    target : float
        Test accuracy; the paper's ratios are at 0.95.
    """
    name, times = collect(directories, target)
    seeds = sorted({s for by_seed in times.values() for s in by_seed})
    zs = sorted({lab.z for lab in map(parse_label, times) if lab is not None and lab.z is not None})
    paper = PAPER.get(name, {})
    lines = [f"### {name}: time to {target:.0%} (simulated s), seeds {seeds}; geometric mean [95 % CI]", "",
             "| scheme | z | accounting | best setting | time s | per seed |", "|---|---|---|---|---|---|"]
    chosen: dict[tuple[str, int | None, str], tuple[str, dict[int, float]]] = {}
    for accounting in ("fednet", "paper"):
        for scheme, z in [("CodedPaddedFL", None)] + [(s, z) for z in zs for s in ("CodedSecAgg", "LightSecAgg")]:
            b = best(times, scheme, z, accounting, seeds)
            if b is None:
                continue
            chosen[scheme, z, accounting] = b
            label, ts = b
            per = " ".join(f"{s}: {t:,.0f}" for s, t in ts.items())
            lines.append(f"| {scheme} | {'-' if z is None else z} | {accounting if parse_label(label).accounting else 'both'} "
                         f"| {parse_label(label).setting} | {_cell(log_interval(ts.values()), '{:,.0f}')} | {per} |")
    lines += ["", f"| ratio (paired by seed) | accounting | fednet | paper (Sec. VII-D) | fednet / paper |",
              "|---|---|---|---|---|"]
    for accounting in ("fednet", "paper"):
        for z in zs:
            c, lsa = chosen.get(("CodedSecAgg", z, accounting)), chosen.get(("LightSecAgg", z, accounting))
            if c is None or lsa is None:
                continue
            st = paired(lsa[1], c[1])
            p = paper.get("speedup", {}).get(z)
            lines.append(f"| speed-up over LightSecAgg, z = {z} | {accounting} | {_cell(st)}x | "
                         f"{'-' if p is None else f'{p}x'} | {'-' if p is None else _flag(st['geomean'], p)} |")
        c, cp = chosen.get(("CodedSecAgg", 1, accounting)), chosen.get(("CodedPaddedFL", None, accounting))
        if c is not None and cp is not None:
            st = paired(c[1], cp[1])
            p = paper.get("csa_over_cpfl")
            lines.append(f"| CodedSecAgg (z = 1) / CodedPaddedFL time | {accounting} | {_cell(st)} | "
                         f"{'-' if p is None else p} | {'-' if p is None else _flag(st['geomean'], p)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    at = 0.95
    if "--target" in args:
        k = args.index("--target")
        at = float(args[k + 1])
        del args[k:k + 2]
    if not args:
        sys.exit(__doc__.splitlines()[2])
    print(report([Path(d) for d in args], at))
