"""Paper-ready results (issue 30, item 4): the set-up time in the summary and its table, a tidy summary frame,
``fednet summarize --format markdown|latex|csv``, and a plot of the mean over seeds with their range (PNG at
300 dpi, PDF, SVG, log-x)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fednet.cli import main
from fednet.study.results import format_frame, format_summary, load_results, summarize, summary_frame
from test_faults import study_text, write

RUNS = ('[[runs]]\nlabel = "plain"\nprotocol = "conventional"\nparams = {}\n'
        '[[runs]]\nlabel = "padded"\nprotocol = "codedpaddedfl"\nparams = { alpha = 2, mode = "timing" }\n')


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("res")
    path = write(tmp, study_text(runs=RUNS, epochs=4, top="seeds = [0, 1]\nbaseline = \"plain\"")
                 .replace("seeds = [0]\n", ""))
    assert main(["run", str(path), "--out", str(tmp / "out"), "--quiet"]) == 0
    return tmp / "out"


def test_the_set_up_is_in_the_summary_and_its_table(out) -> None:
    summary = json.loads((out / "summary.json").read_text())
    res = load_results(out)
    for label in ("plain", "padded"):
        for seed in (0, 1):
            first = res.rounds[(res.rounds.run == label) & (res.rounds.seed == seed)].iloc[0]
            assert first["round"] == 0 and summary["runs"][label]["setup_s"][str(seed)] == first["time_s"]
    assert summary["runs"]["padded"]["setup_s"]["0"] > 0 == summary["runs"]["plain"]["setup_s"]["0"]
    table = format_summary(summary)
    assert "set-up [s]" in table and "n = 2 seeds" in table
    rows = [{"round": 0, "time_s": 0.0, "accuracy": 0.5}, {"round": 1, "time_s": 1.0, "accuracy": 0.9}]
    assert "set-up [" not in format_summary(summarize({"a": {0: rows}}, [0.8], None))   # no column: nothing to show


def test_the_summary_frame_and_its_formats(out) -> None:
    summary = json.loads((out / "summary.json").read_text())
    frame = load_results(out).summary_frame()
    assert list(frame.columns) == ["run", "target", "seeds", "reached", "accuracy_last", "setup_s", "round_s", "time_s",
                                   "time_s_low", "time_s_high", "speedup", "speedup_low", "speedup_high", "note"]
    assert len(frame) == 2 * len(summary["targets"]) and set(frame.seeds) == {2}
    for _, row in frame.iterrows():
        e = summary["runs"][row.run]["per_target"][f"{row.target:g}"]
        st = e["time_s_stats"]
        assert (np.isnan(row.time_s) if st is None else row.time_s == st["geomean"])
        assert row.setup_s == np.mean(list(summary["runs"][row.run]["setup_s"].values()))
    assert frame[frame.run == "plain"].speedup.isna().all()                         # the baseline
    csv = format_frame(frame, "csv")
    assert pd.read_csv(pd.io.common.StringIO(csv)).shape == frame.shape
    md = format_frame(frame, "markdown").splitlines()
    assert md[0].startswith("| run | target |") and md[1].startswith("|---|") and len(md) == len(frame) + 2
    tex = format_frame(frame, "latex")
    assert "\\toprule" in tex and "accuracy\\_last" in tex                        # escaped for LaTeX
    with pytest.raises(ValueError, match="format must be one of"):
        format_frame(frame, "html")
    assert summary_frame(summary).equals(frame)


def test_the_cli_formats_and_plots(out, capsys, tmp_path) -> None:
    assert main(["summarize", str(out), "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("| run | target |")
    assert main(["summarize", str(out), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("run,target,seeds")
    for name, magic in (("f.pdf", b"%PDF"), ("f.svg", b"<?xml"), ("f.png", b"\x89PNG")):
        assert main(["plot", str(out), "--output", str(tmp_path / name), "--log-x"]) == 0
        assert (tmp_path / name).read_bytes()[:5].startswith(magic)
    png = (tmp_path / "f.png").read_bytes()
    width = int.from_bytes(png[16:20], "big")
    assert width == int(7.5 * 300)                                                # 300 dpi by default
