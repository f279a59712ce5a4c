"""CodedPaddedFL: one-time pads + cyclic gradient codes, with grouping.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler mitigation
and secure aggregation in federated learning", Sec. V (eqs. 6-12), V-E (grouping), VII (set-up);
gradient codes of Tandon et al. (ICML 2017).  The math of every step, and the ring ``Z_2^W``,
``W = k + f_B + f``, of the shares (exact decoding), are in :mod:`fednet.codes.padded`.

Phase 1 (:meth:`CodedPaddedFL.setup`, round 0)
    Offline (Sec. VII), device ``i`` pads ``X_i^T X_i`` and ``G_i^(1)`` with secret pads whose seeds only
    reach the server (eqs. 6-7); it shares ``(Phi_i, Psi_i)`` (Remark 1) with the ``alpha - 1`` devices
    column ``i`` of ``Omega`` names, relayed end-to-end encrypted through the server (Sec. III-B), and
    encodes ``C_i``, ``Cbar_i`` (eqs. 8-9); the server encodes the pads alike.
Phase 2 (:meth:`CodedPaddedFL.round`, each epoch)
    The server broadcasts ``epsilon`` (eq. 10); devices upload ``C_i + Cbar_i epsilon`` (eq. 11); per
    group the ``D_g - alpha + 1`` fastest are unpadded and decoded (eq. 12); eq. (5).  ``full`` mode checks each
    decoded gradient; the sum over groups is not charged (as the paper).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.capacity import check_statistics_capacity
from fednet.algebra.fixed_point import FixedPoint
from fednet.codes import padded
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.codes.gram import local_statistics, pack_upper, unpack_upper  # noqa: F401 (tests import them here)
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig, ServerState
from fednet.protocol.modes import Shape
from fednet.sim.simulation import Node
from fednet.topologies.groups import group_sizes, membership

__all__ = ["CodedPaddedFLConfig", "CodedPaddedFL", "CodedPaddedFLState", "CodedPaddedFLServerState"]


class CodedPaddedFLConfig(ProtocolConfig):
    """Parameters of CodedPaddedFL.

    Attributes
    ----------
    element_bits : int
        Wire width of ``epsilon`` and of the coded gradients (``k`` = 48).
    alpha : int
        Devices each partition is stored on (tolerates ``alpha - 1`` stragglers per group).
    groups : int
        Number of groups N (Sec. V-E), sizes as equal as possible.
    k, f : int
        The fixed-point format ``Q<k,f>`` (48, 24 in Sec. VII).
    code_fraction_bits : int
        Fractional bits ``f_B`` of the encoding matrix B (24 as in the paper).
    share_element_bits : int, optional
        Wire width of a shared element; default ``k + f_B + f``, the ring exact decoding needs (paper: ``k``).
    sharing_schedule : {"relay_steps", "relay_asap", "upload_once"}
        Phase 1's schedule, left open by Sec. V-C (:meth:`fednet.protocol.primitives.Net.exchange`; row ``r``
        of ``Omega`` in step ``r`` by default, :func:`fednet.codes.padded.sharing_steps`).
    mode : {"full", "timing"}
    code_draws : int
        Candidate H matrices drawn per group code (best conditioned kept).
    check_decoding : bool
        Full mode: check each decoded gradient against the plain one (observer, not charged).
    encode_count : {"alpha", "alpha_minus_1"}
        MACs charged for a device's encoding (Sec. V-D, :func:`fednet.codes.padded.encode_charge`).
    encode_per_group : bool
        True: each group shares along its own ``Omega`` and encodes as soon as its own sharing
        ends (Sec. V-E); False (default): devices encode once the whole network's sharing ended.
    paper_accounting : dict (class)
        The paper's choices, selected by a study's ``accounting = "paper"`` (Sec. V-D, V-E).
    """

    paper_accounting: ClassVar[dict[str, Any]] = {"share_element_bits": 48, "encode_count": "alpha_minus_1",
                                                  "encode_per_group": True}

    element_bits: int = Field(48, ge=1, le=4096)
    alpha: int = Field(..., ge=1)
    groups: int = Field(1, ge=1)
    k: int = Field(48, ge=8, le=62)
    f: int = Field(24, ge=1)
    code_fraction_bits: int = Field(24, ge=1, le=40)
    share_element_bits: int | None = Field(None, ge=1, le=4096)
    sharing_schedule: Literal["relay_steps", "relay_asap", "upload_once"] = "relay_steps"
    mode: Literal["full", "timing"] = "full"
    code_draws: int = Field(16, ge=1, le=10_000)
    check_decoding: bool = True
    encode_count: Literal["alpha", "alpha_minus_1"] = "alpha"
    encode_per_group: bool = False

    @model_validator(mode="after")
    def _formats(self) -> "CodedPaddedFLConfig":
        if self.f >= self.k:
            raise ValueError(f"f must be less than k = {self.k}, got {self.f}")
        return self

    @property
    def ring_bits(self) -> int:
        """``W = k + f_B + f``, the ring of the shares (:func:`fednet.codes.padded.ring_bits`)."""
        return padded.ring_bits(self.k, self.f, self.code_fraction_bits)


@dataclass
class CodedPaddedFLState(NodeState):
    """A device's private state.

    Attributes
    ----------
    M, G1 : ndarray, (d, d) and (d, c) int64
        ``X_i^T X_i`` and ``G_i^(1)`` in ``Q<k,f>`` (kept for the observer's check only).
    share, received_shares : (Phi, Psi), dict of int -> (Phi, Psi)
        Its padded data (eqs. 6-7, ring limbs) and that of the devices in its support; freed after encoding.
    Cbar, C : PreparedOperand (d, d), ndarray (L', d, c)
        Its encoded data (eqs. 8-9), kept across rounds.
    """

    M: Any = None
    G1: Any = None
    share: Any = None
    received_shares: dict = field(default_factory=dict)
    Cbar: Any = None
    C: Any = None


@dataclass
class CodedPaddedFLServerState(ServerState):
    """The server's private state.

    Attributes
    ----------
    pads, encoded_pads : dict of int -> (RX, RG), dict of int -> (Rbar, R)
        Every device's pads (from their seeds; freed after encoding) and their encoded forms.
    """

    pads: dict = field(default_factory=dict)
    encoded_pads: dict = field(default_factory=dict)


class CodedPaddedFL(Protocol):
    """CodedPaddedFL (Schlegel et al., Sec. V) with grouping (Sec. V-E); module docstring.

    Attributes
    ----------
    groups : list of list of int
        Device indices of each group.
    codes : list of CyclicGradientCode
        The ``(alpha, D_g)`` code of each group.
    group_of : dict of int -> (int, int)
        Device -> (group, index in the group).
    max_decode_error, decode_bound : float
        Full mode: largest max-norm error seen of a decoded group gradient (against the plain one
        from the same fixed-point data), and the largest stated bound it was checked against.
    """

    name = "codedpaddedfl"
    secrets_reach_model = frozenset({"full"})   # full mode: the padded values' fixed-point rounding (Sec. V-B)
    Config = CodedPaddedFLConfig
    State = CodedPaddedFLState
    ServerStateType = CodedPaddedFLServerState
    exact_trajectory = True
    groups: list[list[int]]
    codes: list[CyclicGradientCode]
    group_of: dict[int, tuple[int, int]]
    max_decode_error: float = 0.0
    decode_bound: float = 0.0
    _round_check: tuple[float, float] | None = None     # this round's (error, bound), if observed

    @classmethod
    def check(cls, config: CodedPaddedFLConfig, n_devices: int) -> None:
        """Refuse more groups than devices, alpha above the smallest group (Sec. V-E), or a wire width below k."""
        padded.check_wire_bits(config, "CodedPaddedFL")
        if config.groups > n_devices:
            raise ValueError(f"groups must be at most the number of devices ({n_devices}), got {config.groups}")
        padded.check_groups(config.alpha, group_sizes(n_devices, config.groups))

    @classmethod
    def check_dropout(cls, config: CodedPaddedFLConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout leaving fewer than ``D_g - alpha + 1`` devices of a group on average (eq. 12)."""
        padded.check_dropout(config.alpha, group_sizes(n_devices, config.groups), dropout)

    @property
    def q(self) -> FixedPoint:
        """The fixed-point format ``Q<k,f>`` of the configuration."""
        return FixedPoint(self.config.k, self.config.f)

    # -- phase 1 ---------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Phase 1 (Sec. V-A/C): pads, sharing of (Phi_i, Psi_i) along Omega, local encoding (eqs. 6-9)."""
        cfg, q, mode, (d, c) = self.config, self.q, self.mode, (self.task.d, self.task.c)
        self.groups = groups = membership(self.sim, cfg.groups)  # the network's groups, else consecutive (Sec. V-E)
        check_statistics_capacity(q, self.task.X, self.task.Y, groups,   # refuse a too-narrow Q<k,f> now
                                  memo=getattr(self.task, "memo", None))
        self.codes = padded.group_codes(cfg.alpha, [len(m) for m in groups],
                                        [self.sim.rng(self.server, "gradient-code", g) for g in range(len(groups))],
                                        q, cfg.code_fraction_bits, cfg.code_draws, search=mode.exact)
        self.group_of = {dev: (g, local) for g, members in enumerate(self.groups) for local, dev in enumerate(members)}
        like = tuple(Shape(shape, np.int64) for shape in padded.padded_statistics_shapes(cfg.ring_bits, d, c))
        for dev in self.devices:                       # offline (Sec. VII): eqs. (6)-(7), not timed
            st, X, Y = dev.state, self.task.X[dev.index], self.task.Y[dev.index]
            st.M, st.G1, Phi, Psi, RX, RG = mode.offline(padded.padded_statistics, q, cfg.ring_bits, X, Y,
                                                         self.sim.secret_rng(dev, "pads"), like=like)
            st.share, self.server.state.pads[dev.index] = (Phi, Psi), (RX, RG)   # the seed is what travels
        if cfg.encode_per_group:                       # each group shares, then encodes (Sec. V-E)
            yield self.env.all_of([self.env.process(self._share_and_encode([g], [self.devices[i] for i in members]))
                                   for g, members in enumerate(self.groups)])
        else:                                          # the network's sharing, then every device encodes
            yield from self._share_and_encode(range(len(self.groups)), self.devices)
        yield from self.net.server_compute(self._encode_pads)
        self.server.state.pads = {}                    # only the encoded forms are used from now on
        for dev in self.devices:
            dev.state.share, dev.state.received_shares = None, {}
            if not cfg.check_decoding:
                dev.state.M = dev.state.G1 = None

    def _share_and_encode(self, groups, nodes: list[Node]) -> Generator:
        """Share ``(Phi_i, Psi_i)`` along ``Omega`` inside ``groups`` (Sec. V-A), then ``nodes`` encode (eqs. 8-9)."""
        cfg, (d, c) = self.config, (self.task.d, self.task.c)
        steps = [[(self.devices[src], self.devices[dst]) for src, dst in step]
                 for step in padded.sharing_steps(cfg.alpha, self.groups, self.codes, groups)]
        delivered = yield from self.net.exchange(steps, lambda src, dst: src.state.share, kind="share",
                                                 schedule=cfg.sharing_schedule, n_elements=padded.share_elements(d, c),
                                                 element_bits=cfg.share_element_bits or cfg.ring_bits,
                                                 exclusive=True)   # nothing else uses these links meanwhile
        for (src, dst), share in delivered.items():
            self.devices[dst].state.received_shares[src] = share
        yield from self.net.compute_each(nodes, self._encode_device,     # the paper's alpha = 1: no encoding (V-D)
                                         free=cfg.alpha == 1 and cfg.encode_count == "alpha_minus_1")

    def _encode(self, dev: int, term: Callable[[int], tuple]) -> tuple:
        """Eqs. (8)-(9) for device ``dev``: its code row over ``term(j)`` for ``j`` in its support."""
        cfg, q, d = self.config, self.q, self.task.d
        g, local = self.group_of[dev]
        members, coef = padded.support(self.codes[g], local)
        Phis, Psis = zip(*(term(self.groups[g][j]) for j in members))
        return self.mode.run(padded.encode_prepared, coef, list(Phis), list(Psis),
                             cfg.ring_bits, cfg.code_fraction_bits, q.k + q.f, d)

    def _encode_device(self, dev: Node) -> None:
        """Device ``dev``: eqs. (8)-(9) from its own and its received shares."""
        st = dev.state
        with padded.encode_charge(self.config.alpha, self.config.encode_count):     # Sec. V-D
            st.Cbar, st.C = self._encode(dev.index, lambda j: st.share if j == dev.index else st.received_shares[j])

    def _encode_pads(self) -> None:
        """The server encodes every device's pads exactly as the device encodes its shares."""
        pads = self.server.state.pads
        self.server.state.encoded_pads = {dev.index: self._encode(dev.index, pads.__getitem__) for dev in self.devices}

    # -- phase 2 ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Phase 2 (Sec. V-B): broadcast epsilon, coded gradients (eq. 11), decoding per group (eq. 12), eq. (5)."""
        cfg, q, mode, (d, c) = self.config, self.q, self.mode, (self.task.d, self.task.c)
        eps = mode.offline(q.encode, self.theta, like=Shape((d, c), np.int64))  # Theta^(1) = 0: eps = Theta (eq. 10)
        totals, used, self._round_check = {}, [], None

        def _decode(g: int, replies: Any) -> Generator:
            """The server decodes group ``g`` as soon as its ``n_responders`` coded gradients are in."""
            local = [self.group_of[n.index][1] for n in replies.nodes]
            pads = [self.server.state.encoded_pads[n.index] for n in replies.nodes]
            totals[g] = yield from self.net.server_compute(self._decode_group, g, local, replies.values, pads, eps)
            if cfg.check_decoding:
                mode.observe(self._check, g, local, totals[g], eps)
            used.extend(n.index for n in replies.nodes)
        groups = [[self.devices[i] for i in group] for group in self.groups]
        yield from self.net.gather_groups(groups, self._device_epoch, kind="coded_gradient", then=_decode,
                                          first=[code.n_responders for code in self.codes], download=eps,
                                          download_kind="epsilon", download_bits=cfg.k, upload_elements=d * c,
                                          upload_bits=cfg.k)
        self.used = used
        G = mode.offline(sum, [totals[g] for g in range(len(self.groups))], like=Shape((d, c), np.float64))
        mode.update(self, G, self.task.m)                                              # eq. (5)

    def _decode_group(self, g: int, local: list[int], received: list, pads: list, eps: Any) -> Any:
        """Server: remove the pads of group ``g``'s responders and decode (eq. 12)."""
        return self.mode.run(padded.unpad_and_decode, self.q, self.codes[g], local, received, pads, eps)

    def _device_epoch(self, dev: Node) -> Any:
        """Eq. (11) on ``dev`` with the epsilon it downloaded (``d^2 c`` MACs)."""
        st = dev.state
        return self.mode.run(padded.coded_gradient, self.q, st.Cbar, st.C, st.received)

    def _check(self, g: int, local: list[int], G: np.ndarray, eps: np.ndarray) -> None:
        """Observer: compare with the plain gradient from the same fixed-point data (not charged)."""
        stats = [(self.devices[i].state.M, self.devices[i].state.G1) for i in self.groups[g]]
        err, bound = padded.check_decoding(self.q, self.codes[g], local, G, eps, stats,
                                           what=f"round {self.epoch}, group {g}")   # refuses a wrapped round
        self.max_decode_error, self.decode_bound = max(self.max_decode_error, err), max(self.decode_bound, bound)
        self._round_check = tuple(map(max, self._round_check or (0.0, 0.0), (err, bound)))
        if err > bound:
            raise AssertionError(f"decoded gradient of group {g} is off by {err:.3g} > bound {bound:.3g}")

    def round_metrics(self, round: int) -> dict:
        """Where the observer checked this round's decoding: its largest error and its bound."""
        return {} if self._round_check is None else dict(zip(("decode_error", "decode_bound"), self._round_check))
