"""Pinned runs of the torch-MLP baselines (FedAvg, FedAvg-IS, SCAFFOLD, centralized, FedAvg+LightSecAgg).

Each scenario is a reduced DReS-FL-like set-up (Shao et al., Sec. 6.1: the extreme dropout model,
an MLP with ReLU and cross-entropy in float32, one local SGD step per round) on the synthetic task of
``tests/factories.py``: ``small`` (12-8-8-3, batch 8, 24 rounds) and ``paper`` (the paper's
784-64-64-10 shape, batch 64, 6 rounds), on one thread as every study run
(:func:`fednet.study.threads.limit_threads`; torch's float sums depend on the thread count). The
digest covers every column of every trace row (floats through ``repr``) and the bytes of the final
parameters; the metered MACs (devices and server, summed over the rounds) are pinned separately. The golden values were written by main at a00ff18, before
:class:`~fednet.learning.torch_models.TorchModel` had its hand-written MLP path:
``PYTHONPATH=. python tests/test_torch_baselines_pinned.py`` prints them.

Kernels: the digests that moved were recomputed on 2026-11-27 by c3c7045's code (which had reproduced the earlier
ones on other hosts) on an AVX2-only host, where floating-point results differ in their last digits (the same
scenarios' pinned traces: the test loss alone, ``tests/test_pinned_traces.py``): kernels that sum in another order
(AVX-512 ones where a host has them; ``fednet.PORTABLE_KERNELS`` now pins the AVX2 kernels everywhere).
torch's float32 products come from MKL, whose AVX2 pin holds across Intel CPUs only: :data:`GOLDEN_INTEL` holds the
digests of Intel hosts, :data:`GOLDEN` those of the non-Intel host that wrote them.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from factories import make_task  # noqa: E402
from fednet.protocol import registry  # noqa: E402
from fednet.sim.dropout import ExtremeDropout  # noqa: E402
from fednet.sim.simulation import Simulation  # noqa: E402
from fednet.study.threads import limit_threads  # noqa: E402
from fednet.topologies.lte import lte_star  # noqa: E402

#: scenario -> (task arguments, protocol parameters shared by the methods, rounds)
SCENARIOS = {
    "small": (dict(D=6, n=40, d=12, c=3), {"hidden": [8, 8], "batch_size": 8}, 24),
    "paper": (dict(D=6, n=100, d=784, c=10), {"hidden": [64, 64], "batch_size": 64}, 6),
}

#: method -> (registry name, extra parameters)
METHODS = {
    "fedavg": ("fedavg", {}),
    "fedavg_is": ("fedavg_is", {"importance": "normalized"}),
    "fedavg_is_unbiased": ("fedavg_is", {}),
    "scaffold": ("scaffold", {}),
    "centralized": ("centralized", {}),
    "fedavg_lightsecagg": ("fedavg_lightsecagg", {"U": 3}),
}

#: (scenario, method) -> (sha256 of trace and parameters, device MACs, server MACs); written by main at a00ff18,
#: except FedAvg+LightSecAgg's, rewritten when it began to record its absent clients in ``dropped``: with that
#: column blanked after round 0 the new runs hash to a00ff18's digests (6e843a00..., 20b3c24e...).
GOLDEN: dict[tuple[str, str], tuple[str, int, int]] = {
    ('small', 'fedavg'): ('0c01a53140048362d6eab313df8a58d32cbd1c93edfe3f70e368f46b417ada45', 258017, 18473),
    ('small', 'fedavg_is'): ('675dc74ad2229194be8674c38b53b7dfd8f200d3c5b2141ba009e3092b3b44d8', 258017, 18473),
    ('small', 'fedavg_is_unbiased'): ('928a186378035ba9c88c107c597f9a3fed1eed1f58f739a88e9f5dd23f4838b6', 258017, 18473),
    ('small', 'scaffold'): ('321f6b250f2c7c872e943285fcd8c4d1798eca6702410c30fc4fb6b96662932c', 326022, 36946),
    ('small', 'centralized'): ('29a004a3d98b9a26ede6fc652addd74b7839f5d109eeada85cd5e0fe329ab3dc', 0, 97296),
    ('small', 'fedavg_lightsecagg'): ('3f2aafacd314476a3348a41d95d221561e03ae80cc5fa73a13055da1e093cc89', 406258, 27056),
    ('paper', 'fedavg'): ('aa3e0edb553ef72962534c44933e3988e4fcb8b1ae70025a6e0d153384cbc307', 118190240, 1211100),
    ('paper', 'fedavg_is'): ('e96788817731e39a9968ece6d747d6bfa7bb612c82d26eb70fca6ed89945ef85', 118190240, 1211100),
    ('paper', 'fedavg_is_unbiased'): ('13da790407003c9098d0ac57dcd585f63aa2eb034a372d1c77c4357133d60629', 118190240, 1211100),
    ('paper', 'scaffold'): ('0c1827c1e76b2559fe56cb5de37982575e789cfc31d1815b2a2fbc946a991712', 122594240, 2422200),
    ('paper', 'centralized'): ('c6528c06bc72ae1e90f139231da48eebbc5889c1abe5df82c948818e46141700', 0, 44651640),
    ('paper', 'fedavg_lightsecagg'): ('87c9156966634e751cb15bb01a36b51ecc54afacfc218f5ae0a6d75ff47f9d06', 127658840, 1541400),
}


def run(scenario: str, method: str) -> tuple[str, int, int]:
    """Run one pinned scenario; its digest and summed device / server MACs."""
    task_args, params, rounds = SCENARIOS[scenario]
    name, extra = METHODS[method]
    task = make_task(**task_args)
    D = task_args["D"]
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.1), 3, availability=ExtremeDropout(D, 3),
                     secret_seed=20261123)
    proto = registry.get(name)(sim, task, dict(params, **extra))
    with limit_threads(1):  # as every study run: one BLAS / torch thread fixes the reductions' order
        trace = proto.run(rounds)
    h = hashlib.sha256()
    for row in trace:
        h.update(repr(sorted(row.items())).encode())
    for k in sorted(proto.params):
        a = np.ascontiguousarray(proto.params[k])
        h.update(k.encode() + str(a.dtype).encode() + repr(a.shape).encode() + a.tobytes())
    return h.hexdigest(), sum(int(r["device_macs"]) for r in trace), sum(int(r["server_macs"]) for r in trace)


#: (scenario, method) -> sha256 on an Intel CPU: MKL's ``MKL_CBWR=AVX2`` branch gives the same float32 products on
#: every Intel CPU with AVX2 (Intel's documented promise), but on other vendors' CPUs it falls back to MKL's own
#: choice, so the digests above (written on a non-Intel AVX2 host, 2026-11-27) are not reached on an Intel host by
#: any setting (measured 2026-11-28 on an Intel Xeon with AVX-512: every MKL_CBWR / MKL_ENABLE_INSTRUCTIONS /
#: ATEN_CPU_CAPABILITY / oneDNN ISA combination tried; NumPy's and OpenBLAS's results are the same on both, as
#: ``tests/test_pinned_traces.py`` shows).  The MAC counts are the same on both.
GOLDEN_INTEL: dict[tuple[str, str], str] = {
    ('small', 'fedavg'): 'f1c52c7ee5e6d6795bb4390dddf207f7988c5c1c26ab6f71d685d8dbbfa4e396',
    ('small', 'fedavg_is'): '95e584d02586628ff60d8c0599d9b9fc0e0890b90fd271b82331c6522f194827',
    ('small', 'fedavg_is_unbiased'): '3c0482d10f86ccaee563bfcaa9eb5af00c43cce6e310b487689f6245e8883aa0',
    ('small', 'scaffold'): '2d169a0dec3aca90cb5b08e72f701483b6f9349d097c49483a4dd35a862bc3b8',
    ('small', 'centralized'): '11e2cb0be7079993f5eb1d2f976f5c6a798da14e988ce1307c7b89cc9bb133bf',
    ('small', 'fedavg_lightsecagg'): '24f8e3d2230aa213982268e69f7cce113ce641471b27bb48b0b5a120d7e597de',
    ('paper', 'fedavg'): '4f65c81a1b5acbe133346f172349a4800741bbee78b069c543b408295262e0d8',
    ('paper', 'fedavg_is'): '73080abed8e0a21673c39c979f35c9123b290fd0bee1897f83963f96728bb531',
    ('paper', 'fedavg_is_unbiased'): '0bdfff4482d77e2bfd5d0abcfcb69d570db86ef683f2f24b732be1beb99ae9c4',
    ('paper', 'scaffold'): '0001890ef5e328eafb1fc72e01a0f9e23fb0142f18bde43b56fbb1f1e5138bf5',
    ('paper', 'centralized'): '9c3b7d0e9e16326332ee07730c5227d8cd0e957bc8266693ce62d2c98150b061',
    ('paper', 'fedavg_lightsecagg'): '87c9156966634e751cb15bb01a36b51ecc54afacfc218f5ae0a6d75ff47f9d06',
}


def golden(scenario: str, method: str) -> tuple[str, int, int]:
    """The pinned (digest, device MACs, server MACs) for this host's CPU vendor (see :data:`GOLDEN_INTEL`)."""
    digest, device, server = GOLDEN[(scenario, method)]
    return (GOLDEN_INTEL[(scenario, method)] if intel_cpu() else digest), device, server


def intel_cpu() -> bool:
    """Whether this host's CPU is Intel's (``vendor_id`` of ``/proc/cpuinfo``; False where it cannot be read)."""
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("scenario,method", list(GOLDEN))
def test_pinned(scenario, method):
    assert run(scenario, method) == golden(scenario, method)


if __name__ == "__main__":
    for s in SCENARIOS:
        for m in METHODS:
            print(f"    ({s!r}, {m!r}): {run(s, m)!r},")
