"""Every ``fednet`` command in the README's code blocks runs (issue 30, item 2), reduced so that the whole check takes
about a minute: a renamed run label, a study key that no longer exists or an example that no longer validates fails
here, not in a reader's shell.

Each command keeps every option it is written with (so its labels, ``--set`` keys and values are validated as
written, the kept baseline included) and gains, for ``fednet run``: ``--epochs 1``, the study's first seed, 64
random features (``--set data.n_components=64`` for a horizontal random-feature study), the baseline alone when
the command names no ``--runs``, ``--quiet``, and an ``--out`` in a temporary folder (the same folder for every
command naming the same path, so ``fednet summarize /tmp/q`` and ``fednet report quickstart /tmp/q`` read what
``fednet run ... --out /tmp/q`` wrote; ``fednet report``'s ``--write`` is dropped: a README example never rewrites a
bundled study file).
Commands run in one process, in README order, from a temporary working folder. A command that needs a running
Dask scheduler (``--scheduler``) is skipped, with that reason.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fednet.cli import _resolve, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: Why a command is not run (matched against the command's text).
SKIPPED = {"--scheduler": "needs a running Dask scheduler at the README's placeholder address (tcp://HOST:8786)"}


def readme_commands(text: str) -> list[tuple[int, list[str]]]:
    """The ``fednet`` commands of a Markdown text's fenced code blocks: (line number, argv after ``fednet``).

    Backslash continuations are joined; comments and a leading ``$ `` prompt are dropped; the program may be
    written ``fednet`` or as a path ending in ``/fednet`` (``.venv/bin/fednet``).
    """
    commands: list[tuple[int, list[str]]] = []
    fence: str | None = None
    pending, start = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*(```+|~~~+)", line)
        if m:
            fence = None if fence is not None and m.group(1).startswith(fence) else (fence or m.group(1))
            pending = ""
            continue
        if fence is None:
            continue
        if not pending:
            start = n
        pending += line.strip().removeprefix("$ ")
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:
            words = []
        pending = ""
        if words and (words[0] == "fednet" or words[0].endswith("/fednet")):
            commands.append((start, words[1:]))
    return commands


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def reduce_command(argv: list[str], folder: Path, paths: dict[str, Path]) -> list[str]:
    """The reduced form of one command (module docstring); ``paths`` maps the README's output paths to ``folder``."""
    from fednet.study.config import load_study

    def place(p: str) -> str:
        if p not in paths:
            paths[p] = folder / f"out{len(paths)}"
        return str(paths[p])

    argv = [str(ROOT / a) if not Path(a).is_absolute() and (ROOT / a).is_file() else a for a in argv]
    if argv[0] in ("summarize", "plot"):
        return [argv[0], place(argv[1]), *argv[2:]]
    if argv[0] == "report":                 # the study as written, its result folder where the run put it
        return [argv[0], argv[1], place(argv[2]), *[a for a in argv[3:] if a != "--write"]]
    if argv[0] != "run":
        return argv
    out = _option(argv, "--out")
    argv = [a for a in argv if a != "--quiet"]
    if out is not None:
        argv[argv.index("--out") + 1] = place(out)
    else:
        argv += ["--out", place(f"results-{len(paths)}")]
    if "--epochs" in argv:
        argv[argv.index("--epochs") + 1] = "1"
    else:
        argv += ["--epochs", "1"]
    study = load_study(_resolve(argv[1]))
    if "--seed" not in argv:
        argv += ["--seed", str(study.seeds[0])]
    if "--runs" not in argv:
        argv += ["--runs", study.baseline or study.runs[0].name]
    if not study.data.vertical and study.data.features == "rbf" and "data.n_components" not in " ".join(argv):
        argv += ["--set", "data.n_components=64"]
    return [*argv, "--quiet"]


def test_the_readme_holds_the_commands_it_documents() -> None:
    """The extraction finds the README's examples (a reformatted README must not silently test nothing)."""
    commands = [" ".join(argv) for _, argv in readme_commands(README.read_text(encoding="utf-8"))]
    for needle in ("list", "describe ", "schema", "run quickstart", "summarize ", "plot ", "report ", "topology ",
                   "--jobs 2",
                   "--resume", "--set "):
        assert any(needle in c for c in commands), needle


def test_every_readme_command_runs_reduced(tmp_path, monkeypatch, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)                 # default outputs (results/...) and relative files land here
    paths: dict[str, Path] = {}
    failures, ran, skipped = [], 0, []
    for line, argv in readme_commands(README.read_text(encoding="utf-8")):
        text = shlex.join(["fednet", *argv])
        why = next((reason for key, reason in SKIPPED.items() if key in argv), None)
        if why is not None:
            skipped.append(f"README.md:{line}: {text}: {why}")
            continue
        reduced = reduce_command(argv, tmp_path, paths)
        rc = main(reduced)
        out, err = capsys.readouterr()
        ran += 1
        if rc != 0:
            failures.append(f"README.md:{line}: {text}\n    ran as: {shlex.join(['fednet', *reduced])}\n    exit {rc}: "
                            f"{err.strip()[-800:]}")
    assert not failures, "README commands that fail:\n" + "\n".join(failures)
    assert ran >= 10, f"only {ran} README commands ran"
    assert len(skipped) <= 1, skipped       # only the one that needs a real scheduler


def test_an_unknown_label_is_named_with_the_closest_labels_not_all_of_them(capsys) -> None:
    """The README's old topology example (a label fig7_mnist no longer has) used to print all 136 labels on one line."""
    assert main(["topology", "fig7_mnist", "--run", "CodedSecAgg z=1 N=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "136 labels, 4 starting with 'CodedSecAgg z=1 N=8': [" in err
    assert "'CodedSecAgg z=1 N=8 relay_steps fednet'" in err and len(err) < 600
    assert main(["run", "fig7_mnist", "--runs", "CodedSecAgg z=1 N=8", "--epochs", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "136 labels, 4 starting with" in err and len(err) < 800
