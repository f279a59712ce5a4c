"""Scale: device-epochs per host CPU second and peak memory of every protocol at D = 1,000, 10,000 and 100,000 devices,
and the exact kernels' slowdown against float64 at the papers' shapes (issue 32, item 3).

Every registered protocol (:func:`fednet.protocol.registry.names`) runs in its timing mode where it has one (no field
or fixed-point math: the cost of simulating the protocol at scale) and in its only mode otherwise, on the LTE star
(the paper's link and shifted-exponential compute models), on a synthetic task sized to fit: each device holds ``--n``
Gaussian points of ``--d`` features (:func:`bench_sweep.synthetic_task`; the FedVS protocols, which split features
rather than examples, get 256 shared rows, FedVS's batch, of 2 features per device).  Parameters are
:data:`bench_sweep.PROTOCOLS`'s where it has the protocol, else :data:`EXTRA_PARAMS`'s, else the protocol's defaults.

Each (protocol, D) cell runs in a fresh child process, so that its peak resident memory (``ru_maxrss``) is its own,
under an address-space limit (``--memory-gib``, at most 80 % of the memory available when the benchmark starts) and
a time limit (``--limit`` seconds); a cell that fails, runs out of memory or time, or that the protocol refuses at that D
prints the reason instead.  The child first runs one untimed epoch at D = 10 where it can (JIT compilation, caches),
then builds the task and network (``build s``), runs the set-up phase up to the round-0 row (``setup s``) and
``--epochs`` rounds.
Reported, in host CPU seconds of the child (``time.process_time``, one BLAS thread; other load on a shared host
inflates them less than wall time):

- ``ms/epoch``: CPU milliseconds per simulated epoch after the set-up;
- ``dev-ep/s``: device-epochs per CPU second, ``updates x epochs / CPU seconds of the epochs``, where a round makes
  D updates (one per device), ``buffer_size`` for a buffered protocol (FedBuff) and none for ``centralized``;
- ``peak MiB``: the child's peak RSS; ``base MiB`` the RSS after its imports (the interpreter, NumPy, the protocol's
  module), before the warm-up.

The second table times the exact kernels against float64 on the same shapes, wall clock (best or median of
``--repeat``), reusing the kernel benchmarks: CodedPaddedFL's ``Q<48,24>`` product (2000 x 2000) @ (2000 x 10)
(:func:`bench_fixed_point.measure`), CodedSecAgg's products mod 2^72 + 15 and FedVS's field 2^31 - 1 at that shape
(:func:`bench_modp.measure`), and DReS-FL's kernels at the MNIST PINN's shapes over its 200- and 440-bit primes
(:func:`bench_field_kernels.kernel_rows`).

Run: ``.venv/bin/python benchmarks/bench_scale.py [--devices 1000 10000 100000] [--epochs 3] [--protocols conventional
codedsecagg] [--limit 900] [--memory-gib 24] [--d 20] [--n 16] [--repeat 5] [--no-kernels] [--json out.json]``;
``--quick`` (``make bench``): D = 1,000, 2 epochs, a 30 s limit per cell, the kernels at 3 repetitions, 200 bits only.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_scale.py --devices 40
--epochs 1 --protocols conventional codedsecagg --no-kernels``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from bench_sweep import PROTOCOLS as SWEEP_PROTOCOLS  # benchmarks/ is sys.path[0] when run as a script
from bench_sweep import synthetic_task

#: The cell's result line on the child's stdout starts with this.
TAG = "BENCH_SCALE "

#: Parameters by D for protocols :data:`bench_sweep.PROTOCOLS` does not have (the protocol's defaults otherwise).
EXTRA_PARAMS: dict[str, Callable[[int], dict[str, Any]]] = {
    "fedbuff_lightsecagg": lambda D: {"buffer_size": max(1, D // 10)},
    "approx_gc": lambda D: {"setting": "iid", "k": max(1, D // 10)},  # M = k L = D partitions (L = 10 classes)
}

#: Protocols whose devices hold feature blocks of shared rows (a vertical task), its rows (FedVS's batch of 256) and
#: features per device.
VERTICAL_PREFIX = "fedvs"
VERTICAL_ROWS = 256
VERTICAL_FEATURES = 2


def mode_of(cls: type) -> str:
    """``"timing"`` where the protocol's config has a timing mode, else ``"full"`` (its only mode)."""
    field = cls.Config.model_fields.get("mode")
    return "timing" if field is not None and "timing" in str(field.annotation) else "full"


