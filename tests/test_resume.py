"""Checkpoint and ``--resume``: an interrupted study keeps its finished (run, seed) pairs, and the resumed
run writes the uninterrupted run's outputs byte for byte (fednet.study.checkpoint)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import fednet.study.runner as runner
from fednet.cli import main
from fednet.errors import ConfigError, OutputError
from fednet.study.checkpoint import CHECKPOINT
from fednet.study.config import load_study

from test_parallel import SMALL  # noqa: E402

_RUN_ONE = runner._run_one
FILES = ["summary.json", "Conventional_FL/trace.csv", "Conventional_FL_drop_1/trace.csv"]


def _study(tmp_path: Path, epochs: int = 4):
    """test_parallel's two-run, two-seed study (a feature draw per seed), with ``epochs`` rounds."""
    path = tmp_path / f"small{epochs}.toml"
    path.write_text(SMALL.format(fs="per_seed").replace("epochs = 4", f"epochs = {epochs}"))
    return load_study(path)


def _counting(monkeypatch, fail_at: int | None = None) -> list[tuple[str, int]]:
    """Wrap the runner's ``_run_one``: record each (run, seed) it runs; raise KeyboardInterrupt at call ``fail_at``."""
    calls: list[tuple[str, int]] = []

    def run_one(study, run, seed, task, on_round):
        if fail_at is not None and len(calls) + 1 == fail_at:
            raise KeyboardInterrupt
        calls.append((run.name, seed))
        return _RUN_ONE(study, run, seed, task, on_round)

    monkeypatch.setattr(runner, "_run_one", run_one)
    return calls


def _checkpoint(out: Path) -> Path:
    return out.parent / f".{out.name}{CHECKPOINT}"


def _interrupt_after_two(tmp_path: Path, monkeypatch, out: Path) -> None:
    _counting(monkeypatch, fail_at=3)
    with pytest.raises(KeyboardInterrupt):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False)
    assert not out.exists()                                              # no half-written output
    assert sorted(p.name for p in _checkpoint(out).glob("run*.json")) == ["run0-seed0.json", "run1-seed0.json"]


def test_resume_runs_only_the_rest_and_writes_the_uninterrupted_outputs(tmp_path, monkeypatch) -> None:
    ref = tmp_path / "ref"
    runner.run_study(_study(tmp_path), ref, progress=False, plot=False)
    assert not _checkpoint(ref).exists()                                  # removed once the output is in place
    out = tmp_path / "out"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    calls = _counting(monkeypatch)
    assert main(["run", str(tmp_path / "small4.toml"), "--out", str(out), "--quiet", "--resume"]) == 0
    assert calls == [("Conventional FL", 1), ("Conventional FL, drop 1", 1)]       # a feature draw per seed
    for name in FILES:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    timing = json.loads((out / "timing.json").read_text())
    assert timing["resumed"] == [["Conventional FL", 0], ["Conventional FL, drop 1", 0]]
    assert "resumed" not in json.loads((ref / "timing.json").read_text())
    assert not _checkpoint(out).exists()


def test_without_resume_the_checkpoint_is_discarded_with_a_warning(tmp_path, monkeypatch, caplog) -> None:
    out = tmp_path / "out"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    calls = _counting(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="fednet.study.checkpoint"):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False)
    assert len(calls) == 4
    assert "discarding 2 finished" in caplog.text
    assert not _checkpoint(out).exists()


def test_resume_refuses_another_study_and_keeps_the_checkpoint(tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    before = sorted(p.name for p in _checkpoint(out).iterdir())
    with pytest.raises(ConfigError, match="another study"):
        runner.run_study(_study(tmp_path, epochs=5), out, progress=False, plot=False, resume=True)
    assert sorted(p.name for p in _checkpoint(out).iterdir()) == before
    assert not out.exists()


def test_a_foreign_folder_at_the_checkpoint_path_is_refused_and_left_alone(tmp_path) -> None:
    out = tmp_path / "out"
    foreign = _checkpoint(out)
    foreign.mkdir()
    (foreign / "mine.txt").write_text("user data")
    with pytest.raises(OutputError, match="did not write it"):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False)
    assert (foreign / "mine.txt").read_text() == "user data"


def test_resume_needs_an_output_folder(tmp_path) -> None:
    with pytest.raises(ConfigError, match="out_dir"):
        runner.run_study(_study(tmp_path), None, progress=False, resume=True)


def test_parallel_skips_finished_pairs_and_reports_each_new_one(client, tmp_path) -> None:
    from fednet.study.parallel import simulate_parallel

    study = _study(tmp_path)
    serial = runner.run_study(study, None, progress=False)
    first = serial.traces["Conventional FL"][0]
    finished = {(0, 0): {"rows": first, "wall_s": 1.0, "data_s": 2.0, "feature_seed": 0}}
    done: list[tuple[int, int]] = []
    traces, wall, _, _ = simulate_parallel(study, client=client, progress=False, finished=finished,
                                           on_done=lambda i, seed, rec: done.append((i, seed)))
    assert sorted(done) == [(0, 1), (1, 0), (1, 1)]
    assert traces["Conventional FL"][0] is first and wall["Conventional FL"][0] == 1.0
    assert json.dumps(traces) == json.dumps(serial.traces)
