"""Geometry and channel: devices placed around a base station, rates and losses from path loss and fading
(issue 28, items 1-2, first part).

Each device is placed uniformly in a disc (or a ring ``[min_distance_m, radius_m]``) around the base station, its
mean SNR follows from a named path-loss model with log-normal shadowing, transmit power, noise density, noise
figure and bandwidth, and its link from **link adaptation to a block-error target under Rayleigh block fading**:
with the channel gain ``|h|^2 ~ Exp(1)`` drawn anew for every packet (transmission), a packet sent at rate ``r`` over
bandwidth ``B`` is lost when ``B log2(1 + SNR |h|^2) < r``, which happens with probability

    ``q(r) = 1 - exp(-(2^(r / B) - 1) / SNR)``                        (the Rayleigh outage probability)

so the rate that meets a target ``q`` is ``r = B log2(1 + SNR ln(1 / (1 - q)))`` and every packet is lost
(retransmitted by HARQ) with probability ``q``, independently: exactly fednet's per-packet loss model
(:func:`fednet.sim.network.transmission_time`).  ``rate_model = "shannon"`` instead sends at ``B log2(1 + SNR /
gap)`` (the mean-SNR capacity less a gap) and loses each packet with its outage probability ``q(r)``.

Path-loss models (``d`` in km, dB): ``"3gpp_macro"``: ``128.1 + 37.6 log10 d`` (3GPP TR 36.814, Table A.2.1.1.2-3,
urban macro at 2 GHz; used by Chen et al., IEEE TWC 2021, and Yang et al., IEEE TWC 2021); ``"free_space"`` at
``carrier_hz``; ``"power_law"``: ``10 alpha log10 d[m]`` (gain ``d^-alpha``, 0 dB at 1 m, ``alpha =
pathloss_exponent``; the ``h = d^-2`` of Chen et al.'s published simulation code).  Positions and shadowing come from
the topology's keyed stream, so every protocol compared at a seed sees the same channels.

**Interference and the waterfall BLER model.**  ``interference_w`` (uplink) and ``downlink_interference_w`` add a
received interference power ``I`` (W) to the noise ``B N0``, so the link's SINR is ``P h / (I + B N0)``.  With
``bler_model = "waterfall"`` a packet is lost with Chen et al.'s packet error rate (Chen, Yang, Saad, Yin, Poor, Cui,
"A joint learning and communications framework for federated learning over wireless networks", IEEE TWC 20(1), 2021:
the packet error rate of a user on a resource block, as the authors' published simulation code computes it,
github.com/mzchen0/Wireless-FL, ``FLMIN.m``, with ``m = 1.08``; studies/radio_validation.toml checks fednet against it)

    ``q = 1 - exp(-m (I + B N0) / (P h))``                            (``m``: the waterfall threshold)

whatever the rate: the Rayleigh outage of a packet that needs an SINR of ``m`` (``q = outage_probability(r, B,
SINR)`` at ``2^(r/B) - 1 = m``).  It goes with ``rate_model = "shannon"`` (the paper's ``c = B log2(1 + SINR)``).
``downlink_lossless`` delivers every downlink packet at the first try (the paper's error-free broadcast).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import networkx as nx
import numpy as np

from .lte import SERVER, assign_cells, lte_star

__all__ = ["PATHLOSS_MODELS", "BLER_MODELS", "PLACEMENTS", "pathloss_db", "outage_probability", "rate_for_outage",
           "waterfall_bler", "radio_star"]

PATHLOSS_MODELS = ("3gpp_macro", "free_space", "power_law")
#: How a packet's loss probability follows from the link (module docstring).
BLER_MODELS = ("outage", "waterfall")
#: How devices are placed: uniform in the ring's area, or with the distance uniform on the ring's radii.
PLACEMENTS = ("area", "distance")


def pathloss_db(d_m: np.ndarray, model: str = "3gpp_macro", carrier_hz: float = 2e9,
                exponent: float = 2.0) -> np.ndarray:
    """Path loss in dB at distances ``d_m`` (metres) under a named model (module docstring); ``exponent`` is
    ``"power_law"``'s ``alpha``.

    Raises
    ------
    ValueError
        For an unknown model or a distance that is not positive.
    """
    d = np.asarray(d_m, dtype=np.float64)
    if np.any(~(d > 0)):
        raise ValueError("distances must be positive metres")
    if model == "3gpp_macro":
        return 128.1 + 37.6 * np.log10(d / 1000.0)
    if model == "free_space":
        return 20 * np.log10(d) + 20 * np.log10(carrier_hz) - 147.55
    if model == "power_law":
        return 10.0 * exponent * np.log10(d)
    raise ValueError(f"pathloss model must be one of {PATHLOSS_MODELS}, got {model!r}")


def outage_probability(rate_bps: float, bandwidth_hz: float, snr: float) -> float:
    """``1 - exp(-(2^(r/B) - 1) / SNR)``: the probability that a Rayleigh-faded packet at rate ``r`` is lost."""
    return -math.expm1(-math.expm1(rate_bps / bandwidth_hz * math.log(2.0)) / snr)


def rate_for_outage(target: float, bandwidth_hz: float, snr: float) -> float:
    """The rate (bit/s) whose Rayleigh outage probability is ``target``: ``B log2(1 + SNR ln(1 / (1 - target)))``."""
    return bandwidth_hz * math.log2(1.0 + snr * -math.log1p(-target))


def waterfall_bler(sinr: float, m: float) -> float:
    """Chen et al.'s packet error rate ``q = 1 - exp(-m (I + B N0) / (P h)) = 1 - exp(-m / SINR)`` (module docstring;
    IEEE TWC 2021), ``m`` the waterfall threshold (linear), ``sinr`` linear; dimensionless probability."""
    return -math.expm1(-m / sinr)


def radio_star(n_devices: int, *, radius_m: float = 500.0, min_distance_m: float = 35.0,
               pathloss: str = "3gpp_macro", shadowing_db: float = 8.0, carrier_hz: float = 2e9,
               tx_power_dbm: float = 23.0, bs_power_dbm: float = 46.0, noise_dbm_hz: float = -174.0,
               noise_figure_db: float = 9.0, uplink_hz: float = 1e6, downlink_hz: float = 1e6,
               rate_model: str = "bler_target", bler: float = 0.1, gap_db: float = 0.0,
               n_cells: int | None = None, header_overhead: float = 0.1, packet_bits: int | None = 12_000,
               server_mac_rate: float = 8.24e12, device_mac_rates: list[float] | None = None,
               hop_latency_s: float = 0.0, energy: Mapping[str, float] | None = None,
               pathloss_exponent: float = 2.0, placement: str = "area", distances_m: Sequence[float] | None = None,
               interference_w: float | Sequence[float] = 0.0, downlink_interference_w: float | Sequence[float] = 0.0,
               bler_model: str = "outage", waterfall_m: float = 1.0, downlink_lossless: bool = False,
               rng: np.random.Generator | None = None) -> nx.Graph:
    """A star whose devices' rates and packet losses come from their places and the channel (module docstring).

    Parameters
    ----------
    n_devices : int
    radius_m, min_distance_m : float
        Devices uniform (in area) in the ring between these distances from the base station (metres).
    pathloss : {"3gpp_macro", "free_space", "power_law"}
    shadowing_db : float
        Standard deviation of log-normal shadowing (dB; 8 in TR 36.814).
    carrier_hz : float
        Carrier frequency (free space only).
    tx_power_dbm, bs_power_dbm : float
        Device and base-station transmit powers (23 and 46 dBm).
    noise_dbm_hz, noise_figure_db : float
        Thermal noise density (-174 dBm/Hz) and receiver noise figure (9 dB).
    uplink_hz, downlink_hz : float
        Bandwidth of each device's uplink and downlink (Hz).
    rate_model : {"bler_target", "shannon"}
        Link adaptation to the ``bler`` target, or Shannon at the mean SNR less ``gap_db`` (module docstring).
    bler : float
        Block-error target, in (0, 1).
    gap_db : float
        SNR gap of the ``shannon`` model (dB).
    n_cells : int, optional
        Also share the airtime of this many cells (:func:`fednet.topologies.lte.assign_cells`).
    header_overhead, packet_bits, server_mac_rate, device_mac_rates, hop_latency_s, energy
        As :func:`fednet.topologies.lte.lte_star` (packets of 12,000 bits, LTE's 1,500 bytes, by default:
        the losses are per packet).
    pathloss_exponent : float
        ``alpha`` of ``"power_law"`` (2: Chen et al.'s code).
    placement : {"area", "distance"}
        Uniform in the ring's area (a uniform drop), or the distance uniform on ``[min_distance_m, radius_m]``
        (Chen et al.'s code draws ``d = 500 U(0, 1)`` m).
    distances_m : sequence of float, optional
        Explicit distances (metres, positive), one per device, instead of a drawn placement.
    interference_w, downlink_interference_w : float or sequence of float
        Received interference power at the base station (uplink) and at the device (downlink), W, for every
        device or one per device (0: none; Chen et al.'s code: 1e-8 to 1.1e-7 W over the uplink RBs, 1.8e-7 W
        on the downlink).
    bler_model : {"outage", "waterfall"}
        A packet's loss probability: the Rayleigh outage at the chosen rate, or Chen et al.'s waterfall
        ``1 - exp(-m / SINR)`` (module docstring; needs ``rate_model = "shannon"``).
    waterfall_m : float
        The waterfall threshold ``m`` (linear, positive; 1.08 in Chen et al.'s code).
    downlink_lossless : bool
        Deliver every downlink packet (loss 0), as Chen et al. assume for the base station's broadcast.
    rng : numpy.random.Generator
        The topology's stream (positions, shadowing, drawn MAC rates).

    Returns
    -------
    networkx.Graph
        :func:`~fednet.topologies.lte.lte_star`'s graph, each device with ``distance_m``, ``x_m``, ``y_m`` (the
        base station at the origin), ``snr_up_db`` and ``snr_down_db``.

    Raises
    ------
    ValueError
        Naming the offending argument and value.
    """
    if rng is None:
        raise ValueError("radio_star needs the topology's rng (positions and shadowing are drawn)")
    for name, v in (("radius_m", radius_m), ("min_distance_m", min_distance_m), ("shadowing_db", shadowing_db),
                    ("carrier_hz", carrier_hz), ("tx_power_dbm", tx_power_dbm), ("bs_power_dbm", bs_power_dbm),
                    ("noise_dbm_hz", noise_dbm_hz), ("noise_figure_db", noise_figure_db), ("uplink_hz", uplink_hz),
                    ("downlink_hz", downlink_hz), ("bler", bler), ("gap_db", gap_db)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if shadowing_db < 0:
        raise ValueError(f"shadowing_db is a standard deviation (dB) and must be >= 0, got {shadowing_db}")
    if not 0 < min_distance_m < radius_m:
        raise ValueError(f"need 0 < min_distance_m < radius_m, got {min_distance_m} and {radius_m}")
    if rate_model not in ("bler_target", "shannon"):
        raise ValueError(f"rate_model must be 'bler_target' or 'shannon', got {rate_model!r}")
    if not 0 < bler < 1:
        raise ValueError(f"bler must be in (0, 1), got {bler}")
    for name, v in (("uplink_hz", uplink_hz), ("downlink_hz", downlink_hz)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if bler_model not in BLER_MODELS:
        raise ValueError(f"bler_model must be one of {BLER_MODELS}, got {bler_model!r}")
    if bler_model == "waterfall" and rate_model != "shannon":
        raise ValueError(f"bler_model = 'waterfall' sets the losses whatever the rate: it needs rate_model = "
                         f"'shannon', got {rate_model!r}")
    if isinstance(waterfall_m, bool) or not isinstance(waterfall_m, (int, float)) or not 0 < waterfall_m < math.inf:
        raise ValueError(f"waterfall_m must be a positive finite number, got {waterfall_m!r}")
    if isinstance(pathloss_exponent, bool) or not isinstance(pathloss_exponent, (int, float)) \
            or not 0 < pathloss_exponent < math.inf:
        raise ValueError(f"pathloss_exponent must be a positive finite number, got {pathloss_exponent!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    i_up = _watts(interference_w, n_devices, "interference_w")
    i_down = _watts(downlink_interference_w, n_devices, "downlink_interference_w")
    if distances_m is not None:
        d = np.array([float(x) for x in distances_m], dtype=np.float64)
        if d.shape != (n_devices,):
            raise ValueError(f"distances_m has {d.size} entries for {n_devices} devices")
        if not np.all(np.isfinite(d) & (d > 0)):
            raise ValueError(f"distances_m must be positive finite metres, got {distances_m!r}")
    elif placement == "area":
        r2 = rng.uniform(min_distance_m ** 2, radius_m ** 2, n_devices)
        d = np.sqrt(r2)
    else:
        d = rng.uniform(min_distance_m, radius_m, n_devices)
    shadow = rng.normal(0.0, shadowing_db, n_devices) if shadowing_db > 0 else np.zeros(n_devices)
    loss_db = pathloss_db(d, pathloss, carrier_hz, pathloss_exponent) + shadow

    def link(power_dbm: float, hz: float, interference: np.ndarray) -> tuple[np.ndarray, list[float], list[float]]:
        noise_dbm = noise_dbm_hz + 10 * math.log10(hz) + noise_figure_db
        if interference.any():                        # SINR = P h / (I + B N0), powers in mW
            snr_db = power_dbm - loss_db - 10 * np.log10(10 ** (noise_dbm / 10) + interference * 1e3)
        else:                                         # no interference: the operations of the SNR alone
            snr_db = power_dbm - loss_db - noise_dbm
        rates, losses = [], []
        for s in 10 ** (snr_db / 10):
            if rate_model == "bler_target":
                r = rate_for_outage(bler, hz, float(s))
            else:
                r = hz * math.log2(1.0 + float(s) / 10 ** (gap_db / 10))
            rates.append(max(r, 1.0))
            q = waterfall_bler(float(s), waterfall_m) if bler_model == "waterfall" \
                else outage_probability(rates[-1], hz, float(s))
            losses.append(min(q, 0.999))
        return snr_db, rates, losses

    snr_up, up, loss_up = link(tx_power_dbm, uplink_hz, i_up)
    snr_down, down, loss_down = link(bs_power_dbm, downlink_hz, i_down)
    if downlink_lossless:
        loss_down = [0.0] * n_devices
    g = lte_star(n_devices, uplink_bps=up, downlink_bps=down, loss=loss_up, header_overhead=header_overhead,
                 packet_bits=packet_bits, server_mac_rate=server_mac_rate, device_mac_rates=device_mac_rates,
                 rng=rng, hop_latency_s=hop_latency_s, energy=energy)
    angle = rng.uniform(0.0, 2 * math.pi, n_devices)           # where around the base station (for drawing)
    for i in range(n_devices):
        g.nodes[i].update(distance_m=float(d[i]), snr_up_db=float(snr_up[i]), snr_down_db=float(snr_down[i]),
                          x_m=float(d[i] * math.cos(angle[i])), y_m=float(d[i] * math.sin(angle[i])))
        edge = g.edges[i, SERVER]
        edge["uplink_loss"], edge["downlink_loss"] = loss_up[i], loss_down[i]
    return assign_cells(g, n_cells) if n_cells is not None else g


def _watts(value: float | Sequence[float], n_devices: int, name: str) -> np.ndarray:
    """A power per device (W, finite, >= 0) from one value or one per device."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        vals = [float(value)] * n_devices
    elif isinstance(value, Sequence) and not isinstance(value, str):
        vals = [float(v) for v in value]
        if len(vals) != n_devices:
            raise ValueError(f"{name} has {len(vals)} entries for {n_devices} devices")
    else:
        raise ValueError(f"{name} must be a number of watts or one per device, got {value!r}")
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"{name} must be finite watts >= 0, got {value!r}")
    return np.array(vals, dtype=np.float64)
