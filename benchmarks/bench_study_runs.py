"""Host CPU seconds of a study's runs, split into set-up and per epoch, to estimate a whole study (issue 12).

Usage::

    FEDNET_DATA=../shared/data OMP_NUM_THREADS=1 python benchmarks/bench_study_runs.py STUDY.toml \
        [--epochs 60] [--seed 0] [--stride 1] [--skip PREFIX ...] [--runs LABEL ...] [--json OUT.json] \
        [--profile DIR]

Prepares the study's task for ``--seed`` once, builds the full-batch trajectory (the exactly decoding
protocols' timing modes replay it; its cost is printed apart, as a study pays it once per seed and
worker process), then runs every ``--stride``-th run (labels starting with a ``--skip`` prefix left out;
with ``--runs``, only the runs of these exact labels)
for at most ``--epochs`` rounds with one BLAS thread, and prints for each the CPU seconds of its
set-up (up to its round-0 row) and its mean CPU seconds per epoch (and per epoch after the first,
which may meter kernels at their shapes once: the steady cost). A run's cost to a target is then
``setup + epochs_to_target * per_epoch``; CPU seconds (``time.process_time``) rather than wall clock,
so that other jobs on a shared host inflate the numbers less.

With ``--profile DIR``, each timed run's epochs after its first (the steady state: the first one meters
the kernels at their shapes) run under :mod:`cProfile`; the stats go to ``DIR/<run index>.prof`` and the
functions of largest own time are printed (the profiler slows Python-heavy code more than NumPy: compare
shares, not seconds, with the unprofiled numbers).

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_study_runs.py
studies/quickstart.toml --epochs 1``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

from fednet.protocol import registry
from fednet.study.config import load_study
from fednet.study.runner import _build_protocol, prepare_task
from fednet.study.threads import limit_threads


def main() -> None:
    """Print each run's set-up and per-epoch CPU seconds for ``--epochs`` epochs at ``--seed`` (command line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--runs", nargs="*", help="exact labels of the runs to time (default: all)")
    ap.add_argument("--json")
    ap.add_argument("--profile", metavar="DIR", help="cProfile each run's epochs after its first into DIR/<k>.prof")
    args = ap.parse_args()
    study = load_study(args.study, max_epochs=args.epochs)
    for run in study.runs:
        registry.get(run.protocol)
    out: dict[str, dict[str, float]] = {}
    with limit_threads(1):
        c0 = time.process_time()
        task = prepare_task(study, os.environ.get("FEDNET_DATA"), feature_seed=study.data.feature_seed_for(args.seed))
        c1 = time.process_time()
        task.full_batch_trajectory(args.epochs)
        print(f"task {c1 - c0:.1f} CPU s; trajectory of {args.epochs} epochs {time.process_time() - c1:.1f} CPU s",
              flush=True)
        for k, run in enumerate(study.runs):
            if (k % args.stride or any(run.name.startswith(s) for s in args.skip)
                    or (args.runs is not None and run.name not in args.runs)):
                continue
            marks: list[float] = []
            prof = cProfile.Profile() if args.profile else None

            def on_round(row: dict, marks: list[float] = marks, prof: cProfile.Profile | None = prof) -> None:
                """Note the CPU time of each round's end; profile from the end of the first epoch on."""
                marks.append(time.process_time())
                if prof is not None and len(marks) == 2:
                    prof.enable()
            proto = _build_protocol(study, run, args.seed, task)
            c0 = time.process_time()
            rows = proto.run(study.run_epochs(run), stop_at=study.stop_accuracy, on_round=on_round,
                             strict=study.strict)
            if prof is not None:
                prof.disable()
                os.makedirs(args.profile, exist_ok=True)
                prof.dump_stats(os.path.join(args.profile, f"{k}.prof"))
                print(f"{run.name}: profile of epochs 2-{len(rows) - 1} in {args.profile}/{k}.prof", flush=True)
                pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            setup, per = marks[0] - c0, (time.process_time() - marks[0]) / max(1, len(rows) - 1)
            steady = (marks[-1] - marks[1]) / (len(marks) - 2) if len(marks) > 2 else per
            out[run.name] = {"setup_s": setup, "epoch_s": per, "steady_epoch_s": steady}
            print(f"{run.name}: set-up {setup:.2f} CPU s, {per * 1e3:.1f} CPU ms per epoch "
                  f"({steady * 1e3:.1f} after the first)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
