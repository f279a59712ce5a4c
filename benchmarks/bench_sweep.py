"""Host cost of simulated epochs: wall per epoch and device-epochs per second, per protocol and mode.

For each protocol, each of its modes (``full``; ``timing`` where the protocol has one) and each
device count D, one simulation on the LTE star (paper's link and shifted-exponential compute
models) runs the set-up phase and ``--epochs`` rounds of a synthetic task (D devices with ``--n``
Gaussian points of ``--d`` features, ``--c`` classes). Reported (host wall-clock, not simulated
time):

- ``setup``: host seconds of the set-up phase (round 0 row; CodedPaddedFL/CodedSecAgg sharing);
- ``ms/epoch``: host milliseconds per simulated epoch after set-up;
- ``dev-ep/s``: device-epochs per host second, D x epochs / epoch wall (one device-epoch: one
  device's download, compute and upload);
- ``ev/dev-ep``: SimPy events per device-epoch (``env.step`` calls);
- then a cProfile breakdown of the epochs' host time (a second, profiled run of the same
  configuration; percentages of the profiled total, by the file of each function's own time):
  ``simpy`` (the event loop), ``device`` (per-device Python: protocols, fednet.protocol,
  fednet.sim), ``math`` (numpy/scipy/galois/torch kernels and fednet.algebra/codes/learning),
  ``rng`` (numpy.random and fednet.sim.rng), ``trace`` (trace rows and test evaluation),
  ``other``.

Default (a few minutes on a quiet 2-core host): D = 25 and 120, d = 100, 3 epochs, every
protocol and mode. ``--full`` adds D = 1000 (slow: full-mode LightSecAgg and CodedSecAgg at
D = 1000 take minutes an epoch); ``--devices``, ``--protocols``, ``--modes`` select a grid;
``--d 2000`` is the paper's feature size; ``--json FILE`` saves the rows; ``--threads N`` lends each
simulation N threads (:mod:`fednet.algebra.slices`); ``--off BACKEND ...`` disallows engine backends
(``tree``, ``gather``, ... of :data:`fednet.sim.engine.BACKENDS`, or ``reference`` for all: the before of an A/B;
the same as ``FEDNET_ENGINE=-tree,...``). Messages are not kept in their receivers' views
(``record_views=False``), as in studies; ``--record-views`` measures with them. Each configuration
runs with one BLAS thread (threadpoolctl), after an untimed warm-up of the same protocol and mode
at D = 10 (numba compiles LightSecAgg's kernels on first use).

Run: ``.venv/bin/python benchmarks/bench_sweep.py [--full] [--devices 25 120 1000] [--d 100]
[--epochs 3] [--protocols conventional lightsecagg] [--modes timing] [--no-profile] [--json out.json]
[--threads 2] [--record-views] [--off tree]``

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_sweep.py --devices 10
--epochs 1 --no-profile --protocols conventional``
"""

from __future__ import annotations

import argparse
import cProfile
import os
import json
import pstats
import time
from typing import Any

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.errors import ConfigError
from fednet.sim.engine import EngineConfig
from fednet.algebra.slices import compute_threads
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.compute import ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.study.threads import limit_threads
from fednet.topologies.lte import lte_star

from bench_engine import count_events  # benchmarks/ is sys.path[0] when run as a script

