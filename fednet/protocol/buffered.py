"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022, Algorithm 1): the protocol family of
``fedbuff`` and ``fedbuff_lightsecagg`` (``protocols/``), the way :mod:`fednet.protocol.neural` is the MLP baselines'.

:class:`BufferedAsync` runs the clients' loops and the server's buffer on the engine's primitives; its choices are
stated in ``protocols/fedbuff.py``'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fednet.algebra.meter import axpy, charge
from fednet.learning.models import minibatch_gradient, some_minibatch_gradients, sum_gradients
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.sim.engine.results import batched
from fednet.sim.simulation import Node

__all__ = ["FedBuffConfig", "FedBuffState", "BufferedAsync", "staleness_weight", "buffered_sum"]


class FedBuffConfig(ProtocolConfig):
    """FedBuff's parameters (Nguyen et al., Algorithm 1).

    Attributes
    ----------
    buffer_size : int
        ``K``: updates per server step (10 in the paper's experiments).
    concurrency : int or None
        Clients training at once (the paper's ``concurrency``); None: every device.
    staleness : {"sqrt", "none"}
        Staleness weight: ``1 / sqrt(1 + tau)`` (the paper's) or 1.
    server_lr : float
        ``eta_g``, scaling the buffered sum before the server step (1: the task's step as it is).
    minibatch_fraction : float
        Fraction of a client's points in its minibatch (0.2, as conventional FL in Schlegel et al., Sec. VII-A).
    """

    buffer_size: int = Field(10, ge=1)
    concurrency: int | None = Field(None, ge=1)
    staleness: Literal["sqrt", "none"] = "sqrt"
    server_lr: float = Field(1.0, gt=0.0)
    minibatch_fraction: float = Field(0.2, gt=0.0, le=1.0)


@dataclass
class FedBuffState(NodeState):
    """A client's minibatch size ``b_i``, its iterations so far and the last model version it trained on."""

    batch: int = 0
    iteration: int = 0
    version: int = -1


def staleness_weight(rule: str, tau: int) -> float:
    """``s(tau)``: ``1 / sqrt(1 + tau)`` for ``"sqrt"`` (Nguyen et al., Sec. 5), 1.0 for ``"none"``.

    Raises
    ------
    ValueError
        For a negative ``tau`` or an unknown rule.
    """
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")
    if rule == "none":
        return 1.0
    if rule == "sqrt":
        return 1.0 / math.sqrt(1.0 + tau)
    raise ValueError(f"staleness rule must be 'sqrt' or 'none', got {rule!r}")


def buffered_sum(gradients: list[np.ndarray], weights: list[float], server_lr: float) -> np.ndarray:
    """``server_lr * sum_k w_k G_k`` in arrival order, metered: the plain sum of eq. (3) when every weight is 1
    (``d c`` MACs a gradient), else one scaling and one addition a gradient (``2 d c`` MACs), and ``d c`` more
    for ``server_lr != 1``."""
    if any(w != 1.0 for w in weights):
        g0 = gradients[0]
        if (isinstance(g0, np.ndarray) and g0.dtype == np.float64
                and all(isinstance(g, np.ndarray) and g.shape == g0.shape and g.dtype == g0.dtype for g in gradients)):
            stack = np.stack(gradients)             # the same products as an axpy a gradient, at once, in place
            charge(stack.size)
            np.multiply(np.asarray(weights, dtype=np.float64).reshape((-1,) + (1,) * g0.ndim), stack, out=stack)
            gradients = np.add(stack, 0.0, out=stack)
        else:
            gradients = [axpy(w, g, 0.0) for w, g in zip(weights, gradients)]
    total = sum_gradients(gradients)
    return total if server_lr == 1.0 else axpy(server_lr, total, 0.0)


