"""Host CPU time of a LightSecAgg epoch, full mode against timing mode (issue 32, item 2).

LightSecAgg (So et al., MLSys 2022) as :mod:`bench_sweep` runs it: the LTE star, shifted-exponential
compute, a synthetic task of D devices with ``--n`` Gaussian points of ``--d`` features and ``--c``
classes, ``z = 1`` and ``U = D - max(1, D // 10)``. For each D and mode, an untimed warm-up at D = 10
(numba compiles, caches fill), then ``--repeats`` simulations of set-up and ``--epochs`` rounds; the
CPU time (``time.process_time``) per epoch after set-up is reported as the best of the repeats, and
the full/timing ratio per D (the goal of issue 32: at most 5 at D = 120). One BLAS thread.

Run (about 1.5 minutes on one quiet core)::

    .venv/bin/python benchmarks/bench_lightsecagg_full.py [--devices 120 1000] [--epochs 2] [--repeats 3]
        [--profile]

``--profile`` prints the 25 functions of most own time of one more full-mode run at the largest D.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_lightsecagg_full.py
--devices 20 --epochs 1 --repeats 1``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import fednet

fednet.configure_host()  # the fednet command's host settings, before NumPy loads

import numpy as np

from fednet.protocol import registry
from fednet.sim.compute import ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.study.threads import limit_threads
from fednet.topologies.lte import lte_star

from bench_sweep import PROTOCOLS, synthetic_task  # benchmarks/ is sys.path[0] when run as a script


def epoch_cpu_s(D: int, mode: str, *, epochs: int, d: int, n: int, c: int,
                prof: cProfile.Profile | None = None) -> float:
    """CPU seconds per epoch of one LightSecAgg run (set-up excluded)."""
    params = dict(PROTOCOLS["lightsecagg"][1](D), mode=mode)
    task = synthetic_task(D, d, n, c)
    sim = Simulation(lte_star(D, rng=np.random.default_rng(1)), seed=0, device_compute=ShiftedExponential(0.5),
                     record_views=False)
    proto = registry.get("lightsecagg")(sim, task, params, label="lightsecagg")
    marks: list[float] = []

    def _on_round(row: dict) -> None:
        marks.append(time.process_time())
        if prof is not None and len(marks) == 1:
            prof.enable()

    proto.run(epochs, on_round=_on_round)
    if prof is not None:
        prof.disable()
    return (marks[-1] - marks[0]) / (len(marks) - 1)


def main(argv: list[str] | None = None) -> None:
    """Print full and timing CPU seconds per epoch and their ratio for each D."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[120, 1000])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--d", type=int, default=100)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    kw = dict(epochs=args.epochs, d=args.d, n=args.n, c=args.c)
    print(f"{'D':>5} {'full s/epoch':>13} {'timing s/epoch':>15} {'full/timing':>12}", flush=True)
    with limit_threads(1):
        for mode in ("full", "timing"):
            epoch_cpu_s(10, mode, **dict(kw, epochs=1))
        for D in args.devices:
            best = {mode: min(epoch_cpu_s(D, mode, **kw) for _ in range(args.repeats)) for mode in ("full", "timing")}
            print(f"{D:>5} {best['full']:>13.4f} {best['timing']:>15.4f} {best['full'] / best['timing']:>12.1f}",
                  flush=True)
        if args.profile:
            prof = cProfile.Profile()
            epoch_cpu_s(max(args.devices), "full", prof=prof, **kw)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
