"""fednet: a discrete-event simulator of coded and secure federated learning over wireless networks.

Layers (a layer imports only the layers above it in this list):

``fednet.algebra``    fixed point, prime fields, exact kernels, the MAC meter
``fednet.codes``      gradient codes, Shamir, Lagrange coded computing, mask codes
``fednet.learning``   datasets, partitions, features, models
``fednet.sim``        the SimPy engine: nodes, links, compute-time models, trace
``fednet.topologies`` network builders, groups, the group tree (the repository's ``topologies/``)
``fednet.protocol``   the ``Protocol`` base class and registry
``fednet.protocols``  the built-in protocols (the repository's ``protocols/``)
``fednet.study``      study configs, runs, results, plots; ``fednet.cli`` the command
``fednet.studies``    the bundled study files (the repository's ``studies/``, package data)

The top-level directories ``protocols/``, ``topologies/`` and ``studies/`` of the repository install
as ``fednet.protocols``, ``fednet.topologies`` and ``fednet.studies`` (``package-dir`` in
``pyproject.toml``), so a user's own folder named ``protocols`` cannot shadow them. When this package
is imported from a source checkout (``PYTHONPATH=checkout``, or an editable install), the finder
below maps those three names to the directories beside *this* ``fednet/``, so a checkout never
mixes its own ``fednet`` with another checkout's protocols.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import os
import platform
import sys
from pathlib import Path

__version__ = "0.1.0"

#: The kernels that floating-point results come from, the same on every x86-64 host (set before NumPy, SciPy or
#: torch load, where the variable is unset). OpenBLAS (NumPy's and SciPy's), NumPy's SIMD loops and torch's MKL and
#: ATen pick kernels by CPU, AVX-512 where the host has it, and kernels of other vector widths sum in other orders:
#: on 2026-11-27 the last bits of a test loss, and every digest over it, differed between an AVX-512 host and an
#: AVX2-only one. Pinning the AVX2 kernels, which every x86-64 host fednet targets has, makes a trace at a seed the
#: same on both (``tests/test_pinned_traces.py`` and the other pinned digests hold on either). Set
#: ``FEDNET_NATIVE_KERNELS=1`` to keep the host's own (faster on AVX-512; other last bits than the pinned traces).
PORTABLE_KERNELS = {
    "OPENBLAS_CORETYPE": "Haswell",                       # OpenBLAS's AVX2 kernels (DYNAMIC_ARCH would pick by CPU)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",   # NumPy >= 2.4's names of its AVX-512 loops
    "MKL_CBWR": "AVX2",                                   # torch's MKL: its AVX2 path (conditional reproducibility)
    "ATEN_CPU_CAPABILITY": "avx2",                        # torch's own vectorised kernels
}


def _portable_kernels() -> None:
    """Set :data:`PORTABLE_KERNELS` in the environment (unset ones only), unless opted out or too late to matter."""
    if os.environ.get("FEDNET_NATIVE_KERNELS") == "1" or platform.machine().lower() not in ("x86_64", "amd64"):
        return
    for name, value in PORTABLE_KERNELS.items():
        if name == "NPY_DISABLE_CPU_FEATURES":
            try:                                          # older NumPy names its loops otherwise: leave it alone
                major, minor = (int(x) for x in importlib.metadata.version("numpy").split(".")[:2])
            except (importlib.metadata.PackageNotFoundError, ValueError):
                continue
            if (major, minor) < (2, 4):
                continue
        os.environ.setdefault(name, value)


_portable_kernels()

#: glibc's malloc settings fednet applies at import (``mallopt``): arrays up to 32 MiB come from the heap rather
#: than from a fresh ``mmap`` each, and up to 256 MiB of freed heap is kept for the next ones.  With glibc's
#: defaults a round's large temporaries (a stack of minibatches, a stack of gradients: 8 MB each at D = 1000) are
#: mapped, zeroed page by page and unmapped every round: measured 2026-11-27, the batched gradient kernels of
#: conventional FL at D = 1000 (d = 100) took 11 ms a round with the defaults and 5.4 ms with these, and
#: ``benchmarks/bench_sweep.py --devices 1000 --protocols conventional`` went 19.8 -> 14.8 ms a round.  Where
#: memory comes from changes no result (the kernels fednet uses do not depend on an array's address).  Set
#: ``FEDNET_DEFAULT_MALLOC=1`` to keep glibc's defaults; other C libraries are left alone.
MALLOC_SETTINGS = {"M_MMAP_THRESHOLD": (-3, 32 * 2**20), "M_TRIM_THRESHOLD": (-1, 256 * 2**20)}

#: Whether :data:`MALLOC_SETTINGS` took effect in this process.
MALLOC_TUNED = False


def _tune_malloc() -> None:
    """Apply :data:`MALLOC_SETTINGS` with glibc's ``mallopt`` (glibc on Linux only; opt-out above)."""
    global MALLOC_TUNED
    if os.environ.get("FEDNET_DEFAULT_MALLOC") == "1" or sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    import ctypes
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    MALLOC_TUNED = all(mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.values())


_tune_malloc()

#: Subpackages that live outside ``fednet/`` in the repository (``package-dir`` in pyproject.toml).
_MAPPED = ("protocols", "topologies", "studies")


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Find ``fednet.protocols`` / ``fednet.topologies`` / ``fednet.studies`` in a source checkout."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (importlib protocol)
        """The spec of ``fednet.<name>`` for a mapped top-level package (importlib's meta path finder API).

        Parameters
        ----------
        fullname : str
            Dotted module name being imported.
        path, target
            Unused (importlib's protocol).

        Returns
        -------
        importlib.machinery.ModuleSpec or None
            None for every module this finder does not map.
        """
        head, _, tail = fullname.partition(".")
        if head != __name__ or tail not in _MAPPED:
            return None
        init = self.root / tail / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def _install_checkout_finder() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    if not (root / "pyproject.toml").is_file():  # an installed wheel: the subpackages sit inside fednet/
        return
    if not all((root / name / "__init__.py").is_file() and not (here / name).exists() for name in _MAPPED):
        return
    if not any(isinstance(f, _CheckoutFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(root))


_install_checkout_finder()
