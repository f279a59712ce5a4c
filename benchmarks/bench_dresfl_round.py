"""Host wall time of DReS-FL rounds: one full-mode round (real LCC data, coded gradients, decoding, check)
and one timing-mode round, N = 20 clients, the paper's 784-64-64-10 network over GF(2^200 - 75), K = T = 1.

Usage: PYTHONPATH=. python benchmarks/bench_dresfl_round.py [rows_per_client [rounds]]
(full mode keeps every client's coded data set in residue form: rows_per_client = 3000, MNIST's, does not fit
in memory; the default 64 does.)
       PYTHONPATH=. python benchmarks/bench_dresfl_round.py --table2 [rounds]
(timing mode only, at the Table 2 set-up of ``studies/dresfl_table2.toml``: 3000 rows per client,
p = 2^440 - 33, f = 8, max_norm 64, batch 64; host seconds per round over rounds 2..``rounds``, default 100.)

Measured (2026-11-23, the shared 2-core host at load average ~5-7, ``nice -n 5``): full mode, set-up 47.3 s host
(LCC encoding and sharing of 20 x 64 rows), one round 6.47 s host (20 coded gradients over GF(2^200 - 75), the
decoding and the bit-for-bit check); timing mode, one round 0.39 s host.  In the Table 2 study (timing mode,
p = 2^440 - 33, MNIST, 3000 rounds, seed 0) DReS-FL took 566 s of the study's 1016 s host (0.19 s per round;
FedAvg 150 s, FedAvg-IS 147 s, SCAFFOLD 137 s, centralized 12 s): its per-round cost is the plain integer
gradient of the global minibatch (RNS forward and backward, CRT to Python ints) and the exact update Q.

``--table2`` (2026-11-26, the shared 2-core host at load average 3.4-4.6, two alternating runs of 100 rounds
each): before the timing-mode speed-ups (main at a00ff18) 0.114 / 0.150 s host per round (0.098 / 0.105 s
CPU); after (the plain gradient modulo a smaller prime as WideInts digit columns, the update on them, the
global data transformed once) 0.032 / 0.044 s host (0.031 / 0.042 s CPU).  The study itself, DReS-FL only,
MNIST seed 0, 1000 rounds (``fednet run studies/dresfl_table2.toml --runs DReS-FL --epochs 1000 --seed 0``):
252 s -> 86 s host wall (load average ~5.5), the trace bit for bit the same.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_dresfl_round.py 4 1``
"""

from __future__ import annotations

import sys
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star


def main(rows: int = 64, rounds: int = 2) -> None:
    """Print host seconds per DReS-FL round, full and timing mode (N = 20 clients, MNIST-shaped random data).

    Parameters
    ----------
    rows : int
        Rows per client.
    rounds : int
        Training rounds measured after the set-up.
    """
    N, rng = 20, np.random.default_rng(0)
    X = [rng.random((rows, 784)) for _ in range(N)]
    Y = [np.eye(10)[rng.integers(0, 10, rows)] for _ in range(N)]
    task = LearningTask(X, Y, rng.random((100, 784)), rng.integers(0, 10, 100))
    for mode in ("full", "timing"):
        sim = Simulation(lte_star(N, device_mac_rates=[1e8] * N), 0, availability=AlwaysAvailable(),
                         record_views=False)
        proto = registry.get("dresfl")(sim, task, {"mode": mode, "eval_every": 1000})
        stamps = [time.perf_counter()]
        proto.run(rounds, on_round=lambda row: stamps.append(time.perf_counter()))
        setup, per_round = stamps[1] - stamps[0], (stamps[-1] - stamps[1]) / rounds
        print(f"{mode:6s}: setup {setup:7.2f} s host, one round {per_round:7.2f} s host "
              f"(N = {N}, {rows} rows per client, d_w = {proto.learning.n_params})", flush=True)


def table2(rounds: int = 100, rows: int = 3000) -> float:
    """Host seconds per timing-mode round at the Table 2 set-up (MNIST-shaped random data, N = 20).

    Parameters
    ----------
    rounds : int
        Training rounds (>= 2) after the (virtual) set-up; the first is not timed (it transforms the global data).
    rows : int
        Rows per client (MNIST: 3000).

    Returns
    -------
    float
        Mean host seconds per round (also printed).
    """
    N, rng = 20, np.random.default_rng(0)
    X = [rng.random((rows, 784)) for _ in range(N)]
    Y = [np.eye(10)[rng.integers(0, 10, rows)] for _ in range(N)]
    task = LearningTask(X, Y, rng.random((100, 784)), rng.integers(0, 10, 100))
    sim = Simulation(lte_star(N, device_mac_rates=[1e8] * N), 0, availability=AlwaysAvailable(), record_views=False)
    proto = registry.get("dresfl")(sim, task, {"mode": "timing", "p": "2^440-33", "max_norm": 64.0,
                                               "eval_every": 1000})
    stamps, cpu = [time.perf_counter()], [time.process_time()]

    def on_round(row):
        """Stamp host wall and CPU seconds at the end of each round."""
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())

    proto.run(rounds, on_round=on_round)
    per_round = (stamps[-1] - stamps[2]) / (rounds - 1)      # round 1 also transforms the global data set
    print(f"timing (Table 2 set-up): setup {stamps[1] - stamps[0]:6.2f} s host, {per_round:.4f} s host per round "
          f"({(cpu[-1] - cpu[2]) / (rounds - 1):.4f} s CPU) over rounds 2..{rounds} (N = {N}, {rows} rows per client, "
          f"p = 2^440 - 33, d_w = {proto.learning.n_params})",
          flush=True)
    return per_round


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table2":
        table2(int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    else:
        main(*(int(a) for a in sys.argv[1:3]))
