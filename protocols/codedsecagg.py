"""CodedSecAgg: Shamir-shared data, straggler-resilient secure aggregation, with grouping.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning", Sec. VI (eq. 13, Remark 3), Sec. VI-D
(grouping and the inter-group tree, eqs. 14-15, Fig. 3), Sec. VII-D (Fig. 7).

Number system (Remark 3): shares over GF(q), q the smallest prime above ``2**(k+f)`` (73 bits for
``Q<48,24>``; ``field_prime = "largest_below"`` takes the 72-bit prime below it, the width the paper
counts), scaling postponed until after decoding, so the decoded aggregate is exact (see
:mod:`fednet.codes.secagg`).  Accounting options where the paper counts differently
(``charge_encoding``, ``widen_compute``, ``field_prime``, ``encode_per_group``) are selected together
by a study's ``accounting = "paper"``.

Phase 1 (:meth:`CodedSecAgg.setup`, round 0), inside each group of ``n' = D/N`` devices
    Offline (Sec. VII, not timed): device ``i`` computes ``M_i = X_i^T X_i`` and
    ``G_i^(1) = -X_i^T Y_i`` (``Theta^(1) = 0``) in ``Q<k,f>``.  It Shamir-shares (n', k') the
    upper triangle of ``M_i`` (``d(d+1)/2`` elements; shares of a symmetric matrix with symmetric
    randomness are symmetric, Remark 1) and ``2**f G_i^(1)`` (``d c``); the encoding is charged
    (``n' k' (d(d+1)/2 + d c)`` MACs) unless ``charge_encoding`` is off.  Device ``i`` sends share
    ``j`` to device ``j`` of its group, relayed through the server (end-to-end encrypted in the
    paper, Sec. III-B).  Each device sums the ``n'`` shares it holds (Sec. VI-A: ``(n'-1)(d(d+1)/2
    + d c)`` MACs) into ``Psi^(i)``, ``Phi^(i)`` and keeps ``Phi^(i)`` in prepared limb form.
    The all-to-all exchange is not scheduled by the paper: ``sharing_schedule`` ``relay_steps``
    runs ``n' - 1`` steps (step ``r``: local device ``i`` sends to ``(i + r) mod n'``; barrier
    between steps), ``relay_asap`` launches every message at once (links serve them FIFO).
Phase 2 (:meth:`CodedSecAgg.round`, each epoch)
    The server broadcasts ``epsilon = Theta^(e) - Theta^(1)`` (``Q<k,f>``, ``k`` bits); device i of
    group g computes ``G~_{g,i} = Psi_g^(i) + Phi_g^(i) epsilon`` (eq. 13, ``d^2 c + d c`` MACs).
    The shares climb the tree of :func:`fednet.codes.secagg_tree.aggregation_tree`: device i of a
    sending group forwards its running sum (eq. 15) to device i of the receiving group, which adds
    it (``d c`` MACs).  A transfer starts as soon as its sender holds its own share and its
    children's sums (no global barrier between the logical steps; each device still sends at most
    one and receives at most one message per step, in the order of the steps).  Device i of the
    master group (group 0) uploads share i of ``G^(e)``; the server takes the first ``k'`` uploads,
    cancels the rest, interpolates at 0 (``k' d c`` MACs), scales by ``2**(-2f)`` and updates
    (eq. 5).  Column ``i`` (device i of every group) is therefore as slow as its slowest member and
    its tree path: this is the loss of straggler tolerance due to grouping noted in Sec. VI-D.

What each party sees
    A device sees ``epsilon`` (the model update, public in FL), one share of every group-mate's
    ``M_j`` and ``2**f G_j^(1)`` (any ``z < k'`` colluders learn nothing: Shamir), and in phase 2
    running sums of shares of other groups' gradients -- one share of each, so again nothing.
    The server sees only what is addressed to it in the clear: the ``k'`` master-group shares of
    ``G^(e)`` per round, which determine ``G^(e)`` and nothing else (relayed device-to-device
    messages are encrypted: the engine keeps them in the server's ``relayed`` list, not its view).

Modes (:mod:`fednet.protocol.modes`; one code path)
    ``full``: the exact math above every epoch; ``check_decoding`` compares the decoded integer
    aggregate with an independent Python-int computation from the same fixed-point data.
    ``timing``: the decoded aggregate equals the plain one (up to ``Q<k,f>`` quantisation), so the
    trajectory is plain full-batch gradient descent (cached, shared with CodedPaddedFL) and every
    step charges the closed-form MAC count that full mode checks against the metered kernels at
    every call; traffic and schedules are those of full mode.  The math is in
    :mod:`fednet.codes.secagg`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.capacity import check_statistics_capacity
from fednet.algebra.fields import field_dtype, fixed_point_field, paper_field
from fednet.algebra.meter import recharged
from fednet.algebra.fixed_point import FixedPoint
from fednet.codes.gram import local_statistics
from fednet.codes.secagg import (
    add_shares,
    check_aggregate,
    column_tree,
    combine_shares,
    decode_aggregate,
    decode_shares,
    device_share,
    shamir_share_macs,
    share_device_secrets,
    share_secrets,
)
from fednet.codes.secagg_tree import aggregation_tree
from fednet.codes.shamir import check_shamir_parameters, default_points
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.modes import Shape
from fednet.protocol.primitives import cyclic_steps
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
        Wire width of a field element; default ``bits(q)`` (73 for ``Q<48,24>`` with ``field_prime =
        "next_above"``, 72 with ``"largest_below"``).
    field_prime : {"next_above", "largest_below"}
        The prime q of Remark 3.  ``"next_above"`` (default): the smallest prime above ``2**(k+f)``
        (``2**72 + 15``, 73 bits): the signed map is a bijection on all of ``Z_<k+f>``.
        ``"largest_below"``: the largest prime below ``2**(k+f)`` (``2**72 - 93``, 72 bits: the
        ``k + f`` bits the paper counts, Remark 3 and Sec. VI-C).  It carries signed integers up
        to ``(q-1)/2 = 2**71 - 47`` in magnitude, i.e. all of ``Z_<k+f>`` but the 47 values
        nearest each end: a secret outside that range is refused with a capacity message when it
        is shared (:func:`fednet.codes.secagg.share_secrets`).  At the paper's sizes it decodes
        exactly: on fig7_mnist (D = 120, d = 2000, c = 10) the secrets reach ``|M_i| = 0.42`` and
        ``|G_i^(1)| = 14.3`` and the aggregate ``|G| = 189.5`` over 600 epochs of the trajectory,
        44,000 times below the field's ``(q-1)/2 / 2**(2f) = 2**23`` (measured at this commit).
    sharing_schedule : {"relay_steps", "relay_asap"}
        Schedule of the phase-1 all-to-all (module docstring).
    charge_encoding : bool
        Charge the Shamir encoding of phase 1 to the devices (default) or treat it as offline (the
        paper's count, Sec. VI-C, lists only the additions of the shares).
    widen_compute : bool
        Charge the devices' phase-2 work (eq. 13 and the tree additions of eq. 15) ``(k + f)/k``
        times its metered MACs (rounded up): Remark 3's cost of integer work in ``Z_<k+f>``
        instead of ``Z_<k>``, which the paper applies to CodedSecAgg's epochs.  Default False
        (the kernels' count: a MAC is a MAC whatever the width).
    encode_per_group : bool
        False (default): phase 1 runs network-wide (every device encodes, then the all-to-all of
        every group, then every device adds its shares).  True: each group encodes, shares (its
        own step barriers under ``relay_steps``) and adds as soon as its own sharing ends.
    mode : {"full", "timing"}
    check_decoding : bool
        Full mode: verify every decoded aggregate exactly (observer's work, not charged).

    Accounting
    ----------
    ``paper_accounting`` holds the paper's choices that a study selects with ``accounting =
    "paper"`` (:mod:`fednet.study.config`): ``charge_encoding = False`` (Sec. VI-C),
    ``widen_compute = True`` (Remark 3), ``field_prime = "largest_below"`` (72-bit elements,
    Remark 3) and ``encode_per_group = True`` (Sec. VI-D: CodedSecAgg applied in each group).
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
        """The prime of Remark 3 (``field_prime``): next above or largest below ``2**(k+f)``."""
        if self.field_prime == "largest_below":
            return paper_field(self.k, self.f)
        return fixed_point_field(self.k, self.f)


@dataclass
class CodedSecAggState(NodeState):
    """A device's private state.

    Attributes
    ----------
    M, G1 : ndarray
        ``X_i^T X_i`` and ``G_i^(1)`` in ``Q<k,f>`` (kept for the observer's check only).
    secrets : (phi, psi)
        The two secrets over GF(q) (Remark 3).
    out_shares : list of (phi_j, psi_j)
        Its shares for each device of its group (phase 1, freed after combining).
    in_shares : list of (phi_j, psi_j)
        The shares it received (phase 1).
    Phi, Psi : PreparedMatrix (d, d), ndarray (d, c)
        Sums of the shares it holds (Sec. VI-A), kept across rounds.
    """

    M: Any = None
    G1: Any = None
    secrets: Any = None
    out_shares: Any = None
    in_shares: list = field(default_factory=list)
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
        Full mode: largest max-norm difference between the decoded gradient and the float64 plain
        computation on the same fixed-point data (the exact integer check is separate).
    """

    name = "codedsecagg"
    Config = CodedSecAggConfig
    State = CodedSecAggState
    exact_trajectory = True

    @classmethod
    def check(cls, config: CodedSecAggConfig, n_devices: int) -> None:
        """Refuse N not dividing D, groups smaller than k', or k' <= z (Sec. VI-D)."""
        N = config.groups
        if N > n_devices or n_devices % N:
            raise ValueError(f"groups must divide the number of devices ({n_devices}), got {N}")
        n_prime = n_devices // N
        kp = config.threshold
        if n_prime < kp:
            raise ValueError(f"every group needs at least k_prime = {kp} devices; groups = {N} gives {n_prime}")
        check_shamir_parameters(n_prime, kp, config.q, z=config.z)

    @classmethod
    def check_dropout(cls, config: CodedSecAggConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout that leaves fewer than k' complete columns on average.

        A column (device ``i`` of every group) reaches the server only if all its ``N`` devices
        are present: on average ``n' (1 - dropout)^N`` columns of ``n' = D / N``.
        """
        N = config.groups
        n_prime, kp = n_devices // N, config.threshold
        mean = n_prime * (1.0 - dropout) ** N
        if mean < kp:
            raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of {n_prime} share columns complete on "
                             f"average (all {N} groups present), fewer than the k_prime = {kp} the decoder needs; "
                             f"lower k_prime, groups or dropout")

    @property
    def fp(self) -> FixedPoint:
        """The fixed-point format ``Q<k,f>`` of the configuration."""
        return FixedPoint(self.config.k, self.config.f)

    @property
    def q(self) -> int:
        """The field size, the smallest prime above 2^(k+f) (Remark 3)."""
        return self.config.q

    # -- phase 1 ---------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Phase 1 (Sec. VI-A): Shamir sharing of 2^f G_i^(1) and X_i^T X_i inside each group; sums of received shares."""
        cfg, mode = self.config, self.mode
        d, c, q = self.task.d, self.task.c, self.q
        self.groups = membership(self.sim, cfg.groups)  # the network's groups, else consecutive (Sec. VI-D)
        check_statistics_capacity(self.fp, self.task.X, self.task.Y)          # refuse a too-narrow Q<k,f> now
        self.n_prime = len(self.groups[0])
        self.points = default_points(self.n_prime)
        self.tree = aggregation_tree(cfg.groups)
        self.column_tree = column_tree(self.groups, self.tree)
        self.group_of = {dev: (g, i) for g, members in enumerate(self.groups) for i, dev in enumerate(members)}
        self.max_decode_error = 0.0
        self._size = d * (d + 1) // 2 + d * c
        fdt = field_dtype(q)
        for dev in self.devices:                          # offline (Sec. VII): not timed
            X, Y = self.task.X[dev.index], self.task.Y[dev.index]
            dev.state.M, dev.state.G1 = mode.offline(local_statistics, self.fp, X, Y,
                                                     like=(Shape((d, d), np.int64), Shape((d, c), np.int64)))
            dev.state.secrets = mode.offline(share_secrets, self.fp, q, dev.state.M, dev.state.G1,
                                             like=(Shape((d * (d + 1) // 2,), fdt), Shape((d, c), fdt)))
        nodes = [[self.devices[i] for i in members] for members in self.groups]
        if cfg.encode_per_group:                          # each group on its own (Sec. VI-D)
            yield self.env.all_of([self.env.process(self._share_in([group], group)) for group in nodes])
        else:
            yield from self._share_in(nodes, self.devices)

    def _share_in(self, groups: list[list[Node]], devices: list[Node]) -> Generator:
        """Encode on ``devices``, all-to-all inside ``groups``, then ``devices`` add their shares (Sec. VI-A)."""
        cfg = self.config
        if cfg.charge_encoding:
            yield from self.compute_each(devices, self._encode)
        else:
            for dev in devices:
                self._encode(dev)
        delivered = yield from self.exchange(                # all-to-all in each group, via the server
            cyclic_steps(groups), lambda src, dst: src.state.out_shares[self.group_of[dst.index][1]],
            kind="shamir_share", schedule=cfg.sharing_schedule, n_elements=self._size,
            element_bits=self._share_bits())
        for (_, j), share in delivered.items():
            self.devices[j].state.in_shares.append(share)
        yield from self.compute_each(devices, self._combine, free=self.n_prime == 1)   # n' = 1: nothing to add

    def _share_bits(self) -> int:
        return self.config.share_element_bits or self.q.bit_length()

    def _encode(self, dev: Node) -> None:
        """Device ``dev``: Shamir-share its two secrets (Sec. VI-A)."""
        n1, kp = self.n_prime, self.config.threshold
        d, c, fdt = self.task.d, self.task.c, field_dtype(self.q)
        phi, psi = dev.state.secrets
        dev.state.out_shares = self.mode.run(
            share_device_secrets, phi, psi, n1, kp, self.q, self.sim.secret_rng(dev, "shamir"), self.points,
            macs=shamir_share_macs(n1, kp, self._size),
            like=[(Shape((d * (d + 1) // 2,), fdt), Shape((d, c), fdt))] * n1)

    def _combine(self, dev: Node) -> None:
        """Device ``dev``: sum the shares it holds into ``Phi^(i)``, ``Psi^(i)`` (Sec. VI-A)."""
        i = self.group_of[dev.index][1]
        mine = [dev.state.out_shares[i]] + dev.state.in_shares
        dev.state.Phi, dev.state.Psi = self.mode.run(
            combine_shares, mine, self.q, self.task.d, self.config.k,
            macs=(self.n_prime - 1) * self._size, like=(None, Shape((self.task.d, self.task.c), field_dtype(self.q))))
        dev.state.out_shares, dev.state.in_shares = None, []    # the device keeps only its sums

    # -- phase 2 ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Phase 2 (Sec. VI-B/D): broadcast epsilon, shares of eq. 13, the tree of eqs. 14-15, k' master shares decoded."""
        cfg, mode = self.config, self.mode
        d, c, kp = self.task.d, self.task.c, cfg.threshold
        eps = mode.offline(self.fp.encode, self.theta, like=Shape((d, c), np.int64))   # Theta^(1) = 0 (eq. 10)
        masters = yield from self.tree_aggregate(
            self.column_tree, self._eq13, self._add, kind="tree_share", root_kind="master_share", first=kp,
            download=eps, download_kind="epsilon", download_bits=cfg.k, n_elements=d * c,
            element_bits=self._share_bits())
        cols = [self.group_of[node.index][1] for node in masters.nodes]
        self.used = sorted(m[i] for m in self.groups for i in cols)
        exact, G = yield from self.server_compute(self._decode, masters.values, cols)     # Remark 3
        if cfg.check_decoding:
            mode.observe(self._check, exact, G, eps)
        mode.update(self, G, self.task.m)                                              # eq. (5)

    def _decode(self, shares: list, cols: list[int]):
        d, c, kp = self.task.d, self.task.c, self.config.threshold
        return self.mode.run(decode_shares, shares, [self.points[i] for i in cols], kp, self.q, self.config.k,
                             self.config.f, macs=kp * d * c, like=(Shape((d, c), object), Shape((d, c), np.float64)))

    def _eq13(self, node: Node):
        d, c = self.task.d, self.task.c
        with self._widened():
            return self.mode.run(device_share, node.state.Phi, node.state.Psi, node.state.received, self.q,
                                 macs=d * d * c + d * c, like=Shape((d, c), field_dtype(self.q)))

    def _add(self, acc, part):
        d, c = self.task.d, self.task.c
        with self._widened():
            return self.mode.run(add_shares, acc, part, self.q, macs=d * c, like=Shape((d, c), field_dtype(self.q)))

    def _widened(self):
        """``widen_compute``: charge ``ceil(macs (k + f) / k)`` for the block's MACs (Remark 3)."""
        if not self.config.widen_compute:
            return contextlib.nullcontext()
        k, f = self.config.k, self.config.f
        return recharged(lambda macs: -(-macs * (k + f) // k))

    def _check(self, exact: np.ndarray, G: np.ndarray, eps: np.ndarray) -> None:
        """Observer (not charged): :func:`fednet.codes.secagg.check_aggregate` on every device's data,
        after checking that the plain aggregate fits ``Q<k,f>`` (a wrapped aggregate is a CapacityError)."""
        err = check_aggregate(exact, G, [dev.state.M for dev in self.devices], [dev.state.G1 for dev in self.devices],
                              eps, self.config.f, fp=self.fp, what=f"the aggregate gradient of round {self.epoch}")
        self.max_decode_error = max(self.max_decode_error, err)
