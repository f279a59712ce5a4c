"""FedAvg and FedAvg-IS with one local SGD step per round: the DReS-FL baselines (Sec. 6.1).

Source: Shao, Sun, Li, Zhang, "DReS-FL", Sec. 6.1 and App. B; McMahan et al., "Communication-efficient
learning of deep networks from decentralized data", AISTATS 2017 (FedAvg); Ren et al. 2020 and
Kairouz et al. 2021 (importance sampling: "the local computation results are weighted by the
participation probability (i.e., 1 - dropout probability)").

Each round the server broadcasts the MLP's parameters (float32, ``d_w`` numbers) to the clients;
every client present this round (the availability model) takes one SGD step on a minibatch of
``b = 64`` of its own rows, ``Delta_i = -eta (1/b) sum_j grad l``, and uploads ``Delta_i``
(``d_w`` numbers). The server waits for every present client and applies
``w <- w + sum_i w_i Delta_i`` with

* FedAvg: ``w_i = m_i / sum_{j present} m_j``;
* FedAvg-IS: ``w_i = (m_i / m) / (1 - p_i)`` (``importance = "unbiased"``, Horvitz-Thompson: unbiased
  over the dropouts for the full-participation update) or those weights normalised over the
  present clients (``importance = "normalized"``); ``p_i`` from the availability model
  (:class:`fednet.sim.dropout.PerClientDropout`: the method "knows the dropout distribution").

A round in which no client is present is skipped (no update; ``skipped`` column). What each party
sees: the server sees every present client's update in the clear (the paper runs the baselines
without secure aggregation, its footnote 8; ``fedavg_lightsecagg`` adds it).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Literal

from fednet.learning.federated import add_scaled, fedavg_weights, local_sgd_delta, weighted_sum
from fednet.protocol.base import Protocol
from fednet.protocol.neural import NeuralConfig, NeuralLearning
from fednet.sim.simulation import Node

__all__ = ["FedAvgConfig", "FedAvg", "FedAvgIS"]


class FedAvgConfig(NeuralConfig):
    """FedAvg's parameters (:class:`~fednet.protocol.neural.NeuralConfig` plus the weighting).

    Attributes
    ----------
    importance : {"none", "unbiased", "normalized"}
        ``none``: FedAvg; otherwise FedAvg-IS with that rule (:func:`fednet.learning.federated.fedavg_weights`).
    """

    importance: Literal["none", "unbiased", "normalized"] = "none"


class FedAvg(Protocol):
    """FedAvg, one local SGD step per round (module docstring)."""

    name = "fedavg"
    Config = FedAvgConfig
    Learning = NeuralLearning
    setup_dropouts = "none"          # nothing is exchanged before training; absent devices are only recorded

    def validate(self) -> None:
        """FedAvg-IS needs an availability model that states each client's participation probability."""
        super().validate()
        if self.config.importance != "none" and self.learning.participation() is None:
            raise ValueError(f"importance = {self.config.importance!r} needs an availability model with per-client "
                             f"dropout probabilities (e.g. network.availability = 'dresfl_extreme'), got "
                             f"{self.sim.availability!r}")

    def local_update(self, dev: Node):
        """Client ``dev``: one SGD step from the downloaded model on its minibatch; uploads ``Delta_i``."""
        x, y = self.learning.batch(dev)
        delta, _ = local_sgd_delta(self.model, dev.state.received, x, y, self.learning.lr)
        return delta

    def aggregate(self, deltas: list, weights) -> dict:
        """Server: ``w + sum_i w_i Delta_i`` (one MAC per element and term, one per element for the step)."""
        return add_scaled(self.params, 1.0, weighted_sum(deltas, weights))

    def round(self, epoch: int) -> Generator:
        """Broadcast w; present clients step and upload; weighted average (FedAvg / FedAvg-IS)."""
        replies = yield from self.net.gather(self.devices, self.local_update, kind="update", download=self.params,
                                             download_bits=self.element_bits, upload_bits=self.element_bits)
        self.used = sorted(dev.index for dev in replies.nodes)
        if not self.used:
            self.learning.skipped = True
            return
        order = [dev.index for dev in replies.nodes]
        q = None if self.config.importance == "none" else self.learning.participation()
        rule = "unbiased" if self.config.importance == "none" else self.config.importance
        w = fedavg_weights(self.task.n_points, order, q, rule)
        self.params = yield from self.net.server_compute(self.aggregate, replies.values, w)


class FedAvgIS(FedAvg):
    """FedAvg with importance sampling (``importance = "unbiased"`` by default)."""

    name = "fedavg_is"

    class Config(FedAvgConfig):
        """FedAvg-IS: :class:`FedAvgConfig` with ``importance = "unbiased"``."""

        importance: Literal["unbiased", "normalized"] = "unbiased"
