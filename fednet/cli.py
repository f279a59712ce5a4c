"""The ``fednet`` command.

``fednet run STUDY.toml [--out DIR] [--seed N] [--data-dir DIR] [--set KEY.PATH=VALUE ...]
[--epochs N] [--runs LABEL ...] [--targets ACC ...] [--jobs [N] | --scheduler ADDRESS] [--blas-threads N]
[--threads N] [--resume] [--secret-seed N]``
    Run a study (a TOML file, or the name of a bundled one such as ``quickstart``) with a
    progress bar; write ``summary.json``, ``timing.json``, ``provenance.json``,
    ``accuracy_vs_time.png`` and per-run ``trace.csv`` to ``DIR`` (default
    ``results/<study name>``) and print the summary table. ``--set`` (repeatable) changes any
    key of the study (``--set network.dropout=0.1``, ``--set runs.0.params.alpha=16``,
    ``--set 'runs.*.params.mode="timing"'``), validated like the file; ``--epochs`` caps every
    run's rounds; ``--runs`` keeps the named runs (and the baseline); ``--targets`` replaces the
    target accuracies (``stop_at`` never stops a run before the highest one). ``--set``, ``--runs``
    and the output folders name runs alike: by their labels after sweep expansion (or a pattern with
    ``*``/``?``; an index counts the expanded runs); ``--set`` on a key a sweep sets is refused
    (:func:`fednet.study.config.load_study`). The progress (stderr) weighs runs by measured host cost
    (:mod:`fednet.study.progress`): a bar on a terminal, a line at most every 30 s elsewhere.
    ``--jobs [N]`` runs the runs x seeds as parallel tasks on a local Dask cluster of N
    single-threaded worker processes (default: the cores the load average leaves free,
    :func:`fednet.study.parallel.default_jobs`), ``--scheduler ADDRESS`` on a running Dask cluster;
    the outputs are the serial run's, byte for byte (``timing.json`` aside); with fewer runs x seeds than N, the
    spare cores become threads inside the runs (a single one runs in this process, without a cluster).
    ``--blas-threads N`` (default 1) sets the BLAS threads of each simulation; ``--threads N``
    the threads its sliced kernels use (:mod:`fednet.algebra.slices`; the same outputs for any N).
    ``--resume`` reuses the (run, seed) pairs an interrupted run of the same command finished
    (:mod:`fednet.study.checkpoint`) and runs only the others.
    Every study runs under one secret seed (the root of its pads, masks and noise; never derived from
    the public seeds): ``--secret-seed N``, else ``$FEDNET_SECRET_SEED``, else the resumed pairs', else
    drawn from OS entropy. It is written to ``DIR/secret_seed.json`` (mode 0600, apart from the public
    results) so that a run whose numbers depend on its secrets (``summary.json``: ``secret_dependent``)
    can be replayed exactly with ``--secret-seed N``.
``fednet describe PROTOCOL``
    Every parameter of a protocol: type, default, bounds and documentation.
``fednet schema``
    The JSON schema of a study file.
``fednet summarize DIR [--per-seed] [--format text|markdown|latex|csv]`` / ``fednet plot DIR [--output F.pdf] [--log-x | --speedup] [--dpi N (1-1200)]``
    Reprint the summary table (or one tidy row per run and target as Markdown, LaTeX or CSV) / redraw
    ``accuracy_vs_time.png`` from a saved study (the mean over seeds with their range; PNG, PDF or SVG).
    With ``--speedup``, ``speedup.png``: each run's speed-up over the baseline per target with its interval.
``fednet report STUDY DIR [--targets ACC ...] [--write]``
    The measured table of a study's header from a saved result folder of that study (:mod:`fednet.study.report`):
    per run the seeds counted, the last test accuracy and, per target, the time (geometric mean [95 % interval]),
    the devices' joules (with an energy model) and the speed-up over the baseline, as ``# `` comment lines with the
    command and date of the run and what it changed against the file. ``DIR`` must hold results of ``STUDY`` (its
    ``study.json`` names it and runs only runs of the file). ``--targets`` re-summarizes the saved traces at other
    accuracies; ``--write`` replaces the block between ``# >>> fednet report`` and ``# <<< fednet report`` in the
    study file (put at its top when absent), atomically, every other byte unchanged.
``fednet list``
    Name the registered protocols, topologies and bundled studies.
``fednet topology STUDY [--run LABEL] [--seed N] [--plot tree.png]``
    Build a run's network without running anything: print the devices (MAC rate, link rates, loss,
    group), the groups and CodedSecAgg's group tree (Sec. VI-D); ``--plot`` draws the network and
    the tree to an image.
``fednet --version``

Exit status 2, with one message on stderr and no traceback, for any
:class:`fednet.errors.FednetError`: a bad study (the message names the key and value), bad
data, an output folder fednet may not replace or that another run holds (the message names its
process id), or, in a ``strict`` study, a round that cannot complete. Nothing is written then.
The same for a plugin that cannot be imported or reuses a taken name (``fednet describe``; ``fednet list`` reports
it on stderr and lists the others) and for a reader that closes stdout early (``fednet list | head``: broken pipe).
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


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return n


#: Largest ``fednet plot --dpi`` (a 7.5 x 4.8 inch figure: 9000 x 5760 pixels, about 200 MB of image in memory).
MAX_DPI = 1200


def _dpi(text: str) -> int:
    n = _positive(text)
    if n > MAX_DPI:
        raise argparse.ArgumentTypeError(f"expected a resolution in [1, {MAX_DPI}] dots per inch, got {text!r}")
    return n


def _cmd_run(args: argparse.Namespace) -> int:
    from fednet.study.config import load_study
    from fednet.study.runner import run_study

    study = load_study(_resolve(args.study), seeds=[args.seed] if args.seed is not None else None,
                       targets=args.targets, sets=args.set or (), only_runs=args.runs, max_epochs=args.epochs)
    if args.jobs == 0:  # --jobs without a value
        from fednet.study.parallel import default_jobs

        args.jobs = default_jobs()
    out = Path(args.out) if args.out else Path("results") / study.name
    t0 = time.perf_counter()
    try:
        result = run_study(study, out, data_dir=args.data_dir, progress=not args.quiet,
                           command=["fednet", *(sys.argv[1:] if args.argv is None else args.argv)],
                           jobs=args.jobs, scheduler=args.scheduler, blas_threads=args.blas_threads,
                           resume=args.resume, threads=args.threads, secret_seed=args.secret_seed)
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
    if args.explain_engine:
        print("\n" + explain_engine(result.timing.get("engine", {})))
    print(f"\nresults in {result.out_dir}/ (summary.json, timing.json, provenance.json, accuracy_vs_time.png, "
          "<run>/trace.csv; secret_seed.json, private: it replays the runs' secrets)")
    return 0


def explain_engine(engine: dict) -> str:
    """The engine paths of ``timing.json``'s ``engine`` (label -> :meth:`EnginePaths.as_dict`), run by run: which
    backend ran each step, or why the reference did (:mod:`fednet.sim.engine`)."""
    from fednet.sim.engine.paths import EnginePaths

    lines = ["engine paths (which backend ran each step; 'reference' = SimPy processes, with the reasons):"]
    for label, rows in engine.items():
        paths = EnginePaths()
        paths.merge(rows)
        lines += [f"{label}:", paths.explain()]
    return "\n".join(lines)


def _cmd_describe(args: argparse.Namespace) -> int:
    from fednet.study.describe import describe_protocol

    try:
        text = describe_protocol(args.protocol)
    except KeyError as e:
        from fednet.protocol import registry
        from fednet.study.config import _did_you_mean

        print(f"fednet: {e.args[0]}{_did_you_mean(args.protocol, registry.names())}", file=sys.stderr)
        return 2
    except (ImportError, ValueError, TypeError) as e:   # a broken or clashing plugin (a name taken twice)
        print(f"fednet: protocol {args.protocol!r}: {e}", file=sys.stderr)
        return 2
    print(text)
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

    from fednet.study.results import format_frame, format_per_seed, format_summary, summary_frame

    out = _saved(args)
    if out is None:
        return 2
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("runs"), dict):
            raise ValueError("summary.json holds no table of runs")
        if args.format != "text":
            text = format_frame(summary_frame(summary), args.format)
        table = format_summary(summary)
        per_seed = format_per_seed(summary) if args.per_seed or summary.get("feature_seeds") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise _unreadable(out, e) from e
    if args.format != "text":
        print(text, end="")
        return 0
    print(f"{summary.get('study', out.name)} ({out})\n")
    print(table)
    if per_seed is not None:
        print("\nper seed:\n" + per_seed)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from fednet.study.plots import plot_results, plot_speedup_results

    out = _saved(args)
    if out is None:
        return 2
    if args.speedup and args.log_x:
        print("fednet: --log-x is for the accuracy plot, not with --speedup", file=sys.stderr)
        return 2
    if args.output is not None:                       # checked before drawing: the message names --output
        target = Path(args.output)
        if target.suffix.lower() not in (".png", ".pdf", ".svg"):
            print(f"fednet: --output {args.output!r}: the image format comes from the extension: .png, .pdf or .svg",
                  file=sys.stderr)
            return 2
        if not target.parent.is_dir():
            print(f"fednet: --output {args.output!r}: no folder {str(target.parent)!r} to write it into",
                  file=sys.stderr)
            return 2
        if target.is_dir():
            print(f"fednet: --output {args.output!r} is a folder; name an image file", file=sys.stderr)
            return 2
    try:
        if args.speedup:
            import json

            summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
            if summary.get("baseline") is None or len(summary.get("runs", {})) < 2:
                print(f"fednet: --speedup needs a study with a baseline and another run; {out} has baseline "
                      f"{summary.get('baseline')!r}", file=sys.stderr)
                return 2
            path = plot_speedup_results(out, args.output, dpi=args.dpi)
        else:
            path = plot_results(out, args.output, log_x=args.log_x, dpi=args.dpi)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise _unreadable(out, e) from e
    print(path)
    return 0


def _target(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = float("nan")
    if not 0.0 < t <= 1.0:                       # NaN fails too
        raise argparse.ArgumentTypeError(f"expected a target accuracy in (0, 1], got {text!r}")
    return t


def _cmd_report(args: argparse.Namespace) -> int:
    import json
    import shlex

    from fednet.errors import FednetError
    from fednet.study.config import load_study
    from fednet.study.report import (as_validated, format_report, report_summary, saved_result,
                                     study_differences, write_block)

    path = _resolve(args.study)
    if args.write and not path.is_file():
        print(f"fednet: --write: {args.study!r} is not a study file to write into", file=sys.stderr)
        return 2
    study = load_study(path)
    out = _saved(args)
    if out is None:
        return 2
    summary, saved, prov = saved_result(out)
    try:
        differences = study_differences(as_validated(saved), json.loads(study.model_dump_json()), str(out))
        if args.targets is not None and len(set(args.targets)) != len(args.targets):
            print(f"fednet: --targets: {args.targets} names a target twice", file=sys.stderr)
            return 2
        chosen = report_summary(out, summary, sorted(args.targets) if args.targets else None)
        command = shlex.join(["fednet", "report", args.study, args.dir,
                              *(["--targets", *(f"{t:g}" for t in sorted(args.targets))] if args.targets else []),
                              "--write"])
        block = format_report(chosen, command=command, result=args.dir, provenance=prov, differences=differences)
    except FednetError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise _unreadable(out, e) from e
    if args.write:
        write_block(path, block)
    print(block, end="")
    if args.write:
        print(f"fednet: wrote the report block into {path}", file=sys.stderr)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from fednet.protocol import registry
    from fednet.topologies import TOPOLOGIES

    print("protocols:")
    for name in registry.names():
        try:
            doc = ((registry.get(name).__doc__ or "").strip().splitlines() or [""])[0]
        except Exception as e:   # noqa: BLE001 - one broken plugin (a clashing name, an import error): reported, skipped
            print(f"fednet: protocol {name!r} skipped: {e}", file=sys.stderr)
            print(f"  {name:<20} (broken plugin, skipped: see stderr)")
            continue
        print(f"  {name:<20} {doc}")
    print("topologies:")
    for name, fn in TOPOLOGIES.items():
        print(f"  {name:<20} {(fn.__doc__ or '').strip().splitlines()[0]}")
    from fednet.sim.cells import SCHEDULERS
    from fednet.topologies.radio import RATE_MODELS

    print(f"  {'':<20} cell schedulers (params.scheduler): {', '.join(SCHEDULERS)}")
    print(f"  {'':<20} radio_star rate models (params.rate_model): {', '.join(RATE_MODELS)}")
    print("studies:")
    for name, path in bundled_studies().items():
        print(f"  {name:<20} {path}")
    return 0


def _cmd_topology(args: argparse.Namespace) -> int:
    from fednet.study.config import StudyError, load_study
    from fednet.study.runner import build_network
    from fednet.topologies.groups import has_groups, membership
    from fednet.topologies.secagg_tree import draw_topology, group_tree

    try:
        study = load_study(_resolve(args.study))
    except StudyError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    if args.run is not None:
        runs = [r for r in study.runs if r.name == args.run]
        if not runs:
            from fednet.study.config import _did_you_mean, label_choices

            labels = [r.name for r in study.runs]
            print(f"fednet: --run: no run labelled {args.run!r}{_did_you_mean(args.run, labels)}; "
                  f"{label_choices(args.run, labels)}", file=sys.stderr)
            return 2
        run = runs[0]
    else:  # the first grouped run, else the first run
        def _n_groups(r):
            return study.run_params(r).get("groups")
        run = next((r for r in study.runs if isinstance(_n_groups(r), int) and _n_groups(r) > 1), study.runs[0])
    seed = study.seeds[0] if args.seed is None else args.seed
    net = study.run_network(run)
    graph = build_network(net, seed)
    from fednet.sim.simulation import Simulation

    Simulation(graph, seed)          # refuses what a run would (a non-finite rate, a loss of 1 or more), by name
    n = study.run_params(run).get("groups")
    groups = membership(graph, None if has_groups(graph) else (n if isinstance(n, int) else 1))
    tree = group_tree(groups)
    devs = [(k, a) for k, a in graph.nodes(data=True) if a.get("role") == "device"]
    server = next(k for k, a in graph.nodes(data=True) if a.get("role") == "server")
    group_of = {i: g for g, m in enumerate(groups) for i in m}
    print(f"{study.name}: run {run.name!r} ({run.protocol}), seed {seed}, network {net.kind}, "
          f"{len(devs)} devices, {len(groups)} group(s)"
          + ("" if has_groups(graph) else " (consecutive, from the run's groups parameter)"))
    print(f"  server: {graph.nodes[server].get('mac_rate', float('nan')):.4g} MAC/s; header overhead "
          f"{graph.graph.get('header_overhead', 0.0)}, packet_bits {graph.graph.get('packet_bits')}")
    edge_servers = [k for k, a in graph.nodes(data=True) if a.get("role") == "edge"]
    if edge_servers:                           # a hierarchy (fednet.topologies.hierarchy): cells, edge servers, backhaul
        print(f"  edge servers: {len(edge_servers)}, each with a backhaul to the server (the cloud)")
        print(f"  {'edge':>6} {'MAC/s':>10} {'devices':>7} {'backhaul up':>11} {'down bit/s':>10} {'loss':>6} "
              f"{'latency s':>9}")
        for k in edge_servers:
            a, b = graph.nodes[k], graph.edges[k, server] if graph.has_edge(k, server) else {}
            n = sum(1 for d, _ in devs if graph.has_edge(d, k))
            print(f"  {str(a.get('cell', k)):>6} {a.get('mac_rate', float('nan')):>10.4g} {n:>7} "
                  f"{b.get('uplink_bps', float('nan')):>11.4g} {b.get('downlink_bps', float('nan')):>10.4g} "
                  f"{b.get('loss', 0.0):>6.3g} {b.get('latency_s', 0.0):>9.3g}")
    up_to = {k: next((v for v in graph.neighbors(k) if v in set(edge_servers)), server) for k, _ in devs}
    print(f"  {'device':>6} {'MAC/s':>10} {'up bit/s':>10} {'down bit/s':>10} {'loss':>6} {'group':>5}"
          + (f" {'cell':>4}" if edge_servers else ""))
    for i, (k, a) in enumerate(devs):
        e = {**a, **graph.edges[k, up_to[k]]} if graph.has_edge(k, up_to[k]) else a
        cell = graph.nodes[up_to[k]].get("cell", "-") if up_to[k] != server else "-"
        print(f"  {i:>6} {a.get('mac_rate', float('nan')):>10.4g} {e.get('uplink_bps', float('nan')):>10.4g} "
              f"{e.get('downlink_bps', float('nan')):>10.4g} {e.get('loss', 0.0):>6.3g} {group_of[i]:>5}"
              + (f" {cell:>4}" if edge_servers else ""))
    role = {k: a.get("role") for k, a in graph.nodes(data=True)}
    d2d = [(u, v) for u, v in graph.edges() if role[u] == "device" and role[v] == "device"]
    if d2d:
        print(f"  device-to-device links: {len(d2d)}")
    print("groups:")
    for g, m in enumerate(groups):
        print(f"  G{g}: {m}")
    print(f"group tree (Sec. VI-D, eqs. 14-15), depth {tree.graph['depth']}:")
    for u, v, a in sorted(tree.edges(data=True), key=lambda e: e[2]["step"]):
        print(f"  step {a['step']}: G{u} -> {'server' if v == 'server' else f'G{v}'}  (sum of groups {a['covers']})")
    if args.plot:
        path = draw_topology(graph, args.plot, n_groups=len(groups), title=f"{study.name}: {run.name} (seed {seed})")
        print(f"drawn to {path}")
    return 0


def _broken_pipe() -> int:
    """The reader of stdout went away (``fednet list | head``): one line on stderr, status 2, no traceback.

    stdout is pointed at ``/dev/null`` so that the interpreter's final flush does not fail again.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):    # stdout without a file descriptor (captured): nothing to redirect
        pass
    try:
        print("fednet: output cut short: the reader of stdout closed it (broken pipe)", file=sys.stderr)
    except OSError:
        pass
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fednet`` command; returns the exit status.

    Returns
    -------
    int
        0 on success; 2 for any :class:`fednet.errors.FednetError` (printed as ``fednet: <message>``
        on stderr, without a traceback). Argument errors exit 2 through argparse.

    Notes
    -----
    Applies fednet's host configuration first (:func:`fednet.runtime.configure_host`: portable kernels, malloc
    thresholds, the garbage-collector policy), before anything imports NumPy: this module and ``fednet`` itself
    import none.
    """
    from fednet.runtime import configure_host

    configure_host()
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
    p_run.add_argument("--quiet", action="store_true",
                       help="no progress (otherwise a cost-weighted bar on a terminal, a line every 30 s elsewhere)")
    p_run.add_argument("--explain-engine", action="store_true",
                       help="print, per run and step, which engine backend ran it or why the reference did")
    p_run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                       help="change a study key, e.g. network.dropout=0.1 or runs.0.params.alpha=16 (repeatable; runs are "
                            "named by their labels after sweep expansion; a key a sweep sets is refused)")
    p_run.add_argument("--epochs", type=int, help="maximum rounds of every run")
    p_run.add_argument("--runs", nargs="+", metavar="LABEL", help="run only these runs (and the baseline): labels after sweep expansion, or patterns "
                            "with * and ?")
    p_run.add_argument("--targets", nargs="+", type=float, metavar="ACC", help="target accuracies, e.g. 0.9 0.95")
    par = p_run.add_mutually_exclusive_group()
    par.add_argument("--jobs", type=_positive, nargs="?", const=0, metavar="N",
                     help="run the runs x seeds in parallel on a local Dask cluster of N worker processes "
                          "(N omitted: the cores the 1-minute load average leaves free; an N above them warns)")
    par.add_argument("--scheduler", metavar="ADDRESS",
                     help="run the runs x seeds on a running Dask cluster (e.g. tcp://host:8786)")
    p_run.add_argument("--resume", action="store_true",
                       help="reuse the (run, seed) pairs an interrupted run of the same command finished "
                            "(kept beside --out) and run only the others")
    p_run.add_argument("--secret-seed", type=_non_negative, metavar="N",
                       help="root of the runs' secrets (pads, masks, noise), to replay a result exactly from its "
                            "secret_seed.json (default $FEDNET_SECRET_SEED, else drawn and recorded there)")
    p_run.add_argument("--blas-threads", type=_positive, default=1, metavar="N",
                       help="BLAS/OpenMP threads per simulation (default 1)")
    p_run.add_argument("--threads", type=_positive, metavar="N",
                       help="threads inside each simulation for the devices' like work and the test evaluation "
                            "(same results for any N; default 1, or with --jobs N and fewer runs x seeds than N, "
                            "the spare cores)")
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
    p_sum.add_argument("--format", choices=["text", "markdown", "latex", "csv"], default="text",
                       help="text (default): the table; markdown, latex, csv: one tidy row per run and target "
                            "(fednet.study.results.summary_frame)")
    p_sum.set_defaults(func=_cmd_summarize)
    p_plot = sub.add_parser("plot", help="redraw accuracy_vs_time.png of a saved study")
    p_plot.add_argument("dir", help="a study's output directory")
    p_plot.add_argument("--output", help="output file, PNG, PDF or SVG by its extension "
                                         "(default DIR/accuracy_vs_time.png)")
    p_plot.add_argument("--log-x", action="store_true", help="logarithmic time axis")
    p_plot.add_argument("--speedup", action="store_true",
                        help="plot each run's speed-up over the baseline per target with its interval "
                             "(from summary.json; default file DIR/speedup.png)")
    p_plot.add_argument("--dpi", type=_dpi, default=300, help=f"resolution of a PNG, 1 to {MAX_DPI} (default 300)")
    p_plot.set_defaults(func=_cmd_plot)
    p_rep = sub.add_parser("report", help="the measured table of a study's header from a saved result folder")
    p_rep.add_argument("study", help="study TOML file or bundled study name")
    p_rep.add_argument("dir", help="an output directory of that study")
    p_rep.add_argument("--targets", nargs="+", type=_target, metavar="ACC",
                       help="target accuracies in (0, 1] (default: the result's), re-summarized from the saved traces")
    p_rep.add_argument("--write", action="store_true",
                       help="replace the block between '# >>> fednet report' and '# <<< fednet report' in the study "
                            "file (at its top when absent)")
    p_rep.set_defaults(func=_cmd_report)
    p_top = sub.add_parser("topology", help="build and show a run's network and group tree (nothing is run)")
    p_top.add_argument("study", help="study TOML file or bundled study name")
    p_top.add_argument("--run", help="label of the run whose network to show (default: the first grouped run)")
    p_top.add_argument("--seed", type=int, help="seed of drawn rates and groups (default: the study's first)")
    p_top.add_argument("--plot", help="draw the network and the group tree to this image file (PNG)")
    p_top.set_defaults(func=_cmd_topology)
    args = parser.parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    try:
        status = args.func(args)
        sys.stdout.flush()                 # a closed pipe is found here, not at exit
        return status
    except BrokenPipeError:
        return _broken_pipe()
    except FednetError as e:
        print(f"fednet: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fednet: interrupted (SIGINT); no partial results were left", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
