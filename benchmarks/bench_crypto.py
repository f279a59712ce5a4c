"""Host rates of the cryptographic operations SecAgg / SecAgg+ charge (the defaults of
:data:`fednet.algebra.crypto_meter.HOST_CRYPTO_RATES`), and the host's MAC rate they are scaled by.

Run (one core, the test environment)::

    OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell .venv/bin/python benchmarks/bench_crypto.py

Prints, with the ``cryptography`` package's version:

- X25519 key generations/s (``X25519PrivateKey.from_private_bytes(32 bytes).public_key()``: one scalar
  multiplication) and key agreements/s (``exchange`` + SHA-256 of the shared secret);
- ChaCha20 PRG output bytes/s (a 32-byte seed expanded to 8 MiB of keystream) and AES-256-CTR for comparison;
- ChaCha20-Poly1305 AEAD: messages/s on empty messages (the per-message cost) and bytes/s on 1 MiB messages;
- the host's float64 MAC rate: a (2000, 2000) @ (2000, 10) product on one thread (the reference MAC rate
  :data:`fednet.algebra.crypto_meter.REFERENCE_MAC_RATE` that device crypto rates are scaled by).

Each figure is the best of 5 repetitions.

Smoke (a reduced run, tests/test_benchmarks_smoke.py): ``.venv/bin/python benchmarks/bench_crypto.py``
"""

from __future__ import annotations

import os
import time

import numpy as np

import cryptography
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305


def best(fn, reps: int = 5) -> float:
    """Fastest wall-clock seconds of ``fn()`` over ``reps`` runs."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    """Measure and print the host's crypto rates (module docstring)."""
    n = 2000
    seeds = [os.urandom(32) for _ in range(n)]
    keygen = n / best(lambda: [X25519PrivateKey.from_private_bytes(s).public_key() for s in seeds])
    sk = X25519PrivateKey.from_private_bytes(seeds[0])
    pks = [X25519PrivateKey.from_private_bytes(s).public_key() for s in seeds]

    def agree():
        """``n`` key agreements, each hashed as the protocols use them."""
        for pk in pks:
            h = hashes.Hash(hashes.SHA256())
            h.update(sk.exchange(pk))
            h.finalize()
    ka = n / best(agree)
    size = 8 * 2**20
    zeros = bytes(size)
    chacha = size / best(lambda: Cipher(algorithms.ChaCha20(seeds[1], bytes(16)), None).encryptor().update(zeros))
    aes = size / best(lambda: Cipher(algorithms.AES(seeds[2]), modes.CTR(bytes(16))).encryptor().update(zeros))
    aead = ChaCha20Poly1305(seeds[3])
    m = 20000
    aead_msgs = m / best(lambda: [aead.encrypt(bytes(12), b"", None) for _ in range(m)])
    big = bytes(2**20)
    aead_bytes = 16 * len(big) / best(lambda: [aead.encrypt(bytes(12), big, None) for _ in range(16)])
    a, b = np.random.default_rng(0).random((2000, 2000)), np.random.default_rng(1).random((2000, 10))
    macs = 2000 * 2000 * 10 / best(lambda: a @ b, reps=20)
    print(f"cryptography {cryptography.__version__}")
    print(f"x25519 key generations/s   {keygen:.4g}")
    print(f"x25519 key agreements/s    {ka:.4g}")
    print(f"chacha20 PRG bytes/s       {chacha:.4g}")
    print(f"aes-256-ctr PRG bytes/s    {aes:.4g}")
    print(f"chacha20-poly1305 msgs/s   {aead_msgs:.4g}")
    print(f"chacha20-poly1305 bytes/s  {aead_bytes:.4g}")
    print(f"float64 GEMM MAC/s (1 thr) {macs:.4g}")


if __name__ == "__main__":
    main()
