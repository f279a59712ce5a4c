"""DReS-FL timing mode pinned bit for bit: parameters, trace and metered MACs of reduced Table 2 set-ups.

The digests were recorded on main before the timing-mode speed-ups (the plain integer gradient's CRT and the
exact update of eq. 7 computed from limbs); any change of a bit of the trajectory, of a time or of a metered
MAC count changes them.  The set-up is Table 2's (N = 20, K = T = 1, fixed point f = 8, batch 64, quadratic
MLP, clipping in real units) at a smaller width: the integer gradients are ~150-bit integers, as at full size.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from factories import make_task
from fednet.protocol import registry
from fednet.sim.dropout import ExtremeDropout, PerClientDropout
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

N = 20


def _run(p: str, max_norm: float, rounds: int, K: int = 1):
    task = make_task(D=N, n=32, d=49, c=10, seed=5)
    availability = ExtremeDropout(N, 2) if K == 1 else PerClientDropout([0.01] * N)   # K = 2: R = 17 of 20
    sim = Simulation(lte_star(N, device_mac_rates=[1e6] * N), 7, availability=availability)
    cfg = {"hidden": [16, 16], "batch_size": 64, "weight_bits": 8, "mode": "timing", "p": p,
           "max_norm": max_norm, "eval_every": 10, "K": K}
    proto = registry.get("dresfl")(sim, task, cfg)
    proto.run(rounds)
    return proto


def _digest(proto) -> tuple[str, str, int, int]:
    """``(params sha256, trace sha256, sum of device MACs, sum of server MACs)``."""
    hp = hashlib.sha256()
    for k in sorted(proto.params):
        a = np.asarray(proto.params[k])
        hp.update(k.encode() + repr(a.shape).encode() + b"".join(int(v).to_bytes(16, "little", signed=True)
                                                                   for v in a.ravel()))
    ht = hashlib.sha256()
    for row in proto.trace:
        ht.update(repr(sorted((c, repr(v)) for c, v in row.items())).encode())
    dev = sum(int(r["device_macs"]) for r in proto.trace)
    srv = sum(int(r["server_macs"]) for r in proto.trace)
    return hp.hexdigest()[:16], ht.hexdigest()[:16], dev, srv


PINNED = {          # "p|max_norm|rounds|K": 64 never clips here, 0.5 and 4 (K = 2) clip every round
    "2^440-33|64.0|40|1": ("1e83dc33e77cc625", "3300f1eb6896bc88", 90808866, 496800),
    "2^200-75|64.0|40|1": ("1e83dc33e77cc625", "1cddd4b7d520b736", 90808866, 496800),
    "2^440-33|0.5|40|1": ("8e1e628ea2aff8e3", "2a22ea3319337eb5", 90808866, 496800),
    "2^440-33|4.0|30|2": ("f5afb9bedc78f479", "3dea9c31a2270ce0", 117162694, 1304100),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_timing_mode_is_pinned(case: str) -> None:
    p, max_norm, rounds, K = case.split("|")
    assert _digest(_run(p, float(max_norm), int(rounds), int(K))) == PINNED[case]
