"""FedAdam, FedYogi and FedAdagrad: FedAvg's clients, an adaptive optimiser on the server (Reddi et al., ICLR 2021).

Source: Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive federated optimization",
ICLR 2021, Algorithm 2 ("FedAdagrad, FedYogi, and FedAdam"). Each round the server broadcasts ``x_t``; each
sampled client present this round runs ``K`` local SGD steps from it (``local_steps`` / ``local_epochs``, as
:mod:`protocols.fedavg`) and uploads ``Delta_i = x_i^K - x_t``; the server forms ``Delta_t`` and applies
(:func:`fednet.learning.federated.fedopt_server`, element-wise, every MAC metered)

    ``m_t = beta1 m_{t-1} + (1 - beta1) Delta_t``
    ``v_t = v_{t-1} + Delta_t^2``                                          (FedAdagrad)
    ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``    (FedYogi)
    ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``                        (FedAdam)
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``

from ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (Alg. 2 asks ``v_{-1} >= tau^2``); no bias correction (as Alg. 2).

Parameters taken: ``beta1 = 0.9``, ``beta2 = 0.99``, ``tau = 1e-3`` (the paper's defaults, Sec. 5), server
learning rate ``eta = 10^-2`` (``server_lr``; the paper tunes ``eta`` per task over a log10 grid; 10^-2 is its
usual best for FedAdam / FedYogi on the image and text tasks -- tune it), the client learning rate is the
config's ``learning_rate`` schedule. ``Delta_t`` is FedAvg's weighted mean ``sum_i (m_i / sum_j m_j) Delta_i``
over the clients that arrived (Alg. 2 writes the plain mean ``1/|S| sum Delta_i``; the two agree when the clients
hold equal numbers of rows, as in the partitions of fednet's studies; ``importance`` weights as FedAvg-IS).
A round with no client present makes no step (``skipped``; ``m`` and ``v`` unchanged).

What each party sees: as FedAvg; the server's ``m`` and ``v`` stay on the server (its state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from fednet.learning.federated import fedopt_server, weighted_sum
from fednet.protocol.base import ServerState

from .fedavg import FedAvg, FedAvgConfig

__all__ = ["FedOptConfig", "FedOpt", "FedAdam", "FedYogi", "FedAdagrad"]


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
    """Base of FedAdam / FedYogi / FedAdagrad (module docstring); ``rule`` names the second-moment update."""

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
