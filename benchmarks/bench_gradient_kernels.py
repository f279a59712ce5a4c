"""Host cost of conventional FL's batched gradient kernels alone, at the shapes of bench_sweep's D = 1000 row.

What the epoch of ``bench_sweep.py --devices 1000 --protocols conventional`` spends in
:func:`fednet.learning.models.minibatch_gradients` (the minibatches gathered from the stacked points, one
pair of BLAS products per device, the scaling), with nothing of the engine around it: the floor an epoch cannot go
under while each device keeps its own products (the bits of the unbatched code). Printed per thread count lent
(:func:`fednet.algebra.slices.compute_threads`), milliseconds per epoch, three repetitions of 50 epochs.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gradient_kernels.py [--devices 1000] [--d 100] [--n 48]
[--b 10]``.  Compare with ``FEDNET_DEFAULT_MALLOC=1`` (glibc's malloc defaults: the temporaries mapped anew).

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_gradient_kernels.py
--devices 10``
"""

from __future__ import annotations

import argparse
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.algebra.slices import compute_threads
from fednet.learning.models import minibatch_gradients
from fednet.study.threads import limit_threads


def main() -> None:
    """Print the kernels' milliseconds per epoch for 1 and 2 threads."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--d", type=int, default=100)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--b", type=int, default=10)
    ap.add_argument("--c", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    D, n, d, c, b = args.devices, args.n, args.d, args.c, args.b
    X = [rng.standard_normal((n, d)) for _ in range(D)]
    Y = [rng.standard_normal((n, c)) for _ in range(D)]
    theta = rng.standard_normal((d, c))
    rows = np.stack([rng.choice(n, b, replace=False) for _ in range(D)])
    print(f"malloc tuned: {fednet.configure_host().malloc}")
    with limit_threads(1):
        for t in (1, 2):
            with compute_threads(t):
                cache: dict = {}
                for _ in range(3):
                    t0 = time.perf_counter()
                    for _ in range(50):
                        with MacMeter():
                            minibatch_gradients(X, Y, theta, rows, cache)
                    print(f"threads {t}: {(time.perf_counter() - t0) / 50 * 1e3:.2f} ms an epoch", flush=True)


if __name__ == "__main__":
    main()
