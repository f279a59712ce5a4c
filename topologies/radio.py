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

``rate_model = "cqi_table"`` is LTE's table-based link adaptation: the mean SNR picks the highest CQI index whose
10 %-BLER SNR threshold it meets (:data:`CQI_SNR_DB`, :func:`cqi_for_snr`), the link's rate is that CQI's spectral
efficiency times the bandwidth, ``r = eff_CQI B`` (:data:`CQI_EFFICIENCY`: 3GPP TS 36.213, Table 7.2.3-1, the
4-bit CQI table, information bits per resource element), and every packet is lost with the BLER the thresholds are
defined at, :data:`CQI_BLER` = 0.1 (so ``bler`` must be 0.1).  The efficiency is taken as bit/s per Hz with no
deduction for reference signals, control channels or cyclic prefix: fednet's ``header_overhead`` is the only
overhead.  The thresholds are AWGN (single-antenna) link-level results at the mean SNR, with no fading margin:
under fading a real outer loop backs off the CQI to hold the BLER, which this model does not (its rates are
optimistic by that margin).  A device whose mean SNR is below CQI 1's threshold (-6.934 dB) in either direction is
out of range (CQI 0, "out of range" in the table): refused with an error naming it, its SNR and the threshold
(there is no rate to give it; shrink ``radius_m`` or ``shadowing_db``, or raise the powers).  At the defaults (500 m,
8 dB shadowing, 23 dBm, 1 MHz) about 0.3 % of devices fall below CQI 1 on the uplink: 7.5 % of 25-device draws
(400 seeds) are refused.

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

__all__ = ["PATHLOSS_MODELS", "RATE_MODELS", "BLER_MODELS", "PLACEMENTS", "CQI_EFFICIENCY", "CQI_SNR_DB", "CQI_BLER",
           "pathloss_db", "outage_probability", "rate_for_outage", "cqi_for_snr", "waterfall_bler", "radio_star"]

PATHLOSS_MODELS = ("3gpp_macro", "free_space", "power_law")
#: How a packet's loss probability follows from the link (module docstring).
BLER_MODELS = ("outage", "waterfall")
#: How devices are placed: uniform in the ring's area, or with the distance uniform on the ring's radii.
PLACEMENTS = ("area", "distance")
#: The link-adaptation models of :func:`radio_star` (module docstring).
RATE_MODELS = ("bler_target", "shannon", "cqi_table")

#: Spectral efficiency (information bits per resource element, used as bit/s/Hz) of CQI 1..15: 3GPP TS 36.213,
#: Table 7.2.3-1 (4-bit CQI table; QPSK for 1-6, 16QAM for 7-9, 64QAM for 10-15; CQI 0 is "out of range").
CQI_EFFICIENCY: tuple[float, ...] = (0.1523, 0.2344, 0.3770, 0.6016, 0.8770, 1.1758, 1.4766, 1.9141, 2.4063,
                                     2.7305, 3.3223, 3.9023, 4.5234, 5.1152, 5.5547)
#: SNR (dB) at which CQI 1..15 reach 10 % BLER in AWGN (SISO): the Vienna LTE link-level simulator's curves as
#: tabulated in the Vienna LTE System Level Simulator (v1.4 r570, ``+utils/cqiMapper.m``, ``SINR_to_CQI2``; Ikuno,
#: Wrulich, Rupp, "System level simulation of LTE networks", IEEE VTC 2010-Spring; Mehlfuehrer et al., "Simulating
#: the Long Term Evolution physical layer", EUSIPCO 2009).
CQI_SNR_DB: tuple[float, ...] = (-6.934, -5.147, -3.18, -1.254, 0.761, 2.70, 4.697, 6.528, 8.576, 10.37, 12.3,
                                 14.18, 15.89, 17.82, 19.83)
#: The block-error rate :data:`CQI_SNR_DB` is defined at (and the per-packet loss of a ``cqi_table`` link).
CQI_BLER = 0.1


