"""Wall time of an exact ``Q<48,24>`` (2000 x 2000) @ (2000 x 10) product vs float64 BLAS.

Run: ``.venv/bin/python benchmarks/bench_fixed_point.py [--repeat N]``.  Prints the median of
``N`` runs for: plain float64 ``A @ B``; the exact fixed-point product on prepared operands
(limbs built once, the per-round case); the preparation of ``A`` alone; and the exact product
including both preparations.  The result is checked against a Python-int oracle on a slice.
"""

from __future__ import annotations

import argparse
import statistics
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.algebra.fixed_point import FixedPoint


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    """Time the products (module docstring) and print the medians in milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--d", type=int, default=2000)
    parser.add_argument("--c", type=int, default=10)
    args = parser.parse_args()
    q = FixedPoint(48, 24)
    rng = np.random.default_rng(0)
    A = q.random_pad((args.d, args.d), rng)  # full 48-bit values: 3 limbs, wrap-around
    B = q.random_pad((args.d, args.c), rng)
    Af, Bf = q.decode(A), q.decode(B)
    pa, pb = q.prepare(A), q.prepare(B)

    out = q.matmul(pa, pb)
    ref = q.wrap((A[:3].astype(object) @ B.astype(object)) >> q.f)
    assert np.array_equal(out[:3], ref), "exact product disagrees with the Python-int oracle"

    t_blas = _median_time(lambda: Af @ Bf, args.repeat)
    t_fix = _median_time(lambda: q.matmul(pa, pb), args.repeat)
    t_prep = _median_time(lambda: q.prepare(A), max(3, args.repeat // 3))
    t_full = _median_time(lambda: q.matmul(A, B), max(3, args.repeat // 3))
    shape = f"({args.d}x{args.d})@({args.d}x{args.c})"
    print(f"float64 BLAS {shape}:                  {t_blas * 1e3:8.2f} ms")
    print(f"Q<48,24> exact, prepared operands:     {t_fix * 1e3:8.2f} ms  ({t_fix / t_blas:.1f}x)")
    print(f"Q<48,24> prepare A (limb split, once): {t_prep * 1e3:8.2f} ms")
    print(f"Q<48,24> exact, unprepared operands:   {t_full * 1e3:8.2f} ms  ({t_full / t_blas:.1f}x)")


if __name__ == "__main__":
    main()
