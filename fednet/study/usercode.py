"""A study's own code: the ``"module:Name"`` protocols and network builders it names, found and shipped.

A study may name a protocol class or a network builder of its own as ``"package.module:Name"``
(:mod:`fednet.plugins`), imported from ``sys.path``, the study file's folder or the working folder.
Serially the client imports it; on Dask the workers must import the same code, wherever they run
and whatever their working folder. :func:`user_modules` finds the file of every such module (and the
top-level module or package it belongs to); :class:`UserCode` is a ``dask.distributed`` worker plugin
that carries their source (the top-level module's file, or every ``.py`` file of its package) to every
worker, writes it into the worker's local folder and puts that folder first on ``sys.path``, so serial,
``--jobs`` and ``--scheduler`` runs import the very same code. :func:`check_workers` imports every
named object on every worker before any task is submitted, so a study whose code does not import
there fails at once, with one message, and leaves no checkpoint behind.

Modules installed in the environment (under ``site-packages`` or the standard library) and fednet's own
are not shipped: every worker has them. :func:`user_modules` also gives ``provenance.json`` each user
module's path and SHA-256.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednet.plugins import is_object_path, search_path

__all__ = ["user_code_error", "UserModule", "user_specs", "user_modules", "ship_files", "UserCode", "check_workers", "study_folder",
           "MAX_SHIPPED_BYTES"]

def user_code_error(obj: Any, exc: BaseException, doing: str) -> Exception | None:
    """The one-line :class:`~fednet.errors.PluginError` for ``exc``, raised by a study's own code ``obj`` while
    fednet was ``doing`` something with it; None when ``obj`` is fednet's own (a bug: its traceback stays) or
    ``exc`` must go on as it is.

    Parameters
    ----------
    obj : class or function
        The protocol class or network builder (its ``__module__`` tells whose code it is).
    exc : BaseException
        What it raised. A :class:`~fednet.errors.FednetError` (already named), ``KeyboardInterrupt``,
        ``GeneratorExit`` and the ``SystemExit`` of fednet's signal handler (:mod:`fednet.study.output`) are
        never wrapped; the user's own ``sys.exit()`` is.
    doing : str
        E.g. ``"in round 3"``, ``"when constructed"``.

    Returns
    -------
    fednet.errors.PluginError or None
        Naming ``module:Name``, ``doing``, the innermost frame in the object's own file (else the innermost
        frame) as ``file:line``, and the exception's type and message.
    """
    from fednet.errors import FednetError, PluginError

    module = str(getattr(obj, "__module__", "") or "")
    if module == "fednet" or module.startswith("fednet.") or isinstance(exc, (FednetError, KeyboardInterrupt,
                                                                               GeneratorExit)):
        return None
    if not isinstance(exc, (Exception, SystemExit)):
        return None
    tb, own, last = exc.__traceback__, None, None
    file = getattr(sys.modules.get(module), "__file__", None)
    while tb is not None:
        last = tb
        if file is not None and tb.tb_frame.f_code.co_filename == file:
            own = tb
        tb = tb.tb_next
    if isinstance(exc, SystemExit) and last is not None and last.tb_frame.f_code.co_name == "_on_signal":
        return None                                   # a signal: the process ends with 128 + N
    at = own or last
    where = f" at {at.tb_frame.f_code.co_filename}:{at.tb_lineno}" if at is not None else ""
    name = f"{module}:{getattr(obj, '__qualname__', getattr(obj, '__name__', obj))}"
    what = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
    return PluginError(f"{name} raised {doing}{where}: {what}")


#: Most bytes of source :class:`UserCode` carries (a package larger than this is refused, by name).
MAX_SHIPPED_BYTES = 32 * 2**20


@dataclass(frozen=True)
class UserModule:
    """One module of the user's own code named by a study.

    Attributes
    ----------
    spec : str
        ``"package.module:Name"`` as the study names it.
    what : str
        ``"protocol"``, ``"model factory"``, ``"dataset loader"`` or ``"network builder"``.
    module : str
        The module's dotted name.
    path : str or None
        The module's file (None for a module without one).
    sha256 : str or None
        SHA-256 of that file.
    installed : bool
        Whether it comes from the environment (site-packages, the standard library, fednet): not shipped.
    files : dict of str to bytes
        What :class:`UserCode` ships: the top-level module's file, or every ``.py`` file of its package,
        by path relative to the folder that holds it (empty when ``installed``).
    """

    spec: str
    what: str
    module: str
    path: str | None
    sha256: str | None
    installed: bool
    files: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """``provenance.json``'s entry: spec, what, module, path, sha256, shipped."""
        return {"spec": self.spec, "what": self.what, "module": self.module, "path": self.path,
                "sha256": self.sha256, "shipped": not self.installed}


