"""Old name of :mod:`fednet.topologies.groups` (kept so that ``fednet.topologies.grouping`` imports keep working)."""

from .groups import alpha_group_grid, equal_groups, group_sizes

__all__ = ["equal_groups", "group_sizes", "alpha_group_grid"]