def buffered_gradients_of(protocol: Any, nodes: list, received: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """The batched form of :meth:`BufferedAsync.local_gradient`: each node's minibatch gradient on ``received``,
    its rows keyed by the iteration in its state (the same floats, :func:`fednet.learning.models.minibatch_gradients`).

    Returns
    -------
    gradients : list of ndarray (d, c), or one ndarray (len(nodes), d, c)
    macs : list of int
        ``2 b_i d c`` per node.
    """
    rows = protocol.minibatch_rows_many(nodes, [dev.state.batch for dev in nodes],
                                        [dev.state.iteration for dev in nodes])
    X, Y = protocol.task.X, protocol.task.Y
    cache = protocol.__dict__.setdefault("_gradient_stacks", {})      # the whole population's stacks, kept
    return some_minibatch_gradients(X, Y, received.astype(np.float64), [dev.index for dev in nodes], rows, cache)


class BufferedAsync(Protocol):
    """FedBuff's buffered asynchronous aggregation (module docstring): the base of ``fedbuff`` and
    ``fedbuff_lightsecagg`` (``protocols/``), not registered itself."""

    Config = FedBuffConfig
    State = FedBuffState
    setup_dropouts = "none"                               # no set-up exchange: absentees recorded only

    @classmethod
    def check(cls, config: FedBuffConfig, n_devices: int) -> None:
        """Refuse ``buffer_size > concurrency`` or ``concurrency > n_devices`` (the buffer could never fill)."""
        slots = n_devices if config.concurrency is None else config.concurrency
        if slots > n_devices:
            raise ValueError(f"concurrency must be at most the number of devices ({n_devices}), got {slots}")
        if config.buffer_size > slots:
            raise ValueError(f"buffer_size must be at most concurrency ({slots}: every buffered update comes from a "
                             f"different client of one version at most), got {config.buffer_size}")

    def setup(self) -> Generator:
        """No set-up exchange: each client's minibatch size; the server's queue, slots and version."""
        for dev in self.devices:
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * self.task.X[dev.index].shape[0])))
        self.version = 0
        #: Who runs the clients, decided at the first take: "reference" (a process each) or the engine's replay.
        self.clients: Any = None
        self.arrivals, self.slots = self.net.queue(), self.net.queue()
        # the concurrency slots, in the store from the start (no put events: nothing is scheduled before a take)
        self.slots.items.extend([True] * (self.sim.n_devices if self.config.concurrency is None
                                          else self.config.concurrency))
        self.new_version = self.env.event()
        self._staleness: list[int] = []
        return
        yield  # pragma: no cover

    @batched(buffered_gradients_of)
    def local_gradient(self, dev: Node, received: np.ndarray, iteration: int) -> np.ndarray:
        """Client ``dev``'s minibatch gradient (eq. 3) on the model it downloaded, rows keyed by its iteration."""
        rows = self.minibatch_rows(dev, dev.state.batch, iteration)
        return minibatch_gradient(self.task.X[dev.index], self.task.Y[dev.index], received.astype(np.float64), rows)

    def next_turn(self, dev: Node) -> Generator:
        """Client ``dev`` waits for a model version it has not trained on (skipping one it is absent for) and a
        concurrency slot; then its state holds that version and its next iteration."""
        st = dev.state
        while st.version == self.version or not self.net.available(dev):
            st.version = self.version                 # trained on this version already, or absent: skip it
            yield self.new_version
        yield self.slots.get()
        st.version, st.iteration = self.version, st.iteration + 1

    def client_loop(self, dev: Node) -> Generator:
        """Client ``dev``: wait for a version it has not trained on and a slot; download, train, upload; repeat."""
        st = dev.state
        while True:
            yield from self.next_turn(dev)
            msg = yield from self.net.send(self.server, dev, self.theta.astype(np.float32), kind="model",
                                           element_bits=self.element_bits)
            G = yield from self.net.compute(dev, self.local_gradient, dev, msg.payload, st.iteration)
            yield from self.net.send(dev, self.server, G, kind="gradient", element_bits=self.element_bits)
            self.slots.put(True)
            self.arrivals.put((dev, st.version, G))

    def fill_buffer(self) -> Generator:
        """The server's buffer: (the first time, start the clients, with the first round's draws) wait for ``K``
        arrivals ``(dev, version, update)``, in arrival order; their staleness goes to the trace.

        An engine step (kind ``buffered``): its reference runs :meth:`client_loop` as a process per client
        (:func:`fednet.sim.engine.reference.buffered`); the ``buffered`` backend replays it with arrays where it can
        (:mod:`fednet.sim.engine.backends.buffered`).
        """
        buffer = yield from self.net.take_buffered(
            self, self.devices, self.config.buffer_size, base=BufferedAsync, fn=self.local_gradient,
            download=lambda: self.theta.astype(np.float32), download_kind="model", download_bits=self.element_bits,
            upload_kind="gradient", upload_bits=self.element_bits, concurrency=self.config.concurrency)
        self._staleness = [self.version - v for _, v, _ in buffer]
        self.used = [dev.index for dev, _, _ in buffer]
        return buffer

    def new_model_version(self) -> None:
        """The server has stepped: a new model version, announced to the clients waiting for one."""
        if self.clients is not None and self.clients != "reference":
            self.clients.version_changed()                      # the replay ends what ends before the new version
        self.version += 1
        event, self.new_version = self.new_version, self.env.event()
        event.succeed()

    def round(self, epoch: int) -> Generator:
        """One server step: wait for ``K`` buffered updates, weight them by staleness, step, start a new version."""
        cfg = self.config
        buffer = yield from self.fill_buffer()
        weights = [staleness_weight(cfg.staleness, tau) for tau in self._staleness]
        G = yield from self.net.server_compute(buffered_sum, [g for _, _, g in buffer], weights, cfg.server_lr)
        self.mode.update(self, G, int(self.point_counts[self.used].sum()))                # eqs. (4)-(5)
        self.new_model_version()

    def round_metrics(self, round: int) -> dict[str, Any]:
        """``version`` after the step; the buffered updates' ``staleness`` (arrival order) and ``max_staleness``."""
        return {"version": self.version, "staleness": " ".join(map(str, self._staleness)),
                "max_staleness": max(self._staleness, default=0)}
