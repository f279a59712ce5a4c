"""Client-edge-cloud hierarchies: cells, each with an edge server, and a cloud server behind a backhaul (issue 28,
item 5).

Model (the smallest one that separates the two tiers; :mod:`fednet.sim.simulation` for the routing):

* ``n_cells`` cells of consecutive devices (device ``i`` in cell ``i * n_cells // D``, as
  :func:`~fednet.topologies.lte.lte_cells`). Each cell has an **edge server** (graph node ``("edge", c)``,
  ``role="edge"``, at the cell's base station) and every device of the cell is linked to it -- not to the cloud --
  by the LTE links of the papers' star (``uplink_bps``, ``downlink_bps``, ``loss``; Schlegel et al., Sec. VII: 5 and
  10 Mbit/s, 10 % packet loss, 10 % headers). With ``shared_air`` (the default) the devices of a cell share its
  uplink and downlink airtime by equal shares (processor sharing, :mod:`fednet.sim.cells`): ``n`` devices uploading
  at once each get ``1/n`` of their rate (``scheduler = "proportional_fair"``: ``G_n(snr) / n`` of it, at the
  devices' mean SNR ``snr_db``); ``shared_air = False`` gives each device its own full-rate link.
* Each edge server reaches the **cloud** (the graph's ``"server"``) over a **backhaul**: a full-duplex link of
  ``backhaul_bps`` each way, per-packet loss ``backhaul_loss`` and a one-way latency ``backhaul_latency_s`` (a
  message is delivered that long after its last bit, the link meanwhile free).
* MAC rates: devices as the papers' (:func:`~fednet.topologies.lte.paper_mac_rates`, drawn from ``rng`` for
  D != 25: the same rates as :func:`~fednet.topologies.lte.lte_star` at a seed), the cloud ``server_mac_rate``
  (8.24e12 MAC/s, Sec. VII) and each edge server ``edge_mac_rate``.

Defaults of the backhaul and the edge servers, and where they come from. Liu et al. (ICC 2020) time their
experiments with abstract per-iteration latencies and fix no rates; these values are fednet's assumptions, stated so
that a study can change them: a 1 Gbit/s backhaul each way (a Gigabit Ethernet / fibre link of a cell site, IEEE
802.3), no loss (a wired link with its own retransmission below IP), a 10 ms one-way latency (the order of a
metropolitan path from a cell site to a data centre; 5 ms of it is 1,000 km of fibre at 2e8 m/s), and an edge server
as fast as the papers' server (8.24e12 MAC/s: an edge aggregation is a weighted sum of the cell's models, whose time
is negligible at any server-class rate). With one cell, no shared air, and a backhaul far faster than the radio,
devices see the star of the papers plus one backhaul hop each way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import networkx as nx
import numpy as np

from .lte import SERVER, _check_scheduler, lte_star

__all__ = ["hierarchy", "edge_key", "BACKHAUL_BPS", "BACKHAUL_LATENCY_S", "EDGE_MAC_RATE"]

#: Default backhaul rate each way, bit/s (module docstring: an assumption, Gigabit Ethernet).
BACKHAUL_BPS = 1e9
#: Default one-way backhaul latency, simulated seconds (module docstring: an assumption).
BACKHAUL_LATENCY_S = 0.01
#: Default MAC rate of an edge server, MAC/s (the papers' server, Schlegel et al. Sec. VII).
EDGE_MAC_RATE = 8.24e12


def edge_key(cell: int) -> tuple[str, int]:
    """The graph key of cell ``cell``'s edge server: ``("edge", cell)``."""
    return ("edge", int(cell))


