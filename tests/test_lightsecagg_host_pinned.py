"""LightSecAgg's per-round host work is pinned bit for bit (issue 12, "Fast studies at scale").

Reduced LightSecAgg runs (U < N so that the survivor set U1 matters, z > 1, timing and full mode, one with
absent users) must keep their trace, every node's view and relay list, the keyed-draw counters
(:func:`test_fast_path.snapshot`), the final model's bytes and the metered MACs: the digests below were
recorded before the host work of a round (stand-in gradients, sums) was changed.

Kernels: the digests that moved were recomputed on 2026-11-27 by c3c7045's code (which had reproduced the earlier
ones on other hosts) on an AVX2-only host, where floating-point results differ in their last digits (the same
scenarios' pinned traces: the test loss alone, ``tests/test_pinned_traces.py``): kernels that sum in another order
(AVX-512 ones where a host has them; ``fednet.PORTABLE_KERNELS`` now pins the AVX2 kernels everywhere).
"""

from __future__ import annotations

import hashlib

import pytest

from fednet.protocols.lightsecagg import LightSecAgg

from test_fast_path import snapshot  # noqa: E402
from test_lightsecagg_scale import run as run_scenario  # noqa: E402

# name -> (params, D, d, rounds, seed, dropout)
HOST_SCENARIOS: dict[str, tuple] = {
    "timing_z3": (dict(z=3, U=28, mode="timing"), 36, 24, 4, 31, 0.0),
    "timing_z2_dropout": (dict(z=2, U=24, mode="timing"), 36, 16, 4, 32, 0.1),
    "full_z2": (dict(z=2, U=26, mode="full"), 32, 12, 3, 33, 0.05),
}

#: sha256 of :func:`digest` per scenario (recorded before the change)
PINNED: dict[str, str] = {
    "full_z2": "2f42c6bbcfd30db6543d8509a57e629e6c33611a045f2668cb9d5b9f766d243a",
    "timing_z2_dropout": "af33d44bcd3ba2d042612011145657835c2ce1c86868058590d30d8bf7f86c6e",
    "timing_z3": "e98577c3362e98be265626c14c583689c3e6bde24fd00bb5a9cfaf7945b676c6",
}


def run(name: str) -> LightSecAgg:
    """Scenario ``name`` run to its last round (views recorded)."""
    return run_scenario(name, HOST_SCENARIOS)


def digest(proto: LightSecAgg) -> str:
    """sha256 of the snapshot, the model's bytes and the MACs each round charged (in the trace rows)."""
    macs = [(row.get("device_macs"), row.get("server_macs")) for row in proto.trace]
    blob = repr((snapshot(proto), proto.theta.dtype.str, proto.theta.shape, proto.theta.tobytes().hex(), macs))
    return hashlib.sha256(blob.encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(HOST_SCENARIOS))
def test_lightsecagg_host_work_is_pinned(name: str) -> None:
    assert digest(run(name)) == PINNED[name]


if __name__ == "__main__":
    for name in sorted(HOST_SCENARIOS):
        proto = run(name)
        print(f'    "{name}": "{digest(proto)}",  # {proto.trace[-1]}')
