"""Interleaved A/B of :mod:`bench_sweep` between another checkout (A, the before) and this one (B).

Each configuration (protocol, mode, D) runs ``--reps`` times in each checkout, alternating A, B, A, B, ... in one
sitting, so that drift of the host's load hits both alike; the table gives each side's best device-epochs per second
and B / A.  A checkout is any directory holding a fednet source tree (``git worktree add /tmp/base REV``); both run
with this interpreter (``PYTHONPATH`` points at the checkout: its ``fednet`` and, through fednet's checkout finder, its
``protocols/``).

Run: ``.venv/bin/python benchmarks/bench_ab.py --base /tmp/base [--devices 25 120 1000] [--reps 2]
[--protocols conventional codedsecagg] [--json out.json]``

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_ab.py --base . --devices 10
--protocols conventional --reps 1``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: (protocol, mode) pairs measured, and epochs per D (a few host seconds each: shorter runs are dominated by noise).
CONFIGS = [("conventional", "full"), ("cfl", "full"), ("codedpaddedfl", "timing"), ("codedsecagg", "timing"),
           ("lightsecagg", "timing")]
EPOCHS = {25: 1500, 120: 400, 1000: 50}


def once(tree: Path, protocol: str, mode: str, D: int, epochs: int) -> float:
    """Device-epochs per second of one bench_sweep run in ``tree``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, str(tree / "benchmarks" / "bench_sweep.py"), "--devices", str(D),
                        "--protocols", protocol, "--modes", mode, "--epochs", str(epochs), "--no-profile",
                        "--json", out.name], check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
        rows = json.loads(Path(out.name).read_text())
    if len(rows) != 1:
        raise RuntimeError(f"bench_sweep in {tree} gave no row for {protocol} {mode} D = {D} (it printed why)")
    return float(rows[0]["device_epochs_per_s"])


def main() -> None:
    """Run the grid, alternating the two checkouts, and print the table (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (A)")
    ap.add_argument("--devices", type=int, nargs="+", default=[25, 120, 1000])
    ap.add_argument("--protocols", nargs="+", default=[p for p, _ in CONFIGS])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{'protocol':<14} {'mode':<6} {'D':>5} {'A dev-ep/s':>11} {'B dev-ep/s':>11} {'B/A':>6}", flush=True)
    for D in args.devices:
        for protocol, mode in CONFIGS:
            if protocol not in args.protocols:
                continue
            a, b = [], []
            for _ in range(args.reps):
                a.append(once(args.base.resolve(), protocol, mode, D, EPOCHS.get(D, 20)))
                b.append(once(HERE, protocol, mode, D, EPOCHS.get(D, 20)))
            rows.append({"protocol": protocol, "mode": mode, "D": D, "A": max(a), "B": max(b), "A_all": a, "B_all": b})
            print(f"{protocol:<14} {mode:<6} {D:>5} {max(a):>11,.0f} {max(b):>11,.0f} {max(b) / max(a):>6.2f}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