def params_for(name: str, cls: type, D: int) -> dict[str, Any]:
    """The protocol parameters of a cell: :data:`bench_sweep.PROTOCOLS`'s or :data:`EXTRA_PARAMS`'s, and the mode."""
    params = dict(SWEEP_PROTOCOLS[name][1](D)) if name in SWEEP_PROTOCOLS else EXTRA_PARAMS.get(name, lambda D: {})(D)
    if mode_of(cls) == "timing":
        params["mode"] = "timing"
    return params


def updates_per_round(name: str, params: dict[str, Any], D: int) -> int:
    """Device updates one round makes: ``buffer_size`` for a buffered protocol, none for ``centralized``, else D."""
    if name == "centralized":
        return 0
    return int(params.get("buffer_size", D))


def vertical_task(D: int, c: int, n: int = VERTICAL_ROWS, d: int = VERTICAL_FEATURES) -> Any:
    """``n`` shared training rows with one-hot labels over ``c`` classes, ``d`` Gaussian features per device."""
    from fednet.learning.task import LearningTask

    rng = np.random.default_rng(0)
    y = np.eye(c)[rng.integers(0, c, n)]
    X = [rng.normal(size=(n, d)) / np.sqrt(d * D) for _ in range(D)]
    x_test = rng.normal(size=(50, d * D)) / np.sqrt(d * D)
    return LearningTask(X, [y] * D, x_test, rng.integers(0, c, 50), learning_rate=0.05)


def build(name: str, D: int, d: int, n: int, c: int) -> tuple[Any, dict[str, Any]]:
    """The protocol ``name`` on the LTE star of D devices with a synthetic task; and its parameters."""
    from fednet.protocol import registry
    from fednet.sim.compute import ShiftedExponential
    from fednet.sim.simulation import Simulation
    from fednet.topologies.lte import lte_star

    cls = registry.get(name)
    params = params_for(name, cls, D)
    task = vertical_task(D, c) if name.startswith(VERTICAL_PREFIX) else synthetic_task(D, d, n, c)
    sim = Simulation(lte_star(D, rng=np.random.default_rng(1)), seed=0, device_compute=ShiftedExponential(0.5),
                     record_views=False)
    return cls(sim, task, params, label=name), params


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_cell(name: str, D: int, *, epochs: int, d: int, n: int, c: int) -> dict[str, Any]:
    """One cell, in this process: a warm-up at D = 10, then the timed build, set-up and epochs (module docstring).

    Returns
    -------
    dict
        ``build_s``, ``setup_s``, ``epochs``, ``ms_per_epoch``, ``dev_ep_per_s``, ``peak_mib``, ``base_mib``,
        ``mode`` and ``params`` (CPU seconds).
    """
    from fednet.protocol import registry
    from fednet.study.threads import limit_threads

    registry.get(name)  # its module imported: part of the base
    base = _rss_mib()
    with limit_threads(1):
        try:
            build(name, 10, d, n, c)[0].run(1)
        except Exception:  # noqa: BLE001 - a protocol made for other sizes: the cell itself says why, or runs
            pass
        t0 = time.process_time()
        proto, params = build(name, D, d, n, c)
        t1 = time.process_time()
        marks: list[float] = []
        proto.run(epochs, on_round=lambda row: marks.append(time.process_time()))
    done = len(marks) - 1
    epoch_s = marks[-1] - marks[0]
    updates = updates_per_round(name, params, D) * done
    return {"mode": params.get("mode", "full"), "params": params, "build_s": t1 - t0, "setup_s": marks[0] - t1,
            "epochs": done, "ms_per_epoch": 1e3 * epoch_s / max(done, 1),
            "dev_ep_per_s": updates / epoch_s if updates and epoch_s > 0 else float("nan"),
            "peak_mib": _rss_mib(), "base_mib": base}


