"""Figs. 7 and 8 of Schlegel et al. beside fednet's: each scheme at its best setting, and the paper's ratios.

Usage: python studies/secagg_report.py RESULT_DIR [RESULT_DIR ...] [--target 0.95]
(directories written by ``fednet run studies/fig7_mnist.toml`` or ``studies/fig8_mnist.toml``, whole or with
``--runs``; seeds of one study are pooled over folders, a (run, seed) found twice must agree).

What is compared (Schlegel et al., Sec. VII-D): for each privacy level ``z`` and accounting, the setting of
each scheme (CodedSecAgg's N, CodedPaddedFL's N and alpha, LightSecAgg's U) with the smallest geometric-mean
time to the target over the seeds that every run reached it at -- one fixed setting per scheme, not the best
per seed, so a lucky seed does not pick its own winner.  The paper minimises over the same grid for one
realisation.  Beside LightSecAgg's best U, LightSecAgg with U = D (the server waits for every user, as
conventional FL does in the paper) is shown and compared too.  Each time is split into the set-up phase
(round 0: the data sharing), the epochs to the target and the mean simulated seconds an epoch, the parts the
model's differences from the paper show up in.  Then, paired by seed:

* speed-up of CodedSecAgg over LightSecAgg at each ``z``: ``T_LSA / T_CSA`` (paper, at 95 %: D = 120: 18.7x at
  z = 1, 6.6x at z = 60; D = 1000: 38.9x at z = 1, 10.4x at z = 600);
* cost of secure aggregation: ``T_CSA(z = 1) / T_CPFL`` (paper: 1.34 at D = 120, 1.15 at D = 1000).

Each is a geometric mean over seeds with a Student-t interval of the log-ratios
(:func:`fednet.study.results.log_interval`, 95 %), and the ratio fednet / paper is flagged where it is off
by more than 30 %.
"""

from __future__ import annotations

import csv
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


class Reached(NamedTuple):
    """One run and seed at the target: simulated seconds and epochs to it (None if never reached) and the
    simulated seconds of its set-up phase (round 0; None if the trace is not there)."""

    time_s: float | None
    epochs: int | None
    setup_s: float | None


def parse_label(label: str) -> Label | None:
    """The parts of a run label, or None for a label of another form (ignored by the report)."""
    m = _LABEL.match(label)
    if m is None:
        return None
    return Label(m["scheme"], None if m["z"] is None else int(m["z"]), m["setting"].strip(), m["accounting"])


def collect(directories: list[Path], target: float) -> tuple[str, dict[str, dict[int, Reached]]]:
    """``(study name, {label: {seed: Reached}})`` over folders (``time_s``/``epochs`` None if not reached).

    Raises
    ------
    ValueError
        If the folders hold different studies, or one (run, seed) twice with different results.
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
            setup = _setup_times(directory / run["trace_csv"]) if "trace_csv" in run else {}
            for seed, t in entry["time_s"].items():
                got = Reached(t, entry["round"][seed], setup.get(int(seed)))
                seeds = out.setdefault(label, {})
                if int(seed) in seeds and seeds[int(seed)] != got:
                    raise ValueError(f"{label!r} seed {seed}: {seeds[int(seed)]} and {got} in two folders")
                seeds[int(seed)] = got
    if name is None:
        raise ValueError("no result folders given")
    return name, out


def _setup_times(trace_csv: Path) -> dict[int, float]:
    """Simulated seconds of each seed's round-0 row (the set-up phase: data sharing, or 0)."""
    with open(trace_csv, newline="", encoding="utf-8") as f:
        return {int(r["seed"]): float(r["time_s"]) for r in csv.DictReader(f) if r["round"] == "0"}


def best(times: dict[str, dict[int, Reached]], scheme: str, z: int | None, accounting: str | None,
         seeds: list[int], setting: str | None = None) -> tuple[str, dict[int, Reached]] | None:
    """The run of ``scheme`` at ``z`` and ``accounting`` with the smallest geometric-mean time over ``seeds``.

    Only runs that reached the target at every seed of ``seeds`` compete (a run that misses it at one seed
    cannot be averaged); ``setting`` keeps only that setting (e.g. ``"U=120"``).  Runs without an accounting
    (LightSecAgg) compete under either.  Returns the label and its results per seed, or None when no run
    qualifies.
    """
    found = []
    for label, by_seed in times.items():
        lab = parse_label(label)
        if (lab is None or lab.scheme != scheme or lab.z != z or lab.accounting not in (None, accounting)
                or setting not in (None, lab.setting)):
            continue
        ts = [by_seed[s].time_s if s in by_seed else None for s in seeds]
        if all(t is not None and t > 0 for t in ts):
            found.append((log_interval(ts)["geomean"], label))
    if not found:
        return None
    _, label = min(found)
    return label, {s: times[label][s] for s in seeds}


