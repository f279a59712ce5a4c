"""A study's own code travels (issue 30, item 1): an outside protocol and an outside network builder, in a folder
that is neither the working folder nor on ``sys.path``, run alike serially, with ``--jobs 2`` from another folder
and on a running scheduler; a study whose code the workers cannot import fails at once and leaves no checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fednet.cli import main
from fednet.protocol import registry
from fednet.study.config import load_study

distributed = pytest.importorskip("distributed")

STUDY = """
name = "outside"
seeds = [0, 1]
targets = [0.5]
baseline = "built-in"
epochs = 2
run_to_end = true
[data]
dataset = "digits"
n_components = 200
[network]
n_devices = 5
kind = "w30_net:my_star"
params = {{ uplink_bps = 4e6 }}
[[runs]]
label = "built-in"
protocol = "conventional"
params = {{ minibatch_fraction = 0.5 }}
[[runs]]
label = "mine"
protocol = "{protocol}"
params = {{ minibatch_fraction = 0.5 }}
"""

PROTOCOL = '''
from fednet.protocols.conventional import ConventionalFL


class MyFL(ConventionalFL):
    """Conventional FL under a class of the user's own (outside fednet)."""
'''

BUILDER = '''
from fednet.topologies.lte import lte_star


def my_star(n_devices, rng=None, uplink_bps=5e6):
    """An LTE star with the user's own uplink rate."""
    return lte_star(n_devices, uplink_bps=uplink_bps, rng=rng)
'''


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A study folder with its own protocol and builder, and another folder to run from (the working folder)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "w30_proto.py").write_text(PROTOCOL)
    (code / "w30_net.py").write_text(BUILDER)
    (code / "study.toml").write_text(STUDY.format(protocol="w30_proto:MyFL"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    saved = dict(registry._REGISTRY)
    yield code
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    for m in [m for m in sys.modules if m.startswith("w30_")]:
        del sys.modules[m]


def _same(a: Path, b: Path) -> None:
    for name in ("summary.json", "built-in/trace.csv", "mine/trace.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_outside_protocol_and_builder_run_alike_with_jobs_from_another_folder(outside, tmp_path, capsys) -> None:
    assert str(outside) not in sys.path and Path.cwd() != outside
    serial, par = tmp_path / "serial", tmp_path / "par"
    assert main(["run", str(outside / "study.toml"), "--out", str(serial), "--quiet"]) == 0, capsys.readouterr().err
    for m in [m for m in sys.modules if m.startswith("w30_")]:     # the client forgets them: the workers import
        del sys.modules[m]                                         # what was shipped, the client the study's folder
    assert main(["run", str(outside / "study.toml"), "--out", str(par), "--quiet", "--jobs", "2"]) == 0, \
        capsys.readouterr().err
    _same(serial, par)
    prov = json.loads((par / "provenance.json").read_text())
    code = {e["module"]: e for e in prov["user_code"]}
    assert set(code) == {"w30_proto", "w30_net"}
    assert code["w30_proto"]["path"] == str((outside / "w30_proto.py").resolve()) and code["w30_proto"]["shipped"]
    import hashlib

    assert code["w30_net"]["sha256"] == hashlib.sha256((outside / "w30_net.py").read_bytes()).hexdigest()


def test_outside_code_runs_on_a_scheduler(outside, tmp_path, client) -> None:
    from fednet.study.runner import run_study

    study = load_study(outside / "study.toml")
    serial = run_study(study, tmp_path / "serial", progress=False, plot=False)
    remote = run_study(study, tmp_path / "remote", progress=False, plot=False, scheduler=client.scheduler.address)
    assert remote.timing["parallel"]["scheduler"] == client.scheduler.address
    _same(serial.out_dir, remote.out_dir)

    # new code under the same module name: the long-lived workers import the new version, not the one they hold
    (outside / "w30_proto.py").write_text(PROTOCOL + "\n\nVERSION = 2\n")

    def version() -> object:
        import w30_proto

        return getattr(w30_proto, "VERSION", 1)

    for m in [m for m in sys.modules if m.startswith("w30_")]:
        del sys.modules[m]
    study = load_study(outside / "study.toml")
    run_study(study, tmp_path / "remote2", progress=False, plot=False, scheduler=client.scheduler.address)
    assert set(client.run(version).values()) == {2}


def test_code_the_workers_cannot_import_fails_at_once_without_a_checkpoint(outside, tmp_path, client,
                                                                            monkeypatch) -> None:
    from fednet.errors import ConfigError
    from fednet.study import usercode
    from fednet.study.runner import run_study

    (outside / "w30_other.py").write_text(PROTOCOL)
    (outside / "other.toml").write_text(STUDY.format(protocol="w30_other:MyFL"))
    study = load_study(outside / "other.toml")
    monkeypatch.setattr(usercode, "ship_files", lambda modules: {})    # as if nothing were shipped
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"cannot import the study's own code: .*w30_"):
        run_study(study, out, progress=False, plot=False, scheduler=client.scheduler.address)
    assert not out.exists() and not any(p.name.endswith(".fednet-checkpoint") for p in tmp_path.iterdir())


def test_a_helper_module_beside_the_protocol_is_shipped_and_fednet_never_is(tmp_path, monkeypatch) -> None:
    from fednet.study.usercode import ship_files, user_modules

    (tmp_path / "w30_helper.py").write_text("FACTOR = 1\n")
    (tmp_path / "w30_pkg").mkdir()
    (tmp_path / "w30_pkg" / "__init__.py").write_text("")
    (tmp_path / "w30_pkg" / "proto.py").write_text("import w30_helper\n" + PROTOCOL)
    (tmp_path / "s.toml").write_text(STUDY.format(protocol="w30_pkg.proto:MyFL").replace('kind = "w30_net:my_star"\n', "")
                                     .replace("params = { uplink_bps = 4e6 }\n", "")
                                     .replace('label = "built-in"\nprotocol = "conventional"',
                                              'label = "built-in"\nprotocol = "fednet.protocols.conventional:ConventionalFL"'))
    monkeypatch.chdir(tmp_path.parent)
    try:
        study = load_study(tmp_path / "s.toml")
        mods = {m.module: m for m in user_modules(study)}
        assert mods["fednet.protocols.conventional"].files == {} and not mods["fednet.protocols.conventional"].as_dict()["shipped"]
        files = ship_files(list(mods.values()))
        assert set(files) == {"w30_pkg/__init__.py", "w30_pkg/proto.py", "w30_helper.py"}
    finally:
        for m in [m for m in sys.modules if m.startswith("w30_")]:
            del sys.modules[m]
