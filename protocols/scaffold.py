"""SCAFFOLD with one local step and option II control variates: a DReS-FL baseline (Sec. 6.1).

Source: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic controlled averaging
for federated learning", ICML 2020, Algorithm 1; Shao et al., "DReS-FL", Sec. 6.1 (one local SGD
step per round, batch 64, learning rate of App. B; Fig. 4).

Each round the server broadcasts ``(x, c)`` (``2 d_w`` float32 numbers). Every present client ``i``
takes ``K = 1`` corrected step ``y_i = x - eta_l (g_i(x) - c_i + c)`` on its minibatch, updates its
control variate by option II, ``c_i^+ = c_i - c + (x - y_i) / (K eta_l)`` (``= g_i(x)`` for
``K = 1``), and uploads ``(Delta y_i, Delta c_i)`` (``2 d_w`` numbers). The server, with the set
``S`` of present clients, applies ``x <- x + eta_g / |S| sum Delta y_i`` and
``c <- c + 1/N sum Delta c_i`` (``eta_g = global_lr``, 1 by default). Control variates start at
zero. A round without a present client is skipped. The server sees each update in the clear.

``control_average = "present"`` divides the control update by ``|S|`` instead of ``N`` (a variant found in
public SCAFFOLD code, not Karimireddy et al.'s Alg. 1): it breaks the invariant ``c = mean_i c_i`` whenever
clients are absent. fednet offers it to test whether it explains the collapse DReS-FL reports for SCAFFOLD
(Shao et al., Sec. 6.2, Fig. 4: "the estimation of the update direction is highly inaccurate").
``control_lr = "initial"`` likewise tests a second variant: option II divided by the initial learning rate
while the step uses the decayed one (App. B decays it x0.65 every 1500 rounds), as code that reads a fixed
``lr`` argument does; then ``c_i^+ = (1 - r)(c_i - c) + r g_i(x)`` with ``r = eta_t / eta_0``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fednet.learning.federated import scaffold_local, scaffold_server
from fednet.protocol.base import NodeState, Protocol
from fednet.protocol.neural import NeuralConfig, NeuralLearning
from fednet.sim.simulation import Node

__all__ = ["ScaffoldConfig", "Scaffold", "ScaffoldState"]


class ScaffoldConfig(NeuralConfig):
    """SCAFFOLD's parameters.

    Attributes
    ----------
    global_lr : float
        Server step ``eta_g`` (1).
    control_average : {"all", "present"}
        Divisor of the server's control-variate update: ``N`` (Alg. 1, line 17; default) or ``|S|``, the
        clients present this round (a variant; module docstring).
    control_lr : {"current", "initial"}
        The learning rate option II divides by: this round's (Alg. 1; default) or the initial one (a variant).
    """

    global_lr: float = Field(1.0, gt=0)
    control_average: Literal["all", "present"] = "all"
    control_lr: Literal["current", "initial"] = "current"


@dataclass
class ScaffoldState(NodeState):
    """A client's control variate ``c_i`` (Params; zeros at the start)."""

    c_i: Any = None


class Scaffold(Protocol):
    """SCAFFOLD, Algorithm 1 with K = 1 and option II (module docstring)."""

    name = "scaffold"
    Config = ScaffoldConfig
    Learning = NeuralLearning
    State = ScaffoldState
    setup_dropouts = "none"          # nothing is exchanged before training; absent devices are only recorded

    def setup(self) -> Generator:
        """Control variates ``c = c_i = 0``."""
        self.c = {k: np.zeros_like(v) for k, v in self.params.items()}
        for dev in self.devices:
            dev.state.c_i = {k: np.zeros_like(v) for k, v in self.params.items()}
        return
        yield  # pragma: no cover

    def local_update(self, dev: Node):
        """Client ``dev``: corrected step and option II; keeps ``c_i^+``, uploads ``(Delta y_i, Delta c_i)``."""
        x, y = self.learning.batch(dev)
        params, c = dev.state.received
        fixed = self.config.learning_rate if self.config.control_lr == "initial" else None
        dy, dc, dev.state.c_i = scaffold_local(self.model, params, x, y, self.learning.lr, c, dev.state.c_i, fixed)
        return dy, dc

    def round(self, epoch: int) -> Generator:
        """Broadcast (x, c); present clients step; the server averages (Alg. 1, lines 16-17)."""
        replies = yield from self.net.gather(self.devices, self.local_update, kind="update",
                                             download=(self.params, self.c), download_bits=self.element_bits,
                                             upload_bits=self.element_bits)
        self.used = sorted(dev.index for dev in replies.nodes)
        if not self.used:
            self.learning.skipped = True
            return
        self.params, self.c = yield from self.net.server_compute(
                scaffold_server, self.params, self.c, [v[0] for v in replies.values], [v[1] for v in replies.values],
                self.sim.n_devices if self.config.control_average == "all" else len(self.used), self.config.global_lr)