def paired(num: dict[int, Reached], den: dict[int, Reached]) -> dict:
    """:func:`log_interval` of ``num[s].time_s / den[s].time_s`` over the seeds both have."""
    return log_interval(num[s].time_s / den[s].time_s for s in sorted(num) if s in den)


def _cell(st: dict, fmt: str = "{:.3g}") -> str:
    g = fmt.format(st["geomean"])
    if st["ci_low"] is None:
        return f"{g} (n = {st['n']})"
    return f"{g} [{fmt.format(st['ci_low'])}, {fmt.format(st['ci_high'])}]"


def _flag(fednet: float, paper: float) -> str:
    r = fednet / paper
    return f"{r:.2f}x the paper" + (" (off by > 30 %)" if abs(r - 1) > FLAG else "")


def _parts(rs: dict[int, Reached]) -> str:
    """Mean set-up (s), epochs to target and simulated seconds an epoch after set-up, over seeds."""
    n = len(rs)
    if any(r.setup_s is None for r in rs.values()):
        return f"- | {sum(r.epochs for r in rs.values()) / n:.0f} | - "
    setup = sum(r.setup_s for r in rs.values()) / n
    epoch = sum((r.time_s - r.setup_s) / r.epochs for r in rs.values()) / n
    return f"{setup:,.0f} | {sum(r.epochs for r in rs.values()) / n:.0f} | {epoch:.3g}"


def report(directories: list[Path], target: float = 0.95) -> str:
    """The markdown tables of a Fig. 7 or Fig. 8 study (module docstring), as text.

    Parameters
    ----------
    directories : list of Path
        Output folders of one study (``study.json``, ``summary.json``, the runs' ``trace.csv``).
    target : float
        Test accuracy; the paper's ratios are at 0.95.

    Returns
    -------
    str
        Each scheme's best setting per ``z`` and accounting (time to target, its set-up, epochs and seconds
        per epoch, per seed), LightSecAgg waiting for every user (``U = D``) beside it, and the ratios.
    """
    name, times = collect(directories, target)
    seeds = sorted({s for by_seed in times.values() for s in by_seed})
    zs = sorted({lab.z for lab in map(parse_label, times) if lab is not None and lab.z is not None})
    paper = PAPER.get(name, {})
    everyone = f"U={paper['D']}" if "D" in paper else None
    if abs(target - 0.95) > 1e-9:
        paper = {}                                        # the paper states its ratios at 95 % only
    lines = [f"### {name}: time to {target:.0%} (simulated s), seeds {seeds}; geometric mean [95 % CI]", "",
             "| scheme | z | accounting | setting | time s | set-up s | epochs | s/epoch | per seed |",
             "|---|---|---|---|---|---|---|---|---|"]
    chosen: dict[tuple[str, int | None, str], tuple[str, dict[int, Reached]]] = {}
    rows = [("CodedPaddedFL", None, None)] + [(sc, z, st) for z in zs for sc, st in
                                              (("CodedSecAgg", None), ("LightSecAgg", None), ("LightSecAgg", everyone))]
    for accounting in ("fednet", "paper"):
        for scheme, z, setting in rows:
            b = best(times, scheme, z, accounting, seeds, setting)
            if b is None or (setting is not None and b[0] == chosen.get((scheme, z, accounting), (None,))[0]):
                continue                                  # U = D is LightSecAgg's best: shown once
            chosen[scheme + (" " + setting if setting else ""), z, accounting] = b
            label, rs = b
            lab = parse_label(label)
            if lab.accounting is None and accounting == "paper":
                continue                                  # LightSecAgg is the same under both: shown once
            per = " ".join(f"{s}: {r.time_s:,.0f}" for s, r in rs.items())
            lines.append(f"| {scheme} | {'-' if z is None else z} | {accounting if lab.accounting else 'both'} | "
                         f"{lab.setting}{' (waits for all)' if lab.setting == everyone else ''} | "
                         f"{_cell(log_interval(r.time_s for r in rs.values()), '{:,.0f}')} | {_parts(rs)} | {per} |")
    lines += ["", "| ratio (paired by seed) | accounting | fednet | paper (Sec. VII-D) | fednet / paper |",
              "|---|---|---|---|---|"]
    for accounting in ("fednet", "paper"):
        for z in zs:
            c = chosen.get(("CodedSecAgg", z, accounting))
            p = paper.get("speedup", {}).get(z)
            for key, what in (("LightSecAgg", "its best U"), (f"LightSecAgg {everyone}", f"{everyone}")):
                lsa = chosen.get((key, z, accounting))
                if c is None or lsa is None:
                    continue
                st = paired(lsa[1], c[1])
                lines.append(f"| speed-up over LightSecAgg ({what}), z = {z} | {accounting} | {_cell(st)}x | "
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