def cqi_for_snr(snr_db: float) -> int:
    """The highest CQI (1..15) whose 10 %-BLER threshold :data:`CQI_SNR_DB` ``snr_db`` meets (``>=``); 0 below CQI 1.

    Parameters
    ----------
    snr_db : float
        Mean SNR in dB.

    Returns
    -------
    int
        The CQI index, 0 ("out of range", 3GPP TS 36.213 Table 7.2.3-1) below -6.934 dB.

    Raises
    ------
    ValueError
        For an SNR that is not a finite number.
    """
    if isinstance(snr_db, bool) or not isinstance(snr_db, (int, float, np.floating, np.integer)) \
            or not math.isfinite(snr_db):
        raise ValueError(f"snr_db must be a finite number of dB, got {snr_db!r}")
    return sum(1 for t in CQI_SNR_DB if snr_db >= t)


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
               n_cells: int | None = None, scheduler: str = "round_robin", header_overhead: float = 0.1,
               packet_bits: int | None = 12_000,
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
    rate_model : {"bler_target", "shannon", "cqi_table"}
        Link adaptation to the ``bler`` target, Shannon at the mean SNR less ``gap_db``, or LTE's CQI table
        (3GPP TS 36.213 Table 7.2.3-1 with 10 %-BLER thresholds; module docstring).
    bler : float
        Block-error target, in (0, 1); 0.1 (:data:`CQI_BLER`) with ``cqi_table``.
    gap_db : float
        SNR gap of the ``shannon`` model (dB).
    n_cells : int, optional
        Also share the airtime of this many cells (:func:`fednet.topologies.lte.assign_cells`).
    scheduler : {"round_robin", "proportional_fair"}
        How those cells share their airtime (:data:`fednet.sim.cells.SCHEDULERS`; proportional fair at each
        device's ``snr_up_db`` / ``snr_down_db``); needs ``n_cells`` unless round robin.
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
        Naming the offending argument and value; under ``cqi_table``, also a device out of range (below CQI 1).
    """
    if rng is None:
        raise ValueError("radio_star needs the topology's rng (positions and shadowing are drawn)")
    from fednet.sim.cells import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if scheduler != "round_robin" and n_cells is None:
        raise ValueError(f"scheduler {scheduler!r} shares the air of cells: give n_cells too")
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
    if rate_model not in RATE_MODELS:
        raise ValueError(f"rate_model must be one of {RATE_MODELS}, got {rate_model!r}")
    if not 0 < bler < 1:
        raise ValueError(f"bler must be in (0, 1), got {bler}")
    if rate_model == "cqi_table" and bler != CQI_BLER:
        raise ValueError(f"rate_model 'cqi_table' has the BLER its SNR thresholds are defined at, {CQI_BLER}; "
                         f"got bler = {bler}")
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

    def link(power_dbm: float, hz: float, interference: np.ndarray,
             what: str) -> tuple[np.ndarray, list[float], list[float]]:
        noise_dbm = noise_dbm_hz + 10 * math.log10(hz) + noise_figure_db
        if interference.any():                        # SINR = P h / (I + B N0), powers in mW
            snr_db = power_dbm - loss_db - 10 * np.log10(10 ** (noise_dbm / 10) + interference * 1e3)
        else:                                         # no interference: the operations of the SNR alone
            snr_db = power_dbm - loss_db - noise_dbm
        rates, losses = [], []
        if rate_model == "cqi_table":
            for i, x in enumerate(snr_db):
                cqi = cqi_for_snr(float(x))
                if cqi == 0:
                    raise ValueError(f"device {i} is out of range on its {what}: mean SNR {x:.2f} dB is below CQI 1's "
                                     f"threshold {CQI_SNR_DB[0]} dB (rate_model 'cqi_table'; {d[i]:.0f} m away, "
                                     f"shadowing {shadow[i]:+.1f} dB): shrink radius_m or shadowing_db, or raise "
                                     f"the transmit power")
                rates.append(CQI_EFFICIENCY[cqi - 1] * hz)
                losses.append(CQI_BLER)
            return snr_db, rates, losses
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

    snr_up, up, loss_up = link(tx_power_dbm, uplink_hz, i_up, "uplink")
    snr_down, down, loss_down = link(bs_power_dbm, downlink_hz, i_down, "downlink")
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
    return assign_cells(g, n_cells, scheduler) if n_cells is not None else g


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
