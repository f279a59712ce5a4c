"""Steering studies (--set, --epochs, --runs, --targets, sweeps), discoverability, tidy results,
honest statistics, the feature draw as a random factor, and reproducible strict summary.json."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fednet.protocol import registry
from scipy import stats

from fednet import __version__
from fednet.cli import main
from fednet.learning.datasets import DatasetError, load_dataset
from fednet.study.config import StudyError, load_study
from fednet.study.results import format_per_seed, load_results, log_interval, mean_ci, summarize
from fednet.study.runner import run_study

ROOT = Path(__file__).resolve().parents[1]

MINI = """
name = "mini"
seeds = [0, 1]
targets = [0.5, 0.99]
baseline = "conv"
epochs = 4
[data]
dataset = "digits"
n_components = 100
[network]
n_devices = 5
[[runs]]
label = "conv"
protocol = "conventional"
[[runs]]
label = "drop1"
protocol = "conventional"
params = { drop_slowest = 1 }
"""

# CodedPaddedFL in timing mode follows full-batch GD exactly (Prop. 3): its crossing round depends on
# the data and the feature draw only, so a change of crossing round between seeds is the feature draw's.
FDRAW = """
name = "fdraw"
seeds = [0, 1]
targets = [0.95]
epochs = 150
[data]
dataset = "digits"
n_components = 200
feature_seed = "per_seed"
[network]
n_devices = 5
[[runs]]
label = "GD"
protocol = "codedpaddedfl"
params = { alpha = 2, mode = "timing" }
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- steering ------------------------------------------------------------------------------------

def test_set_with_a_bad_value_names_the_key_and_value(tmp_path, capsys) -> None:
    path = write(tmp_path, MINI)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--set", "network.loss=2.5"]) == 2
    err = capsys.readouterr().err
    assert "network.loss: Input should be less than or equal to 0.999 (got 2.5)" in err and "--set network.loss=2.5" in err
    assert main(["run", str(path), "--out", str(out), "--quiet", "--set", "runs.1.params.drop_slowest=-3"]) == 2
    err = capsys.readouterr().err
    assert "runs[1] (drop1).params.drop_slowest: Input should be greater than or equal to 0 (got -3)" in err
    with pytest.raises(StudyError, match=r"network.uplnk_bps: Extra inputs are not permitted \(did you mean 'uplink_bps'\?\)"):
        load_study(path, sets=["network.uplnk_bps=1e6"])
    with pytest.raises(StudyError, match="expected key.path=value"):
        load_study(path, sets=["network.loss"])
    with pytest.raises(StudyError, match=r"no run labelled 'conb' \(did you mean 'conv'\?\)"):
        load_study(path, sets=["runs.conb.epochs=3"])
    assert not out.exists()


def test_set_values_and_python_overrides_merge_deeply(tmp_path) -> None:
    path = write(tmp_path, MINI)
    # (a dropout needs drop_slowest >= ceil(D * dropout) in every conventional run: issue 14's cross-check)
    s = load_study(path, sets=["network.dropout=0.2", "runs.drop1.params.drop_slowest=2",
                               "runs.conv.params.drop_slowest=1",
                               'runs.*.params.element_bits=16', "data.feature_seed=per_seed"])
    assert s.network.dropout == 0.2 and s.network.n_devices == 5
    assert s.runs[1].params == {"drop_slowest": 2, "element_bits": 16}
    assert s.runs[0].params == {"drop_slowest": 1, "element_bits": 16}
    assert s.data.feature_seed == "per_seed"
    s = load_study(path, sets=['runs."drop1".params={ drop_slowest = 3, minibatch_fraction = 0.5 }'])
    assert s.runs[1].params == {"drop_slowest": 3, "minibatch_fraction": 0.5}
    labelled = MINI.replace('label = "drop1"', 'label = "drop a=1.5"')
    s = load_study(write(tmp_path, labelled, "l.toml"), sets=['runs."drop a=1.5".params.drop_slowest=2'])
    assert s.runs[1].params == {"drop_slowest": 2}
    # Python overrides merge tables key by key (n_devices and n_components survive)
    s = load_study(path, network={"dropout": 0.1}, data={"partition": "iid"}, seeds=[7],
                   sets=["runs.conv.params.drop_slowest=1"])
    assert (s.network.dropout, s.network.n_devices, s.data.n_components, s.data.partition, s.seeds) == (
        0.1, 5, 100, "iid", [7])


