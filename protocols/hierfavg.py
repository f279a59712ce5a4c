"""Hierarchical federated averaging (HierFAVG) on client-edge-cloud networks (issue 28, item 5).

Source: Liu, Zhang, Song, Letaief, "Client-Edge-Cloud Hierarchical Federated Learning", IEEE ICC 2020
(arXiv:1905.06641), Algorithm 1 (HierFAVG): every client takes ``kappa_1`` local SGD steps between two edge
aggregations; every edge server ``l`` then aggregates its clients' models weighted by their data,

    ``w^l <- sum_{i in C^l} |D_i| w_i / |D^l|``,

and every ``kappa_2`` edge aggregations the cloud aggregates the edge models weighted by the edges' data,

    ``w <- sum_l |D^l| w^l / |D|``.

The symbols are the paper's (``kappa_1``, ``kappa_2``). The network is a hierarchy (``network.kind =
"hierarchy"``, :func:`fednet.topologies.hierarchy.hierarchy`): each cell's devices talk to their edge server over
the cell's radio links, the edge servers to the cloud over their backhaul (:mod:`fednet.sim.simulation`).

One fednet round is one cloud period (the trace's rows hold the cloud model):

1. the cloud sends ``w`` to every edge server over its backhaul (``d_w`` numbers of ``element_bits``, 32: float32);
2. each edge server, independently of the others, ``kappa_2`` times: sends its model to the clients of its cell
   present this round (the availability model, drawn once per round), each client runs ``kappa_1`` SGD steps on
   minibatches of ``batch_size`` of its rows (one computation of the steps' metered MACs on its processor) and
   uploads ``Delta_i = w_i - w^l``; the edge server waits for every present client and computes ``w^l + sum_i
   (|D_i| / sum_j |D_j|) Delta_i`` over the clients that reported, in order of arrival (metered on its processor);
3. each edge server uploads ``w^l`` over its backhaul; the cloud waits for every edge server and computes ``sum_l
   (|D^l| / sum_k |D^k|) w^l`` over the edge servers that had at least one client update (metered on its
   processor). An edge server none of whose clients was present uploads nothing and is left out; a round in which
   no edge server had an update makes none (``skipped``).

Minibatches and learning rate are indexed by the client's *local step* ``s = ((r - 1) kappa_2 + (k - 1)) kappa_1 +
t`` (round ``r``, edge period ``k``, step ``t``): the rows come from the keyed stream ``(device, "minibatch", s)``
and the step size is the schedule at ``s`` (DReS-FL's MLP schedule, :class:`~fednet.protocol.neural.NeuralConfig`).
So with ``kappa_1 = kappa_2 = 1`` round ``r`` draws what FedAvg's round ``r`` draws (``protocols/fedavg.py``), and on
one cell (one edge server) the model is FedAvg's bit for bit whenever the edge server receives the updates in the
order FedAvg's server does: the edge aggregation is FedAvg's ``w + sum_i w_i Delta_i`` on the same deltas and
weights, and the cloud's average of one edge model with weight 1 is that model (``0 + 1 * x = x`` exactly).

What each party sees: an edge server sees its clients' updates in the clear, the cloud the edge models (no secure
aggregation, as in the paper).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pydantic import Field

from fednet.learning.federated import add_scaled, fedavg_weights, local_sgd_delta, weighted_sum
from fednet.protocol.base import Protocol
from fednet.protocol.neural import NeuralConfig, NeuralLearning
from fednet.sim.simulation import Node

__all__ = ["HierFAVGConfig", "HierFAVG"]


class HierFAVGConfig(NeuralConfig):
    """HierFAVG's parameters (:class:`~fednet.protocol.neural.NeuralConfig` plus the two aggregation periods).

    The learning-rate schedule (``learning_rate``, ``lr_decay``, ``lr_every``) and the minibatches count *local
    steps* here, not rounds (module docstring). The defaults ``kappa_1 = 5``, ``kappa_2 = 2`` are fednet's (the paper
    studies several pairs); a study sets its own.

    Attributes
    ----------
    kappa_1 : int
        Local SGD steps of every client between two edge aggregations (Liu et al., Algorithm 1), in [1, 10000].
    kappa_2 : int
        Edge aggregations between two cloud aggregations (Algorithm 1), in [1, 10000].
    """

    kappa_1: int = Field(5, ge=1, le=10_000)
    kappa_2: int = Field(2, ge=1, le=10_000)


class HierFAVG(Protocol):
    """Hierarchical FedAvg on a client-edge-cloud network (module docstring)."""

    name = "hierfavg"
    Config = HierFAVGConfig
    Learning = NeuralLearning
    setup_dropouts = "none"          # nothing is exchanged before training; absent devices are only recorded

    def validate(self) -> None:
        """Refuse a network without edge servers, or with a device not in an edge server's cell."""
        super().validate()
        sim = self.sim
        if not sim.edge_servers:
            raise ValueError("hierfavg needs a network with edge servers (network.kind = 'hierarchy', "
                             "fednet.topologies.hierarchy); this network has none")
        direct = [dev.index for dev in sim.devices if sim.parent.get(dev.index) == sim.server.index]
        if direct:
            raise ValueError(f"hierfavg needs every device in an edge server's cell; devices {direct[:5]} are "
                             f"linked to the cloud server directly")

    @property
    def cells(self) -> list[tuple[Node, list[Node]]]:
        """``(edge server, its clients in index order)`` for every edge server that has clients."""
        cells = getattr(self, "_cells", None)
        if cells is None:
            sim = self.sim
            members: dict[int, list[Node]] = {edge.index: [] for edge in sim.edge_servers}
            for dev in sim.devices:
                members[sim.parent[dev.index]].append(dev)
            cells = self._cells = [(sim.node(e), devs) for e, devs in members.items() if devs]
        return cells

    def local_step(self, epoch: int, k: int, t: int) -> int:
        """The local step ``s`` of step ``t`` of edge period ``k`` of round ``epoch`` (module docstring), from 1."""
        c = self.config
        return ((epoch - 1) * c.kappa_2 + (k - 1)) * c.kappa_1 + t

    def local_update(self, dev: Node, epoch: int, k: int) -> dict:
        """Client ``dev``: ``kappa_1`` SGD steps from the downloaded edge model; returns ``Delta_i = w_i - w^l``
        (the sum of the steps' deltas; metered: the gradients and one MAC per element and step)."""
        task, learning = self.task, self.learning
        params, total = dev.state.received, None
        for t in range(1, self.config.kappa_1 + 1):
            s = self.local_step(epoch, k, t)
            rows = learning.rows(dev, s)
            delta, _ = local_sgd_delta(self.model, params, task.X[dev.index][rows], task.Y[dev.index][rows],
                                       learning.schedule(s))
            total = delta if total is None else add_scaled(total, 1.0, delta)
            if t < self.config.kappa_1:
                params = add_scaled(params, 1.0, delta)
        return total

    @staticmethod
    def edge_aggregate(model: dict, deltas: list, weights) -> dict:
        """Edge server: ``w^l + sum_i w_i Delta_i`` (FedAvg's update; one MAC per element and term, and per element)."""
        return add_scaled(model, 1.0, weighted_sum(deltas, weights))

    def _client(self, edge: Node, dev: Node, model: dict, epoch: int, k: int) -> Generator[Any, Any, dict]:
        """One client's edge period: download the edge model, ``kappa_1`` local steps, upload ``Delta_i``."""
        msg = yield from self.net.send(edge, dev, model, kind="model", element_bits=self.element_bits)
        dev.state.received = msg.payload
        delta = yield from self.net.compute(dev, self.local_update, dev, epoch, k, step="local_update")
        yield from self.net.send(dev, edge, delta, kind="update", element_bits=self.element_bits)
        return delta

    def _edge(self, edge: Node, clients: list[Node], epoch: int, arrived: list) -> Generator:
        """Edge server ``edge``'s cloud period: the cloud model down the backhaul, ``kappa_2`` edge aggregations of
        its present clients, its model up the backhaul (appended to ``arrived`` as ``(edge, model)``)."""
        msg = yield from self.net.send(self.sim.server, edge, self.params, kind="model", element_bits=self.element_bits)
        model = msg.payload
        flags = self.sim.available_many(clients)
        present = [dev for dev, ok in zip(clients, flags) if ok]
        absent = [dev for dev, ok in zip(clients, flags) if not ok]
        if not present:
            self.round_dropped.update(dev.index for dev in absent)
            return
        for k in range(1, self.config.kappa_2 + 1):
            replies = yield from self.net.first_k([(dev, self._client(edge, dev, model, epoch, k)) for dev in present],
                                                  dropped=absent)
            order = [dev.index for dev in replies.nodes]
            self._used.update(order)
            w = fedavg_weights(self.task.n_points, order)                      # |D_i| / sum over the reports
            model = yield from self.net.compute(edge, self.edge_aggregate, model, replies.values, w,
                                                step="edge aggregation")
        yield from self.net.send(edge, self.sim.server, model, kind="edge_model", element_bits=self.element_bits)
        arrived.append((edge, model))

    def round(self, epoch: int) -> Generator:
        """One cloud period (module docstring): every edge server's ``kappa_2`` edge periods in parallel, then the
        cloud's weighted average of the edge models."""
        self._used: set[int] = set()
        arrived: list[tuple[Node, dict]] = []
        env = self.sim.env
        yield env.all_of([self.net.background(self._edge(edge, clients, epoch, arrived))
                          for edge, clients in self.cells])
        self.used = sorted(self._used)
        if not arrived:
            self.learning.skipped = True
            return
        data = {edge.index: int(sum(self.task.n_points[dev.index] for dev in clients)) for edge, clients in self.cells}
        w = fedavg_weights([data[edge.index] for edge, _ in arrived], list(range(len(arrived))))   # |D^l| / sum
        self.params = yield from self.net.server_compute(weighted_sum, [m for _, m in arrived], w,
                                                         step="cloud aggregation")
