"""Pinned reduced numbers of every bundled study (issue 31, item 4): a header's table cannot go stale silently.

A study header's measured table is written by ``fednet report studies/X.toml RESULT_DIR`` from a full run's folder
(hours). This module reruns a *reduced* version of every ``studies/*.toml`` and compares its ``fednet report``
block, text for text, with ``tests/data/reduced_reports/<study>.txt``. A change of the code that moves a study's
numbers (time, accuracy, energy, speed-up) moves the reduced ones too, and fails here: the change must then come
with regenerated pinned files *and* a note on which headers need a full rerun.

The reduction (:func:`reduce`), the same for every study unless :data:`REDUCE` says otherwise:

- the study's first seed (``--seed``), at most :data:`EPOCHS` rounds of every run (``--epochs``);
- the baseline (or the first run) and the first run of each other protocol, at most :data:`RUNS` runs (``--runs``);
- 64 random features for a horizontal random-feature study (``--set data.n_components=64``); the first 600 training
  and 200 test examples for a vertical one (``--set data.max_train=600 --set data.max_test=200``);
- secret seed 20261129 (``--secret-seed 20261129``: FedVS's rounding and CodedPaddedFL's full-mode pads draw from it);
- the report at the targets 0.2 and 0.5 (``--targets 0.2 0.5``): a run of a few rounds reaches those, not the
  study's own;
- no plot. :data:`REDUCE` adds ``--set`` keys, more seeds or other runs where a study is too slow or too small.

The report is compared after replacing the host-dependent parts of its lines with placeholders (:func:`normalise`):
the result folder's path (``RESULT_DIR``), the date, the git commit and the fednet version.

Regenerating a pinned file (only with a documented reason in the commit message: which change of the code moves
which numbers, and why that is right; a regenerated file with no reason is a defect)::

    PYTHONPATH=. python tests/test_header_numbers.py --write STUDY [STUDY ...]   # or --write all

which runs exactly what the test runs (``--time`` prints each study's host seconds without writing anything).

Studies that are not pinned are listed in :data:`SKIPPED` with the reason (data not shipped with the tests); every
other bundled study must have a pinned file (:func:`test_every_bundled_study_is_pinned_or_skipped_with_a_reason`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
PINNED = ROOT / "tests" / "data" / "reduced_reports"

#: Rounds of every run in a reduced study.
EPOCHS = 2
#: Most runs kept (the baseline included).
RUNS = 2
#: Target accuracies of the reduced report.
TARGETS = (0.2, 0.5)
#: Secret seed of the reduced runs.
SECRET_SEED = 20261129

#: Per study, what the reduction changes: ``sets`` (more ``--set`` keys), ``seeds`` (how many of the study's
#: first seeds), ``runs`` (the labels to keep instead of the default choice), ``epochs``.
REDUCE: dict[str, dict[str, Any]] = {
    "quickstart": {"seeds": 2},                        # digits: cheap enough for an interval over two seeds
    "dresfl_table2": {"runs": ["FedAvg", "DReS-FL"]},  # the study's protocol, not the next baseline
    "dresfl_table2_fashion": {"runs": ["FedAvg", "DReS-FL"]},
    "dresfl_latency_dropouts": {"runs": ["FedAvg+LightSecAgg", "DReS-FL K=1"]},   # the dropouts' protocol
    "fedvs_fig1": {"runs": ["Wait average no stragglers", "Ignore concat", "VAFL max"]},   # each aggregation once
}

#: Studies not pinned, with the reason (keep this short).
SKIPPED: dict[str, str] = {
    "fedvs_fig2_handwritten": "needs the UCI Handwritten (mfeat) files, which are not in FEDNET_DATA",
}

#: Data sets each study needs in ``$FEDNET_DATA`` (a study whose data is absent there skips, naming it).
_FILE_DATA = ("mnist", "fashion-mnist")


def reduce(name: str) -> tuple[list[str], dict[str, Any]]:
    """The reduced ``fednet run`` arguments of a bundled study (module docstring) and the keywords of ``load_study``.

    Returns
    -------
    (list of str, dict)
        The command line after ``fednet`` (what :func:`reduced_report` runs, written in the report), and the
        ``load_study`` keywords that run it: ``seeds``, ``max_epochs``, ``only_runs``, ``sets``.
    """
    from fednet.study.config import load_study

    path = STUDIES / f"{name}.toml"
    spec = REDUCE.get(name, {})
    study = load_study(path)
    seeds = list(study.seeds[: spec.get("seeds", 1)])
    base = study.baseline or study.runs[0].name
    if "runs" in spec:
        runs = list(spec["runs"])
    else:
        protocols = {next(r.protocol for r in study.runs if r.name == base)}
        runs = [base]
        for r in study.runs:
            if len(runs) < RUNS and r.protocol not in protocols:
                protocols.add(r.protocol)
                runs.append(r.name)
        for r in study.runs:                            # one protocol only: the next run
            if len(runs) < min(RUNS, len(study.runs)) and r.name not in runs:
                runs.append(r.name)
    sets = []
    if study.data.vertical:
        sets += ["data.max_train=600", "data.max_test=200"]
    elif study.data.features == "rbf":
        sets += ["data.n_components=64"]
    sets += list(spec.get("sets", ()))
    epochs = spec.get("epochs", EPOCHS)
    argv = ["run", f"studies/{name}.toml", "--epochs", str(epochs), "--runs", *runs,
            *[a for s in sets for a in ("--set", s)], "--secret-seed", str(SECRET_SEED)]
    argv += ["--seed", str(seeds[0])] if len(seeds) == 1 else ["--set", f"seeds=[{','.join(map(str, seeds))}]"]
    return argv, {"seeds": seeds, "max_epochs": epochs, "only_runs": runs, "sets": sets}


def reduced_report(name: str, out: Path) -> str:
    """Run the reduced study ``name`` into ``out`` (in this process, without a plot) and return its report block.

    The study is run by :func:`fednet.study.runner.run_study`, which ``fednet run`` calls, and reported by
    ``fednet report`` itself (:func:`fednet.cli.main`), on the study file of this checkout.
    """
    import contextlib
    import io

    from fednet.cli import main
    from fednet.study.config import load_study
    from fednet.study.runner import run_study

    argv, kwargs = reduce(name)
    os.chdir(ROOT)                                      # the report names the study file as the command does
    study = load_study(STUDIES / f"{name}.toml", **kwargs)
    run_study(study, out, progress=False, plot=False, command=["fednet", *argv], secret_seed=SECRET_SEED)
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["report", f"studies/{name}.toml", str(out), "--targets", *map(str, TARGETS)])
    if rc != 0:
        raise AssertionError(f"fednet report {name} failed: {err.getvalue().strip()}")
    return normalise(buf.getvalue(), out)


def normalise(text: str, out: Path) -> str:
    """The report with its host-dependent parts replaced: the result folder, date, git commit and fednet version."""
    text = text.replace(str(out), "RESULT_DIR")
    text = re.sub(r" on \d{4}-\d\d-\d\d ", " on DATE ", text)
    text = re.sub(r"commit [0-9a-f]{7}(-dirty)?|commit unknown", "commit COMMIT", text)
    return re.sub(r"\(fednet [^,)]+,", "(fednet VERSION,", text)


def _needs(name: str) -> str | None:
    """The ``$FEDNET_DATA`` data set a study reads, or None (embedded data)."""
    from fednet.study.config import load_study

    ds = load_study(STUDIES / f"{name}.toml").data.dataset
    return ds if ds in _FILE_DATA else None


def bundled() -> list[str]:
    """The bundled studies, by name."""
    return sorted(p.stem for p in STUDIES.glob("*.toml"))


def test_every_bundled_study_is_pinned_or_skipped_with_a_reason() -> None:
    names = bundled()
    assert len(names) >= 20                                  # the glob found the studies
    missing = [n for n in names if n not in SKIPPED and not (PINNED / f"{n}.txt").is_file()]
    assert not missing, f"bundled studies without a pinned reduced report (module docstring): {missing}"
    assert set(SKIPPED) <= set(names), "SKIPPED names a study that is not bundled"
    assert len(SKIPPED) <= 3, f"keep the skipped list short: {SKIPPED}"
    stale = sorted(p.stem for p in PINNED.glob("*.txt") if p.stem not in names)
    assert not stale, f"pinned reports of studies that are no longer bundled: {stale}"


@pytest.mark.parametrize("name", [n for n in bundled() if n not in SKIPPED])
def test_reduced_study_reproduces_its_pinned_report(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)                             # restored after the test (reduced_report changes it)
    need = _needs(name)
    data = os.environ.get("FEDNET_DATA")
    if need is not None and not (data and (Path(data) / need).is_dir()):
        pytest.skip(f"{name} needs {need} in FEDNET_DATA (see README)")
    got = reduced_report(name, tmp_path / "out")
    want = (PINNED / f"{name}.txt").read_text(encoding="utf-8")
    assert got == want, (f"{name}: the reduced report moved (regenerate only with a documented reason: module "
                         f"docstring)\n--- pinned\n{want}--- now\n{got}")


def _cli(argv: list[str]) -> int:  # pragma: no cover - the regeneration command
    import tempfile

    write, timing = "--write" in argv, "--time" in argv
    names = [a for a in argv if not a.startswith("--")]
    names = [n for n in bundled() if n not in SKIPPED] if names == ["all"] else names
    if not names or not (write or timing):
        print(__doc__.split("\n\n")[-3], file=sys.stderr)
        return 2
    import fednet

    fednet.configure_host()
    from fednet.study.threads import limit_threads

    PINNED.mkdir(parents=True, exist_ok=True)
    with limit_threads(1), tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            text = reduced_report(name, Path(tmp) / name)
            print(f"{name}: {time.perf_counter() - t0:.1f} s  ({shlex.join(['fednet', *reduce(name)[0]])})")
            if write:
                (PINNED / f"{name}.txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_cli(sys.argv[1:]))
