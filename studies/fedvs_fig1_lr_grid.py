"""Learning-rate check behind fedvs_fig1's per-aggregation server rates (Wait without stragglers, one seed).

Usage: ``python studies/fedvs_fig1_lr_grid.py EPOCHS AGG:INIT:LR_CLIENT:LR_SERVER [...]``, e.g.
``python studies/fedvs_fig1_lr_grid.py 100 average:5:5:0.5 concat:5:5:0.5 concat:5:5:0.05 max:5:5:0.5 max:5:5:0.05``.
FashionMNIST over 16 clients (all 60000 training images, the first 1000 test images), fedvs_fig1's network
(300 Mbit/s, clients 1e9 MAC/s), ``delay_scale = 0``, batch 256, seed 0.  Prints the test accuracy every 10
rounds (rounds 10, 20, ..., EPOCHS) and the host CPU seconds of each setting.
"""

import sys
import time

from fednet.learning.vertical import as_learning_task, load_vertical
from fednet.protocol import registry
from fednet.sim import Deterministic, Simulation
from fednet.topologies.lte import lte_star


def main(argv: list[str]) -> None:
    """Run every ``AGG:INIT:LR_CLIENT:LR_SERVER`` setting for ``EPOCHS`` rounds (module docstring)."""
    epochs, specs = int(argv[0]), argv[1:]
    task = as_learning_task(load_vertical("fashion-mnist", 16, max_test=1000))
    for spec in specs:
        agg, init, lrc, lrs = spec.split(":")
        g = lte_star(16, uplink_bps=300e6, downlink_bps=300e6, loss=0.0, header_overhead=0.0, server_mac_rate=1e11,
                     device_mac_rates=[1e9] * 16)
        sim = Simulation(g, 0, device_compute=Deterministic(), record_views=False, secret_seed=1)
        t = time.process_time()
        proto = registry.get("fedvs_wait")(sim, task, dict(aggregation=agg, delay_scale=0.0, init_scale=float(init),
                                                           lr_client=float(lrc), lr_server=float(lrs), batch_size=256))
        trace = proto.run(epochs)
        print(spec, " ".join(f"{r['accuracy']:.2f}" for r in trace[10::10]), f"cpu {time.process_time() - t:.1f}s",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
