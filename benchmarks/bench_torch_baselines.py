"""Host seconds per round of the torch-MLP baselines of DReS-FL's Table 2 (FedAvg, FedAvg-IS, SCAFFOLD, centralized).

Usage::

    FEDNET_DATA=../shared/data PYTHONPATH=. python benchmarks/bench_torch_baselines.py \
        [--study studies/dresfl_table2.toml] [--rounds 300] [--seed 0] [--runs FedAvg SCAFFOLD ...]

Builds each run of the study as ``fednet run`` does (one BLAS / torch thread), runs it for ``--rounds`` rounds
and prints its set-up and round-1 CPU seconds (the first round measures the gradient's MACs under torch's
FLOP counter) apart from the mean CPU seconds of the later rounds (evaluations every ``eval_every`` rounds
included). CPU seconds (``time.process_time``), so that other work on a shared host inflates them less.
The script uses only interfaces that a00ff18 already had, so the same file run with ``PYTHONPATH`` at an older
checkout measures the code before (``git archive a00ff18 | tar -x -C OLD``, copy this file into ``OLD/benchmarks``
and run it from ``OLD`` with ``PYTHONPATH=OLD``).

Measured 2026-11-26 on the shared 2-core host under load (load average 5.7-6.5, other jobs beside it), MNIST,
seed 0, 300 rounds, two alternating repetitions each, CPU ms per round (rounds 2-300):

    run           before (a00ff18)   after
    FedAvg        20.3 / 20.6        13.1 / 13.4   (first run of the process: paid the collector's walk, below)
    FedAvg-IS     18.9 / 18.9        14.6 / 12.6
    SCAFFOLD      23.9 / 21.7        16.1 / 22.8   (host noise: 16-26 ms in other repetitions of both)
    Centralized    1.7 /  1.8         1.9 /  1.8

Before, round 1 of the first run took ~1 s (FlopCounterMode importing torch._dynamo mid-run) and every 16th
round's full garbage collection then walked those ~120,000 objects (~0.1 s each, ~6 ms per round on average).
Where a round's time goes now (FedAvg, ~9.4 present clients): the hand-written gradients ~45 % (their BLAS
kernels, 64 x 784 x 64 twice, about two thirds of that), the float64 update arithmetic of clients and server
~23 %, gathering the minibatch rows ~13 %, the simulation, records and evaluations the rest.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_torch_baselines.py --rounds
2 --runs Centralized``
"""

from __future__ import annotations

import argparse
import os
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

from fednet.protocol import registry
from fednet.study.config import load_study
from fednet.study.runner import _build_protocol, prepare_task
from fednet.study.threads import limit_threads

BASELINES = ("FedAvg", "FedAvg-IS", "SCAFFOLD", "Centralized")


def main() -> None:
    """Print set-up, first-round and per-round CPU seconds of each baseline (command line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="studies/dresfl_table2.toml")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", nargs="+", default=list(BASELINES))
    args = ap.parse_args()
    study = load_study(args.study, max_epochs=args.rounds)
    with limit_threads(1):
        task = prepare_task(study, os.environ.get("FEDNET_DATA"), feature_seed=study.data.feature_seed_for(args.seed))
        for run in (r for r in study.runs if r.name in args.runs):
            registry.get(run.protocol)
            c0 = time.process_time()
            proto = _build_protocol(study, run, args.seed, task)
            marks: list[float] = []
            proto.run(args.rounds, on_round=lambda row: marks.append(time.process_time()))
            later = (marks[-1] - marks[1]) / max(1, len(marks) - 2)
            print(f"{run.name:12s} set-up {marks[0] - c0:5.2f} CPU s, round 1 {marks[1] - marks[0]:5.2f} CPU s, "
                  f"rounds 2-{len(marks) - 1}: {later * 1e3:6.2f} CPU ms per round", flush=True)


if __name__ == "__main__":
    main()
