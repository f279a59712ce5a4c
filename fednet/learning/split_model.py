"""Split models of vertical FL: bottom models over the clients' feature blocks, a top model at the server.

FedVS (Li et al., Sec. 3): client ``n`` holds the block ``X_n`` of every example's features
(:class:`~fednet.learning.partitions.VerticalSplit`) and a bottom model producing the embedding
``H_n = f_n(X_n)`` (a polynomial network, eq. 1); the server holds the labels and a top model on
the aggregate ``H = (1/N) sum_n H_n``; the gradient ``dL/dH`` goes back to the clients, which
update their bottom models. :class:`SplitModel` composes any :class:`~fednet.learning.model.Model`
parts into one :class:`~fednet.learning.model.Model`, the plain (uncoded) reference that FedVS
decodes to and that its baselines (Wait, Ignore, VAFL) train; a protocol that runs the parts on
different nodes calls :meth:`SplitModel.embeddings`, the top model's ``gradient_with_input`` and
the bottoms' ``backward`` itself, with :meth:`SplitModel.bottom_params` and
:meth:`SplitModel.top_params` to address the parts' parameters.

Parameters of the composite are named ``"bottom<n>/<name>"`` and ``"top/<name>"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.algebra.meter import charge
from fednet.algebra.meter import unmetered
from fednet.learning.model import Model, Params, ParamsOrArray
from fednet.learning.partitions import VerticalSplit

__all__ = ["SplitModel"]


class SplitModel(Model):
    """Bottom models on feature blocks, averaged (or summed) embeddings, a top model (FedVS, Sec. 3).

    Parameters
    ----------
    bottoms : sequence of Model
        Client ``n``'s model: ``n_inputs == split.sizes[n]``, all with the same ``n_outputs``
        (the embedding width ``e``). Each needs :meth:`~fednet.learning.model.Model.backward`.
    top : Model
        The server's model on ``H``: ``n_inputs == e``; needs
        :meth:`~fednet.learning.model.Model.gradient_with_input`.
    split : VerticalSplit
        The clients' feature blocks.
    aggregate : {"mean", "sum"}
        ``H = (1/N) sum_n H_n`` (FedVS) or ``sum_n H_n``.

    Raises
    ------
    ValueError
        If the number of bottoms differs from ``split.n_clients``, or a width does not fit.
    """

    def __init__(self, bottoms: Sequence[Model], top: Model, split: VerticalSplit, aggregate: str = "mean") -> None:
        if len(bottoms) != split.n_clients:
            raise ValueError(f"bottoms lists {len(bottoms)} models for {split.n_clients} clients")
        e = bottoms[0].n_outputs
        for n, (m, p) in enumerate(zip(bottoms, split.sizes)):
            if m.n_inputs != p:
                raise ValueError(f"bottoms[{n}].n_inputs = {m.n_inputs}, but client {n} holds {p} features")
            if m.n_outputs != e:
                raise ValueError(f"bottoms[{n}].n_outputs = {m.n_outputs}, expected the embedding width {e}")
        if top.n_inputs != e:
            raise ValueError(f"top.n_inputs = {top.n_inputs}, expected the embedding width {e}")
        if aggregate not in ("mean", "sum"):
            raise ValueError(f"aggregate must be 'mean' or 'sum', got {aggregate!r}")
        self.bottoms, self.top, self.split, self.aggregate = list(bottoms), top, split, aggregate
        self.n_inputs, self.n_outputs, self.n_embedding = split.n_features, top.n_outputs, e

    def __repr__(self) -> str:
        return f"SplitModel({self.split.n_clients} bottoms -> {self.n_embedding} ({self.aggregate}) -> {self.top!r})"

    # -- parameters ----------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``"bottom<n>/<name>"`` for every bottom, then ``"top/<name>"``."""
        out: dict[str, tuple[int, ...]] = {}
        for n, m in enumerate(self.bottoms):
            out.update({f"bottom{n}/{k}": s for k, s in m.param_shapes().items()})
        out.update({f"top/{k}": s for k, s in self.top.param_shapes().items()})
        return out

    def init_params(self, seed: int | np.random.Generator | None = None) -> Params:
        """Each part's ``init_params`` under its own stream spawned from ``seed`` (SeedSequence)."""
        if isinstance(seed, np.random.Generator):
            seed = int(seed.integers(2**63))
        streams = np.random.SeedSequence(0 if seed is None else int(seed)).spawn(len(self.bottoms) + 1)
        out: Params = {}
        for n, (m, ss) in enumerate(zip(self.bottoms, streams)):
            out.update({f"bottom{n}/{k}": v for k, v in m.init_params(np.random.default_rng(ss)).items()})
        out.update({f"top/{k}": v for k, v in self.top.init_params(np.random.default_rng(streams[-1])).items()})
        return out

    def bottom_params(self, params: ParamsOrArray, n: int) -> Params:
        """Client ``n``'s parameters, under the bottom model's own names."""
        p, prefix = self.as_params(params), f"bottom{n}/"
        return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}

    def top_params(self, params: ParamsOrArray) -> Params:
        """The server's parameters, under the top model's own names."""
        p = self.as_params(params)
        return {k[4:]: v for k, v in p.items() if k.startswith("top/")}

    # -- metered computation ---------------------------------------------------------------------
    def embeddings(self, params: ParamsOrArray, x: np.ndarray) -> list[np.ndarray]:
        """Every client's embedding ``H_n = f_n(X_n)``, each (b, e); charges the bottoms' forward MACs."""
        return [m.forward(self.bottom_params(params, n), xn)
                for n, (m, xn) in enumerate(zip(self.bottoms, self.split.split(x)))]

    def combine(self, embeddings: Sequence[np.ndarray]) -> np.ndarray:
        """``H = (1/N) sum_n H_n`` (or the plain sum); charges one MAC per element of ``H`` for the scaling."""
        H = embeddings[0]
        for h in embeddings[1:]:
            H = H + h
        if self.aggregate == "mean":
            charge(H.size)
            H = H * (1.0 / len(embeddings))
        return H

    def forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """``top(H)``; charges the bottoms' and the top's forward MACs."""
        return self.top.forward(self.top_params(params), self.combine(self.embeddings(params, x)))

    def loss(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> float:
        """The top model's loss on ``H`` (its regulariser included; the bottoms' are not)."""
        return self.top.loss(self.top_params(params), self.combine(self.embeddings(params, x)), y)

    def gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """Gradient of the summed loss through the split: top, then ``dL/dH_n`` to every bottom.

        ``dL/dH_n = (1/N) dL/dH`` for the mean. Charges the bottoms' forward, the scaling of
        ``H``, the top's forward and backward, the scaling of ``dL/dH`` and the bottoms' backward
        passes (without their input gradients).
        """
        xs = self.split.split(x)
        Hs = [m.forward(self.bottom_params(params, n), xn) for n, (m, xn) in enumerate(zip(self.bottoms, xs))]
        g_top, g_H = self.top.gradient_with_input(self.top_params(params), self.combine(Hs), y)
        if self.aggregate == "mean":
            charge(g_H.size)
            g_H = g_H * (1.0 / len(Hs))
        out: Params = {}
        for n, (m, xn) in enumerate(zip(self.bottoms, xs)):
            g_n, _ = m.backward(self.bottom_params(params, n), xn, g_H, input_grad=False)
            out.update({f"bottom{n}/{k}": v for k, v in g_n.items()})
        out.update({f"top/{k}": v for k, v in g_top.items()})
        return out

    # -- observer --------------------------------------------------------------------------------
    def predict(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Predicted classes (not metered)."""
        with unmetered():
            H = self.combine(self.embeddings(params, x))
        return self.top.predict(self.top_params(params), H)

    def evaluate(self, params: ParamsOrArray, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """The top model's ``(accuracy, loss)`` on the test set's embeddings (not metered)."""
        with unmetered():
            H = self.combine(self.embeddings(params, x))
        return self.top.evaluate(self.top_params(params), H, labels)
