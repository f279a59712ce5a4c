"""Paper-ready results, the rest of issue 30 item 4: ``used``/``dropped`` as lists of ints in the tables, a
speed-up plot with the summary's intervals, zero-width and one-seed intervals explained, tables at most 120
characters wide, energy to each target in the summary frame, and the set-up and per-round times side by side."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.figure import Figure

from fednet.cli import main
from fednet.study.plots import plot_speedups
from fednet.study.results import format_summary, load_results, summarize, summary_frame
from test_faults import study_text, write

RUNS = ('[[runs]]\nlabel = "plain"\nprotocol = "conventional"\nparams = {}\n'
        '[[runs]]\nlabel = "padded"\nprotocol = "codedpaddedfl"\nparams = { alpha = 2, mode = "timing" }\n')


def trace(setup: float, per_round: float, accs: list[float], joules: float | None = None) -> list[dict]:
    """Rows of a run: a set-up row (round 0) at ``setup`` s, then one round every ``per_round`` s."""
    rows = [{"round": r, "time_s": setup + r * per_round, "accuracy": a} for r, a in enumerate(accs)]
    if joules is not None:
        for r in rows:
            r["energy_j"] = joules * (r["round"] + 1)
    return rows


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper")
    path = write(tmp, study_text(runs=RUNS, epochs=3, top='baseline = "plain"'))
    assert main(["run", str(path), "--out", str(tmp / "out"), "--quiet"]) == 0
    return tmp / "out"


def test_used_and_dropped_are_lists_of_ints(one_seed) -> None:
    import pandas as pd

    res = load_results(one_seed)
    csv = pd.read_csv(one_seed / json.loads((one_seed / "summary.json").read_text())["runs"]["plain"]["trace_csv"],
                      dtype={"used": str, "dropped": str}, keep_default_na=False)
    plain = res.rounds[res.rounds.run == "plain"]
    assert [list(v) for v in plain["used"]] == [[int(i) for i in s.split()] for s in csv["used"]]
    assert all(isinstance(i, int) for v in res.rounds["used"] for i in v)
    assert plain["used"].iloc[-1] == list(range(6))                   # conventional FL: every device, sorted
    assert all(v == [] for v in res.rounds["dropped"])               # no availability model: nobody dropped
    assert [r["used"] for r in res.traces()["plain"][0]] == list(plain["used"])


def test_one_seed_table_says_why_there_is_no_interval_and_fits_120_columns(one_seed) -> None:
    summary = json.loads((one_seed / "summary.json").read_text())
    table = format_summary(summary)
    assert "n = 1 seed; one seed: no intervals" in table
    assert all("[" not in line and "*" not in line for line in table.splitlines() if line.startswith("pad"))
    assert max(len(line) for line in table.splitlines()) <= 120
    frame = summary_frame(summary)
    assert (frame.note == "n = 1: one seed, no interval").any() and frame.time_s_low.isna().all()
    # the quickstart's width: four long labels and two targets fold into blocks of at most 120 characters
    runs = {f"CodedPaddedFL alpha={a}, N=5 groups": trace(2725.0, 1.1, [0.1, 0.97, 0.975]) for a in range(4)}
    wide = format_summary(summarize({"Conventional FL": {0: trace(0.0, 1.0, [0.1, 0.96, 0.98])},
                                     **{k: {0: v} for k, v in runs.items()}}, [0.97, 0.98], "Conventional FL"))
    assert max(len(line) for line in wide.splitlines()) <= 120 and wide.count("\nrun ") == 1


def test_a_zero_width_interval_is_marked_and_explained() -> None:
    same = {"a": {s: trace(0.0, 1.0, [0.1, 0.5, 0.9]) for s in (0, 1)},
            "b": {s: trace(0.0, 2.0, [0.1, 0.5, 0.9]) for s in (0, 1)}}
    summary = summarize(same, [0.8], "a")
    st = summary["runs"]["a"]["per_target"]["0.8"]["time_s_stats"]
    assert st["ci_low"] == st["ci_high"] == 2.0
    table = format_summary(summary)
    assert "[2, 2]" not in table and "2 *" in table and "0.5 *" in table                # time and speed-up
    assert "*: zero-width interval (every seed gave the same value)" in table.replace("\n", " ")
    assert set(summary_frame(summary).note) == {"zero-width interval: every seed gave the same value"}
    differ = {"a": {0: trace(0.0, 1.0, [0.1, 0.5, 0.9]), 1: trace(0.0, 1.5, [0.1, 0.5, 0.9])}}
    assert "*" not in format_summary(summarize(differ, [0.8], None))


def test_set_up_and_time_per_round_are_shown_apart() -> None:
    """A set-up of 1000 s and rounds of 2 s: a tiny speed-up is explained by the set-up, not the rounds."""
    traces = {"plain": {0: trace(0.0, 4.0, [0.1, 0.5, 0.9]), 1: trace(0.0, 4.0, [0.1, 0.9, 0.95])},
              "coded": {0: trace(1000.0, 2.0, [0.1, 0.5, 0.9]), 1: trace(1000.0, 2.0, [0.1, 0.9, 0.95])}}
    summary = summarize(traces, [0.8], "plain")
    assert summary["runs"]["coded"]["round_s"] == {"0": 2.0, "1": 2.0}
    assert summary["runs"]["coded"]["setup_s"] == {"0": 1000.0, "1": 1000.0}
    frame = summary_frame(summary).set_index("run")
    assert frame.loc["coded", "round_s"] == 2.0 and frame.loc["plain", "round_s"] == 4.0
    assert frame.loc["coded", "setup_s"] == 1000.0
    table = format_summary(summary)
    head, *rows = [line for line in table.splitlines() if line.startswith(("run", "coded", "plain"))]
    assert "per round [s]" in table and "set-up [s]" in table
    assert rows[1].split()[1:4] == ["0.9250", "1000", "2"]   # accuracy, set-up, per round (mean over seeds)


def test_energy_to_each_target_is_in_the_frame_and_the_table() -> None:
    traces = {"a": {0: trace(0.0, 1.0, [0.1, 0.5, 0.9], joules=3.0), 1: trace(0.0, 1.0, [0.1, 0.9, 0.9], joules=5.0)}}
    summary = summarize(traces, [0.8], None)
    frame = summary_frame(summary)
    # seed 0 reaches 0.8 at round 2: 3 + 6 + 9 J; seed 1 at round 1: 5 + 10 J; whole runs: 18 and 30 J
    assert frame.energy_j.tolist() == [np.mean([18.0, 15.0])] and frame.energy_j_total.tolist() == [24.0]
    assert list(frame.columns).index("energy_j") == list(frame.columns).index("time_s_high") + 1
    assert "energy to 80%" in format_summary(summary) and "16.5" in format_summary(summary)
    assert "energy_j" not in summary_frame(summarize({"a": {0: trace(0.0, 1.0, [0.1, 0.9])}}, [0.8], None))


def test_the_speedup_plot_draws_the_summarys_numbers(tmp_path, monkeypatch) -> None:
    traces = {"base": {s: trace(0.0, 3.0 + s, [0.1, 0.5, 0.9]) for s in range(3)},
              "fast": {s: trace(0.0, 1.0 + 0.3 * s, [0.1, 0.9, 0.95]) for s in range(3)}}
    summary = summarize(traces, [0.8, 0.9], "base")
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: (drawn.append(self), open(path, "wb").close()))
    plot_speedups(summary, tmp_path / "s.png")
    (bars,) = drawn[0].axes[0].containers
    (line, _, (segments,)) = bars.lines
    want = [summary["runs"]["fast"]["per_target"][k]["speedup_stats"] for k in ("0.8", "0.9")]
    assert line.get_ydata().tolist() == [w["geomean"] for w in want]
    ends = [y for seg in segments.get_segments() for y in sorted(seg[:, 1].tolist())]
    assert ends == pytest.approx([y for w in want for y in (w["ci_low"], w["ci_high"])], rel=1e-12)
    assert all(w["ci_low"] < w["geomean"] < w["ci_high"] for w in want)
    monkeypatch.undo()
    for name, magic in (("s.pdf", b"%PDF"), ("s.svg", b"<?xml"), ("s.png", b"\x89PNG")):
        plot_speedups(summary, tmp_path / name)
        assert (tmp_path / name).read_bytes()[:5].startswith(magic)
    assert int.from_bytes((tmp_path / "s.png").read_bytes()[16:20], "big") == int(7.5 * 300)
    with pytest.raises(ValueError, match="baseline"):
        plot_speedups(summarize(traces, [0.8], None), tmp_path / "x.png")


def test_fednet_plot_speedup(one_seed, capsys, tmp_path) -> None:
    assert main(["plot", str(one_seed), "--speedup", "--output", str(tmp_path / "s.svg")]) == 0
    assert (tmp_path / "s.svg").read_bytes().startswith(b"<?xml")
    assert main(["plot", str(one_seed), "--speedup"]) == 0 and (one_seed / "speedup.png").is_file()
    capsys.readouterr()
    assert main(["plot", str(one_seed), "--speedup", "--log-x"]) == 2
    assert "--log-x" in capsys.readouterr().err


def test_round_seconds_skips_a_failed_round_of_non_finite_time():
    """A run whose clock turned NaN at a round (a recorded failure) keeps a finite mean round time from the rounds
    before it, and none when the first round failed: summary.json stays strict JSON (the campaign's NanDelay)."""
    from fednet.study.results import _round_seconds

    rows = [{"round": 0, "time_s": 2.0, "event": "phase"}, {"round": 1, "time_s": 5.0, "event": "round"},
            {"round": 2, "time_s": 8.0, "event": "round"}, {"round": 3, "time_s": float("nan"), "event": "round"}]
    assert _round_seconds(rows) == pytest.approx((8.0 - 2.0) / 2)
    assert _round_seconds(rows[:1] + rows[3:]) is None