def _limit_memory(nbytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return apply


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure_cell(name: str, D: int, *, epochs: int, d: int, n: int, c: int, limit_s: float,
                 memory_bytes: int) -> dict[str, Any]:
    """Run one cell in a child process (:func:`run_cell`) under the limits; its result, or ``reason`` why none."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", name, str(D), "--epochs", str(epochs),
           "--d", str(d), "--n", str(n), "--c", str(c)]
    row: dict[str, Any] = {"protocol": name, "D": D}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, preexec_fn=_limit_memory(memory_bytes))
    except subprocess.TimeoutExpired:
        return {**row, "reason": f"time limit ({limit_s:.0f} s)"}
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            return {**row, **json.loads(line[len(TAG):])}
    if p.returncode < 0:
        return {**row, "reason": f"killed by signal {-p.returncode} (out of memory?)"}
    last = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {**row, "reason": f"exit {p.returncode}: {last[:160]}"}


def _cell_main(name: str, D: int, args: argparse.Namespace) -> None:
    """The child: print the cell's result, or its one-line reason, as one tagged JSON line."""
    try:
        out = run_cell(name, D, epochs=args.epochs, d=args.d, n=args.n, c=args.c)
    except MemoryError:
        out = {"reason": "memory limit (address space)"}
    except Exception as e:  # noqa: BLE001 - a protocol's refusal is the cell's answer
        msg = " ".join(str(e).split())
        out = {"reason": f"{type(e).__name__}: {msg[:160]}"}
    print(TAG + json.dumps(out), flush=True)


def kernel_rows(repeat: int, bits: tuple[int, ...] = (200, 440)) -> list[dict[str, Any]]:
    """The exact kernels against float64 at the papers' shapes (module docstring); wall milliseconds."""
    import bench_field_kernels
    import bench_fixed_point
    import bench_modp

    rows = []

    def add(protocol: str, kernel: str, float_ms: float, exact_ms: float) -> None:
        rows.append({"protocol": protocol, "kernel": kernel, "float64 ms": float_ms, "exact ms": exact_ms,
                     "ratio": exact_ms / float_ms})

    t = bench_fixed_point.measure(2000, 10, repeat)
    add("CodedPaddedFL", "Q<48,24> (2000x2000)@(2000x10), prepared operands", 1e3 * t["float64"],
        1e3 * t["exact_prepared"])
    for label, tf, te, _ in bench_modp.measure(2000, 2000, 10, repeat, galois=False)[1:]:
        who = "FedVS" if "31-bit" in label else "CodedSecAgg"
        add(who, f"{label.strip()}, (2000x2000)@(2000x10)", tf, te)
    for b in bits:
        _, krows = bench_field_kernels.kernel_rows(b, repeat)
        for name, tf, te, _ in krows:
            add("DReS-FL", f"{b}-bit: {name}", tf, te)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the scale table and the kernel table (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", help="device counts (default 1000 10000 100000)")
    ap.add_argument("--protocols", nargs="+", help="registered protocol names (default: all)")
    ap.add_argument("--epochs", type=int, help="timed epochs per cell (default 3)")
    ap.add_argument("--d", type=int, default=20, help="features per point (default 20)")
    ap.add_argument("--n", type=int, default=16, help="points per device (default 16)")
    ap.add_argument("--c", type=int, default=10, help="classes")
    ap.add_argument("--limit", type=float, help="CPU+wait seconds per cell before it is stopped (default 900)")
    ap.add_argument("--memory-gib", type=float, default=24.0,
                    help="address-space limit per cell, at most 80%% of the memory available now (default 24)")
    ap.add_argument("--repeat", type=int, help="repetitions of each kernel timing (default 5)")
    ap.add_argument("--no-kernels", action="store_true", help="skip the kernel table")
    ap.add_argument("--quick", action="store_true", help="the reduced run of `make bench` (module docstring)")
    ap.add_argument("--json", help="write both tables' rows to this JSON file")
    ap.add_argument("--cell", nargs=2, metavar=("PROTOCOL", "D"), help=argparse.SUPPRESS)  # the child
    args = ap.parse_args(argv)
    args.epochs = args.epochs or (2 if args.quick else 3)
    if args.cell:
        _cell_main(args.cell[0], int(args.cell[1]), args)
        return
    import pandas as pd

    from fednet.protocol import registry

    devices = args.devices or ([1000] if args.quick else [1000, 10000, 100000])
    limit_s = args.limit or (30.0 if args.quick else 900.0)
    repeat = args.repeat or (3 if args.quick else 5)
    memory = int(args.memory_gib * 2**30)
    avail = available_bytes()
    if avail is not None:
        memory = min(memory, int(0.8 * avail))  # a shared host: a cell fails with MemoryError, not the OOM killer
    print(f"# {len(devices)} device counts x protocols, {args.epochs} epochs, d = {args.d}, n = {args.n}; "
          f"per cell: {limit_s:.0f} s, {memory / 2**30:.1f} GiB address space", flush=True)
    names = args.protocols or registry.names()
    rows = []
    for D in devices:
        for name in names:
            try:
                mode = mode_of(registry.get(name))
            except Exception as e:  # noqa: BLE001 - a protocol that cannot load is a row, not the end of the run
                rows.append({"protocol": name, "D": D, "reason": f"cannot load: {' '.join(str(e).split())[:160]}"})
            else:
                rows.append({"mode": mode, **measure_cell(name, D, epochs=args.epochs, d=args.d, n=args.n, c=args.c,
                                                          limit_s=limit_s, memory_bytes=memory)})
            r = rows[-1]
            print(f"  {name} D={D}: " + (r["reason"] if "reason" in r else
                                         f"{r['dev_ep_per_s']:.0f} device-epochs/s, {r['peak_mib']:.0f} MiB"),
                  flush=True)
    measured = pd.DataFrame([r for r in rows if "reason" not in r],
                            columns=["protocol", "mode", "D", "build_s", "setup_s", "ms_per_epoch", "dev_ep_per_s",
                                     "peak_mib", "base_mib"])
    print("\nHost CPU seconds per cell (timing mode where the protocol has one)")
    print(measured.rename(columns={"build_s": "build s", "setup_s": "setup s", "ms_per_epoch": "ms/epoch",
                                   "dev_ep_per_s": "dev-ep/s", "peak_mib": "peak MiB", "base_mib": "base MiB"})
          .to_string(index=False, formatters={"build s": "{:.2f}".format, "setup s": "{:.2f}".format,
                                              "ms/epoch": "{:.1f}".format, "dev-ep/s": "{:,.0f}".format,
                                              "peak MiB": "{:,.0f}".format, "base MiB": "{:,.0f}".format}))
    failed = [r for r in rows if "reason" in r]
    if failed:
        print("\nCells without a result")
        for r in failed:
            print(f"  {r['protocol']:<20} {r.get('mode', ''):<6} D = {r['D']:<7} {r['reason']}")
    kernels = []
    if not args.no_kernels:
        kernels = kernel_rows(repeat, (200,) if args.quick else (200, 440))
        print("\nExact kernels vs float64 at the papers' shapes (host wall ms)")
        print(pd.DataFrame(kernels).to_string(index=False, justify="left", formatters={
            "protocol": "{:<13}".format, "kernel": "{:<62}".format, "float64 ms": "{:.3f}".format,
            "exact ms": "{:.3f}".format, "ratio": "{:.1f}".format}))
    if args.json:
        Path(args.json).write_text(json.dumps({"cells": rows, "kernels": kernels}, indent=1, default=str))


if __name__ == "__main__":
    main()
