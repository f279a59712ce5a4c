"""Smoke runs of the FedVS studies (Figs. 2-4) at a tiny size: every run goes through the study runner."""

import os
from pathlib import Path

import pytest

from fednet.study import load_study, run_study

STUDIES = Path(__file__).resolve().parents[1] / "studies"
DATA = os.environ.get("FEDNET_DATA", "/work/shared/data")
pytestmark = pytest.mark.skipif(not (Path(DATA) / "fashion-mnist").is_dir(), reason="FashionMNIST not available")


def _tiny(name: str):
    study = load_study(STUDIES / f"{name}.toml", seeds=[0], max_epochs=2)
    runs = [r.model_copy(update={"params": dict(r.params, max_train=600, max_test=100, batch_size=48)})
            for r in study.runs]
    return study.model_copy(update={"runs": runs})


@pytest.mark.parametrize("name,n_runs", [("fedvs_fig2", 6), ("fedvs_fig3", 8), ("fedvs_fig4", 4)])
def test_study_runs(name, n_runs):
    study = _tiny(name)
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
