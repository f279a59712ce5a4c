"""LightSecAgg's bundled mask exchange at larger N is pinned bit for bit (issue 12, "Fast studies at scale").

A reduced fig7/fig8-style LightSecAgg (N = 40-48 LTE devices with loss, shifted-exponential compute, the
bundled relay, U < N and U = N, with and without absent users, both modes) must keep its trace, every
node's view and relay list, and the keyed-draw counters: the digests below were recorded by the code
before the exchange was vectorised (per-pair mailbox deliveries).

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
from test_pinned_traces import digits_task, lossy_sim  # noqa: E402

# name -> (params, D, d, rounds, seed, dropout)
SCALE_SCENARIOS: dict[str, tuple] = {
    "u_lt_n_timing": (dict(z=1, U=34, mode="timing"), 48, 20, 4, 21, 0.0),
    "u_eq_n_timing": (dict(z=12, U=40, mode="timing"), 40, 20, 3, 22, 0.0),
    "dropout_timing": (dict(z=2, U=30, mode="timing"), 48, 20, 4, 23, 0.15),
    "serial_timing": (dict(z=1, U=40, mode="timing", offline_parallel=False), 44, 20, 3, 24, 0.05),
    "u_lt_n_full": (dict(z=3, U=36, mode="full"), 44, 12, 3, 25, 0.1),
}

#: sha256 of :func:`digest_input` per scenario (recorded before the vectorised exchange)
PINNED: dict[str, str] = {
    "dropout_timing": "5186cbe1c7241d70195edaf4f33479eeb68c019c46a7acbb8d769cf48073acfe",
    "serial_timing": "2f0984adb36fe52889c9212c824efbb30ae91bc2925b30e893eb5a8e81ad87c8",
    "u_eq_n_timing": "f4386ccaaff78d03adf99d5d7bb98309cf75f5ec2f7651de263e4e59d36c6f17",
    "u_lt_n_full": "79bcf6fdd6f8af2308aff9314772ace59c4b542213f7d76043a1ad215f42a46d",
    "u_lt_n_timing": "d7b1370f9d0b0b501ccc856ecd83c0a14d78c19969f627d6ed276339488a0a02",
}


def run(name: str, scenarios: dict | None = None) -> LightSecAgg:
    """Scenario ``name`` of ``scenarios`` (default :data:`SCALE_SCENARIOS`) run to its last round (views recorded)."""
    params, D, d, rounds, seed, dropout = (SCALE_SCENARIOS if scenarios is None else scenarios)[name]
    proto = LightSecAgg(lossy_sim(D, seed, dropout), digits_task(D, d, "noniid"), params, label=name)
    proto.run(rounds)
    return proto


def digest(proto: LightSecAgg) -> str:
    """sha256 of the run's :func:`test_fast_path.snapshot` (trace, views, relays, draw counters)."""
    return hashlib.sha256(repr(snapshot(proto)).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SCALE_SCENARIOS))
def test_bundled_exchange_at_scale_is_pinned(name: str) -> None:
    assert digest(run(name)) == PINNED[name]


if __name__ == "__main__":
    for name in sorted(SCALE_SCENARIOS):
        proto = run(name)
        print(f'    "{name}": "{digest(proto)}",  # {proto.trace[-1]["time_s"]!r}')
