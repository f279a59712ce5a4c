"""CodedSecAgg: Shamir-shared data, straggler-resilient secure aggregation, with grouping.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning", Sec. VI (eq. 13, Remark 3), Sec. VI-D
(grouping and the inter-group tree, eqs. 14-15, Fig. 3), Sec. VII-D (Fig. 7).

Number system (Remark 3)
    Data are ``Q<k,f>`` integers; all share arithmetic is over GF(q) with q the smallest prime
    above ``2**(k+f)`` (``2**72 + 15`` for ``Q<48,24>``), signed integers mapped ``-x -> q - x``.
    Scaling is postponed until after decoding: ``X_i^T X_i`` is shared at scale ``2**f`` and the
    first gradient at scale ``2**(2f)`` (``G_i^(1)`` multiplied by ``2**f`` before encoding), so
    ``Psi + Phi epsilon`` is an exact integer at scale ``2**(2f)`` and the decoded aggregate equals
    ``sum_i (2**f G_i^(1) + M_i epsilon)`` *exactly* in the field.  A decoded value outside
    ``Z_<k+f>`` raises (never wraps silently).  Field elements travel as ``share_element_bits``
    bits (default ``q.bit_length()`` = 73; the paper counts ``k + f`` = 72).

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

Modes
    ``full``: the exact math above every epoch; ``check_decoding`` compares the decoded integer
    aggregate with an independent Python-int computation from the same fixed-point data.
    ``timing``: the decoded aggregate equals the plain one (up to ``Q<k,f>`` quantisation), so the
    trajectory is plain full-batch gradient descent (cached, shared with CodedPaddedFL) and every
    step charges the MACs the real kernels meter at the real shapes; traffic and schedules are
    those of full mode.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Literal

import numpy as np
import simpy
from pydantic import Field, model_validator

from fednet.algebra.capacity import check_fixed_point_holds, check_statistics_capacity
from fednet.algebra.fields import check_field_capacity, fixed_point_field, from_field, to_field
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import charge, macs_of, matmul
from fednet.algebra.modp import PreparedMatrix, add_mod, sum_mod
from fednet.codes.secagg_tree import aggregation_tree
from fednet.codes.shamir import check_shamir_parameters, default_points, shamir_reconstruct, shamir_share
from fednet.protocol.base import Outgoing, Protocol, ProtocolConfig, StragglerShortfall
from fednet.sim.simulation import Node
from protocols.codedpaddedfl import local_statistics, pack_upper, unpack_upper
from topologies.grouping import equal_groups

__all__ = [
    "CodedSecAggConfig",
    "CodedSecAgg",
    "share_secrets",
    "device_share",
    "decode_aggregate",
    "shamir_share_macs",
]


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
        Wire width of a field element; default ``bits(q)`` (73 for ``Q<48,24>``).
    sharing_schedule : {"relay_steps", "relay_asap"}
        Schedule of the phase-1 all-to-all (module docstring).
    charge_encoding : bool
        Charge the Shamir encoding of phase 1 to the devices (default) or treat it as offline.
    mode : {"full", "timing"}
    check_decoding : bool
        Full mode: verify every decoded aggregate exactly (observer's work, not charged).
    """

    element_bits: int = Field(48, ge=1)
    z: int = Field(1, ge=0)
    k_prime: int | None = Field(None, ge=1)
    groups: int = Field(1, ge=1)
    k: int = Field(48, ge=8, le=62)
    f: int = Field(24, ge=1)
    share_element_bits: int | None = Field(None, ge=1)
    sharing_schedule: Literal["relay_steps", "relay_asap"] = "relay_steps"
    charge_encoding: bool = True
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
        """The prime of Remark 3: smallest prime above ``2**(k+f)``."""
        return fixed_point_field(self.k, self.f)


# ----------------------------------------------------------------------------- pure math
def shamir_share_macs(n_prime: int, k_prime: int, size: int) -> int:
    """MACs :func:`fednet.codes.shamir.shamir_share` meters for ``size`` elements (``n' k' size``).

    Used in timing mode, where the real encoding of a (d, d) matrix is not run; a test checks it
    against the metered kernel.
    """
    return int(n_prime) * int(k_prime) * int(size)


