"""Benchmark: exact (2000 x 2000) @ (2000 x 10) products mod q against float64 BLAS.

Run: ``.venv/bin/python benchmarks/bench_modp.py [--m 2000 --k 2000 --n 10 --repeat 7] [--no-galois]``.

Reports the best-of-``repeat`` wall time (ms) of
* plain float64 BLAS ``A @ B`` (the reference speed, not exact mod q),
* ``PreparedMatrix.matmul`` mod a 31-bit prime (2**31 - 1) and mod the 73-bit CodedSecAgg prime
  2**72 + 15 (Remark 3, Q<48,24>) with a uniform right operand,
* ``PreparedMatrix.matmul_signed`` mod 2**72 + 15 with a 48-bit signed right operand (the
  CodedSecAgg update epsilon, eq. 13),
* the one-off cost of preparing the left operand, and galois FieldArray matmul on a (m/10)-row slice
  (scaled by 10) as the oracle's speed.
Every exact result is checked against galois on a few rows.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_modp.py --m 100 --k 100
--repeat 1 --no-galois``
"""

from __future__ import annotations

import argparse
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.algebra.fields import fixed_point_field, prime_field, to_field, uniform
from fednet.algebra.modp import prepare


def best_ms(fn, repeat: int) -> float:
    """Best of ``repeat`` timings of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def measure(m: int = 2000, k: int = 2000, n: int = 10, repeat: int = 7,
            galois: bool = True) -> list[tuple[str, float, float, str]]:
    """The products of the module docstring at ``(m x k) @ (k x n)``, every exact result checked against galois.

    Parameters
    ----------
    m, k, n : int
        The shape.
    repeat : int
        Each time is the best of this many runs.
    galois : bool
        Also time galois' FieldArray product (on ``m / 10`` rows, scaled) for each prime.

    Returns
    -------
    list of (label, float64 ms, exact ms, note)
        The float64 BLAS row first (its own reference).
    """
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, k))
    B = rng.standard_normal((k, n))
    t_blas = best_ms(lambda: A @ B, repeat)
    rows = [("float64 BLAS", t_blas, t_blas, "")]

    for label, q, rhs_bits in [("31-bit 2^31-1", 2**31 - 1, None), ("73-bit 2^72+15", fixed_point_field(48, 24), None)]:
        a = uniform(rng, q, (m, k))
        b = uniform(rng, q, (k, n))
        t0 = time.perf_counter()
        P = prepare(a, q, rhs_bits=rhs_bits)
        t_prep = 1e3 * (time.perf_counter() - t0)
        out = P.matmul(b)
        GF = prime_field(q)
        ref = np.asarray((GF(a[:3]) @ GF(b)).view(np.ndarray))
        assert np.array_equal(out[:3].astype(object), ref.astype(object)), label
        t = best_ms(lambda: P.matmul(b), repeat)
        rows.append((f"mod {label} field rhs", t_blas, t,
                     f"limbs {P.n_limbs}x{P.w}b | rhs {P.w_b}b; prepare {t_prep:.0f} ms, {P.nbytes / 2**20:.0f} MiB"))
        if galois:
            mg = max(1, m // 10)
            t_g = best_ms(lambda: GF(a[:mg]) @ GF(b), 1) * (m / mg)
            rows.append((f"  galois FieldArray (scaled from {mg} rows)", t_blas, t_g, ""))

    q = fixed_point_field(48, 24)
    a = uniform(rng, q, (m, k))
    eps = rng.integers(-(2**47), 2**47, size=(k, n))
    P = prepare(a, q, rhs_bits=48)
    GF = prime_field(q)
    ref = np.asarray((GF(a[:3]) @ GF(to_field(eps, q))).view(np.ndarray))
    assert np.array_equal(P.matmul_signed(eps)[:3].astype(object), ref.astype(object))
    t = best_ms(lambda: P.matmul_signed(eps), repeat)
    rows.append(("mod 73-bit, 48-bit signed rhs (eq.13)", t_blas, t,
                 f"limbs {P.n_limbs}x{P.w}b | rhs {P.w_b}b, {P.nbytes / 2**20:.0f} MiB"))
    return rows


def main() -> None:
    """Time the products for the sizes given on the command line and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--k", type=int, default=2000)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-galois", action="store_true", help="skip the (slow) galois FieldArray rows")
    args = ap.parse_args()
    print(f"shape ({args.m}x{args.k})@({args.k}x{args.n}), best of {args.repeat}")
    for label, t_blas, t, note in measure(args.m, args.k, args.n, args.repeat, galois=not args.no_galois):
        print(f"{label:40s} {t:9.2f} ms {t / t_blas:6.1f}x" + (f"  ({note})" if note else ""))


if __name__ == "__main__":
    main()
