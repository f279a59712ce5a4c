"""Every study runs under one recorded secret seed (issue 31, item 5): ``secret_seed.json`` (mode 0600) beside the
public results, ``--secret-seed`` replays it, ``summary.json`` marks the runs whose numbers depend on it, and
``check_protocol`` refuses a protocol whose model depends on its secrets without saying so."""

from __future__ import annotations

import json
import stat

import pytest

from fednet.cli import main
from fednet.errors import ConfigError
from fednet.protocol import registry
from fednet.study.config import load_study
from fednet.study.runner import SECRET_FILE, run_study, study_secret_seed
from fednet.testing import check_protocol
from factories import make_task
from test_faults import study_text, write

RUNS = ('[[runs]]\nlabel = "plain"\nprotocol = "conventional"\nparams = {}\n'
        '[[runs]]\nlabel = "padded full"\nprotocol = "codedpaddedfl"\nparams = { alpha = 2, mode = "full" }\n')


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDNET_SECRET_SEED", raising=False)
    return load_study(write(tmp_path, study_text(runs=RUNS, epochs=3)))


def _trace(out, label: str) -> str:
    return (out / label.replace(" ", "_") / "trace.csv").read_text()


def test_the_secret_seed_is_recorded_privately_and_replays_the_runs(study, tmp_path) -> None:
    first = run_study(study, tmp_path / "a", progress=False, plot=False)
    record = tmp_path / "a" / SECRET_FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    doc = json.loads(record.read_text())
    seed = doc["secret_seed"]
    assert doc["source"] == "drawn" and isinstance(seed, int) and seed not in study.seeds
    assert first.secret_seed == seed
    for public in ("summary.json", "provenance.json", "timing.json", "study.json"):   # never in the public files
        assert str(seed) not in (tmp_path / "a" / public).read_text()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["runs"]["padded full"]["secret_dependent"] is True     # full mode's rounding of padded values
    assert "secret_dependent" not in summary["runs"]["plain"]

    again = run_study(study, tmp_path / "b", progress=False, plot=False, secret_seed=seed)
    assert again.secret_source == "--secret-seed"
    for label in ("plain", "padded full"):                                  # replayed bit for bit
        assert _trace(tmp_path / "b", label) == _trace(tmp_path / "a", label)
    other = run_study(study, tmp_path / "c", progress=False, plot=False, secret_seed=seed + 1)
    assert _trace(tmp_path / "c", "plain") == _trace(tmp_path / "a", "plain")
    assert _trace(tmp_path / "c", "padded full") != _trace(tmp_path / "a", "padded full")   # why it is recorded
    assert other.secret_seed == seed + 1


def test_precedence_and_refusals(study, monkeypatch) -> None:
    assert study_secret_seed(study, 77) == (77, "--secret-seed")
    monkeypatch.setenv("FEDNET_SECRET_SEED", "88")
    assert study_secret_seed(study) == (88, "FEDNET_SECRET_SEED")
    assert study_secret_seed(study, 77) == (77, "--secret-seed")
    monkeypatch.delenv("FEDNET_SECRET_SEED")
    resumed = {(0, 0): {"rows": [], "secret_seed": 99}, (1, 0): {"rows": [], "secret_seed": 99}}
    assert study_secret_seed(study, None, resumed) == (99, "checkpoint")
    with pytest.raises(ConfigError, match="differs from the one the checkpoint's finished pairs ran under"):
        study_secret_seed(study, 77, resumed)
    with pytest.raises(ConfigError, match="different secret seeds"):
        study_secret_seed(study, None, {(0, 0): {"secret_seed": 1}, (1, 0): {"secret_seed": 2}})
    with pytest.raises(ConfigError, match="must differ from the study's public seeds"):
        study_secret_seed(study, study.seeds[0])
    with pytest.raises(ConfigError, match="non-negative integer"):
        study_secret_seed(study, -3)
    drawn = {study_secret_seed(study)[0] for _ in range(3)}
    assert len(drawn) == 3                                                  # fresh OS entropy each time


def test_the_cli_replays_with_secret_seed(study, tmp_path, capsys) -> None:
    path = write(tmp_path, study_text(runs=RUNS, epochs=2), "cli.toml")
    assert main(["run", str(path), "--out", str(tmp_path / "x"), "--quiet", "--secret-seed", "12345"]) == 0
    assert json.loads((tmp_path / "x" / SECRET_FILE).read_text())["secret_seed"] == 12345
    assert "secret_seed.json" in capsys.readouterr().out
    assert main(["run", str(path), "--out", str(tmp_path / "y"), "--quiet", "--secret-seed", "0"]) == 2
    assert "must differ from the study's public seeds" in capsys.readouterr().err


def test_check_protocol_refuses_an_undeclared_dependence_on_secrets() -> None:
    padded = registry.get("codedpaddedfl")

    class Undeclared(padded):
        secrets_reach_model = False                      # but full mode rounds the secretly padded values

    with pytest.raises(AssertionError, match="secret_dependent"):
        check_protocol(Undeclared, {"alpha": 3, "mode": "full"}, task=make_task(D=8), rounds=3)
    assert padded.secret_dependent(padded.Config(alpha=3, mode="full"))
    assert not padded.secret_dependent(padded.Config(alpha=3, mode="timing"))
