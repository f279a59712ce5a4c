"""Importing user objects named ``"package.module:Name"`` (protocols, topology builders).

Studies name a protocol class or a network builder that lives outside fednet as
``"package.module:Name"``. :func:`import_object` imports it from ``sys.path``, else from the
directories pushed by :func:`search_path` (a study file's directory, see
:func:`fednet.study.config.load_study`) and the working directory. No other fednet module is imported
here, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any
from collections.abc import Iterator
from pathlib import Path

__all__ = ["import_object", "import_callable", "search_path", "is_object_path", "find_file"]

_SEARCH: list[Path] = []


def is_object_path(spec: str) -> bool:
    """Whether ``spec`` has the ``"package.module:Name"`` form (a colon; identifiers either side)."""
    module, sep, attr = spec.partition(":")
    return bool(sep and module and attr
                and all(p.isidentifier() for p in module.split(".") + attr.split(".")))


@contextlib.contextmanager
def search_path(*dirs: str | Path | None) -> Iterator[None]:
    """Extra directories tried (after ``sys.path``) by :func:`import_object` inside the block."""
    added = [Path(d).resolve() for d in dirs if d is not None]
    _SEARCH[:0] = added
    try:
        yield
    finally:
        del _SEARCH[:len(added)]


def find_file(name: str | Path) -> Path:
    """A data file a study names (e.g. ``network.availability_trace``), found like a plugin module: an absolute path
    as it is, a relative one in the study file's folder (the :func:`search_path` dirs), then the working folder.

    Raises
    ------
    FileNotFoundError
        Naming the places tried.
    """
    p = Path(name).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p
        raise FileNotFoundError(f"no file {str(p)!r}")
    tried = list(dict.fromkeys([*_SEARCH, Path.cwd().resolve()]))
    for d in tried:
        if (d / p).is_file():
            return (d / p).resolve()
    raise FileNotFoundError(f"no file {str(name)!r} in {', '.join(repr(str(d)) for d in tried)}")


def _missing_is_target(e: ModuleNotFoundError, module: str) -> bool:
    # True when the module itself (or a parent package) is missing, not an import inside it
    return e.name is not None and (module == e.name or module.startswith(e.name + "."))


def guarded_import(module: str, what: str) -> Any:
    """``importlib.import_module(module)``, where a module that ends the process at import is an error.

    A plugin that calls ``sys.exit`` (or raises ``SystemExit``) while it is imported would end a run
    with that status and no output; here it is an :class:`ImportError` naming ``what`` and the status.

    Raises
    ------
    ImportError
        When importing raises ``SystemExit`` or any other exception (the plugin's; named with the file
        and line); import errors propagate unchanged.
    """
    try:
        return importlib.import_module(module)
    except SystemExit as e:
        raise ImportError(f"{what}: importing module {module!r} called sys.exit({e.code!r}); a plugin may not end "
                          f"the process when it is imported") from None
    except ImportError:
        raise
    except Exception as e:          # the plugin's own bug: named with where it happened (kept as the cause)
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        raise ImportError(f"{what}: importing module {module!r} failed{where}: {type(e).__name__}: {e}") from e


def import_object(spec: str, what: str = "object") -> object:
    """Import ``"package.module:Name"`` (``Name`` may be dotted).

    Parameters
    ----------
    spec : str
        ``"package.module:Name"``.
    what : str
        What the object is, for messages (``"protocol"``, ``"network builder"``).

    Returns
    -------
    object

    Raises
    ------
    ValueError
        For a spec not of that form.
    ImportError
        If the module is found nowhere (naming the directories searched) or lacks ``Name``.
    """
    if not is_object_path(spec):
        raise ValueError(f"{what} {spec!r} is not of the form 'package.module:Name'")
    module, _, attr = spec.partition(":")
    try:
        mod = guarded_import(module, f"{what} {spec!r}")
    except ModuleNotFoundError as e:
        if not _missing_is_target(e, module):
            raise
        extra = [str(p) for p in dict.fromkeys([*_SEARCH, Path.cwd().resolve()]) if str(p) not in sys.path]
        sys.path[:0] = extra
        try:
            mod = guarded_import(module, f"{what} {spec!r}")
        except ModuleNotFoundError as e2:
            if not _missing_is_target(e2, module):
                raise
            where = ", ".join(extra) or "nowhere else"
            raise ImportError(f"{what} {spec!r}: no module named {module!r} on sys.path or in {where}") from None
        finally:
            for p in extra:
                with contextlib.suppress(ValueError):
                    sys.path.remove(p)
    obj: object = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{what} {spec!r}: module {module!r} ({getattr(mod, '__file__', '?')}) "
                              f"has no attribute {attr!r}") from None
    return obj


def import_callable(spec: str, what: str, name: str | None = None) -> Any:
    """:func:`import_object` of a ``"package.module:name"`` that must be callable (a factory, a loader), for a
    pydantic validator: every failure is one :class:`ValueError` line naming ``name`` (default ``what``) and ``spec``.

    Raises
    ------
    ValueError
        If the object cannot be imported, or is not callable.
    """
    try:
        obj = import_object(spec, what)
    except ImportError as e:                     # one line, through pydantic (which names the field)
        raise ValueError(str(e)) from None
    if not callable(obj):
        raise ValueError(f"{name or what} {spec!r} is not callable (got a {type(obj).__name__})")
    return obj
