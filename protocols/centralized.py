"""Centralized minibatch SGD on the pooled data: the upper bound of DReS-FL's Table 2 (Sec. 6.1).

Source: Shao et al., "DReS-FL", Sec. 6.1 ("the centralized training scheme as a performance upper
bound, where the server can access all the clients' datasets") and App. B (batch 64, learning
rate 0.1 decayed by 0.65 every 1500 rounds).

The server holds the concatenation of the clients' data (uploaded once before training, not
charged: the bound ignores privacy and communication) and takes one SGD step per round on
``batch_size`` rows drawn uniformly without replacement from all ``m`` rows (the keyed stream
``(server, "minibatch", round)``); the batch equals DReS-FL's global batch ``b K`` with ``K = 1``.
Dropouts do not affect it. The step is charged on the server's processor.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from fednet.learning.federated import add_scaled, local_sgd_delta
from fednet.protocol.neural import NeuralConfig, NeuralProtocol

__all__ = ["Centralized"]


class Centralized(NeuralProtocol):
    """Centralized SGD (module docstring)."""

    name = "centralized"
    Config = NeuralConfig

    def setup(self) -> Generator:
        """Pool the clients' data at the server (uncharged)."""
        self.X_all = np.concatenate(self.task.X)
        self.Y_all = np.concatenate(self.task.Y)
        return
        yield  # pragma: no cover

    def sgd_step(self, rows: np.ndarray) -> dict:
        """One SGD step on the pooled rows ``rows``."""
        delta, _ = local_sgd_delta(self.model, self.params, self.X_all[rows], self.Y_all[rows], self.lr)
        return add_scaled(self.params, 1.0, delta)

    def round(self, epoch: int) -> Generator:
        """One server-side SGD step."""
        m = self.X_all.shape[0]
        rows = self.sim.rng(self.server, "minibatch", epoch).choice(m, size=min(self.config.batch_size, m),
                                                                    replace=False)
        self.params = yield from self.server_compute(self.sgd_step, rows)
        self.used = []
