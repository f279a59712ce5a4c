"""A counter of changes to the nodes' timing parameters, so that vector replays may keep per-node tables.

The engine's replays (:mod:`fednet.protocol.primitives`, issue 12) read every node's link rates and
losses, MAC rate and compute model each round. Those rarely change, but nothing forbids a protocol or a
study to change them between rounds (a protocol's set-up may set a MAC rate). Every assignment to an
attribute of a :class:`~fednet.sim.network.Link`, a :class:`~fednet.sim.simulation.Node` or a
:class:`~fednet.sim.compute.ComputeModel` bumps :data:`STAMP`; a table made at one value of
``STAMP.value`` is valid while it is unchanged.
"""

from __future__ import annotations

__all__ = ["STAMP", "Stamped"]


class _Stamp:
    """The counter (one attribute, ``value``)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


#: Bumped by every attribute assignment on a :class:`Stamped` object.
STAMP = _Stamp()


class Stamped:
    """Mixin: every attribute assignment (construction included) bumps :data:`STAMP`."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        STAMP.value += 1
