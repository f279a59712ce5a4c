"""The inter-group aggregation tree of CodedSecAgg as a pure schedule.

Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. VI-D, eqs. (14)-(15) and Fig. 3.  The devices
are split into N equally sized groups; device i of every group holds a Shamir share of its group's
gradient.  Shares climb a binary tree towards the master group: in step ``s = 1..ceil(log2 N)`` every
device ``i`` of each group

    j in {j' in [N] : j' mod 2**s = (2**(s-1) + 1) mod 2**s}                           (14)

sends its running sum of shares of the groups ``j .. min(j + 2**(s-1) - 1, N)``             (15)

to device ``i`` of group ``j - 2**(s-1)``, which adds it to its own.  After the last step, device i of
the master group (group 1) holds share i of the global gradient.

Indexing here is **0-based**: group ``g = j - 1``, master group ``0``.  Eq. (14) then reads
``g mod 2**s == 2**(s-1)`` and the receiver is ``g - 2**(s-1)``.  Device ``i`` of group ``g`` only ever
talks to device ``i`` of another group, so a group-level schedule in which every group sends at most
one message and receives at most one message per step gives the same bound per device.
"""

from __future__ import annotations

import math

__all__ = ["tree_depth", "aggregation_tree", "tree_coverage"]


def _check_n(n_groups: int) -> int:
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 1:
        raise ValueError(f"n_groups must be a positive integer, got {n_groups!r}")
    return n_groups


def tree_depth(n_groups: int) -> int:
    """Number of steps ``ceil(log2 N)`` (0 for a single group)."""
    return math.ceil(math.log2(_check_n(n_groups))) if n_groups > 1 else 0


def aggregation_tree(n_groups: int) -> list[list[tuple[int, int]]]:
    """The steps of eqs. (14)-(15): a list over steps of ``(sender group, receiver group)`` pairs.

    Parameters
    ----------
    n_groups : int
        Number of groups N >= 1 (0-based group ids, master group 0).

    Returns
    -------
    list of list of tuple(int, int)
        ``steps[s-1]`` holds the transfers of step ``s``; ``len(steps) == ceil(log2 N)``.  In a step,
        every group appears at most once as a sender and at most once as a receiver, and no group
        both sends and receives.

    Raises
    ------
    ValueError
        If ``n_groups`` is not a positive integer.

    Examples
    --------
    >>> aggregation_tree(8)        # Fig. 3 (groups 1..8 of the paper are 0..7 here)
    [[(1, 0), (3, 2), (5, 4), (7, 6)], [(2, 0), (6, 4)], [(4, 0)]]
    """
    n = _check_n(n_groups)
    steps = []
    for s in range(1, tree_depth(n) + 1):
        half = 2 ** (s - 1)
        steps.append([(g, g - half) for g in range(n) if g % (2**s) == half])
    return steps


def tree_coverage(n_groups: int) -> list[list[frozenset[int]]]:
    """Which groups' shares each group has summed, before step 1 and after every step.

    Returns
    -------
    list of list of frozenset
        ``cov[t][g]``: the groups whose shares group g holds the sum of after ``t`` steps
        (``cov[0][g] = {g}``).  A sender's coverage after step ``s`` is its eq. (15) range
        ``g .. min(g + 2**(s-1) - 1, N - 1)``; the master's final coverage is all groups.
    """
    n = _check_n(n_groups)
    cov = [frozenset([g]) for g in range(n)]
    out = [list(cov)]
    for step in aggregation_tree(n):
        nxt = list(cov)
        for src, dst in step:
            nxt[dst] = nxt[dst] | cov[src]
        cov = nxt
        out.append(list(cov))
    return out
