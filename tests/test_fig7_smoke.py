"""Smoke run of a miniature Fig. 7 study through the CLI: CodedSecAgg and LightSecAgg, full and timing."""

from __future__ import annotations

import json
from pathlib import Path

from fednet.cli import main
from fednet.study.config import load_study

MINI = """
name = "fig7_mini"
seeds = [0]
targets = [0.5]
baseline = "LightSecAgg"
epochs = 3
[data]
dataset = "digits"
n_components = 60
[network]
n_devices = 8
[[runs]]
label = "CodedSecAgg full"
protocol = "codedsecagg"
params = { z = 1, groups = 2 }
[[runs]]
label = "CodedSecAgg timing"
protocol = "codedsecagg"
params = { z = 1, groups = 2, mode = "timing" }
[[runs]]
label = "LightSecAgg"
protocol = "lightsecagg"
params = { z = 2, U = 7 }
[[runs]]
label = "LightSecAgg timing"
protocol = "lightsecagg"
params = { z = 2, U = 7, mode = "timing" }
"""


def test_fig7_study_file_validates():
    study = load_study(Path(__file__).parents[1] / "studies" / "fig7_mnist.toml")
    assert study.network.n_devices == 120 and study.baseline == "LightSecAgg z=1 U=96"
    assert {r.params["z"] for r in study.runs if r.protocol == "codedsecagg"} == {1, 12, 30, 60}
    # like for like: every CodedSecAgg / CodedPaddedFL setting under both schedules and both accountings,
    # one LightSecAgg U grid for every z, every feasible N for CodedSecAgg (N | D, D / N > z)
    coded = [r for r in study.runs if r.protocol in ("codedsecagg", "codedpaddedfl")]
    settings = {(r.protocol, r.params.get("z"), r.params["groups"], r.params.get("alpha")) for r in coded}
    for s in settings:
        got = {(r.params["sharing_schedule"], r.accounting) for r in coded
               if (r.protocol, r.params.get("z"), r.params["groups"], r.params.get("alpha")) == s}
        assert got == {(a, b) for a in ("relay_steps", "relay_asap") for b in ("fednet", "paper")}, s
    lsa = {(r.params["z"], r.params["U"]) for r in study.runs if r.protocol == "lightsecagg"}
    assert lsa == {(z, U) for z in (1, 12, 30, 60) for U in (120, 108, 96, 84, 72)}
    for z in (1, 12, 30, 60):
        want = {N for N in range(1, 121) if 120 % N == 0 and 120 // N > z}
        assert {r.params["groups"] for r in coded if r.params.get("z") == z} == want


def test_fig6_study_sweeps_every_group_count():
    study = load_study(Path(__file__).parents[1] / "studies" / "fig6_mnist.toml")
    cpfl = [r for r in study.runs if r.protocol == "codedpaddedfl"]
    assert {r.params["groups"] for r in cpfl} == {N for N in range(1, 121) if 120 % N == 0}
    assert {(8, 15), (6, 20)} <= {(r.params["groups"], r.params["alpha"]) for r in cpfl}
    assert all(r.params["alpha"] <= 120 // r.params["groups"] for r in cpfl)
    for N in (8, 6):
        assert {(r.params["sharing_schedule"], r.accounting) for r in cpfl if r.params["groups"] == N
                and r.params["alpha"] == 120 // N} == {(a, b) for a in ("relay_steps", "relay_asap")
                                                        for b in ("fednet", "paper")}


def test_mini_fig7_runs(tmp_path):
    path = tmp_path / "mini.toml"
    path.write_text(MINI)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"]
    assert set(runs) == {"CodedSecAgg full", "CodedSecAgg timing", "LightSecAgg", "LightSecAgg timing"}
    # full and timing modes give the same simulated times (same keyed draws, same metered costs)
    def last_time(label: str) -> float:
        last = (out / label.replace(" ", "_") / "trace.csv").read_text().splitlines()[-1]
        return float(last.split(",")[3])

    t = {k: last_time(k) for k in runs}
    assert all(v > 0 for v in t.values())
    assert t["CodedSecAgg full"] == t["CodedSecAgg timing"]
    assert t["LightSecAgg"] == t["LightSecAgg timing"]
