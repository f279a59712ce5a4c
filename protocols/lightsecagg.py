"""LightSecAgg: conventional minibatch FL whose uploads are protected by one-shot mask recovery.

Source: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg: a lightweight and versatile
design for secure aggregation in federated learning", MLSys 2022 (summary and test vectors in
``shared/references.md``); the baseline of Schlegel et al., Sec. VII-D (Fig. 7), where data are
32-bit numbers and the devices run conventional minibatch gradient descent (Sec. VII-A).

Each round ``e``, with N = D users, privacy ``T = z``, target ``U`` (``T < U <= N``, tolerating
``N - U`` dropped or straggling users):

1. Offline (mask phase): user ``i`` draws a uniform mask ``z_i`` in GF(p)^(dc), splits it into
   ``U - T`` pieces of length ``L = ceil(dc / (U - T))``, appends ``T`` uniform noise pieces,
   encodes them at the users' points (``N U L`` MACs, :func:`fednet.codes.lagrange.lsa_encode_mask`)
   and sends ``z~_ij`` (``L`` elements) to every other user ``j`` through the server.
2. Online: the server broadcasts ``Theta`` (float32); user ``i`` computes its minibatch gradient
   (``2 b_i d c`` MACs, as conventional FL), quantises it (``round(G 2**b)``, negatives to ``p + v``),
   adds its mask (``d c`` MACs) and uploads ``d c`` elements.
3. The server takes the first ``U`` masked uploads as the survivor set ``U1`` (the fastest; the
   others are dropped this round), announces ``U1`` (``|U1|`` numbers to each survivor); survivor
   ``j`` waits for the encoded masks of every member of ``U1``, sums them
   (``(|U1| - 1) L`` MACs) and uploads ``s_j`` (``L`` elements); from ``U`` of them the server
   decodes ``sum_{i in U1} z_i`` (``(U - T) U L`` MACs), unmasks the sum of the masked uploads
   (``|U1| d c`` MACs), dequantises and updates with ``m`` = the survivors' points (eqs. 4-5).

What runs in parallel (``offline_parallel``, default True): following the LightSecAgg paper, the
mask phase of round ``e`` overlaps the model download and the local training of round ``e`` -- the
encoding shares the device's processor with training (encoding first), the ``N - 1`` encoded masks
share the uplink with the masked upload (first come, first served).  With ``offline_parallel``
False every mask is delivered before the round's model is broadcast.

Choice of U: ``U`` is a parameter; the baseline's study sweeps ``U`` for each ``(D, z)`` and keeps the
fastest to the target accuracy (smaller ``U`` waits for fewer users but drops more of the non-iid
data each round and lengthens the pieces, ``L = dc / (U - T)``).  ``U`` defaults to ``N``.

What each party sees: the server sees each survivor's masked gradient (uniform in GF(p)^(dc) for
``T >= 0``: a one-time pad), the ``s_j`` of the survivors (which reveal nothing beyond the aggregate
mask for up to ``T`` colluders) and so learns only ``sum_{i in U1} G_i``; a user sees ``Theta``, the
survivor list and one encoded mask share ``z~_ij`` from each user, which for any ``T`` colluding
users is uniformly distributed (the ``T`` noise pieces).  Device-to-device shares are relayed
through the (encrypted) server; audits drop them from the relay's view.

Modes: ``full`` runs the finite-field math above every round; ``timing`` computes the same
quantised gradients (so the same survivor sets and trajectory) but skips the masks, charging the
MACs the real kernels meter at the real shapes.  Traffic is identical.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Literal

import numpy as np
import simpy
from pydantic import Field, model_validator

from fednet.algebra.fields import check_prime, uniform
from fednet.algebra.meter import charge, macs_of
from fednet.algebra.modp import add_mod, sub_mod, sum_mod
from fednet.codes.lagrange import (
    check_lsa_parameters,
    default_lsa_points,
    dequantize,
    lsa_aggregate_encoded,
    lsa_decode_aggregate_mask,
    lsa_encode_mask,
    lsa_piece_length,
    quantize,
)
from fednet.protocol.base import Protocol, ProtocolConfig, StragglerShortfall
from fednet.sim.simulation import Node
from protocols.conventional import minibatch_gradient

__all__ = ["LightSecAggConfig", "LightSecAgg", "mask_upload", "unmask_aggregate"]

#: Largest prime below 2**32: 32-bit field elements (the paper's 32-bit baseline data).
P32 = 2**32 - 5


class LightSecAggConfig(ProtocolConfig):
    """Parameters of the LightSecAgg baseline.

    Attributes
    ----------
    element_bits : int
        Wire width of a field element and of the float32 model (32).
    z : int
        Privacy T: number of colluding users (paper's z = LightSecAgg's T), ``z >= 0``.
    U : int, optional
        Target number of survivors, ``z < U <= D``; default D.
    p : int
        The prime field (default ``2**32 - 5``).
    quant_bits : int
        Fractional bits ``b`` of the quantisation ``round(G 2**b)``.
    minibatch_fraction : float
        Fraction of each device's points per round (0.2, Sec. VII-A).
    offline_parallel : bool
        Overlap the mask phase with download and training (module docstring).
    mask_relay : {"bundled", "per_message"}
        ``per_message``: user i sends each ``z~_ij`` as its own message relayed to user j
        (``N (N - 1)`` messages a round).  ``bundled`` (default): user i uploads its ``N - 1``
        encoded shares as one message, and once every available user's bundle is in, the server
        forwards to each user one bundle of the ``N - 1`` shares addressed to it (same bits, ``2N``
        messages; the offline phase then ends with a barrier at the server).
    mode : {"full", "timing"}
    """

    element_bits: int = Field(32, ge=1)
    z: int = Field(1, ge=0)
    U: int | None = Field(None, ge=1)
    p: int = P32
    quant_bits: int = Field(16, ge=0, le=40)
    minibatch_fraction: float = Field(0.2, gt=0.0, le=1.0)
    offline_parallel: bool = True
    mask_relay: Literal["bundled", "per_message"] = "bundled"
    mode: Literal["full", "timing"] = "full"

    @model_validator(mode="after")
    def _prime(self) -> "LightSecAggConfig":
        check_prime(self.p)
        if self.U is not None and self.U <= self.z:
            raise ValueError(f"U must exceed z = {self.z} (T < U), got {self.U}")
        return self


def mask_upload(G: np.ndarray, z_mask: np.ndarray, b: int, p: int, n_summands: int) -> np.ndarray:
    """A user's upload ``Q(G) + z_i`` over GF(p).

    Parameters
    ----------
    G : ndarray, (d, c) float64
        Local gradient.
    z_mask : ndarray, (d c,) over GF(p)
    b, p : int
        Quantisation bits and field.
    n_summands : int
        Number of uploads that will be summed (the field must hold their sum).

    Returns
    -------
    ndarray, (d c,) over GF(p); charges ``d c`` MACs.

    Raises
    ------
    ValueError
        If the field is too small for the sum of ``n_summands`` quantised gradients.
    """
    return add_mod(quantize(G.reshape(-1), b, p, n_summands=n_summands), z_mask, p)


def unmask_aggregate(masked: list[np.ndarray], s: np.ndarray, alphas, betas, U: int, T: int,
                     shape: tuple[int, int], b: int, p: int) -> np.ndarray:
    """Server: ``sum x~_i - decode(s)``, dequantised (LightSecAgg, references.md).

    Parameters
    ----------
    masked : list of ndarray, each (d c,) over GF(p)
        Masked uploads of the survivors U1.
    s : ndarray, (R, L) over GF(p)
        Aggregated encoded masks of ``R >= U`` survivors, at points ``alphas``.
    alphas, betas : sequences of int
    U, T : int
    shape : (d, c)
    b, p : int

    Returns
    -------
    ndarray, (d, c) float64
        ``sum_{i in U1} Q(G_i) / 2**b``; charges ``(U - T) U L + |U1| d c`` MACs.
    """
    n = shape[0] * shape[1]
    agg_mask = lsa_decode_aggregate_mask(s, alphas, betas, U, T, n, p)
    total = sum_mod(masked, p)
    return dequantize(sub_mod(total, agg_mask, p), b, p).reshape(shape)


class LightSecAgg(Protocol):
    """LightSecAgg baseline (So et al., MLSys 2022) on conventional minibatch FL; module docstring."""

    name = "lightsecagg"
    Config = LightSecAggConfig
    setup_dropouts = "none"                               # masks are drawn each round: absentees recorded only

    @classmethod
    def check(cls, config: LightSecAggConfig, n_devices: int) -> None:
        """Refuse parameters outside T < U <= N (So et al.), via :func:`check_lsa_parameters`."""
        U = n_devices if config.U is None else config.U
        check_lsa_parameters(n_devices, U, config.z, config.p, quant_bits=config.quant_bits)

    @property
    def U(self) -> int:
        """The target number of survivors U (the configured value, or D)."""
        return self.sim.n_devices if self.config.U is None else self.config.U

    def setup(self) -> Generator:
        """No data sharing: per-device minibatch streams and the mask-code points."""
        N = self.sim.n_devices
        self.alphas, self.betas = default_lsa_points(N, self.U)
        for dev in self.devices:
            n = self.task.X[dev.index].shape[0]
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * n)))
        return
        yield  # pragma: no cover

    def _rows(self, dev: Node, epoch: int) -> np.ndarray:
        """Minibatch of ``dev`` in round ``epoch``: a stream keyed by (device, round), so the draw does
        not depend on which earlier rounds the device took part in (full and timing modes agree)."""
        return self.minibatch_rows(dev, dev.state.batch, epoch)

    def _batched_gradients(self, devs: list[Node], epoch: int) -> dict[int, np.ndarray]:
        """Timing mode: every device's quantised minibatch gradient in a few batched products
        (host speed only; each device is charged its own MACs when it computes)."""
        b = self.config.quant_bits
        theta = self.theta.astype(np.float32).astype(np.float64)     # the model the devices download
        out: dict[int, np.ndarray] = {}
        shapes: dict[tuple[int, int], list[Node]] = {}
        for dev in devs:
            shapes.setdefault((self.task.X[dev.index].shape[0], dev.state.batch), []).append(dev)
        for (n, bsz), group in shapes.items():
            for start in range(0, len(group), 32):
                part = group[start:start + 32]
                rows = [self._rows(dev, epoch) for dev in part]
                Xb = np.stack([self.task.X[dev.index][r] for dev, r in zip(part, rows)])
                Yb = np.stack([self.task.Y[dev.index][r] for dev, r in zip(part, rows)])
                G = np.matmul(Xb.transpose(0, 2, 1), np.matmul(Xb, theta) - Yb) * (n / bsz)
                for dev, g in zip(part, G):
                    quantize(g.reshape(-1), b, self.config.p, n_summands=self.U)   # the capacity check
                    out[dev.index] = np.rint(g * 2.0**b) / 2.0**b
        return out

    # -- device work -----------------------------------------------------------------------
    def _draw_mask(self, dev: Node, epoch: int) -> None:
        """Draw ``z_i`` for this round (free: randomness is not a MAC) and the encoder's stream."""
        dev.state.rng_mask = self.sim.secret_rng(dev, "masks", epoch)
        dev.state.mask = uniform(dev.state.rng_mask, self.config.p, self.task.d * self.task.c)

    def _encode(self, dev: Node) -> np.ndarray:
        """Offline phase of user ``dev``: encoded mask shares for all N users, ``(N, L)``."""
        cfg = self.config
        return lsa_encode_mask(dev.state.mask, self.U, cfg.z, cfg.p, dev.state.rng_mask, self.alphas, self.betas)

    def _gradient(self, dev: Node):
        """Online phase (full mode): minibatch gradient (eq. 3 estimate), quantised and masked."""
        theta = dev.state.received.astype(np.float64)
        G = minibatch_gradient(self.task.X[dev.index], self.task.Y[dev.index], theta, self._rows(dev, self.epoch))
        return mask_upload(G, dev.state.mask, self.config.quant_bits, self.config.p, self.U)

    # -- the round ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """One round: offline masks (overlapping training), masked uploads, survivor set, aggregated encoded masks, unmasking."""
        cfg = self.config
        env = self.env
        N, U, T = self.sim.n_devices, self.U, cfg.z
        d, c = self.task.d, self.task.c
        L = lsa_piece_length(d * c, U, T)
        full = cfg.mode == "full"
        bits = cfg.element_bits
        enc_macs = None if full else macs_of(("lsa-encode", N, U, T, d * c), lambda: lsa_encode_mask(
            np.zeros(d * c, np.int64), U, T, 2**31 - 1, np.random.default_rng(0), *default_lsa_points(N, U)))
        available = [dev for dev in self.devices if self.sim.available(dev)]
        if not full:
            pre = self._batched_gradients(available, epoch)
            grad_macs = {dev.index: macs_of(("lsa-grad", self.task.X[dev.index].shape[0], dev.state.batch, d, c),
                                             lambda dev=dev: (minibatch_gradient(
                                                 np.zeros_like(self.task.X[dev.index]), np.zeros_like(self.task.Y[dev.index]),
                                                 np.zeros((d, c)), np.arange(dev.state.batch)), charge(d * c)))
                         for dev in available}
        if len(available) < U:
            raise StragglerShortfall(f"{self.label}: round {epoch} needs U = {U} users, {len(available)} available")
        delivered = {(i, j): env.event() for i in range(N) for j in range(N)}   # (i, i): own share encoded
        received: dict[int, dict[int, object]] = {j: {} for j in range(N)}
        arrivals: list[tuple[int, object]] = []
        phase1 = env.event()
        procs: list = []

        uploaded = {dev.index: env.event() for dev in available}
        bundles: dict[int, object] = {}

        def offline(dev: Node) -> Generator:
            i = dev.index
            try:
                if full:
                    self._draw_mask(dev, epoch)
                    enc = yield from self.sim.compute(dev, self._encode, dev, timing_key="compute-mask")
                else:
                    yield from self.sim.compute(dev, None, macs=enc_macs, timing_key="compute-mask")
                    enc = None
                received[i][i] = enc[i] if full else None
                delivered[(i, i)].succeed()
                if cfg.mask_relay == "per_message":
                    sends = [env.process(one(dev, j, enc[j] if full else np.empty(0))) for j in range(N) if j != i]
                    procs.extend(sends)
                    yield env.all_of(sends)
                else:
                    yield from self.send(dev, self.server, enc if full else np.empty(0), kind="encoded_mask_relay",
                                         n_elements=(N - 1) * L, element_bits=bits, encrypted=True, timing_key="mask")
                    bundles[i] = enc
                    uploaded[i].succeed()
            except simpy.Interrupt:
                return

        def one(dev: Node, j: int, payload) -> Generator:
            try:
                msg = yield from self.send(dev, self.devices[j], payload, kind="encoded_mask",
                                           n_elements=L, element_bits=bits, timing_key="mask")
            except simpy.Interrupt:
                return
            received[j][dev.index] = msg.payload
            delivered[(dev.index, j)].succeed()

        def forward(dev: Node) -> Generator:
            """Server to user j: the encoded shares addressed to j, once every bundle is in."""
            j = dev.index
            try:
                yield env.all_of(list(uploaded.values()))
                senders = [i for i in sorted(bundles) if i != j]
                payload = np.stack([bundles[i][j] for i in senders]) if full else np.empty(0)
                msg = yield from self.send(self.server, dev, payload, kind="encoded_mask_relay",
                                           n_elements=len(senders) * L, element_bits=bits, encrypted=True,
                                           timing_key="mask")
            except simpy.Interrupt:
                return
            for k, i in enumerate(senders):
                received[j][i] = msg.payload[k] if full else None
                delivered[(i, j)].succeed()

        fwd = [env.process(forward(dev)) for dev in available] if cfg.mask_relay == "bundled" else []
        procs.extend(fwd)

        def online(dev: Node) -> Generator:
            try:
                msg = yield from self.send(self.server, dev, self.theta.astype(np.float32), kind="model",
                                           element_bits=bits)
                dev.state.received = msg.payload
                if full:
                    upload = yield from self.sim.compute(dev, self._gradient, dev)
                else:
                    yield from self.sim.compute(dev, None, macs=grad_macs[dev.index])
                    upload = pre[dev.index]
                yield from self.send(dev, self.server, upload if full else np.empty(0), kind="masked_model",
                                     n_elements=d * c, element_bits=bits)
            except simpy.Interrupt:
                return
            arrivals.append((dev.index, upload))
            if len(arrivals) >= U and not phase1.triggered:
                phase1.succeed()

        if cfg.offline_parallel:
            for dev in available:
                procs.append(env.process(offline(dev)))
                procs.append(env.process(online(dev)))
        else:
            offs = [env.process(offline(dev)) for dev in available]
            procs.extend(offs)
            yield env.all_of(offs + fwd)                              # every mask delivered
            procs.extend(env.process(online(dev)) for dev in available)
        yield phase1
        U1 = sorted(i for i, _ in arrivals[:U])
        uploads = {i: up for i, up in arrivals[:U]}

        def second(dev: Node) -> Generator:
            j = dev.index
            yield from self.send(self.server, dev, np.asarray(U1), kind="survivors", element_bits=bits,
                                 timing_key="mask")
            yield env.all_of([delivered[(i, j)] for i in U1])
            if full:
                s = yield from self.sim.compute(dev, lsa_aggregate_encoded, [received[j][i] for i in U1], cfg.p,
                                                timing_key="compute-mask")
            else:
                yield from self.sim.compute(dev, None, macs=(len(U1) - 1) * L, timing_key="compute-mask")
                s = None
            yield from self.send(dev, self.server, s if full else np.empty(0), kind="aggregated_mask",
                                 n_elements=L, element_bits=bits, timing_key="mask")
            return j, s

        # users outside U1 are dropped for this round; their work goes on until the round ends
        seconds = [env.process(second(self.devices[i])) for i in U1]
        yield env.all_of(seconds)
        replies = [p.value for p in seconds][:U]
        for p in procs:                                   # whatever is still running is not needed
            if p.is_alive:
                p.interrupt("round over")
        if full:
            s = np.stack([r[1] for r in replies])
            alphas = [self.alphas[r[0]] for r in replies]
            G = yield from self.server_compute(unmask_aggregate, [uploads[i] for i in U1], s, alphas,
                                               self.betas, U, T, (d, c), cfg.quant_bits, cfg.p)
        else:
            dec = macs_of(("lsa-decode", U, T, L, len(U1), d * c), lambda: unmask_aggregate(
                [np.zeros(d * c, np.int64)] * len(U1), np.zeros((U, L), np.int64), self.alphas[:U],
                self.betas, U, T, (d, c), 0, 2**31 - 1))
            yield from self.server_compute(None, macs=dec)
            G = sum(uploads[i] for i in U1)
        self.used = U1
        self.step(G, sum(self.task.X[i].shape[0] for i in U1))
