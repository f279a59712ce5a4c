"""``import fednet`` pins the AVX2 floating-point kernels (``fednet.PORTABLE_KERNELS``) before NumPy loads.

Checked in fresh interpreters (the variables matter only before NumPy, SciPy or torch load): every unset variable
is set, a variable the user set is kept, ``FEDNET_NATIVE_KERNELS=1`` sets none, and NumPy then runs without its
AVX-512 loops and OpenBLAS with its Haswell (AVX2) kernels.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import fednet

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import json, os, fednet, numpy as np, threadpoolctl; "
         "print(json.dumps({'env': {k: os.environ.get(k) for k in fednet.PORTABLE_KERNELS}, "
         "'blas': [d.get('architecture') for d in threadpoolctl.threadpool_info() if d['internal_api'] == 'openblas']}))")

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the kernels are pinned on x86-64 hosts only")


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in fednet.PORTABLE_KERNELS and k != "FEDNET_NATIVE_KERNELS"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_unset_variables_are_set_before_numpy_loads() -> None:
    got = _probe()
    assert got["env"] == fednet.PORTABLE_KERNELS
    assert got["blas"] and set(got["blas"]) == {"Haswell"}


def test_a_users_value_is_kept_and_native_opts_out() -> None:
    assert _probe(MKL_CBWR="COMPATIBLE")["env"]["MKL_CBWR"] == "COMPATIBLE"
    assert all(v is None for v in _probe(FEDNET_NATIVE_KERNELS="1")["env"].values())
