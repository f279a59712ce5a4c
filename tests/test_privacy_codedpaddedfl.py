"""Privacy audit of CodedPaddedFL's one-time pads (Schlegel et al., Sec. V-A, eqs. 6-7).

A device that receives ``(Phi_j, Psi_j)`` from device ``j`` must learn nothing about ``X_j^T X_j`` or
``G_j^(1)``: each padded element is ``value + R mod 2^W`` with ``R`` uniform, hence uniform whatever
the value.  Two checks:

* pure: the protocol's own :func:`pad` over a small ring ``Z_2^4``; every coordinate is a trial, so
  the padded values of two different data sets are compared by a chi-square homogeneity test, and
  each is tested for uniformity;
* engine: a full-mode run; the top 4 bits of every padded element found in the devices' views
  (messages of kind ``share``) are tested for uniformity over 16 cells.

Chi-square tests reject at p < 1e-4 (a false alarm in fewer than 1 run in 10,000 per test); the
mutation tests (``test_privacy_mutations.py``) show the checks fail when the pads are zeroed.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2, chi2_contingency

from factories import make_sim, make_task
from fednet.codes.padded import pad
from fednet.protocols.codedpaddedfl import CodedPaddedFL

from fednet.algebra.fixed_point import FixedPoint

ALPHA = 1e-4


def uniform_p(h: np.ndarray) -> float:
    e = h.sum() / h.size
    return float(chi2.sf(((h - e) ** 2 / e).sum(), h.size - 1))


def padded_values(M: np.ndarray, G1: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """All padded elements (``Phi`` then ``Psi``) of one device as integers mod ``2^bits`` (bits <= 16)."""
    q = FixedPoint(16, 4)
    Phi, Psi, _, _ = pad(q, bits, M, G1, np.random.default_rng(seed))
    return np.concatenate([Phi[0].ravel(), Psi[0].ravel()])


def test_padded_shares_are_uniform_and_independent_of_the_data():
    bits, d, c = 4, 60, 30                       # d(d+1)/2 + d c = 3630 trials per data set
    rng = np.random.default_rng(5)
    A = (np.zeros((d, d), np.int64), np.zeros((d, c), np.int64))
    S = rng.integers(-300, 300, (d, d))
    B = (S + S.T, rng.integers(-300, 300, (d, c)))
    hA = np.bincount(padded_values(*A, bits, 1), minlength=16)
    hB = np.bincount(padded_values(*B, bits, 2), minlength=16)
    assert uniform_p(hA) > ALPHA and uniform_p(hB) > ALPHA
    assert chi2_contingency(np.stack([hA, hB]))[1] > ALPHA


def shares_seen_by_devices(seed: int = 0) -> np.ndarray:
    """Top 4 bits of every padded element received by a device in a small full-mode run."""
    D, d, c = 8, 14, 3                           # 8 (d(d+1)/2 + d c) = 1176 distinct padded elements
    sim = make_sim(D=D, seed=seed)
    proto = CodedPaddedFL(sim, make_task(D=D, n=20, d=d, c=c, lr=0.5), dict(alpha=3, groups=1))
    proto.run(1)
    W = proto.config.ring_bits
    top_limb_bits = W - 16 * ((W - 1) // 16)
    tops, seen = [], set()
    for dev in sim.devices:
        for msg in dev.view:
            if msg.kind == "share":
                Phi, Psi = msg.payload
                for part in (Phi, Psi):
                    key = part[-1].tobytes()
                    if key in seen:  # a share relayed on to alpha - 1 devices counts once (independent trials)
                        continue
                    seen.add(key)
                    tops.append((part[-1].ravel() >> (top_limb_bits - 4)) & 15)
    assert tops, "no padded share reached a device"
    return np.concatenate(tops)


def test_engine_shares_in_device_views_are_uniform():
    tops = shares_seen_by_devices()
    assert tops.size >= 1000
    assert uniform_p(np.bincount(tops, minlength=16)) > ALPHA
