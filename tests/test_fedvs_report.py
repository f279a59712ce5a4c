"""studies/fedvs_report.py: intervals on accuracies stay inside (0, 1)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("fedvs_report", Path(__file__).resolve().parents[1] / "studies" /
                                               "fedvs_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_logit_interval_stays_in_the_unit_interval_where_a_t_interval_does_not():
    vals = [0.10, 0.11, 0.45, 0.10, 0.12]                  # one seed took off: a t-interval reaches below 0
    m, s = np.mean(vals), np.std(vals, ddof=1)
    assert m - 2.776 * s / np.sqrt(5) < 0
    lo, hi = report.logit_interval(vals)
    assert 0 < lo < min(vals) < max(vals) < 1 and lo < m < hi < 1
    lo1, hi1 = report.logit_interval([0.99, 1.0, 1.0, 0.98])
    assert 0.85 < lo1 < hi1 < 1


def test_logit_interval_matches_the_t_interval_on_logits():
    vals = [0.6, 0.7, 0.65]
    z = np.log(np.array(vals) / (1 - np.array(vals)))
    h = 4.302652729911275 * z.std(ddof=1) / np.sqrt(3)
    lo, hi = report.logit_interval(vals)
    assert lo == pytest.approx(1 / (1 + np.exp(-(z.mean() - h))), rel=1e-9)
    assert hi == pytest.approx(1 / (1 + np.exp(-(z.mean() + h))), rel=1e-9)
    with pytest.raises(ValueError, match="at least two values"):
        report.logit_interval([0.5])
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        report.logit_interval([0.5, 1.5])


def test_table_cells():
    runs = {"A": {0: [(1.0, 0.1), (5.0, 0.6), (9.0, 0.8)], 1: [(1.0, 0.1), (4.0, 0.5), (8.0, 0.7)]}}
    rows = report.table(runs, [4.5, 8.0, 8.5], [0.6, 0.9])
    assert rows[1][3] == f"{(8 / 2 + 7 / 2) / 2:.3f}"                              # simulated s per round
    assert rows[1][4].startswith("0.300 [") and rows[1][5].startswith("0.650 [")   # means of (0.1, 0.5), (0.6, 0.7)
    assert rows[1][6] == "0.600 (1/2)"                                              # seed 1 ended at 8 s
    assert rows[1][7].startswith(f"{np.sqrt(5.0 * 8.0):.1f} [") and rows[1][7].endswith("(2/2)")
    assert rows[1][8] == "not reached"
