"""The measured table of a study's header, written from a saved result folder (``fednet report``; issue 31, item 4).

A study file's header quotes what a full run measured. So that no number there is typed by hand (and none can go
stale unnoticed), ``fednet report STUDY RESULT_DIR`` prints the table as ``# ``-prefixed comment lines, and
``--write`` puts them into the study file between the markers :data:`BEGIN` and :data:`END`::

    # >>> fednet report (generated from a result folder: edit outside the markers)
    # regenerate: `fednet report studies/x.toml results/x --write`
    # result results/x, run on 2026-11-29 (fednet 0.1.0, commit a791f87):
    #   `fednet run studies/x.toml --jobs 2`
    # seeds 0, 1, 2; the study as in this file
    #   run              seeds  last acc.  per round [s]  to 80 % [s]      speed-up @80 %
    #   ---------------  -----  ---------  -------------  ---------------  --------------
    #   Conventional FL  3      0.9480     33.0           148 [106, 208]   1 (baseline)
    # times: geometric mean over seeds [95% interval, log scale], ...
    # <<< fednet report

Every number is one :func:`fednet.study.results.summarize` computed (the one code path of ``fednet summarize``):
the saved ``summary.json``, or, with other target accuracies, :func:`~fednet.study.results.summarize` of the saved
traces. The cells are :func:`~fednet.study.results.time_cell`, :func:`~fednet.study.results.energy_cell` and
:func:`~fednet.study.results.speedup_cell`, as in ``fednet summarize``'s table.

A result folder is reported against a study file only when it is that study's: its ``study.json`` names the same
study and every run it holds is a run of the file. What the run changed (``--epochs``, ``--seed``, ``--runs``,
``--set``) is read from ``study.json`` against the file and named in the block, so a reduced or altered run cannot
pass for the file's.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError, DataError, OutputError

__all__ = ["BEGIN", "END", "saved_result", "as_validated", "study_differences", "report_summary", "format_report", "replace_block",
           "write_block"]

#: First line of the generated block in a study file (the rest of that line is free text).
BEGIN = "# >>> fednet report"
#: Last line of the generated block.
END = "# <<< fednet report"

#: Widest line of the block, ``# `` prefix included (as ``fednet summarize``'s tables).
WIDTH = 120

#: Most differences between the run and the file named one by one (the others are counted).
MAX_DIFFERENCES = 8


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def saved_result(out_dir: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``summary.json``, ``study.json`` and ``provenance.json`` of a saved result folder.

    Parameters
    ----------
    out_dir : path-like
        A folder written by ``fednet run``.

    Returns
    -------
    (dict, dict, dict)
        The summary, the study as run, and the provenance (empty when the folder has none).

    Raises
    ------
    DataError
        If the folder holds no ``summary.json`` or ``study.json``, or they are not fednet's (names the folder).
    """
    out = Path(out_dir)
    if not (out / "summary.json").is_file():
        raise DataError(f"{out} holds no summary.json (not a study's output directory)")
    if not (out / "study.json").is_file():
        raise DataError(f"{out} holds no study.json, so which study it ran cannot be checked")
    try:
        summary, study = _read_json(out / "summary.json"), _read_json(out / "study.json")
        prov = _read_json(out / "provenance.json") if (out / "provenance.json").is_file() else {}
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"{out}: saved results are damaged or not written by this fednet ({e})") from e
    if not (isinstance(summary, dict) and isinstance(summary.get("runs"), dict) and isinstance(study, dict)
            and isinstance(study.get("runs"), list) and isinstance(prov, dict)):
        raise DataError(f"{out}: saved results are damaged or not written by this fednet (summary.json, study.json "
                        "or provenance.json is not the expected table)")
    return summary, study, prov


def as_validated(saved: Mapping[str, Any]) -> dict[str, Any]:
    """``study.json`` of a result validated again, so keys added to the study format since it was written read as
    their defaults (and do not count as differences); as it is when it no longer validates."""
    from pydantic import ValidationError

    from fednet.errors import FednetError
    from fednet.study.config import Study

    try:
        return json.loads(Study.model_validate(dict(saved)).model_dump_json())
    except (ValidationError, FednetError, ValueError, TypeError):
        return dict(saved)


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaves(v, (*path, str(k)))
    else:
        yield path, value


