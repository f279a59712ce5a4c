"""Wall time of an exact ``Q<48,24>`` (2000 x 2000) @ (2000 x 10) product vs float64 BLAS.

Run: ``.venv/bin/python benchmarks/bench_fixed_point.py [--repeat N] [--d 2000] [--c 10]``.  Prints the median of
``N`` runs for: plain float64 ``A @ B``; the exact fixed-point product on prepared operands
(limbs built once, the per-round case); the preparation of ``A`` alone; and the exact product
including both preparations.  The result is checked against a Python-int oracle on a slice.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_fixed_point.py --repeat 1
--d 200``
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


def measure(d: int = 2000, c: int = 10, repeat: int = 15) -> dict[str, float]:
    """Median seconds of the products (module docstring) at ``(d x d) @ (d x c)``, the result checked first.

    Returns
    -------
    dict
        ``float64``, ``exact_prepared``, ``prepare_A`` and ``exact_unprepared``: seconds.
    """
    q = FixedPoint(48, 24)
    rng = np.random.default_rng(0)
    A = q.random_pad((d, d), rng)  # full 48-bit values: 3 limbs, wrap-around
    B = q.random_pad((d, c), rng)
    Af, Bf = q.decode(A), q.decode(B)
    pa, pb = q.prepare(A), q.prepare(B)

    out = q.matmul(pa, pb)
    ref = q.wrap((A[:3].astype(object) @ B.astype(object)) >> q.f)
    assert np.array_equal(out[:3], ref), "exact product disagrees with the Python-int oracle"
    few = max(3, repeat // 3)
    return {"float64": _median_time(lambda: Af @ Bf, repeat),
            "exact_prepared": _median_time(lambda: q.matmul(pa, pb), repeat),
            "prepare_A": _median_time(lambda: q.prepare(A), few),
            "exact_unprepared": _median_time(lambda: q.matmul(A, B), few)}


def main() -> None:
    """Time the products (module docstring) and print the medians in milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--d", type=int, default=2000)
    parser.add_argument("--c", type=int, default=10)
    args = parser.parse_args()
    t = measure(args.d, args.c, args.repeat)
    t_blas, t_fix, t_prep, t_full = t["float64"], t["exact_prepared"], t["prepare_A"], t["exact_unprepared"]
    shape = f"({args.d}x{args.d})@({args.d}x{args.c})"
    print(f"float64 BLAS {shape}:                  {t_blas * 1e3:8.2f} ms")
    print(f"Q<48,24> exact, prepared operands:     {t_fix * 1e3:8.2f} ms  ({t_fix / t_blas:.1f}x)")
    print(f"Q<48,24> prepare A (limb split, once): {t_prep * 1e3:8.2f} ms")
    print(f"Q<48,24> exact, unprepared operands:   {t_full * 1e3:8.2f} ms  ({t_full / t_blas:.1f}x)")


if __name__ == "__main__":
    main()
