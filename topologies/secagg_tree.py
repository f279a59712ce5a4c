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

    A hierarchy (edge servers, ``role="edge"``: :func:`fednet.topologies.hierarchy.hierarchy`) is drawn as the cloud,
    its edge servers with their backhaul links (rate and latency) and each cell's devices under its edge server.

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
    edges = [k for k, a in graph.nodes(data=True) if a.get("role") == "edge"]
    if edges:                                                  # a hierarchy: cloud, edge servers, cells
        _draw_hierarchy(graph, ax_net, devs, server, edges, [cmap(group_of[i] % 20) for i in range(len(devs))])
        devs = []
    placed = bool(devs) and all("x_m" in graph.nodes[k] for k in devs)   # radio_star: the devices where they are
    pos = ({k: (graph.nodes[k]["x_m"], graph.nodes[k]["y_m"]) for k in devs} | {server: (0.0, 0.0)} if placed
           else nx.shell_layout(graph, nlist=[[server], devs]) if devs else {})
    colours = [cmap(group_of[i] % 20) for i in range(len(devs))]
    role = {k: a.get("role") for k, a in graph.nodes(data=True)}
    d2d = [(u, v) for u, v in graph.edges() if role[u] == "device" and role[v] == "device"] if devs else []
    star = [e for e in graph.edges() if e not in d2d] if devs else []
    rates = [graph.edges[e].get("uplink_bps", 0.0) for e in star]
    if placed and rates:                                        # the links coloured by their uplink rate
        lines = nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=star, edge_color=rates,
                                       edge_cmap=plt.get_cmap("viridis"), width=1.2)
        fig.colorbar(lines, ax=ax_net, label="uplink rate [bit/s]", shrink=0.7)
    else:
        nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=star, edge_color="0.8")
    if devs:
        nx.draw_networkx_edges(graph, pos, ax=ax_net, edgelist=d2d, edge_color="tab:red", style="dashed")
        sizes = [60 + 240 * (graph.nodes[k].get("mac_rate", 1.0)
                             / max(graph.nodes[d].get("mac_rate", 1.0) for d in devs)) for k in devs]
        nx.draw_networkx_nodes(graph, pos, ax=ax_net, nodelist=devs, node_color=colours, node_size=sizes)
        nx.draw_networkx_nodes(graph, pos, ax=ax_net, nodelist=[server], node_color="black", node_shape="s",
                               node_size=400)
        if len(devs) <= 40:
            nx.draw_networkx_labels(graph, pos, ax=ax_net, labels={k: str(i) for i, k in enumerate(devs)},
                                    font_size=7)
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


def _draw_hierarchy(graph: nx.Graph, ax: Any, devs: list, server: Any, edges: list, colours: list) -> None:
    """The left panel of :func:`draw_topology` for a client-edge-cloud hierarchy
    (:func:`fednet.topologies.hierarchy.hierarchy`): the cloud on top, each edge server below it joined by its
    backhaul (labelled with its rate and latency), and each cell's devices under their edge server in a shaded box
    (devices coloured by group, sized by MAC rate; a cell sharing its airtime says so)."""
    from matplotlib.patches import FancyBboxPatch

    parent = {}
    for k in devs:
        up = [v for v in graph.neighbors(k) if v in set(edges)]
        parent[k] = up[0] if up else server
    members = {e: [k for k in devs if parent[k] == e] for e in edges}
    width = max(1, len(devs))
    pos: dict[Any, tuple[float, float]] = {server: (width / 2.0, 2.0)}
    x = 0.0
    for e in edges:
        cell = members[e]
        for j, k in enumerate(cell):
            pos[k] = (x + j + 0.5, 0.0)
        pos[e] = (x + max(len(cell), 1) / 2.0, 1.0)
        shared = cell and all(graph.nodes[k].get("cell") is not None for k in cell)
        ax.add_patch(FancyBboxPatch((x + 0.1, -0.35), max(len(cell), 1) - 0.2, 1.65, boxstyle="round,pad=0.02",
                                    facecolor="0.93", edgecolor="0.6", zorder=0))
        ax.text(x + 0.2, -0.3, f"cell {graph.nodes[e].get('cell', edges.index(e))}"
                + (" (shared air)" if shared else ""), fontsize=7, va="bottom")
        x += max(len(cell), 1)
    direct = [k for k in devs if parent[k] == server]
    for j, k in enumerate(direct):
        pos[k] = (x + j + 0.5, 0.0)
    radio = [(k, parent[k]) for k in devs]
    backhaul = [(e, server) for e in edges]
    nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=radio, edge_color="0.6")
    nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=backhaul, edge_color="tab:blue", width=2.5)
    nx.draw_networkx_edge_labels(graph, pos, ax=ax, font_size=6, edge_labels={
        (e, server): f"{graph.edges[e, server].get('uplink_bps', float('nan')):.3g} bit/s, "
                     f"{graph.edges[e, server].get('latency_s', 0.0):.3g} s" for e in edges})
    rates = [graph.nodes[k].get("mac_rate", 1.0) for k in devs]
    sizes = [60 + 240 * r / max(rates) for r in rates] if rates else []
    nx.draw_networkx_nodes(graph, pos, ax=ax, nodelist=devs, node_color=colours, node_size=sizes)
    nx.draw_networkx_nodes(graph, pos, ax=ax, nodelist=edges, node_color="tab:orange", node_shape="s", node_size=500)
    nx.draw_networkx_nodes(graph, pos, ax=ax, nodelist=[server], node_color="black", node_shape="s", node_size=600)
    labels = {e: f"edge {graph.nodes[e].get('cell', i)}" for i, e in enumerate(edges)}
    nx.draw_networkx_labels(graph, pos, ax=ax, labels=labels, font_size=7)
    nx.draw_networkx_labels(graph, pos, ax=ax, labels={server: "cloud"}, font_size=7, font_color="white")
    if len(devs) <= 40:
        nx.draw_networkx_labels(graph, pos, ax=ax, labels={k: str(i) for i, k in enumerate(devs)}, font_size=6)
    ax.set_title(f"{len(devs)} devices in {len(edges)} cells, edge servers (orange), backhaul (blue) to the cloud\n"
                 f"devices: colour = group, size = MAC rate", fontsize=9)
    ax.set_xlim(-0.2, max(x, 1.0) + len(direct) + 0.2)
    ax.set_ylim(-0.5, 2.4)
    ax.axis("off")