def test_epochs_runs_and_targets_from_the_command_line(tmp_path, capsys) -> None:
    path = write(tmp_path, MINI.replace('params = { drop_slowest = 1 }', 'params = { drop_slowest = 1 }\nepochs = 9'))
    s = load_study(path, max_epochs=2, only_runs=["drop1"], targets=[0.6])
    assert [r.name for r in s.runs] == ["conv", "drop1"]  # the baseline stays for the speed-ups
    assert [s.run_epochs(r) for r in s.runs] == [2, 2] and s.targets == [0.6]
    with pytest.raises(StudyError, match=r"no run labelled 'drop' \(did you mean 'drop1'\?\)"):
        load_study(path, only_runs=["drop"])
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--epochs", "2", "--runs", "conv",
                 "--targets", "0.3", "0.4", "--seed", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == ["conv"] and summary["targets"] == [0.3, 0.4]
    assert summary["runs"]["conv"]["last_round"] == {"1": 2} or summary["runs"]["conv"]["last_round"]["1"] <= 2
    assert "time to 30% [s]" in capsys.readouterr().out


def test_stop_at_never_hides_a_requested_target(tmp_path) -> None:
    path = write(tmp_path, MINI.replace("epochs = 4", "epochs = 4\nstop_at = 0.5"))
    assert load_study(path).stop_accuracy == 0.99
    assert load_study(path, targets=[0.3]).stop_accuracy == 0.5
    assert load_study(path, targets=[0.97]).stop_accuracy == 0.97


def test_sweep_expands_into_labelled_runs(tmp_path) -> None:
    text = MINI.replace('label = "drop1"', 'label = "drop"\nsweep = { drop_slowest = [0, 1, 2], minibatch_fraction = [0.2, 0.5] }')
    s = load_study(write(tmp_path, text))
    labels = [r.name for r in s.runs]
    assert labels[:3] == ["conv", "drop drop_slowest=0, minibatch_fraction=0.2", "drop drop_slowest=0, minibatch_fraction=0.5"]
    assert len(labels) == 1 + 6 and s.runs[-1].params == {"drop_slowest": 2, "minibatch_fraction": 0.5}
    text = MINI.replace('label = "drop1"', 'label = "drop {drop_slowest}"\nsweep = { drop_slowest = [1, 2] }')
    assert [r.name for r in load_study(write(tmp_path, text)).runs] == ["conv", "drop 1", "drop 2"]
    bad = MINI.replace('label = "drop1"', 'label = "drop"\nsweep = { drop_slowest = [1, 9] }')
    with pytest.raises(StudyError, match=r"runs\[2\] \(drop drop_slowest=9\).params: drop_slowest must be less"):
        load_study(write(tmp_path, bad))


# -- discoverability -------------------------------------------------------------------------------

def test_every_problem_of_a_file_is_reported_at_once_one_per_line(tmp_path) -> None:
    text = MINI.replace("n_devices = 5", "n_devices = 5\nlos = 0.1\nuplink_bps = -1").replace(
        'protocol = "conventional"\n[[runs]]', 'protocol = "conventonal"\n[[runs]]').replace(
        "drop_slowest = 1", "drop_slowst = 1")
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, text))
    lines = str(err.value).splitlines()[1:]
    assert lines == [
        "  network.uplink_bps: Input should be greater than or equal to 1 (got -1)",
        "  network.los: Extra inputs are not permitted (did you mean 'loss'?)",
        f"  runs[0] (conv): unknown protocol 'conventonal'; registered: {', '.join(registry.names())} "
        "(or name a class as 'package.module:Class') (did you mean 'conventional'?)",
        "  runs[1] (drop1).params.drop_slowst: Extra inputs are not permitted (did you mean 'drop_slowest'?)",
    ]


def test_describe_schema_and_version(capsys) -> None:
    assert main(["describe", "codedpaddedfl"]) == 0
    out = capsys.readouterr().out
    assert "  k : int = 48; >= 8, <= 62\n      The fixed-point format ``Q<k,f>``" in out
    assert "  alpha : int = required; >= 1" in out
    assert "sharing_schedule : Literal['relay_steps', 'relay_asap', 'upload_once'] = 'relay_steps'" in out
    assert main(["describe", "conventinal"]) == 2
    assert "did you mean 'conventional'?" in capsys.readouterr().err
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"runs", "targets", "data", "network"} <= set(schema["properties"])
    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.strip() == f"fednet {__version__}"


# -- honest statistics -------------------------------------------------------------------------------

def _rows(times_acc):
    return [{"round": i, "time_s": t, "accuracy": a} for i, (t, a) in enumerate(times_acc)]


