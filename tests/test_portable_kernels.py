"""``fednet.configure_host()`` pins the AVX2 floating-point kernels (``fednet.PORTABLE_KERNELS``) before NumPy loads.

Checked in fresh interpreters (the variables matter only before NumPy, SciPy or torch load): every unset variable
is set, a variable the user set is kept, ``FEDNET_NATIVE_KERNELS=1`` sets none, and NumPy then runs without its
AVX-512 loops and OpenBLAS with its Haswell (AVX2) kernels.  It also applies glibc's malloc settings
(``fednet.MALLOC_SETTINGS``), with their own opt-out.  ``import fednet`` alone does neither
(``tests/test_host_config.py``).
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
PROBE = ("import json, os, fednet; fednet.configure_host(); import numpy as np, threadpoolctl; "
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


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_malloc_settings_apply_and_opt_out() -> None:
    """``fednet.configure_host()`` applies :data:`fednet.MALLOC_SETTINGS` (glibc accepts both),
    ``FEDNET_DEFAULT_MALLOC=1`` leaves glibc's defaults."""
    code = "import fednet; print(fednet.configure_host().malloc)"
    env = {**{k: v for k, v in os.environ.items() if k != "FEDNET_DEFAULT_MALLOC"}, "PYTHONPATH": str(ROOT)}
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "FEDNET_DEFAULT_MALLOC": "1"},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")
