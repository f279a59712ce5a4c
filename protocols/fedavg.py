"""FedAvg and FedAvg-IS (one local SGD step per round by default: the DReS-FL baselines, Sec. 6.1), FedProx, FedAdam,
FedYogi and FedAdagrad (the FedAvg family: one module, so that the family shares FedAvg's client code).

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

FedProx
-------
FedProx: FedAvg whose clients minimise a local objective with a proximal term (Li et al., MLSys 2020).

Source: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated optimization in heterogeneous networks",
MLSys 2020, Algorithm 2 and eq. (2): in round ``t`` each selected client ``k`` (inexactly) solves

    ``min_w h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2``

from ``w_t``, here by ``K`` local SGD steps (``local_steps``, or ``local_epochs`` passes over its rows) on keyed
minibatches: ``w <- w - eta (grad F_k(w; b) + mu (w - w_t))`` (:func:`fednet.learning.federated.local_sgd_steps`,
every MAC of the proximal term metered); the server averages the updates as FedAvg does (weights ``m_i / sum m_j``
over the clients that arrived; client sampling and FedAvg-IS weighting as above).

Parameters taken: ``mu = 0.01`` (the paper picks the best ``mu`` of ``{0.001, 0.01, 0.1, 1}`` per data set; 0.01 is
one of that grid, not a paper-wide default: tune it) and ``local_steps = 10`` (the proximal term is zero at the
first step, where ``w = w_t``, so FedProx differs from FedAvg only with several local steps; the paper runs
``E = 20`` local epochs with batch 10). ``mu = 0`` is FedAvg bit for bit (no proximal term is computed).
Inexact solves with a variable amount of local work per device (the paper's ``gamma``-inexactness, systems
heterogeneity) are not modelled: every sampled client does the same ``K`` steps.

What each party sees: as FedAvg (the server sees every arriving update in the clear).

FedAdam, FedYogi and FedAdagrad
-------------------------------
FedAdam, FedYogi and FedAdagrad: FedAvg's clients, an adaptive optimiser on the server (Reddi et al., ICLR 2021).

Source: Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive federated optimization",
ICLR 2021, Algorithm 2 ("FedAdagrad, FedYogi, and FedAdam"). Each round the server broadcasts ``x_t``; each
sampled client present this round runs ``K`` local SGD steps from it (``local_steps`` / ``local_epochs``, as
FedAvg above) and uploads ``Delta_i = x_i^K - x_t``; the server forms ``Delta_t`` and applies
(:func:`fednet.learning.federated.fedopt_server`, element-wise, every MAC metered)

    ``m_t = beta1 m_{t-1} + (1 - beta1) Delta_t``
    ``v_t = v_{t-1} + Delta_t^2``                                          (FedAdagrad)
    ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``    (FedYogi)
    ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``                        (FedAdam)
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``

from ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (Alg. 2 asks ``v_{-1} >= tau^2``); no bias correction (as Alg. 2).

Parameters taken: ``beta1 = 0.9``, ``beta2 = 0.99``, ``tau = 1e-3`` (the paper's defaults, Sec. 5), server
learning rate ``eta = 10^-2`` (``server_lr``; the paper tunes ``eta`` per task over a log10 grid and fixes no
default: 10^-2 is fednet's choice, not checked against the paper's tables -- tune it), the client learning rate is the
config's ``learning_rate`` schedule. ``Delta_t`` is FedAvg's weighted mean ``sum_i (m_i / sum_j m_j) Delta_i``
over the clients that arrived (Alg. 2 writes the plain mean ``1/|S| sum Delta_i``; the two agree when the clients
hold equal numbers of rows, as in the partitions of fednet's studies; ``importance`` weights as FedAvg-IS).
A round with no client present makes no step (``skipped``; ``m`` and ``v`` unchanged).

What each party sees: as FedAvg; the server's ``m`` and ``v`` stay on the server (its state).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.learning.federated import add_scaled, fedavg_weights, fedopt_server, local_sgd_steps, weighted_sum
from fednet.protocol.base import Protocol, ServerState
from fednet.protocol.neural import ModelPluginConfig, NeuralConfig, NeuralLearning
from fednet.protocol.sampling import SamplingConfig, sample_clients, sample_size, sampled_text
from fednet.sim.simulation import Node

__all__ = ["FedAvgConfig", "FedAvg", "FedAvgIS", "FedProxConfig", "FedProx", "FedOptConfig", "FedOpt", "FedAdam",
           "FedYogi", "FedAdagrad"]


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


class FedProxConfig(FedAvgConfig):
    """FedProx's parameters: :class:`~fednet.protocols.fedavg.FedAvgConfig` plus the proximal weight.

    Attributes
    ----------
    mu : float
        ``mu >= 0``, the weight of the proximal term ``mu/2 ||w - w_t||^2`` (Li et al. 2020, eq. 2); 0.01 (one of
        the paper's grid ``{0.001, 0.01, 0.1, 1}``); 0 is FedAvg.
    local_steps : int
        ``K >= 1`` local SGD steps on the proximal objective (10 here: with one step FedProx is FedAvg).
    """

    mu: float = Field(0.01, ge=0.0)
    local_steps: int = Field(10, ge=1)


class FedProx(FedAvg):
    """FedProx (module docstring, "FedProx"): FedAvg with the proximal term ``mu/2 ||w - w_t||^2`` in each local objective."""

    name = "fedprox"
    Config = FedProxConfig

    def prox_mu(self) -> float:
        """``mu`` of the config."""
        return self.config.mu


class FedOptConfig(FedAvgConfig):
    """The server optimiser's parameters (Reddi et al. 2021, Alg. 2) on top of :class:`~fednet.protocols.fedavg.FedAvgConfig`.

    Attributes
    ----------
    server_lr : float
        ``eta > 0``, the server learning rate (10^-2).
    beta1 : float
        First-moment decay ``beta1`` in [0, 1) (0.9).
    beta2 : float
        Second-moment decay ``beta2`` in [0, 1) (0.99; FedAdagrad does not use it).
    tau : float
        Degree of adaptivity ``tau > 0`` (10^-3); ``v`` starts at ``tau^2``.
    """

    server_lr: float = Field(1e-2, gt=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.99, ge=0.0, lt=1.0)
    tau: float = Field(1e-3, gt=0.0)


@dataclass
class FedOptServerState(ServerState):
    """The server's optimiser state: ``m`` and ``v`` per parameter array (float64)."""

    m: Any = None
    v: Any = None


class FedOpt(FedAvg):
    """Base of FedAdam / FedYogi / FedAdagrad (module docstring, "FedAdam, FedYogi and FedAdagrad"); ``rule`` names the second-moment update."""

    Config = FedOptConfig
    ServerStateType = FedOptServerState
    rule: ClassVar[Literal["adam", "yogi", "adagrad"]] = "adam"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        st = self.server.state
        st.m = {k: np.zeros(np.shape(v), dtype=np.float64) for k, v in self.params.items()}
        st.v = {k: np.full(np.shape(v), self.config.tau ** 2, dtype=np.float64) for k, v in self.params.items()}

    def aggregate(self, deltas: list, weights) -> dict:
        """Server: ``Delta_t = sum_i w_i Delta_i`` then the adaptive step (MACs metered in both)."""
        st = self.server.state
        cfg = self.config
        delta = weighted_sum(deltas, weights)
        x, st.m, st.v = fedopt_server(self.params, st.m, st.v, delta, self.rule, cfg.server_lr, cfg.beta1,
                                      cfg.beta2, cfg.tau)
        return x


class FedAdam(FedOpt):
    """FedAdam (Reddi et al. 2021, Alg. 2): ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``."""

    name = "fedadam"
    rule = "adam"


class FedYogi(FedOpt):
    """FedYogi (Reddi et al. 2021, Alg. 2): ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``."""

    name = "fedyogi"
    rule = "yogi"


class FedAdagrad(FedOpt):
    """FedAdagrad (Reddi et al. 2021, Alg. 2): ``v_t = v_{t-1} + Delta_t^2``."""

    name = "fedadagrad"
    rule = "adagrad"