def test_speedup_interval_from_three_positive_paired_times_is_positive() -> None:
    base = {0: 10.0, 1: 20.0, 2: 30.0}
    run = {0: 12.0, 1: 5.0, 2: 40.0}
    traces = {"b": {s: _rows([(0.0, 0.1), (t, 0.9)]) for s, t in base.items()},
              "a": {s: _rows([(0.0, 0.1), (t, 0.9)]) for s, t in run.items()}}
    s = summarize(traces, [0.9], "b")
    e = s["runs"]["a"]["per_target"]["0.9"]
    ratios = [base[k] / run[k] for k in range(3)]
    assert e["speedup"] == {"0": ratios[0], "1": ratios[1], "2": ratios[2]}
    st = e["speedup_stats"]
    assert 0 < st["ci_low"] < st["geomean"] < st["ci_high"]
    ci = stats.ttest_1samp(np.log(ratios), 0).confidence_interval(0.95)
    assert st["ci_low"] == pytest.approx(math.exp(ci.low)) and st["ci_high"] == pytest.approx(math.exp(ci.high))
    assert st["geomean"] == pytest.approx(stats.gmean(ratios))
    assert mean_ci(ratios)["ci_low"] < 0  # the arithmetic interval the summaries no longer use goes negative
    t = e["time_s_stats"]
    assert 0 < t["ci_low"] < t["geomean"] < t["ci_high"] and t["geomean"] == pytest.approx(stats.gmean(list(run.values())))
    # the reverse comparison is the reciprocal interval
    rev = summarize(traces, [0.9], "a")["runs"]["b"]["per_target"]["0.9"]["speedup_stats"]
    assert rev["geomean"] == pytest.approx(1 / st["geomean"]) and rev["ci_low"] == pytest.approx(1 / st["ci_high"])
    with pytest.raises(ValueError, match="finite positive"):
        log_interval([1.0, 0.0])


def test_not_reached_is_counted_null_with_a_reason_and_shown() -> None:
    traces = {"b": {0: _rows([(0.0, 0.1), (5.0, 0.9)]), 1: _rows([(0.0, 0.1), (6.0, 0.9)])},
              "a": {0: _rows([(0.0, 0.1), (2.0, 0.9)]), 1: _rows([(0.0, 0.1), (3.0, 0.7)])}}
    s = summarize(traces, [0.9], "b")
    e = s["runs"]["a"]["per_target"]["0.9"]
    assert e["time_s"] == {"0": 2.0, "1": None} and e["reached"] == "1/2" and e["n_reached"] == 1
    assert e["not_reached"] == {"1": "max test accuracy 0.7000 < 0.9 in 1 rounds"}
    assert e["time_s_stats"] is None and e["time_s_stats_reason"] == "reached by 1 of 2 seeds"
    assert e["speedup_stats"] is None and e["speedup"] == {"0": 2.5, "1": None}
    from fednet.study.results import format_summary

    table = format_summary(s)
    assert "2 (1/2)" in table and "2.5 (1/2)" in table and "test acc, last" in table


# -- tidy results, reproducibility ---------------------------------------------------------------------

def test_summary_json_is_strict_and_byte_identical_across_runs(tmp_path) -> None:
    path = write(tmp_path, MINI)
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    a, b = ((o / "summary.json").read_bytes() for o in outs)
    assert a == b

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    summary = json.loads(a, parse_constant=refuse)
    e = summary["runs"]["conv"]["per_target"]["0.99"]
    assert e["time_s"] == {"0": None, "1": None} and set(e["not_reached"]) == {"0", "1"}
    assert "wall" not in a.decode()
    timing = json.loads((outs[0] / "timing.json").read_text())
    assert set(timing["runs"]["conv"]) == {"0", "1"} and timing["total_s"] > 0
    prov = json.loads((outs[0] / "provenance.json").read_text())
    assert prov["fednet"] == __version__ and prov["command"].startswith("fednet run ")
    assert set(prov["packages"]) >= {"numpy", "torch", "galois", "simpy"} and prov["packages"]["numpy"] == np.__version__


def test_load_results_round_trips_a_run(tmp_path) -> None:
    pd = pytest.importorskip("pandas", reason="pandas (a fednet dependency) is not installed in this environment")
    study = load_study(write(tmp_path, MINI))
    mem = run_study(study, None, progress=False)
    assert mem.out_dir is None and [p.name for p in tmp_path.iterdir()] == ["s.toml"]
    written = run_study(study, tmp_path / "out", progress=False, plot=False)
    import fednet.study

    res = fednet.study.load_results(tmp_path / "out")
    frames = mem.frames()
    assert len(res.rounds) == sum(len(r) for by in mem.traces.values() for r in by.values())
    assert list(res.rounds.columns[:4]) == ["run", "seed", "round", "time_s"]
    pd.testing.assert_frame_equal(res.rounds[frames.rounds.columns], frames.rounds, check_dtype=False)
    pd.testing.assert_frame_equal(res.targets, frames.targets)
    assert len(res.targets) == 2 * 2 * 2  # run x seed x target
    row = res.targets.query("run == 'drop1' and seed == 1 and target == 0.5").iloc[0]
    assert row["time_s"] == written.summary["runs"]["drop1"]["per_target"]["0.5"]["time_s"]["1"]
    listed = {"used", "dropped"}                                   # lists of ints in the tables, text in the CSV
    assert res.traces() == {k: {s: [{kk: [int(i) for i in vv.split()] if kk in listed else vv
                                     for kk, vv in r.items() if kk != "protocol"} for r in rows]
                                for s, rows in by.items()} for k, by in mem.traces.items()}
    assert all(isinstance(v, list) for v in res.rounds["used"]) and res.rounds["used"].iloc[-1]
    assert res.summary == written.summary


