"""Host configuration: the process-wide settings fednet's own entry points apply, in one call.

``import fednet`` (or any of its modules) changes nothing outside fednet: no environment variable, no
allocator setting, no garbage-collector state. The three process-wide settings that make fednet's runs the same
on every host and fast are applied by :func:`configure_host`, which the ``fednet`` command
(:func:`fednet.cli.main`), the study runner (:func:`fednet.study.runner.run_study`), the Dask workers
(:class:`fednet.study.parallel.BlasLimits`) and the test suite (``tests/conftest.py``) call; a script that wants
the same calls it first, before it imports NumPy, SciPy or torch::

    import fednet
    fednet.configure_host()          # before numpy / scipy / torch load
    import numpy as np

The settings:

portable kernels (:data:`PORTABLE_KERNELS`)
    Environment variables that pin the AVX2 floating-point kernels of OpenBLAS, NumPy, MKL and ATen on every
    x86-64 host, set where unset. They are read when those libraries load, so they take effect only if set
    before: a library already imported keeps the kernels it picked (:attr:`HostConfig.kernels_late`; a
    :class:`RuntimeWarning` says so). ``FEDNET_NATIVE_KERNELS=1`` keeps the host's own kernels.
malloc (:data:`MALLOC_SETTINGS`)
    glibc's ``mallopt`` thresholds that keep large temporaries on the heap. ``FEDNET_DEFAULT_MALLOC=1`` keeps
    glibc's defaults; other C libraries are left alone.
garbage-collector policy
    :meth:`fednet.protocol.base.Protocol.run` freezes the objects alive after the set-up, turns automatic
    collection off during the rounds and collects at round boundaries (:data:`fednet.protocol.base.GC_ROUNDS`),
    restoring the collector's state at the end. Without :func:`configure_host` it leaves the collector alone.

None of them changes a result: the kernels are the ones the pinned traces were computed with (the same on every
host), and where memory comes from, or when cycles are collected, changes no float.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import sys
import threading
import warnings
from dataclasses import dataclass, field

__all__ = ["configure_host", "host_config", "HostConfig", "PORTABLE_KERNELS", "MALLOC_SETTINGS"]

#: The kernels that floating-point results come from, the same on every x86-64 host (set before NumPy, SciPy or
#: torch load, where the variable is unset). OpenBLAS (NumPy's and SciPy's), NumPy's SIMD loops and torch's MKL and
#: ATen pick kernels by CPU, AVX-512 where the host has it, and kernels of other vector widths sum in other orders:
#: on 2026-11-27 the last bits of a test loss, and every digest over it, differed between an AVX-512 host and an
#: AVX2-only one. Pinning the AVX2 kernels, which every x86-64 host fednet targets has, makes a trace at a seed the
#: same on both (``tests/test_pinned_traces.py`` and the other pinned digests hold on either) -- except torch's MKL
#: products, whose ``MKL_CBWR=AVX2`` holds across Intel CPUs only (other vendors' CPUs fall back to MKL's own choice;
#: ``tests/test_torch_baselines_pinned.py`` pins both). Set
#: ``FEDNET_NATIVE_KERNELS=1`` to keep the host's own (faster on AVX-512; other last bits than the pinned traces).
PORTABLE_KERNELS = {
    "OPENBLAS_CORETYPE": "Haswell",                       # OpenBLAS's AVX2 kernels (DYNAMIC_ARCH would pick by CPU)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",   # NumPy >= 2.4's names of its AVX-512 loops
    "MKL_CBWR": "AVX2",                                   # torch's MKL: its AVX2 path (conditional reproducibility)
    "ATEN_CPU_CAPABILITY": "avx2",                        # torch's own vectorised kernels
}

#: glibc's malloc settings (``mallopt``: parameter number, value): arrays up to 32 MiB come from the heap rather than
#: from a fresh ``mmap`` each, and up to 256 MiB of freed heap is kept for the next ones. With glibc's defaults a
#: round's large temporaries (a stack of minibatches, a stack of gradients: 8 MB each at D = 1000) are mapped, zeroed
#: page by page and unmapped every round: measured 2026-11-27, the batched gradient kernels of conventional FL at
#: D = 1000 (d = 100) took 11 ms a round with the defaults and 5.4 ms with these, and
#: ``benchmarks/bench_sweep.py --devices 1000 --protocols conventional`` went 19.8 -> 14.8 ms a round. They also undo
#: ``MALLOC_TRIM_THRESHOLD_=65536``, which Dask's nanny gives its workers and which fixes glibc's mmap threshold at
#: 128 KiB (1.8 M page faults, 2-3x the host time of a quickstart run). Where memory comes from changes no result
#: (the kernels fednet uses do not depend on an array's address). Set ``FEDNET_DEFAULT_MALLOC=1`` to keep glibc's
#: defaults; other C libraries are left alone.
MALLOC_SETTINGS = {"M_MMAP_THRESHOLD": (-3, 32 * 2**20), "M_TRIM_THRESHOLD": (-1, 256 * 2**20)}

#: Libraries that pick their kernels when they load: :data:`PORTABLE_KERNELS` set after one of them is imported
#: does not reach it.
_KERNEL_LIBRARIES = ("numpy", "scipy", "torch")


@dataclass(frozen=True)
class HostConfig:
    """What :func:`configure_host` has applied in this process (all False / empty before its first call).

    Attributes
    ----------
    kernels : dict of str to str
        The :data:`PORTABLE_KERNELS` variables fednet set (those that were unset); empty when they were all set
        already, when opted out (``FEDNET_NATIVE_KERNELS=1``) or on a host other than x86-64.
    kernels_late : tuple of str
        The libraries of ``("numpy", "scipy", "torch")`` already imported when ``kernels`` were set: they keep the
        kernels they picked (empty when ``kernels`` is, or when the variables came first, as they should).
    kernels_checked : bool
        Whether the portable-kernel step ran (``portable_kernels=True`` in some call).
    malloc : bool
        Whether :data:`MALLOC_SETTINGS` took effect (glibc on Linux, not opted out with ``FEDNET_DEFAULT_MALLOC=1``).
    gc_policy : bool
        Whether :meth:`fednet.protocol.base.Protocol.run` manages the garbage collector (module docstring).
    """

    kernels: dict[str, str] = field(default_factory=dict)
    kernels_late: tuple[str, ...] = ()
    kernels_checked: bool = False
    malloc: bool = False
    gc_policy: bool = False


_config = HostConfig()
_malloc_tried = False
_lock = threading.Lock()


def host_config() -> HostConfig:
    """What :func:`configure_host` has applied in this process so far (changes nothing).

    Returns
    -------
    HostConfig
    """
    return _config


def configure_host(*, portable_kernels: bool = True, malloc: bool = True, gc_policy: bool = True) -> HostConfig:
    """Apply fednet's process-wide host settings: portable kernels, malloc thresholds, garbage-collector policy.

    The one place fednet changes anything outside itself (module docstring). The ``fednet`` command, the study
    runner and the Dask workers call it; call it yourself, before importing NumPy, SciPy or torch, for the same
    kernels (the pinned traces) and the same speed in a script that drives :class:`~fednet.sim.simulation.Simulation`
    and a protocol directly.

    Idempotent: each setting is applied by the first call that asks for it and left as it is by later calls, which
    return the same record; a setting passed as False is not applied (nor undone if an earlier call applied it).

    Parameters
    ----------
    portable_kernels : bool
        Set each unset variable of :data:`PORTABLE_KERNELS` in ``os.environ`` (x86-64 hosts only; none with
        ``FEDNET_NATIVE_KERNELS=1``; ``NPY_DISABLE_CPU_FEATURES`` only for NumPy >= 2.4, whose loop names it
        holds). Effective only for the libraries that load afterwards: if fednet sets a variable while NumPy,
        SciPy or torch is already imported, a :class:`RuntimeWarning` names them (:attr:`HostConfig.kernels_late`).
    malloc : bool
        Apply :data:`MALLOC_SETTINGS` with glibc's ``mallopt`` (Linux with glibc only; not with
        ``FEDNET_DEFAULT_MALLOC=1``).
    gc_policy : bool
        Let :meth:`fednet.protocol.base.Protocol.run` freeze and pause the garbage collector during its rounds
        (:data:`fednet.protocol.base.GC_ROUNDS`; the collector's state is restored when the run ends).

    Returns
    -------
    HostConfig
        What has taken effect in this process (also :func:`host_config`).

    Warns
    -----
    RuntimeWarning
        When a portable-kernel variable is set after NumPy, SciPy or torch was imported.
    """
    global _config, _malloc_tried
    late: tuple[str, ...] = ()
    with _lock:
        changes: dict = {}
        if portable_kernels and not _config.kernels_checked:
            kernels = _set_portable_kernels()
            if kernels:
                late = tuple(name for name in _KERNEL_LIBRARIES if name in sys.modules)
            changes.update(kernels=kernels, kernels_late=late, kernels_checked=True)
        if malloc and not _malloc_tried:
            _malloc_tried = True
            changes["malloc"] = _tune_malloc()
        if gc_policy:
            changes["gc_policy"] = True
        if changes:
            _config = dataclasses.replace(_config, **changes)
        config = _config
    if late:
        warnings.warn(f"fednet.configure_host set {', '.join(sorted(config.kernels))} after {', '.join(late)} "
                      "was imported, which keeps the kernels it picked (results may differ in the last bits from the "
                      "pinned traces on this host): call it before importing them, or export the variables "
                      "(fednet.PORTABLE_KERNELS)", RuntimeWarning, stacklevel=2)
    return config


def _set_portable_kernels() -> dict[str, str]:
    """Set the unset variables of :data:`PORTABLE_KERNELS` (unless opted out or not x86-64); returns those set."""
    if os.environ.get("FEDNET_NATIVE_KERNELS") == "1" or platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    done: dict[str, str] = {}
    for name, value in PORTABLE_KERNELS.items():
        if name == "NPY_DISABLE_CPU_FEATURES":
            try:                                          # older NumPy names its loops otherwise: leave it alone
                major, minor = (int(x) for x in importlib.metadata.version("numpy").split(".")[:2])
            except (importlib.metadata.PackageNotFoundError, ValueError):
                continue
            if (major, minor) < (2, 4):
                continue
        if name not in os.environ:
            os.environ[name] = done[name] = value
    return done


def _tune_malloc() -> bool:
    """Apply :data:`MALLOC_SETTINGS` with glibc's ``mallopt`` (glibc on Linux only; opt-out above); whether it took."""
    if os.environ.get("FEDNET_DEFAULT_MALLOC") == "1" or sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.values())
