"""Engine speed: SimPy events per second and host wall time per simulated epoch.

Conventional FL (download, minibatch gradient, upload; the server waits for everyone) on the
LTE star with the paper's link and compute models, at D = 25 and D = 1000. Two data sizes:
``d = 20`` (the engine's own overhead dominates) and ``d = 2000, c = 10`` with 96 points per
device (the paper's feature size; the math shows up).

Run: ``.venv/bin/python benchmarks/bench_engine.py [--quick]`` (``--quick``: the D = 25 rows, 5 epochs each).

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_engine.py --quick``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star


def task(D: int, d: int, n: int, c: int = 10) -> LearningTask:
    """D devices with n Gaussian points of d features, c classes."""
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(n, d)) / np.sqrt(d) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.normal(size=(100, d)), rng.integers(0, c, 100), learning_rate=0.1)


def count_events(sim: Simulation) -> Callable[[], int]:
    """Count the SimPy events ``sim`` processes from now on (host-side instrumentation, no simulated time).

    Parameters
    ----------
    sim : Simulation
        Its ``env.step`` is wrapped in place.

    Returns
    -------
    callable () -> int
        The number of events processed since the call.
    """
    count = [0]
    step = sim.env.step

    def _counted_step() -> None:
        count[0] += 1
        step()

    sim.env.step = _counted_step  # type: ignore[method-assign]
    return lambda: count[0]


def bench(D: int, d: int, n: int, epochs: int) -> dict[str, float]:
    """Run conventional FL for ``epochs`` rounds; events, events/s, host ms and simulated s per epoch."""
    t = task(D, d, n)
    sim = Simulation(lte_star(D, rng=np.random.default_rng(1)), seed=0)
    events = count_events(sim)
    proto = registry.get("conventional")(sim, t, {})
    t0 = time.perf_counter()
    proto.run(epochs)
    wall = time.perf_counter() - t0
    return {"D": D, "d": d, "epochs": epochs, "events": events(), "events_per_s": events() / wall,
            "wall_per_epoch_ms": 1e3 * wall / epochs, "sim_s_per_epoch": sim.now / epochs}


def main() -> None:
    """Print the table for D in {25, 1000} and d in {20, 2000} (``--quick``: D = 25 only, 5 epochs)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="D = 25 only, 5 epochs a row")
    args = ap.parse_args()
    rows = [(25, 20, 96, 400), (1000, 20, 96, 20), (25, 2000, 96, 100), (1000, 2000, 96, 5)]
    if args.quick:
        rows = [(D, d, n, 5) for D, d, n, _ in rows if D == 25]
    print(f"{'D':>5} {'d':>5} {'epochs':>6} {'events':>9} {'events/s':>10} {'wall/epoch':>11} {'sim/epoch':>10}")
    for D, d, n, epochs in rows:
        r = bench(D, d, n, epochs)
        print(f"{r['D']:>5} {r['d']:>5} {r['epochs']:>6} {r['events']:>9} {r['events_per_s']:>10.0f} "
              f"{r['wall_per_epoch_ms']:>9.2f}ms {r['sim_s_per_epoch']:>9.2f}s")


if __name__ == "__main__":
    main()
