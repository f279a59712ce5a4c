"""Issue 30, item 5: the study's progress ETA follows measured host cost, not rounds; line-based off a terminal.

Deterministic: the estimator is fed a fake clock and fake host times (nothing sleeps)."""

from __future__ import annotations

import io
import re

import pytest

from fednet.study.progress import Pair, StudyProgress, format_eta


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# Two runs of very unequal cost, as in the issue (an ETA of 11:36:46 for a study that took 2:33): a cheap baseline
# (0.5 s set-up, 0.25 s a row, 401 rows) and a coded protocol whose set-up dominates (2000 s, then 2 s a row, 11 rows).
COST = {"cheap": (0.5, 0.25, 401), "coded": (2000.0, 2.0, 11)}
PROTO = {"cheap": "conventional", "coded": "codedsecagg", "coded2": "codedsecagg"}


def cost(run: str) -> float:
    setup, row, rows = COST[run]
    return setup + (rows - 1) * row


def make(stream=None, workers=1, runs=("cheap", "coded"), seeds=(0, 1, 2), interval=30.0):
    clock = Clock()
    pairs = [Pair((r, s), r, PROTO[r]) for r in runs for s in seeds]
    expect = {r: COST[r if r in COST else "coded"][2] for r in runs}
    p = StudyProgress(pairs, expect, desc="study", stream=stream or io.StringIO(), clock=clock, workers=workers,
                      interval=interval)
    return p, clock


def simulate_pair(p: StudyProgress, clock: Clock, key, run: str, rows: int | None = None) -> None:
    """Feed one pair's rows at its true host times (run ``run``'s costs)."""
    setup, row, n = COST[run]
    n = n if rows is None else rows
    p.start(key)
    t0 = clock.t
    for k in range(1, n + 1):
        clock.t = t0 + setup + (k - 1) * row
        p.update(key, k)
    p.finish(key, n, clock.t - t0)


@pytest.mark.parametrize("first", ["cheap", "coded"])
def test_eta_is_exact_once_each_run_is_measured_where_counting_rounds_is_off_by_orders(first) -> None:
    """The serial order: every seed of one run, then the next run. After the first run and one pair of the second,
    the ETA is the true host time left; the rows left at the mean host time per row so far (the old bar) are off by
    a factor of about 90 (cheap run first: 42 s for 67 min) or 57 (coded run first: 3 h 10 min for 3 min 21 s)."""
    runs = (first, "coded" if first == "cheap" else "cheap")
    p, clock = make(runs=runs)
    for s in (0, 1, 2):
        simulate_pair(p, clock, (first, s), first)
    simulate_pair(p, clock, (runs[1], 0), runs[1])
    truth = 2 * cost(runs[1])
    assert p.remaining() == pytest.approx(truth, rel=1e-12)
    assert p.eta() == pytest.approx(truth, rel=1e-12)
    rows_done = 3 * COST[first][2] + COST[runs[1]][2]
    by_rounds = 2 * COST[runs[1]][2] * (clock.t / rows_done)
    assert by_rounds / truth < 0.02 if first == "cheap" else by_rounds / truth > 50
    # the share of the bar is the share of host time, not of rounds
    assert p.fraction() == pytest.approx(clock.t / (clock.t + truth), rel=1e-12)


def test_unmeasured_runs_borrow_their_protocols_estimate_then_every_runs() -> None:
    p, clock = make(runs=("cheap", "coded", "coded2"), seeds=(0,))
    assert p.remaining() is None and p.eta() is None and "ETA ?" in p.line()   # nothing measured yet
    simulate_pair(p, clock, ("cheap", 0), "cheap")
    # the coded runs borrow the only measurement (the cheap run's): an underestimate, but a number
    assert p.remaining() == pytest.approx(2 * cost("cheap") * 11 / 401 + 2 * (0.5 - 0.25) * (1 - 11 / 401),
                                          rel=1e-12)
    simulate_pair(p, clock, ("coded", 0), "coded")
    # coded2 (same protocol, unmeasured) takes coded's set-up and row costs, not the cheap run's
    assert p.remaining() == pytest.approx(cost("coded"), rel=1e-12)


