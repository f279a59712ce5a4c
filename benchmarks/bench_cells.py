"""Host cost of shared cells against the orthogonal star (issue 28: "timing-mode throughput on the shared cell stays
within 2x of the orthogonal star at D = 1000").

Each protocol runs :mod:`bench_sweep`'s synthetic task (d features, n rows a device, c classes) at D devices twice:
on the papers' star (:func:`fednet.topologies.lte.lte_star`: every device its own full-rate links, the engine's array
backends) and with the same devices in ``--cells`` cells of consecutive devices sharing each cell's airtime
(:func:`fednet.topologies.lte.lte_cells`, processor sharing, :mod:`fednet.sim.cells`).  Replayed on round-robin cells
without processes (the airtime by :mod:`fednet.sim.engine.backends.airtime`'s float operations): the vectorised
gather (conventional FL), the groups backend (CodedPaddedFL's grouped gathers), the masked backend (LightSecAgg's
timing-mode round, :mod:`fednet.sim.engine.backends.masked_cells`) and the tree backend (CodedSecAgg's tree of
shares, :mod:`fednet.sim.engine.backends.tree_cells`); the other backends (the set-ups' exchanges among them) and
proportional-fair cells decline and the reference runs.  Printed
per protocol: host CPU milliseconds per epoch after the set-up (``time.process_time``, best of ``--repeat``),
device-epochs per CPU second, the cell/star ratio, and the simulated seconds per epoch of each (the cells' are longer:
the devices share the air).

Run (a few minutes on a quiet 2-core host)::

    .venv/bin/python benchmarks/bench_cells.py --devices 1000 --cells 10

``--scheduler proportional_fair`` shares the cells by proportional fair instead (:class:`fednet.sim.cells.
ProportionalFairAir`, every device at ``--snr-db``, 10 dB by default).

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_cells.py --devices 50
--cells 5 --epochs 1 --repeat 1 --protocols conventional``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import fednet

fednet.configure_host()

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sweep as b  # noqa: E402

from fednet.protocol import registry  # noqa: E402
from fednet.sim.compute import ShiftedExponential  # noqa: E402
from fednet.sim.simulation import Simulation  # noqa: E402
from fednet.study.threads import limit_threads  # noqa: E402
from fednet.topologies.lte import lte_cells, lte_star  # noqa: E402

#: Protocols measured by default, in the mode their studies sweep in.
DEFAULT = ["conventional", "codedpaddedfl", "codedsecagg", "lightsecagg"]


def epoch_cpu(protocol: str, n_devices: int, n_cells: int | None, *, d: int, n: int, c: int,
              epochs: int, scheduler: str = "round_robin", snr_db: float = 10.0) -> tuple[float, float]:
    """CPU seconds per epoch after the set-up and simulated seconds per epoch."""
    modes, params_of = b.PROTOCOLS[protocol]
    params = dict(params_of(n_devices))
    if "timing" in modes:
        params["mode"] = "timing"
    task = b.synthetic_task(n_devices, d, n, c)
    rng = np.random.default_rng(1)
    snr = None if scheduler == "round_robin" else snr_db
    graph = lte_star(n_devices, rng=rng) if n_cells is None else lte_cells(n_devices, n_cells=n_cells, rng=rng,
                                                                          scheduler=scheduler, snr_db=snr)
    sim = Simulation(graph, seed=0, device_compute=ShiftedExponential(0.5), record_views=False)
    proto = registry.get(protocol)(sim, task, params, label=protocol)
    marks: list[tuple[float, float]] = []
    with limit_threads(1):
        proto.run(epochs, on_round=lambda row: marks.append((time.process_time(), sim.now)))
    (c0, s0), (c1, s1) = marks[0], marks[-1]
    done = max(len(marks) - 1, 1)
    return (c1 - c0) / done, (s1 - s0) / done


def main(argv: list[str] | None = None) -> int:
    """Print, per protocol, CPU ms per epoch on the star and on the cells, their ratio and the simulated epoch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--protocols", nargs="+", default=DEFAULT, choices=sorted(b.PROTOCOLS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--d", type=int, default=100)
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--c", type=int, default=10)
    parser.add_argument("--scheduler", default="round_robin", choices=["round_robin", "proportional_fair"])
    parser.add_argument("--snr-db", type=float, default=10.0, help="every device's mean SNR (proportional fair)")
    args = parser.parse_args(argv)
    D = args.devices
    print(f"D = {D}, {args.cells} {args.scheduler} cells of {D // args.cells}, d = {args.d}, {args.epochs} epochs, "
          f"best of {args.repeat} (host CPU; simulated seconds per epoch in brackets)")
    print(f"{'protocol':14} {'star ms/ep':>11} {'cells ms/ep':>12} {'cells/star':>10} {'star dev-ep/s':>14} "
          f"{'cells dev-ep/s':>15}   simulated s/epoch star, cells")
    for protocol in args.protocols:
        star = min((epoch_cpu(protocol, D, None, d=args.d, n=args.n, c=args.c, epochs=args.epochs)
                    for _ in range(args.repeat)), key=lambda r: r[0])
        cell = min((epoch_cpu(protocol, D, args.cells, d=args.d, n=args.n, c=args.c, epochs=args.epochs,
                              scheduler=args.scheduler, snr_db=args.snr_db)
                    for _ in range(args.repeat)), key=lambda r: r[0])
        print(f"{protocol:14} {1e3 * star[0]:11.2f} {1e3 * cell[0]:12.2f} {cell[0] / star[0]:10.2f} "
              f"{D / star[0]:14.0f} {D / cell[0]:15.0f}   [{star[1]:.4g}, {cell[1]:.4g}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