def test_summarize_and_plot_redraw_from_saved_results(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, MINI)), "--out", str(out), "--quiet"]) == 0
    first = capsys.readouterr().out
    (out / "accuracy_vs_time.png").unlink()
    assert main(["summarize", str(out)]) == 0
    again = capsys.readouterr().out
    table = first[first.index("run "):first.index("results in")].strip()
    assert table in again
    assert main(["summarize", str(tmp_path)]) == 2
    pytest.importorskip("pandas", reason="pandas (a fednet dependency) is not installed in this environment")
    assert main(["plot", str(out)]) == 0
    assert (out / "accuracy_vs_time.png").stat().st_size > 10_000


def test_feature_draw_per_seed_moves_the_crossing_and_the_summary_shows_both(tmp_path, capsys) -> None:
    per_seed = load_study(write(tmp_path, FDRAW))
    fixed = load_study(write(tmp_path, FDRAW), data={"feature_seed": 0})
    r_fixed = run_study(fixed, None, progress=False).summary["runs"]["GD"]["per_target"]["0.95"]["round"]
    res = run_study(per_seed, None, progress=False)
    e = res.summary["runs"]["GD"]["per_target"]["0.95"]
    assert r_fixed["0"] == r_fixed["1"]  # one feature draw: the GD trajectory is the same at both seeds
    assert e["round"]["0"] is not None and e["round"]["1"] is not None and e["round"]["0"] != e["round"]["1"]
    assert e["round"]["0"] == r_fixed["0"]  # seed 0 draws feature_seed 0
    assert res.summary["feature_seeds"] == {"0": 0, "1": 1}
    assert e["time_s_spread"] == pytest.approx(max(e["time_s"].values()) / min(e["time_s"].values()))
    text = format_per_seed(res.summary)
    assert f"round {e['round']['0']}," in text and f"round {e['round']['1']}," in text and "RFF 1" in text
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert f"round {e['round']['1']}," in capsys.readouterr().out


def test_runner_logs_instead_of_printing(tmp_path, caplog, capsys) -> None:
    study = load_study(write(tmp_path, MINI), seeds=[0])
    with caplog.at_level(logging.INFO, logger="fednet.study.runner"):
        run_study(study, None, progress=False)
    assert any("conv seed 0" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr().out == ""


def test_importing_fednet_does_not_choose_a_matplotlib_backend() -> None:
    code = ("import sys, fednet, fednet.cli, fednet.study.runner, fednet.study.plots, fednet.study.results; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'; "
            "import matplotlib; assert matplotlib.rcParams._get('backend') is matplotlib.rcsetup._auto_backend_sentinel")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr


def test_missing_dataset_without_url_fails_at_once(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FEDNET_DATA_URL", raising=False)

    def no_network(*a, **k):
        raise AssertionError("tried to download")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", tmp_path)
    msg = str(err.value)
    assert "4 data file(s) missing" in msg and "FEDNET_DATA_URL" in msg and "FEDNET_DATA" in msg
    assert not (tmp_path / "mnist").exists()


def test_progress_total_follows_early_stops(tmp_path, monkeypatch) -> None:
    import fednet.study.progress as progress
    import fednet.study.runner as runner

    made, seen = [], []

    class Spy(progress.StudyProgress):
        def set_status(self, text):
            seen.append(text)
            return super().set_status(text)

    def spy(study, **kw):
        made.append(progress.study_progress(study, **kw))
        made[-1].__class__ = Spy
        return made[-1]

    monkeypatch.setattr(runner, "study_progress", spy)
    study = load_study(write(tmp_path, FDRAW), seeds=[0, 1, 2])
    res = run_study(study, None, progress=True)
    rows = [len(r) for r in res.traces["GD"].values()]
    bar = made[0]
    # planned 3 x (150 + 1) rows, stopped early at 95 %: the rows expected of a pair follow the early stops
    assert max(rows) < 151 and bar.expect["GD"] == min(rows)
    assert bar.remaining() == 0 and bar.fraction() == 1.0 and len(bar.done) == 3   # the bar ends full
    assert any("loading digits" in p for p in seen)
