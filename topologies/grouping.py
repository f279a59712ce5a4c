"""Grouping of devices (CodedPaddedFL paper, Sec. V-E and VII-C).

Source: Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. V-E: the ``D`` devices are
partitioned into ``N`` disjoint groups "as equally as possible" (``N`` need not divide ``D``);
CodedPaddedFL runs inside each group and the server sums the groups' decoded aggregates.
Sec. VII-C searches over ``alpha`` and ``N`` (there with ``N | D``) for the fastest time to a
target accuracy.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["equal_groups", "group_sizes", "alpha_group_grid"]


def group_sizes(n_devices: int, n_groups: int) -> list[int]:
    """Sizes of ``n_groups`` groups of ``n_devices`` devices, as equal as possible.

    Parameters
    ----------
    n_devices : int
        D, at least 1.
    n_groups : int
        N, in ``[1, D]``.

    Returns
    -------
    list of int
        The first ``D mod N`` groups have ``ceil(D / N)`` devices, the others ``floor(D / N)``.

    Raises
    ------
    ValueError
        If ``n_devices < 1`` or ``n_groups`` is not in ``[1, n_devices]``.
    """
    if not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive integer, got {n_devices!r}")
    if not isinstance(n_groups, int) or not 1 <= n_groups <= n_devices:
        raise ValueError(f"n_groups must be an integer in [1, n_devices] = [1, {n_devices}], got {n_groups!r}")
    q, r = divmod(n_devices, n_groups)
    return [q + 1] * r + [q] * (n_groups - r)


def equal_groups(n_devices: int, n_groups: int) -> list[list[int]]:
    """Partition devices ``0..D-1`` into ``N`` consecutive groups as equal as possible.

    Parameters
    ----------
    n_devices : int
        D.
    n_groups : int
        N (see :func:`group_sizes`).

    Returns
    -------
    list of list of int
        Group ``g`` holds consecutive device indices; sizes differ by at most one.
    """
    out, start = [], 0
    for size in group_sizes(n_devices, n_groups):
        out.append(list(range(start, start + size)))
        start += size
    return out


def alpha_group_grid(n_devices: int, alphas: Iterable[int] | None = None, *,
                     divisors_only: bool = True) -> list[tuple[int, int]]:
    """The (alpha, N) pairs of the Sec. VII-C search.

    Parameters
    ----------
    n_devices : int
        D.
    alphas : iterable of int, optional
        Candidate alphas (default: every feasible one).
    divisors_only : bool
        Only ``N`` dividing ``D`` (the paper's restriction of the search space).

    Returns
    -------
    list of (alpha, N)
        Pairs with ``1 <= alpha <=`` the smallest group size.
    """
    pairs = []
    for N in range(1, n_devices + 1):
        if divisors_only and n_devices % N:
            continue
        smallest = min(group_sizes(n_devices, N))
        cand = range(1, smallest + 1) if alphas is None else [a for a in alphas if 1 <= a <= smallest]
        pairs.extend((a, N) for a in cand)
    return pairs
