"""CPU seconds and peak RSS of CodedSecAgg's set-up (round 0) at D devices, in this fresh process (issue 32's goal:
D = 20,000 under 10 s and 4 GiB; timing mode, z = 1, 8 groups).

The cell is :func:`bench_scale.build`'s ``("codedsecagg", D, d=20, n=16, c=10)``; the set-up is ``proto.run(0)``,
timed with ``time.process_time`` under one BLAS thread; the peak is the process's ``ru_maxrss`` (build included).
An optional JSON object overrides protocol parameters (e.g. ``'{"sharing_schedule": "relay_asap"}'``).  The old
code is measured by pointing ``PYTHONPATH`` at its tree.

Run: ``/usr/bin/time -v .venv/bin/python benchmarks/setup_codedsecagg.py 20000 ['{"encode_per_group": true}']``
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fednet  # noqa: E402

fednet.configure_host()

import bench_scale  # noqa: E402
from fednet.study.threads import limit_threads  # noqa: E402


def main() -> None:
    """Print ``D``, the parameters, build and set-up CPU seconds, peak MiB and round 0's time and retransmissions."""
    D = int(sys.argv[1])
    extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    params_for = bench_scale.params_for
    bench_scale.params_for = lambda name, cls, n: dict(params_for(name, cls, n), **extra)
    with limit_threads(1):
        t0 = time.process_time()
        proto, params = bench_scale.build("codedsecagg", D, 20, 16, 10)
        t1 = time.process_time()
        proto.run(0)
        t2 = time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = proto.trace[0]
    print(f"D={D} params={params} build_s={t1 - t0:.2f} setup_s={t2 - t1:.2f} peak_MiB={peak:.0f} "
          f"time_s={row['time_s']!r} retransmissions={row['retransmissions']}")


if __name__ == "__main__":
    main()
