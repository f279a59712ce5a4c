"""studies/secagg_report.py: the best setting per scheme, the paired ratios, and pooling folders."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("secagg_report", Path(__file__).resolve().parents[1] / "studies" /
                                               "secagg_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _write(folder: Path, name: str, times: dict[str, dict[int, float | None]]) -> Path:
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({"name": name}))
    runs = {label: {"per_target": {"0.95": {"time_s": {str(s): t for s, t in by_seed.items()}}}}
            for label, by_seed in times.items()}
    (folder / "summary.json").write_text(json.dumps({"targets": [0.95], "runs": runs}))
    return folder


def test_parse_label():
    assert report.parse_label("CodedSecAgg z=1 N=2 relay_asap fednet") == report.Label(
        "CodedSecAgg", 1, "N=2 relay_asap", "fednet")
    assert report.parse_label("CodedPaddedFL N=6 alpha=20 relay_asap paper") == report.Label(
        "CodedPaddedFL", None, "N=6 alpha=20 relay_asap", "paper")
    assert report.parse_label("LightSecAgg z=600 U=700") == report.Label("LightSecAgg", 600, "U=700", None)
    assert report.parse_label("Conventional FL") is None


def test_best_setting_is_fixed_over_seeds_and_needs_every_seed():
    times = {
        "CodedSecAgg z=1 N=1 relay_asap fednet": {0: 100.0, 1: 400.0},     # geomean 200
        "CodedSecAgg z=1 N=2 relay_asap fednet": {0: 150.0, 1: 150.0},     # geomean 150: chosen (not best at seed 0)
        "CodedSecAgg z=1 N=4 relay_asap fednet": {0: 10.0, 1: None},       # misses seed 1: out
        "CodedSecAgg z=1 N=2 relay_asap paper": {0: 1.0, 1: 1.0},          # other accounting
        "LightSecAgg z=1 U=96": {0: 3000.0, 1: 1200.0},
    }
    assert report.best(times, "CodedSecAgg", 1, "fednet", [0, 1]) == (
        "CodedSecAgg z=1 N=2 relay_asap fednet", {0: 150.0, 1: 150.0})
    assert report.best(times, "LightSecAgg", 1, "paper", [0, 1])[0] == "LightSecAgg z=1 U=96"
    assert report.best(times, "CodedSecAgg", 60, "fednet", [0, 1]) is None


def test_report_ratios_paired_by_seed_and_pooled_over_folders(tmp_path):
    a = _write(tmp_path / "a", "fig7_mnist", {
        "CodedSecAgg z=1 N=2 relay_asap fednet": {0: 100.0},
        "CodedPaddedFL N=6 alpha=20 relay_asap fednet": {0: 80.0},
        "LightSecAgg z=1 U=96": {0: 500.0}})
    b = _write(tmp_path / "b", "fig7_mnist", {
        "CodedSecAgg z=1 N=2 relay_asap fednet": {1: 200.0},
        "CodedPaddedFL N=6 alpha=20 relay_asap fednet": {1: 100.0},
        "LightSecAgg z=1 U=96": {1: 1600.0}})
    text = report.report([a, b])
    speedup = math.sqrt(5.0 * 8.0)                                    # paired: 500/100 and 1600/200
    assert f"| speed-up over LightSecAgg, z = 1 | fednet | {speedup:.3g} [" in text
    assert f"| 18.7x | {speedup / 18.7:.2f}x the paper (off by > 30 %) |" in text    # 6.3 against 18.7
    assert f"| CodedSecAgg (z = 1) / CodedPaddedFL time | fednet | {math.sqrt(1.25 * 2.0):.3g} [" in text
    assert "| 1.34 | 1.18x the paper |" in text                        # within 30 %: no flag
    assert "| CodedSecAgg | 1 | fednet | N=2 relay_asap | 141 [" in text and "0: 100 1: 200 |" in text


def test_refuses_mixed_studies_and_conflicting_seeds(tmp_path):
    a = _write(tmp_path / "a", "fig7_mnist", {"LightSecAgg z=1 U=96": {0: 1.0}})
    b = _write(tmp_path / "b", "fig8_mnist", {"LightSecAgg z=1 U=96": {1: 1.0}})
    c = _write(tmp_path / "c", "fig7_mnist", {"LightSecAgg z=1 U=96": {0: 2.0}})
    with pytest.raises(ValueError, match="fig8_mnist"):
        report.collect([a, b], 0.95)
    with pytest.raises(ValueError, match="seed 0: 1.0 and 2.0"):
        report.collect([a, c], 0.95)
    with pytest.raises(ValueError, match="target 0.9 not in summary.json"):
        report.collect([a], 0.9)
