"""Centralized minibatch SGD on the pooled data: the upper bound of DReS-FL's Table 2 (Sec. 6.1).

Source: Shao et al., "DReS-FL", Sec. 6.1 ("the centralized training scheme as a performance upper
bound, where the server can access all the clients' datasets") and App. B (batch 64, learning
rate 0.1 decayed by 0.65 every 1500 rounds).

The server holds the concatenation of the clients' data (uploaded once before training, not
charged: the bound ignores privacy and communication) and takes one SGD step per round on
``batch_size`` rows drawn uniformly without replacement from all ``m`` rows (the keyed stream
``(server, "minibatch", round)``); the batch equals DReS-FL's global batch ``b K`` with ``K = 1``.
Dropouts do not affect it. The step is charged on the server's processor.

``max_norm`` (default None: no clipping) clips the summed minibatch gradient ``b g`` to that L2 norm
before the step, as DReS-FL clips its decoded global gradient (Table 4; fednet's DReS-FL studies use
64 in real units).  With ``activation = "quadratic"`` and ``loss = "mse"`` this is the float
counterpart of DReS-FL's polynomial network, which splits DReS-FL's gap to the ReLU bound into the
model's part and the fixed-point arithmetic's part (``studies/dresfl_gap.toml``).
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from pydantic import Field

from fednet.algebra.meter import charge
from fednet.learning.federated import add_scaled, local_sgd_delta
from fednet.protocol.base import Protocol
from fednet.protocol.neural import NeuralConfig, NeuralLearning

__all__ = ["Centralized", "CentralizedConfig"]


class CentralizedConfig(NeuralConfig):
    """:class:`NeuralConfig` plus gradient clipping.

    Attributes
    ----------
    max_norm : float or None
        Clip the summed minibatch gradient ``b g`` to this L2 norm (DReS-FL's clipping, Table 4);
        None (default): no clipping.
    """

    max_norm: float | None = Field(None, gt=0)


class Centralized(Protocol):
    """Centralized SGD (module docstring)."""

    name = "centralized"
    Config = CentralizedConfig
    Learning = NeuralLearning
    setup_dropouts = "none"          # nothing is exchanged before training; absent devices are only recorded

    def setup(self) -> Generator:
        """Pool the clients' data at the server (uncharged)."""
        self.X_all = np.concatenate(self.task.X)
        self.Y_all = np.concatenate(self.task.Y)
        return
        yield  # pragma: no cover

    def sgd_step(self, rows: np.ndarray) -> dict:
        """One SGD step on the pooled rows ``rows``."""
        delta, _ = local_sgd_delta(self.model, self.params, self.X_all[rows], self.Y_all[rows], self.learning.lr)
        scale = 1.0
        if self.config.max_norm is not None:
            # ||b g|| = ||delta|| b / lr, since delta = -lr g
            charge(sum(v.size for v in delta.values()))   # the squared norm's MACs
            norm = np.sqrt(sum(float(np.vdot(v, v)) for v in delta.values())) * len(rows) / self.learning.lr
            if norm > self.config.max_norm:
                scale = self.config.max_norm / norm
        return add_scaled(self.params, scale, delta)

    def round(self, epoch: int) -> Generator:
        """One server-side SGD step."""
        m = self.X_all.shape[0]
        rows = self.sim.rng(self.server, "minibatch", epoch).choice(m, size=min(self.config.batch_size, m),
                                                                    replace=False)
        self.params = yield from self.net.server_compute(self.sgd_step, rows)
        self.used = []
