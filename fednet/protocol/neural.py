"""The learning set-up of the neural-network protocols (the DReS-FL baselines): model, schedule, evaluation.

Source: Shao et al., "DReS-FL", Sec. 6.1 and App. B: an MLP with two hidden layers of 64 units
(784-64-64-10 on MNIST / Fashion-MNIST) and ReLU for the baselines, mini-batch SGD with batch
64, one local step per round, learning rate 0.1 decayed by 0.65 every 1500 rounds.

:class:`NeuralLearning` (a protocol declares ``Learning = NeuralLearning`` and a ``Config`` deriving from
:class:`NeuralConfig`) holds the global parameters (``self.learning.params``, also ``self.params``;
:data:`Params`), draws each client's minibatch from the keyed stream
``(device, "minibatch", round)`` (so every baseline sees the same minibatches at a seed, whatever
it did in earlier rounds), and evaluates the test accuracy every ``eval_every`` rounds and at the last
round (the other rows repeat the last evaluation; the column ``evaluated`` says which rows measured).

:class:`NeuralProtocol` is a deprecated alias kept for outside code: a :class:`~fednet.protocol.base.Protocol`
configured with :class:`NeuralLearning`, with the old attribute names forwarded.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Generator, Iterator
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from fednet.learning.federated import dresfl_schedule
from fednet.learning.model import Model, Params
from fednet.learning.torch_models import MLPModel
from fednet.plugins import import_callable, import_object, is_object_path
from fednet.sim.simulation import Node

from .base import Protocol, ProtocolConfig
from .learning import Learning

__all__ = ["NeuralConfig", "ModelPluginConfig", "plugin_model", "NeuralLearning", "NeuralProtocol"]


class NeuralConfig(ProtocolConfig):
    """Parameters shared by the neural-network baselines (DReS-FL Sec. 6.1, App. B).

    Attributes
    ----------
    element_bits : int
        Wire width of a parameter (32: float32).
    hidden : list of int
        Hidden widths of the MLP (``[64, 64]``); input and output widths come from the task.
    activation : str
        ``"relu"`` (the baselines).
    loss : {"cross_entropy", "mse"}
        Per-row loss (the paper does not state the baselines' loss; cross-entropy is PyTorch's usual).
    batch_size : int
        Rows per client and round (64).
    learning_rate, lr_decay : float
        0.1 and 0.65 (App. B).
    lr_every : int
        Rounds between decays (1500).
    model_seed : int
        Seed of the initial parameters (the same for every protocol at a study seed).
    eval_every : int
        Evaluate the test accuracy every this many rounds (and at round 0).
    """

    element_bits: int = Field(32, ge=1)
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    activation: Literal["relu", "tanh", "sigmoid", "quadratic"] = "relu"
    loss: Literal["cross_entropy", "mse"] = "cross_entropy"
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(0.1, gt=0)
    lr_decay: float = Field(0.65, gt=0)
    lr_every: int = Field(1500, ge=1)
    model_seed: int = Field(0, ge=0)
    eval_every: int = Field(1, ge=1)


class ModelPluginConfig(ProtocolConfig):
    """A user's own torch model in place of the MLP (:func:`plugin_model`).

    Attributes
    ----------
    model : str or None
        ``"package.module:factory"``: ``factory(n_inputs, n_outputs)`` returns a ``torch.nn.Module`` mapping
        ``(b, n_inputs)`` float rows to ``(b, n_outputs)`` scores (or a :class:`fednet.learning.model.Model`);
        imported like a ``module:Class`` protocol (``sys.path``, then the study file's folder and the working
        folder). Its initial parameters are torch's initialisation under ``model_seed``; ``loss`` applies;
        ``hidden`` and ``activation`` are not used. None (default): the MLP of ``hidden`` and ``activation``.
    """

    model: str | None = None

    @field_validator("model")
    @classmethod
    def _importable(cls, spec: str | None) -> str | None:
        if spec is None:
            return spec
        if not is_object_path(spec):
            raise ValueError(f"model must be 'package.module:factory', got {spec!r}")
        import_callable(spec, "model factory", "model")
        return spec


def plugin_model(spec: str, n_inputs: int, n_outputs: int, loss: str) -> Model:
    """The model a ``"package.module:factory"`` builds (:class:`ModelPluginConfig`), as a metered :class:`Model`.

    Parameters
    ----------
    spec : str
        ``"package.module:factory"``; ``factory(n_inputs, n_outputs)`` returns a ``torch.nn.Module`` (wrapped in
        :class:`~fednet.learning.torch_models.TorchModel`: float32, MACs counted by torch's flop counter, the
        forward and backward contractions) or a :class:`~fednet.learning.model.Model` (used as it is).
    n_inputs, n_outputs : int
        ``d`` and ``c`` of the task.
    loss : {"cross_entropy", "mse"}

    Returns
    -------
    Model

    Raises
    ------
    fednet.errors.ConfigError
        If the factory cannot be imported, raises, or returns something else (one line, naming ``model``).
    """
    from torch import nn

    from fednet.errors import ConfigError
    from fednet.learning.torch_models import TorchModel

    try:
        built = import_object(spec, "model factory")(n_inputs, n_outputs)
    except Exception as e:  # the user's code: one line naming the option
        raise ConfigError(f"model = {spec!r}: {spec.partition(':')[2]}({n_inputs}, {n_outputs}) failed: "
                          f"{type(e).__name__}: {e}") from e
    if isinstance(built, Model):
        return built
    if not isinstance(built, nn.Module):
        raise ConfigError(f"model = {spec!r} returned a {type(built).__name__}; it must return a torch.nn.Module "
                          f"(or a fednet.learning.model.Model)")
    try:
        return TorchModel(built, n_inputs, n_outputs, loss=loss)
    except ValueError as e:
        raise ConfigError(f"model = {spec!r}: {e}") from e


class NeuralLearning(Learning):
    """The MLP set-up of the DReS-FL baselines (module docstring); ``self.learning`` of its protocols.

    A protocol training another network on the same schedule (DReS-FL's field MLP) replaces ``model`` and
    ``params`` in its ``__init__`` (``self.model = ...``, ``self.params = ...``).

    Attributes
    ----------
    model : Model
        The MLP (``[d, *hidden, c]``, from the config).
    params : Params
        The global parameters (float64), from ``model_seed``.
    schedule : StepSchedule
        The learning-rate schedule of App. B.
    skipped : bool
        Set by a protocol whose round made no update (the ``skipped`` column; reset after each row).
    """

    Config: ClassVar[type[ProtocolConfig]] = NeuralConfig

    def __init__(self, protocol: Protocol) -> None:
        super().__init__(protocol)
        cfg, task = protocol.config, protocol.task
        spec = getattr(cfg, "model", None)          # a protocol whose Config has ``model`` (ModelPluginConfig)
        if spec is None:
            sizes = [task.d, *cfg.hidden, task.c]
            self.model: Model = MLPModel(sizes, cfg.activation, loss=cfg.loss)
        else:
            self.model = plugin_model(spec, task.d, task.c, cfg.loss)
        self.params: Params = {k: np.asarray(v, np.float64) for k, v in self.model.init_params(cfg.model_seed).items()}
        self.schedule = dresfl_schedule(cfg.learning_rate, cfg.lr_decay, cfg.lr_every)
        self._last_eval: tuple[float, float] = (float("nan"), float("nan"))
        self._evaluated = False
        self._final_round: int | None = None
        self.skipped = False

    @property
    def lr(self) -> float:
        """The learning rate of the current round."""
        return self.schedule(self.protocol.epoch)

    @property
    def n_params(self) -> int:
        """Number of model parameters ``d_w`` (what one model message carries)."""
        return self.model.n_params

    def rows(self, dev: Node, epoch: int) -> np.ndarray:
        """Client ``dev``'s minibatch in round ``epoch`` (``batch_size`` rows without replacement, keyed stream)."""
        p = self.protocol
        n = p.task.X[dev.index].shape[0]
        return p.sim.rng(dev, "minibatch", epoch).choice(n, size=min(p.config.batch_size, n), replace=False)

    def batch(self, dev: Node) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of client ``dev``'s minibatch this round."""
        task = self.protocol.task
        r = self.rows(dev, self.protocol.epoch)
        return task.X[dev.index][r], task.Y[dev.index][r]

    def local_batches(self, dev: Node, steps: int = 1, epochs: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Client ``dev``'s minibatches for its local work this round (FedAvg's local steps / epochs).

        ``epochs = None``: ``steps`` minibatches of ``batch_size`` rows without replacement, the first
        :meth:`batch` itself (keyed ``(device, "minibatch", round)``, so one step is the one-step baselines' draw),
        step ``s >= 1`` keyed ``(device, "minibatch", round, s)``. ``epochs = E``: McMahan et al.'s ``E`` local
        epochs (AISTATS 2017, Alg. 1, ``ClientUpdate``): each a pass over the client's rows in the order of a
        permutation keyed ``(device, "local-epoch", round, e)``, split into ``ceil(n_i / B)`` minibatches of
        ``B = batch_size`` rows (the last one smaller when ``B`` does not divide ``n_i``).

        Parameters
        ----------
        dev : Node
        steps : int
            Local steps ``K >= 1`` (ignored when ``epochs`` is given).
        epochs : int, optional
            Local epochs ``E >= 1``.

        Yields
        ------
        (ndarray (b, d), ndarray (b,) or (b, c))
            Rows and labels of each minibatch, in order.
        """
        p = self.protocol
        X, Y = p.task.X[dev.index], p.task.Y[dev.index]
        n, b = X.shape[0], min(p.config.batch_size, X.shape[0])
        if epochs is None:
            yield self.batch(dev)
            for s in range(1, steps):
                r = p.sim.rng(dev, "minibatch", p.epoch, s).choice(n, size=b, replace=False)
                yield X[r], Y[r]
            return
        for e in range(epochs):
            order = p.sim.rng(dev, "local-epoch", p.epoch, e).permutation(n)
            for start in range(0, n, p.config.batch_size):
                r = order[start:start + p.config.batch_size]
                yield X[r], Y[r]

    def secret_rng(self, dev: Node, purpose: str, *key: int) -> np.random.Generator:
        """A stream for protocol secrets (masks, noise shards) that never derives from the public seed.

        Uses the engine's secret streams where the engine has them (``Simulation.secret_rng``),
        otherwise fresh OS entropy (secrets do not change any decoded value, so traces stay
        reproducible at a seed).
        """
        make = getattr(self.protocol.sim, "secret_rng", None)
        if make is not None:
            return make(dev, purpose, *key)
        return np.random.default_rng(secrets.randbits(128))

    def participation(self) -> np.ndarray | None:
        """Each client's probability of taking part, if the availability model states it (else None)."""
        p = getattr(self.protocol.sim.availability, "participation", None)
        return None if p is None else np.asarray(p, dtype=np.float64)

    def start(self, epochs: int) -> None:
        """Remember the last round, so that it is always evaluated."""
        self._final_round = epochs

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss every ``eval_every`` rounds and at the last round; the last values in between."""
        p = self.protocol
        self._evaluated = (p.epoch % p.config.eval_every == 0 or np.isnan(self._last_eval[0])
                           or p.epoch == self._final_round)
        if self._evaluated:
            self._last_eval = self.model.evaluate(self.params, p.task.x_test, p.task.y_test)
        return self._last_eval

    def round_metrics(self, round: int) -> dict[str, Any]:
        """``evaluated``: whether this row measured the accuracy; ``skipped``: no update this round."""
        out = {"evaluated": self._evaluated, "skipped": self.skipped}
        self.skipped = False
        return out


class NeuralProtocol(Protocol):
    """Deprecated: subclass :class:`~fednet.protocol.base.Protocol` with ``Learning = NeuralLearning``.

    Kept so that outside code does not break silently: subclassing warns (``DeprecationWarning``), and the
    old attribute names (``lr``, ``n_params``, ``rows``, ``batch``, ``secret_rng``, ``participation``,
    ``skipped``) forward to ``self.learning``.
    """

    Config = NeuralConfig
    Learning = NeuralLearning
    setup_dropouts = "none"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        warnings.warn(f"{cls.__qualname__}: NeuralProtocol is deprecated; subclass fednet.protocol.base.Protocol "
                      f"with Learning = NeuralLearning (fednet.protocol.neural)", DeprecationWarning, stacklevel=2)
        super().__init_subclass__(**kwargs)

    lr = property(lambda self: self.learning.lr, doc="``self.learning.lr``.")
    n_params = property(lambda self: self.learning.n_params, doc="``self.learning.n_params``.")
    skipped = property(lambda self: self.learning.skipped,
                       lambda self, v: setattr(self.learning, "skipped", v), doc="``self.learning.skipped``.")

    def rows(self, dev: Node, epoch: int) -> np.ndarray:
        """``self.learning.rows``."""
        return self.learning.rows(dev, epoch)

    def batch(self, dev: Node) -> tuple[np.ndarray, np.ndarray]:
        """``self.learning.batch``."""
        return self.learning.batch(dev)

    def secret_rng(self, dev: Node, purpose: str, *key: int) -> np.random.Generator:
        """``self.learning.secret_rng``."""
        return self.learning.secret_rng(dev, purpose, *key)

    def participation(self) -> np.ndarray | None:
        """``self.learning.participation``."""
        return self.learning.participation()

    def setup(self) -> Generator:
        """No set-up phase."""
        return
        yield  # pragma: no cover