def share_secrets(fp: FixedPoint, q: int, M: np.ndarray, G1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two secrets of device i (Remark 3): ``pack_upper(M_i)`` and ``2**f G_i^(1)`` over GF(q).

    Parameters
    ----------
    fp : FixedPoint
        ``Q<k,f>``.
    q : int
        The field, ``q > 2**(k+f)``.
    M : ndarray, (d, d) int64
        ``X_i^T X_i`` in ``Q<k,f>`` (scale ``2**f``).
    G1 : ndarray, (d, c) int64
        ``G_i^(1)`` in ``Q<k,f>``.

    Returns
    -------
    phi : ndarray, (d(d+1)/2,) over GF(q)
    psi : ndarray, (d, c) over GF(q)
        ``G1 * 2**f`` (scale ``2**(2f)``).
    """
    check_field_capacity(q, 2 ** (fp.k + fp.f - 1), what=f"Z_<k+f> integers (Q<{fp.k},{fp.f}>, Remark 3)")
    phi = to_field(pack_upper(M), q, name="M")
    psi = to_field(G1.astype(object) * (1 << fp.f), q, name="G1 * 2**f")
    return phi, psi


def device_share(Phi: PreparedMatrix, Psi: np.ndarray, eps: np.ndarray, q: int) -> np.ndarray:
    """Eq. (13): ``G~ = Psi + Phi epsilon`` over GF(q).

    Parameters
    ----------
    Phi : PreparedMatrix, (d, d) over GF(q)
    Psi : ndarray, (d, c) over GF(q)
    eps : ndarray, (d, c) int64
        ``epsilon`` in ``Q<k,f>`` (signed integers, mapped to the field by the kernel).
    q : int

    Returns
    -------
    ndarray, (d, c) over GF(q); charges ``d^2 c + d c`` MACs.
    """
    return add_mod(Psi, Phi.matmul_signed(eps), q)


def decode_aggregate(shares: np.ndarray, points, k_prime: int, q: int, k: int, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Server: interpolate ``G^(e)`` from ``k'`` shares and scale it (Remark 3).

    Parameters
    ----------
    shares : ndarray, (k', d, c) over GF(q)
    points : sequence of int
        The shares' evaluation points.
    k_prime, q, k, f : int

    Returns
    -------
    exact : ndarray, (d, c) object
        The signed integer aggregate (scale ``2**(2f)``), exactly ``sum_i (2**f G_i^(1) + M_i eps)``.
    G : ndarray, (d, c) float64
        ``exact * 2**(-2f)``.  Charges ``k' d c`` MACs.

    Raises
    ------
    OverflowError
        If the decoded value leaves ``Z_<k+f>`` (the aggregate overflowed ``Q<k,f>``).
    """
    field = shamir_reconstruct(shares, points, k_prime, q)
    exact = from_field(field, q).astype(object)
    lim = 1 << (k + f - 1)
    if exact.size and (exact.max() >= lim or exact.min() < -lim):
        raise OverflowError(f"decoded aggregate leaves Z_<k+f> = Z_<{k + f}>: the gradient overflowed Q<{k},{f}>")
    G = np.array([float(v) for v in exact.ravel()], dtype=np.float64).reshape(exact.shape) * 2.0 ** (-2 * f)
    return exact, G


# ----------------------------------------------------------------------------- the protocol
class CodedSecAgg(Protocol):
    """CodedSecAgg (Schlegel et al., Sec. VI) with grouping and the tree of Sec. VI-D.

    Attributes
    ----------
    groups : list of list of int
        Device indices of each group (consecutive, equal sizes ``n' = D/N``); group 0 is the master.
    tree : list of list of (int, int)
        The aggregation steps (sender group, receiver group), eqs. (14)-(15).
    max_decode_error : float
        Full mode: largest max-norm difference between the decoded gradient and the float64 plain
        computation on the same fixed-point data (the exact integer check is separate).
    """

    name = "codedsecagg"
    Config = CodedSecAggConfig

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

    # -- helpers ---------------------------------------------------------------------------
    @property
    def fp(self) -> FixedPoint:
        """The fixed-point format ``Q<k,f>`` of the configuration."""
        return FixedPoint(self.config.k, self.config.f)

    @property
    def q(self) -> int:
        """The field size, the smallest prime above 2^(k+f) (Remark 3)."""
        return self.config.q

    def _share_bits(self) -> int:
        return self.config.share_element_bits or self.q.bit_length()

    def _share_elements(self) -> int:
        d, c = self.task.d, self.task.c
        return d * (d + 1) // 2 + d * c

    # -- phase 1 ---------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Phase 1 (Sec. VI-A): Shamir sharing of 2^f G_i^(1) and X_i^T X_i inside each group; sums of received shares."""
        cfg = self.config
        D = self.sim.n_devices
        self.groups = equal_groups(D, cfg.groups)
        check_statistics_capacity(self.fp, self.task.X, self.task.Y)          # refuse a too-narrow Q<k,f> now
        self.n_prime = D // cfg.groups
        self.points = default_points(self.n_prime)
        self.tree = aggregation_tree(cfg.groups)
        self.group_of = {dev: (g, i) for g, members in enumerate(self.groups) for i, dev in enumerate(members)}
        self.max_decode_error = 0.0
        full = cfg.mode == "full"
        kp, n1 = cfg.threshold, self.n_prime
        if full:
            fp = self.fp
            for dev in self.devices:                      # offline (Sec. VII): not timed
                M, G1 = local_statistics(fp, self.task.X[dev.index], self.task.Y[dev.index])
                dev.state.M, dev.state.G1 = M, G1         # kept for the observer's check only
                dev.state.secrets = share_secrets(fp, self.q, M, G1)
            if cfg.charge_encoding:
                yield from self.compute_each(self.devices, self._encode)
            else:
                for dev in self.devices:
                    self._encode(dev)
        elif cfg.charge_encoding:
            size = self._share_elements()
            yield from self.compute_each(self.devices, None, macs=lambda n: shamir_share_macs(n1, kp, size))
        # all-to-all inside each group, relayed through the server
        steps = []
        for r in range(1, n1):
            step = []
            for members in self.groups:
                for i, dev in enumerate(members):
                    dst = members[(i + r) % n1]
                    payload = self.devices[dev].state.out_shares[(i + r) % n1] if full else np.empty(0)
                    step.append(Outgoing(self.devices[dev], self.devices[dst], payload, "shamir_share",
                                         self._share_elements(), self._share_bits()))
            steps.append(step)
        if steps:
            delivered = yield from self.send_all(steps, barrier=cfg.sharing_schedule == "relay_steps")
        else:
            delivered = []
        for dev in self.devices:
            dev.state.in_shares = []
        if full:
            for step in delivered:
                for msg in step:
                    self.devices[msg.dst].state.in_shares.append(msg.payload)
            yield from self.compute_each(self.devices, self._combine)
        else:
            def sum_macs(node: Node) -> int:
                return macs_of(("csa-sum", n1, self._share_elements()), lambda: sum_mod(
                    [np.zeros(self._share_elements(), np.int64)] * n1, 2**31 - 1))
            yield from self.compute_each(self.devices, None, macs=sum_macs)

    def _encode(self, dev: Node) -> None:
        """Device ``dev``: Shamir-share its two secrets (Sec. VI-A)."""
        cfg = self.config
        rng = self.sim.secret_rng(dev, "shamir")
        phi, psi = dev.state.secrets
        sp = shamir_share(phi, self.n_prime, cfg.threshold, self.q, rng, self.points)
        sg = shamir_share(psi, self.n_prime, cfg.threshold, self.q, rng, self.points)
        dev.state.out_shares = [(sp[j], sg[j]) for j in range(self.n_prime)]

    def _combine(self, dev: Node) -> None:
        """Device ``dev``: sum the shares it holds into ``Phi^(i)``, ``Psi^(i)`` and prepare ``Phi``."""
        g, i = self.group_of[dev.index]
        mine = [dev.state.out_shares[i]] + list(dev.state.in_shares)
        phi = sum_mod([s[0] for s in mine], self.q)
        psi = sum_mod([s[1] for s in mine], self.q)
        dev.state.Phi = PreparedMatrix(unpack_upper(phi, self.task.d), self.q, rhs_bits=self.config.k)
        dev.state.Psi = psi
        dev.state.out_shares = None                       # the device keeps only its sums
        dev.state.in_shares = []

    # -- phase 2 ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Phase 2 (Sec. VI-B/D): broadcast epsilon, shares of eq. 13, the tree of eqs. 14-15, k' master shares decoded."""
        cfg = self.config
        d, c = self.task.d, self.task.c
        full = cfg.mode == "full"
        kp = cfg.threshold
        eps = self.fp.encode(self.theta) if full else np.zeros((d, c), np.int64)   # Theta^(1) = 0 (eq. 10)
        env = self.env
        children: dict[int, list[int]] = {g: [] for g in range(len(self.groups))}
        parent: dict[int, int] = {}
        for step in self.tree:
            for src, dst in step:
                children[dst].append(src)
                parent[src] = dst
        inbox = {(g, ch, i): env.event() for g in children for ch in children[g] for i in range(self.n_prime)}
        arrivals: list[tuple[int, np.ndarray]] = []
        done = env.event()
        alive_columns = [i for i in range(self.n_prime)
                         if all(self.sim.available(self.devices[m[i]]) for m in self.groups)]
        if len(alive_columns) < kp:
            raise StragglerShortfall(f"{self.label}: round {epoch} needs {kp} complete columns, "
                                     f"only {len(alive_columns)} have every device available")
        share_bits = self._share_bits()
        eq13 = None if full else macs_of(("csa-eq13", d, c), lambda: (
            matmul(np.zeros((d, d)), np.zeros((d, c))), charge(d * c)))
        add_macs = d * c

        def device(g: int, i: int) -> Generator:
            node = self.devices[self.groups[g][i]]
            try:
                msg = yield from self.send(self.server, node, eps, kind="epsilon", element_bits=cfg.k)
                node.state.received = msg.payload
                if full:
                    share = yield from self.sim.compute(node, self._eq13, node)
                else:
                    share = yield from self.sim.compute(node, None, macs=eq13)
                for ch in children[g]:                       # in step order
                    part = yield inbox[(g, ch, i)]
                    if full:
                        share = yield from self.sim.compute(node, add_mod, share, part, self.q)
                    else:
                        yield from self.sim.compute(node, None, macs=add_macs)
                payload = share if full else np.empty(0)
                if g == 0:
                    yield from self.send(node, self.server, payload, kind="master_share",
                                         n_elements=d * c, element_bits=share_bits)
                    arrivals.append((i, share))
                    if len(arrivals) >= kp and not done.triggered:
                        done.succeed()
                else:
                    dst = self.devices[self.groups[parent[g]][i]]
                    yield from self.send(node, dst, payload, kind="tree_share", n_elements=d * c,
                                         element_bits=share_bits)
                    ev = inbox[(parent[g], g, i)]
                    if not ev.triggered:
                        ev.succeed(share)
            except simpy.Interrupt:
                return

        procs = [env.process(device(g, i)) for g in range(len(self.groups)) for i in alive_columns]
        watch = env.all_of(procs)
        yield done | watch
        for p in procs:
            if p.is_alive:
                p.interrupt("cancelled: k' master shares arrived")
        if len(arrivals) < kp:
            raise StragglerShortfall(f"{self.label}: round {epoch} got {len(arrivals)} master shares, needs {kp}")
        first = arrivals[:kp]
        cols = [i for i, _ in first]
        self.used = sorted(m[i] for m in self.groups for i in cols)
        if full:
            shares = np.stack([s for _, s in first])
            pts = [self.points[i] for i in cols]
            exact, G = yield from self.server_compute(decode_aggregate, shares, pts, kp, self.q, cfg.k, cfg.f)
            if cfg.check_decoding:
                self._check(exact, G, eps)
            self.step(G, self.task.m)
        else:
            dec = macs_of(("csa-decode", kp, d, c), lambda: matmul(np.zeros((1, kp)), np.zeros((kp, d * c))))
            yield from self.server_compute(None, macs=dec)

    def _eq13(self, node: Node) -> np.ndarray:
        return device_share(node.state.Phi, node.state.Psi, node.state.received, self.q)

    def _check(self, exact: np.ndarray, G: np.ndarray, eps: np.ndarray) -> None:
        """Observer (not charged): the decoded integers against an independent computation.

        ``d <= 256``: Python-int arithmetic, exact.  Larger ``d``: the same identity modulo the
        independent prime ``2**61 - 1`` (sum of the ``M_i`` in int64, then one exact modular product),
        which a wrong entry passes with probability about ``2**-61``.
        """
        f = self.config.f
        M_total = np.zeros((self.task.d, self.task.d), dtype=np.int64)
        for dev in self.devices:                # |M_i| < 2**(k-1), D < 2**14: no int64 overflow
            M_total += dev.state.M
        G1_total = sum(dev.state.G1.astype(object) for dev in self.devices) * (1 << f)
        agg = self.fp.decode(M_total) @ self.fp.decode(eps) + self.fp.decode(G1_total.astype(float)) * 2.0**-f
        check_fixed_point_holds(self.fp, float(np.abs(agg).max()), f"the aggregate gradient of round {self.epoch}")
        if self.task.d <= 256:
            want = M_total.astype(object).dot(eps.astype(object)) + G1_total
            ok = np.array_equal(exact, want)
        else:
            p2 = 2**61 - 1
            lhs = (exact % p2).astype(np.int64)
            prod = PreparedMatrix(M_total % p2, p2).matmul(eps % p2)   # canonical residues mod p2
            rhs = (prod.astype(object) + G1_total) % p2
            ok = np.array_equal(lhs.astype(object), rhs)
        if not ok:
            raise AssertionError("decoded CodedSecAgg aggregate differs from the exact fixed-point aggregate")
        plain = (M_total.astype(np.float64) @ (eps.astype(np.float64) * 2.0**-f) * 2.0**-f
                 + np.array([float(v) for v in G1_total.ravel()]).reshape(G.shape) * 2.0 ** (-2 * f))
        self.max_decode_error = max(self.max_decode_error, float(np.abs(G - plain).max()))

    def evaluate(self) -> tuple[float, float]:
        """Full mode: the model's accuracy; timing mode: the cached exact trajectory's."""
        if self.config.mode == "full":
            return super().evaluate()
        return self.task.full_batch_trajectory(self.epoch)[self.epoch]
