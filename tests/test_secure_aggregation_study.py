"""studies/secure_aggregation*.toml and studies/secure_aggregation_report.py (issue 27, item 6).

The study files validate with the dropout mapping their header states; a reduced run (seed 0, 2 epochs, the
50 % dropout runs of the paper's model and SecAgg on the LTE star) through the ``fednet`` command gives the table,
bit for bit the same twice.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fednet.study.config import load_study

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("secure_aggregation_report",
                                               ROOT / "studies" / "secure_aggregation_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


@pytest.mark.parametrize("name, n", [("secure_aggregation", 100), ("secure_aggregation_n200", 200)])
def test_study_files_map_the_dropout_rate_as_their_header_says(name: str, n: int) -> None:
    study = load_study(ROOT / "studies" / f"{name}.toml")
    assert study.network.n_devices == n and study.data.n_components * 10 == 7850
    assert len(study.runs) == 18 and all(r.params["mode"] == "timing" for r in study.runs)
    for r in study.runs:
        m = report._LABEL.match(r.name)
        assert m, r.name
        p = float(m["p"])
        U = round((1 - p) * n)
        if r.protocol == "lightsecagg":                      # N - U = pN users left out of every sum
            assert r.params["U"] == U and r.params["z"] == U // 2
        else:                                                # inputs missing w.p. 1 - (1 - q)^2 = p
            assert math.isclose(1 - (1 - r.params["stage_dropout"]) ** 2, p, abs_tol=2e-4)
        if r.protocol == "secagg":
            assert r.params["t"] == U // 2 + 1                  # the same privacy as LightSecAgg's T
        paper = m["net"] == "paper"
        assert (r.network.get("uplink_bps") == 300e6) == paper


def _run(out: Path, data_dir: Path) -> str:
    env = dict(os.environ, FEDNET_DATA=str(data_dir))
    runs = ["paper LightSecAgg p=0.5", "paper SecAgg p=0.5", "paper SecAggPlus p=0.5", "lte SecAgg p=0.5"]
    subprocess.run([sys.executable, "-m", "fednet.cli", "run", "secure_aggregation", "--seed", "0", "--epochs", "2",
                    "--quiet", "--out", str(out), "--runs", *runs], check=True, env=env, capture_output=True)
    return report.report([out])


def test_reduced_study_gives_the_table_bit_for_bit(tmp_path: Path, data_dir: Path) -> None:
    a = _run(tmp_path / "a", data_dir)
    b = _run(tmp_path / "b", data_dir)
    assert a == b
    for d in ("a", "b"):
        assert (tmp_path / d / "summary.json").exists()
    for run in ("paper_SecAgg_p_0.5", "paper_LightSecAgg_p_0.5", "lte_SecAgg_p_0.5"):
        assert (tmp_path / "a" / run / "trace.csv").read_bytes() == (tmp_path / "b" / run / "trace.csv").read_bytes()
    rows = [ln for ln in a.splitlines() if ln.startswith(("paper", "lte"))]
    assert len(rows) == 4
    secagg = next(ln for ln in rows if ln.startswith("paper  100  0.5  SecAgg "))
    assert "8.0" in secagg                                   # beside the paper's ratio
