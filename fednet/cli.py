"""The ``fednet`` command.

``fednet run STUDY.toml [--out DIR] [--seed N] [--data-dir DIR]``
    Run a study (a TOML file, or the name of a bundled one such as ``quickstart``) with a
    progress bar; write ``summary.json``, ``accuracy_vs_time.png`` and per-run ``trace.csv``
    to ``DIR`` (default ``results/<study name>``) and print the summary table.
``fednet list``
    Name the registered protocols, topologies and bundled studies.

Exit status 2 for a bad study or bad data (the message names the problem; nothing is written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main", "bundled_studies"]


def bundled_studies() -> dict[str, Path]:
    """Study files shipped with fednet (package data of ``fednet.studies``, the repository's ``studies/``), by name."""
    from importlib.resources import files

    try:
        root = Path(str(files("fednet.studies")))
    except ModuleNotFoundError:  # pragma: no cover (a broken install)
        return {}
    return {p.stem: p for p in sorted(root.glob("*.toml"))} if root.is_dir() else {}


def _resolve(study: str) -> Path:
    p = Path(study)
    if p.exists() or p.suffix == ".toml":
        return p
    return bundled_studies().get(study, p)


def _cmd_run(args: argparse.Namespace) -> int:
    from fednet.learning.datasets import DatasetError
    from fednet.study.config import StudyError, load_study
    from fednet.study.runner import run_study

    try:
        study = load_study(_resolve(args.study), seeds=[args.seed] if args.seed is not None else None)
    except StudyError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("results") / study.name
    t0 = time.perf_counter()
    try:
        result = run_study(study, out, data_dir=args.data_dir, progress=not args.quiet)
    except DatasetError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    print(f"\n{study.name}: {len(study.runs)} runs x {len(study.seeds)} seeds in {time.perf_counter() - t0:.1f} s "
          f"(host wall time)\n")
    if study.description:
        print(study.description.strip() + "\n")
    print(result.table())
    print(f"\nresults in {result.out_dir}/ (summary.json, accuracy_vs_time.png, <run>/trace.csv)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from fednet.protocol import registry
    from fednet.topologies import TOPOLOGIES

    print("protocols:")
    for name in registry.names():
        doc = (registry.get(name).__doc__ or "").strip().splitlines()[0]
        print(f"  {name:<20} {doc}")
    print("topologies:")
    for name, fn in TOPOLOGIES.items():
        print(f"  {name:<20} {(fn.__doc__ or '').strip().splitlines()[0]}")
    print("studies:")
    for name, path in bundled_studies().items():
        print(f"  {name:<20} {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fednet`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="fednet", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a study")
    p_run.add_argument("study", help="study TOML file or bundled study name")
    p_run.add_argument("--out", help="output directory (default results/<study name>)")
    p_run.add_argument("--seed", type=int, help="run this single seed instead of the study's seeds")
    p_run.add_argument("--data-dir", help="directory with mnist/ and fashion-mnist/ (default $FEDNET_DATA)")
    p_run.add_argument("--quiet", action="store_true", help="no progress bar")
    p_run.set_defaults(func=_cmd_run)
    p_list = sub.add_parser("list", help="list protocols, topologies and bundled studies")
    p_list.set_defaults(func=_cmd_list)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
