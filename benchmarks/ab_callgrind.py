"""Work per simulated epoch, old checkout against new, counted in instructions (callgrind ``Ir``).

Wall-clock A/B on a shared 2-core host varies by more than the 10 % a refactor may cost (issue 26), and this host has
no hardware performance counters. Valgrind's callgrind counts the instructions the interpreter executes, which for
the same inputs is deterministic to well under 1 % (``PYTHONHASHSEED=0``, one thread, fixed kernel dispatch). It is
not wall time (cache misses and memory bandwidth are not in it), so it bounds what a refactor added to the work of an
epoch, not what the host pays for it.

Each cell runs :mod:`bench_sweep`'s synthetic task (d = 100 features, 48 rows per device, 10 classes) on the LTE
star at ``D`` devices in a fresh ``valgrind --tool=callgrind --instr-atstart=no`` process, switches counting on with
``callgrind_control -i on`` when warm-up epoch ``W`` is recorded, and stops after ``E`` more epochs, so set-up,
imports and warm-up are left out. The checkout is the child's ``PYTHONPATH``.

Run (about 1 h for the default grid; the numbers of issue 26's closing note)::

    git worktree add --detach /tmp/old <old commit>
    python benchmarks/ab_callgrind.py /tmp/old . --devices 25 120 1000

Smoke (one small cell, about a minute of CPU per checkout under valgrind; does nothing without valgrind)::

    python benchmarks/ab_callgrind.py . . --devices 25 --protocols conventional --epochs 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: (protocol, mode) of each row: the seed papers' five systems, in the mode their studies run.
CELLS = [("conventional", "full"), ("cfl", "full"), ("codedpaddedfl", "timing"), ("codedsecagg", "timing"),
         ("lightsecagg", "timing")]
#: Warm-up epochs and counted epochs per D (counted epochs shrink with D so that a cell takes minutes).
SCHEDULE = {25: (5, 40), 120: (3, 12), 1000: (2, 3)}

#: The single-threaded, fixed-dispatch environment every cell runs in.
ENV = {"OPENBLAS_CORETYPE": "Haswell", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
       "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def child(protocol: str, mode: str, n_devices: int, warmup: int, epochs: int) -> None:
    """Run one cell inside valgrind: counting is switched on at epoch ``warmup`` and the process ends at
    ``warmup + epochs`` (``os._exit``, so interpreter teardown is not counted)."""
    sys.path.insert(0, str(Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) / "benchmarks"))
    import bench_sweep as b
    import numpy as np

    from fednet.protocol import registry
    from fednet.sim.compute import ShiftedExponential
    from fednet.sim.simulation import Simulation
    from fednet.study.threads import limit_threads
    from fednet.topologies.lte import lte_star

    modes, params_of = b.PROTOCOLS[protocol]
    params = dict(params_of(n_devices))
    if len(modes) > 1:
        params["mode"] = mode
    task = b.synthetic_task(n_devices, 100, 48, 10)
    sim = Simulation(lte_star(n_devices, rng=np.random.default_rng(1)), seed=0,
                     device_compute=ShiftedExponential(0.5), record_views=False)
    proto = registry.get(protocol)(sim, task, params, label=protocol)

    def on_round(row):
        """Counting on after the warm-up epochs; the process ends after the counted ones."""
        r = row.get("round", row.get("epoch"))
        if r == warmup:
            subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], stdout=subprocess.DEVNULL, check=True)
        elif r == warmup + epochs:
            sys.stdout.flush()
            os._exit(0)

    with limit_threads(1):
        proto.run(warmup + epochs + 1, on_round=on_round)
    print(f"{protocol} did not reach epoch {warmup + epochs}", file=sys.stderr)
    os._exit(3)


def instructions(checkout: Path, protocol: str, mode: str, n_devices: int, warmup: int, epochs: int) -> int:
    """Instructions (callgrind ``Ir``) of ``epochs`` epochs of one cell in ``checkout``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, **ENV, PYTHONPATH=str(checkout))
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
               str(Path(__file__).resolve()), "--child", protocol, mode, str(n_devices), str(warmup), str(epochs)]
        done = subprocess.run(cmd, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{protocol} at D = {n_devices} in {checkout}: exit {done.returncode}: "
                               f"{done.stderr.strip()[-400:]}")
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no callgrind summary for {protocol} at D = {n_devices}")


def main(argv: list[str] | None = None) -> int:
    """Print the instructions per epoch of every cell, old and new, and their ratio (or run one ``--child`` cell)."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        protocol, mode, d, w, e = argv[1:6]
        child(protocol, mode, int(d), int(w), int(e))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the old checkout (a git worktree)")
    parser.add_argument("new", type=Path, help="the new checkout")
    parser.add_argument("--devices", type=int, nargs="+", default=sorted(SCHEDULE))
    parser.add_argument("--protocols", nargs="+", default=[p for p, _ in CELLS])
    parser.add_argument("--epochs", type=int, help="counted epochs of every cell (default: by D, SCHEDULE)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: nothing measured")
        return 0
    old, new = args.old.resolve(), args.new.resolve()
    print(f"{'protocol':14} {'mode':7} {'D':>5} {'old Ir/epoch':>14} {'new Ir/epoch':>14} {'new/old':>8}")
    for d in args.devices:
        warmup, epochs = SCHEDULE.get(d, (2, 3))
        epochs = args.epochs or epochs
        for protocol, mode in CELLS:
            if protocol not in args.protocols:
                continue
            a = instructions(old, protocol, mode, d, warmup, epochs) / epochs
            b = instructions(new, protocol, mode, d, warmup, epochs) / epochs
            print(f"{protocol:14} {mode:7} {d:5d} {a:14.4g} {b:14.4g} {b / a:8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
