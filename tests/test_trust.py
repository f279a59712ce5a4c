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
    with pytest.raises(TrainingFailure, match="round 2: values overflowed"):
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
