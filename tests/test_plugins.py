"""Protocol plugins: "module:Class" studies, installed entry points, duplicate names, the package layout."""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from fednet.cli import main
from fednet.protocol import registry
from fednet.protocol.base import Protocol
from fednet.study.config import StudyError, load_study

ROOT = Path(__file__).resolve().parents[1]

STUDY = """
name = "plugin"
seeds = [0]
targets = [0.5]
epochs = 3
run_to_end = true
[data]
dataset = "digits"
n_components = 300
[network]
n_devices = 5
[[runs]]
label = "built-in"
protocol = "conventional"
params = {{ minibatch_fraction = 0.5 }}
[[runs]]
label = "plugin"
protocol = "{protocol}"
params = {{ minibatch_fraction = 0.5 }}
"""

# A protocol written outside the repository: conventional FL under another class, counting its instances.
PLUGIN = '''
from fednet.protocols.conventional import ConventionalFL

RUNS = []


class {cls}(ConventionalFL):
    """A protocol from outside fednet (a test plugin)."""

    name = {name!r}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RUNS.append(self.label)
'''


@pytest.fixture
def clean_registry(monkeypatch):
    """Restore the registry and drop the test's plugin modules afterwards."""
    saved = dict(registry._REGISTRY)
    modules = set(sys.modules)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    registry._eps_cache = None
    for m in set(sys.modules) - modules:
        if m.startswith(("w4_", "my_fl_w4")):
            del sys.modules[m]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return [{k: v for k, v in r.items() if k != "protocol"} for r in csv.DictReader(fh)]


def _same_as_builtin(out: Path) -> None:
    a, b = _rows(out / "built-in" / "trace.csv"), _rows(out / "plugin" / "trace.csv")
    assert len(a) == 4 and a == b  # rounds 0..3, every number equal to the built-in protocol's


def test_protocol_named_module_class_runs_from_the_command_line(tmp_path, clean_registry, capsys) -> None:
    (tmp_path / "my_fl_w4.py").write_text(PLUGIN.format(cls="MyFL", name=""))
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(protocol="my_fl_w4:MyFL"))
    out = tmp_path / "out"
    # the module sits beside the study file, which is neither the working directory nor on sys.path
    assert str(tmp_path) not in sys.path and Path.cwd() != tmp_path
    assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert set(sys.modules["my_fl_w4"].RUNS) == {"plugin"}  # built to check its fit, then run
    _same_as_builtin(out)
    assert "my_fl_w4" not in registry.names()  # an unnamed class is used, not registered


def test_module_class_errors_name_the_problem(tmp_path, clean_registry) -> None:
    (tmp_path / "w4_notproto.py").write_text("class NotAProtocol:\n    pass\n")
    for protocol, needle in [("w4_missing:X", "no module named 'w4_missing'"),
                             ("w4_notproto:Nope", "has no attribute 'Nope'"),
                             ("w4_notproto:NotAProtocol", "is not a fednet Protocol subclass")]:
        study = tmp_path / "s.toml"
        study.write_text(STUDY.format(protocol=protocol))
        with pytest.raises(StudyError) as err:
            load_study(study)
        assert needle in str(err.value) and "runs[1] (plugin).protocol" in str(err.value)


