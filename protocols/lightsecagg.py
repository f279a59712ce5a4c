"""LightSecAgg: conventional minibatch FL whose uploads are protected by one-shot mask recovery.

Source: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg: a lightweight and versatile
design for secure aggregation in federated learning", MLSys 2022 (summary and test vectors in
``shared/references.md``); the baseline of Schlegel et al., Sec. VII-D (Fig. 7), where data are
32-bit numbers and the devices run conventional minibatch gradient descent (Sec. VII-A).  The mask
math, its MAC counts and what each party sees are in :mod:`fednet.codes.lightsecagg`.

Each round ``e``, with N = D users, privacy ``T = z``, target ``U`` (``T < U <= N``, tolerating
``N - U`` dropped or straggling users):

1. Offline (mask phase): user ``i`` draws a uniform mask ``z_i`` in GF(p)^(dc), splits it into
   ``U - T`` pieces of length ``L = ceil(dc / (U - T))``, appends ``T`` uniform noise pieces,
   encodes them at the users' points and sends ``z~_ij`` (``L`` elements) to every other user ``j``
   through the server.
2. Online: the server broadcasts ``Theta`` (float32); user ``i`` computes its minibatch gradient
   (as conventional FL), quantises it (``round(G 2**b)``, negatives to ``p + v``), adds its mask and
   uploads ``d c`` elements.
3. The server takes the first ``U`` masked uploads as the survivor set ``U1`` (the fastest; the
   others are dropped this round) and announces ``U1``; survivor ``j`` waits for the encoded masks of
   every member of ``U1``, sums them and uploads ``s_j`` (``L`` elements); from ``U`` of them the
   server decodes ``sum_{i in U1} z_i``, unmasks the sum of the masked uploads, dequantises and
   updates with ``m`` = the survivors' points (eqs. 4-5).

What runs in parallel (``offline_parallel``, default True): following the LightSecAgg paper, the
mask phase of round ``e`` overlaps the model download and the local training of round ``e`` -- the
encoding shares the device's processor with training (encoding first), the ``N - 1`` encoded masks
share the uplink with the masked upload (first come, first served).  With ``offline_parallel``
False every mask is delivered before the round's model is broadcast.

Randomness: masks and mask noise come from the secret stream.  The mask steps draw their compute
delays and losses under their own ``timing_key = "mask"``, so the model download, the training step
and the masked upload take the same keyed draws, and the same minibatches, as conventional FL's at
one seed (a paired comparison).

Choice of U: ``U`` is a parameter; the baseline's study sweeps ``U`` for each ``(D, z)`` and keeps the
fastest to the target accuracy (smaller ``U`` waits for fewer users but drops more of the non-iid
data each round and lengthens the pieces, ``L = dc / (U - T)``).  ``U`` defaults to ``N``.

Modes: ``timing`` computes the same quantised gradients on the host, those of the survivors the aggregate
sums (so the same survivor sets and trajectory), but skips the masks, charging the MACs the real kernels
meter at the real shapes; traffic is identical.  Where it can, the engine's ``masked`` backend
(:mod:`fednet.sim.engine.backends.masked`) replays a timing-mode round without a SimPy process per user
(``FEDNET_ENGINE=-masked`` runs the processes), and ``U = D`` runs on one task and seed share their models
(:meth:`LightSecAgg.trajectory_group`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.fields import check_prime, uniform
from fednet.codes import lightsecagg as lsa
from fednet.codes.lightsecagg import mask_upload, unmask_aggregate  # noqa: F401 (re-exported: tests import them here)
from fednet.learning.models import minibatch_gradient  # noqa: F401 (re-exported)
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.modes import Shape, Timing
from fednet.protocol.primitives import Mailbox
from fednet.sim.simulation import Node

__all__ = ["LightSecAggConfig", "LightSecAgg", "LightSecAggState", "mask_upload", "unmask_aggregate",
           "minibatch_gradient"]

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

    element_bits: int = Field(32, ge=1, le=4096)
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
        try:
            check_prime(self.p)
        except ValueError as e:
            raise ValueError(f"p = {self.p} is not usable as the field of LightSecAgg: {e}") from None
        if self.U is not None and self.U <= self.z:
            raise ValueError(f"U must exceed z = {self.z} (T < U), got {self.U}")
        return self


@dataclass
class LightSecAggState(NodeState):
    """A user's private state.

    Attributes
    ----------
    batch : int
        Its minibatch size ``b_i``.
    mask : ndarray, (d c,) over GF(p)
        This round's mask ``z_i``.
    rng_mask : numpy.random.Generator or None
        This round's mask stream (the encoder's noise pieces); None in timing mode (nothing is drawn).
    encoded : ndarray, (N, L) over GF(p)
        This round's encoded mask shares ``z~_ij``, row ``j`` for user ``j``.
    """

    batch: int = 0
    mask: Any = None
    rng_mask: Any = None
    encoded: Any = None


class LightSecAgg(Protocol):
    """LightSecAgg baseline (So et al., MLSys 2022) on conventional minibatch FL; module docstring."""

    name = "lightsecagg"
    Config = LightSecAggConfig
    State = LightSecAggState
    setup_dropouts = "none"                               # masks are drawn each round: absentees recorded only

    @classmethod
    def check(cls, config: LightSecAggConfig, n_devices: int) -> None:
        """Refuse parameters outside T < U <= N (So et al.): :func:`fednet.codes.lightsecagg.check_lsa_parameters`."""
        U = n_devices if config.U is None else config.U
        lsa.check_lsa_parameters(n_devices, U, config.z, config.p, quant_bits=config.quant_bits, param="p")

    @classmethod
    def check_dropout(cls, config: LightSecAggConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout leaving fewer than U users available on average (:mod:`fednet.codes.lightsecagg`)."""
        lsa.check_lsa_dropout(n_devices, n_devices if config.U is None else config.U, config.z, dropout)

    @classmethod
    def trajectory_group(cls, config: LightSecAggConfig, n_devices: int) -> tuple | None:
        """Timing mode with ``U = D``: every user survives every round, and the server's sum of their quantised
        gradients is exact (integers times ``2**-b`` below ``p / 2``: the same float in any order), so the models
        depend on the minibatches (the seed), ``quant_bits``, ``p`` (the capacity check) and
        ``minibatch_fraction``, not on ``z``, the network or the arrival order. fig7's and fig8's ``U = D`` runs
        of every ``z`` share one trajectory a seed (:meth:`Protocol.trajectory_group`). None otherwise: with
        ``U < D`` the survivors are the fastest users."""
        if config.mode != "timing" or config.U not in (None, n_devices):
            return None
        return (config.quant_bits, config.p, config.minibatch_fraction)

    @property
    def U(self) -> int:
        """The target number of survivors U (the configured value, or D)."""
        return self.sim.n_devices if self.config.U is None else self.config.U

    def setup(self) -> Generator:
        """No data sharing: per-device minibatch sizes and the mask-code points."""
        self.alphas, self.betas = lsa.default_lsa_points(self.sim.n_devices, self.U)
        self._host_batch: tuple[int, np.ndarray | None, dict[int, np.ndarray]] = (-1, None, {})
        self._rows_cache: dict[tuple[int, int], np.ndarray] = {}
        for dev in self.devices:
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * self.task.X[dev.index].shape[0])))
        return
        yield  # pragma: no cover

    # -- the round ---------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Offline masks (overlapping training), masked uploads, survivor set U1, aggregated encoded masks, unmasking.

        Up to the survivors' aggregated masks the round is the engine's masked secure sum
        (:meth:`~fednet.protocol.primitives.Net.masked_sum`; replayed without per-user processes in timing mode
        where the ``masked`` backend can run), then the server unmasks (eqs. 4-5).
        """
        cfg, U = self.config, self.U
        d, c = self.task.d, self.task.c
        L = lsa.lsa_piece_length(d * c, U, cfg.z)
        available = [dev for dev in self.devices if self.net.available(dev)]
        U1, online, replies = yield from self.net.masked_sum(
            available, prepare=lambda dev: self._prepare_mask(dev, epoch), encode=self._encode,
            local=self._masked_gradient, aggregate=lambda dev, U1, masks: self._aggregate_masks(dev, U1, masks, L),
            first=U, piece_length=L, download=self.theta.astype(np.float32), upload_elements=d * c,
            element_bits=cfg.element_bits, download_bits=cfg.element_bits,
            relay="per_message" if cfg.mask_relay == "per_message" else "bundled", parallel=cfg.offline_parallel,
            timing_key="mask", precomputed=type(self.mode) is Timing)
        uploads = dict((dev.index, up) for dev, up in online)
        G = yield from self.net.server_compute(self._unmask, [uploads[i] for i in U1], [s for _, s in replies],
                                               [self.alphas[dev.index] for dev, _ in replies], len(U1), L)
        self.used = U1
        self.mode.update(self, G, sum(self.task.X[i].shape[0] for i in U1))            # eqs. (4)-(5)

    def _prepare_mask(self, dev: Node, epoch: int) -> None:
        """User ``dev``'s mask stream and mask ``z_i`` of round ``epoch`` (secret; stand-ins in timing mode)."""
        cfg, dc = self.config, self.task.d * self.task.c
        dev.state.rng_mask = self.mode.offline(self.sim.secret_rng, dev, "masks", epoch)  # a secret (not in timing)
        dev.state.mask = self.mode.offline(uniform, dev.state.rng_mask, cfg.p, dc, like=Shape((dc,), np.int64))

    # -- the math of each step (through the mode) -------------------------------------------------
    def _encode(self, dev: Node):
        """User ``dev``'s encoded mask shares for all N users, ``(N, L)`` (``N U L`` MACs)."""
        return self.mode.run(
            lsa.lsa_encode_mask, dev.state.mask, self.U, self.config.z, self.config.p, dev.state.rng_mask, self.alphas,
            self.betas)

    def _masked_gradient(self, dev: Node):
        """Online phase of user ``dev`` on the model it downloaded (eq. 3 estimate, quantised, masked).

        Timing mode charges the kernel's declared ``2 b_i d c + d c`` MACs (:func:`~fednet.codes.lightsecagg.
        masked_gradient_macs`); its stand-in value is the user's index, and the quantised gradient is computed only if the round sums it (:meth:`_host_gradient`, from
        :meth:`_unmask`): a user the server drops costs the host nothing."""
        i, cfg, U = dev.index, self.config, self.U
        X, Y, rows = self.task.X[i], self.task.Y[i], self._rows(dev, self.epoch)
        return self.mode.run(lsa.masked_gradient, X, Y, dev.state.received, rows, dev.state.mask,
                             cfg.quant_bits, cfg.p, U, stand_in=lambda: i)      # computed if summed

    def _aggregate_masks(self, dev: Node, U1: np.ndarray, masks: Mailbox, L: int):
        """Survivor ``dev``: the sum of the encoded masks of U1 (indices, ascending) addressed to it (``(|U1| - 1) L`` MACs).

        The shares are read from ``masks`` inside the step (reading meters nothing), so timing mode, which charges
        the closed form without running the step, does not gather ``|U1|`` stand-ins per survivor for nothing."""
        p = self.config.p
        return self.mode.run(lambda: lsa.lsa_aggregate_encoded(masks.get_many(U1, dev.index), p),
                             macs=(len(U1) - 1) * L, like=Shape((L,), np.int64))

    def _unmask(self, masked: list, s_parts: list, alphas: list[int], n_survivors: int, L: int):
        """Server: decode the aggregate mask from U shares, unmask the sum, dequantise."""
        cfg, U, T, d, c = self.config, self.U, self.config.z, self.task.d, self.task.c
        return self.mode.run(
            lsa.unmask_shares, masked, s_parts, alphas, self.betas, U, T, (d, c), cfg.quant_bits, cfg.p,
            stand_in=lambda: None if self.mode.follows(self) else lsa.sum_in_order([self._host_gradient(m.value)
                                                                                    for m in masked]))

    def _rows(self, dev: Node, epoch: int) -> np.ndarray:
        """Minibatch of ``dev`` in round ``epoch``, keyed by (device, round): independent of the rounds the device
        took part in (full and timing modes agree).  The first request of a round draws every device's rows at once
        (:meth:`~fednet.protocol.base.Protocol.minibatch_rows_many`: the same rows); timing mode asks twice a round.
        """
        key = (dev.index, epoch)
        rows = self._rows_cache.get(key)
        if rows is None:
            self._rows_cache.clear()
            drawn = self.minibatch_rows_many(self.devices, [d.state.batch for d in self.devices], epoch)
            self._rows_cache.update(((d.index, epoch), r) for d, r in zip(self.devices, drawn))
            rows = self._rows_cache[key]
        return rows

    def _host_gradient(self, i: int) -> np.ndarray:
        """Timing mode's stand-in of user ``i``'s masked upload this round (uncharged host work, once a round and
        user): :func:`~fednet.codes.lightsecagg.quantised_gradient` at the downloaded model, computed only for the
        survivors the aggregate sums, so only theirs meet the capacity check of ``U`` summands (full mode, where
        every user that trains quantises its own upload, also checks the users the server drops).

        Raises
        ------
        fednet.errors.CapacityError
            If the quantised gradient exceeds what ``U`` summands may hold in GF(p) (named by quantize).
        """
        if self._host_batch[0] != self.epoch:               # the model the devices download, and no gradient yet
            self._host_batch = (self.epoch, self.theta.astype(np.float32).astype(np.float64), {})
        epoch, theta, cache = self._host_batch
        g = cache.get(i)
        if g is None:
            cfg = self.config
            rows = self._rows(self.devices[i], epoch)
            g = cache[i] = lsa.quantised_gradient(self.task.X[i], self.task.Y[i], theta, rows, cfg.quant_bits,
                                                  cfg.p, self.U)
        return g
