"""Issue 33: no diverged run counts as a result; no planted file is trusted or overwritten.

One section per class of the issue's campaign:

1. non-finite training ends as a recorded failure (or a named error under ``strict``), never credited;
2. fednet's own bookkeeping paths (lock, marker, staging, checkpoint) never follow links;
3. checkpoints are data (JSON) with a digest, never unpickled;
4. protocol parameters are validated against the data and the field before anything runs;
5. environment faults (scheduler unreachable, read-only or full targets, broken plugins) end in one message.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import fednet.protocols  # noqa: F401  (registers the built-in protocols)
from fednet.cli import main
from fednet.errors import FednetError, TrainingFailure
from fednet.learning.field_models import FieldOverflowError
from fednet.protocol.base import Protocol
from fednet.protocols.conventional import ConventionalFL
from fednet.protocols.fedavg import FedAvg
from fednet.study.results import crossing, summarize

from factories import make_sim, make_task

REPO = Path(__file__).resolve().parents[1]


def study_text(*, top: str = "", data: str = "", network: str = "", training: str = "",
               protocol: str = "conventional", params: str = "{}", epochs: int = 4, n_devices: int = 6,
               targets: str = "[0.05, 0.5]") -> str:
    """A tiny study: digits, 40 random features, ``n_devices`` devices, ``epochs`` rounds."""
    return (f'name = "tiny"\nseeds = [0]\ntargets = {targets}\nepochs = {epochs}\nrun_to_end = true\n{top}\n'
            f'[data]\ndataset = "digits"\nn_components = 40\n{data}\n'
            f'[network]\nn_devices = {n_devices}\ncompute = "deterministic"\nloss = 0.0\n{network}\n'
            f'[training]\n{training}\n[[runs]]\nprotocol = "{protocol}"\nparams = {params}\n')


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def expect_cli_error(capsys, args: list[str], needle: str) -> str:
    """Run the CLI; assert exit 2, one ``fednet:`` message holding ``needle``, no traceback."""
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    assert "fednet: " in err
    return err


# ---------------------------------------------------------------------------------------------
# 1. Non-finite training
# ---------------------------------------------------------------------------------------------
class _Diverging(ConventionalFL):
    """Conventional FL whose model turns to NaN in round ``bad`` (name-less: not registered)."""

    bad = 3

    def round(self, epoch):
        yield from super().round(epoch)
        if epoch == self.bad:
            self.theta = self.theta.copy()
            self.theta[0, 0] = np.nan


class _Overflowing(ConventionalFL):
    """Conventional FL whose round 2 overflows its field."""

    def round(self, epoch):
        if epoch == 2:
            raise FieldOverflowError("integer gradient bound 2^300 does not fit the 200-bit prime")
        yield from super().round(epoch)


def test_a_nan_model_ends_training_as_a_recorded_failure() -> None:
    proto = _Diverging(make_sim(6, deterministic=True), make_task(D=6))
    rows = proto.run(8, strict=False)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]                  # no round after the failure
    last = rows[-1]
    assert "theta" in last["failure"] and "nan" in last["failure"]
    assert math.isnan(last["accuracy"])
    assert all("failure" not in r for r in rows[:-1])
    assert crossing(rows, 1e-9) == (rows[0]["time_s"], 0)              # before it: credited as usual
    late = [dict(r, accuracy=0.0) for r in rows[:-1]] + [dict(last, accuracy=1.0)]
    assert crossing(late, 0.5) is None                                 # at it: never credited


def test_a_nan_model_is_a_named_error_under_strict() -> None:
    proto = _Diverging(make_sim(6, deterministic=True), make_task(D=6))
    with pytest.raises(TrainingFailure, match=r"round 3: non-finite model parameter theta"):
        proto.run(8, strict=True)


def test_a_run_time_overflow_is_a_recorded_failure_with_its_round() -> None:
    proto = _Overflowing(make_sim(6, deterministic=True), make_task(D=6))
    rows = proto.run(5, strict=False)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert "overflowed" in rows[-1]["failure"] and "200-bit prime" in rows[-1]["failure"]
    assert rows[-1]["accuracy"] == rows[-2]["accuracy"]                 # the model before the round
    with pytest.raises(TrainingFailure, match="round 2: values overflowed"):  # FieldOverflowError: not yet named
        _Overflowing(make_sim(6, deterministic=True), make_task(D=6)).run(5, strict=True)


def test_a_model_evaluated_every_few_rounds_is_caught_at_the_round_it_diverged() -> None:
    class Bad(FedAvg):
        def round(self, epoch):
            yield from super().round(epoch)
            if epoch == 2:
                self.params = {k: v * np.inf for k, v in self.params.items()}

    task = make_task(D=6, n=20, d=6, c=3)
    proto = Bad(make_sim(6, deterministic=True), task, {"eval_every": 100, "hidden": [4], "batch_size": 8})
    rows = proto.run(6, strict=False)
    assert rows[-1]["round"] == 2 and "params[" in rows[-1]["failure"]


def test_summary_names_the_failed_round_and_credits_nothing_after_it() -> None:
    proto = _Diverging(make_sim(6, deterministic=True), make_task(D=6))
    rows = proto.run(8, strict=False)
    ok = ConventionalFL(make_sim(6, deterministic=True), make_task(D=6), label="ok").run(3, strict=False)
    s = summarize({"bad": {0: rows}, "ok": {0: ok}}, [0.99], None)
    assert s["runs"]["bad"]["failed"] == {"0": {"round": 3, "reason": rows[-1]["failure"]}}
    assert "training failed at round 3" in s["runs"]["bad"]["per_target"]["0.99"]["not_reached"]["0"]
    assert "failed" not in s["runs"]["ok"]
    assert math.isfinite(s["runs"]["bad"]["accuracy_last_round"]["0"])
    json.dumps(s, allow_nan=False)                                      # strict JSON still


def test_a_diverging_study_is_recorded_and_strict_is_exit_2(tmp_path, capsys) -> None:
    text = study_text(training="learning_rate = 1e6", epochs=30)
    out = tmp_path / "o"
    assert main(["run", str(write(tmp_path, text)), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    failed = summary["runs"]["conventional"]["failed"]["0"]
    assert "non-finite" in failed["reason"]
    trace = (out / "conventional" / "trace.csv").read_text().splitlines()
    assert trace[0].endswith(",failure") and len(trace) == failed["round"] + 2
    assert "training failed at round" in capsys.readouterr().out
    expect_cli_error(capsys, ["run", str(write(tmp_path, "strict = true\n" + text, "t.toml")), "--out",
                              str(tmp_path / "o2"), "--quiet"], "training failed at round")
    assert not (tmp_path / "o2").exists()


# ---------------------------------------------------------------------------------------------
# 2. fednet's own paths never follow links; 3. checkpoints are data with a digest
# ---------------------------------------------------------------------------------------------
from fednet.errors import ConfigError, OutputError  # noqa: E402
from fednet.study import runner  # noqa: E402
from fednet.study.checkpoint import CHECKPOINT, decode, encode  # noqa: E402
from fednet.study.output import MARKER, StagedOutput, check_output_target  # noqa: E402

from test_resume import _counting, _interrupt_after_two, _study  # noqa: E402


def _lock(out: Path) -> Path:
    return out.parent / f".{out.name}.fednet-lock"


def _ckpt(out: Path) -> Path:
    return out.parent / f".{out.name}{CHECKPOINT}"


def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(tmp_path, capsys) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("user data\n")
    out = tmp_path / "o"
    _lock(out).symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link"):
        with StagedOutput(out):
            pass
    assert victim.read_text() == "user data\n" and _lock(out).is_symlink() and not out.exists()
    text = study_text(epochs=1)
    expect_cli_error(capsys, ["run", str(write(tmp_path, text)), "--out", str(out), "--quiet"], "symbolic link")
    assert victim.read_text() == "user data\n"


def test_a_dangling_link_or_a_hard_link_or_a_user_file_at_the_lock_is_refused(tmp_path) -> None:
    out = tmp_path / "o"
    _lock(out).symlink_to(tmp_path / "would-be-created")
    with pytest.raises(OutputError, match="symbolic link"):
        StagedOutput(out).__enter__()
    assert not (tmp_path / "would-be-created").exists()
    _lock(out).unlink()
    victim = tmp_path / "precious.txt"
    victim.write_text("1234\n")
    os.link(victim, _lock(out))                         # a hard link: its content looks like a pid
    with pytest.raises(OutputError, match="hard links"):
        StagedOutput(out).__enter__()
    assert victim.read_text() == "1234\n"
    _lock(out).unlink()
    _lock(out).write_text("my notes, not a pid\n")
    with pytest.raises(OutputError, match="process id"):
        StagedOutput(out).__enter__()
    assert _lock(out).read_text() == "my notes, not a pid\n"


def test_a_marker_that_is_a_link_does_not_make_a_folder_fednets(tmp_path) -> None:
    real = tmp_path / "real-marker"
    real.write_text(json.dumps({"fednet": "output", "files": ["mine.txt"]}))
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("user data")
    (out / MARKER).symlink_to(real)
    with pytest.raises(OutputError, match="did not write"):
        check_output_target(out)
    assert (out / "mine.txt").read_text() == "user data"


def test_a_link_at_the_checkpoint_path_is_refused_and_its_target_kept(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n")
    (elsewhere / "study.json").write_text("{}")
    out = tmp_path / "o"
    _ckpt(out).symlink_to(elsewhere)
    with pytest.raises(OutputError, match="symbolic link"):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False)
    assert sorted(p.name for p in elsewhere.iterdir()) == [MARKER, "study.json"]


def test_a_planted_checkpoint_with_the_public_marker_and_foreign_files_is_not_emptied(tmp_path) -> None:
    out = tmp_path / "o"
    ck = _ckpt(out)
    ck.mkdir(mode=0o700)
    (ck / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n")
    (ck / "thesis.tex").write_text("user data")
    with pytest.raises(OutputError, match="thesis.tex"):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False)
    assert (ck / "thesis.tex").read_text() == "user data"


def test_a_checkpoint_open_to_other_users_is_refused(tmp_path, monkeypatch) -> None:
    out = tmp_path / "o"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    os.chmod(_ckpt(out), 0o777)
    with pytest.raises(OutputError, match="open to other users"):
        runner.run_study(_study(tmp_path), out, progress=False, plot=False, resume=True)


def test_checkpoint_records_are_json_with_a_key_and_never_pickles(tmp_path, monkeypatch) -> None:
    out = tmp_path / "o"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    ck = _ckpt(out)
    assert stat_mode(ck) == 0o700 and stat_mode(ck / "key") == 0o600
    doc = json.loads((ck / "run0-seed0.json").read_text())
    assert set(doc) == {"format", "digest", "record"} and doc["record"]["rows"][0]["round"] == 0


def stat_mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o777


class _Boom:
    """Pickling this runs code on load: it would create a file named ``PWNED`` in the working folder."""

    def __reduce__(self):
        return (open, ("PWNED", "w"))


@pytest.mark.parametrize("tamper", ["pickle", "forged", "swapped", "truncated", "link", "foreign_pair", "garbage"])
def test_a_tampered_checkpoint_is_refused_on_resume_by_name(tmp_path, monkeypatch, capsys, tamper) -> None:
    import pickle

    out = tmp_path / "o"
    _interrupt_after_two(tmp_path, monkeypatch, out)
    ck = _ckpt(out)
    a, b = ck / "run0-seed0.json", ck / "run1-seed0.json"
    if tamper == "pickle":
        (ck / "run0-seed1.pkl").write_bytes(pickle.dumps(_Boom()))
        needle = "pickle"
    elif tamper == "forged":
        doc = json.loads(a.read_text())
        doc["record"]["rows"][-1]["accuracy"] = 0.999
        a.write_text(json.dumps(doc))
        needle = "digest"
    elif tamper == "swapped":
        ta, tb = a.read_bytes(), b.read_bytes()
        a.write_bytes(tb)
        b.write_bytes(ta)
        needle = "digest"
    elif tamper == "truncated":
        a.write_bytes(a.read_bytes()[:100])
        needle = "not valid JSON"
    elif tamper == "link":
        target = tmp_path / "target.json"
        target.write_bytes(a.read_bytes())
        a.unlink()
        a.symlink_to(target)
        needle = "not a regular file"
    elif tamper == "foreign_pair":
        (ck / "run7-seed0.json").write_bytes(a.read_bytes())
        needle = "does not have"
    else:
        a.write_text(json.dumps({"format": "fednet-checkpoint-record/1", "digest": "0" * 64,
                                 "record": {"rows": [{"$np": "|O", "b64": ""}]}}))
        needle = "digest"
    monkeypatch.chdir(tmp_path)
    calls = _counting(monkeypatch)
    expect_cli_error(capsys, ["run", str(tmp_path / "small4.toml"), "--out", str(out), "--quiet", "--resume"],
                     needle)
    assert calls == [] and not out.exists() and not (tmp_path / "PWNED").exists()
    # without --resume the checkpoint (fednet's own, even tampered) is discarded and the study runs
    if tamper not in ("link",):
        assert main(["run", str(tmp_path / "small4.toml"), "--out", str(out), "--quiet"]) == 0
        assert not ck.exists() and not (tmp_path / "PWNED").exists()


def test_the_record_encoding_keeps_every_type_and_bit() -> None:
    row = {"a": 1, "b": 0.1, "c": float("nan"), "d": float("-inf"), "e": np.float32(0.1), "f": np.int64(7),
           "g": True, "h": None, "i": "x", "j": (1, 2.5), "k": [np.float64(1e-300)], "$l": 3,
           "m": np.arange(3, dtype=np.int16), "n": {1: "one"}}
    back = decode(json.loads(json.dumps(encode([row]), allow_nan=False)))[0]
    assert list(back) == list(row)
    for k in row:
        if k == "m":
            assert back[k].dtype == row[k].dtype and np.array_equal(back[k], row[k])
            continue
        assert type(back[k]) is type(row[k]) and repr(back[k]) == repr(row[k]) and str(back[k]) == str(row[k]), k
    with pytest.raises(TypeError):
        encode({"x": object()})
    with pytest.raises(ValueError):
        decode({"$np": "|O", "b64": ""})


# ---------------------------------------------------------------------------------------------
# 4. Parameters validated against the data and the field before anything runs
# ---------------------------------------------------------------------------------------------
from fednet.errors import DataError  # noqa: E402
from fednet.learning.task import LearningTask  # noqa: E402


def vertical_text(protocol: str, params: str, epochs: int = 2) -> str:
    return (f'name = "tiny"\nseeds = [0]\ntargets = [0.5]\nepochs = {epochs}\nrun_to_end = true\n'
            f'[data]\nsplit = "vertical"\ndataset = "mnist"\nmax_train = 600\nmax_test = 200\n'
            f'[network]\nn_devices = 4\ncompute = "deterministic"\nloss = 0.0\n'
            f'[[runs]]\nprotocol = "{protocol}"\nparams = {params}\n')


LOAD_TIME = [
    (study_text(protocol="dresfl", params='{ p = 65537, hidden = [4], batch_size = 8 }'), "p = 65537 (17 bits) is too small"),
    (study_text(protocol="dresfl", params='{ hidden = [4], batch_size = 8, weight_bits = -3 }'), "weight_bits = -3 rounds 100.0%"),
    (study_text(protocol="dresfl", params='{ hidden = [4], batch_size = 8, data_bits = -2 }'), "data_bits = -2 rounds"),
    (study_text(protocol="dresfl", params='{ hidden = [4], batch_size = 100000 }'), "batch_size = 100000 exceeds"),
    (study_text(protocol="dresfl", params='{ hidden = [4], batch_size = 8, element_bits = 8 }'), "element_bits = 8 is below the 200 bits"),
    (study_text(protocol="dresfl", params='{ hidden = [4], batch_size = 8, weight_bits = 60 }'), "integer gradient of the initial model"),
    (study_text(protocol="codedsecagg", params='{ z = 1, groups = 2, element_bits = 4 }'), "element_bits = 4 is below the k = 48"),
    (study_text(protocol="codedsecagg", params='{ z = 1, groups = 2, share_element_bits = 8 }'), "share_element_bits = 8"),
    (study_text(protocol="codedpaddedfl", params='{ alpha = 2, element_bits = 4 }'), "element_bits = 4 is below"),
    (vertical_text("fedvs", "{ p = 1000001 }"), "p = 1000001: q must be a prime"),
    (vertical_text("fedvs", "{ p = 7 }"), "p = 7 (3 bits) is too small"),
    (vertical_text("fedvs", "{ p = 618970019642690137449562111 }"), "must be below 2**62"),
    (vertical_text("fedvs", "{ l_w = 0 }"), "l_w = 0 rounds"),
    (vertical_text("fedvs", "{ batch_size = 100000 }"), "batch_size = 100000 exceeds the 600"),
    (vertical_text("fedvs_wait", "{ batch_size = 601 }"), "batch_size = 601 exceeds the 600"),
    (vertical_text("fedvs_ignore", '{ dataset = "fashion-mnist" }'), "would silently replace the study's vertical [data]"),
]


@pytest.mark.parametrize("text,needle", LOAD_TIME, ids=[f"load{i}" for i in range(len(LOAD_TIME))])
def test_parameters_that_do_not_fit_the_data_or_field_are_named_before_anything_runs(tmp_path, capsys, text,
                                                                                   needle) -> None:
    expect_cli_error(capsys, ["run", str(write(tmp_path, text)), "--out", str(tmp_path / "o"), "--quiet"], needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


@pytest.mark.parametrize("where", ["X", "Y", "x_test", "y_test_high", "y_test_negative", "y_test_float"])
def test_data_no_model_can_train_on_is_a_data_error(where) -> None:
    rng = np.random.default_rng(0)
    X = [rng.uniform(size=(5, 3)) for _ in range(2)]
    Y = [np.eye(3)[rng.integers(0, 3, 5)] for _ in range(2)]
    x_test, y_test = rng.uniform(size=(4, 3)), np.array([0, 1, 2, 1])
    if where == "X":
        X[1][2, 1] = np.nan
    elif where == "Y":
        Y[0][0, 0] = np.inf
    elif where == "x_test":
        x_test[0, 0] = -np.inf
    elif where == "y_test_high":
        y_test = np.array([0, 1, 3, 1])
    elif where == "y_test_negative":
        y_test = np.array([0, -1, 2, 1])
    else:
        y_test = np.array([0.0, 1.0, 2.0, 1.0])
    with pytest.raises(DataError, match="x_test|y_test|X holds|Y holds"):
        LearningTask(X, Y, x_test, y_test)


# ---------------------------------------------------------------------------------------------
# 5. Environment faults and broken plugins: one named message
# ---------------------------------------------------------------------------------------------
import errno  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import fednet.study.output as output_mod  # noqa: E402
from fednet.protocol import registry  # noqa: E402


def test_an_unreachable_scheduler_is_a_named_error_within_the_stated_timeout(tmp_path, capsys, monkeypatch) -> None:
    import fednet.study.parallel as parallel

    monkeypatch.setattr(parallel, "SCHEDULER_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    expect_cli_error(capsys, ["run", str(write(tmp_path, study_text(epochs=1))), "--out", str(tmp_path / "o"),
                              "--quiet", "--scheduler", "tcp://127.0.0.1:9"], "no Dask scheduler answered within 1 s")
    assert time.monotonic() - t0 < 30 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_target_is_a_named_error_and_leaves_nothing(tmp_path, capsys, monkeypatch, code) -> None:
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "o" / "summary.json"))

    monkeypatch.setattr(runner, "write_results", fail)
    expect_cli_error(capsys, ["run", str(write(tmp_path, study_text(epochs=1))), "--out", str(tmp_path / "o"),
                              "--quiet"], os.strerror(code))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"] or not (tmp_path / "o").exists()


def test_a_rename_refused_by_the_file_system_is_a_named_error(tmp_path, capsys, monkeypatch) -> None:
    def fail(self):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.out))

    monkeypatch.setattr(output_mod.StagedOutput, "commit", fail)
    expect_cli_error(capsys, ["run", str(write(tmp_path, study_text(epochs=1))), "--out", str(tmp_path / "o"),
                              "--quiet"], "cannot put the results in place")
    assert not (tmp_path / "o").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_checkpoint_that_cannot_be_written_does_not_stop_the_study(tmp_path, monkeypatch, caplog) -> None:
    import fednet.study.checkpoint as ck

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ck, "write_own", fail)
    runner.run_study(_study(tmp_path), tmp_path / "o", progress=False, plot=False)
    assert (tmp_path / "o" / "summary.json").exists() and "cannot keep finished" in caplog.text


class _BrokenEntryPoint:
    name, value, dist = "broken_plugin", "broken_pkg.mod:Proto", None

    def load(self):
        raise RuntimeError("the plugin's own bug")


def test_fednet_list_reports_and_skips_a_broken_plugin(capsys, monkeypatch) -> None:
    eps = dict(registry.entry_points())
    monkeypatch.setattr(registry, "entry_points", lambda: {**eps, "broken_plugin": [_BrokenEntryPoint()]})
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "conventional" in out and "broken_plugin" in out and "Traceback" not in err
    assert "the plugin's own bug" in err
    with pytest.raises(ImportError, match="failed to load: RuntimeError"):
        registry.get("broken_plugin")


def test_a_plugin_that_exits_at_import_is_a_named_error(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "exiting_plugin.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = study_text(epochs=1).replace('protocol = "conventional"', 'protocol = "exiting_plugin:Proto"')
    expect_cli_error(capsys, ["run", str(write(tmp_path, text)), "--out", str(tmp_path / "o"), "--quiet"],
                     "called sys.exit(0)")
    sys.modules.pop("exiting_plugin", None)


def test_a_plugin_that_raises_at_import_is_a_named_error_with_its_location(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "raising_plugin.py").write_text("x = 1\nraise RuntimeError('plugin bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = study_text(epochs=1).replace('protocol = "conventional"', 'protocol = "raising_plugin:Proto"')
    expect_cli_error(capsys, ["run", str(write(tmp_path, text)), "--out", str(tmp_path / "o"), "--quiet"],
                     "raising_plugin.py:2: RuntimeError: plugin bug")
    sys.modules.pop("raising_plugin", None)


@pytest.mark.parametrize("protocol,params,training", [
    ("codedpaddedfl", "{ alpha = 2 }", "learning_rate = 1e6"),                 # Q<48,24> outgrown at run time
])
def test_a_format_outgrown_at_run_time_is_a_recorded_failure(tmp_path, protocol, params, training) -> None:
    text = study_text(protocol=protocol, params=params, training=training, epochs=12)
    out = tmp_path / "o"
    assert main(["run", str(write(tmp_path, text)), "--out", str(out), "--quiet"]) == 0
    failed = json.loads((out / "summary.json").read_text())["runs"][protocol]["failed"]["0"]
    assert "out of range for Q<48,24>" in failed["reason"] or "non-finite" in failed["reason"]


def test_fedvs_weights_outgrowing_w_max_are_a_recorded_failure(tmp_path) -> None:
    text = vertical_text("fedvs", '{ lr_client = 1e6, lr_server = 1e6, mode = "timing" }', epochs=3)
    out = tmp_path / "o"
    assert main(["run", str(write(tmp_path, text)), "--out", str(out), "--quiet"]) == 0
    failed = json.loads((out / "summary.json").read_text())["runs"]["fedvs"]["failed"]["0"]
    assert "w_max" in failed["reason"] or "non-finite" in failed["reason"]
