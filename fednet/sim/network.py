"""Messages and links: sizes, rates, header overhead, packet loss with retransmission.

Model (DESIGN.md "Links"; CodedPaddedFL paper Sec. III-B): every device has its own
full-duplex, orthogonal link to the server, an uplink and a downlink, each a FIFO resource
(messages on one link queue; links of different devices never interfere). A message of
``b = n_elements * element_bits`` payload bits occupies the link for

    T = b (1 + h) / gamma * (n + X) / n,

with ``h`` the header overhead (a fraction), ``gamma`` the link rate in bit/s, ``n =
ceil(b (1 + h) / packet_bits)`` packets (one packet when ``packet_bits`` is None, which is the
paper's per-message geometric model ``T = N b / gamma``) and ``X ~ NegBin(n, 1 - p)`` the
retransmissions (a sum of ``n`` geometric tries minus ``n``), sampled in one draw from the keyed
uniform of (node, "uplink"/"downlink", round). Device-to-device messages are relayed through the
server: the whole message is uploaded, then downloaded (store and forward) -- unless the topology
has a direct device-to-device edge between the two, whose link then carries it in one hop (keyed
uniform of (sender, "d2d", round); :mod:`fednet.sim.simulation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from .rng import _nb_cdf, negative_binomial_from_uniform
from .stamp import Stamped

__all__ = ["Message", "Link", "transmission_time", "negative_binomials_from_uniforms"]


@dataclass(eq=False)
class Message:
    """A payload travelling between nodes.

    Attributes
    ----------
    src, dst : int
        Node indices (devices ``0..D-1``, the server ``D``).
    kind : str
        What the message carries (``"model"``, ``"gradient"``, ``"share"``...), for traces and views.
    payload : Any
        The data itself (kept by reference; the receiver's view holds it).
    n_elements : int
        Number of numbers carried.
    element_bits : int
        Width of one number in bits (32 for float32, 48 for ``Q<48,24>``, ceil(log2 q) for GF(q)).
    round : int
        Round whose keyed draws decide the message's losses.
    sent_at, delivered_at : float
        Simulated seconds.
    encrypted : bool
        End-to-end encrypted for its final recipient: a server that relays it sees only its size
        and endpoints (it lands in the server's ``relayed`` list, not its ``view``). Every
        device-to-device message is encrypted (Schlegel et al., Sec. III-B); a protocol may also
        mark messages it sends to the server for forwarding.
    timing_key : str
        Suffix of the keyed draws deciding the message's losses: ``""`` (default) uses
        ``(device, "uplink" / "downlink", round)``; a message only some protocols send (mask shares,
        say) names its own key, drawing from ``"uplink:<key>"`` / ``"downlink:<key>"``, so that the
        model download and the gradient upload of every protocol take the same draws (paired).
    """

    src: int
    dst: int
    kind: str
    payload: Any
    n_elements: int
    element_bits: int
    round: int = 0
    encrypted: bool = False
    timing_key: str = ""
    sent_at: float = math.nan
    delivered_at: float = math.nan
    hops: list[tuple[str, int, float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.n_elements < 0:
            raise ValueError(f"n_elements must be >= 0, got {self.n_elements}")
        if self.element_bits <= 0:
            raise ValueError(f"element_bits must be positive, got {self.element_bits}")

    @property
    def bits(self) -> int:
        """Payload size in bits (headers and retransmissions excluded)."""
        return int(self.n_elements) * int(self.element_bits)


def transmission_time(bits: int, rate_bps: float, overhead: float, loss: float,
                      packet_bits: int | None, u: float) -> tuple[float, int, int]:
    """Seconds a message occupies a link, and its packet and retransmission counts.

    Parameters
    ----------
    bits : int
        Payload bits.
    rate_bps : float
        Link rate in bit/s.
    overhead : float
        Header overhead as a fraction of the payload (0.1 in Sec. VII).
    loss : float
        Per-packet loss probability in [0, 1).
    packet_bits : int or None
        Packet size on the air in bits; None sends the message as one packet.
    u : float
        The keyed uniform that decides the retransmissions.

    Returns
    -------
    seconds : float
        Simulated seconds.
    n_packets : int
    retransmissions : int
    """
    if bits == 0:
        return 0.0, 0, 0
    air_bits = bits * (1.0 + overhead)
    n = 1 if packet_bits is None else max(1, math.ceil(air_bits / packet_bits))
    extra = negative_binomial_from_uniform(u, n, loss)
    return air_bits / rate_bps * (n + extra) / n, n, extra


@dataclass
class Link(Stamped):
    """One direction of a device's link to the server (or of a direct device-to-device link).

    Attributes
    ----------
    rate_bps : float
        Rate in bit/s.
    loss : float
        Per-packet loss probability in [0, 1).
    resource : simpy.Resource
        Capacity-1 FIFO resource: one message on the link at a time.
    air : fednet.sim.cells.SharedAir, a proportional-fair port, or None
        The cell's shared airtime this link transmits on, through its ``transmit(airtime)`` (:mod:`fednet.sim.cells`:
        a :class:`~fednet.sim.cells.SharedAir` under round robin, a
        :meth:`~fednet.sim.cells.ProportionalFairAir.port` at the link's mean SNR under proportional fair); None: a
        dedicated link (the papers' star).
    latency_s : float
        Seconds from a message's last bit to its delivery, the link meanwhile free (an edge server's backhaul:
        propagation and transport; :mod:`fednet.sim.simulation`). 0 for radio links, whose floor is the
        simulation's ``hop_latency``.
    """

    rate_bps: float
    loss: float
    resource: Any
    air: Any = None
    latency_s: float = 0.0


def negative_binomials_from_uniforms(u: np.ndarray, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """:func:`~fednet.sim.rng.negative_binomial_from_uniform` element by element, with array ufuncs.

    The same CDF inversion (continuous first guess ``nbdtrik``, then steps to the exact discrete
    quantile with ``nbdtr``), evaluated on arrays; where every message has one ``(n, p)``, a search of the
    stored CDF that the scalar function also reads (``bisect_left`` there). Element ``t`` equals
    ``negative_binomial_from_uniform(u[t], n[t], p[t])`` (tested on random inputs).

    Parameters
    ----------
    u : ndarray of float, (m,)
        Uniforms in [0, 1).
    n : ndarray of int, (m,)
        Packets (>= 1).
    p : ndarray of float, (m,)
        Per-packet loss probabilities in [0, 1).

    Returns
    -------
    ndarray of int64, (m,)
        Retransmitted packets.
    """
    u = np.asarray(u, dtype=float)
    if np.ndim(n) == 0 and np.ndim(p) == 0:             # one (n, p) given as scalars: no per-element copies of them
        out = _one_negative_binomial(u, int(n), float(p))
        if out is not None:
            return out
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), u.shape)
    p = np.broadcast_to(np.asarray(p, dtype=float), u.shape)
    out = np.zeros(u.shape, dtype=np.int64)
    live = (p != 0.0) & (u > 0.0)
    if not live.any():
        return out
    uu, nn, pp = u[live], n[live], p[live]
    if nn.min() == nn.max() and pp.min() == pp.max():   # one (n, p), the common case: the scalar path's stored CDF
        cdf = _nb_cdf(int(nn[0]), float(pp[0]), float(uu.max()))
        if cdf is not None:                             # the smallest k with cdf[k] >= u: bisect_left, as there
            out[live] = np.searchsorted(np.asarray(cdf), uu, side="left")
            return out
    qq = 1.0 - pp
    guess = special.nbdtrik(uu, nn, qq)
    k = np.where(np.isfinite(guess), np.maximum(0, np.ceil(np.where(np.isfinite(guess), guess, 0.0))), 0)
    k = k.astype(np.int64)
    while True:
        down = (k > 0) & (special.nbdtr(k - 1, nn, qq) >= uu)
        if not down.any():
            break
        k -= down
    while True:
        up = special.nbdtr(k, nn, qq) < uu
        if not up.any():
            break
        k += up
    out[live] = k
    return out


def _one_negative_binomial(u: np.ndarray, n: int, p: float) -> np.ndarray | None:
    """:func:`negative_binomials_from_uniforms` where every element has one ``(n, p)``: the stored CDF searched
    (``bisect_left``) only for the uniforms above its first value (the others retransmit nothing), or None where
    that CDF is not available (the caller's general path then walks).

    Parameters
    ----------
    u : ndarray of float, any shape
        Uniforms in [0, 1).
    n : int
        Packets (>= 1).
    p : float
        Per-packet loss probability in [0, 1).

    Returns
    -------
    ndarray of int64, ``u``'s shape, or None
    """
    out = np.zeros(u.shape, dtype=np.int64)
    if p == 0.0 or not u.size:
        return out
    top = float(u.max())
    if not top > 0.0:                                   # no live uniform (u = 0 draws nothing)
        return out
    cdf = _nb_cdf(n, p, top)
    if cdf is None:
        return None
    flat, got = u.reshape(-1), out.reshape(-1)
    hit = np.flatnonzero(flat > cdf[0])                 # bisect_left(cdf, u) = 0 where u <= cdf[0]
    got[hit] = np.searchsorted(np.asarray(cdf), flat[hit], side="left")
    return out


def transmission_times(bits: np.ndarray | int, rate_bps: np.ndarray, overhead: float, loss: np.ndarray,
                       packet_bits: int | None, u: np.ndarray, *, arrays: bool = False) -> tuple[list[float], list[int]]:
    """:func:`transmission_time` for many messages at once (one per link), the same float operations.

    Parameters
    ----------
    bits : int or ndarray of int, (m,)
        Payload bits of each message.
    rate_bps, loss : ndarray, (m,), or float
        Each link's rate (bit/s) and per-packet loss probability; scalars (with an int ``bits``) for messages on
        links of one rate and loss, which then take no per-element copies of them (``u`` of any shape).
    overhead : float
    packet_bits : int or None
    u : ndarray, (m,)
        The keyed uniforms.
    arrays : bool
        Return float64 and int64 arrays instead of lists.

    Returns
    -------
    seconds : list of float
        Element ``t`` equals ``transmission_time(bits[t], rate_bps[t], overhead, loss[t], packet_bits, u[t])[0]``.
    retransmissions : list of int
    """
    u = np.asarray(u, dtype=float)
    if np.ndim(bits) == 0 and np.ndim(rate_bps) == 0 and np.ndim(loss) == 0:     # one link class: scalar operands
        air = np.int64(bits) * (1.0 + overhead)         # the same float operations, on scalars
        n = 1 if packet_bits is None else int(max(1, np.ceil(air / packet_bits)))
        extra = negative_binomials_from_uniforms(u, n, float(loss))
        seconds = air / float(rate_bps) * (n + extra) / n
        if bits == 0:
            seconds[...], extra[...] = 0.0, 0
        return (seconds, extra) if arrays else (seconds.tolist(), extra.tolist())
    bits_a = np.broadcast_to(np.asarray(bits, dtype=np.int64), u.shape)
    air = bits_a * (1.0 + overhead)
    if packet_bits is None:
        n = np.ones(u.shape, dtype=np.int64)
    else:
        n = np.maximum(1, np.ceil(air / packet_bits)).astype(np.int64)
    extra = negative_binomials_from_uniforms(u, n, np.asarray(loss, dtype=float))
    seconds = air / np.asarray(rate_bps, dtype=float) * (n + extra) / n
    seconds[bits_a == 0] = 0.0
    extra[bits_a == 0] = 0
    if arrays:
        return seconds, extra
    return seconds.tolist(), extra.tolist()
