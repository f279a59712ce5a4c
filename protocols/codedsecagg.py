"""CodedSecAgg: Shamir-shared data, straggler-resilient secure aggregation, with grouping.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler mitigation
and secure aggregation in federated learning", Sec. VI (eq. 13, Remark 3), VI-D (grouping and the
inter-group tree, eqs. 14-15, Fig. 3), VII-D (Fig. 7).  The math, its number system (GF(q), scaling
postponed: the decoded aggregate is exact, Remark 3) and what each party sees: :mod:`fednet.codes.secagg`.

Phase 1 (:meth:`CodedSecAgg.setup`, round 0; Sec. VI-A), inside each group of ``n' = D/N`` devices
    Offline (Sec. VII), device ``i`` forms ``M_i = X_i^T X_i`` and ``G_i^(1) = -X_i^T Y_i`` in ``Q<k,f>``,
    Shamir-shares (n', k') the upper triangle of ``M_i`` (Remark 1) and ``2**f G_i^(1)``, sends share ``j``
    to device ``j`` of its group (relayed end-to-end encrypted through the server, Sec. III-B) and sums
    the ``n'`` shares it holds into ``Psi^(i)``, ``Phi^(i)``.
Phase 2 (:meth:`CodedSecAgg.round`, each epoch; Sec. VI-B, VI-D)
    The server broadcasts ``epsilon = Theta^(e) - Theta^(1)``; device i of group g computes ``G~_{g,i} =
    Psi_g^(i) + Phi_g^(i) epsilon`` (eq. 13); the running sums climb the tree of :mod:`fednet.codes.secagg_tree`
    (eqs. 14-15) to the master group (group 0), whose device i uploads share i of ``G^(e)``; the server
    interpolates the first ``k'`` at 0, scales by ``2**(-2f)`` and updates (eq. 5).  Column ``i`` is as slow
    as its slowest member and its tree path: the loss of straggler tolerance due to grouping (Sec. VI-D).
  ``full`` mode checks each aggregate against an independent Python-int computation.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.capacity import check_statistics_capacity
from fednet.algebra.fields import field_dtype
from fednet.algebra.fixed_point import FixedPoint
from fednet.codes import padded, secagg
from fednet.codes.secagg import decode_aggregate, device_share, shamir_share_macs, share_secrets  # re-exported
from fednet.codes.secagg_tree import aggregation_tree
from fednet.codes.shamir import default_points
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.modes import Shape
from fednet.protocol.primitives import CyclicSteps, prepend, received_by
from fednet.sim.simulation import Node
from fednet.topologies.groups import membership

__all__ = ["CodedSecAggConfig", "CodedSecAgg", "CodedSecAggState", "share_secrets", "device_share",
           "decode_aggregate", "shamir_share_macs"]


class CodedSecAggConfig(ProtocolConfig):
    """Parameters of CodedSecAgg (Schlegel et al., Sec. VI).

    Attributes
    ----------
    element_bits : int
        Wire width of ``epsilon`` (``k`` = 48).
    z : int
        Number of colluding agents to protect against (paper's z), ``z >= 0``.
    k_prime : int, optional
        Shamir threshold k' (paper's k'); default ``z + 1``.  Must exceed ``z``.
    groups : int
        Number of groups N; must divide D, and every group needs at least ``k'`` devices.
    k, f : int
        The fixed-point format ``Q<k,f>`` (48, 24 in Sec. VII).
    share_element_bits : int, optional
        Wire width of a field element; default ``bits(q)`` (73 or 72 bits for ``Q<48,24>``).
    field_prime : {"next_above", "largest_below"}
        The prime q of Remark 3, next above or largest below ``2**(k+f)`` (the paper's 72 bits);
        :func:`fednet.codes.secagg.field_prime`.
    sharing_schedule : {"relay_steps", "relay_asap"}
        The phase-1 all-to-all, left open by the paper: ``n' - 1`` steps (step ``r``: local device
        ``i`` sends to ``(i + r) mod n'``, barrier between steps) or every message at once (FIFO links).
    charge_encoding : bool
        Charge the Shamir encoding (``n' k' (d(d+1)/2 + d c)`` MACs) to the devices (default) or
        treat it as offline (the paper's count, Sec. VI-C, lists only the additions of the shares).
    widen_compute : bool
        Charge the devices' phase-2 work (eqs. 13, 15) ``(k + f)/k`` times its metered MACs
        (Remark 3; :func:`fednet.codes.secagg.widened`).  Default False: a MAC is a MAC.
    encode_per_group : bool
        True: each group encodes, shares and adds as soon as its own sharing ends (Sec. VI-D);
        False (default): every device encodes, then every group's all-to-all, then the additions.
    mode : {"full", "timing"}
    check_decoding : bool
        Full mode: verify every decoded aggregate exactly (observer's work, not charged).
    paper_accounting : dict (class)
        The paper's choices, selected by a study's ``accounting = "paper"`` (Sec. VI-C, VI-D, Remark 3).
    """

    paper_accounting: ClassVar[dict[str, Any]] = {"charge_encoding": False, "widen_compute": True,
                                                  "field_prime": "largest_below", "encode_per_group": True}

    element_bits: int = Field(48, ge=1, le=4096)
    z: int = Field(1, ge=0)
    k_prime: int | None = Field(None, ge=1)
    groups: int = Field(1, ge=1)
    k: int = Field(48, ge=8, le=62)
    f: int = Field(24, ge=1)
    share_element_bits: int | None = Field(None, ge=1, le=4096)
    sharing_schedule: Literal["relay_steps", "relay_asap"] = "relay_steps"
    charge_encoding: bool = True
    widen_compute: bool = False
    field_prime: Literal["next_above", "largest_below"] = "next_above"
    encode_per_group: bool = False
    mode: Literal["full", "timing"] = "full"
    check_decoding: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> "CodedSecAggConfig":
        if self.f >= self.k:
            raise ValueError(f"f must be less than k = {self.k}, got {self.f}")
        if self.k_prime is not None and self.k_prime <= self.z:
            raise ValueError(f"k_prime must exceed z = {self.z} (k' > z), got {self.k_prime}")
        return self

    @property
    def threshold(self) -> int:
        """k' (``z + 1`` unless set)."""
        return self.z + 1 if self.k_prime is None else self.k_prime

    @property
    def q(self) -> int:
        """The prime of Remark 3 (:func:`fednet.codes.secagg.field_prime`)."""
        return secagg.field_prime(self.k, self.f, self.field_prime)


@dataclass
class CodedSecAggState(NodeState):
    """A device's private state.

    Attributes
    ----------
    M, G1 : ndarray
        ``X_i^T X_i`` and ``G_i^(1)`` in ``Q<k,f>`` (kept for the observer's check only).
    secrets : (phi, psi)
        The two secrets over GF(q) (Remark 3).
    out_shares, in_shares : list of (phi_j, psi_j)
        Its shares for each device of its group, and those it received (phase 1; freed after combining); in timing
        mode ``in_shares`` may be a :class:`~fednet.algebra.shape.Repeated` of one stand-in (the ``cyclic``
        backend's exchange).
    Phi, Psi : PreparedMatrix (d, d), ndarray (d, c)
        Sums of the shares it holds (Sec. VI-A), kept across rounds.
    """

    M: Any = None
    G1: Any = None
    secrets: Any = None
    out_shares: Any = None
    in_shares: Any = field(default_factory=list)
    Phi: Any = None
    Psi: Any = None


class CodedSecAgg(Protocol):
    """CodedSecAgg (Schlegel et al., Sec. VI) with grouping and the tree of Sec. VI-D.

    Attributes
    ----------
    groups : list of list of int
        Device indices of each group (consecutive, equal sizes ``n' = D/N``); group 0 is the master.
    tree : list of list of (int, int)
        The aggregation steps (sender group, receiver group), eqs. (14)-(15).
    column_tree : networkx.DiGraph
        The device-level tree the shares climb (edges child -> parent, roots: the master group).
    max_decode_error : float
        Full mode: largest max-norm difference between the decoded gradient and the float64 plain one.
    """

    name = "codedsecagg"
    Config = CodedSecAggConfig
    State = CodedSecAggState
    exact_trajectory = True

    @classmethod
    def check(cls, config: CodedSecAggConfig, n_devices: int) -> None:
        """Refuse N not dividing D, groups smaller than k', or k' <= z (Sec. VI-D), or a wire width below k."""
        padded.check_wire_bits(config, "CodedSecAgg")
        secagg.check_groups(n_devices, config.groups, config.threshold, config.q, config.z)

    @classmethod
    def check_dropout(cls, config: CodedSecAggConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout leaving fewer than k' complete share columns on average (Sec. VI-D)."""
        secagg.check_dropout(n_devices, config.groups, config.threshold, dropout)

    @property
    def fp(self) -> FixedPoint:
        """The fixed-point format ``Q<k,f>`` of the configuration."""
        return FixedPoint(self.config.k, self.config.f)

    @property
    def q(self) -> int:
        """The field size q (:attr:`CodedSecAggConfig.q`, Remark 3)."""
        return self.config.q

    # -- phase 1 ---------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Phase 1 (Sec. VI-A): Shamir-share ``2^f G_i^(1)``, ``X_i^T X_i`` in each group; sum the shares held."""
        cfg, mode, q, (d, c) = self.config, self.mode, self.q, (self.task.d, self.task.c)
        self.groups = membership(self.sim, cfg.groups)  # the network's groups, else consecutive (Sec. VI-D)
        check_statistics_capacity(self.fp, self.task.X, self.task.Y,           # refuse a too-narrow Q<k,f> now
                                  memo=getattr(self.task, "memo", None))
        self.n_prime = len(self.groups[0])
        self.points = default_points(self.n_prime)
        self.tree = aggregation_tree(cfg.groups)
        self.column_tree = secagg.column_tree(self.groups, self.tree)
        self.group_of = {dev: (g, i) for g, members in enumerate(self.groups) for i, dev in enumerate(members)}
        self.max_decode_error = 0.0
        self._size, self._bits = secagg.share_size(d, c), cfg.share_element_bits or q.bit_length()
        self._secret_like = tuple(Shape(shape, field_dtype(q)) for shape in secagg.secret_shapes(d, c))
        like = (Shape((d, d), np.int64), Shape((d, c), np.int64)) + self._secret_like
        for dev in self.devices:                          # offline (Sec. VII): not timed; Remark 3
            st = dev.state
            st.M, st.G1, *st.secrets = mode.offline(secagg.device_secrets, self.fp, q, self.task.X[dev.index],
                                                    self.task.Y[dev.index], like=like)
        nodes = [[self.devices[i] for i in members] for members in self.groups]
        if cfg.encode_per_group:                          # each group on its own (Sec. VI-D)
            yield self.env.all_of([self.env.process(self._share_in([group], group)) for group in nodes])
        else:
            yield from self._share_in(nodes, self.devices)

    def _share_in(self, groups: list[list[Node]], devices: list[Node]) -> Generator:
        """Encode on ``devices``, all-to-all inside ``groups``, then ``devices`` add their shares (Sec. VI-A)."""
        cfg = self.config
        if cfg.charge_encoding:
            yield from self.net.compute_each(devices, self._encode)
        else:                                               # offline: the paper's count (Sec. VI-C)
            list(map(self._encode, devices))
        delivered = yield from self.net.exchange(                # all-to-all in each group, via the server
                CyclicSteps(groups), lambda src, dst: src.state.out_shares[self.group_of[dst.index][1]],
                kind="shamir_share", schedule=cfg.sharing_schedule, n_elements=self._size, element_bits=self._bits,
                exclusive=True,                                  # nothing else uses these links meanwhile
                alike=True)                                      # timing mode: every share one stand-in
        for j, shares in received_by(delivered).items():
            self.devices[j].state.in_shares = shares
        yield from self.net.compute_each(devices, self._combine, free=self.n_prime == 1)   # n' = 1: nothing to add

    def _encode(self, dev: Node) -> None:
        """Device ``dev``: Shamir-share its two secrets (Sec. VI-A)."""
        n1, kp, (phi, psi) = self.n_prime, self.config.threshold, dev.state.secrets
        dev.state.out_shares = self.mode.run(
            secagg.share_device_secrets, phi, psi, n1, kp, self.q, self.sim.secret_rng(dev, "shamir"), self.points)

    def _combine(self, dev: Node) -> None:
        """Device ``dev``: sum the shares it holds into ``Phi^(i)``, ``Psi^(i)`` (Sec. VI-A)."""
        i = self.group_of[dev.index][1]
        mine = prepend(dev.state.out_shares[i], dev.state.in_shares)
        dev.state.Phi, dev.state.Psi = self.mode.run(
            secagg.combine_shares, mine, self.q, self.task.d, self.config.k)
        dev.state.out_shares, dev.state.in_shares = None, []    # the device keeps only its sums

    # -- phase 2 ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Phase 2 (Sec. VI-B/D): broadcast epsilon, eq. (13), the tree of eqs. (14)-(15), decode k' master shares."""
        cfg, mode, kp, (d, c) = self.config, self.mode, self.config.threshold, (self.task.d, self.task.c)
        eps = mode.offline(self.fp.encode, self.theta, like=Shape((d, c), np.int64))   # Theta^(1) = 0 (eq. 10)
        masters = yield from self.net.tree_aggregate(
                self.column_tree, self._eq13, self._add, kind="tree_share", root_kind="master_share", first=kp,
                download=eps, download_kind="epsilon", download_bits=cfg.k, n_elements=d * c,
                element_bits=self._bits, alike=True)        # timing mode: one stand-in, one count per node
        cols = [self.group_of[node.index][1] for node in masters.nodes]
        self.used = sorted(m[i] for m in self.groups for i in cols)
        exact, G = yield from self.net.server_compute(self._decode, masters.values, cols)     # Remark 3
        if cfg.check_decoding:
            mode.observe(self._check, exact, G, eps)
        mode.update(self, G, self.task.m)                                              # eq. (5)

    def _decode(self, shares: list, cols: list[int]):
        """Server: interpolate the ``k'`` master shares at 0, scale by ``2**(-2f)`` (Remark 3)."""
        cfg = self.config
        return self.mode.run(secagg.decode_shares, shares, [self.points[i] for i in cols], cfg.threshold, self.q,
                             cfg.k, cfg.f)

    def _eq13(self, node: Node, received: Any = None):
        """Device: its share ``Psi^(i) + Phi^(i) epsilon`` of the gradient (eq. 13); ``received``: default its own."""
        cfg, st = self.config, node.state
        with secagg.widened(cfg.k, cfg.f, cfg.widen_compute):
            return self.mode.run(secagg.device_share, st.Phi, st.Psi, st.received if received is None else received,
                                 self.q)

    def _add(self, acc, part):
        """Device: add a child's running sum to its own (eq. 15)."""
        cfg = self.config
        with secagg.widened(cfg.k, cfg.f, cfg.widen_compute):
            return self.mode.run(secagg.add_shares, acc, part, self.q)

    def _check(self, exact: np.ndarray, G: np.ndarray, eps: np.ndarray) -> None:
        """Observer (not charged): :func:`fednet.codes.secagg.check_aggregate` (capacity, then exactness)."""
        Ms, G1s = [dev.state.M for dev in self.devices], [dev.state.G1 for dev in self.devices]
        err = secagg.check_aggregate(exact, G, Ms, G1s, eps, self.config.f, fp=self.fp,
                                     what=f"the aggregate gradient of round {self.epoch}")
        self.max_decode_error = max(self.max_decode_error, err)