def study_folder(study: Any) -> Path | None:
    """The folder of the file a study was loaded from (:func:`fednet.study.config.load_study`), else None."""
    return getattr(study, "_folder", None)


def user_specs(study: Any) -> list[tuple[str, str]]:
    """Every ``"module:Name"`` a study names, with what it is, in study order, each once.

    Parameters
    ----------
    study : fednet.study.config.Study

    Returns
    -------
    list of (spec, what)
        ``what`` is ``"protocol"``, ``"model factory"`` (a run's ``params.model``), ``"dataset loader"`` (``data.dataset``) or
        ``"network builder"``.
    """
    found: dict[str, str] = {}
    if is_object_path(study.data.dataset):                # a user's dataset loader (fednet.learning.datasets)
        found.setdefault(study.data.dataset, "dataset loader")
    for run in study.runs:
        if is_object_path(run.protocol):
            found.setdefault(run.protocol, "protocol")
        model = (run.params or {}).get("model")          # a user's model factory (fednet.protocol.neural)
        if isinstance(model, str) and is_object_path(model):
            found.setdefault(model, "model factory")
        kind = run.network.get("kind", study.network.kind) if run.network else study.network.kind
        if isinstance(kind, str) and is_object_path(kind):
            found.setdefault(kind, "network builder")
    return list(found.items())


def _environment_roots() -> list[Path]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            roots.add(Path(sysconfig.get_paths()[key]).resolve())
    import fednet

    roots.add(Path(fednet.__file__).resolve().parent)
    return sorted(roots)


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _package_files(module: Any, top: str) -> dict[str, bytes]:
    """The source a worker needs for the top-level module ``top``: its file, or its package's ``.py`` files."""
    files: dict[str, bytes] = {}
    paths = list(getattr(module, "__path__", []) or [])
    if not paths:                                          # a single-file module
        src = Path(module.__file__)
        files[src.name] = src.read_bytes()
        return files
    total = 0
    for folder in paths:
        folder = Path(folder)
        for p in sorted(folder.rglob("*.py")):
            if "__pycache__" in p.parts or not p.is_file():
                continue
            data = p.read_bytes()
            total += len(data)
            if total > MAX_SHIPPED_BYTES:
                raise ImportError(f"package {top!r} ({folder}) holds more than {MAX_SHIPPED_BYTES // 2**20} MiB of "
                                  f"Python source; fednet ships a study's own code to the Dask workers: install "
                                  f"the package on every worker instead (then it is not shipped)")
            files[str(Path(top) / p.relative_to(folder))] = data
    return files


def user_modules(study: Any) -> list[UserModule]:
    """The user's own modules a study names (imported here, from the study file's folder as the study was).

    Parameters
    ----------
    study : fednet.study.config.Study

    Returns
    -------
    list of UserModule
        One per distinct ``"module:Name"`` (:func:`user_specs`).

    Raises
    ------
    ImportError
        When a module cannot be imported (the study was loaded in another process or folder) or is too
        large to ship.
    """
    from fednet.plugins import import_object

    roots = _environment_roots()
    out = []
    with search_path(study_folder(study)):
        for spec, what in user_specs(study):
            import_object(spec, what)
            module = spec.partition(":")[0]
            mod = sys.modules[module]
            file = getattr(mod, "__file__", None)
            path = Path(file).resolve() if file else None
            top = module.split(".")[0]
            installed = path is None or top == "fednet" or _inside(path, roots)
            files = {} if installed else {**_package_files(sys.modules[top], top), **_siblings(sys.modules[top], roots)}
            out.append(UserModule(spec, what, module, None if path is None else str(path),
                                  None if path is None or not path.is_file() else _sha256(path), installed, files))
    return out


def _import_root(module: Any) -> Path | None:
    """The folder a top-level module was imported from (its file's folder; a package's parent folder)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    p = Path(file).resolve()
    return p.parent.parent if getattr(module, "__path__", None) else p.parent


def _siblings(module: Any, roots: list[Path]) -> dict[str, bytes]:
    """The source of the other top-level modules imported so far from the folder ``module`` came from.

    A protocol that imports a helper module beside it (``from helpers import x``) needs that helper on the
    workers too.
    """
    folder = _import_root(module)
    files: dict[str, bytes] = {}
    if folder is None:
        return files
    for name, mod in list(sys.modules.items()):
        if "." in name or name == "fednet" or mod is None or mod is module:
            continue
        file = getattr(mod, "__file__", None)
        if not file or _import_root(mod) != folder or _inside(Path(file).resolve(), roots):
            continue
        files.update(_package_files(mod, name))
    return files


def ship_files(modules: list[UserModule]) -> dict[str, bytes]:
    """Every file the modules' :class:`UserCode` plugin carries, by relative path (sorted)."""
    files: dict[str, bytes] = {}
    for m in modules:
        files.update(m.files)
    return dict(sorted(files.items()))


