"""Engine events per device-epoch: host wall per simulated epoch and device-epochs per second.

Conventional FL (full mode: it has no timing mode), conventional FL dropping the slowest 10 %,
CodedSecAgg (timing mode, z = 1, one group) and LightSecAgg (timing mode, z = 1, U = D/2) on the LTE
star with the paper's link and compute models, at D = 25, 120 and 1000, ``d = 20`` Gaussian features
(the engine's own overhead dominates). One device-epoch is one device's download, compute and upload;
a round of D devices counts D device-epochs (CodedSecAgg's cancelled devices included).

Each set-up runs its setup phase and one warm-up round once (not timed), then ``E`` rounds on the SimPy
process path (``FEDNET_ENGINE=reference``, the engine's reference semantics: one process per
device, one event per mask; the collector left alone), ``E`` further rounds on the event-free path with each
device's math node by node (``BATCHED = False``, rows ``+unbatched``) and ``E`` more with batched device math
and the vectorised replay (the default, rows ``+fast``), the last two with :meth:`Protocol.run`'s collector
handling. The rows run different rounds, so their ``sim_end`` differ; bit-identity of the paths is what
``tests/test_fast_path.py`` and ``tests/test_batched.py`` check. Views are not recorded (as in a study;
``--views`` records them). Host time is given as wall time and as this process's CPU time: on a loaded
shared host the wall time includes the time other processes held the cores.

Run (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_engine_events.py [SETUP ...] [D ...] [--views]
        [--paths ,+unbatched,+fast]
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_engine_events.py --profile SETUP D [--slow]

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_engine_events.py
conventional 25``
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from bench_engine import count_events  # benchmarks/ is first on sys.path when run as a file

import fednet.protocol.base as base
from fednet.sim.engine import EngineConfig
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


#: (row suffix, engine configuration): SimPy processes (the reference); the event-free path with the step's
#: math node by node; the event-free path with batched math and the vectorised replay (the default).
PATHS = (("", "reference"), ("+unbatched", "-batched"), ("+fast", ""))


def bench(name: str, D: int, epochs: int) -> list[dict]:
    """Run set-up ``name`` for ``epochs`` rounds on each path of :data:`PATHS` in turn, after one setup phase
    and one warm-up round (compiled kernels, cached stacks; neither timed)."""
    proto, counter = build(name, D)
    proto.run(0)                            # setup phase (round 0) outside the measurement
    more_rounds(proto, 1, 1)                # warm-up round (default path)
    out = []
    first = 2
    for suffix, engine in PATHS:
        if "--paths" in sys.argv and suffix not in sys.argv[sys.argv.index("--paths") + 1].split(","):
            continue
        proto.sim.engine = EngineConfig.parse(engine)
        fast = engine != "reference"
        start = counter()
        t0, c0 = time.perf_counter(), time.process_time()
        trace = more_rounds(proto, epochs, first, base.GC_ROUNDS if fast else 0)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.append(_row(name + suffix, D, epochs, counter() - start, wall, cpu, trace))
        first += epochs
        proto.trace = proto.trace[:1]
        proto.theta = np.zeros_like(proto.theta)
    proto.sim.engine = EngineConfig()
    return out


def _row(name, D, epochs, events, wall, cpu, trace) -> dict:
    return {"name": name, "D": D, "epochs": epochs, "events": events, "ev_per_dev_epoch": events / (D * epochs),
            "ms_per_epoch": 1e3 * wall / epochs, "dev_epochs_per_s": D * epochs / wall,
            "cpu_ms_per_epoch": 1e3 * cpu / epochs, "dev_epochs_per_cpu_s": D * epochs / cpu,
            "sim_end": trace[-1]["time_s"], "acc": trace[-1]["accuracy"]}


EPOCHS = {25: 200, 120: 60, 1000: 20}
if "lightsecagg" in sys.argv:
    EPOCHS = {25: 40, 120: 10, 1000: 1}


def main() -> None:
    """Print the table (or profile one set-up with ``--profile NAME D``)."""
    if "--profile" in sys.argv:
        i = sys.argv.index("--profile")
        name, D = sys.argv[i + 1], int(sys.argv[i + 2])
        proto, _ = build(name, D)
        proto.run(0)
        proto.sim.engine = EngineConfig.parse("reference" if "--slow" in sys.argv else "")
        prof = cProfile.Profile()
        prof.enable()
        more_rounds(proto, EPOCHS[D])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    names = [a for a in sys.argv[1:] if a in SETUPS] or list(SETUPS)
    print(f"# load average {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())} on "
          f"{__import__('os').cpu_count()} cores; cpu = this process's CPU time (time.process_time)")
    print(f"{'setup':>24} {'D':>5} {'ep':>4} {'events':>8} {'ev/dev-ep':>9} {'ms/epoch':>9} {'dev-ep/s':>9} "
          f"{'cpu ms/ep':>9} {'dev-ep/cpu-s':>12} {'sim_end':>22} {'acc':>20}")
    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()] or [25, 120, 1000]
    for name in names:
        for D in sizes:
            for r in bench(name, D, EPOCHS[D]):
                print(f"{r['name']:>24} {r['D']:>5} {r['epochs']:>4} {r['events']:>8} {r['ev_per_dev_epoch']:>9.2f} "
                      f"{r['ms_per_epoch']:>9.2f} {r['dev_epochs_per_s']:>9.0f} {r['cpu_ms_per_epoch']:>9.2f} "
                      f"{r['dev_epochs_per_cpu_s']:>12.0f} {r['sim_end']!r:>22} {r['acc']!r:>20}", flush=True)


if __name__ == "__main__":
    main()
