"""The engine's backends, one module per step kind, tried in the order listed here (:func:`..step.execute`).

=============  ============================================  ===============================================
step kind      backends, in order                            module
=============  ============================================  ===============================================
``gather``     ``gather`` (with ``batched`` inside)          :mod:`.gather`
``groups``     ``groups``                                    :mod:`.groups`
``tree``       ``gather`` (edgeless trees), ``tree``         :mod:`.tree` (on cells: :mod:`.tree_cells`)
``compute``    ``compute``                                   :mod:`.compute`
``exchange``   ``bundled``, ``cyclic``, ``relays``           :mod:`.bundled`, :mod:`.cyclic`, :mod:`.relays`
``masked``     ``masked``                                    :mod:`.masked` (on cells: :mod:`.masked_cells`)
``buffered``   ``buffered``                                  :mod:`.buffered`
=============  ============================================  ===============================================
"""

from __future__ import annotations

from ..step import Backend
from .buffered import BufferedReplay
from .bundled import BundledArrays
from .compute import ComputeReplay
from .cyclic import CyclicReplay
from .gather import GatherReplay
from .groups import GroupsReplay
from .masked import MaskedReplay
from .relays import RelayReplay
from .tree import EdgelessTree, TreeReplay

__all__ = ["BY_KIND"]

#: Step kind -> its backends, in the order they are tried.
BY_KIND: dict[str, list[Backend]] = {
    "gather": [GatherReplay()],
    "groups": [GroupsReplay()],
    "tree": [EdgelessTree(), TreeReplay()],
    "compute": [ComputeReplay()],
    "exchange": [BundledArrays(), CyclicReplay(), RelayReplay()],
    "masked": [MaskedReplay()],
    "buffered": [BufferedReplay()],
}
