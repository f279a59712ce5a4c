"""The ``fednet`` command.

``fednet run STUDY.toml [--out DIR] [--seed N] [--data-dir DIR]``
    Run a study (a TOML file, or the name of a bundled one such as ``quickstart``) with a
    progress bar; write ``summary.json``, ``accuracy_vs_time.png`` and per-run ``trace.csv``
    to ``DIR`` (default ``results/<study name>``) and print the summary table.
``fednet list``
    Name the registered protocols, topologies and bundled studies.

Exit status 2, with one message on stderr and no traceback, for any
:class:`fednet.errors.FednetError`: a bad study (the message names the key and value), bad
data, an output folder fednet may not replace or that another run holds (the message names its
process id), or, in a ``strict`` study, a round that cannot complete. Nothing is written then.
Status 128 + N when stopped by signal N (SIGINT: 130, SIGTERM: 143); the staging folder is
removed and the lock released. Any other exception is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main", "bundled_studies"]


def bundled_studies() -> dict[str, Path]:
    """Study files shipped in the repository's ``studies/`` directory, by name."""
    root = Path(__file__).resolve().parents[1] / "studies"
    return {p.stem: p for p in sorted(root.glob("*.toml"))} if root.is_dir() else {}


def _resolve(study: str) -> Path:
    p = Path(study)
    if p.exists() or p.suffix == ".toml":
        return p
    return bundled_studies().get(study, p)


def _cmd_run(args: argparse.Namespace) -> int:
    from fednet.study.config import load_study
    from fednet.study.runner import run_study

    study = load_study(_resolve(args.study), seeds=[args.seed] if args.seed is not None else None)
    out = Path(args.out) if args.out else Path("results") / study.name
    t0 = time.perf_counter()
    result = run_study(study, out, data_dir=args.data_dir, progress=not args.quiet)
    print(f"\n{study.name}: {len(study.runs)} runs x {len(study.seeds)} seeds in {time.perf_counter() - t0:.1f} s "
          f"(host wall time)\n")
    if study.description:
        print(study.description.strip() + "\n")
    print(result.table())
    print(f"\nresults in {result.out_dir}/ (summary.json, accuracy_vs_time.png, <run>/trace.csv)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from fednet.protocol import registry
    from topologies import TOPOLOGIES

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
    """Entry point of the ``fednet`` command; returns the exit status.

    Returns
    -------
    int
        0 on success; 2 for any :class:`fednet.errors.FednetError` (printed as ``fednet: <message>``
        on stderr, without a traceback). Argument errors exit 2 through argparse.
    """
    from fednet.errors import FednetError

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
    try:
        return args.func(args)
    except FednetError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fednet: interrupted (SIGINT); no partial results were left", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
