"""Conventional federated (minibatch) gradient descent — the baseline of Sec. VII.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning", Sec. III-A (eqs. 3-5) and
Sec. VII-A/B.

Each epoch the server broadcasts ``Theta`` (float32, d*c numbers); device i draws a minibatch
of ``b_i = round(minibatch_fraction * n_i)`` of its points without replacement (Sec. VII-A: "a
fifth of the data at each epoch"), computes the unbiased estimate of eq. (3)

    G_i = (n_i / b_i) X_b^T (X_b Theta - Y_b)          (2 b_i d c MACs)

and uploads it. The server waits for all devices, or for the ``D - drop_slowest`` first to
arrive (the client-drift variant of Sec. VII-B: the slowest are dropped each epoch), sums the
gradients (one MAC per element and gradient), and applies eqs. (4)-(5) with ``m`` replaced by
the number of points of the devices used.

Client sampling (``clients_per_round`` / ``client_fraction``; McMahan et al. 2017, Alg. 1;
:mod:`fednet.protocol.sampling`): each epoch only the sampled set ``S_t`` (``m`` devices, a public keyed draw) takes
part and the server waits for the ``m - drop_slowest`` first of them; the trace's ``sampled`` column names ``S_t``.
Default: every device (the paper's setting, traces unchanged).

What each party sees: the server sees every used device's local gradient estimate in the clear
(no privacy beyond not sharing raw data); devices see only the model.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from fednet.learning.models import (STACK_BYTES, minibatch_gradient, minibatch_gradients,  # noqa: F401 (re-exported)
                                    minibatch_gradients_of, sum_gradients)
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.primitives import batched
from fednet.protocol.sampling import SamplingConfig, sample_clients, sample_size, sampled_text
from fednet.sim.simulation import Node


class ConventionalFLConfig(SamplingConfig):
    """Parameters of conventional FL (and client sampling, :class:`~fednet.protocol.sampling.SamplingConfig`).

    Attributes
    ----------
    minibatch_fraction : float
        Fraction of each device's points used per epoch, in (0, 1] (0.2 in Sec. VII-A).
    drop_slowest : int
        Number of slowest devices whose gradients the server does not wait for (Sec. VII-B); with client sampling,
        of the ``m`` sampled ones.
    """

    minibatch_fraction: float = Field(0.2, gt=0.0, le=1.0)
    drop_slowest: int = Field(0, ge=0)


@dataclass
class ConventionalState(NodeState):
    """A device's state: its minibatch size ``b_i`` (the rows come from :meth:`Protocol.minibatch_rows`)."""

    batch: int = 0


class ConventionalFL(Protocol):
    """Conventional federated minibatch gradient descent (Sec. III-A, VII-A/B)."""

    name = "conventional"
    Config = ConventionalFLConfig
    State = ConventionalState
    setup_dropouts = "none"                               # no setup exchange: absentees recorded only

    @classmethod
    def check(cls, config: ConventionalFLConfig, n_devices: int) -> None:
        """Refuse dropping as many devices as there are (or as are sampled), or sampling more than there are."""
        m = sample_size(config, n_devices)
        if m is not None and config.drop_slowest >= m:
            raise ValueError(f"drop_slowest must be less than the clients sampled per round ({m}), "
                             f"got {config.drop_slowest}")
        if config.drop_slowest >= n_devices:
            raise ValueError(f"drop_slowest must be less than the number of devices ({n_devices}), "
                             f"got {config.drop_slowest}")

    @classmethod
    def check_dropout(cls, config: ConventionalFLConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout that leaves fewer than ``D - drop_slowest`` devices on average (``m - drop_slowest`` of
        the ``m`` sampled)."""
        m = sample_size(config, n_devices)
        what, who = ("D", "devices") if m is None else ("m", "sampled devices")
        if m is not None:
            n_devices = m
        need = n_devices - config.drop_slowest
        mean = n_devices * (1.0 - dropout)
        if mean < need:
            s_min = math.ceil(n_devices * dropout - 1e-12)
            raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of {n_devices} {who} available on "
                             f"average, fewer than the {what} - drop_slowest = {need} each round waits for "
                             f"(drop_slowest = {config.drop_slowest}); set drop_slowest >= {s_min} or lower dropout")

    def setup(self) -> Generator:
        """No set-up phase: only each device's minibatch size."""
        for dev in self.devices:
            n = self.task.X[dev.index].shape[0]
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * n)))
        return
        yield  # pragma: no cover

    @batched(minibatch_gradients_of)                      # the engine's batched backend: every device at once
    def local_gradient(self, dev: Node) -> np.ndarray:
        """Device ``dev``'s minibatch gradient on the model it received this round."""
        theta = dev.state.received.astype(np.float64)      # the float32 model it downloaded
        rows = self.minibatch_rows(dev, dev.state.batch)   # keyed (device, "minibatch", epoch): paired
        return minibatch_gradient(self.task.X[dev.index], self.task.Y[dev.index], theta, rows)

    def round(self, epoch: int) -> Generator:
        """One epoch: download Theta, minibatch gradient (eq. 3), upload; the server sums the first D - s and updates (eqs. 4-5)."""
        clients = sample_clients(self, epoch)
        self.sampled = clients
        replies = yield from self.net.gather(clients, self.local_gradient, kind="gradient",
                                             first=len(clients) - self.config.drop_slowest,
                                             download=self.theta.astype(np.float32),
                                             download_bits=self.element_bits, upload_bits=self.element_bits)
        if replies.stack_rows is not None:                  # the batch's stack and the arrivals' rows in it
            G = yield from self.net.server_compute(sum_gradients, *replies.stack_rows)          # eq. (3)
        else:
            G = yield from self.net.server_compute(sum_gradients, replies.values)
        self.used = replies.indices
        counts = self.point_counts
        m_used = int(counts.sum() if len(self.used) == len(counts) else counts[self.used].sum())
        self.mode.update(self, G, m_used)                                                 # eqs. (4)-(5)

    def round_metrics(self, round: int) -> dict[str, Any]:
        """``sampled`` (this epoch's ``S_t``) when client sampling is configured; nothing otherwise."""
        out = super().round_metrics(round)
        if sample_size(self.config, self.sim.n_devices) is not None:
            out["sampled"] = sampled_text(getattr(self, "sampled", None) if round else None)
        return out