def _roots(files: dict[str, bytes]) -> list[str]:
    """The top-level module names of shipped files (``pkg/x.py`` -> ``pkg``; ``mod.py`` -> ``mod``)."""
    return sorted({Path(p).parts[0].removesuffix(".py") for p in files})


try:
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # pragma: no cover - dask is a dependency
    _WorkerPlugin = object  # type: ignore[assignment,misc]


class UserCode(_WorkerPlugin):
    """A ``dask.distributed`` worker plugin carrying a study's own modules (their source) to every worker.

    Parameters
    ----------
    files : dict of str to bytes
        Source files by path relative to an import root (:func:`ship_files`).

    Notes
    -----
    ``setup`` writes the files under ``<worker local folder>/fednet-user-code/<sha256 of the files>/``, puts
    that folder first on ``sys.path`` and forgets any module of the same top-level names imported before (a
    long-lived worker that ran an older version of the code imports this one). The plugin's name holds the
    digest, so studies with different code can share one cluster.
    """

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(sorted(files.items()))
        h = hashlib.sha256()
        for name, data in self.files.items():
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        self.digest = h.hexdigest()
        self.name = f"fednet-user-code-{self.digest[:16]}"
        self._folder: str | None = None

    def setup(self, worker: Any) -> None:
        """Write the source into the worker's local folder and import from there first."""
        base = getattr(worker, "local_directory", None) or os.path.join(os.getcwd(), "dask-worker-space")
        folder = Path(base) / "fednet-user-code" / self.digest
        for name, data in self.files.items():
            p = folder / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.is_file() or p.read_bytes() != data:
                tmp = p.with_name(p.name + f".tmp{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, p)
        for top in _roots(self.files):                     # an older version imported by an earlier study
            for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                file = getattr(sys.modules[name], "__file__", None) or ""
                if not file.startswith(str(folder)):
                    del sys.modules[name]
        self._folder = str(folder)
        if self._folder not in sys.path:
            sys.path.insert(0, self._folder)
        importlib.invalidate_caches()

    def teardown(self, worker: Any) -> None:
        """Take the folder off ``sys.path``."""
        if self._folder is not None:
            with contextlib.suppress(ValueError):
                sys.path.remove(self._folder)


def _probe(specs: list[tuple[str, str]]) -> list[str]:
    """Import every ``(spec, what)`` in this process; the errors, one line each (run on every worker)."""
    from fednet.plugins import import_object

    errors = []
    for spec, what in specs:
        try:
            import_object(spec, what)
        except (ImportError, ValueError, TypeError) as e:
            errors.append(f"{what} {spec!r}: {e}")
    return errors


def check_workers(client: Any, study: Any, modules: list[UserModule] | None = None) -> None:
    """Ship a study's own code to a Dask cluster and check every worker imports it, before any task runs.

    Parameters
    ----------
    client : distributed.Client
    study : fednet.study.config.Study
    modules : list of UserModule, optional
        :func:`user_modules` of the study (computed when omitted).

    Raises
    ------
    fednet.errors.ConfigError
        When a worker cannot import a protocol or builder the study names (the worker and the error named).
    """
    from fednet.errors import ConfigError

    specs = user_specs(study)
    if not specs:
        return
    modules = user_modules(study) if modules is None else modules
    files = ship_files(modules)
    if files:
        client.register_plugin(UserCode(files))
    failed = {w: errs for w, errs in client.run(_probe, specs).items() if errs}
    if failed:
        worker, errs = next(iter(sorted(failed.items())))
        raise ConfigError(f"Dask worker {worker} ({len(failed)} of {len(client.scheduler_info()['workers'])} "
                          f"workers) cannot import the study's own code: {errs[0]}; nothing was run")


@contextlib.contextmanager
def study_imports(study: Any) -> Iterator[None]:
    """Inside the block, ``"module:Name"`` imports also search the study file's folder (:func:`search_path`)."""
    with search_path(study_folder(study)):
        yield
