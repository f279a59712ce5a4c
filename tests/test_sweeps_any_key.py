"""Issue 30, item 3: sweeps over any run key (network, training, protocol parameters, accounting, epochs) with
one syntax, checked at load time; ``--set`` on a swept key refused, never ignored; one label scheme (the expanded
labels) for ``--set``, ``--runs``, the summary and the output folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fednet.cli import main
from fednet.study.config import StudyError, load_study, slug
from fednet.study.runner import build_network, training_task
from fednet.topologies.groups import membership

GRID = """
name = "grid"
seeds = [0]
targets = [0.5]
baseline = "conv"
epochs = 1
[data]
dataset = "digits"
n_components = 40
[network]
n_devices = 12
[[runs]]
label = "conv"
protocol = "conventional"
[[runs]]
label = "csa"
protocol = "codedsecagg"
params = { z = 1, mode = "timing" }
sweep = { "network.groups.rule" = ["consecutive", "random"], "network.groups.count" = [1, 2, 3] }
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_two_grouping_rules_by_three_group_counts_is_one_run_block(tmp_path) -> None:
    """Why: a 2 rules x 3 counts study needed six hand-written blocks ("Extra inputs are not permitted")."""
    s = load_study(write(tmp_path, GRID))
    runs = s.runs[1:]
    assert [r.name for r in runs] == [f"csa network.groups.rule={rule}, network.groups.count={n}"
                                      for rule in ("consecutive", "random") for n in (1, 2, 3)]
    for r, (rule, n) in zip(runs, [(rule, n) for rule in ("consecutive", "random") for n in (1, 2, 3)]):
        net = s.run_network(r)
        assert (net.groups.rule, net.groups.count) == (rule, n)
        assert s.run_params(r)["groups"] == n          # the protocol takes the network's group count
        groups = membership(build_network(net, 0), None)
        assert sorted(len(g) for g in groups) == [12 // n] * n
        assert sorted(i for g in groups for i in g) == list(range(12))
        if rule == "consecutive":
            assert groups == [list(range(k * 12 // n, (k + 1) * 12 // n)) for k in range(n)]
    # the random rule really is another grouping (for 3 groups of 4 out of 12, a consecutive draw is 1 in 5775)
    assert membership(build_network(s.run_network(runs[5]), 0), None) != \
        membership(build_network(s.run_network(runs[2]), 0), None)
    assert s.run_network(s.runs[0]).groups is None     # the unswept run keeps the study's network


def test_dotted_key_merges_into_the_study_table_and_templates_name_it(tmp_path) -> None:
    text = GRID.replace("n_devices = 12", "n_devices = 12\ngroups = { rule = \"mac_balanced\", count = 2 }").replace(
        'label = "csa"', 'label = "csa N={count} ({network.groups.count}) lr={learning_rate}"').replace(
        'sweep = { "network.groups.rule" = ["consecutive", "random"], "network.groups.count" = [1, 2, 3] }',
        'sweep = { "network.groups.count" = [2, 3], "training.learning_rate" = [3.0], accounting = ["paper"] }')
    s = load_study(write(tmp_path, text))
    assert [r.name for r in s.runs[1:]] == ["csa N=2 (2) lr=3.0", "csa N=3 (3) lr=3.0"]
    r = s.runs[2]
    assert s.run_network(r).groups.model_dump() == {"rule": "mac_balanced", "count": 3, "membership": None,
                                                    "seed": None}
    assert s.run_training(r).learning_rate == 3.0 and s.run_training(r).lr_milestones == [200, 350]
    assert s.run_accounting(r) == "paper" and "accounting" not in r.params
    assert s.run_training(s.runs[0]).learning_rate == 6.0

    import dataclasses                                  # training_task replaces only what the run sets

    @dataclasses.dataclass
    class T:
        learning_rate: float = 6.0
        lr_decay: float = 0.8
    assert training_task(s, r, T()) == T(learning_rate=3.0) and training_task(s, s.runs[0], t := T()) is t


@pytest.mark.parametrize("sweep, expect", [
    ('{ "network.grups.count" = [1, 2] }', r"runs\[1\] \(csa\).sweep: sweep key 'network.grups.count': no network "
                                           r"field 'grups' \(did you mean 'groups'\?\) \(values \[1, 2\]\)"),
    ('{ "network.groups.count" = [2, 13] }', r"runs\[2\] \(csa network.groups.count=13\).network.*groups.count must "
                                             r"be at most n_devices = 12, got 13"),
    ('{ "training.learning_rate" = [1.0, -2.0] }', r"runs\[2\] \(csa training.learning_rate=-2.0\)"
                                                   r".training.learning_rate: .*greater than 0 \(got -2.0\)"),
    ('{ "network.loss" = [0.1, 2.0] }', r"runs\[2\] \(csa network.loss=2.0\).network.loss: .* 0.999 \(got 2.0\)"),
    ('{ zz = [1] }', r"'codedsecagg' has no parameter 'zz' \(did you mean 'z'\?\)"),
    ('{ "data.partition" = ["iid"] }', r"data cannot vary between the runs of one study"),
    ('{ "network.n_devices" = [4] }', r"a run cannot change n_devices"),
    ('{ z = [1, 2], "params.z" = [3] }', r"key 'params.z' sets params.z, which 'z' already sweeps"),
])
def test_a_bad_sweep_key_or_value_is_named_on_one_line_at_load_time(tmp_path, sweep, expect) -> None:
    text = GRID.replace('sweep = { "network.groups.rule" = ["consecutive", "random"], "network.groups.count" = '
                        '[1, 2, 3] }', f"sweep = {sweep}")
    with pytest.raises(StudyError, match=expect) as err:
        load_study(write(tmp_path, text))
    assert len(str(err.value).splitlines()) == 2       # the file, then one line


@pytest.mark.parametrize("assignment", [
    "runs.*.params.z=2",                                # a swept protocol parameter, every run
    "runs.csa*.network.groups.count=2",                 # a swept network key, by label pattern
    "runs.1.network.groups.count=99",                   # even an out-of-bounds value (it was ignored)
    'runs."csa network.groups.rule=random, network.groups.count=2".network.groups={ count = 3 }',
    "network.groups.count=2",                           # the study's value, which the sweep would override
    "network.groups=2",
])
def test_set_on_a_swept_key_is_refused_never_ignored(tmp_path, capsys, assignment) -> None:
    """Why: --set on a swept parameter was silently ignored, even with an out-of-bounds value."""
    text = GRID.replace('"network.groups.rule" = ["consecutive", "random"], ', '"params.z" = [1], '
                        '"network.groups.rule" = ["consecutive", "random"], ') if "params.z" in assignment or \
        "runs.*.params.z" in assignment else GRID
    path = write(tmp_path, text)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--set", assignment]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is swept" in err and assignment.split("=")[0].split(".")[-1] in err
    assert "--runs" in err and not out.exists()


def test_set_on_an_unswept_key_of_an_expanded_run_changes_that_run_only(tmp_path) -> None:
    text = GRID.replace("n_devices = 12", "n_devices = 12\ngroups = { rule = \"random\", count = 2 }")
    s = load_study(write(tmp_path, text), sets=['runs."csa network.groups.rule=random, *".epochs=3',
                                                "runs.1.params.mode=full", "network.groups.seed=4"])
    assert [s.run_epochs(r) for r in s.runs] == [1, 1, 1, 1, 3, 3, 3]
    assert [r.params.get("mode") for r in s.runs[1:]] == ["full"] + ["timing"] * 5
    # a study-level key the sweep does not set reaches the swept tables (applied before the expansion)
    assert {s.run_network(r).groups.seed for r in s.runs[1:]} == {4}
    # a sweep added from the command line to one expanded run
    s = load_study(write(tmp_path, GRID), sets=['runs.conv.sweep.drop_slowest=[0, 1]', 'baseline="conv drop_slowest=0"'])
    assert [r.name for r in s.runs[:2]] == ["conv drop_slowest=0", "conv drop_slowest=1"]


def test_set_runs_and_outputs_share_the_expanded_labels(tmp_path, capsys) -> None:
    """Why: --set took a run's label before sweep expansion while --runs took the expanded one."""
    path = write(tmp_path, GRID)
    label = "csa network.groups.rule=random, network.groups.count=2"
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--runs", label,
                 "--set", f'runs."{label}".params.mode="timing"', "--set", f'runs."{label}".epochs=2']) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == ["conv", label]
    assert summary["runs"][label]["trace_csv"] == f"{slug(label)}/trace.csv"
    assert (out / slug(label) / "trace.csv").is_file()
    study = json.loads((out / "study.json").read_text())
    assert [(r["label"], r["epochs"]) for r in study["runs"]] == [("conv", None), (label, 2)]
    # the pre-expansion label is no run's name, for --set as for --runs
    for argv in (["--set", "runs.csa.epochs=2"], ["--runs", "csa"]):
        assert main(["run", str(path), "--out", str(tmp_path / "o2"), "--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert "no run labelled 'csa'" in err and "csa network.groups.rule=consecutive" in err
    # patterns select the same runs for --runs and --set
    s = load_study(path, only_runs=["csa *count=3"], sets=['runs."csa *count=3".epochs=2'])
    assert [(r.name, r.epochs) for r in s.runs] == [("conv", None),
                                                    ("csa network.groups.rule=consecutive, network.groups.count=3", 2),
                                                    ("csa network.groups.rule=random, network.groups.count=3", 2)]


def test_the_readme_sweep_example_validates_as_written(tmp_path) -> None:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if "network.groups.rule" in b)
    head = 'name = "readme"\nepochs = 1\n[network]\nn_devices = 12\n'
    s = load_study(write(tmp_path, head + "[[runs]]" + block.split("[[runs]]")[-1]))   # its CodedSecAgg block
    assert [r.name for r in s.runs] == [
        f"CodedSecAgg {rule} N={n}" for rule in ("consecutive", "random") for n in (1, 2, 4)]


def test_a_python_override_of_a_swept_study_key_is_refused_too(tmp_path) -> None:
    path = write(tmp_path, GRID)
    with pytest.raises(StudyError, match=r"override network.groups.count: network.groups.count is swept by runs\[1\] "
                                         r"\(csa\) \(sweep 'network.groups.count' = \[1, 2, 3\]\)"):
        load_study(path, network={"groups": {"count": 2}})
    assert load_study(path, network={"dropout": 0.0}).network.dropout == 0.0     # an unswept key merges
