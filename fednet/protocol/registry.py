"""Registry of protocols by name.

A concrete :class:`~fednet.protocol.base.Protocol` subclass with a non-empty ``name`` registers
itself when its module is imported; :func:`load_builtin` imports every module of the
``protocols`` package, so ``get("conventional")`` works without knowing where it lives.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .base import Protocol

__all__ = ["register", "get", "names", "load_builtin"]

_REGISTRY: dict[str, type["Protocol"]] = {}
_loaded = False


def register(cls: type["Protocol"]) -> type["Protocol"]:
    """Register a protocol class under ``cls.name``; a second class with that name is an error."""
    name = cls.name
    other = _REGISTRY.get(name)
    if other is not None and other.__qualname__ != cls.__qualname__:
        raise ValueError(f"protocol name {name!r} is taken by {other.__module__}.{other.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def load_builtin() -> None:
    """Import every module of the ``protocols`` package (idempotent)."""
    global _loaded
    if _loaded:
        return
    import protocols

    for info in pkgutil.iter_modules(protocols.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"protocols.{info.name}")
    _loaded = True


def get(name: str) -> type["Protocol"]:
    """The protocol class registered as ``name``.

    Raises
    ------
    KeyError
        Naming the unknown protocol and the registered ones.
    """
    load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown protocol {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def names() -> list[str]:
    """Sorted names of the registered protocols."""
    load_builtin()
    return sorted(_REGISTRY)
