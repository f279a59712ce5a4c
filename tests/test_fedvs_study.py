"""The FedVS studies (Figs. 2-4) through the study layer and the CLI, at a tiny size: vertical tasks built by the runner."""

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from fednet.cli import main
from fednet.learning.vertical import vertical_from_task
from fednet.study import load_study, run_study
from fednet.study.config import StudyError
from fednet.study.runner import prepare_task

STUDIES = Path(__file__).resolve().parents[1] / "studies"
DATA = os.environ.get("FEDNET_DATA", "/work/shared/data")
HAVE_FMNIST = (Path(DATA) / "fashion-mnist").is_dir()
needs_data = pytest.mark.skipif(not HAVE_FMNIST, reason="FashionMNIST not available")


def _tiny(name: str):
    """One seed, 2 rounds, 600 / 100 images, batch 48; FedVS in full mode (its decoded sums verified)."""
    study = load_study(STUDIES / f"{name}.toml", seeds=[0], max_epochs=2,
                       sets=["data.max_train=600", "data.max_test=100"])
    runs = [r.model_copy(update={"params": dict(r.params, batch_size=48,
                                                **({"mode": "full"} if r.protocol == "fedvs" else {}))})
            for r in study.runs]
    return study.model_copy(update={"runs": runs})


@needs_data
@pytest.mark.parametrize("name,n_runs", [("fedvs_fig2", 8), ("fedvs_fig3", 16), ("fedvs_fig4", 8)])
def test_study_runs(name, n_runs):
    study = _tiny(name)
    assert study.data.split == "vertical" and study.data.max_train == 600
    assert len(study.runs) == n_runs
    result = run_study(study, None, data_dir=DATA, progress=False, plot=False)
    for label, by_seed in result.traces.items():
        rows = by_seed[0]
        assert rows[0]["event"] == "phase" and rows[-1]["time_s"] > 0
        if label.startswith(("FedVS", "delay", "computation")):
            assert rows[-1]["checked_rounds"] == 2                       # decoded sums verified bit-exact
    if name == "fedvs_fig3":
        t = {label: by_seed[0][-1]["time_s"] for label, by_seed in result.traces.items()}
        # slower clients: the computation dominant runs take longer for the same rounds
        assert t["computation dominant K=1"] > t["delay dominant K=1"]
        # 'own': nobody waits for the stragglers' model-sharing delays, so rounds are shorter
        assert t["delay dominant own K=1"] < t["delay dominant K=1"]


@needs_data
def test_runner_builds_the_vertical_task_of_the_data_block():
    study = load_study(STUDIES / "fedvs_fig2.toml", seeds=[0], sets=["data.max_train=90", "data.max_test=30"])
    data = vertical_from_task(prepare_task(study, DATA))
    assert data.n_clients == 28 and data.sizes == [28] * 28
    assert len(data.y_train) == 90 and len(data.y_test) == 30
    assert all(x.shape == (90, 28) for x in data.x_train)
    assert 0.0 <= min(x.min() for x in data.x_train) and max(x.max() for x in data.x_train) <= 1.0


@needs_data
def test_reduced_fig2_through_the_cli_writes_the_study_outputs(tmp_path, capsys):
    """`fednet run studies/fedvs_fig2.toml` with reductions: summary.json, traces and the plot, every run."""
    out = tmp_path / "out"
    sets = ["data.max_train=400", "data.max_test=80", "runs.*.params.batch_size=32",
            'runs."FedVS T=1 K=*".params.mode=full']          # runs named as in the outputs (after the sweep)
    argv = ["run", str(STUDIES / "fedvs_fig2.toml"), "--seed", "0", "--epochs", "2", "--quiet", "--out", str(out),
            "--data-dir", DATA]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    labels = ["FedVS T=1 K=1", "FedVS T=1 K=2", "FedVS own T=1 K=1", "FedVS own T=1 K=2", "Wait", "Ignore", "VAFL",
              "Wait-DP eps=5"]
    assert sorted(summary["runs"]) == sorted(labels)
    assert (out / "accuracy_vs_time.png").stat().st_size > 1000
    for label in labels:
        rows = list(csv.DictReader(open(out / summary["runs"][label]["trace_csv"])))
        assert rows[0]["event"] == "phase" and float(rows[-1]["time_s"]) > float(rows[0]["time_s"])
        if label.startswith("FedVS T=1"):                                # full mode: verified every round
            assert rows[-1]["checked_rounds"] == "2"
        elif label.startswith("FedVS own"):                              # the study's timing mode
            assert rows[-1]["checked_rounds"] == "0" and len(rows) == 3
    vafl = list(csv.DictReader(open(out / summary["runs"]["VAFL"]["trace_csv"])))
    assert sum(r["event"] == "update" for r in vafl) == 2 * 28           # one row per arrival


@pytest.mark.parametrize("data,needle", [
    ('split = "vertical"\ndataset = "digits"', "split = 'vertical' needs dataset in"),
    ('split = "vertical"\ndataset = "fashion-mnist"\nn_components = 16', "n_components has no meaning for split = 'vertical'"),
    ('dataset = "handwritten"', "set split = 'vertical'"),
    ('dataset = "mnist"\nmax_train = 10', "max_train only apply to split = 'vertical'"),
    ('split = "vertical"\ndataset = "fashion-mnist"\nmax_train = 0', "data.max_train: Input should be greater than or equal to 1"),
    ('split = "diagonal"\ndataset = "mnist"', "data.split: Input should be 'horizontal' or 'vertical'"),
])
def test_bad_vertical_data_blocks_are_refused_by_name(tmp_path, data, needle):
    text = (STUDIES / "fedvs_fig4.toml").read_text()
    start, end = text.index("[data]"), text.index("[network]")
    path = tmp_path / "s.toml"
    path.write_text(text[:start] + "[data]\n" + data + "\n\n" + text[end:])
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert needle in str(err.value)


def test_handwritten_needs_six_clients(tmp_path):
    from fednet.errors import ConfigError
    from fednet.study.runner import vertical_task

    text = (STUDIES / "fedvs_fig2_handwritten.toml").read_text()
    spec = load_study(STUDIES / "fedvs_fig2_handwritten.toml")
    bad = spec.model_copy(update={"network": spec.network.model_copy(update={"n_devices": 5})})
    with pytest.raises(ConfigError, match="network.n_devices must be 6, got 5"):
        vertical_task(bad, tmp_path)
    assert "split" in text


def test_a_vertical_protocol_refuses_a_horizontal_task():
    from fednet.learning.task import LearningTask
    rng = np.random.default_rng(0)
    y = np.eye(3)[rng.integers(0, 3, 10)]
    task = LearningTask(X=[rng.random((6, 4)), rng.random((4, 4))], Y=[y[:6], y[6:]], x_test=rng.random((5, 4)),
                        y_test=np.zeros(5, int), learning_rate=0.1, lr_milestones=(), lr_decay=1.0, weight_decay=0.0)
    with pytest.raises(ValueError, match="the task is not vertical"):
        vertical_from_task(task)


@pytest.mark.parametrize("name", ["quickstart", "fedvs_fig2", "fig7_mnist"])
def test_a_dumped_study_validates_again(name: str) -> None:
    """``model_dump`` writes every key out (max_train = None, the horizontal keys' defaults); reloading it must not
    read those as given (they were refused as "only apply to split = 'vertical'" / "no meaning" before)."""
    from fednet.study.config import Study

    study = load_study(Path(__file__).parents[1] / "studies" / f"{name}.toml")
    again = Study.model_validate(study.model_dump(mode="json"))
    assert again.model_dump(mode="json") == study.model_dump(mode="json")
