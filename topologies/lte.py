"""LTE star networks with the device heterogeneity of the CodedPaddedFL paper.

Source: Schlegel et al., Sec. VII: LTE Cat 1 links (uplink 5 Mbit/s, downlink 10 Mbit/s),
packet loss probability 0.1 with retransmission, 10 % header overhead, server 8.24e12 MAC/s;
device MAC rates for D = 25: ten at 25e6, five each at 5e6, 2.5e6 and 1.25e6 MAC/s (Sec.
VII-A); for other D drawn uniformly at random from those four rates (Sec. VII-C).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import networkx as nx
import numpy as np

__all__ = ["MAC_RATE_LEVELS", "paper_mac_rates", "lte_star", "lte_cells", "assign_cells", "energy_attributes",
           "ENERGY_KEYS", "SERVER"]

#: Device MAC rates of Sec. VII, in MAC/s.
MAC_RATE_LEVELS: tuple[float, ...] = (25e6, 5e6, 2.5e6, 1.25e6)
#: Graph key of the server node.
SERVER = "server"


def paper_mac_rates(n_devices: int, rng: np.random.Generator | None = None) -> list[float]:
    """Device MAC rates of Sec. VII.

    Parameters
    ----------
    n_devices : int
        D. For D = 25 the fixed mix of Sec. VII-A (10 x 25e6, 5 x 5e6, 5 x 2.5e6, 5 x 1.25e6);
        otherwise each rate drawn uniformly from :data:`MAC_RATE_LEVELS` (Sec. VII-C).
    rng : numpy.random.Generator, optional
        Stream for the draw (required when D != 25).

    Returns
    -------
    list of float
        MAC/s of devices 0..D-1.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be positive, got {n_devices}")
    if n_devices == 25:
        return [25e6] * 10 + [5e6] * 5 + [2.5e6] * 5 + [1.25e6] * 5
    if rng is None:
        raise ValueError(f"paper_mac_rates needs an rng to draw the rates of {n_devices} devices")
    return [float(x) for x in rng.choice(MAC_RATE_LEVELS, size=n_devices)]


def _per_device(value: float | Sequence[float], n_devices: int, name: str, ok, need: str) -> list[float]:
    vals = [float(value)] * n_devices if not isinstance(value, Sequence) else [float(v) for v in value]
    if len(vals) != n_devices:
        raise ValueError(f"{name} has {len(vals)} entries for {n_devices} devices")
    for i, v in enumerate(vals):
        if not ok(v):
            raise ValueError(f"{name} must be {need}, got {v}" if not isinstance(value, Sequence)
                             else f"{name}[{i}] must be {need}, got {v}")
    return vals