#: protocol -> (modes, params(D))
PROTOCOLS: dict[str, tuple[tuple[str, ...], Any]] = {
    "conventional": (("full",), lambda D: {"minibatch_fraction": 0.2}),
    "cfl": (("full",), lambda D: {"redundancy": 0.1}),
    "codedpaddedfl": (("full", "timing"), lambda D: {"alpha": 4, "groups": max(1, D // 25)}),
    "codedsecagg": (("full", "timing"), lambda D: {"z": 1, "groups": 1 if D <= 25 else 8}),
    "lightsecagg": (("full", "timing"), lambda D: {"z": 1, "U": D - max(1, D // 10)}),
    "fedbuff": (("full",), lambda D: {"buffer_size": max(1, D // 10)}),     # a round: K client updates
}

#: Client updates ("device-epochs") a round of each protocol makes, by D (default: every device once).
UPDATES_PER_ROUND = {"fedbuff": lambda D: max(1, D // 10)}

CATEGORIES = ("simpy", "device", "math", "rng", "trace", "other")


def synthetic_task(D: int, d: int, n: int, c: int) -> LearningTask:
    """D devices with ``n`` Gaussian points of ``d`` features and one-hot labels over ``c`` classes."""
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(n, d)) / np.sqrt(d) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return LearningTask(X, Y, rng.normal(size=(200, d)) / np.sqrt(d), rng.integers(0, c, 200), learning_rate=0.5)


def category(filename: str, funcname: str) -> str:
    """The profile category of a function (its own time), from its file and name."""
    f = filename.replace("\\", "/")
    if "/simpy/" in f:
        return "simpy"
    if "numpy/random" in f or "fednet/sim/rng" in f or "numpy.random" in funcname or "Generator" in funcname:
        return "rng"
    if "fednet/protocol/base" in f and funcname in ("_record", "round_metrics"):
        return "trace"
    if "evaluate" in funcname or "/csv" in f or "accuracy" in funcname:
        return "trace"
    if any(s in f for s in ("/protocols/", "fednet/protocol/", "fednet/sim/", "/topologies/")):
        return "device"
    if any(s in f for s in ("/numpy/", "/scipy/", "/galois/", "/torch/", "/numba/", "fednet/algebra",
                            "fednet/codes", "fednet/learning")):
        return "math"
    if f == "~" and any(s in funcname for s in ("_heapq", "method 'send' of 'generator'", "method 'throw' of")):
        return "simpy"
    if f == "~" and any(s in funcname for s in ("numpy", "method 'dot'", "matmul", "method 'sum'", "reduce",
                                                 "einsum", "solve", "array", "concatenate", "take", "copy")):
        return "math"
    return "other"


def run_config(protocol: str, mode: str, D: int, *, d: int, n: int, c: int, epochs: int,
               profile: bool, record_views: bool = False) -> dict[str, Any]:
    """Set-up and ``epochs`` rounds of one configuration; timings, events and (optionally) a profile."""
    modes, params_of = PROTOCOLS[protocol]
    params = dict(params_of(D))
    if len(modes) > 1:
        params["mode"] = mode
    task = synthetic_task(D, d, n, c)
    cls = registry.get(protocol)

    def _simulate(prof: cProfile.Profile | None) -> dict[str, Any]:
        sim = Simulation(lte_star(D, rng=np.random.default_rng(1)), seed=0,
                         device_compute=ShiftedExponential(0.5), record_views=record_views)
        events = count_events(sim)
        proto = cls(sim, task, params, label=protocol)
        marks: list[tuple[float, int]] = []

        def _on_round(row: dict[str, Any]) -> None:
            marks.append((time.perf_counter(), events()))
            if prof is not None and len(marks) == 1:
                prof.enable()  # profile the epochs only

        t0 = time.perf_counter()
        proto.run(epochs, on_round=_on_round)
        if prof is not None:
            prof.disable()
        (t_setup, ev_setup), (t_end, ev_end) = marks[0], marks[-1]
        done = len(marks) - 1
        return {"setup_s": t_setup - t0, "epochs": done, "epoch_s": (t_end - t_setup) / max(done, 1),
                "events_per_epoch": (ev_end - ev_setup) / max(done, 1), "sim_s_per_epoch": sim.now / max(done, 1)}

    r = _simulate(None)
    updates = UPDATES_PER_ROUND.get(protocol, lambda D: D)(D)
    out = {"protocol": protocol, "mode": mode, "D": D, "d": d, "params": params, **r,
           "device_epochs_per_s": updates / r["epoch_s"] if r["epoch_s"] > 0 else float("inf"),
           "events_per_device_epoch": r["events_per_epoch"] / updates}
    if profile:
        prof = cProfile.Profile()
        _simulate(prof)
        st = pstats.Stats(prof)
        by = dict.fromkeys(CATEGORIES, 0.0)
        for (fname, _line, func), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            by[category(fname, func)] += tt
        total = sum(by.values()) or 1.0
        out["profile_pct"] = {k: 100.0 * v / total for k, v in by.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    """Print the table (and save it with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the whole grid: D = 25, 120 and 1000")
    ap.add_argument("--devices", type=int, nargs="+", help="device counts (default 25 120; --full adds 1000)")
    ap.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS), default=list(PROTOCOLS))
    ap.add_argument("--modes", nargs="+", choices=["full", "timing"], default=["full", "timing"])
    ap.add_argument("--d", type=int, default=100, help="features (paper: 2000)")
    ap.add_argument("--c", type=int, default=10, help="classes")
    ap.add_argument("--n", type=int, default=48, help="points per device")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile breakdown")
    ap.add_argument("--json", help="write the rows to this JSON file")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads lent to each simulation's sliced kernels (fednet.algebra.slices; default 1)")
    ap.add_argument("--off", nargs="+", default=[], metavar="BACKEND",
                    help="engine backends to disallow (an A/B), e.g. tree batched, or 'reference' for all "
                         "(fednet.sim.engine.BACKENDS)")
    ap.add_argument("--record-views", action="store_true",
                    help="keep every message in its receiver's view (off in studies unless record_views = true)")
    args = ap.parse_args(argv)
    if args.off:
        value = "reference" if "reference" in args.off else ",".join(f"-{b}" for b in args.off)
        try:
            EngineConfig.parse(value)
        except ConfigError as e:
            ap.error(f"--off: {e}")
        os.environ["FEDNET_ENGINE"] = value          # every Simulation made from here on
    devices = args.devices or ([25, 120, 1000] if args.full else [25, 120])
    head = (f"{'protocol':<14} {'mode':<6} {'D':>5} {'setup s':>8} {'ms/epoch':>9} {'dev-ep/s':>9} {'ev/dev-ep':>9}"
            + ("" if args.no_profile else "  " + " ".join(f"{k:>6}" for k in CATEGORIES) + "  (% of epoch time)"))
    print(head, flush=True)
    rows = []
    warm: set[tuple[str, str]] = set()
    with limit_threads(1), compute_threads(args.threads):
        for D in devices:
            for protocol in args.protocols:
                for mode in PROTOCOLS[protocol][0]:
                    if mode not in args.modes:
                        continue
                    try:
                        if (protocol, mode) not in warm:  # compile JIT kernels, fill caches: not timed
                            run_config(protocol, mode, 10, d=args.d, n=args.n, c=args.c, epochs=1, profile=False)
                            warm.add((protocol, mode))
                        r = run_config(protocol, mode, D, d=args.d, n=args.n, c=args.c, epochs=args.epochs,
                                       profile=not args.no_profile, record_views=args.record_views)
                    except Exception as e:  # noqa: BLE001 - report and go on with the grid
                        print(f"{protocol:<14} {mode:<6} {D:>5}  failed: {type(e).__name__}: {e}", flush=True)
                        continue
                    rows.append(r)
                    line = (f"{protocol:<14} {mode:<6} {D:>5} {r['setup_s']:>8.2f} {1e3 * r['epoch_s']:>9.1f} "
                            f"{r['device_epochs_per_s']:>9.0f} {r['events_per_device_epoch']:>9.1f}")
                    if "profile_pct" in r:
                        line += "  " + " ".join(f"{r['profile_pct'][k]:>6.1f}" for k in CATEGORIES)
                    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
