"""fednet.study: study files, runs, results and plots.

``load_study`` (:mod:`.config`), ``run_study`` (:mod:`.runner`) and ``load_results``
(:mod:`.results`) are importable from here; they are loaded on first use, so importing
``fednet.study`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_study", "run_study", "load_results", "StudyError"]

_WHERE = {"load_study": "config", "StudyError": "config", "run_study": "runner", "load_results": "results"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
