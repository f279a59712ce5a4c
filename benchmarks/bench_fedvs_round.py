"""Benchmark: host wall time of full-mode FedVS rounds at the FashionMNIST set-up (Li, Yao, Liu, App. C).

Run: ``FEDNET_DATA=... .venv/bin/python benchmarks/bench_fedvs_round.py [--K 2 --T 1 --rounds 5
--max-train 60000 --max-test 2000 --mode full|timing]``.

28 clients holding 28 pixels each of all 60000 training images, 1-layer PN, embedding 64, batch 256
(``256 / K`` coded rows), p = 2^31 - 1.  Timed (host wall clock, not simulated time): the set-up phase (its
encoding is charged, the shares of a batch are materialised when the batch is used), then each round:
model quantisation and LCC sharing (28 clients), the batch's data shares, 28 coded embeddings (eq. 5), the
decoding (eqs. 6-7), the full-mode bit-exact check against the plain quantised sum, the top model's step
and the 28 client updates, with the engine's event handling, and the observer's test evaluation of the
trace row (``--max-test`` images).  ``--mode timing`` times the same rounds in timing mode (no field math;
the same trace).  Prints JSON.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_fedvs_round.py --rounds 1
--max-train 512 --max-test 100 --mode timing``
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    """Parse the command line and print host seconds per FedVS round (host wall-clock, not simulated time)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--K", type=int, default=2)
    ap.add_argument("--T", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-train", type=int, default=60000)
    ap.add_argument("--max-test", type=int, default=2000)
    ap.add_argument("--mode", choices=["full", "timing"], default="full")
    args = ap.parse_args()
    import fednet

    fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads
    from fednet.learning.vertical import as_learning_task, load_vertical
    from fednet.sim import Deterministic, Simulation
    from fednet.protocols.fedvs import FedVS
    from fednet.topologies.lte import lte_star

    t0 = time.perf_counter()
    data = load_vertical("fashion-mnist", 28, max_train=args.max_train, max_test=args.max_test)
    t_load = time.perf_counter() - t0
    g = lte_star(28, uplink_bps=300e6, downlink_bps=300e6, loss=0.0, header_overhead=0.0, server_mac_rate=1e11,
                 device_mac_rates=[1e9] * 28)
    sim = Simulation(g, 0, device_compute=Deterministic(), record_views=False)
    proto = FedVS(sim, as_learning_task(data), {"K": args.K, "T": args.T, "mode": args.mode})
    stamps = []
    t1 = time.perf_counter()
    proto.run(args.rounds, on_round=lambda row: stamps.append(time.perf_counter()))
    per_round = [b - a for a, b in zip(stamps, stamps[1:])]
    print(json.dumps({"mode": args.mode, "K": args.K, "T": args.T, "train_rows": len(data.y_train), "load_s": round(t_load, 2),
                      "setup_s": round(stamps[0] - t1, 2), "round_s": [round(x, 3) for x in per_round],
                      "round_s_median": round(sorted(per_round)[len(per_round) // 2], 3),
                      "checked_rounds": proto.checked_rounds, "sim_time_s": round(sim.now, 3)}))


if __name__ == "__main__":
    main()
