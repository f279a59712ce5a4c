"""fednet: a discrete-event simulator of coded and secure federated learning over wireless networks.

Layers (a layer imports only the layers above it in this list):

``fednet.algebra``    fixed point, prime fields, exact kernels, the MAC meter
``fednet.codes``      gradient codes, Shamir, Lagrange coded computing, mask codes
``fednet.learning``   datasets, partitions, features, models
``fednet.sim``        the SimPy model: nodes, links, compute-time and delay models, keyed draws
``fednet.sim.engine`` the engine: steps, their reference semantics (SimPy processes), the backends that
                      replay them, ``EngineConfig`` (``$FEDNET_ENGINE``) and the recorded paths
``fednet.topologies`` network builders, groups, the group tree (the repository's ``topologies/``)
``fednet.protocol``   the ``Protocol`` base class, its primitives (``self.net``) and registry
``fednet.testing``    public harnesses for a protocol of your own (``check_engine``)
``fednet.protocols``  the built-in protocols (the repository's ``protocols/``)
``fednet.study``      study configs, runs, results, plots; ``fednet.cli`` the command
``fednet.studies``    the bundled study files (the repository's ``studies/``, package data)

The top-level directories ``protocols/``, ``topologies/`` and ``studies/`` of the repository install
as ``fednet.protocols``, ``fednet.topologies`` and ``fednet.studies`` (``package-dir`` in
``pyproject.toml``), so a user's own folder named ``protocols`` cannot shadow them. When this package
is imported from a source checkout (``PYTHONPATH=checkout``, or an editable install), the finder
below maps those three names to the directories beside *this* ``fednet/``, so a checkout never
mixes its own ``fednet`` with another checkout's protocols.

Importing fednet changes nothing outside it: no environment variable, allocator setting or garbage-collector
state. :func:`configure_host` (:mod:`fednet.runtime`) applies fednet's process-wide host settings (portable
floating-point kernels, glibc malloc thresholds, the garbage-collector policy of ``Protocol.run``); the ``fednet``
command, the study runner and the Dask workers call it, and a script can call it before it imports NumPy.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

from .runtime import MALLOC_SETTINGS, PORTABLE_KERNELS, HostConfig, configure_host

__version__ = "0.1.0"
__all__ = ["configure_host", "HostConfig", "PORTABLE_KERNELS", "MALLOC_SETTINGS", "__version__"]

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
