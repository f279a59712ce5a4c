"""FedBuff with LightSecAgg masks: buffered asynchronous secure aggregation (issue 29, item 2).

Source: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg: a lightweight and versatile design for secure
aggregation in federated learning", MLSys 2022, Sec. 4 (the mask code: one-shot reconstruction of the *aggregate*
mask from any ``U`` users' aggregated encoded masks) and Sec. 6 (LightSecAgg in asynchronous FL: masks are encoded
per update and the server reconstructs the aggregate mask of the updates it buffered, whichever model versions they
were computed on); Nguyen et al., AISTATS 2022 (FedBuff: the buffer, the staleness weight, the concurrency limit;
``fednet.protocol.buffered``).

Per client update ``u`` (client ``i`` on the model version it downloaded):

1. it draws a fresh mask ``z_u`` over GF(p) (its secret stream), encodes it into ``N`` shares
   ``z~_u,n = f_u(alpha_n)`` (``U - T`` pieces and ``T`` noise pieces, :func:`fednet.codes.lightsecagg.lsa_encode_mask`)
   and uploads the ``N - 1`` shares for the others in one encrypted message, which the server forwards, one share
   to each client (it cannot read them);
2. it uploads ``x~_u = Q(G_u) + z_u`` (its minibatch gradient quantised with ``quant_bits``).

Once ``K`` masked updates are buffered, the server fixes their staleness weights in the field,
``w_u = round(s(tau_u) 2^weight_bits)``, asks every available client for ``s_n = sum_u w_u z~_u,n``, decodes
``sum_u w_u z_u`` from the first ``U`` answers and takes ``sum_u w_u x~_u - sum_u w_u z_u = sum_u w_u Q(G_u)``:
exactly the weighted buffered sum in the field (checked when ``check_decoding``), dequantised by
``2^(quant_bits + weight_bits)`` for the server step of eqs. (4)-(5) (as FedBuff).  The field must hold
``K 2^weight_bits max|Q(G)|``; too small a field is refused when the values are quantised.

What each party sees: the server sees only uniformly masked updates and the aggregated encoded masks of the
buffered set, from which it learns ``sum_u w_u z_u`` and so the weighted buffered sum, nothing about one update
(for ``T`` colluding clients at most); a client sees encoded shares of the others' masks only.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.fields import check_prime, uniform
from fednet.learning.model import unmetered
from fednet.algebra.modp import lincomb_mod, sub_mod
from fednet.algebra.quantize import dequantize, quantize
from fednet.codes.lightsecagg import default_lsa_points, lsa_decode_aggregate_mask, lsa_encode_mask, masked_gradient
from fednet.learning.models import minibatch_gradient
from fednet.protocol.primitives import StragglerShortfall
from fednet.protocol.buffered import BufferedAsync, FedBuffConfig, FedBuffState, staleness_weight
from fednet.sim.simulation import Node

__all__ = ["FedBuffLightSecAggConfig", "FedBuffLightSecAgg"]

P61 = 2**61 - 1


class FedBuffLightSecAggConfig(FedBuffConfig):
    """FedBuff's parameters and the mask code's (LightSecAgg, Sec. 4).

    Attributes
    ----------
    z : int
        Privacy ``T``: colluding clients that learn nothing.
    U : int or None
        Aggregated encoded masks the server needs to decode (``z < U <= D``); None: ``max(z + 1, D // 2 + 1)``.
    p : int
        The prime field (``2^61 - 1``: room for the weighted buffered sums).
    quant_bits : int
        Fractional bits of ``Q(G) = round(G 2^quant_bits)``.
    weight_bits : int
        Fractional bits of the staleness weights in the field.
    check_decoding : bool
        Observer (not charged): assert that every decoded sum equals ``sum_u w_u Q(G_u)`` exactly.
    """

    z: int = Field(1, ge=0)
    U: int | None = Field(None, ge=1)
    p: int = P61
    quant_bits: int = Field(16, ge=0, le=40)
    weight_bits: int = Field(8, ge=0, le=24)
    check_decoding: bool = False

    @model_validator(mode="after")
    def _field(self) -> "FedBuffLightSecAggConfig":
        try:
            check_prime(self.p)
        except ValueError as e:
            raise ValueError(f"p = {self.p} is not usable as the field: {e}") from None
        if self.U is not None and self.U <= self.z:
            raise ValueError(f"U must exceed z = {self.z} (T < U), got {self.U}")
        return self


@dataclass
class FedBuffLightSecAggState(FedBuffState):
    """A client's shares of the others' masks, by update id (and, when checking, its own plain updates)."""

    shares: dict[int, np.ndarray] = field(default_factory=dict)


class FedBuffLightSecAgg(BufferedAsync):
    """FedBuff whose buffered sum is a LightSecAgg secure sum (module docstring)."""

    name = "fedbuff_lightsecagg"
    Config = FedBuffLightSecAggConfig
    State = FedBuffLightSecAggState

    @classmethod
    def check(cls, config: FedBuffLightSecAggConfig, n_devices: int) -> None:
        """FedBuff's checks, and ``z < U <= D``."""
        super().check(config, n_devices)
        U = cls._u(config, n_devices)
        if not config.z < U <= n_devices:
            raise ValueError(f"U must satisfy z < U <= D = {n_devices}, got U = {U}, z = {config.z}")

    @staticmethod
    def _u(config: FedBuffLightSecAggConfig, n_devices: int) -> int:
        return config.U if config.U is not None else max(config.z + 1, n_devices // 2 + 1)

    def setup(self) -> Generator:
        """FedBuff's set-up; the code's points ``alpha_n`` (clients) and ``beta`` (pieces); the update counter."""
        yield from super().setup()
        cfg = self.config
        self.U = self._u(cfg, self.sim.n_devices)
        self.alphas, self.betas = default_lsa_points(self.sim.n_devices, self.U)
        self.bits = int(cfg.p - 1).bit_length()                 # a field element on the wire
        self.mailbox = self.net.mailbox()
        self.next_update = 0
        self.plain: dict[int, np.ndarray] = {}                  # observer: Q(G_u) (check_decoding only)
        self.checked_rounds = 0

    def client_loop(self, dev: Node) -> Generator:
        """Client ``dev``: as FedBuff's, with a fresh mask per update, its encoded shares sent, a masked upload."""
        cfg, st = self.config, dev.state
        n = self.task.d * self.task.c
        while True:
            yield from self.next_turn(dev)
            u, self.next_update = self.next_update, self.next_update + 1
            rng = self.sim.secret_rng(dev, "fedbuff-mask", st.iteration)           # a secret, per update
            mask = uniform(rng, cfg.p, (n,))
            encoded = yield from self.net.compute(dev, lsa_encode_mask, mask, self.U, cfg.z, cfg.p, rng,
                                                  self.alphas, self.betas)
            st.shares[u] = encoded[dev.index]
            self.mailbox.put(u, dev.index, encoded[dev.index])
            others = np.delete(encoded, dev.index, axis=0)
            yield from self.net.send(dev, self.server, others, kind="mask_shares", encrypted=True,
                                     element_bits=self.bits)
            for peer in self.devices:                                # the server forwards each share
                if peer is not dev:
                    self.net.background(self._forward(peer, u, encoded[peer.index]))
            msg = yield from self.net.send(self.server, dev, self.theta.astype(np.float32), kind="model",
                                           element_bits=self.element_bits)
            x = yield from self.net.compute(dev, self._masked_update, dev, msg.payload, st.iteration, mask, u)
            yield from self.net.send(dev, self.server, x, kind="masked_gradient", element_bits=self.bits)
            self.slots.put(True)
            self.arrivals.put((dev, st.version, (u, x)))

    def _forward(self, peer: Node, u: int, share: np.ndarray) -> Generator:
        msg = yield from self.net.send(self.server, peer, share, kind="mask_share", element_bits=self.bits)
        peer.state.shares[u] = msg.payload
        self.mailbox.put(u, peer.index, msg.payload)

    def _masked_update(self, dev: Node, received: np.ndarray, iteration: int, mask: np.ndarray, u: int) -> np.ndarray:
        """``Q(G) + z`` over GF(p) for ``dev``'s minibatch gradient (:func:`fednet.codes.lightsecagg.masked_gradient`)."""
        cfg = self.config
        rows = self.minibatch_rows(dev, dev.state.batch, iteration)
        X, Y = self.task.X[dev.index], self.task.Y[dev.index]
        room = cfg.buffer_size * 2**cfg.weight_bits
        if cfg.check_decoding:
            with unmetered():
                G = minibatch_gradient(X, Y, received.astype(np.float64), rows)
            with unmetered():                                    # the observer's copy is not the client's work
                self.plain[u] = quantize(G.reshape(-1), cfg.quant_bits, cfg.p, n_summands=room)
        return masked_gradient(X, Y, received, rows, mask, cfg.quant_bits, cfg.p, room)

    def _aggregated_mask(self, dev: Node, ids: list[int], weights: np.ndarray) -> Generator:
        """Client ``dev``: download the buffered ids and weights; wait for their shares; upload ``sum w_u z~_u,n``."""
        yield from self.net.send(self.server, dev, np.array(ids + list(weights)), kind="mask_request",
                                 element_bits=64)
        yield self.mailbox.wait(dev.index, ids)
        shares = np.stack([dev.state.shares[u] for u in ids])
        s = yield from self.net.compute(dev, lincomb_mod, weights, shares, self.config.p)
        msg = yield from self.net.send(dev, self.server, s, kind="aggregated_mask", element_bits=self.bits)
        return msg.payload

    def round(self, epoch: int) -> Generator:
        """One server step: ``K`` masked updates, the aggregated masks of the first ``U`` clients, the exact sum."""
        cfg = self.config
        buffer = yield from self.fill_buffer()
        ids = [u for _, _, (u, _) in buffer]
        weights = np.array([int(round(staleness_weight(cfg.staleness, t) * 2**cfg.weight_bits))
                            for t in self._staleness], dtype=np.int64)
        present = [dev for dev in self.devices if self.net.available(dev)]
        if len(present) < self.U:
            raise StragglerShortfall(f"{len(present)} clients available to send aggregated masks, U = {self.U} needed")
        replies = yield from self.net.first_k([(dev, self._aggregated_mask(dev, ids, weights)) for dev in present],
                                              self.U, dropped=[d for d in self.devices if d not in present])
        masked = np.stack([x for _, _, (_, x) in buffer])
        exact = yield from self.net.server_compute(self._unmask, masked, weights, replies)
        if cfg.check_decoding:
            with unmetered():
                plain = lincomb_mod(weights, np.stack([self.plain.pop(u) for u in ids]), cfg.p)
            if not np.array_equal(exact, plain):
                raise AssertionError(f"round {epoch}: the decoded buffered sum differs from sum_u w_u Q(G_u)")
            self.checked_rounds += 1
        G = dequantize(exact, cfg.quant_bits + cfg.weight_bits, cfg.p).reshape(self.task.d, self.task.c)
        if cfg.server_lr != 1.0:
            G = G * cfg.server_lr
        self.mode.update(self, G, int(self.point_counts[self.used].sum()))                 # eqs. (4)-(5)
        for dev in self.devices:                                 # the buffered updates' shares are spent
            for u in ids:
                dev.state.shares.pop(u, None)
        self.new_model_version()

    def _unmask(self, masked: np.ndarray, weights: np.ndarray, replies: Any) -> np.ndarray:
        """Server: ``sum_u w_u x~_u - decode(s)`` over GF(p), the exact weighted buffered sum of ``Q(G_u)``."""
        cfg = self.config
        s = np.stack([value for _, value in replies.results])
        pts = [self.alphas[node.index] for node, _ in replies.results]
        total = lincomb_mod(weights, masked, cfg.p)
        agg = lsa_decode_aggregate_mask(s, pts, self.betas, self.U, cfg.z, masked.shape[1], cfg.p)
        return sub_mod(total, agg, cfg.p)

    def round_metrics(self, round: int) -> dict[str, Any]:
        """FedBuff's, and ``checked_rounds`` (rounds whose decoding the observer checked)."""
        return {**super().round_metrics(round), "checked_rounds": self.checked_rounds}
