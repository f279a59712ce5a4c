"""Network builders, device groups, per-device values, and the group tree (installed as ``fednet.topologies``).

A builder returns the networkx graph a :class:`~fednet.sim.simulation.Simulation` runs on (see
:mod:`fednet.sim.simulation` for the attributes: ``role``, ``mac_rate``, link rates and loss per
device, ``group``, and optional device-to-device edges). ``TOPOLOGIES`` maps the names study files
use in ``network.kind`` to builders; a study may instead name its own builder as
``"package.module:function"`` (:func:`builder`), called as ``function(n_devices, rng=..., **params)``.

Modules: :mod:`.lte` (the LTE star of the papers, and ``lte_cells``: the star's devices sharing the airtime of
cells by round robin or proportional fair, :mod:`fednet.sim.cells`), :mod:`.radio` (devices placed around a base
station, rates and losses from path loss, shadowing and Rayleigh fading by link adaptation to a BLER target,
Shannon with a gap, or LTE's CQI table), :mod:`.hierarchy` (cells with edge servers behind a backhaul to a
cloud server), :mod:`.groups` (grouping rules and membership),
:mod:`.distributions` (per-device values), :mod:`.secagg_tree` (CodedSecAgg's group tree as a DiGraph).
"""

from collections.abc import Callable

from .hierarchy import hierarchy
from .lte import lte_cells, lte_star
from .radio import radio_star

__all__ = ["TOPOLOGIES", "builder"]

TOPOLOGIES: dict[str, Callable] = {"lte_star": lte_star, "lte_cells": lte_cells, "radio_star": radio_star,
                                   "hierarchy": hierarchy}


def builder(kind: str) -> Callable:
    """The network builder named ``kind``: a key of :data:`TOPOLOGIES` or ``"package.module:function"``.

    Raises
    ------
    ValueError
        For an unknown name that is not of the ``module:function`` form (naming the known ones).
    ImportError, TypeError
        If the function cannot be imported or is not callable.
    """
    if kind in TOPOLOGIES:
        return TOPOLOGIES[kind]
    from fednet.plugins import import_object, is_object_path

    if not is_object_path(kind):
        raise ValueError(f"network kind must be one of {sorted(TOPOLOGIES)} or 'package.module:function', got {kind!r}")
    fn = import_object(kind, "network builder")
    if not callable(fn):
        raise TypeError(f"network builder {kind!r} is not callable (got {fn!r})")
    return fn
