"""Registry of protocols: entry points, ``"module:Class"`` names, and classes registered by import.

Three ways a protocol becomes known, all lazy (nothing under ``fednet.protocols`` is imported until
a protocol is asked for, so this module imports no concrete protocol and makes no import cycle):

1. **Entry points** of the group ``fednet.protocols`` (:data:`ENTRY_POINT_GROUP`). fednet declares its
   built-ins there in ``pyproject.toml``; a third-party distribution declares its own the same way::

       [project.entry-points."fednet.protocols"]
       myproto = "mypackage.protocols:MyProtocol"

   The entry point is loaded (its module imported) the first time its name is asked for.
2. **A path** ``"package.module:Class"`` as the protocol of a study run: the module is imported
   (:func:`fednet.plugins.import_object`: from ``sys.path``, else from the study file's directory
   and the working directory) and the class is used; it need not have a ``name``.
3. **Registration by import**: a :class:`~fednet.protocol.base.Protocol` subclass with a non-empty
   ``name`` calls :func:`register` when its class statement runs.

A name belongs to one class. Registering a second class under a taken name -- by import, or by
another distribution's entry point -- raises ``ValueError`` naming both classes; a user's class
named ``"conventional"`` can never silently replace the built-in one.

When fednet runs from a source checkout that is not installed (no entry points in its metadata),
the modules of ``fednet.protocols`` are scanned instead, on first use.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys
from typing import TYPE_CHECKING

from fednet.plugins import import_object, search_path

if TYPE_CHECKING:  # pragma: no cover
    from .base import Protocol

__all__ = ["ENTRY_POINT_GROUP", "register", "get", "names", "load_builtin", "search_path", "import_object",
           "qualified_name", "entry_points"]

#: The entry-point group protocols register in.
ENTRY_POINT_GROUP = "fednet.protocols"
#: The package holding the built-in protocols (the repository's ``protocols/``).
BUILTIN_PACKAGE = "fednet.protocols"

_REGISTRY: dict[str, type["Protocol"]] = {}
_eps_cache: tuple[tuple[str, ...], dict[str, list[importlib.metadata.EntryPoint]]] | None = None
_scanned: list[type["Protocol"]] | None = None


def qualified_name(cls: type) -> str:
    """``"module:QualName"`` of a class, the form entry points and studies use."""
    return f"{cls.__module__}:{cls.__qualname__}"


def entry_points() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """The entry points of :data:`ENTRY_POINT_GROUP` by name (distinct values only).

    Re-read whenever ``sys.path`` changed since the last call (a distribution put on the path at
    run time is found). More than one entry point under a name is a conflict that :func:`get`
    reports.
    """
    global _eps_cache
    key = tuple(sys.path)
    if _eps_cache is not None and _eps_cache[0] == key:
        return _eps_cache[1]
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        same = found.setdefault(ep.name, [])
        if all(e.value != ep.value for e in same):  # an editable and a regular install: the same target
            same.append(ep)
    _eps_cache = (key, found)
    return found


def _describe(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} (entry point of {dist.name if dist is not None else 'an installed distribution'})"


def _hint(a: str, b: str) -> str:
    """A hint when ``a`` and ``b`` are one file imported as ``protocols.x`` and ``fednet.protocols.x``."""
    (ma, _, qa), (mb, _, qb) = a.partition(":"), b.partition(":")
    if qa == qb and ma != mb and ma.removeprefix("fednet.") == mb.removeprefix("fednet."):
        return (" -- the same file imported under two module names; import built-in protocols as "
                "'fednet.protocols.<module>', never 'protocols.<module>'")
    return ""


def register(cls: type["Protocol"]) -> type["Protocol"]:
    """Register a protocol class under ``cls.name``.

    Parameters
    ----------
    cls : type
        A :class:`~fednet.protocol.base.Protocol` subclass with a non-empty ``name``.

    Returns
    -------
    type
        ``cls`` (usable as a decorator).

    Raises
    ------
    ValueError
        If ``name`` is empty, or already belongs to another class -- registered before, or declared
        by an entry point that points elsewhere; the message names both classes. Registering the
        same class again (same module and qualified name, e.g. a reloaded module) replaces it.
    """
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"protocol class {qualified_name(cls)} has no name to register under (name = {name!r})")
    mine = qualified_name(cls)
    other = _REGISTRY.get(name)
    if other is not None and qualified_name(other) != mine:
        theirs = qualified_name(other)
        raise ValueError(f"protocol name {name!r} is taken by {theirs}; cannot register {mine} under it"
                         + _hint(theirs, mine))
    for ep in entry_points().get(name, []):
        if ep.value.replace(" ", "") != mine:
            raise ValueError(f"protocol name {name!r} is taken by {_describe(ep)}; cannot register {mine} under it"
                             + _hint(ep.value.replace(" ", ""), mine))
    _REGISTRY[name] = cls
    return cls


def _check_protocol(obj: object, where: str) -> type["Protocol"]:
    from .base import Protocol

    if not (isinstance(obj, type) and issubclass(obj, Protocol)):
        raise TypeError(f"{where} is not a fednet Protocol subclass (got {obj!r})")
    return obj


def _scan_builtin() -> None:
    """Import every module of :data:`BUILTIN_PACKAGE` and register its named protocols (source
    checkouts without installed metadata). The modules are imported once; the classes found are
    registered again if the registry lost them."""
    global _scanned
    if _scanned is None:
        from .base import Protocol

        pkg = importlib.import_module(BUILTIN_PACKAGE)
        found = []
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                mod = importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")
                found += [obj for obj in vars(mod).values()
                          if isinstance(obj, type) and issubclass(obj, Protocol) and obj.__module__ == mod.__name__
                          and obj.__dict__.get("name")]
        _scanned = found
    for cls in _scanned:
        if _REGISTRY.get(cls.name) is not cls:
            register(cls)


def _builtins_declared() -> bool:
    return any(ep.value.startswith(BUILTIN_PACKAGE + ".") for eps in entry_points().values() for ep in eps)


def load_builtin() -> None:
    """Make the built-in protocols known: via their entry points, or by scanning the package.

    Idempotent. With installed metadata this imports nothing (entry points load on demand).
    """
    if not _builtins_declared():
        _scan_builtin()


def _load_entry_point(name: str) -> type["Protocol"] | None:
    eps = entry_points().get(name, [])
    if len(eps) > 1:
        raise ValueError(f"protocol name {name!r} is declared by more than one entry point: "
                         + " and ".join(_describe(ep) for ep in eps))
    if not eps:
        return None
    ep = eps[0]
    try:
        obj = ep.load()
    except (Exception, SystemExit) as e:          # a third-party plugin that cannot be imported
        raise ImportError(f"protocol {name!r}: its entry point {_describe(ep)} failed to load: "
                          f"{type(e).__name__}: {e}") from None
    cls = _check_protocol(obj, f"entry point {name!r} = {ep.value!r}")
    if getattr(cls, "name", "") not in ("", name):
        raise ValueError(f"entry point {name!r} = {ep.value!r} points at a protocol named {cls.name!r}; "
                         "the entry point's name must be the class's name")
    if _REGISTRY.get(name) is not cls:
        other = _REGISTRY.get(name)
        if other is not None:
            raise ValueError(f"protocol name {name!r} is taken by {qualified_name(other)}; "
                             f"the entry point {_describe(ep)} cannot take it" + _hint(qualified_name(other), ep.value))
        _REGISTRY[name] = cls
    return cls


def get(name: str) -> type["Protocol"]:
    """The protocol class for a registered name or a ``"package.module:Class"`` path.

    Parameters
    ----------
    name : str
        A registered name (``fednet list``), or ``"package.module:Class"``.

    Returns
    -------
    type
        A :class:`~fednet.protocol.base.Protocol` subclass.

    Raises
    ------
    KeyError
        Naming the unknown protocol and the registered ones.
    ValueError
        If two entry points declare the name (naming both), or a malformed path.
    ImportError, TypeError
        If a path cannot be imported or is not a Protocol subclass.
    """
    if ":" in name:
        return _check_protocol(import_object(name, "protocol"), f"protocol {name!r}")
    cls = _REGISTRY.get(name)
    if cls is not None and not entry_points().get(name):
        return cls
    loaded = _load_entry_point(name)
    if loaded is not None:
        return loaded
    load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown protocol {name!r}; registered: {', '.join(names())} "
                       "(or name a class as 'package.module:Class')") from None


def names() -> list[str]:
    """Sorted names of the known protocols (registered, or declared by an entry point)."""
    load_builtin()
    return sorted(set(_REGISTRY) | set(entry_points()))
