"""Exact GF(p) kernels of DReS-FL (RNS on float64 BLAS) against float64 on the same shapes.

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_field_kernels.py
[--repeat 5] [--bits 200 440] [--round] [--train STEPS]``.

Shapes are those of the DReS-FL MNIST network (Shao et al., Sec. 6.1, App. E): the PINN
784-64-64-10 with quadratic activations, batch b = 64, Lagrange-coded (uniform) data; and the LCC
encoding of one coded minibatch for N = 20 clients (K = T = 1) and the decoding of the d_w = 55,050
gradient entries from deg(g)(K + T - 1) + 1 = 9 evaluations.  Operands are kept in residue form
across calls (as a client keeps its coded data), so the "kernel" rows exclude conversion; the
conversion rows time it separately.  Each entry is the minimum over ``--repeat`` runs of host wall
time (ms); the ratio is exact / float64.  Goal: within 30x of float64 at 200 bits.  The last row
of the first table times a plain Python-int object-array product (what galois' FieldArray does for
such primes) once, for scale.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_field_kernels.py --repeat 1
--bits 200``
"""

from __future__ import annotations

import argparse
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

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
    ap.add_argument("--round", action="store_true", help="also time one full DReS-FL round")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="also train the MNIST PINN exactly for STEPS steps (needs FEDNET_DATA)")
    a = ap.parse_args()
    for bits in a.bits:
        ctx, rows = kernel_rows(bits, a.repeat, reference=bits == a.bits[0])
        print(f"\n{ctx!r}")
        print(f"{'operation':52s} {'float64 ms':>11s} {'exact ms':>10s} {'ratio':>7s}")
        for name, tf, te, r in rows:
            print(f"{name:52s} {tf:11.3f} {te:10.3f} {r:7.1f}")
    if a.round:
        for bits in a.bits:
            full_round(bits)
    if a.train:
        train_exact(a.train)


def kernel_rows(bits: int, repeat: int = 5,
                reference: bool = False) -> tuple[object, list[tuple[str, float, float, float]]]:
    """The exact kernels at the DReS-FL MNIST shapes over the ``bits``-bit prime, next to float64 (module docstring).

    Parameters
    ----------
    bits : {200, 440}
        The prime (:data:`PRIMES`).
    repeat : int
        Each entry is the best of this many alternating runs.
    reference : bool
        Also time the Python-int object-array product once (slow; for scale).

    Returns
    -------
    ctx : RNSContext
        The residue context the kernels ran in.
    rows : list of (operation, float64 ms, exact ms, exact / float64)
    """
    sizes = (784, 64, 64, 10)
    b = 64
    N, K, T = 20, 1, 1
    rng = np.random.default_rng(0)
    xf = rng.random((b, 784))
    yf = rng.random((b, 10))
    Wf = [rng.standard_normal((i, o)) for i, o in zip(sizes[:-1], sizes[1:])]
    bf = [rng.standard_normal(o) for o in sizes[1:]]
    dzf = rng.random((b, 64))
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
        """Time ``f_float`` and ``f_exact`` (best of ``repeat``) and add the row ``name`` with the slowdown."""
        tf, te = _best_pair(f_float, f_exact, repeat)
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
    if reference:
        A = uniform(rng, q, (64, 784))
        B = uniform(rng, q, (784, 64))
        t = time.perf_counter()
        A.dot(B) % q
        tp = (time.perf_counter() - t) * 1e3
        rows.append(("(reference) Python-int object dot, uniform 64x784x64", rows[1][1], tp, tp / rows[1][1]))
    return ctx, rows


def full_round(bits: int, N: int = 20, K: int = 1, T: int = 1, b: int = 64) -> None:
    """Wall time of one full-mode DReS-FL round at the MNIST shapes (host seconds, one run).

    A coded global minibatch (b rows, shared once by LCC, kept in residue form), N clients' field
    gradients (uploads kept in residue form) of the 784-64-64-10 PINN (fixed point f = 8), decoding from deg(g)(K+T-1)+1 uploads,
    psi, and the update with Q.
    """
    from fednet.codes.dresfl import decode_gradients, evaluate_on_shares, psi, recovery_threshold, share_dataset
    from fednet.learning.field_models import FieldSGD

    q = PRIMES[bits]
    rng = np.random.default_rng(0)
    model = FieldPolyMLP((784, 64, 64, 10), q, data_bits=4, weight_bits=8, init_scale=0.5, max_inner=1024)
    params = model.init_params(0)
    xbar, ybar = model.transform(rng.random((b * K, 784)), rng.integers(0, 10, b * K))
    alphas, betas = default_points(N, K, T)
    t0 = time.perf_counter()
    xs, ys = share_dataset(xbar, ybar, K, T, alphas, betas, q, np.random.default_rng(1), as_rns=True, ctx=model.ctx)
    t1 = time.perf_counter()
    uploads = evaluate_on_shares(lambda x, y: model.field_gradient(params, x, y, as_rns=True), xs, ys)
    t2 = time.perf_counter()
    need = recovery_threshold(K, T, model.degree)
    dec = decode_gradients(uploads[:need], alphas[:need], betas, K, T, model.degree, q)
    g = {k: sum(psi(d[k], q) for d in dec) for k in dec[0]}
    params = FieldSGD(model, 0.1, np.random.default_rng(2), max_norm=64.0).step(params, g, b * K, 1)
    t3 = time.perf_counter()
    print(f"full DReS-FL round, {bits}-bit prime, N={N}, K={K}, T={T}, b={b}: sharing of the batch "
          f"{t1 - t0:.2f} s (one-off), {N} client gradients {t2 - t1:.2f} s ({(t2 - t1) / N * 1e3:.0f} ms each, "
          f"uploads kept in residues), decode+psi+update {t3 - t2:.2f} s")


def train_exact(steps: int, n_train: int = 20000, every: int = 500) -> None:
    """Train the paper's MNIST PINN (784-64-64-10, fixed point f = 8) exactly over GF(2^200 - 75).

    Plain (uncoded) global minibatches of b = 64 (the decoded DReS-FL gradient equals this one bit
    for bit), update of eq. (7) with lr 0.1 and the real-unit gradient clipped at norm 64; prints the
    test accuracy on 2,000 test images every ``every`` steps and the host seconds.
    """
    from fednet.learning.datasets import load_dataset
    from fednet.learning.field_models import FieldSGD

    ds = load_dataset("mnist")
    model = FieldPolyMLP((784, 64, 64, 10), DRESFL_PRIME_200, data_bits=4, weight_bits=8, init_scale=0.5,
                         max_inner=1024)
    params = model.init_params(0)
    opt = FieldSGD(model, 0.1, np.random.default_rng(5), max_norm=64.0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for s in range(steps):
        idx = rng.integers(0, n_train, 64)
        g = model.integer_gradient(params, ds.x_train[idx], ds.y_train[idx])
        params = opt.step(params, g, 64, s + 1)
        if (s + 1) % every == 0 or s + 1 == steps:
            acc, mse = model.evaluate(params, ds.x_test[:2000], ds.y_test[:2000])
            print(f"step {s + 1}: test accuracy {acc:.4f}, mse {mse:.4f}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
