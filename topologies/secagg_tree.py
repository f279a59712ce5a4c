"""The hierarchical group tree of CodedSecAgg as a networkx ``DiGraph``, and drawing it.

Source: Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. VI-D, eqs. (14)-(15) and Fig. 3.
The schedule itself (which group sends to which in step ``s``) is
:func:`fednet.codes.secagg_tree.aggregation_tree` (0-based groups, master group 0); this module
turns it into graphs built from a topology's group membership, so the tree can be inspected and
drawn before a run (``fednet topology STUDY --plot tree.png``):

* :func:`group_tree` -- nodes are groups (``members``, ``size``, ``level``, ``master``), edges
  ``src -> dst`` carry ``step`` (the step ``s`` of eq. 14) and ``covers`` (the groups whose shares
  the sender's running sum holds, eq. 15); with ``server=True`` the master group's edge to the
  server (``step = depth + 1``, ``kind = "upload"``) closes the tree.
* :func:`device_tree` -- the same tree between devices: device ``i`` of group ``src`` sends to
  device ``i`` of group ``dst`` (position ``i`` in the group's member list).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import networkx as nx

from fednet.codes.secagg_tree import aggregation_tree, tree_coverage, tree_depth

from .groups import check_membership, membership

__all__ = ["group_tree", "device_tree", "draw_topology", "SERVER"]

#: Node key of the server in the trees.
SERVER = "server"


def _groups(net: Any, n_groups: int | None) -> list[list[int]]:
    if isinstance(net, int) and not isinstance(net, bool):
        if net < 1:
            raise ValueError(f"the number of groups must be at least 1, got {net}")
        return [[] for _ in range(net)]
    if isinstance(net, Sequence):
        flat = sorted(i for m in net for i in m)
        return check_membership(net, len(flat))
    return membership(net, n_groups)


def group_tree(net: Any, n_groups: int | None = None, *, server: bool = True) -> nx.DiGraph:
    """The inter-group aggregation tree of eqs. (14)-(15) as a DiGraph.

    Parameters
    ----------
    net : networkx.Graph, Simulation, list of list of int, or int
        A topology with group attributes (or without them, cut into ``n_groups`` consecutive groups,
        :func:`~fednet.topologies.groups.membership`), a membership, or just the number of groups N.
    n_groups : int, optional
        N for a topology without group attributes.
    server : bool
        Add the server node and the master group's upload edge.

    Returns
    -------
    networkx.DiGraph
        Group nodes ``0..N-1`` with ``members`` (device indices), ``size``, ``master`` and ``level``
        (the step in which the group sends; ``depth + 1`` for the master, ``depth + 2`` for the
        server); edges with ``step`` and ``covers`` (sorted group ids). Graph attributes ``depth``
        (``ceil(log2 N)``) and ``n_groups``. Every group reaches the master group: the DiGraph is an
        arborescence rooted at the master (or the server).

    Raises
    ------
    ValueError
        If N < 1, or the membership is not a partition.
    """
    groups = _groups(net, n_groups)
    n = len(groups)
    if n < 1:
        raise ValueError(f"the tree needs at least one group, got {n}")
    depth = tree_depth(n)
    cover = tree_coverage(n)
    t = nx.DiGraph(depth=depth, n_groups=n)
    for g, members in enumerate(groups):
        low = (g & -g).bit_length() if g else depth + 1  # g sends in step s with g mod 2^s = 2^(s-1)
        t.add_node(g, members=list(members), size=len(members), master=g == 0, level=low)
    for s, step in enumerate(aggregation_tree(n), start=1):
        for src, dst in step:
            t.add_edge(src, dst, step=s, covers=sorted(cover[s][src]))
    if server:
        t.add_node(SERVER, members=[], size=0, master=False, level=depth + 2)
        t.add_edge(0, SERVER, step=depth + 1, covers=list(range(n)), kind="upload")
    return t


def device_tree(net: Any, n_groups: int | None = None) -> nx.DiGraph:
    """The tree between devices: device ``i`` of a sending group to device ``i`` of its receiver.

    Parameters
    ----------
    net, n_groups
        As for :func:`group_tree` (a membership, a topology or a Simulation; not a bare N).

    Returns
    -------
    networkx.DiGraph
        Device-index nodes with ``group`` and ``position``; edges with ``step`` (eq. 14). Devices
        beyond the receiving group's size (unequal groups) have no edge in that step.
    """
    if isinstance(net, int):
        raise ValueError("device_tree needs a membership or a topology, not only the number of groups")
    gt = group_tree(net, n_groups, server=False)
    t = nx.DiGraph(depth=gt.graph["depth"], n_groups=gt.graph["n_groups"])
    for g in range(gt.graph["n_groups"]):
        for pos, dev in enumerate(gt.nodes[g]["members"]):
            t.add_node(dev, group=g, position=pos)
    for src, dst, a in gt.edges(data=True):
        for a_dev, b_dev in zip(gt.nodes[src]["members"], gt.nodes[dst]["members"]):
            t.add_edge(a_dev, b_dev, step=a["step"])
    return t


def draw_topology(graph: nx.Graph, path: str | Path, *, n_groups: int | None = None, title: str | None = None) -> Path:
    """Draw a topology (devices coloured by group) and its group tree side by side, to a PNG.

    Parameters
    ----------
    graph : networkx.Graph
        A topology (``role`` attributes; ``group`` attributes, or ``n_groups`` consecutive groups).
    path : path-like
        The image file to write.
    n_groups : int, optional
        N for a topology without group attributes (1 if neither is given).
    title : str, optional

    Returns
    -------
    Path
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .groups import has_groups

    tree = group_tree(graph, None if has_groups(graph) else (n_groups or 1))
    group_of = {dev: g for g in range(tree.graph["n_groups"]) for dev in tree.nodes[g]["members"]}
    cmap = plt.get_cmap("tab20")
    fig, (ax_net, ax_tree) = plt.subplots(1, 2, figsize=(13, 6))

    devs = [k for k, a in graph.nodes(data=True) if a.get("role") == "device"]
    server = next(k for k, a in graph.nodes(data=True) if a.get("role") == "server")
    placed = all("x_m" in graph.nodes[k] for k in devs)         # radio_star: the devices where they are
    pos = ({k: (graph.nodes[k]["x_m"], graph.nodes[k]["y_m"]) for k in devs} | {server: (0.0, 0.0)} if placed
           else nx.shell_layout(graph, nlist=[[server], devs]))
    colours = [cmap(group_of[i] % 20) for i in range(len(devs))]
    d2d = [(u, v) for u, v in graph.edges() if u != server and v != server]
    star = [e for e in graph.edges() if e not in d2d]
    rates = [graph.edges[e].get("uplink_bps", 0.0) for e in star]
    if placed and rates:                                        # the links coloured by their uplink rate
        lines = nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=star, edge_color=rates,
                                       edge_cmap=plt.get_cmap("viridis"), width=1.2)
        fig.colorbar(lines, ax=ax_net, label="uplink rate [bit/s]", shrink=0.7)
    else:
        nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=star, edge_color="0.8")
    nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=d2d, edge_color="tab:red", style="dashed")
    sizes = [60 + 240 * (graph.nodes[k].get("mac_rate", 1.0) / max(graph.nodes[d].get("mac_rate", 1.0) for d in devs))
             for k in devs]
    nx.draw_networkx_nodes(graph, pos, ax=ax_net, nodelist=devs, node_color=colours, node_size=sizes)
    nx.draw_networkx_nodes(graph, pos, ax=ax_net, nodelist=[server], node_color="black", node_shape="s", node_size=400)
    if len(devs) <= 40:
        nx.draw_networkx_labels(graph, pos, ax=ax_net, labels={k: str(i) for i, k in enumerate(devs)}, font_size=7)
    cells = {graph.nodes[k].get("cell") for k in devs} - {None}
    ax_net.set_title(f"{len(devs)} devices (colour: group, size: MAC rate)"
                     + (f", {len(d2d)} device-to-device links" if d2d else "")
                     + (f", {len(cells)} cell(s) sharing airtime" if cells else ""), fontsize=9)
    if placed:
        ax_net.set_aspect("equal")
        ax_net.set_xlabel("x [m]")
        ax_net.set_ylabel("y [m]")
    else:
        ax_net.axis("off")

    tpos = nx.multipartite_layout(tree, subset_key="level", align="horizontal")
    tpos = {k: (x, y) for k, (x, y) in tpos.items()}
    nx.draw_networkx_edges(tree, tpos, ax=ax_tree, arrows=True, arrowsize=14, node_size=900)
    nx.draw_networkx_edge_labels(tree, tpos, ax=ax_tree, font_size=7,
                                 edge_labels={(u, v): f"s={a['step']}" for u, v, a in tree.edges(data=True)})
    gnodes = [g for g in tree.nodes if g != SERVER]
    nx.draw_networkx_nodes(tree, tpos, ax=ax_tree, nodelist=gnodes, node_size=900,
                           node_color=[cmap(g % 20) for g in gnodes])
    if SERVER in tree:
        nx.draw_networkx_nodes(tree, tpos, ax=ax_tree, nodelist=[SERVER], node_color="black", node_shape="s",
                               node_size=900)
    nx.draw_networkx_labels(tree, tpos, ax=ax_tree, font_size=7, font_color="black",
                            labels={g: f"G{g}\n{tree.nodes[g]['size']} dev" for g in gnodes})
    nx.draw_networkx_labels(tree, tpos, ax=ax_tree, labels={SERVER: "server"}, font_size=7, font_color="white")
    ax_tree.set_title(f"group tree (Sec. VI-D, eqs. 14-15): N = {tree.graph['n_groups']}, "
                      f"depth {tree.graph['depth']}")
    ax_tree.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