def hierarchy(n_devices: int, *, n_cells: int = 2, uplink_bps: float | Sequence[float] = 5e6,
              downlink_bps: float | Sequence[float] = 10e6, loss: float | Sequence[float] = 0.1,
              header_overhead: float = 0.1, packet_bits: int | None = None, server_mac_rate: float = 8.24e12,
              edge_mac_rate: float = EDGE_MAC_RATE, device_mac_rates: Sequence[float] | None = None,
              backhaul_bps: float = BACKHAUL_BPS, backhaul_latency_s: float = BACKHAUL_LATENCY_S,
              backhaul_loss: float = 0.0, shared_air: bool = True, scheduler: str = "round_robin",
              snr_db: float | Sequence[float] | None = None, rng: np.random.Generator | None = None,
              hop_latency_s: float = 0.0, energy: Mapping[str, float] | None = None) -> nx.Graph:
    """Devices in ``n_cells`` cells, each cell with an edge server, the edge servers behind a backhaul to the cloud.

    Parameters
    ----------
    n_devices : int
        D.
    n_cells : int
        Cells, each with its edge server (``1 <= n_cells <= n_devices``); device ``i`` is in cell
        ``i * n_cells // D`` (consecutive blocks).
    uplink_bps, downlink_bps, loss, header_overhead, packet_bits, server_mac_rate, device_mac_rates, rng,
    hop_latency_s, energy
        As :func:`~fednet.topologies.lte.lte_star`: the devices' radio links (now to their edge server), the cloud's
        MAC rate, the devices' MAC rates.
    edge_mac_rate : float
        MAC/s of every edge server (8.24e12; module docstring).
    backhaul_bps : float
        Rate of each backhaul, each way, bit/s (1e9; module docstring).
    backhaul_latency_s : float
        One-way latency of a backhaul message after its last bit, simulated seconds (0.01; module docstring).
    backhaul_loss : float
        Per-packet loss probability on the backhaul, in [0, 1) (0).
    shared_air : bool
        The devices of a cell share its airtime (True; :mod:`fednet.sim.cells`), or each has its own link.
    scheduler : {"round_robin", "proportional_fair"}
        How a cell shares its airtime (:data:`fednet.sim.cells.SCHEDULERS`; proportional fair:
        :class:`fednet.sim.cells.ProportionalFairAir`).
    snr_db : float or sequence of float, optional
        Mean SNR (dB) of each device's uplink and downlink (``snr_up_db`` / ``snr_down_db``), one value or one per
        device: required by ``"proportional_fair"`` with ``shared_air`` (:func:`~fednet.topologies.lte.assign_cells`).

    Returns
    -------
    networkx.Graph
        Devices ``0..D-1`` (``role="device"``, ``mac_rate``, ``cell``; linked to their edge server with
        ``uplink_bps``, ``downlink_bps``, ``loss``), edge servers ``("edge", c)`` (``role="edge"``, ``mac_rate``,
        ``cell``; linked to ``"server"`` with ``uplink_bps = downlink_bps = backhaul_bps``, ``loss``,
        ``latency_s``) and the cloud ``"server"``; the graph has ``header_overhead``, ``packet_bits``,
        ``hop_latency_s``, ``cell_scheduler`` and ``hierarchy = True``.

    Raises
    ------
    ValueError
        Naming the offending argument and value.
    """
    if isinstance(n_cells, bool) or not isinstance(n_cells, (int, np.integer)) or not 1 <= n_cells <= n_devices:
        raise ValueError(f"n_cells must be an integer in [1, n_devices = {n_devices}], got {n_cells!r}")
    for name, v in (("edge_mac_rate", edge_mac_rate), ("backhaul_bps", backhaul_bps)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite positive number, got {v!r}")
    if not (isinstance(backhaul_latency_s, (int, float)) and math.isfinite(backhaul_latency_s)
            and backhaul_latency_s >= 0):
        raise ValueError(f"backhaul_latency_s must be finite and >= 0 seconds, got {backhaul_latency_s!r}")
    if not (isinstance(backhaul_loss, (int, float)) and 0.0 <= backhaul_loss < 1.0):
        raise ValueError(f"backhaul_loss must be in [0, 1), got {backhaul_loss!r}")
    if not isinstance(shared_air, bool):
        raise ValueError(f"shared_air must be true or false, got {shared_air!r}")
    snrs = _check_scheduler(scheduler, snr_db, n_devices)
    if scheduler == "proportional_fair" and shared_air and snrs is None:
        raise ValueError("scheduler 'proportional_fair' needs each device's mean SNR: give snr_db (dB, one value or "
                         "one per device)")
    star = lte_star(n_devices, uplink_bps=uplink_bps, downlink_bps=downlink_bps, loss=loss,
                    header_overhead=header_overhead, packet_bits=packet_bits, server_mac_rate=server_mac_rate,
                    device_mac_rates=device_mac_rates, rng=rng, hop_latency_s=hop_latency_s, energy=energy)
    g = nx.Graph(**star.graph, cell_scheduler=scheduler, hierarchy=True)
    g.add_node(SERVER, **star.nodes[SERVER])
    for c in range(int(n_cells)):
        g.add_node(edge_key(c), role="edge", mac_rate=float(edge_mac_rate), cell=c)
        g.add_edge(edge_key(c), SERVER, uplink_bps=float(backhaul_bps), downlink_bps=float(backhaul_bps),
                   loss=float(backhaul_loss), latency_s=float(backhaul_latency_s))
    for i in range(n_devices):
        c = i * int(n_cells) // n_devices
        attrs = dict(star.nodes[i])
        if shared_air:
            attrs["cell"] = c
        if snrs is not None:
            attrs["snr_up_db"] = attrs["snr_down_db"] = snrs[i]
        g.add_node(i, **attrs, edge=c)
        g.add_edge(i, edge_key(c), **star.edges[i, SERVER])
    return g
