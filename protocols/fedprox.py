"""FedProx: FedAvg whose clients minimise a local objective with a proximal term (Li et al., MLSys 2020).

Source: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated optimization in heterogeneous networks",
MLSys 2020, Algorithm 2 and eq. (2): in round ``t`` each selected client ``k`` (inexactly) solves

    ``min_w h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2``

from ``w_t``, here by ``K`` local SGD steps (``local_steps``, or ``local_epochs`` passes over its rows) on keyed
minibatches: ``w <- w - eta (grad F_k(w; b) + mu (w - w_t))`` (:func:`fednet.learning.federated.local_sgd_steps`,
every MAC of the proximal term metered); the server averages the updates as FedAvg does (weights ``m_i / sum m_j``
over the clients that arrived; client sampling and FedAvg-IS weighting as :mod:`protocols.fedavg`).

Parameters taken: ``mu = 0.01`` (the paper picks the best ``mu`` of ``{0.001, 0.01, 0.1, 1}`` per data set; 0.01 is
one of that grid, not a paper-wide default: tune it) and ``local_steps = 10`` (the proximal term is zero at the
first step, where ``w = w_t``, so FedProx differs from FedAvg only with several local steps; the paper runs
``E = 20`` local epochs with batch 10). ``mu = 0`` is FedAvg bit for bit (no proximal term is computed).
Inexact solves with a variable amount of local work per device (the paper's ``gamma``-inexactness, systems
heterogeneity) are not modelled: every sampled client does the same ``K`` steps.

What each party sees: as FedAvg (the server sees every arriving update in the clear).
"""

from __future__ import annotations

from pydantic import Field

from .fedavg import FedAvg, FedAvgConfig

__all__ = ["FedProxConfig", "FedProx"]


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
    """FedProx (module docstring): FedAvg with the proximal term ``mu/2 ||w - w_t||^2`` in each local objective."""

    name = "fedprox"
    Config = FedProxConfig

    def prox_mu(self) -> float:
        """``mu`` of the config."""
        return self.config.mu
