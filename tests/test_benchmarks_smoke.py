"""Every benchmark runs (issue 32, item 3): the reduced command its module docstring documents, exit status 0.

Each ``benchmarks/bench_*.py`` documents, besides its full ``Run:`` command, a ``Smoke (...): ``CMD``.`` line: the same
command with small sizes.  Here each runs as written (the literal may wrap lines), from the repository root, with this
interpreter in place of ``.venv/bin/python`` and this checkout first on ``PYTHONPATH`` (so the ``fednet`` it imports
is this one, as in a checkout's own ``.venv``), one BLAS thread.  A benchmark without such a line fails the test, so a
new one cannot go untested; one that needs the MNIST / Fashion-MNIST files skips where ``$FEDNET_DATA`` is unset.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))

#: Benchmarks that read the original data sets (``$FEDNET_DATA``).
NEEDS_DATA = {"bench_fedvs_round.py", "bench_torch_baselines.py"}


def smoke_command(path: Path) -> list[str]:
    """The argv of a benchmark's documented reduced command (``Smoke ...: ``CMD````), interpreter replaced.

    Raises
    ------
    AssertionError
        If the module docstring has no such command, or it does not run this very file.
    """
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    m = re.search(r"^Smoke\b[^`]*``(.+?)``", doc, re.M | re.S)
    assert m, f"{path.name}: its docstring documents no 'Smoke (...): ``command``' line"
    argv = shlex.split(" ".join(m.group(1).split()))
    assert argv[0].endswith("python") and argv[1] == f"benchmarks/{path.name}", argv
    return [sys.executable, *argv[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_smoke_command_runs(path: Path) -> None:
    argv = smoke_command(path)
    if path.name in NEEDS_DATA and not (Path(os.environ.get("FEDNET_DATA", "/nonexistent")) / "mnist").is_dir():
        pytest.skip("needs $FEDNET_DATA (the MNIST / Fashion-MNIST files)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS="1")
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{shlex.join(argv)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


def test_every_benchmark_documents_a_smoke_command() -> None:
    assert BENCHMARKS
    for path in BENCHMARKS:
        smoke_command(path)


def test_bench_scale_cells_without_a_result_say_why(monkeypatch) -> None:
    """A cell that runs out of time, or that the protocol refuses, is a reason in the table, not a crash."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    import bench_scale

    kw = dict(epochs=1, d=4, n=4, c=2, memory_bytes=8 << 30)
    assert bench_scale.measure_cell("conventional", 10, limit_s=0.05, **kw)["reason"] == "time limit (0 s)"
    refused = bench_scale.measure_cell("codedsecagg", 30, limit_s=120, **kw)    # 8 groups do not divide 30 devices
    assert refused["reason"].startswith("ConfigError: ") and "groups" in refused["reason"]
