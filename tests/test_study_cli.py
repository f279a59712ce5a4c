"""Study files, the CLI, and bad input: clear errors, no partial result directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fednet.cli import bundled_studies, main
from fednet.study.config import StudyError, load_study
from fednet.study.results import mean_ci, summarize, time_to_target

MINI = """
name = "mini"
seeds = [0]
targets = [0.9]
epochs = 5
[data]
dataset = "digits"
n_components = 300
[network]
n_devices = 5
[[runs]]
protocol = "conventional"
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("edit,needle", [
    (("[network]", "[network]\nuplink_bps = -5.0"), "network.uplink_bps: Input should be greater than or equal to 1 (got -5.0)"),
    (("[network]", "[network]\nloss = 1.0"), "network.loss: Input should be less than or equal to 0.999 (got 1.0)"),
    (("[network]", "[network]\nlos = 0.1"), "network.los: Extra inputs are not permitted"),
    (('protocol = "conventional"', 'protocol = "conventional"\nparams = { drop_slowest = 5 }'),
     "drop_slowest must be less than the number of devices (5), got 5"),
    (('protocol = "conventional"', 'protocol = "conventional"\nparams = { dropslowest = 1 }'),
     "params.dropslowest: Extra inputs are not permitted"),
    (('protocol = "conventional"', 'protocol = "nope"'), "unknown protocol 'nope'"),
    (("targets = [0.9]", "targets = [90]"), "targets must be accuracies in (0, 1]"),
])
def test_bad_study_is_refused_with_named_error_and_no_output(tmp_path, capsys, edit, needle) -> None:
    path = write(tmp_path, MINI.replace(*edit, 1))
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert needle in str(err.value)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["s.toml"]


def test_missing_and_corrupted_data_files_are_refused(tmp_path, capsys, monkeypatch, data_dir) -> None:
    study = write(tmp_path, MINI.replace('dataset = "digits"', 'dataset = "mnist"'))
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FEDNET_DATA_URL", (tmp_path / "nowhere").as_uri())
    out = tmp_path / "out"
    assert main(["run", str(study), "--out", str(out), "--quiet", "--data-dir", str(empty)]) == 2
    assert "mnist" in capsys.readouterr().err
    assert not out.exists()

    bad = tmp_path / "bad"
    shutil.copytree(data_dir / "mnist", bad / "mnist")
    target = bad / "mnist" / "t10k-labels-idx1-ubyte.gz"
    target.chmod(0o644)
    raw = bytearray(target.read_bytes())
    raw[100] ^= 0xFF
    target.write_bytes(bytes(raw))
    assert main(["run", str(study), "--out", str(out), "--quiet", "--data-dir", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "t10k-labels-idx1-ubyte.gz" in err and "SHA-256" in err.upper().replace("SHA256", "SHA-256")
    assert not out.exists()


def test_quickstart_runs_and_writes_results(tmp_path, capsys) -> None:
    out = tmp_path / "qs"
    assert main(["run", "quickstart", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "Conventional FL" in table and "time to 97%" in table
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["runs"]["Conventional FL"]["per_target"]["0.97"]
    assert entry["reached"] == "1/1" and entry["time_s"]["0"] > 0
    assert (out / "accuracy_vs_time.png").stat().st_size > 10_000
    header = (out / "Conventional_FL" / "trace.csv").read_text().splitlines()[0].split(",")
    for col in ["protocol", "seed", "round", "time_s", "accuracy", "bits_up", "bits_down", "device_macs",
                "server_macs"]:
        assert col in header
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_list_names_protocols_topologies_and_studies(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "conventional" in out and "lte_star" in out and "quickstart" in out
    assert {"quickstart", "conventional_mnist"} <= set(bundled_studies())


def test_every_bundled_study_validates() -> None:
    for name, path in bundled_studies().items():
        load_study(path)


def test_summary_statistics() -> None:
    rows = [{"round": i, "time_s": t, "accuracy": a} for i, (t, a) in enumerate([(0.0, 0.1), (2.0, 0.8), (5.0, 0.95)])]
    assert time_to_target(rows, 0.8) == 2.0 and time_to_target(rows, 0.99) is None
    st = mean_ci([1.0, 2.0, 3.0])
    assert st["mean"] == 2.0 and st["ci_low"] == pytest.approx(2 - 4.302652729911275 / 3 ** 0.5)
    slow = [{"round": 0, "time_s": 0.0, "accuracy": 0.1}, {"round": 1, "time_s": 10.0, "accuracy": 0.96}]
    s = summarize({"a": {0: rows, 1: rows}, "b": {0: slow, 1: slow}}, [0.95], baseline="b")
    assert s["runs"]["a"]["per_target"]["0.95"]["speedup"] == {"0": 2.0, "1": 2.0}


def test_run_to_end_disables_early_stop(tmp_path) -> None:
    study = load_study(write(tmp_path, MINI))
    assert study.stop_accuracy == 0.9
    assert load_study(write(tmp_path, MINI.replace("epochs = 5", "epochs = 5\nrun_to_end = true"))).stop_accuracy is None


@pytest.mark.backends
def test_explain_engine_prints_each_runs_paths_and_timing_json_holds_them(tmp_path, capsys) -> None:
    """``fednet run ... --explain-engine``: per run and step, the backend that ran it or why the reference did; the
    same counts are in ``timing.json``'s ``engine`` section (host facts: summary.json and the traces do not change)."""
    out = tmp_path / "qs"
    assert main(["run", "quickstart", "--seed", "0", "--epochs", "3", "--out", str(out), "--quiet",
                 "--explain-engine"]) == 0
    printed = capsys.readouterr().out
    assert "engine paths" in printed and "Conventional FL:" in printed and "gather 'gradient'" in printed
    engine = json.loads((out / "timing.json").read_text())["engine"]
    assert set(engine) == set(json.loads((out / "summary.json").read_text())["runs"])
    steps = engine["Conventional FL"]["steps"]
    assert any(row["kind"] == "gather" and row["path"] in ("gather", "batched") and row["count"] > 0 for row in steps)
