"""The ``fednet`` command.

``fednet run STUDY.toml [--out DIR] [--seed N] [--data-dir DIR] [--set KEY.PATH=VALUE ...]
[--epochs N] [--runs LABEL ...] [--targets ACC ...] [--jobs [N] | --scheduler ADDRESS] [--blas-threads N]``
    Run a study (a TOML file, or the name of a bundled one such as ``quickstart``) with a
    progress bar; write ``summary.json``, ``timing.json``, ``provenance.json``,
    ``accuracy_vs_time.png`` and per-run ``trace.csv`` to ``DIR`` (default
    ``results/<study name>``) and print the summary table. ``--set`` (repeatable) changes any
    key of the study (``--set network.dropout=0.1``, ``--set runs.0.params.alpha=16``,
    ``--set 'runs.*.params.mode="timing"'``), validated like the file; ``--epochs`` caps every
    run's rounds; ``--runs`` keeps the named runs (and the baseline); ``--targets`` replaces the
    target accuracies (``stop_at`` never stops a run before the highest one).
    ``--jobs [N]`` runs the runs x seeds as parallel tasks on a local Dask cluster of N
    single-threaded worker processes (default: the number of cores), ``--scheduler ADDRESS``
    on a running Dask cluster; the outputs are the serial run's, byte for byte (``timing.json``
    aside). ``--blas-threads N`` (default 1) sets the BLAS threads of each simulation.
``fednet describe PROTOCOL``
    Every parameter of a protocol: type, default, bounds and documentation.
``fednet schema``
    The JSON schema of a study file.
``fednet summarize DIR`` / ``fednet plot DIR``
    Reprint the summary table / redraw ``accuracy_vs_time.png`` from a saved study.
``fednet list``
    Name the registered protocols, topologies and bundled studies.
``fednet --version``

Exit status 2 for a bad study or bad data (the message names the problem; nothing is written).
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


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _cmd_run(args: argparse.Namespace) -> int:
    from fednet.learning.datasets import DatasetError
    from fednet.study.config import StudyError, load_study
    from fednet.study.runner import run_study

    try:
        study = load_study(_resolve(args.study), seeds=[args.seed] if args.seed is not None else None,
                           targets=args.targets, sets=args.set or (), only_runs=args.runs, max_epochs=args.epochs)
    except StudyError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    if args.jobs == 0:  # --jobs without a value
        from fednet.study.parallel import default_jobs

        args.jobs = default_jobs()
    out = Path(args.out) if args.out else Path("results") / study.name
    t0 = time.perf_counter()
    try:
        result = run_study(study, out, data_dir=args.data_dir, progress=not args.quiet,
                           command=["fednet", *(sys.argv[1:] if args.argv is None else args.argv)],
                           jobs=args.jobs, scheduler=args.scheduler, blas_threads=args.blas_threads)
    except DatasetError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        if args.jobs is None and args.scheduler is None:
            raise
        print(f"fednet: {e}", file=sys.stderr)  # dask.distributed missing
        return 2
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


def _cmd_summarize(args: argparse.Namespace) -> int:
    import json

    from fednet.study.results import format_per_seed, format_summary

    out = _saved(args)
    if out is None:
        return 2
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    print(f"{summary.get('study', out.name)} ({out})\n")
    print(format_summary(summary))
    if args.per_seed or summary.get("feature_seeds"):
        print("\nper seed:\n" + format_per_seed(summary))
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from fednet.study.plots import plot_results

    out = _saved(args)
    if out is None:
        return 2
    print(plot_results(out, args.output))
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
    """Entry point of the ``fednet`` command; returns the exit status."""
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
    par = p_run.add_mutually_exclusive_group()
    par.add_argument("--jobs", type=_positive, nargs="?", const=0, metavar="N",
                     help="run the runs x seeds in parallel on a local Dask cluster of N worker processes "
                          "(N omitted: the number of cores)")
    par.add_argument("--scheduler", metavar="ADDRESS",
                     help="run the runs x seeds on a running Dask cluster (e.g. tcp://host:8786)")
    p_run.add_argument("--blas-threads", type=_positive, default=1, metavar="N",
                       help="BLAS/OpenMP threads per simulation (default 1)")
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
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
