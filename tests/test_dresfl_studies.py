"""The DReS-FL studies: they load, refuse absent data sets clearly, and run end to end on a small set-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from fednet.learning.datasets import DatasetError
from fednet.sim.dropout import ExtremeDropout
from fednet.study import load_study, run_study
from fednet.study.runner import build_simulation

ROOT = Path(__file__).resolve().parents[1]


def test_studies_load():
    t2 = load_study(ROOT / "studies/dresfl_table2.toml")
    assert [r.name for r in t2.runs] == ["FedAvg", "FedAvg-IS", "SCAFFOLD", "DReS-FL", "Centralized"]
    assert t2.epochs == 15000 and t2.network.n_devices == 20 and t2.data.partition == "skewed_label"
    assert load_study(ROOT / "studies/dresfl_table2_fashion.toml").data.dataset == "fashion-mnist"
    lat = load_study(ROOT / "studies/dresfl_latency.toml")
    assert [r.name for r in lat.runs] == ["FedAvg", "FedAvg+LightSecAgg", "DReS-FL K=1", "DReS-FL K=2"]


def test_extreme_availability_from_the_study():
    study = load_study(ROOT / "studies/dresfl_table2.toml").model_copy(deep=True)
    sim = build_simulation(study.network.model_copy(update={"min_reliable": 9}), seed=4)
    assert isinstance(sim.availability, ExtremeDropout) and sim.availability.n_reliable >= 9


def _tiny(**data):
    return {"name": "tiny", "seeds": [0], "epochs": 3,
            "data": {"dataset": "digits", "features": "raw", "partition": "skewed_label", **data},
            "network": {"n_devices": 10, "availability": "dresfl_extreme", "min_reliable": 9},
            "runs": [{"protocol": "fedavg", "params": {"batch_size": 8, "hidden": [4, 4]}},
                     {"protocol": "dresfl", "params": {"batch_size": 8, "hidden": [4, 4], "mode": "timing"}}]}


@pytest.mark.parametrize("name", ["emnist", "cifar10", "cifar100", "svhn"])
def test_absent_datasets_refused_clearly(name, tmp_path):
    from fednet.study.config import Study

    with pytest.raises(DatasetError, match="not available on this machine"):
        run_study(Study.model_validate(_tiny(dataset=name)), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_tiny_study_end_to_end():
    from fednet.study.config import Study

    res = run_study(Study.model_validate(_tiny()), None, progress=False, plot=False)
    fed, dres = res.traces["fedavg"][0], res.traces["dresfl"][0]
    assert len(fed) == len(dres) == 4
    assert [r["dropped"] for r in fed[1:]] == [r["dropped"] for r in dres[1:]]
    assert dres[0]["bits_up"] > 0 and dres[0]["time_s"] > 0            # the one-time sharing
    assert 0 < dres[0]["decodable_probability"] <= 1


def test_convergence_rule_of_the_table2_report():
    """W(t) = mean of the evaluations in (t - 500, t]; converged at the first t >= 2000 with
    |W(t) - W(t - 1500)| < 0.2 pp: a curve rising 1.25 pp per 1000 rounds until 4000 and flat after has
    W(5500) - W(4000) = 85 - 84.75 = 0.25 (not converged) and W(5600) - W(4100) = 85 - 84.85 = 0.15."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rep", ROOT / "studies" / "dresfl_table2_report.py")
    rep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rep)
    rounds = list(range(0, 8001, 100))
    acc = [80 + min(t, 4000) / 800 for t in rounds]
    assert rep.window_mean(rounds, acc, 1000) == pytest.approx(81.0)          # 600..1000
    assert rep.converged_round(rounds, acc) == 5600
    assert rep.converged_round(rounds[:50], acc[:50]) is None                      # not by 4900
    assert rep.accuracy_at(rounds, acc, 150) == 80.125
    # the extrapolation: the last period's gain shrinking x0.65 per period falls below 0.2 pp after k periods
    assert rep.predicted_round(5.82, 3000) == 3000 + 8 * 1500 and rep.predicted_round(1.38, 3000) == 10500
    assert rep.predicted_round(0.1, 3000) == 3000
