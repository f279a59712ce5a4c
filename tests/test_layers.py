"""The layer rules of DESIGN.md, checked on the imports of every module (parsed with ast, nothing imported).

* ``fednet.algebra``, ``fednet.codes``, ``fednet.learning`` never import ``fednet.sim``, SimPy, ``fednet.protocol``,
  ``fednet.study`` or ``protocols``;
* ``fednet.sim`` never imports ``protocols``, ``fednet.protocol`` or ``fednet.study``;
* ``fednet/protocol/base.py`` (and the other engine modules of ``fednet.protocol`` except the registry) never
  import a concrete protocol;
* a module of ``protocols/`` never imports another protocol module nor ``fednet.study``; it may import its own
  helper modules, ``protocols/<its name>_<part>.py`` that are no protocol (no entry point in pyproject.toml), e.g.
  e.g. ``fedvs.py`` a ``fedvs_<part>.py``, and a helper is imported by its protocol only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def hits(names: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


LOW = ("fednet.sim", "simpy", "fednet.protocol", "fednet.study", "fednet.cli", "protocols", "fednet.protocols")


@pytest.mark.parametrize("path", modules("fednet/algebra") + modules("fednet/codes") + modules("fednet/learning"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_math_layers_do_not_import_the_engine(path: Path) -> None:
    assert hits(imports(path), LOW) == []


@pytest.mark.parametrize("path", modules("fednet/sim/engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_imports_no_protocol_layer(path: Path) -> None:
    """The engine (steps, reference, backends) sits below fednet.protocol: it never imports it, nor a protocol."""
    assert hits(imports(path), ("protocols", "fednet.protocols", "fednet.protocol", "fednet.study")) == []


@pytest.mark.parametrize("path", modules("fednet/sim"), ids=lambda p: str(p.relative_to(ROOT)))
def test_sim_does_not_import_protocols(path: Path) -> None:
    assert hits(imports(path), ("protocols", "fednet.protocols", "fednet.protocol", "fednet.study")) == []


@pytest.mark.parametrize("path", [p for p in modules("fednet/protocol") if p.name != "registry.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_protocol_engine_imports_no_concrete_protocol(path: Path) -> None:
    assert hits(imports(path), ("protocols", "fednet.protocols", "fednet.study")) == []


def entry_point_modules() -> set[str]:
    """Stems of the ``protocols/`` modules declared as protocols (entry points of group ``fednet.protocols``)."""
    text = (ROOT / "pyproject.toml").read_text()
    group = text.split('[project.entry-points."fednet.protocols"]', 1)[1].split("\n[", 1)[0]
    return {line.split('"')[1].split(":")[0].rsplit(".", 1)[1] for line in group.splitlines()
            if "=" in line and not line.lstrip().startswith("#")}


def own_helpers(path: Path) -> set[str]:
    """The helper modules ``path`` may import: ``protocols/<stem>_<part>.py`` that are not protocols themselves."""
    protocols = entry_point_modules()
    return {p.stem for p in modules("protocols")
            if p.stem.startswith(path.stem + "_") and p.stem not in protocols}


@pytest.mark.parametrize("path", [p for p in modules("protocols") if p.name != "__init__.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_protocols_do_not_import_each_other(path: Path) -> None:
    own = own_helpers(path)
    found = [n for n in hits(imports(path), ("protocols", "fednet.protocols", "fednet.study"))
             if not any(n == f"{pkg}.{h}" or n.startswith(f"{pkg}.{h}.") for h in own
                        for pkg in ("protocols", "fednet.protocols"))]
    assert found == [], f"{path.name} imports {found}"


def test_helpers_are_imported_by_their_protocol_only() -> None:
    """A helper module (``<protocol>_<part>.py``, not an entry point) is imported by no other module of protocols/."""
    helpers = {h: p.stem for p in modules("protocols") for h in own_helpers(p)}
    assert "fedavg_lightsecagg" not in helpers          # a protocol is no helper (LightSecAgg's replay is the engine's)
    for path in modules("protocols"):
        for name in imports(path):
            parts = name.split(".")
            for h, owner in helpers.items():
                if h in parts[:3] and parts[0] in ("protocols", "fednet"):
                    assert path.stem == owner, f"{path.name} imports {owner}'s helper {h}"


def test_the_checker_sees_imports(tmp_path: Path) -> None:
    """The parser finds plain, from- and relative imports (so the rules above can fail)."""
    names = imports(ROOT / "fednet" / "protocol" / "base.py")
    assert "fednet.sim.simulation" in names and "fednet.protocol.primitives" in names
    assert hits({"protocols.conventional", "fednet.simx"}, ("protocols", "fednet.sim")) == ["protocols.conventional"]
