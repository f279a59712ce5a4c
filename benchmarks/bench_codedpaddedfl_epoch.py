"""Wall time of one full-mode CodedPaddedFL epoch vs the same products in float64.

Run: ``.venv/bin/python benchmarks/bench_codedpaddedfl_epoch.py [--D 25 --d 2000 --c 10 --alpha 23]``.

One epoch of phase 2 (paper Sec. V-B) as the protocol executes it
(:mod:`fednet.protocols.codedpaddedfl`, math in :mod:`fednet.codes.padded`): every device turns its stored encoded share ``Cbar_i``
(canonical 16-bit limbs of residues mod ``2^(k+f)``, prepared once as float64 limbs and kept
across rounds) into ``C_i + Cbar_i epsilon`` (eq. 11, exact, one ``Q<48,24>`` shift); the server
removes the pads of the ``D - alpha + 1`` responders the same way and decodes (eq. 12).  The
reference is the same products in plain float64 numpy: ``D + (D - alpha + 1)`` products
``(d x d) @ (d x c)`` and the decoding sum.  The ratio is the overhead of exactness.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_codedpaddedfl_epoch.py --D
4 --d 40 --c 2 --alpha 2 --repeat 1``
"""

from __future__ import annotations

import argparse
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np

from fednet.algebra.fixed_point import FixedPoint, prepare, prepared_from_limbs, random_ring_limbs
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.codes.padded import coded_gradient, decode, remove_pads


def main() -> None:
    """Time one exact epoch and the float64 reference (module docstring); print both in seconds."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--D", type=int, default=25)
    ap.add_argument("--d", type=int, default=2000)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--alpha", type=int, default=23)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    q = FixedPoint(48, 24)
    rng = np.random.default_rng(0)
    bits = q.k + q.f
    n_resp = a.D - a.alpha + 1
    code = CyclicGradientCode(a.alpha, a.D, rng, a_format=q, max_patterns=200)
    Cbar = [prepared_from_limbs(random_ring_limbs((a.d, a.d), bits, rng)) for _ in range(a.D)]
    C = [random_ring_limbs((a.d, a.c), bits, rng) for _ in range(a.D)]
    Rbar = [prepared_from_limbs(random_ring_limbs((a.d, a.d), bits, rng)) for _ in range(n_resp)]
    R = [random_ring_limbs((a.d, a.c), bits, rng) for _ in range(n_resp)]
    eps = q.encode(rng.uniform(-2, 2, (a.d, a.c)))
    Cf = [rng.standard_normal((a.d, a.d)) for _ in range(min(a.D, 4))]
    ef = q.decode(eps)
    responders = list(range(n_resp))

    def exact_epoch():
        """Devices' eq. (11), the server's pad removal for the responders, eq. (12)."""
        pe = prepare(eps)
        sent = [coded_gradient(q, Cbar[i], C[i], pe) for i in range(a.D)]
        P = np.stack([remove_pads(q, sent[i], coded_gradient(q, Rbar[i], R[i], pe))
                      for i in responders])
        return decode(q, code, responders, P)

    def float_epoch():
        """The same products and decoding sum in plain float64."""
        sent = [Cf[i % len(Cf)] @ ef for i in range(a.D)]
        P = np.stack([sent[i] - Cf[i % len(Cf)] @ ef for i in responders])
        return np.tensordot(code.decoding_vector(responders), P, axes=1)

    def best(fn):
        """Smallest wall time of ``fn()`` over ``--repeat`` runs, in seconds."""
        ts = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    t_exact = best(exact_epoch)
    t_float = best(float_epoch)
    pe = prepare(eps)
    raw = random_ring_limbs((a.d, a.d), bits, rng)
    t0 = time.perf_counter()
    prepared_from_limbs(raw)
    t_conv = time.perf_counter() - t0
    t0 = time.perf_counter()
    coded_gradient(q, Cbar[0], C[0], pe)
    t_dev = time.perf_counter() - t0
    print(f"D={a.D} d={a.d} c={a.c} alpha={a.alpha}: {a.D} device products + {n_resp} pad removals + decode")
    print(f"  exact Q<48,24> epoch:   {t_exact:8.3f} s")
    print(f"  float64 same products:  {t_float:8.3f} s")
    print(f"  overhead of exactness:  {t_exact / t_float:8.1f} x")
    print(f"  per device: exact product {t_dev * 1e3:.1f} ms; preparing Cbar (once, setup) {t_conv * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