def test_a_running_pair_counts_what_is_left_of_it_at_its_own_rate() -> None:
    p, clock = make(runs=("coded",), seeds=(0, 1))
    simulate_pair(p, clock, ("coded", 0), "coded")
    p.start(("coded", 1))
    clock.t += 1500.0                                              # three quarters through its set-up
    p.update(("coded", 1), 0)
    assert p.remaining() == pytest.approx(500.0 + 10 * 2.0)
    clock.t += 500.0                                               # set-up done: the first row
    p.update(("coded", 1), 1)
    assert p.remaining() == pytest.approx(10 * 2.0)
    clock.t += 4 * 3.0                                             # then 4 rows at 3 s (slower than seed 0's)
    p.update(("coded", 1), 5)
    assert p.remaining() == pytest.approx(6 * 3.0)                 # its own rate once it has two rows


def test_an_early_stop_lowers_the_rows_expected_of_the_runs_other_seeds() -> None:
    p, clock = make(runs=("cheap",), seeds=(0, 1))
    simulate_pair(p, clock, ("cheap", 0), "cheap", rows=101)       # stop_at reached at round 100
    assert p.expect["cheap"] == 101
    assert p.remaining() == pytest.approx(0.5 + 100 * 0.25)


def test_eta_divides_the_work_left_by_the_pairs_that_run_at_once() -> None:
    p, clock = make(workers=2)
    simulate_pair(p, clock, ("cheap", 0), "cheap")
    simulate_pair(p, clock, ("coded", 0), "coded")
    assert p.eta() == pytest.approx(p.remaining() / 2)
    assert format_eta(p.eta()) == "35:20" and format_eta(3600 * 11 + 36 * 60 + 46) == "11:36:46"


def test_off_a_terminal_the_progress_is_a_few_whole_lines() -> None:
    out = io.StringIO()                                            # not a TTY
    p, clock = make(stream=out)
    for r in ("cheap", "coded"):
        for s in (0, 1, 2):
            simulate_pair(p, clock, (r, s), r)
    p.close()
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    # quiet: at most one line per 30 host seconds of the 6,900 s, not one per row (1,236 rows)
    assert 1 < len(lines) <= clock.t / 30 + 2
    pat = re.compile(r"study: ( *\d+|  \?)% \| \d/6 runs x seeds \| elapsed [\d:]+ \| ETA [\d:?]+( \| .*)?$")
    assert all(pat.match(x) for x in lines), lines
    assert lines[-1].startswith("study: 100% | 6/6 runs x seeds") and "ETA 00:00" in lines[-1]


def test_on_a_terminal_the_progress_is_a_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p, clock = make(stream=out)
    simulate_pair(p, clock, ("cheap", 0), "cheap")
    simulate_pair(p, clock, ("coded", 0), "coded")
    text = out.getvalue()
    assert "\r" in text and "ETA 1:10:41" in text and "2/6 runs x seeds" in text
    p.close()


def test_disabled_progress_writes_nothing() -> None:
    out = io.StringIO()
    clock = Clock()
    p = StudyProgress([Pair(0, "a", "x")], {"a": 3}, desc="s", enabled=False, stream=out, clock=clock)
    p.start(0)
    clock.t = 100.0
    p.update(0, 1)
    p.finish(0, 3, 120.0)
    p.close()
    assert out.getvalue() == ""


def test_run_study_reports_progress_in_lines_when_stderr_is_not_a_terminal(tmp_path, capsys) -> None:
    from fednet.study.config import load_study
    from fednet.study.runner import run_study

    path = tmp_path / "s.toml"
    path.write_text('name = "tiny"\nseeds = [0, 1]\nepochs = 2\n[data]\ndataset = "digits"\nn_components = 40\n'
                    '[network]\nn_devices = 4\n[[runs]]\nlabel = "conv"\nprotocol = "conventional"\n')
    run_study(load_study(path), None, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[-1].startswith("tiny: 100% | 2/2 runs x seeds | elapsed ")


def test_a_late_report_of_a_finished_pair_is_ignored() -> None:
    p, clock = make(runs=("cheap",), seeds=(0, 1))
    simulate_pair(p, clock, ("cheap", 0), "cheap")
    p.update(("cheap", 0), 7, elapsed=1.0)             # a Dask event that arrives after the task's result
    assert ("cheap", 0) not in p.running and p.remaining() == pytest.approx(cost("cheap"))
