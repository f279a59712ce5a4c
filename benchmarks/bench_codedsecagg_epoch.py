"""Benchmark: one full-mode CodedSecAgg epoch (D = 120, d = 2000, c = 10) vs float64 numpy.

Run: ``.venv/bin/python benchmarks/bench_codedsecagg_epoch.py [--devices 120 --d 2000 --c 10
--groups 8 --z 1 --storage float32]``.

What is timed (host wall-clock, not simulated time): the math of one epoch of phase 2
(Schlegel et al., Sec. VI-B/D) -- every device's eq. (13) ``Psi + Phi epsilon`` over GF(2**72 + 15)
with its prepared ``Phi``, the tree additions of eqs. (14)-(15), and the server's interpolation from
k' master shares with the Remark-3 scaling -- next to the same products in float64 numpy
(``Phi_f @ eps_f + Psi_f`` per device, the same sums).  Each part runs in its own child process so
that its peak resident memory (RSS, ru_maxrss) is its own.

The devices' ``Phi^(i)``, ``Psi^(i)`` are drawn uniformly over GF(q): after phase 1 they are sums of
Shamir shares, which are uniform, so the epoch's cost is the same.  To keep the set-up short only
``--distinct`` matrices are drawn and prepared; the other devices hold private copies of their
prepared limbs (same memory, same cost per product) (phase 1 itself, the sharing of
2000 x 2000 matrices, is not part of an epoch and is far more expensive on the host).  The exact
part is checked: device 0's eq. (13) result (first row) equals galois's.  The interpolation runs on
these random shares too (its result is not a meaningful aggregate, so the Z_<k+f> range check is
skipped there; the cost is the same).

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_codedsecagg_epoch.py
--devices 8 --d 40 --c 2 --groups 2 --distinct 2``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time

import fednet

fednet.configure_host()  # the fednet command's host settings (fednet.runtime), before NumPy loads

import numpy as np


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def exact_part(args, out):
    """One full-mode epoch's exact products in GF(2^72 + 15): wall time, MACs and peak RSS into ``out``."""
    from fednet.algebra.fields import fixed_point_field, uniform
    from fednet.algebra.meter import MacMeter
    from fednet.algebra.modp import PreparedMatrix, add_mod
    from fednet.codes.secagg_tree import aggregation_tree
    from fednet.codes.shamir import default_points
    from fednet.protocols.codedsecagg import decode_aggregate, device_share

    q = fixed_point_field(48, 24)
    D, d, c, N, kp = args.devices, args.d, args.c, args.groups, args.z + 1
    n1 = D // N
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    Phi, Psi = [], []
    for j in range(D):
        if j < args.distinct:
            a = uniform(rng, q, (d, d))
            Phi.append(PreparedMatrix(a, q, rhs_bits=48, storage=args.storage))
            if j == 0:
                row0 = a[:1].copy()
            del a
        else:  # a copy with its own memory of an already prepared matrix (same cost per product)
            P = object.__new__(PreparedMatrix)
            P.__dict__.update(Phi[j % args.distinct].__dict__)
            P._stacked = Phi[j % args.distinct]._stacked.copy()
            Phi.append(P)
        Psi.append(uniform(rng, q, (d, c)))
    t_prep = time.perf_counter() - t0
    eps = rng.integers(-(2**40), 2**40, size=(d, c))            # a Q<48,24> update (|eps| < 2^16)
    t0 = time.perf_counter()
    with MacMeter() as meter:
        share = {}
        for g in range(N):
            for i in range(n1):
                share[g, i] = device_share(Phi[g * n1 + i], Psi[g * n1 + i], eps, q)
        t_eq13 = time.perf_counter() - t0
        for step in aggregation_tree(N):
            for src, dst in step:
                for i in range(n1):
                    share[dst, i] = add_mod(share[dst, i], share[src, i], q)
        t_tree = time.perf_counter() - t0 - t_eq13
        pts = default_points(n1)[:kp]
        try:
            decode_aggregate(np.stack([share[0, i] for i in range(kp)]), pts, kp, q, 48, 24)
        except OverflowError:
            pass  # random (non-shared) data: the aggregate is not a Z_<72> value; the work is done
    t_epoch = time.perf_counter() - t0
    from fednet.algebra.fields import prime_field, to_field

    GF = prime_field(q)
    want = (GF(row0) @ GF(to_field(eps, q)) + GF(Psi[0][:1])).view(np.ndarray).astype(object)
    assert np.array_equal(device_share(Phi[0], Psi[0], eps, q)[:1].astype(object), want), "eq. 13 mismatch"
    out.put(dict(part="exact GF(2^72+15)", prepare_s=t_prep, eq13_s=t_eq13, tree_s=t_tree, epoch_s=t_epoch,
                 macs=meter.macs, limbs=f"{Phi[0].n_limbs}x{Phi[0].w}b|rhs {Phi[0].w_b}b {args.storage}",
                 per_device_mib=Phi[0].nbytes / 2**20, peak_rss_mib=_rss_mib()))


def float_part(args, out):
    """The same products in float64 numpy: wall time and peak RSS into ``out``."""
    D, d, c, N = args.devices, args.d, args.c, args.groups
    n1 = D // N
    rng = np.random.default_rng(0)
    Phi = [rng.standard_normal((d, d)) for _ in range(D)]
    Psi = [rng.standard_normal((d, c)) for _ in range(D)]
    eps = rng.standard_normal((d, c))
    t0 = time.perf_counter()
    share = [Phi[j] @ eps + Psi[j] for j in range(D)]
    t_eq13 = time.perf_counter() - t0
    from fednet.codes.secagg_tree import aggregation_tree

    s = {(g, i): share[g * n1 + i] for g in range(N) for i in range(n1)}
    for step in aggregation_tree(N):
        for src, dst in step:
            for i in range(n1):
                s[dst, i] = s[dst, i] + s[src, i]
    agg = sum(s[0, i] for i in range(args.z + 1))
    t_epoch = time.perf_counter() - t0
    out.put(dict(part="float64 numpy", eq13_s=t_eq13, epoch_s=t_epoch, checksum=float(agg.sum()),
                 peak_rss_mib=_rss_mib()))


def main() -> None:
    """Parse the sizes, run both parts (each in its own process) and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=120)
    ap.add_argument("--d", type=int, default=2000)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--z", type=int, default=1)
    ap.add_argument("--storage", choices=["float64", "float32"], default="float32")
    ap.add_argument("--distinct", type=int, default=4,
                    help="distinct random Phi drawn and prepared; the other devices hold copies (own memory)")
    args = ap.parse_args()
    if args.devices % args.groups or args.devices // args.groups <= args.z:
        raise SystemExit(f"groups must divide devices with more than z = {args.z} devices per group")
    ctx = mp.get_context("spawn")
    results = []
    for part in (float_part, exact_part):
        q = ctx.Queue()
        p = ctx.Process(target=part, args=(args, q))
        p.start()
        results.append(q.get())
        p.join()
    print(f"D = {args.devices}, d = {args.d}, c = {args.c}, N = {args.groups}, z = {args.z}")
    for r in results:
        print(json.dumps(r))
    ratio = results[1]["epoch_s"] / results[0]["epoch_s"]
    print(f"exact / float64 epoch wall time: {ratio:.1f}x")


if __name__ == "__main__":
    main()
