"""The learning set-up a protocol is configured with: the model, its data, its update and its evaluation.

A protocol describes *how* the parties talk (its rounds on the primitives, ``self.net``); *what* they train is a
:class:`Learning` component, one attribute of the protocol, ``self.learning``, chosen by the class-level
declaration ``Learning = ...`` (composition, not a parallel base class):

:class:`RidgeLearning` (the default)
    The seed papers' ridge regression on random features: the global model ``theta`` (d, c), the update of
    eqs. (4)-(5) (``step``) and the test accuracy of ``theta`` through the protocol's mode.
:class:`~fednet.protocol.neural.NeuralLearning`
    The MLP of the DReS-FL baselines (Shao et al. Sec. 6.1, App. B): ``params``, the step schedule, keyed
    minibatches, evaluation every ``eval_every`` rounds (config section
    :class:`~fednet.protocol.neural.NeuralConfig`).
:class:`~fednet.protocol.vertical.VerticalLearning`
    The split polynomial-network model of FedVS (Li, Yao, Liu, ICML 2023): vertical data, the Sec. 6.2 delay
    model, the public batch order, the split model's evaluation (config section
    :class:`~fednet.protocol.vertical.VerticalConfig`).

A learning set-up that needs parameters names its config section in ``Config``: the protocol's own ``Config``
must derive from it (a config is data; sharing fields by inheritance there is fine), which is checked when the
protocol class is defined. The protocol reaches the model state through three shorthands that forward to the
component: ``self.theta`` (ridge), ``self.params`` (named parameter arrays), ``self.model``
(:class:`~fednet.learning.model.Model` or the split model); everything else is ``self.learning.<name>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:   # pragma: no cover
    from .base import Protocol, ProtocolConfig

__all__ = ["Learning", "RidgeLearning", "check_learning"]


class Learning:
    """Base of the learning set-ups (module docstring); built by the protocol as ``self.learning``.

    Parameters
    ----------
    protocol : Protocol
        The protocol this set-up trains for: its task, config, simulation and current ``epoch`` are read from it.
        The component is built in :meth:`Protocol.__init__ <fednet.protocol.base.Protocol>` once the config has
        been parsed, before the protocol's ``validate`` (which may read it) and before anything runs.

    Attributes
    ----------
    Config : type or None
        The config section the protocol's ``Config`` must derive from (None: any :class:`ProtocolConfig`).

    Notes
    -----
    Hooks of a set-up: ``__init__`` (build the model and the data views), :meth:`start` (before a run),
    :meth:`evaluate` (each trace row) and :meth:`round_metrics` (extra trace columns). The protocol's own
    ``evaluate`` / ``round_metrics`` default to these.
    """

    Config: ClassVar[type[ProtocolConfig] | None] = None

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol

    def start(self, epochs: int) -> None:
        """Called by :meth:`Protocol.run <fednet.protocol.base.Protocol.run>` before the set-up phase.

        Parameters
        ----------
        epochs : int
            The most rounds the run will have.
        """

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss of the current model (the observer's work, not charged)."""
        raise NotImplementedError

    def round_metrics(self, round: int) -> dict[str, Any]:
        """Columns this set-up adds to the trace row of ``round`` (none by default)."""
        return {}


class RidgeLearning(Learning):
    """The seed papers' ridge regression on the task's random features (the default set-up).

    Attributes
    ----------
    theta : ndarray, (d, c)
        The global model, held by the server; zeros at the start.
    model : RidgeModel
        The task's model (:attr:`fednet.learning.task.LearningTask.model`).
    """

    def __init__(self, protocol: Protocol) -> None:
        super().__init__(protocol)
        task = protocol.task
        self.theta = np.zeros((task.d, task.c))
        self.model = getattr(task, "model", None)

    def step(self, gradient_sum: np.ndarray, m_used: int) -> None:
        """The update of eqs. (4)-(5): ``theta -= mu (G / m_used + lambda theta)``.

        Parameters
        ----------
        gradient_sum : ndarray, (d, c)
            ``G = sum_i G_i`` of eq. (3) over the devices used.
        m_used : int
            Number of training points behind ``G`` (``m`` when every device contributed).

        The task's optimizer (:class:`fednet.learning.model.SGD` with the task's schedule and weight decay) does
        the arithmetic, outside any MAC meter (the update is not charged, as in the papers' timing).
        """
        p = self.protocol
        self.theta = p.task.optimizer.step(self.theta, gradient_sum, m_used, p.epoch)

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss of ``theta`` through the protocol's mode (:meth:`Mode.evaluate`)."""
        return self.protocol.mode.evaluate(self.protocol)


def check_learning(cls: type) -> None:
    """Check a protocol class's ``Learning`` declaration against its ``Config`` (at class definition).

    Parameters
    ----------
    cls : type
        A :class:`~fednet.protocol.base.Protocol` subclass.

    Raises
    ------
    TypeError
        If ``Learning`` is not a :class:`Learning` subclass, or its config section is not a base of ``Config``;
        the message names the class, the attribute and what would fit.
    """
    learning = cls.__dict__.get("Learning", getattr(cls, "Learning", None))
    if not (isinstance(learning, type) and issubclass(learning, Learning)):
        raise TypeError(f"{cls.__qualname__}.Learning must be a subclass of fednet.protocol.learning.Learning "
                        f"(e.g. RidgeLearning, NeuralLearning, VerticalLearning), got {learning!r}")
    section = learning.Config
    if section is not None and not issubclass(cls.Config, section):
        raise TypeError(f"{cls.__qualname__}.Config = {cls.Config.__name__} must derive from {section.__name__}: "
                        f"Learning = {learning.__name__} reads its fields (class {cls.Config.__name__}"
                        f"({section.__name__}): ...)")
