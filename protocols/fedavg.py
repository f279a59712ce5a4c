"""FedAvg and FedAvg-IS (one local SGD step per round by default: the DReS-FL baselines, Sec. 6.1).

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

Everyday knobs (defaults: the baselines above, bit for bit):

* client sampling (``clients_per_round`` or ``client_fraction``; McMahan et al. 2017, Alg. 1): only the
  round's sampled set ``S_t`` (public keyed draw, :mod:`fednet.protocol.sampling`) downloads, computes and
  uploads; the trace's ``sampled`` column names it. FedAvg-IS's participation probability becomes
  ``(m / D)(1 - p_i)`` (sampling and availability independent), so the ``unbiased`` weights stay
  Horvitz-Thompson;
* local work (``local_steps = K`` or ``local_epochs = E``; McMahan et al. 2017, Alg. 1 ``ClientUpdate``):
  ``Delta_i = w_{i,K} - w`` after ``K`` SGD steps ``w <- w - eta grad l(w; b)`` on keyed minibatches
  (:meth:`fednet.protocol.neural.NeuralLearning.local_batches`), every step's MACs metered
  (:func:`fednet.learning.federated.local_sgd_steps`); ``E`` epochs are ``E ceil(n_i / B)`` steps;
* a user's model (``model = "package.module:factory"``, a ``torch.nn.Module`` factory of ``(n_inputs,
  n_outputs)``; :func:`fednet.protocol.neural.plugin_model`) in place of the MLP, its MACs counted by torch.

A round in which no client is present is skipped (no update; ``skipped`` column). What each party
sees: the server sees every present client's update in the clear (the paper runs the baselines
without secure aggregation, its footnote 8; ``fedavg_lightsecagg`` adds it).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.learning.federated import add_scaled, fedavg_weights, local_sgd_steps, weighted_sum
from fednet.protocol.base import Protocol
from fednet.protocol.neural import ModelPluginConfig, NeuralConfig, NeuralLearning
from fednet.protocol.sampling import SamplingConfig, sample_clients, sample_size, sampled_text
from fednet.sim.simulation import Node

__all__ = ["FedAvgConfig", "FedAvg", "FedAvgIS"]


class FedAvgConfig(NeuralConfig, SamplingConfig, ModelPluginConfig):
    """FedAvg's parameters (:class:`~fednet.protocol.neural.NeuralConfig`, client sampling
    :class:`~fednet.protocol.sampling.SamplingConfig`, a user's model :class:`~fednet.protocol.neural.ModelPluginConfig`,
    the weighting and the local work).

    Attributes
    ----------
    importance : {"none", "unbiased", "normalized"}
        ``none``: FedAvg; otherwise FedAvg-IS with that rule (:func:`fednet.learning.federated.fedavg_weights`).
    local_steps : int
        ``K >= 1``: local SGD steps per round on keyed minibatches of ``batch_size`` rows (McMahan et al.
        2017, Alg. 1 ``ClientUpdate``); 1: the DReS-FL baselines' one step.
    local_epochs : int or None
        ``E >= 1``: local epochs per round instead (each a keyed shuffle of the client's rows in minibatches of
        ``batch_size``: ``E ceil(n_i / B)`` steps, McMahan et al. Alg. 1); exclusive with ``local_steps``.
        None (default): ``local_steps``.
    """

    importance: Literal["none", "unbiased", "normalized"] = "none"
    local_steps: int = Field(1, ge=1)
    local_epochs: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_local_rule(self) -> FedAvgConfig:
        if self.local_epochs is not None and "local_steps" in self.model_fields_set:
            raise ValueError(f"set local_steps or local_epochs, not both (got local_steps = {self.local_steps}, "
                             f"local_epochs = {self.local_epochs})")
        return self


class FedAvg(Protocol):
    """FedAvg (module docstring): one local SGD step per round on every client by default."""

    name = "fedavg"
    Config = FedAvgConfig
    Learning = NeuralLearning
    setup_dropouts = "none"          # nothing is exchanged before training; absent devices are only recorded

    @classmethod
    def check(cls, config: FedAvgConfig, n_devices: int) -> None:
        """Refuse sampling more clients than there are (``clients_per_round``)."""
        sample_size(config, n_devices)

    def validate(self) -> None:
        """FedAvg-IS needs an availability model that states each client's participation probability."""
        super().validate()
        if self.config.importance != "none" and self.learning.participation() is None:
            raise ValueError(f"importance = {self.config.importance!r} needs an availability model with per-client "
                             f"dropout probabilities (e.g. network.availability = 'dresfl_extreme'), got "
                             f"{self.sim.availability!r}")

    def prox_mu(self) -> float:
        """The proximal weight ``mu`` of the local objective (0: FedAvg; FedProx overrides)."""
        return 0.0

    def local_update(self, dev: Node):
        """Client ``dev``: ``local_steps`` SGD steps (or ``local_epochs``) from the downloaded model; uploads ``Delta_i``."""
        cfg = self.config
        batches = self.learning.local_batches(dev, cfg.local_steps, cfg.local_epochs)
        return local_sgd_steps(self.model, dev.state.received, batches, self.learning.lr, self.prox_mu())

    def inclusion(self) -> np.ndarray | None:
        """Each client's probability of being in a round's update (FedAvg-IS): ``(m / D)(1 - p_i)``, or None.

        ``1 - p_i`` from the availability model, times ``m / D`` under client sampling (uniform, independent of
        availability); None without per-client probabilities.
        """
        q = self.learning.participation()
        m = sample_size(self.config, self.sim.n_devices)
        if q is None or m is None:
            return q
        return q * (m / self.sim.n_devices)

    def aggregate(self, deltas: list, weights) -> dict:
        """Server: ``w + sum_i w_i Delta_i`` (one MAC per element and term, one per element for the step)."""
        return add_scaled(self.params, 1.0, weighted_sum(deltas, weights))

    def round(self, epoch: int) -> Generator:
        """Broadcast w; present clients step and upload; weighted average (FedAvg / FedAvg-IS)."""
        clients = sample_clients(self, epoch)
        self.sampled = clients
        replies = yield from self.net.gather(clients, self.local_update, kind="update", download=self.params,
                                             download_bits=self.element_bits, upload_bits=self.element_bits)
        self.used = sorted(dev.index for dev in replies.nodes)
        if not self.used:
            self.learning.skipped = True
            return
        order = [dev.index for dev in replies.nodes]
        q = None if self.config.importance == "none" else self.inclusion()
        rule = "unbiased" if self.config.importance == "none" else self.config.importance
        w = fedavg_weights(self.task.n_points, order, q, rule)
        self.params = yield from self.net.server_compute(self.aggregate, replies.values, w)

    def round_metrics(self, round: int) -> dict[str, Any]:
        """The learning set-up's columns, and ``sampled`` (this round's ``S_t``) when sampling is configured."""
        out = super().round_metrics(round)
        if sample_size(self.config, self.sim.n_devices) is not None:
            out["sampled"] = sampled_text(getattr(self, "sampled", None) if round else None)
        return out


class FedAvgIS(FedAvg):
    """FedAvg with importance sampling (``importance = "unbiased"`` by default)."""

    name = "fedavg_is"

    class Config(FedAvgConfig):
        """FedAvg-IS: :class:`FedAvgConfig` with ``importance = "unbiased"``."""

        importance: Literal["unbiased", "normalized"] = "unbiased"
