"""FedAvg with LightSecAgg masks over the MLP's update: the secure baseline of DReS-FL App. C.

Source: So, He, Yang, Li, Yu, Ali, Guler, Avestimehr, "LightSecAgg", MLSys 2022 (mask code: the
pure functions of :mod:`fednet.codes.lightsecagg`); Shao et al., "DReS-FL", App. C, Tables 5-6
("FedAvg with LightSecAgg": coded masks generated and shared every round).

Each round ``e``, with the ``N`` clients, privacy ``T = z`` and target ``U`` (``T < U <= N``):

1. Mask phase: every present client ``i`` draws a uniform mask ``z_i`` over GF(p)^(d_w) from a
   secret stream, encodes it into ``N`` shares of ``L = ceil(d_w / (U - T))`` elements
   (``N U L`` MACs) and sends share ``j`` to client ``j`` through the server (``bundled``
   schedule: one upload of its ``N - 1`` shares, one download per client).
2. The server broadcasts ``w`` (float32); client ``i`` takes one SGD step on its minibatch
   (batch 64), scales the update by ``m_i N / m`` (so that the server's plain sum divided by
   ``sum_{U1} m_i N / m`` is FedAvg's weighted mean), quantises it (``round(v 2^b)``) and uploads it
   masked (``d_w`` elements of ``element_bits``).
3. The server waits for every present client (the set ``U1``; FedAvg waits for all present
   clients too); if ``|U1| < U`` the round is skipped (``decode_failed``). Otherwise it announces
   ``U1``; each member uploads the sum of the shares of ``U1`` addressed to it (``L`` elements);
   from the first ``U`` the server decodes ``sum_{U1} z_i``, unmasks, dequantises and updates
   ``w <- w + sum / sum_{U1} (m_i N / m)``.

What each party sees: the server sees masked updates (one-time pads) and the aggregated shares,
hence only the aggregate update; a coalition of ``T`` clients sees uniform shares.
Full mode only (the MLP's ``d_w = 55,050`` makes every round cheap on the host).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from fednet.algebra.fields import uniform
from fednet.codes.lightsecagg import (check_lsa_parameters, default_lsa_points, lsa_aggregate_encoded,
                                      lsa_encode_mask, lsa_piece_length, mask_upload, unmask_aggregate)
from fednet.learning.federated import add_scaled, local_sgd_delta
from fednet.learning.model import flatten, unflatten
from fednet.protocol.base import NodeState, Protocol
from fednet.protocol.neural import NeuralConfig, NeuralLearning
from fednet.protocol.primitives import AllToAll
from fednet.sim.simulation import Node

__all__ = ["FedAvgLightSecAggConfig", "FedAvgLightSecAgg"]


class FedAvgLightSecAggConfig(NeuralConfig):
    """Parameters of FedAvg with LightSecAgg.

    Attributes
    ----------
    z : int
        Privacy ``T`` (1, as DReS-FL's ``T``).
    U : int
        Target number of survivors (9: DReS-FL's recovery threshold with ``K = T = 1``, so that
        both tolerate ``N - 9`` dropouts with ``N = 20``).
    p : int
        The field (``2^32 - 5``; ``element_bits`` 32 on the wire).
    quant_bits : int
        Fractional bits ``b`` of the quantisation.
    """

    z: int = Field(1, ge=0)
    U: int = Field(9, ge=1)
    p: int = 2**32 - 5
    quant_bits: int = Field(16, ge=0, le=40)


@dataclass
class LsaState(NodeState):
    """A client's round secrets: its mask ``z_i`` (d_w,) and encoded shares (N, L), over GF(p)."""

    mask: Any = None
    encoded: Any = None


class FedAvgLightSecAgg(Protocol):
    """FedAvg whose uploads are protected by LightSecAgg (module docstring)."""

    name = "fedavg_lightsecagg"
    Config = FedAvgLightSecAggConfig
    Learning = NeuralLearning
    State = LsaState
    setup_dropouts = "none"          # masks are drawn each round; absent devices are only recorded

    @classmethod
    def check(cls, config: FedAvgLightSecAggConfig, n_devices: int) -> None:
        """``T < U <= N`` and a field with ``N + U`` distinct points."""
        check_lsa_parameters(n_devices, config.U, config.z, config.p)

    def setup(self) -> Generator:
        """The mask code's points (no data sharing)."""
        self.alphas, self.betas = default_lsa_points(self.sim.n_devices, self.config.U)
        return
        yield  # pragma: no cover

    def encode(self, dev: Node) -> np.ndarray:
        """Client ``dev``'s encoded mask shares for all N clients, ``(N, L)`` over GF(p) (``N U L`` MACs)."""
        cfg = self.config
        return lsa_encode_mask(dev.state.mask, cfg.U, cfg.z, cfg.p,
                               self.learning.secret_rng(dev, "lsa-noise", self.epoch), self.alphas, self.betas)

    def masked_update(self, dev: Node) -> np.ndarray:
        """One SGD step, scaled by ``m_i N / m``, quantised and masked: ``(d_w,)`` over GF(p)."""
        x, y = self.learning.batch(dev)
        delta, _ = local_sgd_delta(self.model, dev.state.received, x, y, self.learning.lr)
        scale = self.task.n_points[dev.index] * self.sim.n_devices / self.task.m
        return mask_upload(flatten(delta) * scale, dev.state.mask, self.config.quant_bits, self.config.p,
                           self.sim.n_devices)

    def unmask(self, masked: list, s_parts: list, alphas: list, U1: list[int]) -> dict:
        """Server: decode the aggregate mask, unmask the sum, dequantise, FedAvg step."""
        cfg = self.config
        total = unmask_aggregate(masked, np.stack(s_parts), alphas, self.betas, cfg.U, cfg.z,
                                 (self.learning.n_params, 1), cfg.quant_bits, cfg.p).reshape(-1)
        weight = sum(self.task.n_points[i] for i in U1) * self.sim.n_devices / self.task.m
        step = unflatten(total, self.model.param_shapes())
        return add_scaled(self.params, 1.0 / weight, step)

    def round(self, epoch: int) -> Generator:
        """Masks shared; masked one-step updates; aggregated shares of U1; unmasking (module docstring)."""
        cfg, N = self.config, self.sim.n_devices
        L = lsa_piece_length(self.learning.n_params, cfg.U, cfg.z)
        present = [dev for dev in self.devices if self.net.available(dev)]
        self.round_dropped.update(dev.index for dev in self.devices if dev not in present)   # the trace's dropped
        shares = self.net.mailbox()

        def _prepare(dev: Node) -> Generator:
            dev.state.mask = uniform(self.learning.secret_rng(dev, "lsa-mask", epoch), cfg.p, self.learning.n_params)
            dev.state.encoded = yield from self.net.compute(dev, self.encode, dev)
            shares.put(dev.index, dev.index, dev.state.encoded[dev.index])

        yield from self.net.exchange(AllToAll(present, present), None, rows=lambda s: s.state.encoded,
                                     kind="encoded_mask", schedule="bundled", n_elements=L, prepare=_prepare,
                                     mailbox=shares, element_bits=self.element_bits)
        for dev in present if len(present) == 1 else ():                  # a lone client has nobody to share with
            yield from _prepare(dev)
        online = yield from self.net.gather(present, self.masked_update, kind="masked_update", download=self.params,
                                            upload_elements=self.learning.n_params, download_bits=self.element_bits,
                                            upload_bits=self.element_bits)
        U1 = sorted(dev.index for dev in online.nodes)
        senders = frozenset(U1)
        if len(U1) < cfg.U:
            self.learning.skipped = self.decode_failed = True
            self.used = []
            return
        agg = yield from self.net.gather([self.devices[i] for i in U1],
                                         lambda dev: lsa_aggregate_encoded(shares.get_many(U1, dev.index), cfg.p),
                                         kind="aggregated_mask", first=cfg.U, download=np.asarray(U1),
                                         download_kind="survivors", upload_elements=L,
                                         download_bits=self.element_bits, upload_bits=self.element_bits,
                                         wait=lambda dev: shares.wait(dev.index, senders))
        uploads = dict((dev.index, v) for dev, v in online)
        self.params = yield from self.net.server_compute(self.unmask, [uploads[i] for i in U1], agg.values,
                                                         [self.alphas[dev.index] for dev in agg.nodes], U1)
        self.used = U1