def _install_dist(site: Path, dist: str, entry_points: str) -> None:
    """A real installed distribution: a dist-info directory with METADATA and entry_points.txt."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fednet.protocols]\n{entry_points}\n")


def test_protocol_from_an_installed_entry_point_runs(tmp_path, clean_registry, monkeypatch, capsys) -> None:
    site = tmp_path / "site"
    (site / "w4_demo_plugin").mkdir(parents=True)
    (site / "w4_demo_plugin" / "__init__.py").write_text(PLUGIN.format(cls="DemoFL", name="w4_demo"))
    _install_dist(site, "w4_demo_plugin", "w4_demo = w4_demo_plugin:DemoFL")
    assert "w4_demo" not in registry.names()
    monkeypatch.syspath_prepend(str(site))
    assert "w4_demo" in registry.names()
    assert "w4_demo_plugin" not in sys.modules  # declared, not imported until asked for
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(protocol="w4_demo"))
    out = tmp_path / "out"
    assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    cls = registry.get("w4_demo")
    assert registry.qualified_name(cls) == "w4_demo_plugin:DemoFL"
    assert set(sys.modules["w4_demo_plugin"].RUNS) == {"plugin"}  # built to check its fit, then run
    _same_as_builtin(out)
    assert main(["list"]) == 0
    assert "w4_demo" in capsys.readouterr().out


def test_duplicate_name_is_an_error_naming_both_classes(tmp_path, clean_registry) -> None:
    class First(Protocol):
        name = "w4_dup"

    with pytest.raises(ValueError) as err:
        class Second(Protocol):
            name = "w4_dup"
    msg = str(err.value)
    assert "'w4_dup'" in msg and registry.qualified_name(First) in msg
    assert "test_duplicate_name_is_an_error_naming_both_classes.<locals>.Second" in msg
    assert registry.get("w4_dup") is First

    # a user's class cannot take a built-in's name, even before the built-in is imported
    (tmp_path / "w4_impostor.py").write_text(PLUGIN.format(cls="Impostor", name="conventional"))
    study = tmp_path / "s.toml"
    study.write_text(STUDY.format(protocol="w4_impostor:Impostor"))
    with pytest.raises(StudyError) as err:
        load_study(study)
    assert "fednet.protocols.conventional:ConventionalFL" in str(err.value)
    assert "w4_impostor:Impostor" in str(err.value)
    assert registry.get("conventional").__module__ == "fednet.protocols.conventional"

    # the old layout's import name (`protocols.conventional`, the same file) is refused with a hint
    import importlib.util

    import fednet.protocols.conventional as builtin

    spec = importlib.util.spec_from_file_location("protocols.conventional", builtin.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the module look themselves up there
    try:
        with pytest.raises(ValueError) as err:
            spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert "protocols.conventional:ConventionalFL" in str(err.value)
    assert "import built-in protocols as 'fednet.protocols.<module>'" in str(err.value)


def test_two_entry_points_under_one_name_are_an_error_naming_both(tmp_path, clean_registry, monkeypatch) -> None:
    site = tmp_path / "site"
    for dist in ("w4_one", "w4_two"):
        (site / dist).mkdir(parents=True)
        (site / dist / "__init__.py").write_text(PLUGIN.format(cls="P", name=""))
        _install_dist(site, dist, f"w4_clash = {dist}:P")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ValueError) as err:
        registry.get("w4_clash")
    assert "w4_one:P" in str(err.value) and "w4_two:P" in str(err.value)


def test_builtins_in_pyproject_match_the_protocols_package() -> None:
    """pyproject's entry points name every built-in protocol class and nothing else."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = meta["project"]["entry-points"]["fednet.protocols"]
    found = {}
    import importlib
    import pkgutil

    import fednet.protocols as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"fednet.protocols.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Protocol) and obj.__module__ == mod.__name__ \
                    and obj.__dict__.get("name"):
                found[obj.name] = registry.qualified_name(obj)
    assert declared == found
    assert {registry.qualified_name(registry.get(n)) for n in declared} == set(declared.values())


def test_pyproject_lists_every_package() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fednet").rglob("__init__.py")}
    mapped = {f"fednet.{d}" for d in ("protocols", "topologies", "studies")}
    assert set(meta["packages"]) == tree | mapped
    assert {k: v for k, v in meta["package-dir"].items() if k != "fednet"} == {
        f"fednet.{d}": d for d in ("protocols", "topologies", "studies")}
    assert meta["package-data"]["fednet.studies"] == ["*.toml"]


def test_a_users_protocols_folder_cannot_shadow_fednet_and_the_registry_imports_no_protocol(tmp_path) -> None:
    shadow = tmp_path / "protocols"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise RuntimeError('the user folder was imported')\n")
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "__init__.py").write_text("raise RuntimeError('the user folder was imported')\n")
    code = textwrap.dedent("""
        import sys
        from fednet.protocol import registry
        assert not [m for m in sys.modules if m.startswith("fednet.protocols")], "registry imported protocols"
        cls = registry.get("codedsecagg")
        import fednet.topologies
        print(cls.__module__, fednet.topologies.__name__, "protocols" in sys.modules)
    """)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["fednet.protocols.codedsecagg", "fednet.topologies", "False"]
