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


def _write(folder: Path, name: str, times: dict[str, dict[int, float | None]], setup: float = 10.0,
           target: str = "0.95") -> Path:
    """A study folder whose runs reach 0.95 at ``times`` (seed: s) in 10 epochs after a set-up of ``setup`` s."""
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({"name": name}))
    runs = {}
    for k, (label, by_seed) in enumerate(times.items()):
        (folder / f"run{k}.csv").write_text("seed,round,time_s\n" + "".join(
            f"{s},0,{setup}\n{s},1,{setup + 1}\n" for s in by_seed))
        runs[label] = {"trace_csv": f"run{k}.csv", "per_target": {target: {
            "time_s": {str(s): t for s, t in by_seed.items()},
            "round": {str(s): None if t is None else 10 for s, t in by_seed.items()}}}}
    (folder / "summary.json").write_text(json.dumps({"targets": [float(target)], "runs": runs}))
    return folder


def test_parse_label():
    assert report.parse_label("CodedSecAgg z=1 N=2 relay_asap fednet") == report.Label(
        "CodedSecAgg", 1, "N=2 relay_asap", "fednet")
    assert report.parse_label("CodedPaddedFL N=6 alpha=20 relay_asap paper") == report.Label(
        "CodedPaddedFL", None, "N=6 alpha=20 relay_asap", "paper")
    assert report.parse_label("LightSecAgg z=600 U=700") == report.Label("LightSecAgg", 600, "U=700", None)
    assert report.parse_label("Conventional FL") is None


def test_best_setting_is_fixed_over_seeds_and_needs_every_seed():
    R = report.Reached
    times = {
        "CodedSecAgg z=1 N=1 relay_asap fednet": {0: R(100.0, 5, 0.0), 1: R(400.0, 5, 0.0)},   # geomean 200
        "CodedSecAgg z=1 N=2 relay_asap fednet": {0: R(150.0, 5, 0.0), 1: R(150.0, 5, 0.0)},   # 150: chosen
        "CodedSecAgg z=1 N=4 relay_asap fednet": {0: R(10.0, 5, 0.0), 1: R(None, None, 0.0)},  # misses seed 1
        "CodedSecAgg z=1 N=2 relay_asap paper": {0: R(1.0, 5, 0.0), 1: R(1.0, 5, 0.0)},        # other accounting
        "LightSecAgg z=1 U=96": {0: R(3000.0, 5, 0.0), 1: R(1200.0, 5, 0.0)},
        "LightSecAgg z=1 U=120": {0: R(9000.0, 5, 0.0), 1: R(9000.0, 5, 0.0)},
    }
    assert report.best(times, "CodedSecAgg", 1, "fednet", [0, 1]) == (
        "CodedSecAgg z=1 N=2 relay_asap fednet", times["CodedSecAgg z=1 N=2 relay_asap fednet"])
    assert report.best(times, "LightSecAgg", 1, "paper", [0, 1])[0] == "LightSecAgg z=1 U=96"
    assert report.best(times, "LightSecAgg", 1, "paper", [0, 1], "U=120")[0] == "LightSecAgg z=1 U=120"
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
    assert f"| speed-up over LightSecAgg (its best U), z = 1 | fednet | {speedup:.3g} [" in text
    assert f"| 18.7x | {speedup / 18.7:.2f}x the paper (off by > 30 %) |" in text    # 6.3 against 18.7
    assert f"| CodedSecAgg (z = 1) / CodedPaddedFL time | fednet | {math.sqrt(1.25 * 2.0):.3g} [" in text
    assert "| 1.34 | 1.18x the paper |" in text                        # within 30 %: no flag
    assert "| CodedSecAgg | 1 | fednet | N=2 relay_asap | 141 [" in text
    assert "| 10 | 10 | 14 | 0: 100 1: 200 |" in text                 # set-up 10 s; 10 epochs: (90/10 + 190/10) / 2 s
    assert "waits for all" not in text                                 # no LightSecAgg U=120 run in these folders


def test_refuses_mixed_studies_and_conflicting_seeds(tmp_path):
    a = _write(tmp_path / "a", "fig7_mnist", {"LightSecAgg z=1 U=96": {0: 1.0}})
    b = _write(tmp_path / "b", "fig8_mnist", {"LightSecAgg z=1 U=96": {1: 1.0}})
    c = _write(tmp_path / "c", "fig7_mnist", {"LightSecAgg z=1 U=96": {0: 2.0}})
    with pytest.raises(ValueError, match="fig8_mnist"):
        report.collect([a, b], 0.95)
    with pytest.raises(ValueError, match="seed 0: Reached.time_s=1.0.* and Reached.time_s=2.0"):
        report.collect([a, c], 0.95)
    with pytest.raises(ValueError, match="target 0.9 not in summary.json"):
        report.collect([a], 0.9)


def _lightsecagg_case(folder: Path, study: str, z: int, lightsecagg: dict[int, dict[int, float]]) -> str:
    """The report of one CodedSecAgg run (100 s at seeds 0 and 1) beside LightSecAgg runs ``{U: {seed: s}}``."""
    times = {f"CodedSecAgg z={z} N=1 relay_asap paper": {0: 100.0, 1: 100.0},
             **{f"LightSecAgg z={z} U={U}": by_seed for U, by_seed in lightsecagg.items()}}
    return report.report([_write(folder, study, times)])


def test_lightsecagg_waiting_for_everyone_is_shown_and_compared(tmp_path):
    text = _lightsecagg_case(tmp_path / "a", "fig7_mnist", 60, {108: {0: 300.0, 1: 300.0}, 120: {0: 900.0, 1: 1600.0}})
    assert "| LightSecAgg | 60 | both | U=108 | 300 [300, 300] |" in text
    assert "| LightSecAgg | 60 | both | U=120 (waits for all) | 1,200 [" in text
    assert "| speed-up over LightSecAgg (its best U), z = 60 | paper | 3 [3, 3]x | 6.6x | 0.45x the paper (off" in text
    assert "| speed-up over LightSecAgg (U=120), z = 60 | paper | 12 [" in text      # sqrt(9 * 16)


def test_lightsecagg_waiting_for_everyone_as_its_best_is_shown_once(tmp_path):
    text = _lightsecagg_case(tmp_path / "a", "fig8_mnist", 1, {900: {0: 3000.0, 1: 3000.0}, 1000: {0: 2000.0, 1: 2000.0}})
    assert text.count("| LightSecAgg | 1 | both |") == 1 and "| U=1000 (waits for all) | 2,000 [" in text
    assert text.count("speed-up over LightSecAgg") == 1 and "| 20 [20, 20]x | 38.9x |" in text


def test_paper_ratios_only_at_its_target(tmp_path):
    times = {"CodedSecAgg z=1 N=5 relay_asap fednet": {0: 100.0}, "LightSecAgg z=1 U=1000": {0: 2000.0}}
    assert "| 38.9x |" in report.report([_write(tmp_path / "a", "fig8_mnist", times)])
    text = report.report([_write(tmp_path / "b", "fig8_mnist", times, target="0.9")], target=0.9)
    assert "| speed-up over LightSecAgg (its best U), z = 1 | fednet | 20 (n = 1)x | - | - |" in text
