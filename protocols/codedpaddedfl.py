"""CodedPaddedFL: one-time pads + cyclic gradient codes, with grouping.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning", Sec. V (eqs. 6-12), Sec. V-E
(grouping), Sec. VII (set-up); gradient codes of Tandon et al. (ICML 2017).

Phase 1 (:meth:`CodedPaddedFL.setup`, round 0)
    Offline (not timed, Sec. VII): device ``i`` computes ``X_i^T X_i`` and its first gradient
    ``G_i^(1) = -X_i^T Y_i`` (``Theta^(1) = 0``) in ``Q<k,f>``.  It pads them with uniform
    pads ``R^X_i`` (symmetric) and ``R^G_i`` (eqs. 6-7); only the pads' seeds reach the server
    (no traffic, as the paper assumes).  Each device shares ``(Phi_i, Psi_i)`` -- the upper
    triangle of ``Phi_i`` (Remark 1) and ``Psi_i``: ``d (d+1)/2 + d c`` elements -- with the
    ``alpha - 1`` devices that column ``i`` of ``Omega`` names, relayed through the server
    (end-to-end encrypted, Sec. III-B: the engine keeps them in the server's ``relayed`` list,
    not its view).
    Each device then encodes ``C_i``, ``Cbar_i`` (eqs. 8-9).  The server encodes the pads the
    same way, once.
Phase 2 (:meth:`CodedPaddedFL.round`, each epoch)
    The server broadcasts ``epsilon = Theta^(e) - Theta^(1)`` (eq. 10) in ``Q<k,f>``; device
    ``i`` computes ``C_i + Cbar_i epsilon`` (eq. 11, ``d^2 c`` MACs) and uploads ``d c``
    elements; per group the server waits for the ``D_g - alpha + 1`` fastest, removes the pads,
    decodes (eq. 12), sums the groups and updates (eq. 5).

Exactness: the ring of the shares
---------------------------------
Multiplying a padded value by a *fractional* public number (a code coefficient ``b_ij``, then
``epsilon``) is not linear modulo ``2^k`` (see :mod:`fednet.algebra.fixed_point`, note on
Proposition 2): every such multiplication consumes ``f`` bits of modulus.  The shares therefore
live in ``Z_2^W`` with ``W = k + f_B + f`` (``f_B`` the fractional bits of ``B``): device ``i``
forms ``sum_j b_bar_ij Phi_j`` exactly mod ``2^W`` and drops ``f_B`` bits (``Cbar_i`` mod
``2^(k+f)``), then per epoch forms ``Cbar_i eps_bar`` exactly mod ``2^(k+f)`` and drops ``f``
bits, so its upload is a ``Q<k,f>`` matrix (``k`` bits per element).  The server applies the
same steps to the pads; every dropped-bit step commutes with the pad removal up to one unit,
so a decoded coded gradient ``P_i`` differs from ``sum_j b_ij G_j`` by at most
``2^-f (2 + max_col ||eps||_1)`` per entry, and the decoded gradient meets
:meth:`fednet.codes.gradient_codes.CyclicGradientCode.error_bound` (checked every epoch in full
mode).  The shares' width on the wire is ``share_element_bits`` (default: ``W``; the paper
counts ``k`` = 48 -- a study reproducing its figures says so explicitly).

Modes
-----
``full``: all of the above, every epoch, with the metered exact kernels; the decoded gradient
is compared with the plain one (``max_decode_error``, ``decode_bound``).
``timing``: exact decoding makes the learning trajectory independent of the stragglers
(Prop. 3), so the trajectory is plain full-batch gradient descent (float64, computed once per
task and cached) and each step is charged the MACs the real kernels meter at the real shapes
(measured once per shape and cached).  Traffic and schedules are those of full mode.

Sharing schedule (left open by Sec. V-C; a study names its choice)
    ``relay_steps`` (default): ``alpha - 1`` successive steps, row ``r`` of ``Omega`` in step
    ``r``; each step is an upload and a download per device, and the next step starts when the
    slowest relay of the step is delivered (the literal reading of "alpha - 1 successive
    transmissions consisting of upload and download").
    ``relay_asap``: every relay launched at once; each link serves its queue first come first
    served, so a device's next upload starts as soon as its previous one ends.
    ``upload_once``: each device uploads once and the server forwards it ``alpha - 1`` times
    (the traffic count of Sec. V-D: one upload, ``alpha - 1`` downloads).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.capacity import check_round_capacity, check_statistics_capacity
from fednet.algebra.fixed_point import (
    FixedPoint,
    extract_bits,
    prepare,
    prepared_from_limbs,
    random_ring_limbs,
    ring_add,
    ring_from_int,
    ring_matmul,
    ring_scaled_sum,
    ring_shift,
)
from fednet.algebra.meter import macs_of, matmul
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.protocol.base import Outgoing, Protocol, ProtocolConfig
from fednet.sim.simulation import Node
from topologies.grouping import equal_groups, group_sizes

__all__ = [
    "CodedPaddedFLConfig",
    "CodedPaddedFL",
    "local_statistics",
    "pad",
    "encode",
    "coded_gradient",
    "remove_pads",
    "decode",
    "pack_upper",
    "unpack_upper",
]


class CodedPaddedFLConfig(ProtocolConfig):
    """Parameters of CodedPaddedFL.

    Attributes
    ----------
    element_bits : int
        Wire width of ``epsilon`` and of the coded gradients (``k`` = 48 for ``Q<48,24>``).
    alpha : int
        Devices each partition is stored on (paper's alpha; tolerates ``alpha - 1`` stragglers
        per group), at most the smallest group size.
    groups : int
        Number of groups N (Sec. V-E), sizes as equal as possible.
    k, f : int
        The fixed-point format ``Q<k,f>`` (48, 24 in Sec. VII).
    code_fraction_bits : int
        Fractional bits ``f_B`` of the encoding matrix B (24: ``Q<48,24>`` as in the paper).
    share_element_bits : int, optional
        Wire width of a shared element of ``Phi``/``Psi``; default the ring width
        ``k + f_B + f`` that exact decoding needs.
    sharing_schedule : {"relay_steps", "relay_asap", "upload_once"}
        Schedule of phase 1 (module docstring).
    mode : {"full", "timing"}
        Real exact math every epoch, or the cached trajectory with metered MAC counts.
    code_draws : int
        Candidate H matrices drawn per group code (best conditioned kept).
    check_decoding : bool
        Full mode: compare each decoded gradient with the plain one (not charged).
    """

    element_bits: int = Field(48, ge=1)
    alpha: int = Field(..., ge=1)
    groups: int = Field(1, ge=1)
    k: int = Field(48, ge=8, le=62)
    f: int = Field(24, ge=1)
    code_fraction_bits: int = Field(24, ge=1, le=40)
    share_element_bits: int | None = Field(None, ge=1)
    sharing_schedule: Literal["relay_steps", "relay_asap", "upload_once"] = "relay_steps"
    mode: Literal["full", "timing"] = "full"
    code_draws: int = Field(16, ge=1)
    check_decoding: bool = True

    @model_validator(mode="after")
    def _formats(self) -> "CodedPaddedFLConfig":
        if self.f >= self.k:
            raise ValueError(f"f must be less than k = {self.k}, got {self.f}")
        return self

    @property
    def ring_bits(self) -> int:
        """``W = k + f_B + f``, the ring of the shares."""
        return self.k + self.code_fraction_bits + self.f


# ----------------------------------------------------------------------------- pure math
def pack_upper(a: np.ndarray) -> np.ndarray:
    """Upper triangle (with diagonal) of the last two axes, row by row: ``(..., d(d+1)/2)``."""
    d = a.shape[-1]
    iu = np.triu_indices(d)
    return a[..., iu[0], iu[1]]


def unpack_upper(p: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_upper` for symmetric matrices: ``(..., d(d+1)/2) -> (..., d, d)``."""
    if p.shape[-1] != d * (d + 1) // 2:
        raise ValueError(f"packed length {p.shape[-1]} is not d(d+1)/2 for d = {d}")
    out = np.empty(p.shape[:-1] + (d, d), dtype=p.dtype)
    iu = np.triu_indices(d)
    out[..., iu[0], iu[1]] = p
    out[..., iu[1], iu[0]] = p
    return out


