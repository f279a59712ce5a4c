"""``fednet report STUDY DIR [--targets ...] [--write]``: a header's measured table from a saved result folder.

The numbers are checked against the trace files themselves (pandas and scipy here, not fednet's summary code), the
folder's identity against the study file, and ``--write`` byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fednet.cli import main
from fednet.study.report import BEGIN, END, replace_block

MINI = """# A tiny study for fednet report's tests.
# Its header says something a report must not touch.
name = "report_mini"
seeds = [0, 1]
targets = [0.5]
baseline = "Conventional FL"
epochs = 4
run_to_end = true
[data]
dataset = "digits"
n_components = 40
[network]
n_devices = 6
[[runs]]
label = "Conventional FL"
protocol = "conventional"
[[runs]]
label = "Conventional FL, drop 2"
protocol = "conventional"
params = { drop_slowest = 2 }
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """The mini study file and a result folder of it (two seeds, both runs)."""
    root = tmp_path_factory.mktemp("report")
    study = root / "report_mini.toml"
    study.write_text(MINI, encoding="utf-8")
    out = root / "out"
    assert main(["run", str(study), "--out", str(out), "--quiet", "--secret-seed", "99"]) == 0
    return study, out


def _report(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["report", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _row(block: str, label: str) -> list[str]:
    """The cells of ``label``'s table row (columns are separated by two spaces or more)."""
    import re

    line = next(x for x in block.splitlines() if x.startswith(f"#   {label}  "))
    return re.split(r"\s{2,}", line[4:].strip())


def _trace(out: Path, folder: str) -> pd.DataFrame:
    return pd.read_csv(out / folder / "trace.csv")


def test_the_block_holds_the_traces_numbers(saved, capsys) -> None:
    study, out = saved
    rc, block, err = _report(capsys, str(study), str(out), "--targets", "0.3")
    assert rc == 0, err
    lines = block.splitlines()
    assert lines[0].startswith(BEGIN) and lines[-1] == END
    assert all(x.startswith("#") for x in lines)
    # only the lines naming the report command and the result folder (never wrapped: a path moves no other line)
    assert all(x.startswith(("# regenerate: `fednet report", f"# result {out}, run on "))
               for x in lines if len(x) > 120)
    assert f"`fednet report {study} {out} --targets 0.3 --write`" in block
    k = next(i for i, x in enumerate(lines) if x.startswith("# seeds "))
    ran = " ".join(x.removeprefix("#   ") for x in lines[3:k])          # provenance's command, wrapped
    assert ran == f"`fednet run {study} --out {out} --quiet --secret-seed '<secret>'`"
    df = _trace(out, "Conventional_FL")
    crossing = df[df.accuracy >= 0.3].groupby("seed").time_s.first()
    assert len(crossing) == 2                                # both seeds reach 0.3: the cell is a geomean [CI]
    run, seeds, acc, per_round, time_cell, speedup = _row(block, "Conventional FL")
    assert (run, seeds, speedup) == ("Conventional FL", "2", "1 (baseline)")
    assert acc == f"{df.groupby('seed').accuracy.last().mean():.4f}"
    setup = df[df["round"] == 0].groupby("seed").time_s.first().reindex(df.seed.unique(), fill_value=0.0)
    last = df.groupby("seed").last()
    assert float(per_round) == pytest.approx(((last.time_s - setup) / last["round"]).mean(), rel=5e-3)
    g = stats.gmean(crossing.to_numpy())
    low, high = np.exp(stats.t.interval(0.95, 1, loc=np.log(crossing).mean(), scale=stats.sem(np.log(crossing))))
    shown = [float(x) for x in time_cell.replace("[", "").replace("]", "").replace(",", "").split()]
    assert shown == pytest.approx([g, low, high], rel=5e-3)
    other = _trace(out, "Conventional_FL_drop_2")
    ratio = crossing / other[other.accuracy >= 0.3].groupby("seed").time_s.first()
    assert float(_row(block, "Conventional FL, drop 2")[5].split()[0]) == pytest.approx(stats.gmean(ratio), rel=5e-3)


def test_saved_targets_and_resummarized_traces_give_the_same_block(saved, capsys) -> None:
    study, out = saved
    rc, a, _ = _report(capsys, str(study), str(out))
    assert rc == 0
    rc, b, _ = _report(capsys, str(study), str(out), "--targets", "0.5")
    assert rc == 0
    assert a == b.replace(" --targets 0.5 --write", " --write")


def test_a_reduced_run_names_what_it_changed(saved, tmp_path, capsys) -> None:
    study, _ = saved
    out = tmp_path / "reduced"
    assert main(["run", str(study), "--out", str(out), "--quiet", "--epochs", "2", "--seed", "1",
                 "--runs", "Conventional FL"]) == 0
    capsys.readouterr()
    rc, block, _ = _report(capsys, str(study), str(out))
    assert rc == 0
    text = " ".join(x[2:] for x in block.splitlines())
    assert "epochs = 2 (file: 4)" in text and "seeds = [1] (file: [0, 1])" in text and "runs: 1 of 2" in text


def test_a_folder_of_another_study_is_refused(saved, tmp_path, capsys) -> None:
    study, out = saved
    other = tmp_path / "other.toml"
    other.write_text(MINI.replace('name = "report_mini"', 'name = "other"'), encoding="utf-8")
    rc, stdout, err = _report(capsys, str(other), str(out))
    assert rc == 2 and stdout == ""
    assert err.count("\n") == 1 and "holds results of study 'report_mini', not of 'other'" in err
    renamed = tmp_path / "renamed.toml"
    renamed.write_text(MINI.replace('"Conventional FL, drop 2"', '"Drop two"'), encoding="utf-8")
    rc, _, err = _report(capsys, str(renamed), str(out))
    assert rc == 2 and "holds run 'Conventional FL, drop 2', which study 'report_mini' does not have" in err
    rc, _, err = _report(capsys, str(study), str(tmp_path))
    assert rc == 2 and "holds no summary.json" in err and "Traceback" not in err


def test_a_folder_without_study_json_is_refused(saved, tmp_path, capsys) -> None:
    study, out = saved
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "summary.json").write_bytes((out / "summary.json").read_bytes())
    rc, _, err = _report(capsys, str(study), str(copy))
    assert rc == 2 and err.count("\n") == 1 and "holds no study.json" in err
    (copy / "study.json").write_text("[1, 2", encoding="utf-8")
    rc, _, err = _report(capsys, str(study), str(copy))
    assert rc == 2 and "damaged or not written by this fednet" in err


@pytest.mark.parametrize("bad", ["1.5", "0", "nan", "x"])
def test_a_bad_target_is_named(saved, capsys, bad) -> None:
    study, out = saved
    with pytest.raises(SystemExit) as e:
        main(["report", str(study), str(out), "--targets", bad])
    assert e.value.code == 2
    assert f"expected a target accuracy in (0, 1], got {bad!r}" in capsys.readouterr().err


def test_write_puts_the_block_at_the_top_then_replaces_only_it(saved, tmp_path, capsys) -> None:
    study, out = saved
    path = tmp_path / "report_mini.toml"
    original = MINI.encode("utf-8")
    path.write_bytes(original)
    rc, block, err = _report(capsys, str(path), str(out), "--write")
    assert rc == 0 and "wrote the report block" in err
    assert path.read_bytes() == block.encode("utf-8") + b"#\n" + original
    # the block moved into the header by hand, text around it: a second --write changes the block alone
    edited = (MINI.replace("# Its header", "#\n" + block.replace("0.", "9.") + "# Its header")).encode("utf-8")
    path.write_bytes(edited)
    rc, again, _ = _report(capsys, str(path), str(out), "--write")
    assert rc == 0 and again == block
    assert path.read_bytes() == MINI.replace("# Its header", "#\n" + block + "# Its header").encode("utf-8")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temporary file left


@pytest.mark.parametrize("markers", [[BEGIN], [END], [BEGIN, BEGIN, END], [END, BEGIN]])
def test_unbalanced_markers_are_refused_and_nothing_is_written(saved, tmp_path, capsys, markers) -> None:
    study, out = saved
    path = tmp_path / "report_mini.toml"
    text = "\n".join(markers) + "\n" + MINI
    path.write_text(text, encoding="utf-8")
    before = path.stat().st_mtime_ns
    rc, stdout, err = _report(capsys, str(path), str(out), "--write")
    assert rc == 2 and stdout == "" and err.count("\n") == 1 and "unbalanced report markers" in err
    assert path.read_text(encoding="utf-8") == text and path.stat().st_mtime_ns == before


def test_replace_block_keeps_crlf_and_a_last_line_without_newline() -> None:
    block = f"{BEGIN} x\n# new\n{END}\n"
    assert replace_block(f"a\r\n{BEGIN}\r\n# old\r\n{END}\r\nb\r\n", block) == f"a\r\n{BEGIN} x\r\n# new\r\n{END}\r\nb\r\n"
    assert replace_block(f"a\n{BEGIN}\n{END}", block) == f"a\n{BEGIN} x\n# new\n{END}"


def test_summary_json_is_not_rewritten(saved, capsys) -> None:
    """A report reads the result folder; it never changes it."""
    study, out = saved
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert _report(capsys, str(study), str(out), "--targets", "0.2", "0.4")[0] == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert json.loads((out / "summary.json").read_text())["targets"] == [0.5]
