"""Groups of devices: sizes, grouping rules, membership on the topology graph.

A topology graph carries group membership as the integer node attribute ``group`` of every device
(groups ``0..N-1``; group 0 is CodedSecAgg's master group). :func:`assign_groups` writes it by a rule;
:func:`membership` reads it back (or falls back to consecutive groups), which is what protocols with
a ``groups`` parameter use.

Rules (:data:`RULES`):

``consecutive``   devices ``0..D-1`` cut into N consecutive runs, sizes as equal as possible
                  (:func:`equal_groups`; the papers' grouping and fednet's default)
``random``        a uniformly random permutation cut the same way (balanced sizes)
``mac_balanced``  devices sorted by MAC rate (fastest first) dealt to the groups in snake order
                  (0, 1, ..., N-1, N-1, ..., 0, ...): balanced sizes and a similar mix of fast and slow
                  devices in every group
``cells``         one group per cell of the network (the devices' ``cell`` attribute; applied by
                  :func:`fednet.study.runner.cell_groups` on the built network, not by :func:`make_groups`)

Source: Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. V-E: the ``D`` devices are
partitioned into ``N`` disjoint groups "as equally as possible" (``N`` need not divide ``D``);
CodedPaddedFL runs inside each group and the server sums the groups' decoded aggregates.
Sec. VII-C searches over ``alpha`` and ``N`` (there with ``N | D``) for the fastest time to a
target accuracy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np

__all__ = ["equal_groups", "group_sizes", "alpha_group_grid", "RULES", "make_groups", "check_membership",
           "assign_groups", "membership", "has_groups"]

#: Names of the grouping rules of :func:`make_groups`.
RULES = ("consecutive", "random", "mac_balanced")


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


def make_groups(rule: str, n_devices: int, n_groups: int, *, mac_rates: Sequence[float] | None = None,
                rng: np.random.Generator | None = None) -> list[list[int]]:
    """Membership of ``n_groups`` groups of devices ``0..D-1`` by a rule (module docstring).

    Parameters
    ----------
    rule : {"consecutive", "random", "mac_balanced"}
    n_devices : int
        D.
    n_groups : int
        N in ``[1, D]``.
    mac_rates : sequence of float, optional
        MAC/s per device (needed by ``mac_balanced``; ties keep device order).
    rng : numpy.random.Generator, optional
        Stream of the permutation (needed by ``random``).

    Returns
    -------
    list of list of int
        Group g's devices in increasing order; sizes as in :func:`group_sizes` for ``consecutive``
        and ``random``, within one of each other for ``mac_balanced``.

    Raises
    ------
    ValueError
        For an unknown rule, a bad N, or a missing ``mac_rates`` / ``rng``.
    """
    sizes = group_sizes(n_devices, n_groups)
    if rule == "consecutive":
        return equal_groups(n_devices, n_groups)
    if rule == "random":
        if rng is None:
            raise ValueError("rule 'random' needs an rng")
        perm = [int(i) for i in rng.permutation(n_devices)]
        out, start = [], 0
        for size in sizes:
            out.append(sorted(perm[start:start + size]))
            start += size
        return out
    if rule == "mac_balanced":
        if mac_rates is None or len(mac_rates) != n_devices:
            raise ValueError(f"rule 'mac_balanced' needs one MAC rate per device ({n_devices}), "
                             f"got {None if mac_rates is None else len(mac_rates)}")
        order = sorted(range(n_devices), key=lambda i: (-float(mac_rates[i]), i))
        snake = [g for r in range(-(-n_devices // n_groups))
                 for g in (range(n_groups) if r % 2 == 0 else range(n_groups - 1, -1, -1))]
        out = [[] for _ in range(n_groups)]
        for dev, g in zip(order, snake):
            out[g].append(dev)
        return [sorted(m) for m in out]
    raise ValueError(f"grouping rule must be one of {RULES}, got {rule!r}")


def check_membership(groups: Sequence[Sequence[int]], n_devices: int) -> list[list[int]]:
    """Check that ``groups`` partition ``0..D-1`` into non-empty groups; return them as lists.

    Raises
    ------
    ValueError
        Naming an empty group, a device in two groups, a device out of range, or a device in none.
    """
    out, seen = [], {}
    for g, members in enumerate(groups):
        members = [int(i) for i in members]
        if not members:
            raise ValueError(f"group {g} is empty")
        for i in members:
            if not 0 <= i < n_devices:
                raise ValueError(f"group {g} names device {i}, outside [0, {n_devices})")
            if i in seen:
                raise ValueError(f"device {i} is in groups {seen[i]} and {g}")
            seen[i] = g
        out.append(members)
    missing = sorted(set(range(n_devices)) - set(seen))
    if missing:
        raise ValueError(f"devices {missing[:10]} are in no group")
    return out


def _device_keys(graph: nx.Graph) -> list[Any]:
    return [n for n, a in graph.nodes(data=True) if a.get("role") == "device"]


def assign_groups(graph: nx.Graph, groups: Sequence[Sequence[int]]) -> nx.Graph:
    """Write group membership onto a topology graph (node attribute ``group``; graph attribute ``n_groups``).

    Parameters
    ----------
    graph : networkx.Graph
        A topology (devices in graph order are indices ``0..D-1``, as in the Simulation).
    groups : sequence of sequence of int
        A partition of the device indices (:func:`check_membership`).

    Returns
    -------
    networkx.Graph
        ``graph``, modified in place.
    """
    keys = _device_keys(graph)
    groups = check_membership(groups, len(keys))
    for g, members in enumerate(groups):
        for i in members:
            graph.nodes[keys[i]]["group"] = g
    graph.graph["n_groups"] = len(groups)
    return graph


def _device_attrs(net: Any) -> list[dict[str, Any]]:
    if isinstance(net, nx.Graph):
        return [net.nodes[k] for k in _device_keys(net)]
    return [d.attrs for d in net.devices]  # a Simulation


def has_groups(net: Any) -> bool:
    """Whether a topology graph (or a Simulation built from one) defines group membership."""
    return any("group" in a for a in _device_attrs(net))


def membership(net: Any, n_groups: int | None = None) -> list[list[int]]:
    """The groups of a network: its ``group`` attributes, else ``n_groups`` consecutive groups.

    Parameters
    ----------
    net : networkx.Graph or Simulation
        The topology, or the Simulation built from it (device ``i`` = ``sim.devices[i]``).
    n_groups : int, optional
        N wanted by the caller (a protocol's ``groups``). Without group attributes the devices are
        cut into N consecutive groups (:func:`equal_groups`); with them, N must equal their number.

    Returns
    -------
    list of list of int
        Device indices of groups ``0..N-1``.

    Raises
    ------
    ValueError
        If some devices have a group and others not, the groups are not ``0..N-1``, or
        ``n_groups`` differs from the network's number of groups (naming both).
    """
    attrs = _device_attrs(net)
    D = len(attrs)
    if not has_groups(net):
        if n_groups is None:
            raise ValueError("the network defines no groups and no n_groups was given")
        return equal_groups(D, n_groups)
    missing = [i for i, a in enumerate(attrs) if "group" not in a]
    if missing:
        raise ValueError(f"devices {missing[:10]} have no 'group' attribute while others have one")
    labels = [int(a["group"]) for a in attrs]
    n = max(labels) + 1
    out = [[i for i in range(D) if labels[i] == g] for g in range(n)]
    empty = [g for g, m in enumerate(out) if not m]
    if min(labels) < 0 or empty:
        raise ValueError(f"group attributes must be 0..N-1 with every group non-empty; empty: {empty}")
    if n_groups is not None and n_groups != n:
        raise ValueError(f"groups = {n_groups} but the network defines {n} groups (network.groups)")
    return out
