"""The ``fednet`` command.

``fednet run STUDY.toml [--out DIR] [--seed N] [--data-dir DIR] [--set KEY.PATH=VALUE ...]
[--epochs N] [--runs LABEL ...] [--targets ACC ...]``
    Run a study (a TOML file, or the name of a bundled one such as ``quickstart``) with a
    progress bar; write ``summary.json``, ``timing.json``, ``provenance.json``,
    ``accuracy_vs_time.png`` and per-run ``trace.csv`` to ``DIR`` (default
    ``results/<study name>``) and print the summary table. ``--set`` (repeatable) changes any
    key of the study (``--set network.dropout=0.1``, ``--set runs.0.params.alpha=16``,
    ``--set 'runs.*.params.mode="timing"'``), validated like the file; ``--epochs`` caps every
    run's rounds; ``--runs`` keeps the named runs (and the baseline); ``--targets`` replaces the
    target accuracies (``stop_at`` never stops a run before the highest one).
``fednet describe PROTOCOL``
    Every parameter of a protocol: type, default, bounds and documentation.
``fednet schema``
    The JSON schema of a study file.
``fednet summarize DIR`` / ``fednet plot DIR``
    Reprint the summary table / redraw ``accuracy_vs_time.png`` from a saved study.
``fednet list``
    Name the registered protocols, topologies and bundled studies.
``fednet --version``

Exit status 2, with one message on stderr and no traceback, for any
:class:`fednet.errors.FednetError`: a bad study (the message names the key and value), bad
data, an output folder fednet may not replace or that another run holds (the message names its
process id), or, in a ``strict`` study, a round that cannot complete. Nothing is written then.
Status 128 + N when stopped by signal N (SIGINT: 130, SIGTERM: 143); the staging folder is
removed and the lock released. Any other exception is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
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

    study = load_study(_resolve(args.study), seeds=[args.seed] if args.seed is not None else None,
                       targets=args.targets, sets=args.set or (), only_runs=args.runs, max_epochs=args.epochs)
    out = Path(args.out) if args.out else Path("results") / study.name
    t0 = time.perf_counter()
    result = run_study(study, out, data_dir=args.data_dir, progress=not args.quiet,
                       command=["fednet", *(sys.argv[1:] if args.argv is None else args.argv)])
    print(f"\n{study.name}: {len(study.runs)} runs x {len(study.seeds)} seeds in {time.perf_counter() - t0:.1f} s "
          f"(host wall time)\n")
    if study.description:
        print(study.description.strip() + "\n")
    print(result.table())
    if study.data.feature_seed == "per_seed":
        print("\nper seed (the random-Fourier draw varies with the seed):\n" + result.per_seed_table())
    print(f"\nresults in {result.out_dir}/ (summary.json, timing.json, provenance.json, accuracy_vs_time.png, "
          "<run>/trace.csv)")
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    from fednet.study.describe import describe_protocol

    try:
        print(describe_protocol(args.protocol))
    except KeyError as e:
        from fednet.protocol import registry
        from fednet.study.config import _did_you_mean

        print(f"fednet: {e.args[0]}{_did_you_mean(args.protocol, registry.names())}", file=sys.stderr)
        return 2
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from fednet.study.describe import study_schema

    print(study_schema())
    return 0


def _saved(args: argparse.Namespace) -> Path | None:
    out = Path(args.dir)
    if not (out / "summary.json").is_file():
        print(f"fednet: {out} holds no summary.json (not a study's output directory)", file=sys.stderr)
        return None
    return out


def _unreadable(out: Path, e: BaseException) -> Exception:
    """A saved result directory whose files are damaged or not fednet's: a named DataError."""
    from fednet.errors import DataError

    what = f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e)
    return DataError(f"{out}: saved results are damaged or not written by this fednet ({what})")


def _cmd_summarize(args: argparse.Namespace) -> int:
    import json

    from fednet.study.results import format_per_seed, format_summary

    out = _saved(args)
    if out is None:
        return 2
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("runs"), dict):
            raise ValueError("summary.json holds no table of runs")
        table = format_summary(summary)
        per_seed = format_per_seed(summary) if args.per_seed or summary.get("feature_seeds") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _unreadable(out, e) from e
    print(f"{summary.get('study', out.name)} ({out})\n")
    print(table)
    if per_seed is not None:
        print("\nper seed:\n" + per_seed)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from fednet.study.plots import plot_results

    out = _saved(args)
    if out is None:
        return 2
    try:
        path = plot_results(out, args.output)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _unreadable(out, e) from e
    print(path)
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
    from fednet import __version__

    parser = argparse.ArgumentParser(prog="fednet", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"fednet {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress (-v) or details (-vv)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a study")
    p_run.add_argument("study", help="study TOML file or bundled study name")
    p_run.add_argument("--out", help="output directory (default results/<study name>)")
    p_run.add_argument("--seed", type=int, help="run this single seed instead of the study's seeds")
    p_run.add_argument("--data-dir", help="directory with mnist/ and fashion-mnist/ (default $FEDNET_DATA)")
    p_run.add_argument("--quiet", action="store_true", help="no progress bar")
    p_run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                       help="change a study key, e.g. network.dropout=0.1 or runs.0.params.alpha=16 (repeatable)")
    p_run.add_argument("--epochs", type=int, help="maximum rounds of every run")
    p_run.add_argument("--runs", nargs="+", metavar="LABEL", help="run only these runs (and the baseline)")
    p_run.add_argument("--targets", nargs="+", type=float, metavar="ACC", help="target accuracies, e.g. 0.9 0.95")
    p_run.set_defaults(func=_cmd_run)
    p_list = sub.add_parser("list", help="list protocols, topologies and bundled studies")
    p_list.set_defaults(func=_cmd_list)
    p_desc = sub.add_parser("describe", help="a protocol's parameters: type, default, bounds, documentation")
    p_desc.add_argument("protocol")
    p_desc.set_defaults(func=_cmd_describe)
    p_schema = sub.add_parser("schema", help="the JSON schema of a study file")
    p_schema.set_defaults(func=_cmd_schema)
    p_sum = sub.add_parser("summarize", help="reprint the summary of a saved study")
    p_sum.add_argument("dir", help="a study's output directory")
    p_sum.add_argument("--per-seed", action="store_true", help="also the time to each target at each seed")
    p_sum.set_defaults(func=_cmd_summarize)
    p_plot = sub.add_parser("plot", help="redraw accuracy_vs_time.png of a saved study")
    p_plot.add_argument("dir", help="a study's output directory")
    p_plot.add_argument("--output", help="PNG path (default DIR/accuracy_vs_time.png)")
    p_plot.set_defaults(func=_cmd_plot)
    args = parser.parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s")
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
