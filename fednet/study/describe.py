"""Discoverability: a protocol's parameters (``fednet describe``) and the study JSON schema (``fednet schema``).

A protocol's parameters are the fields of its pydantic ``Config``; their documentation is the
``Attributes`` section of the Config's NumPy docstring (and its base classes'), or a field's
``description``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

__all__ = ["attribute_docs", "parameter_table", "describe_protocol", "study_schema"]


def attribute_docs(cls: type) -> dict[str, str]:
    """``{name: text}`` from the ``Attributes`` sections of ``cls``'s and its bases' NumPy docstrings.

    An entry ``k, f : int`` documents both ``k`` and ``f``; a subclass's text wins.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__") or ""
        m = re.search(r"^\s*Attributes\n\s*-+\n(.*?)(?:\n\s*\n\s*[A-Z][A-Za-z ]+\n\s*-+\n|\Z)", doc, re.S | re.M)
        if not m:
            continue
        names: list[str] = []
        body: list[str] = []
        lines = m.group(1).splitlines()
        indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)

        def _flush() -> None:
            for n in names:
                docs[n] = " ".join(body).strip()

        for line in lines:
            if not line.strip():
                continue
            if len(line) - len(line.lstrip()) == indent:
                _flush()
                head = line.strip().split(" : ")[0]
                names, body = [n.strip() for n in head.split(",")], []
            else:
                body.append(line.strip())
        _flush()
    return docs


def _type_name(ann: Any) -> str:
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    text = text or str(ann)
    return re.sub(r"typing\.|<class '([^']+)'>", r"\1", text).replace("NoneType", "None")


def _bounds(field: Any) -> str:
    parts = []
    for m in field.metadata:
        for kind, attr, sym in ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"), (Le, "le", "<="),
                                (MinLen, "min_length", "len >="), (MaxLen, "max_length", "len <=")):
            if isinstance(m, kind):
                parts.append(f"{sym} {getattr(m, attr)}")
    return ", ".join(parts)


def parameter_table(model: type[BaseModel]) -> list[dict[str, str]]:
    """One record per field of ``model``: ``name``, ``type``, ``default`` ("required" if none),
    ``bounds`` (e.g. ``">= 1, <= 62"``) and ``doc``."""
    docs = attribute_docs(model)
    rows = []
    for name, f in model.model_fields.items():
        if f.default is PydanticUndefined and f.default_factory is None:
            default = "required"
        elif f.default_factory is not None:
            default = repr(f.default_factory())
        else:
            default = repr(f.default)
        rows.append({"name": name, "type": _type_name(f.annotation), "default": default, "bounds": _bounds(f),
                     "doc": f.description or docs.get(name, "")})
    return rows


def describe_protocol(name: str) -> str:
    """Text for ``fednet describe NAME``: the protocol's summary and every parameter.

    Raises
    ------
    KeyError
        For an unknown protocol (naming the registered ones).
    """
    from fednet.protocol import registry

    cls = registry.get(name)
    summary = (cls.__doc__ or "").strip().splitlines()
    lines = [f"{name}: {summary[0] if summary else cls.__qualname__}",
             f"  class {cls.__module__}.{cls.__qualname__}, parameters {cls.Config.__module__}.{cls.Config.__qualname__}",
             "", "parameters (study: [[runs]] params = { ... }):"]
    for row in parameter_table(cls.Config):
        extra = f"; {row['bounds']}" if row["bounds"] else ""
        lines.append(f"  {row['name']} : {row['type']} = {row['default']}{extra}")
        if row["doc"]:
            lines.append(f"      {row['doc']}")
    return "\n".join(lines)


def study_schema() -> str:
    """The JSON schema of a study file (``fednet schema``), as indented JSON text."""
    from .config import Study

    return json.dumps(Study.model_json_schema(), indent=2)
