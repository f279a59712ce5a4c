"""studies/fig8_mnist.toml (Fig. 8 of Schlegel et al., D = 1000) validates and sweeps what its header says.

Its full-mode check (full = timing on a reduced set-up at the same z / D and N ratios) is
``tests/test_study_modes.py::test_timing_mode_equals_full_mode[fig8_mnist]``.
"""

from __future__ import annotations

from pathlib import Path

from fednet.study.config import load_study

STUDY = Path(__file__).parents[1] / "studies" / "fig8_mnist.toml"
D = 1000


def test_fig8_study_file_validates_and_sweeps_the_feasible_groupings() -> None:
    study = load_study(STUDY)
    assert study.network.n_devices == D and study.data.dataset == "mnist" and study.data.n_components == 2000
    assert study.targets == [0.90, 0.95] and study.baseline == "LightSecAgg z=1 U=700"
    assert all(r.params.get("mode") == "timing" for r in study.runs)
    csa = [r for r in study.runs if r.protocol == "codedsecagg"]
    cpfl = [r for r in study.runs if r.protocol == "codedpaddedfl"]
    lsa = [r for r in study.runs if r.protocol == "lightsecagg"]
    assert {r.params["z"] for r in csa} == {1, 600}
    for r in csa:       # Sec. VI-D: N | D and k' = z + 1 devices in every group
        N, z = r.params["groups"], r.params["z"]
        assert D % N == 0 and D // N >= z + 1, r.name
    assert {r.params["groups"] for r in csa if r.params["z"] == 600} == {1}
    assert {r.params["groups"] for r in csa if r.params["z"] == 1} == {1, 2, 4, 5, 8, 10, 20}
    for r in cpfl:      # Sec. V-E: alpha at most the group size
        assert D % r.params["groups"] == 0 and r.params["alpha"] <= D // r.params["groups"], r.name
    # like for like: one schedule for every coded run, both accountings for each setting
    coded = csa + cpfl
    assert {r.params["sharing_schedule"] for r in coded} == {"relay_asap"}
    settings = {(r.protocol, r.params.get("z"), r.params["groups"], r.params.get("alpha")) for r in coded}
    for s in settings:
        got = {r.accounting for r in coded if (r.protocol, r.params.get("z"), r.params["groups"],
                                                r.params.get("alpha")) == s}
        assert got == {"fednet", "paper"}, s
    assert {(r.params["z"], r.params["U"]) for r in lsa} == {(z, U) for z in (1, 600) for U in (1000, 900, 800, 700)}
    assert all(r.params["z"] < r.params["U"] <= D for r in lsa)
