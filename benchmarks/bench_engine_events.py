"""Engine events per device-epoch: host wall per simulated epoch and device-epochs per second.

Conventional FL (full mode: it has no timing mode), conventional FL dropping the slowest 10 %,
CodedSecAgg (timing mode, z = 1, one group) and LightSecAgg (timing mode, z = 1, U = D/2) on the LTE
star with the paper's link and compute models, at D = 25, 120 and 1000, ``d = 20`` Gaussian features
(the engine's own overhead dominates). One device-epoch is one device's download, compute and upload;
a round of D devices counts D device-epochs (CodedSecAgg's cancelled devices included).

Each set-up runs its setup phase once (not timed), then ``E`` rounds on the SimPy process path
(``FAST_PATH = LAZY_MAILBOX = False`` in :mod:`fednet.protocol.primitives`: one process per device,
one event per mask; the collector left alone) and ``E`` further rounds on the event-free path with
:meth:`Protocol.run`'s collector handling (rows ``+fast``). The two rows
run different rounds, so their ``sim_end`` differ; bit-identity of the two paths is what
``tests/test_fast_path.py`` checks.

Run (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_engine_events.py [SETUP ...] [D ...]
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_engine_events.py --profile SETUP D [--slow]
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys
import time

import numpy as np

from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from bench_engine import count_events  # benchmarks/ is first on sys.path when run as a file

import fednet.protocol.base as base
import fednet.protocol.primitives as primitives
import fednet.protocols.conventional  # noqa: F401  (registers)
import fednet.protocols.codedsecagg  # noqa: F401


def task(D: int, d: int = 20, n: int = 96, c: int = 10) -> LearningTask:
    """D devices with n Gaussian points of d features, c classes."""
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(n, d)) / np.sqrt(d) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.normal(size=(200, d)), rng.integers(0, c, 200), learning_rate=0.1)


#: name -> (protocol, params)
SETUPS = {
    "conventional": ("conventional", {}),
    "conventional_drop": ("conventional", {"drop_slowest": 0.1}),
    "codedsecagg": ("codedsecagg", {"z": 1, "mode": "timing"}),
    "lightsecagg": ("lightsecagg", {"z": 1, "U": 0.5, "mode": "timing"}),
}


def build(name: str, D: int):
    """The protocol object of set-up ``name`` at D devices, with an event counter on its env."""
    proto_name, params = SETUPS[name]
    params = dict(params)
    if "U" in params:
        params["U"] = max(2, int(params["U"] * D))
    if "drop_slowest" in params:
        params["drop_slowest"] = max(1, int(params["drop_slowest"] * D))
    sim = Simulation(lte_star(D, rng=np.random.default_rng(1)), seed=0, record_views="--views" in sys.argv)
    return registry.get(proto_name)(sim, task(D), params), count_events(sim)


def more_rounds(proto, epochs: int, first: int = 1, gc_rounds: int = 0) -> list:
    """Rounds first..first+epochs-1 after ``proto.run(0)`` did the setup phase (Protocol.run's loop, minus
    setup, with its garbage-collector handling when ``gc_rounds``: :data:`fednet.protocol.base.GC_ROUNDS`)."""
    def main():
        """The rounds as one SimPy process."""
        if gc_rounds:
            gc.freeze()
            gc.disable()
        for e in range(first, first + epochs):
            if gc_rounds and e > first:
                gc.collect(1 if (e - first) % gc_rounds else 2)
            proto.sim.round = proto.epoch = e
            proto.used = None
            proto.round_dropped = set()
            proto.decode_failed = False
            yield from proto.round(e)
            proto._record(e)
    try:
        proto.sim.run(main())
    finally:
        gc.unfreeze()
        gc.enable()
    return proto.trace


def bench(name: str, D: int, epochs: int) -> list[dict]:
    """Run set-up ``name`` for ``epochs`` rounds on the SimPy process path, then ``epochs`` more on the
    event-free path (:data:`fednet.protocol.primitives.FAST_PATH`), after one setup phase (not timed)."""
    proto, counter = build(name, D)
    proto.run(0)                            # setup phase (round 0) outside the measurement
    out = []
    for fast in (False, True):
        primitives.FAST_PATH = primitives.LAZY_MAILBOX = fast
        start = counter()
        t0 = time.perf_counter()
        trace = more_rounds(proto, epochs, 1 + fast * epochs, base.GC_ROUNDS if fast else 0)
        wall = time.perf_counter() - t0
        out.append(_row(name + ("+fast" if fast else ""), D, epochs, counter() - start, wall, trace))
        proto.trace = proto.trace[:1]
        proto.theta = np.zeros_like(proto.theta)
    return out


def _row(name, D, epochs, events, wall, trace) -> dict:
    return {"name": name, "D": D, "epochs": epochs, "events": events, "ev_per_dev_epoch": events / (D * epochs),
            "ms_per_epoch": 1e3 * wall / epochs, "dev_epochs_per_s": D * epochs / wall,
            "sim_end": trace[-1]["time_s"], "acc": trace[-1]["accuracy"]}


EPOCHS = {25: 200, 120: 60, 1000: 10}
if "lightsecagg" in sys.argv:
    EPOCHS = {25: 40, 120: 10, 1000: 1}


def main() -> None:
    """Print the table (or profile one set-up with ``--profile NAME D``)."""
    if "--profile" in sys.argv:
        i = sys.argv.index("--profile")
        name, D = sys.argv[i + 1], int(sys.argv[i + 2])
        proto, _ = build(name, D)
        proto.run(0)
        primitives.FAST_PATH = primitives.LAZY_MAILBOX = "--slow" not in sys.argv
        prof = cProfile.Profile()
        prof.enable()
        more_rounds(proto, EPOCHS[D])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    names = [a for a in sys.argv[1:] if a in SETUPS] or list(SETUPS)
    print(f"{'setup':>18} {'D':>5} {'ep':>4} {'events':>8} {'ev/dev-ep':>9} {'ms/epoch':>9} {'dev-ep/s':>9} "
          f"{'sim_end':>22} {'acc':>20}")
    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()] or [25, 120, 1000]
    for name in names:
        for D in sizes:
            for r in bench(name, D, EPOCHS[D]):
                print(f"{r['name']:>18} {r['D']:>5} {r['epochs']:>4} {r['events']:>8} {r['ev_per_dev_epoch']:>9.2f} "
                  f"{r['ms_per_epoch']:>9.2f} {r['dev_epochs_per_s']:>9.0f} {r['sim_end']!r:>22} {r['acc']!r:>20}",
                      flush=True)


if __name__ == "__main__":
    main()
