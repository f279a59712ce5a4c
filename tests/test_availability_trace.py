"""Availability from a trace of per-device on/off times (issue 30, item 7; fednet.sim.availability_trace)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fednet.errors import ConfigError
from fednet.sim.availability_trace import TraceAvailability, read_availability_trace
from fednet.study.config import StudyError, load_study
from fednet.study.runner import run_study


def test_on_off_intervals_are_half_open_and_unlisted_devices_are_always_on():
    t = TraceAvailability({0: [(10.0, 20.0), (0.0, 5.0)], 2: [(3.0, math.inf)]}, n_devices=4)
    assert [t.on(0, s) for s in (0.0, 4.999, 5.0, 9.0, 10.0, 19.99, 20.0, 1e9)] == \
        [True, True, False, False, True, True, False, False]
    assert [t.on(2, s) for s in (0.0, 2.999, 3.0, 1e12)] == [False, False, True, True]
    assert all(t.on(1, s) for s in (0.0, 7.0, 1e9))          # not listed: always on
    clock = [0.0]
    t.bind(lambda: clock[0])
    assert t.available(0, 1, None) is True
    clock[0] = 7.0
    assert t.available(0, 1, None) is False                   # the time, not the round, decides


@pytest.mark.parametrize("intervals, needle", [
    ({0: [(5.0, 5.0)]}, "0 <= on_s < off_s"),
    ({0: [(-1.0, 5.0)]}, "0 <= on_s < off_s"),
    ({0: [(math.nan, 5.0)]}, "0 <= on_s < off_s"),
    ({0: [(0.0, 5.0), (4.0, 8.0)]}, "overlap"),
    ({4: [(0.0, 1.0)]}, "device 4"),
    ({-1: [(0.0, 1.0)]}, "device -1"),
])
def test_bad_intervals_are_named(intervals, needle):
    with pytest.raises(ConfigError, match=needle):
        TraceAvailability(intervals, n_devices=4)


def test_one_model_serves_one_simulation():
    t = TraceAvailability({})
    t.bind(lambda: 0.0)
    with pytest.raises(ValueError, match="one simulation"):
        t.bind(lambda: 1.0)
    with pytest.raises(RuntimeError, match="not bound"):
        TraceAvailability({}).available(0, 0, None)


@pytest.mark.parametrize("text, needle", [
    ("dev,on,off\n0,0,1\n", "header device,on_s,off_s"),
    ("", "header"),
    ("device,on_s,off_s\n0,0\n", "line 2: expected 3 fields"),
    ("device,on_s,off_s\n# a comment\nx,0,1\n", "line 3: 'x,0,1' is not an integer"),
    ("device,on_s,off_s\n0,3,1\n", "0 <= on_s < off_s"),
])
def test_trace_file_errors_name_file_and_line(tmp_path, text, needle):
    p = tmp_path / "trace.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=needle) as e:
        read_availability_trace(p, 4)
    assert "trace.csv" in str(e.value)


def test_trace_file_reads_inf_and_comments(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("# on/off times\ndevice,on_s,off_s\n1,0,2.5\n1, 10 ,inf\n")
    t = read_availability_trace(p, 3)
    assert [t.on(1, s) for s in (0, 2.5, 10, 1e9)] == [True, False, True, True]


STUDY = """
name = "trace"
seeds = [0]
targets = [0.5]
epochs = 6
run_to_end = true

[data]
dataset = "digits"
n_components = 64

[network]
n_devices = 6
compute = "deterministic"
availability = "trace"
availability_trace = "{trace}"

[[runs]]
label = "Conventional FL"
protocol = "conventional"
params = {{ minibatch_fraction = 0.5, drop_slowest = 2 }}   # waits for D - 2 = 4 of the 6
"""


def _study(tmp_path: Path, trace_rows: str, name: str = "on_off.csv") -> Path:
    (tmp_path / name).write_text("device,on_s,off_s\n" + trace_rows)
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(trace=name))
    return study


def test_a_round_uses_the_devices_on_when_it_starts(tmp_path, monkeypatch):
    """Device 1 is never on; device 0 is on until ``t1``, between the ends of rounds 2 and 3 of the run without
    device 1: a round drops device 0 exactly when it starts (the previous row's time) at or after ``t1``, and always
    device 1; the trace file is found
    beside the study from another working folder and its SHA-256 is in the provenance."""
    probe = run_study(load_study(_study(tmp_path, "1,0,0.001\n")), None, progress=False).frames().rounds
    t1 = float(probe.time_s.iloc[2] + probe.time_s.iloc[3]) / 2
    study_file = _study(tmp_path, f"0,0,{t1!r}\n1,1e9,inf\n")
    monkeypatch.chdir(tmp_path.parent)
    study = load_study(study_file)
    assert study.network.availability_trace == str((tmp_path / "on_off.csv").resolve())
    out = tmp_path / "out"
    run_study(study, out, progress=False, plot=False)
    rows = run_study(study, None, progress=False).frames().rounds
    rows = rows[rows.event == "round"].reset_index(drop=True)
    starts = [0.0] + list(rows.time_s[:-1])
    off_0 = [0 in list(d) for d in rows.dropped]
    assert off_0 == [s >= t1 for s in starts]
    assert True in off_0 and False in off_0
    assert all(1 in list(d) for d in rows.dropped) and not any(1 in list(u) for u in rows.used)
    assert not rows.decode_failed.any()
    prov = json.loads((out / "provenance.json").read_text())
    assert list(prov["availability_traces"]) == [str((tmp_path / "on_off.csv").resolve())]
    assert len(prov["availability_traces"][str((tmp_path / "on_off.csv").resolve())]) == 64


@pytest.mark.parametrize("network, needle", [
    ('availability = "trace"', "go together"),
    ('availability_trace = "on_off.csv"', "go together"),
    ('availability = "trace"\navailability_trace = "missing.csv"', "no file 'missing.csv'"),
    ('availability = "trace"\navailability_trace = "on_off.csv"\ndropout = 0.1', "exclude each other"),
    ('availability = "trace"\navailability_trace = "on_off.csv"\nn_devices = 2', "device 5"),
])
def test_study_errors_name_the_key(tmp_path, network, needle):
    (tmp_path / "on_off.csv").write_text("device,on_s,off_s\n5,0,1\n")
    text = STUDY.split("[network]")[0] + "[network]\n" + network + "\n" + STUDY.split('availability_trace = "{trace}"')[1]
    text = text.replace("{{", "{").replace("}}", "}")
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(StudyError, match=needle):
        load_study(f)