_MISSING = object()


def _show(v: Any) -> str:
    text = "missing" if v is _MISSING else json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _diff(saved: Mapping[str, Any], file: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    a, b = dict(_leaves(dict(saved))), dict(_leaves(dict(file)))
    keys = list(a) + [k for k in b if k not in a]
    return [(".".join(k), a.get(k, _MISSING), b.get(k, _MISSING)) for k in keys
            if a.get(k, _MISSING) != b.get(k, _MISSING)]


def study_differences(saved: Mapping[str, Any], file: Mapping[str, Any], where: str = "RESULT_DIR") -> list[str]:
    """What a result's study (``study.json``) changed against the study file's, one phrase per difference.

    Parameters
    ----------
    saved : dict
        ``study.json`` of the result folder.
    file : dict
        The study file, validated (``json.loads(load_study(path).model_dump_json())``).
    where : str
        The result folder's name, for the error message.

    Returns
    -------
    list of str
        ``"epochs = 2 (file: 500)"``, ``"runs: 2 of 17"``, ``"runs.*.epochs = 2 (file: null)"`` (a difference every
        kept run shares), ``"runs.'X'.params.mode = \\"timing\\" (file: \\"full\\")"``; empty when the result ran the
        file as it is.

    Raises
    ------
    DataError
        If the result ran another study (its name differs) or a run the file does not have (named).
    """
    if saved.get("name") != file.get("name"):
        raise DataError(f"{where} holds results of study {saved.get('name')!r}, not of {file.get('name')!r} (the "
                        "study file given): report a result folder against the study that produced it")
    file_runs = {r.get("label"): r for r in file.get("runs", [])}
    saved_runs = {r.get("label"): r for r in saved.get("runs", []) if isinstance(r, dict)}
    foreign = [label for label in saved_runs if label not in file_runs]
    if foreign:
        raise DataError(f"{where} holds run {foreign[0]!r}, which study {file.get('name')!r} does not have "
                        f"({len(foreign)} such run{'s' if len(foreign) != 1 else ''}): the study file changed since, "
                        "or the folder is another study's")
    out = [f"{k} = {_show(a)} (file: {_show(b)})"
           for k, a, b in _diff({k: v for k, v in saved.items() if k != "runs"},
                                {k: v for k, v in file.items() if k != "runs"})]
    if len(saved_runs) < len(file_runs):
        out.append(f"runs: {len(saved_runs)} of {len(file_runs)}")
    per_run = {label: _diff(run, file_runs[label]) for label, run in saved_runs.items()}
    shared = [d for d in next(iter(per_run.values()), []) if all(d in ds for ds in per_run.values())]
    if len(per_run) > 1:
        out += [f"runs.*.{k} = {_show(a)} (file: {_show(b)})" for k, a, b in shared]
    for label, ds in per_run.items():
        out += [f"runs.{label!r}.{k} = {_show(a)} (file: {_show(b)})" for k, a, b in ds
                if len(per_run) == 1 or (k, a, b) not in shared]
    return out


def report_summary(out_dir: str | os.PathLike, summary: Mapping[str, Any],
                   targets: Sequence[float] | None = None) -> Mapping[str, Any]:
    """The summary to report: the saved one, or :func:`~fednet.study.results.summarize` of the saved traces at
    other ``targets`` (the same function that wrote ``summary.json``).

    Raises
    ------
    DataError
        If a run's trace is missing or unreadable (names the folder).
    """
    from fednet.study.results import load_results, summarize

    if targets is None or [float(t) for t in targets] == [float(t) for t in summary.get("targets", [])]:
        return summary
    try:
        res = load_results(out_dir)
        traces = {}
        for label in res.rounds["run"].drop_duplicates():
            sub = res.rounds[res.rounds["run"] == label]
            if "energy_j" in sub and sub["energy_j"].isna().all():   # a column of another run's energy model
                sub = sub.drop(columns="energy_j")
            traces[label] = {int(s): g.drop(columns="run").to_dict("records")
                             for s, g in sub.groupby("seed", sort=True)}
        fs = summary.get("feature_seeds")
        return summarize(traces, list(targets), summary.get("baseline"),
                         feature_seeds=None if fs is None else {int(k): int(v) for k, v in fs.items()},
                         level=summary.get("level", 0.95))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{out_dir}: saved traces are damaged or missing ({e})") from e


def _pct(t: float) -> str:
    return f"{float(t) * 100:g} %"


def _comment(text: str, indent: str = "") -> list[str]:
    import textwrap

    return ["# " + indent + line for line in textwrap.wrap(text, WIDTH - 2 - len(indent), break_on_hyphens=False,
                                                           break_long_words=False)]


def format_report(summary: Mapping[str, Any], *, command: str, result: str,
                  provenance: Mapping[str, Any] | None = None, differences: Sequence[str] = ()) -> str:
    """The header block: :data:`BEGIN`, what produced the result, the table, how it was computed, :data:`END`.

    Parameters
    ----------
    summary : dict
        A study summary (``summary.json``, :func:`report_summary`).
    command : str
        The ``fednet report`` command that writes this block (quoted in its first line).
    result : str
        The result folder, as the user named it.
    provenance : dict, optional
        ``provenance.json`` of the result: its ``command``, ``created_utc``, ``fednet`` and ``git_commit``.
    differences : sequence of str
        :func:`study_differences` (named when not empty).

    Returns
    -------
    str
        ``# ``-prefixed lines, newline-terminated, none wider than :data:`WIDTH` but the two naming the report
        command and the result folder (never wrapped, so that a path's length moves no other line) and an
        unbreakable word. Per run: the seeds counted, the mean test accuracy at the last round, the mean simulated
        set-up time (when some run has a set-up phase) and time per round after it, and per target the time
        (geometric mean [95 % interval] over seeds), the devices' joules (with an energy model) and the paired
        speed-up over the baseline (with a baseline and another run).
    """
    import numpy as np

    from fednet.study.results import (SAME, _key, _num, _table, _time_unit, energy_cell, last_accuracy_cell,
                                      speedup_cell, summary_note, time_cell)

    prov = provenance or {}
    runs = summary["runs"]
    targets = summary["targets"]
    energy = any("energy_j" in e for r in runs.values() for e in r["per_target"].values())
    speedups = summary.get("baseline") in runs and len(runs) > 1
    header = ["run", "seeds", "last acc."]
    setups = {label: [v for v in run.get("setup_s", {}).values() if v is not None] for label, run in runs.items()}
    per_round = {label: [v for v in run.get("round_s", {}).values() if v is not None] for label, run in runs.items()}
    show_setup = any(v > 0 for vals in setups.values() for v in vals)
    if show_setup:
        setup_scale, setup_unit = _time_unit(v for vals in setups.values() for v in vals)
        header.append(f"set-up [{setup_unit}]")
    round_scale, round_unit = _time_unit(v for vals in per_round.values() for v in vals)
    header.append(f"per round [{round_unit}]")
    units = {}
    for t in targets:
        units[_key(t)] = _time_unit(v for r in runs.values() for v in r["per_target"][_key(t)]["time_s"].values())
        header.append(f"to {_pct(t)} [{units[_key(t)][1]}]")
        if energy:
            header.append(f"J to {_pct(t)}")
        if speedups:
            header.append(f"speed-up @{_pct(t)}")
    rows = [header]
    for label, run in runs.items():
        row = [label, str(len(run["seeds"])), last_accuracy_cell(run)]
        if show_setup:
            row.append(_num(float(np.mean(setups[label])), setup_scale) if setups[label] else "-")
        row.append(_num(float(np.mean(per_round[label])), round_scale) if per_round[label] else "-")
        for t in targets:
            e = run["per_target"][_key(t)]
            row.append(time_cell(e, units[_key(t)][0]))
            if energy:
                row.append(energy_cell(e))
            if speedups:
                row.append(speedup_cell(e, label == summary.get("baseline")))
        rows.append(row)
    marked = any(c.endswith(" " + SAME) for r in rows[1:] for c in r)
    commit = str(prov.get("git_commit") or "unknown")[:7] + ("-dirty" if prov.get("git_dirty") else "")
    seeds = sorted({int(s) for r in runs.values() for s in r["seeds"]})
    date = str(prov["created_utc"])[:10] if prov.get("created_utc") else "an unrecorded date"
    # the command and the folder stand on lines of their own, never wrapped: a path's length moves no other line
    lines = [f"{BEGIN} (generated from a result folder: edit outside the markers)",
             f"# regenerate: `{command}`",
             f"# result {result}, run on {date} (fednet {prov.get('fednet', '?')}, commit {commit}):"]
    lines += _comment(f"`{prov.get('command', 'command not recorded')}`", "  ")
    lines += _comment(f"seeds {', '.join(map(str, seeds))}; "
                      + (f"the run differs from this file in: {'; '.join(differences[:MAX_DIFFERENCES])}"
                         + (f"; and {len(differences) - MAX_DIFFERENCES} more" if len(differences) > MAX_DIFFERENCES
                            else "")
                         if differences else "the study as in this file"))
    lines += ["#   " + line if line else "#" for line in _table(rows, WIDTH - 4).splitlines()]
    note = (summary_note(summary, marked) + "; last acc.: mean over seeds of the test accuracy at the last round"
            + ("; set-up: simulated time of the set-up phase" if show_setup else "")
            + "; per round: simulated time per round after the set-up (set-up, per round: means over seeds)")
    if energy:
        note += "; J: the devices' joules until the target, mean over the seeds that reached it"
    lines += _comment(note)
    for label, run in runs.items():
        for seed, f in run.get("failed", {}).items():
            lines += _comment(f"{label} seed {seed}: training failed at round {f['round']}: {f['reason']}")
    lines.append(END)
    return "\n".join(lines) + "\n"


_BEGIN_RE = re.compile(re.escape(BEGIN) + r"(?:\s|$)")
_END_RE = re.compile(re.escape(END) + r"\s*$")


def replace_block(text: str, block: str, where: str = "the study file") -> str:
    """``text`` with the lines from :data:`BEGIN` to :data:`END` replaced by ``block`` (every other byte kept).

    Without markers, ``block`` and a ``#`` line are put at the top of the file (the top of its header).

    Raises
    ------
    ConfigError
        If the markers are unbalanced: not exactly one of each, or the end before the beginning (names the lines).
    """
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    begins = [i for i, line in enumerate(lines) if _BEGIN_RE.match(line)]
    ends = [i for i, line in enumerate(lines) if _END_RE.match(line)]
    body = block.replace("\n", newline)
    if not begins and not ends:
        return body + "#" + newline + text
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        at = lambda idx: ", ".join(str(i + 1) for i in idx) or "none"   # noqa: E731
        raise ConfigError(f"{where}: unbalanced report markers ({BEGIN!r} at line {at(begins)}, {END!r} at line "
                          f"{at(ends)}): leave exactly one of each, the first before the second, or neither")
    tail = lines[ends[0]]
    if not tail.endswith(("\n", "\r")):              # the end marker was the file's last line, without a newline
        body = body[: -len(newline)]
    return "".join(lines[: begins[0]]) + body + "".join(lines[ends[0] + 1:])


def write_block(path: str | os.PathLike, block: str) -> None:
    """Replace the report block of the study file ``path`` (:func:`replace_block`) atomically.

    The new text goes to a temporary file in the same folder, with the file's permissions, and is renamed over it:
    a reader sees the old file or the new one, never a part.

    Raises
    ------
    ConfigError
        If the markers are unbalanced (nothing is written).
    OutputError
        If the file cannot be read or replaced (names it).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise OutputError(f"{path}: cannot read the study file to write its report block ({e})") from e
    new = replace_block(text, block, str(path))
    if new == text:
        return
    try:
        mode = path.stat().st_mode & 0o7777
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".report", dir=path.parent)
    except OSError as e:
        raise OutputError(f"{path}: cannot write its report block ({e})") from e
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(new.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"{path}: cannot write its report block ({e})") from e
