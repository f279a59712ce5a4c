"""The baselines of FedVS's Fig. 2 (Li, Yao, Liu, ICML 2023, Sec. 6.2) on the same split PN model and delays.

* **Wait**: every client computes its embedding ``H_n = g_n(X_n, W_n)`` (eq. 1) on the round's batch, waits
  its keyed upload delay, uploads; the server waits for all N, averages, steps its top model and sends
  ``dL/dH_n = dL/dH / N`` back; every client updates.
* **Ignore**: as Wait, but the server aggregates the first ``N - s`` embeddings to arrive (``s`` the stragglers:
  ``floor(N/2)`` in Sec. 6.2, ``straggler_fraction`` in general; as many
  as there are non-stragglers) and averages over them; only those clients get a gradient and update.
* **Wait-DP**: as Wait, with a noise layer on each client's output (Thapa et al., "SplitFed", AAAI 2022:
  Laplacian noise on the smashed data).  Mechanism stated here: each embedding row is clipped to L1 norm
  ``dp_clip`` (``h <- h min(1, C / ||h||_1)``), then i.i.d. Laplace noise of scale ``b = 2 C / epsilon`` is
  added to every coordinate: replacing one example changes a row by at most ``2C`` in L1, so each released
  row is ``epsilon``-DP (``epsilon = 5``, Sec. 6.2), per round, without composition across rounds (as the
  paper's budget is stated).  The backward pass treats the noise layer as the identity.
* **VAFL** (Chen et al. 2020, "VAFL: a method of vertical asynchronous federated learning"): every client
  loops on its own: embedding of its next batch, upload delay (keyed by the client's own iteration), upload;
  the server keeps the latest embedding of every (example, client) in a table, updates on each arrival
  with the table's mean embedding of the batch, and returns the gradient to that client only, which then
  updates and starts its next iteration.  Each arrival is one trace row with ``event = "update"``; a
  "round" is N arrivals.

Embedding aggregation (parameter ``aggregation`` of Wait, Ignore and VAFL; FedVS Sec. 2.2, Fig. 1: "Three
methods, including concatenation, element-wise average and element-wise maximum, are utilized for embedding
aggregation"; :func:`fednet.learning.vertical.aggregate_embeddings`):

* ``"average"`` (default, Sec. 3's choice; the behaviour above, bit for bit): ``H`` is the mean of the
  received embeddings, client n gets ``dL/dH / |U|``.
* ``"concat"``: ``H = (H_1, ..., H_N)`` side by side, the top model takes ``N h`` inputs; client n gets its
  slice of ``dL/dH``.  The paper does not say what an absent client's slot holds; fixed here: for Ignore
  ("Server ignores the stragglers, and proceeds with aggregating embeddings from non-stragglers", Sec. 6.2)
  zeros (an ignored client contributes nothing, as it contributes nothing to Ignore's average); for VAFL
  ("Server asynchronously receives embeddings", Sec. 6.2) every slot holds the latest embedding the server
  has of that (example, client), the table VAFL keeps for its average.
* ``"max"``: ``H = max_n H_n`` element-wise; ``dL/dH`` goes to the client holding each element's (first)
  maximum, 0 to the others.  Ignore takes the maximum over the received embeddings only; VAFL over its table.

Wait-DP stays average-only (its noise and clipping are calibrated for the averaged embedding of Sec. 6.2) and
refuses other values.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, field_validator

from fednet.algebra.meter import charge
from fednet.learning.vertical import aggregate_embeddings, aggregation_gradient
from fednet.protocol.base import Outgoing, Protocol
from fednet.protocol.vertical import VerticalConfig, VerticalLearning

__all__ = ["WaitConfig", "Wait", "Ignore", "WaitDPConfig", "WaitDP", "VAFL"]


def mean_embedding(embeddings: list[np.ndarray]) -> np.ndarray:
    """``(1/|U|) sum_{n in U} H_n`` (Sec. 3, embedding averaging); charges one MAC per element and operand."""
    charge(embeddings[0].size * len(embeddings))
    return sum(embeddings) / len(embeddings)


class WaitConfig(VerticalConfig):
    """Parameters of Wait, Ignore and VAFL (those of :class:`~fednet.protocol.vertical.VerticalConfig`).

    ``aggregation`` (``"average"``, ``"concat"``, ``"max"``) chooses the embedding aggregation (module
    docstring: what an absent client's slot holds).
    """


class Wait(Protocol):
    """Wait for every client's embedding (Sec. 6.2, baseline 1)."""

    name = "fedvs_wait"
    Config: ClassVar = WaitConfig
    Learning = VerticalLearning

    def wait_for(self) -> int:
        """Embeddings the server aggregates each round (all N)."""
        return self.sim.n_devices

    def embed(self, dev, rows: np.ndarray) -> np.ndarray:
        """Client ``dev``'s embedding of the batch (eq. 1), (b, h); metered."""
        return self.model.embedding(dev.index, rows)

    def round(self, epoch: int) -> Generator:
        """Embeddings up (after the keyed delays), aggregate of the first ``wait_for()``, top step, gradients down."""
        rows = self.learning.batch_rows(epoch, self.config.batch_size)
        work = [(dev, self.learning.delayed_upload(dev, lambda d: self.embed(d, rows), kind="embedding",
                                                   key_round=epoch, element_bits=self.element_bits))
                for dev in self.devices]
        got = yield from self.net.first_k(work, self.wait_for())
        used = sorted(got.nodes, key=lambda n: n.index)
        self.used = [n.index for n in used]
        if self.config.aggregation != "average":
            yield from self._aggregated_round(rows, got, used)
            return
        H = yield from self.net.server_compute(mean_embedding, got.values)
        g_H = yield from self.net.server_compute(self.model.server_step, H, rows)
        yield from self.net.broadcast(g_H.astype(np.float32), kind="embedding_gradient", to=used,
                                      element_bits=self.element_bits)
        yield from self.net.compute_each(used, lambda dev: self.model.client_step(dev.index, rows, g_H,
                                                                                 scale=1.0 / len(used)))

    def _aggregated_round(self, rows: np.ndarray, got, used: list) -> Generator:
        """Concat or max of the received embeddings (absent slots: zeros / left out), top step, per-client gradients."""
        N, agg = self.sim.n_devices, self.config.aggregation
        stack = np.zeros((len(rows), N, self.model.h))
        present = np.zeros(N, bool)
        for node, H_n in got:
            stack[:, node.index] = H_n
            present[node.index] = True
        H = yield from self.net.server_compute(aggregate_embeddings, stack, agg, present)
        g_H = yield from self.net.server_compute(self.model.server_step, H, rows)
        grads = yield from self.net.server_compute(
            lambda: {n.index: aggregation_gradient(g_H, stack, agg, n.index, present) for n in used},
            step="aggregation_gradient")
        yield from self.net.send_all([[Outgoing(self.server, n, grads[n.index].astype(np.float32),
                                                "embedding_gradient", element_bits=self.element_bits)
                                       for n in used]])
        yield from self.net.compute_each(used, lambda dev: self.model.client_step(dev.index, rows, grads[dev.index],
                                                                                 scale=1.0))


class Ignore(Wait):
    """Aggregate the first ``N - s`` embeddings, ignoring the ``s`` stragglers (Sec. 6.2, baseline 2)."""

    name = "fedvs_ignore"

    def wait_for(self) -> int:
        """As many embeddings as there are non-stragglers."""
        return self.sim.n_devices - len(self.learning.delays.stragglers)


class WaitDPConfig(WaitConfig):
    """Wait-DP parameters.

    Attributes
    ----------
    epsilon : float
        Privacy budget per released embedding row (5 in Sec. 6.2).
    dp_clip : float
        L1 bound ``C`` of an embedding row (sensitivity ``2C``).
    """

    epsilon: float = Field(5.0, gt=0)
    dp_clip: float = Field(4.0, gt=0)

    @field_validator("aggregation")
    @classmethod
    def _average_only(cls, v: str) -> str:
        """Wait-DP is Sec. 6.2's baseline on the averaged embedding only."""
        if v != "average":
            raise ValueError(f"Wait-DP is defined on the element-wise average of the embeddings (Sec. 6.2), so "
                             f"aggregation must be 'average', got {v!r}")
        return v


class WaitDP(Wait):
    """Wait with a Laplace noise layer on every client's embedding (Sec. 6.2, baseline 4; module docstring)."""

    name = "fedvs_wait_dp"
    secrets_reach_model = True          # the Laplace noise is a secret
    Config: ClassVar = WaitDPConfig

    def embed(self, dev, rows: np.ndarray) -> np.ndarray:
        """Clip each row to L1 norm ``C``, add Laplace(``2C / epsilon``) noise from the client's secret stream."""
        H = super().embed(dev, rows)
        c = self.config
        norms = np.abs(H).sum(axis=1, keepdims=True)
        H = H * np.minimum(1.0, c.dp_clip / np.maximum(norms, 1e-300))
        charge(2 * H.size)
        rng = self.sim.secret_rng(dev, "dp_noise", self.epoch)
        return H + rng.laplace(0.0, 2.0 * c.dp_clip / c.epsilon, size=H.shape)


class VAFL(Protocol):
    """Vertical asynchronous FL (Chen et al. 2020) on the Sec. 6.2 delays (module docstring)."""

    name = "fedvs_vafl"
    Config: ClassVar = WaitConfig
    Learning = VerticalLearning

    def setup(self) -> Generator:
        """Every client uploads its initial embeddings of all training rows (the server's table), then starts its loop."""
        M, N = len(self.learning.data.y_train), self.sim.n_devices
        allrows = np.arange(M)
        first = yield from self.net.compute_each(self.devices, lambda dev: self.model.embedding(dev.index, allrows))
        yield self.env.all_of([self.env.process(self.net.send(dev, self.server, first[dev.index], kind="embedding",
                                                              element_bits=32)) for dev in self.devices])
        self.table = np.stack([first[n].astype(np.float32) for n in range(N)], axis=1)   # (M, N, h)
        self.arrivals = self.net.queue()
        self.replies = {dev.index: None for dev in self.devices}
        self.iteration = {dev.index: 0 for dev in self.devices}
        for dev in self.devices:
            self.net.background(self.client_loop(dev))

    def client_loop(self, dev) -> Generator:
        """Client ``dev``: embedding of its next batch, delay, upload; wait for its gradient; update; repeat."""
        while True:
            self.iteration[dev.index] += 1
            j = self.iteration[dev.index]
            rows = self.learning.batch_rows(j, self.config.batch_size)
            H = yield from self.learning.delayed_upload(dev, lambda d: self.model.embedding(d.index, rows),
                                                        kind="embedding", key_round=j, element_bits=self.element_bits)
            self.replies[dev.index] = self.env.event()
            yield self.arrivals.put((dev, rows, H))
            g_H = yield self.replies[dev.index]
            scale = None if self.config.aggregation == "average" else 1.0      # average: dL/dH / N (as before)
            yield from self.net.compute(dev, lambda: self.model.client_step(dev.index, rows, g_H, scale=scale))

    def server_update(self, n: int, rows: np.ndarray, H_n: np.ndarray) -> np.ndarray:
        """Store ``H_n`` in the table, step the top model on the table's aggregate; client ``n``'s gradient (b, h).

        ``"average"``: the table's mean embedding, and ``dL/dH`` (the client scales it by ``1/N``); ``"concat"``
        and ``"max"``: :func:`~fednet.learning.vertical.aggregate_embeddings` of the table's rows (every
        client's latest embedding) and ``dL/dH_n`` through it (module docstring).
        """
        self.table[rows, n] = H_n
        if self.config.aggregation != "average":
            stack = self.table[rows].astype(np.float64)
            H = aggregate_embeddings(stack, self.config.aggregation)
            g_H = self.model.server_step(H, rows)
            return aggregation_gradient(g_H, stack, self.config.aggregation, n)
        charge(self.table[rows].size)
        H = self.table[rows].astype(np.float64).mean(axis=1)
        return self.model.server_step(H, rows)

    def round(self, epoch: int) -> Generator:
        """N arrivals, each an asynchronous server update recorded as one ``update`` trace row."""
        for _ in range(self.sim.n_devices):
            dev, rows, H = yield self.arrivals.get()
            g_H = yield from self.net.server_compute(self.server_update, dev.index, rows, H)
            self.used = [dev.index]
            self.net.background(self._reply(dev, g_H))
            self.record("update")
        self.used = None

    def _reply(self, dev, g_H: np.ndarray) -> Generator:
        msg = yield from self.net.send(self.server, dev, g_H.astype(np.float32), kind="embedding_gradient",
                                       element_bits=self.element_bits)
        self.replies[dev.index].succeed(msg.payload.astype(np.float64))

    def round_metrics(self, round: int) -> dict[str, Any]:
        """``iterations``: the clients' iteration counts so far (space-separated)."""
        return {"iterations": " ".join(str(self.iteration.get(i, 0)) for i in range(self.sim.n_devices))
                if hasattr(self, "iteration") else ""}