def local_statistics(q: FixedPoint, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``X^T X`` and the first gradient ``G^(1) = -X^T Y`` (``Theta^(1) = 0``, eq. 3) in ``Q<k,f>``.

    Parameters
    ----------
    q : FixedPoint
    X : ndarray, (n_i, d) float64
    Y : ndarray, (n_i, c) float64

    Returns
    -------
    M : ndarray, (d, d) int64
        ``X^T X`` (exact sum of the quantised data, floored once).
    G1 : ndarray, (d, c) int64
    """
    xb = q.encode(X)
    px = q.prepare(np.ascontiguousarray(xb.T))
    M = q.matmul(px, xb)
    G1 = q.wrap(-q.matmul(px, q.encode(Y)))
    return M, G1


def pad(q: FixedPoint, bits: int, M: np.ndarray, G1: np.ndarray, rng: np.random.Generator):
    """One-time pads and padded data of one device, eqs. (6)-(7), in ``Z_2^bits``.

    Parameters
    ----------
    q : FixedPoint
    bits : int
        The ring width ``W``.
    M : ndarray, (d, d) int64, symmetric
    G1 : ndarray, (d, c) int64
    rng : numpy.random.Generator
        The device's pad stream (its seed is what the server learns).

    Returns
    -------
    Phi, Psi : ndarray
        Canonical limbs of ``pack_upper(M) + R^X`` (``(L, d(d+1)/2)``) and ``G1 + R^G``
        (``(L, d, c)``), ``L = ceil(W/16)``.
    RX, RG : ndarray
        The pads (same shapes): ``R^X`` is the upper triangle of a uniform symmetric matrix.
    """
    d, c = G1.shape
    RX = random_ring_limbs((d * (d + 1) // 2,), bits, rng)
    RG = random_ring_limbs((d, c), bits, rng)
    Phi = ring_add(ring_from_int(pack_upper(M), bits), RX, bits)
    Psi = ring_add(ring_from_int(G1, bits), RG, bits)
    return Phi, Psi, RX, RG


def encode(coefficients, Phis, Psis, bits: int, code_fraction_bits: int, out_bits: int):
    """Local encoding of eqs. (8)-(9) in the ring, then ``f_B`` bits dropped.

    Parameters
    ----------
    coefficients : sequence of int
        ``b_bar_{i, omega_ji}``, the ``Q<., f_B>`` integers of row ``i`` of B on its support.
    Phis, Psis : sequences of canonical limb arrays (``Z_2^bits``)
        The padded data of the devices in the support, in the same order.
    bits, code_fraction_bits, out_bits : int
        ``W``, ``f_B`` and ``k + f``.

    Returns
    -------
    Cbar : ndarray, (L', d(d+1)/2) canonical limbs mod ``2^out_bits``
    C : ndarray, (L', d, c) canonical limbs mod ``2^out_bits``
        Charges ``alpha (d(d+1)/2 + d c)`` MACs.
    """
    Cbar = ring_shift(ring_scaled_sum(coefficients, Phis, bits), code_fraction_bits, out_bits)
    C = ring_shift(ring_scaled_sum(coefficients, Psis, bits), code_fraction_bits, out_bits)
    return Cbar, C


def coded_gradient(q: FixedPoint, Cbar, C: np.ndarray, eps) -> np.ndarray:
    """Eq. (11): ``C + Cbar epsilon`` in ``Q<k,f>`` (the product exact mod ``2^(k+f)``, one shift).

    Parameters
    ----------
    q : FixedPoint
    Cbar : PreparedOperand, (d, d), residues mod ``2^(k+f)`` at scale ``2^f``
    C : ndarray, (L', d, c) canonical limbs mod ``2^(k+f)``
    eps : PreparedOperand or int64 (d, c), ``Q<k,f>``

    Returns
    -------
    ndarray, (d, c) int64, ``Q<k,f>``; charges ``d^2 c`` MACs.
    """
    prod = ring_matmul(Cbar, eps, q.k + q.f)
    return q.add(extract_bits(C, 0, q.k), extract_bits(prod, q.f, q.k))


def remove_pads(q: FixedPoint, received: np.ndarray, pad_part: np.ndarray) -> np.ndarray:
    """``P_i = received - pad part`` in ``Q<k,f>`` (Sec. V-B, before eq. 12)."""
    return q.sub(received, pad_part)


def decode(q: FixedPoint, code: CyclicGradientCode, responders, P: np.ndarray) -> np.ndarray:
    """Eq. (12): ``sum_i a_i P_i`` in ``Q<k,f>`` with the fixed-point decoding row.

    Parameters
    ----------
    q : FixedPoint
    code : CyclicGradientCode
    responders : sequence of int
        Group-local indices of the first ``D_g - alpha + 1`` responders (any order).
    P : ndarray, (len(responders), d, c) int64
        Their unpadded coded gradients, in the order of ``responders``.

    Returns
    -------
    ndarray, (d, c) float64
        The decoded gradient sum (reals); charges ``(D_g - alpha + 1) d c`` MACs.
    """
    order = np.argsort(responders)
    F = [int(responders[i]) for i in order]
    a = code.decoding_vector_fixed(F)
    flat = P[order].reshape(len(F), -1)
    return q.decode(q.matmul(a[None, :], flat)[0]).reshape(P.shape[1:])


# ----------------------------------------------------------------------------- the protocol
class CodedPaddedFL(Protocol):
    """CodedPaddedFL (Schlegel et al., Sec. V) with grouping (Sec. V-E); module docstring.

    Attributes
    ----------
    groups : list of list of int
        Device indices of each group.
    codes : list of CyclicGradientCode
        The ``(alpha, D_g)`` code of each group.
    max_decode_error : float
        Full mode: largest max-norm difference seen between a decoded group gradient and the
        plain one computed from the same fixed-point data.
    decode_bound : float
        The stated bound that difference is checked against (the largest seen).
    """

    name = "codedpaddedfl"
    Config = CodedPaddedFLConfig

    @classmethod
    def check(cls, config: CodedPaddedFLConfig, n_devices: int) -> None:
        """Refuse alpha larger than the smallest group, or more groups than devices."""
        if config.groups > n_devices:
            raise ValueError(f"groups must be at most the number of devices ({n_devices}), got {config.groups}")
        smallest = min(group_sizes(n_devices, config.groups))
        if config.alpha > smallest:
            raise ValueError(f"alpha must be at most the smallest group size ({smallest} with "
                             f"{config.groups} groups of {n_devices} devices), got {config.alpha}")

    # -- helpers ---------------------------------------------------------------------------
    @property
    def q(self) -> FixedPoint:
        """The fixed-point format ``Q<k,f>`` of the configuration."""
        return FixedPoint(self.config.k, self.config.f)

    def _share_elements(self) -> int:
        d, c = self.task.d, self.task.c
        return d * (d + 1) // 2 + d * c

    def _share_bits(self) -> int:
        return self.config.share_element_bits or self.config.ring_bits

    def _support(self, g: int, local: int) -> list[int]:
        """Global devices whose data device ``local`` of group ``g`` encodes (column of Omega)."""
        members = self.groups[g]
        return [members[j] for j in self.codes[g].Omega[:, local]]

    def _sharing_steps(self) -> list[list[Outgoing]]:
        """Row r of Omega is step r: device omega_ri sends its shares to device i."""
        steps: list[list[Outgoing]] = []
        n, bits = self._share_elements(), self._share_bits()
        for r in range(1, self.config.alpha):
            step = []
            for g, members in enumerate(self.groups):
                for local, dev in enumerate(members):
                    src = members[self.codes[g].Omega[r, local]]
                    step.append(Outgoing(self.devices[src], self.devices[dev],
                                         self.devices[src].state.share, "share", n, bits))
            steps.append(step)
        return steps

    def _deliver(self, messages) -> None:
        for msg in messages:
            self.devices[msg.dst].state.received_shares[msg.src] = msg.payload

    # -- phase 1 ---------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Phase 1 (Sec. V-A/C): pads, sharing of (Phi_i, Psi_i) along Omega, local encoding (eqs. 6-9)."""
        cfg, q = self.config, self.q
        D = self.sim.n_devices
        self.groups = equal_groups(D, cfg.groups)
        check_statistics_capacity(q, self.task.X, self.task.Y, self.groups)   # refuse a too-narrow Q<k,f> now
        bq = FixedPoint(min(62, cfg.code_fraction_bits + 24), cfg.code_fraction_bits)
        full = cfg.mode == "full"
        # timing mode needs only the code's shape (responders, decoding cost): no conditioning search
        self.codes = [CyclicGradientCode(cfg.alpha, len(members), self.sim.rng(self.server, "gradient-code", g),
                                         fixed_point=bq, a_format=q, n_draws=cfg.code_draws if full else 1,
                                         max_patterns=2000 if full else 1)
                      for g, members in enumerate(self.groups)]
        self.group_of = {dev: (g, local) for g, members in enumerate(self.groups)
                         for local, dev in enumerate(members)}
        self.max_decode_error = 0.0
        self.decode_bound = 0.0
        W = cfg.ring_bits
        self.server.state.pads = {}
        for dev in self.devices:                       # offline (Sec. VII): not timed
            dev.state.received_shares = {}
            if full:
                M, G1 = local_statistics(q, self.task.X[dev.index], self.task.Y[dev.index])
                dev.state.M, dev.state.G1 = M, G1      # kept for the observer's check only
                Phi, Psi, RX, RG = pad(q, W, M, G1, self.sim.secret_rng(dev, "pads"))
                dev.state.share = (Phi, Psi)
                self.server.state.pads[dev.index] = (RX, RG)   # the seed is what travels
            else:
                dev.state.share = np.empty(0)
        if cfg.alpha > 1:
            if cfg.sharing_schedule == "upload_once":
                ups = [[Outgoing(dev, self.server, dev.state.share, "share", self._share_elements(),
                                 self._share_bits()) for dev in self.devices]]
                yield from self.send_all(ups)
                relays = self._sharing_steps()
                downs = [[Outgoing(self.server, o.dst, o.payload, "share", o.n_elements, o.element_bits)
                          for o in step] for step in relays]
                delivered = yield from self.send_all(downs, barrier=False)
                for step_msgs, step in zip(delivered, relays):
                    for msg, o in zip(step_msgs, step):
                        self.devices[msg.dst].state.received_shares[o.src.index] = msg.payload
            else:
                delivered = yield from self.send_all(self._sharing_steps(),
                                                     barrier=cfg.sharing_schedule == "relay_steps")
                for step in delivered:
                    self._deliver(step)
        d, c = self.task.d, self.task.c
        if full:
            yield from self.compute_each(self.devices, self._encode_device)
            yield from self.server_compute(self._encode_pads)
            # only the encoded forms are used from now on: free the expanded shares and pads
            self.server.state.pads = None
            for dev in self.devices:
                dev.state.share = None
                if not cfg.check_decoding:
                    dev.state.M = dev.state.G1 = None
        else:
            def encode_macs(node: Node) -> int:
                return macs_of(("encode", cfg.alpha, d, c, W), lambda: encode(
                    [1] * cfg.alpha, [np.zeros((1, d * (d + 1) // 2), np.int64)] * cfg.alpha,
                    [np.zeros((1, d, c), np.int64)] * cfg.alpha, 16, 0, 16))
            yield from self.compute_each(self.devices, None, macs=encode_macs)
            pad_macs = sum(encode_macs(dev) for dev in self.devices)
            yield from self.server_compute(None, macs=pad_macs)

    def _encode_device(self, dev: Node) -> None:
        """Eqs. (8)-(9) on device ``dev`` from its own and its received shares."""
        cfg, q = self.config, self.q
        g, local = self.group_of[dev.index]
        support = self._support(g, local)
        coef = self.codes[g].B_bar[local, [self.groups[g].index(j) for j in support]]
        shares = [dev.state.share if j == dev.index else dev.state.received_shares[j] for j in support]
        Cbar, C = encode(coef, [s[0] for s in shares], [s[1] for s in shares], cfg.ring_bits,
                         cfg.code_fraction_bits, q.k + q.f)
        dev.state.Cbar = prepared_from_limbs(unpack_upper(Cbar, self.task.d))  # limbs kept across rounds
        dev.state.C = C
        dev.state.received_shares = {}

    def _encode_pads(self) -> None:
        """The server encodes every device's pads exactly as the device encodes its shares."""
        cfg, q = self.config, self.q
        self.server.state.encoded_pads = {}
        for dev in self.devices:
            g, local = self.group_of[dev.index]
            support = self._support(g, local)
            coef = self.codes[g].B_bar[local, [self.groups[g].index(j) for j in support]]
            pads = [self.server.state.pads[j] for j in support]
            Rbar, R = encode(coef, [p[0] for p in pads], [p[1] for p in pads], cfg.ring_bits,
                             cfg.code_fraction_bits, q.k + q.f)
            self.server.state.encoded_pads[dev.index] = (prepared_from_limbs(unpack_upper(Rbar, self.task.d)), R)

    # -- phase 2 ---------------------------------------------------------------------------
    def _device_epoch(self, dev: Node) -> np.ndarray:
        """Eq. (11) on ``dev`` with the epsilon it downloaded."""
        return coded_gradient(self.q, dev.state.Cbar, dev.state.C, prepare(dev.state.received))

    def round(self, epoch: int) -> Generator:
        """Phase 2 (Sec. V-B): broadcast epsilon, coded gradients (eq. 11), per-group decoding (eq. 12), update (eq. 5)."""
        cfg, q = self.config, self.q
        d, c = self.task.d, self.task.c
        full = cfg.mode == "full"
        if full:
            eps = q.encode(self.theta)                 # Theta^(1) = 0, so epsilon = Theta (eq. 10)
        else:
            eps = np.zeros((d, c), dtype=np.int64)     # a placeholder of the right size
        totals: dict[int, np.ndarray] = {}
        used: list[int] = []
        self._round_error = self._round_bound = 0.0

        def group(g: int) -> Generator:
            members = self.groups[g]
            code = self.codes[g]
            nodes = [self.devices[i] for i in members]
            if full:
                replies = yield from self.gather(nodes, self._device_epoch, kind="coded_gradient",
                                                 first=code.n_responders, download=eps,
                                                 download_kind="epsilon", download_bits=cfg.k,
                                                 upload_bits=cfg.k)
                totals[g] = yield from self.server_compute(self._decode_group, g, replies, eps)
            else:
                macs = macs_of(("epoch", d, c), lambda: matmul(np.zeros((d, d)), np.zeros((d, c))))
                replies = yield from self.gather(nodes, None, kind="coded_gradient", first=code.n_responders,
                                                 download=eps, download_kind="epsilon", download_bits=cfg.k,
                                                 upload_elements=d * c, upload_bits=cfg.k,
                                                 macs=lambda n: macs)
                dec = macs_of(("decode", code.n_responders, d, c), lambda: code.decode(
                    range(code.n_responders), np.zeros((code.n_responders, d, c))))
                yield from self.server_compute(None, macs=code.n_responders * macs + dec)
            used.extend(n.index for n, _ in replies)

        procs = [self.env.process(group(g)) for g in range(len(self.groups))]
        yield self.env.all_of(procs)
        self.used = used
        if full:
            G = sum(totals[g] for g in range(len(self.groups)))
            self.step(G, self.task.m)
        # timing mode: the model is the cached exact trajectory's (see evaluate); theta stays put

    def round_metrics(self, round: int) -> dict:
        """Full mode with ``check_decoding``: this round's largest decode error and its bound."""
        if self.config.mode != "full" or not self.config.check_decoding or round == 0:
            return {}
        return {"decode_error": self._round_error, "decode_bound": self._round_bound}

    def _decode_group(self, g: int, replies, eps: np.ndarray) -> np.ndarray:
        """Server: remove the pads of the responders of group ``g`` and decode (eq. 12)."""
        q = self.q
        members = self.groups[g]
        pe = prepare(eps)
        local, P = [], []
        for node, received in replies:
            Rbar, R = self.server.state.encoded_pads[node.index]
            pad_part = coded_gradient(q, Rbar, R, pe)
            P.append(remove_pads(q, received, pad_part))
            local.append(members.index(node.index))
        G = decode(q, self.codes[g], local, np.stack(P))
        if self.config.check_decoding:
            self._check(g, local, G, eps)
        return G

    def _check(self, g: int, local: list[int], G: np.ndarray, eps: np.ndarray) -> None:
        """Observer: compare with the plain gradient from the same fixed-point data (not charged)."""
        q, code = self.q, self.codes[g]
        e = q.decode(eps)
        parts = [q.decode(self.devices[i].state.M) @ e + q.decode(self.devices[i].state.G1)
                 for i in self.groups[g]]
        check_round_capacity(q, parts, code.B, what=f"round {self.epoch}, group {g}")   # refuse a wrapped round
        err = float(np.abs(G - sum(parts)).max())
        g_sum = float(sum(np.abs(p).max() for p in parts))
        e_max = 2.0 ** -q.f * (2 + float(np.abs(e).sum(axis=0).max())) + 2.0 ** -q.f
        bound = code.error_bound(g_sum, e_max, local)
        self.max_decode_error = max(self.max_decode_error, err)
        self.decode_bound = max(self.decode_bound, bound)
        self._round_error = max(self._round_error, err)
        self._round_bound = max(self._round_bound, bound)
        if err > bound:
            raise AssertionError(f"decoded gradient of group {g} is off by {err:.3g} > bound {bound:.3g}")

    def evaluate(self) -> tuple[float, float]:
        """Full mode: the model's accuracy; timing mode: the cached exact trajectory's."""
        if self.config.mode == "full":
            return super().evaluate()
        return self.task.full_batch_trajectory(self.epoch)[self.epoch]
