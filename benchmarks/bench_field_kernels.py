"""Exact GF(p) kernels of DReS-FL (RNS on float64 BLAS) against float64 on the same shapes.

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_field_kernels.py
[--repeat 5] [--bits 200 440]``.

Shapes are those of the DReS-FL MNIST network (Shao et al., Sec. 6.1, App. E): the PINN
784-64-64-10 with quadratic activations, batch b = 64, Lagrange-coded (uniform) data; and the LCC
encoding of one coded minibatch for N = 20 clients (K = T = 1) and the decoding of the d_w = 55,050
gradient entries from deg(g)(K + T - 1) + 1 = 9 evaluations.  Operands are kept in residue form
across calls (as a client keeps its coded data), so the "kernel" rows exclude conversion; the
conversion rows time it separately.  Each entry is the minimum over ``--repeat`` runs of host wall
time (ms); the ratio is exact / float64.  Goal: within 30x of float64 at 200 bits.  The last row
of the first table times a plain Python-int object-array product (what galois' FieldArray does for
such primes) once, for scale.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fednet.algebra.fields import lagrange_coefficients, uniform
from fednet.algebra.rns import rns_context
from fednet.codes.dresfl import DRESFL_PRIME_200, DRESFL_PRIME_440, default_points
from fednet.learning.field_models import FieldPolyMLP

PRIMES = {200: DRESFL_PRIME_200, 440: DRESFL_PRIME_440}


def _best_pair(f_float, f_exact, repeat: int) -> tuple[float, float]:
    """Minimum wall times (ms) of the two functions, measured alternately (shared host load hits both)."""
    f_float()
    f_exact()
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for i, fn in enumerate((f_float, f_exact)):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return best[0] * 1e3, best[1] * 1e3


def _float_pass(Ws, bs, x, y):
    a, zs = [x], []
    for i, (W, b) in enumerate(zip(Ws, bs)):
        z = a[-1] @ W + b
        zs.append(z)
        if i < len(Ws) - 1:
            a.append(z * z)
    dz = 2 * (zs[-1] - y)
    g = []
    for i in reversed(range(len(Ws))):
        g.append(a[i].T @ dz)
        g.append(dz.sum(axis=0))
        if i > 0:
            dz = 2 * zs[i - 1] * (dz @ Ws[i].T)
    return g


def main() -> None:
    """Print one table per prime: operation, float64 ms, exact ms, ratio (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bits", type=int, nargs="+", default=[200, 440], choices=[200, 440])
    a = ap.parse_args()
    sizes = (784, 64, 64, 10)
    b = 64
    N, K, T = 20, 1, 1
    rng = np.random.default_rng(0)
    xf = rng.random((b, 784))
    yf = rng.random((b, 10))
    Wf = [rng.standard_normal((i, o)) for i, o in zip(sizes[:-1], sizes[1:])]
    bf = [rng.standard_normal(o) for o in sizes[1:]]
    dzf = rng.random((b, 64))
    for bits in a.bits:
        q = PRIMES[bits]
        ctx = rns_context(q, 1024)
        model = FieldPolyMLP(sizes, q, data_bits=4, weight_bits=None, init_scale=4.0, max_inner=1024)
        params = model.init_params(1)
        Xc = ctx.from_field(uniform(rng, q, (b, 784)))  # a coded minibatch
        Yc = ctx.from_field(uniform(rng, q, (b, 10)))
        Wu = ctx.from_field(uniform(rng, q, (784, 64)))
        Ws = ctx.from_signed(params["W1"])
        dZ = ctx.from_field(uniform(rng, q, (b, 64)))
        rows = []

        def row(name, f_float, f_exact):
            tf, te = _best_pair(f_float, f_exact, a.repeat)
            rows.append((name, tf, te, te / tf))

        row("X~(64x784) @ W1(784x64), W1 integer weights", lambda: xf @ Wf[0], lambda: ctx.matmul(Xc, Ws))
        row("X~(64x784) @ U(784x64), both uniform", lambda: xf @ Wf[0], lambda: ctx.matmul(Xc, Wu))
        row("X~^T(784x64) @ dZ1(64x64), both uniform", lambda: xf.T @ dzf, lambda: ctx.matmul(Xc.T, dZ))
        row("PINN 784-64-64-10 fwd+bwd on coded batch", lambda: _float_pass(Wf, bf, xf, yf),
            lambda: model._gradient_rns(params, Xc, Yc))
        # LCC encoding of one coded minibatch for N clients: (N, K+T) @ (K+T, b*784)
        alphas, betas = default_points(N, K, T)
        Lc = ctx.from_field(lagrange_coefficients(betas, alphas, q))
        S = ctx.from_field(uniform(rng, q, (K + T, b * 784)))
        Lf = rng.random((N, K + T))
        Sf = rng.random((K + T, b * 784))
        row(f"LCC encode (N={N}, K+T={K + T}) of 64x784", lambda: Lf @ Sf, lambda: ctx.matmul(Lc, S))
        # decoding: (K, 9) @ (9, d_w)
        d_w = model.n_params
        Dc = ctx.from_field(lagrange_coefficients(alphas[:9], betas[:K], q))
        R = ctx.from_field(uniform(rng, q, (9, d_w)))
        Df = rng.random((K, 9))
        Rf = rng.random((9, d_w))
        row(f"LCC decode (K={K}, 9 evaluations) of d_w={d_w}", lambda: Df @ Rf, lambda: ctx.matmul(Dc, R))
        Xraw = uniform(rng, q, (b, 784))
        row("convert 64x784 field -> residues", lambda: xf.copy(), lambda: ctx.from_field(Xraw))
        G = model._gradient_rns(params, Xc, Yc)["W1"]
        row("convert 784x64 residues -> field (CRT)", lambda: Wf[0].copy(), lambda: G.to_field())
        if bits == a.bits[0]:
            A = uniform(rng, q, (64, 784))
            B = uniform(rng, q, (784, 64))
            t = time.perf_counter()
            A.dot(B) % q
            tp = (time.perf_counter() - t) * 1e3
            rows.append(("(reference) Python-int object dot, uniform 64x784x64", rows[1][1], tp, tp / rows[1][1]))
        print(f"\n{ctx!r}")
        print(f"{'operation':52s} {'float64 ms':>11s} {'exact ms':>10s} {'ratio':>7s}")
        for name, tf, te, r in rows:
            print(f"{name:52s} {tf:11.3f} {te:10.3f} {r:7.1f}")


if __name__ == "__main__":
    main()
