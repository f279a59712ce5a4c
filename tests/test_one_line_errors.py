"""One-line errors where tracebacks were (issue 30, item 6): a plugin reusing a built-in name (``fednet describe``,
``fednet list``), a closed pipe (``fednet list | head``), a protocol whose ``setup()`` is not a generator, an edge
server or relay node in a custom builder, a typo in a builder parameter (checked at load time from the builder's
signature); and provenance with the user's code, the data's checksums, every dependency and a timestamp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fednet.cli import main
from fednet.protocol import registry
from fednet.study.config import StudyError, load_study

STUDY = """
name = "errs"
seeds = [0]
targets = [0.5]
epochs = 1
[data]
dataset = "digits"
n_components = 100
[network]
n_devices = 4
{network}
[[runs]]
label = "run"
protocol = "{protocol}"
params = {{ minibatch_fraction = 0.5 }}
"""

NOT_A_GENERATOR = '''
from fednet.protocols.conventional import ConventionalFL


class NoYield(ConventionalFL):
    """setup() that forgot to yield."""

    def setup(self):
        self.ready = True
'''

BUILDERS = '''
from fednet.topologies.lte import lte_star


def with_edge_server(n_devices, rng=None, uplink_bps=5e6):
    g = lte_star(n_devices, uplink_bps=uplink_bps, rng=rng)
    g.add_node("edge", role="edge_server", mac_rate=1e9)
    return g


def plain(n_devices, rng=None, uplink_bps=5e6, *, loss=0.1):
    return lte_star(n_devices, uplink_bps=uplink_bps, loss=loss, rng=rng)


def buggy(n_devices, rng=None):
    return {}["missing"]
'''


@pytest.fixture
def folder(tmp_path):
    """A study folder with the test's plugin modules; the modules and registry restored afterwards."""
    (tmp_path / "w30e_proto.py").write_text(NOT_A_GENERATOR)
    (tmp_path / "w30e_net.py").write_text(BUILDERS)
    saved = dict(registry._REGISTRY)
    yield tmp_path
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    registry._eps_cache = None
    for m in [m for m in sys.modules if m.startswith("w30e_")]:
        del sys.modules[m]


def _run(folder: Path, capsys, *, protocol: str = "conventional", network: str = "") -> tuple[int, str]:
    study = folder / "s.toml"
    study.write_text(STUDY.format(protocol=protocol, network=network))
    rc = main(["run", str(study), "--out", str(folder / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (folder / "out").exists()
    return rc, err


def test_setup_that_is_not_a_generator_is_refused_at_load_time(folder, capsys) -> None:
    rc, err = _run(folder, capsys, protocol="w30e_proto:NoYield")
    assert rc == 2 and "runs[0] (run).protocol: w30e_proto:NoYield.setup() is not a generator function" in err


def test_edge_server_node_in_a_custom_builder_is_refused_at_load_time(folder, capsys) -> None:
    rc, err = _run(folder, capsys, network='kind = "w30e_net:with_edge_server"')
    assert rc == 2 and "network.kind: network builder 'w30e_net:with_edge_server' built node(s) ['edge'] with " \
                       "role 'edge_server'" in err


def test_builder_parameter_typo_is_refused_from_its_signature(folder, capsys) -> None:
    rc, err = _run(folder, capsys, network='kind = "w30e_net:plain"\nparams = { uplnk_bps = 4e6 }')
    assert rc == 2
    assert "network builder 'w30e_net:plain' has no parameter 'uplnk_bps' (did you mean 'uplink_bps'?); " \
           "it takes uplink_bps, loss" in err
    rc, err = _run(folder, capsys, network='kind = "w30e_net:plain"\nparams = { rng = 3 }')
    assert rc == 2 and "may not set ['rng']" in err
    # a correct parameter runs; a builder's own bug is named with its file and line, at load time
    study = folder / "ok.toml"
    study.write_text(STUDY.format(protocol="conventional", network='kind = "w30e_net:plain"\nparams = { loss = 0.2 }'))
    assert load_study(study).network.params == {"loss": 0.2}
    study.write_text(STUDY.format(protocol="conventional", network='kind = "w30e_net:buggy"'))
    with pytest.raises(StudyError, match=r"network builder 'w30e_net:buggy' failed for seed 0 at .*w30e_net.py:\d+: "
                                         r"KeyError: 'missing'"):
        load_study(study)


def _install_dist(site: Path, entry_points: str) -> None:
    (site / "w30e_dup").mkdir(parents=True)
    (site / "w30e_dup" / "__init__.py").write_text(
        "from fednet.protocols.conventional import ConventionalFL\n\n\n"
        "class Dup(ConventionalFL):\n    \"\"\"A plugin reusing a built-in name.\"\"\"\n\n    name = 'conventional'\n")
    info = site / "w30e_dup-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: w30e_dup\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fednet.protocols]\n{entry_points}\n")


@pytest.mark.parametrize("entry", ["conventional = w30e_dup:Dup", "w30e_other = w30e_dup:Dup"])
def test_plugin_reusing_a_builtin_name_is_one_line_in_describe_and_list(folder, monkeypatch, capsys, entry) -> None:
    site = folder / "site"
    _install_dist(site, entry)
    monkeypatch.syspath_prepend(str(site))
    registry._eps_cache = None
    name = entry.split(" = ")[0]
    assert main(["describe", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fednet: ") and "conventional" in err and "Traceback" not in err
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert f"fednet: protocol {name!r} skipped" in err and "codedpaddedfl" in out


def test_closed_pipe_is_one_line_and_status_2(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "fednet.cli", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                      # the reader is gone before fednet writes (fednet list | head -0)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 2, err
    assert err == "fednet: output cut short: the reader of stdout closed it (broken pipe)\n"


def test_provenance_names_code_data_dependencies_and_time(folder, data_dir, capsys) -> None:
    study = folder / "s.toml"
    study.write_text(STUDY.format(protocol="conventional", network='kind = "w30e_net:plain"')
                     .replace('"digits"', '"mnist"').replace("n_components = 100", "n_components = 20"))
    out = folder / "out"
    assert main(["run", str(study), "--out", str(out), "--quiet", "--epochs", "0"]) == 0, capsys.readouterr().err
    prov = json.loads((out / "provenance.json").read_text())
    assert {"dask", "distributed", "pandas", "matplotlib", "numpy", "torch", "tqdm"} <= set(prov["packages"])
    assert all(prov["packages"][k] for k in ("dask", "distributed", "pandas", "matplotlib"))
    assert prov["created_utc"].endswith("+00:00") and prov["created_utc"][:2] == "20"
    (code,) = prov["user_code"]
    import hashlib

    assert code["module"] == "w30e_net" and code["path"] == str((folder / "w30e_net.py").resolve())
    assert code["sha256"] == hashlib.sha256((folder / "w30e_net.py").read_bytes()).hexdigest()
    data = prov["data"]
    assert data["dataset"] == "mnist" and len(data["files"]) == 4
    for key, digest in data["files"].items():
        assert hashlib.sha256((data_dir / key).read_bytes()).hexdigest() == digest
