"""A tree step's structure: the forest's parts (cached per tree) and the complete subtrees of a round.

:func:`forest_parts` checks a :class:`networkx.DiGraph` (edges child -> parent) once per tree and keeps its roots,
subtrees, children in step order and parents; :func:`taking_part` asks the availability model which subtrees are
complete this round (a root takes part only if every node of its subtree is available).
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from fednet.sim.compute import AlwaysAvailable
from fednet.sim.simulation import Node, Simulation

__all__ = ["forest_parts", "taking_part"]


def forest_parts(cache: dict, tree: nx.DiGraph, edgeless: bool) -> tuple[list, dict, dict, dict, dict, tuple]:
    """A forest's roots, each root's subtree (a set, the same object each call), each node's root, each node's
    children in step order, each node's parent and its nodes in order, checked and computed once per tree and kept in
    ``cache`` while its nodes, edges and steps stay the same.

    Raises
    ------
    ValueError
        If ``tree`` has a cycle or a node with two parents.
    """
    key = (id(tree), tuple(tree.nodes), tuple(tree.edges(data="step")))
    got = cache.get(key)
    if got is None or got[0] is not tree:
        if not edgeless and (not nx.is_directed_acyclic_graph(tree) or any(d > 1 for _, d in tree.out_degree())):
            raise ValueError("tree must be a forest with edges child -> parent (acyclic, one parent per node)")
        roots = list(tree.nodes) if edgeless else [v for v in tree.nodes if tree.out_degree(v) == 0]
        members = {r: {r} for r in roots} if edgeless else {r: nx.ancestors(tree, r) | {r} for r in roots}
        kids = {v: sorted(tree.predecessors(v), key=lambda u, v=v: tree.edges[u, v].get("step", 0)) for v in tree}
        parent = {v: next(iter(tree.successors(v)), None) for v in tree}
        if len(cache) >= 8:                  # a protocol keeps a few trees; one built anew each round is not kept
            cache.clear()
        got = cache[key] = (tree, roots, members, {u: r for r in roots for u in members[r]}, kids, parent, key[1])
    return got[1:]


def taking_part(sim: Simulation, available: Any, parts: tuple, edgeless: bool) -> tuple[set, list[int], list[Node]]:
    """The roots of the complete subtrees, the nodes taking part (tree order) and the absent ones (as nodes).

    ``available(node)`` is the net's availability question, asked in the order the reference asks it (each root's
    subtree walked once); nobody can be absent under :class:`~fednet.sim.compute.AlwaysAvailable`, so there every
    node is asked at once.
    """
    roots, members, root_of, _, _, tree_nodes = parts
    devs = sim.devices
    if edgeless:                         # every node is its own root
        complete = {r for r, ok in zip(roots, sim.available_many([devs[r] for r in roots])) if ok}
    elif type(sim.availability) is AlwaysAvailable and type(sim).available is Simulation.available:
        sim.available_many([devs[u] for r in roots for u in members[r]])   # nobody absent: asked at once
        complete = set(roots)
    else:                                # each root's subtree, walked once (the order available() is asked in)
        complete = {r for r in roots if all(available(devs[u]) for u in members[r])}
    if len(complete) == len(roots):
        return complete, list(tree_nodes), []
    return (complete, [v for v in tree_nodes if root_of[v] in complete],
            [devs[v] for v in tree_nodes if root_of[v] not in complete])