def lte_star(n_devices: int, *, uplink_bps: float | Sequence[float] = 5e6,
             downlink_bps: float | Sequence[float] = 10e6, loss: float | Sequence[float] = 0.1,
             header_overhead: float = 0.1, packet_bits: int | None = None, server_mac_rate: float = 8.24e12,
             device_mac_rates: Sequence[float] | None = None, rng: np.random.Generator | None = None,
             hop_latency_s: float = 0.0, energy: Mapping[str, float] | None = None) -> nx.Graph:
    """A star of ``n_devices`` devices around one server (the paper's defaults).

    Parameters
    ----------
    n_devices : int
        D.
    uplink_bps, downlink_bps : float or sequence of float
        Link rates in bit/s (LTE Cat 1: 5e6 and 10e6), for every device or one per device.
    loss : float or sequence of float
        Per-packet loss probability in [0, 1) (0.1), for every device or one per device.
    header_overhead : float
        Header bits as a fraction of the payload (0.1).
    packet_bits : int or None
        Packet size on the air; None sends each message as one packet (the paper's
        ``T = N b / gamma`` with one geometric N per message).
    server_mac_rate : float
        MAC/s of the server (8.24e12).
    device_mac_rates : sequence of float, optional
        MAC/s per device; default :func:`paper_mac_rates`.
    rng : numpy.random.Generator, optional
        Stream for drawn MAC rates.
    hop_latency_s : float
        Latency floor of every hop in seconds (0: the papers'). A message is delivered this long after its last
        bit, the link meanwhile free: scheduling request and grant, processing and core network. Typical values:
        about 0.01 per direction for LTE, 0.004 for 5G NR eMBB (its user-plane latency target, one way, 3GPP
        TR 38.913, Sec. 7.5).
    energy : mapping, optional
        The devices' energy model (:attr:`fednet.sim.simulation.Simulation.energy`; None: none, the papers'):
        ``tx_power_w`` and ``rx_power_w`` (W while sending / receiving; 0.2 W is 23 dBm, LTE's maximum UE power)
        and the computation's ``kappa`` (effective switched capacitance, J/(cycle Hz^2); 1e-28 in Yang et al.,
        "Energy efficient federated learning over wireless communication networks", IEEE TWC 2021), ``cpu_hz``
        (the CPU frequency ``f``) and ``cycles_per_mac`` (1): ``kappa f^2`` joules per cycle.

    Returns
    -------
    networkx.Graph
        Devices ``0..D-1`` (``role="device"``, ``mac_rate``) and ``"server"``; each edge has
        ``uplink_bps``, ``downlink_bps``, ``loss``; the graph has ``header_overhead``, ``packet_bits`` and
        ``hop_latency_s``.

    Raises
    ------
    ValueError
        Naming the offending argument and value.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be positive, got {n_devices}")
    if not server_mac_rate > 0:
        raise ValueError(f"server_mac_rate must be positive, got {server_mac_rate}")
    ups = _per_device(uplink_bps, n_devices, "uplink_bps", lambda v: v > 0, "positive")
    downs = _per_device(downlink_bps, n_devices, "downlink_bps", lambda v: v > 0, "positive")
    losses = _per_device(loss, n_devices, "loss", lambda v: 0.0 <= v < 1.0, "in [0, 1)")
    if not header_overhead >= 0:
        raise ValueError(f"header_overhead must be >= 0, got {header_overhead}")
    if packet_bits is not None and packet_bits <= 0:
        raise ValueError(f"packet_bits must be positive or None, got {packet_bits}")
    rates = list(device_mac_rates) if device_mac_rates is not None else paper_mac_rates(n_devices, rng)
    if len(rates) != n_devices:
        raise ValueError(f"device_mac_rates has {len(rates)} entries for {n_devices} devices")
    for i, r in enumerate(rates):
        if not r > 0:
            raise ValueError(f"device_mac_rates[{i}] must be positive, got {r}")
    if not (math.isfinite(hop_latency_s) and hop_latency_s >= 0):
        raise ValueError(f"hop_latency_s must be finite and >= 0 seconds, got {hop_latency_s}")
    g = nx.Graph(header_overhead=float(header_overhead), packet_bits=packet_bits, hop_latency_s=float(hop_latency_s))
    g.add_node(SERVER, role="server", mac_rate=float(server_mac_rate))
    model = energy_attributes(energy)
    for i, r in enumerate(rates):
        g.add_node(i, role="device", mac_rate=float(r), **model)
        g.add_edge(i, SERVER, uplink_bps=ups[i], downlink_bps=downs[i], loss=losses[i])
    return g


#: The keys of an energy model (:func:`lte_star`'s ``energy``) and their defaults.
ENERGY_KEYS = {"tx_power_w": 0.2, "rx_power_w": 0.1, "kappa": 1e-28, "cpu_hz": 1e9, "cycles_per_mac": 1.0}


def energy_attributes(energy: Mapping[str, float] | None) -> dict[str, float]:
    """The node attributes of an energy model: ``tx_power_w``, ``rx_power_w``, ``j_per_mac = kappa f^2 c`` ({} for
    None); missing keys take :data:`ENERGY_KEYS`' defaults.

    Raises
    ------
    ValueError
        For an unknown key or a negative or non-finite value.
    """
    if energy is None:
        return {}
    unknown = sorted(set(energy) - set(ENERGY_KEYS))
    if unknown:
        raise ValueError(f"energy takes {sorted(ENERGY_KEYS)}, got unknown {unknown}")
    v = {**ENERGY_KEYS, **{k: float(x) for k, x in energy.items()}}
    for k, x in v.items():
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"energy.{k} must be finite and >= 0, got {x}")
    return {"tx_power_w": v["tx_power_w"], "rx_power_w": v["rx_power_w"],
            "j_per_mac": v["kappa"] * v["cpu_hz"] ** 2 * v["cycles_per_mac"]}


def lte_cells(n_devices: int, *, n_cells: int = 1, uplink_bps: float | Sequence[float] = 5e6,
              downlink_bps: float | Sequence[float] = 10e6, loss: float | Sequence[float] = 0.1,
              header_overhead: float = 0.1, packet_bits: int | None = None, server_mac_rate: float = 8.24e12,
              device_mac_rates: Sequence[float] | None = None, scheduler: str = "round_robin",
              snr_db: float | Sequence[float] | None = None, rng: np.random.Generator | None = None,
              hop_latency_s: float = 0.0, energy: Mapping[str, float] | None = None) -> nx.Graph:
    """:func:`lte_star` whose devices share the airtime of ``n_cells`` cells (:mod:`fednet.sim.cells`).

    Device ``i`` is in cell ``i * n_cells // n_devices`` (consecutive blocks). Each device's ``uplink_bps`` /
    ``downlink_bps`` is the rate it has when alone in its cell; the transfers in progress in a cell share its
    uplink (and, apart, its downlink) by equal airtime (``scheduler = "round_robin"``), so ``n`` devices uploading
    at once each get ``1/n`` of their rate, or by proportional fair (``"proportional_fair"``): ``G_n(snr) / n`` of
    it, ``G_n`` the multi-user diversity gain at the device's mean SNR (:func:`fednet.sim.cells.pf_gain`), which
    ``snr_db`` then gives.  With one device per cell this is the star.

    Parameters
    ----------
    n_devices, uplink_bps, downlink_bps, loss, header_overhead, packet_bits, server_mac_rate, device_mac_rates, rng,
    hop_latency_s, energy
        As :func:`lte_star`.
    n_cells : int
        Cells (``1 <= n_cells <= n_devices``).
    scheduler : {"round_robin", "proportional_fair"}
        How a cell shares its airtime (:data:`fednet.sim.cells.SCHEDULERS`).
    snr_db : float or sequence of float, optional
        Mean SNR (dB) of each device's uplink and downlink, for every device or one per device: required by
        ``"proportional_fair"`` (the star's links have rates but no channel), ignored by round robin
        (:func:`assign_cells`).

    Returns
    -------
    networkx.Graph
        :func:`lte_star`'s graph, each device with a ``cell`` attribute (and ``snr_up_db`` / ``snr_down_db`` where
        ``snr_db`` is given), the graph with ``cell_scheduler``.

    Raises
    ------
    ValueError
        Naming the offending argument and value.
    """
    if not 1 <= n_cells <= n_devices:          # checked before any rate is drawn
        raise ValueError(f"n_cells must be in [1, n_devices = {n_devices}], got {n_cells}")
    _check_scheduler(scheduler, snr_db, n_devices)
    g = lte_star(n_devices, uplink_bps=uplink_bps, downlink_bps=downlink_bps, loss=loss,
                 header_overhead=header_overhead, packet_bits=packet_bits, server_mac_rate=server_mac_rate,
                 device_mac_rates=device_mac_rates, rng=rng, hop_latency_s=hop_latency_s, energy=energy)
    return assign_cells(g, n_cells, scheduler, snr_db)


def _check_scheduler(scheduler: str, snr_db: float | Sequence[float] | None, n_devices: int) -> list[float] | None:
    """``scheduler`` checked against :data:`fednet.sim.cells.SCHEDULERS`, ``snr_db`` made one finite dB per device.

    Raises
    ------
    ValueError
        For an unknown scheduler, or an ``snr_db`` of the wrong length or not finite.
    """
    from fednet.sim.cells import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if snr_db is None:
        return None
    if isinstance(snr_db, bool) or not isinstance(snr_db, (int, float, Sequence, np.ndarray)) \
            or isinstance(snr_db, str):
        raise ValueError(f"snr_db must be a number of dB or one per device, got {snr_db!r}")
    return _per_device(snr_db, n_devices, "snr_db", math.isfinite, "a finite number of dB")


def assign_cells(g: nx.Graph, n_cells: int, scheduler: str = "round_robin",
                 snr_db: float | Sequence[float] | None = None) -> nx.Graph:
    """Put the devices of a star in ``n_cells`` cells, consecutive blocks (:func:`lte_cells`); returns ``g``.

    Parameters
    ----------
    g : networkx.Graph
        A star (devices ``role="device"``).
    n_cells : int
        Cells, in ``[1, D]``.
    scheduler : {"round_robin", "proportional_fair"}
        How a cell shares its airtime (:data:`fednet.sim.cells.SCHEDULERS`), the graph's ``cell_scheduler``.
    snr_db : float or sequence of float, optional
        Mean SNR (dB) written as each device's ``snr_up_db`` and ``snr_down_db`` (one value, or one per device in
        graph order). ``"proportional_fair"`` needs every device to have them, from here or already (as
        :func:`fednet.topologies.radio.radio_star` sets them).

    Raises
    ------
    ValueError
        For ``n_cells`` outside ``[1, D]``, an unknown ``scheduler``, a bad ``snr_db``, or a proportional-fair cell
        whose devices have no mean SNR.
    """
    devices = [v for v, a in g.nodes(data=True) if a.get("role") == "device"]
    if not 1 <= n_cells <= len(devices):
        raise ValueError(f"n_cells must be in [1, n_devices = {len(devices)}], got {n_cells}")
    snrs = _check_scheduler(scheduler, snr_db, len(devices))
    if snrs is not None:
        for v, s in zip(devices, snrs):
            g.nodes[v]["snr_up_db"] = g.nodes[v]["snr_down_db"] = s
    if scheduler == "proportional_fair":
        lacking = [v for v in devices if "snr_up_db" not in g.nodes[v] or "snr_down_db" not in g.nodes[v]]
        if lacking:
            raise ValueError(f"scheduler 'proportional_fair' needs each device's mean SNR, and device {lacking[0]!r} "
                             f"has none: give snr_db (dB, one value or one per device), or use radio_star, whose "
                             f"devices have one")
    g.graph["cell_scheduler"] = scheduler
    for i, v in enumerate(devices):
        g.nodes[v]["cell"] = i * n_cells // len(devices)
    return g
