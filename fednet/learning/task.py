"""A learning task: the devices' local data, the test set, and the optimiser's hyperparameters.

The protocols of the CodedPaddedFL/CodedSecAgg paper (Schlegel et al.) train a linear model
``Theta`` of shape (d, c) by federated gradient descent on the ridge objective of eq. (2),
with the update of eqs. (4)-(5) and the step-size schedule of Sec. VII (mu = 6.0, multiplied
by 0.8 at epochs 200 and 350, lambda = 9e-6).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet.errors import DataError
from fednet.learning.model import SGD, RidgeModel, StepSchedule
from fednet.learning.trajectory import FullBatchTrajectory

__all__ = ["LearningTask", "check_finite_data"]


def _nonfinite(a: np.ndarray) -> int:
    """How many entries of ``a`` are not finite (0 quickly when the sum is finite)."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return 0
    with np.errstate(all="ignore"):
        if np.isfinite(a.sum()):
            return 0
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def check_finite_data(task: "LearningTask") -> None:
    """Refuse data no model can train on: non-finite features or targets, test labels outside the classes.

    Raises
    ------
    fednet.errors.DataError
        Naming the array (device ``i``'s ``X`` or ``Y``, ``x_test``, ``y_test``) and what is wrong with it.
    """
    for name, arrays in (("X", task.X), ("Y", task.Y)):
        for i, a in enumerate(arrays):
            bad = _nonfinite(a)
            if bad:
                raise DataError(f"device {i}'s {name} holds {bad} non-finite values (nan or inf); fednet trains on "
                                f"finite data only")
    bad = _nonfinite(task.x_test)
    if bad:
        raise DataError(f"x_test holds {bad} non-finite values (nan or inf); fednet evaluates on finite data only")
    y = np.asarray(task.y_test)
    c = task.Y[0].shape[1]
    if y.size and (y.dtype.kind not in "iu" or int(y.min()) < 0 or int(y.max()) >= c):
        shown = y.dtype if y.dtype.kind not in "iu" else f"values in [{int(y.min())}, {int(y.max())}]"
        raise DataError(f"y_test must hold class indices in [0, {c}) for the {c} classes of Y; got {shown}")


@dataclass
class LearningTask:
    """Local data of every device, the test set and the hyperparameters of eqs. (2)-(5).

    Attributes
    ----------
    X : list of ndarray, each (n_i, d) float64
        Features of device i (rows are data points; Sec. III).
    Y : list of ndarray, each (n_i, c) float64
        One-hot labels of device i.
    x_test : ndarray, (m_test, d) float64
    y_test : ndarray, (m_test,) int64
        Test labels (class indices).
    learning_rate : float
        Initial step size mu of eq. (5).
    lr_milestones : sequence of int
        Epochs at which mu is multiplied by ``lr_decay`` (Sec. VII: 200 and 350).
    lr_decay : float
    weight_decay : float
        The regularisation parameter lambda of eq. (2).
    """

    X: list[np.ndarray]
    Y: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray
    learning_rate: float = 6.0
    lr_milestones: Sequence[int] = (200, 350)
    lr_decay: float = 0.8
    weight_decay: float = 9e-6
    _trajectory: FullBatchTrajectory | None = field(init=False, repr=False, default=None)
    _memo: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.X) != len(self.Y) or not self.X:
            raise ValueError(f"X and Y must list the same positive number of devices, got {len(self.X)} and {len(self.Y)}")
        for i, (x, y) in enumerate(zip(self.X, self.Y)):
            if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
                raise ValueError(f"device {i}: X {x.shape} and Y {y.shape} must be (n_i, d) and (n_i, c)")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        check_finite_data(self)

    @property
    def n_devices(self) -> int:
        """Number of devices D."""
        return len(self.X)

    @property
    def d(self) -> int:
        """Number of features."""
        return self.X[0].shape[1]

    @property
    def c(self) -> int:
        """Number of outputs (classes)."""
        return self.Y[0].shape[1]

    @property
    def n_points(self) -> list[int]:
        """n_i for every device."""
        return [x.shape[0] for x in self.X]

    @property
    def m(self) -> int:
        """Total number of training points."""
        return sum(self.n_points)

    def step_size(self, epoch: int) -> float:
        """mu at ``epoch`` (1-based): the initial rate times ``lr_decay`` per milestone reached."""
        return self.schedule(epoch)

    @property
    def model(self) -> RidgeModel:
        """The ridge model of eq. (2) on this task's features: ``RidgeModel(d, c, weight_decay)``."""
        return RidgeModel(self.d, self.c, self.weight_decay)

    @property
    def schedule(self) -> StepSchedule:
        """The step-size schedule of Sec. VII: ``StepSchedule(learning_rate, lr_milestones, lr_decay)``."""
        return StepSchedule(self.learning_rate, self.lr_milestones, self.lr_decay)

    @property
    def optimizer(self) -> SGD:
        """The update of eqs. (4)-(5): ``SGD(schedule, weight_decay)``.

        ``task.optimizer.step(theta, G, m_used, epoch)`` returns the same floats as
        ``theta - task.step_size(epoch) * (G / m_used + task.weight_decay * theta)``.
        """
        return SGD(self.schedule, self.weight_decay)

    def evaluate(self, theta: np.ndarray) -> tuple[float, float]:
        """Test accuracy and the objective of eq. (2) on the test set (``self.model.evaluate``).

        Parameters
        ----------
        theta : ndarray, (d, c)

        Returns
        -------
        accuracy : float
            Fraction of test points whose argmax prediction equals the label.
        loss : float
            ``1/(2 m_test) ||X_test Theta - Y_test||_F^2 + lambda/2 ||Theta||_F^2``.
        """
        return self.model.evaluate(theta, self.x_test, self.y_test)

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, computed once per task and ``key`` and kept (quantities derived from the data only).

        The task's data are treated as immutable: every run of a study shares one task, so what a
        protocol derives from the data alone (bounds for a capacity check, say) is computed once for
        all its runs; so is a learning trajectory several runs share (its key holds the seed:
        :class:`fednet.protocol.modes.SharedTrajectory`). Keys should name the function and every
        parameter it depends on.

        Parameters
        ----------
        key : hashable
        compute : callable() -> Any

        Returns
        -------
        Any
            The kept value (shared: do not modify).
        """
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def full_batch_trajectory(self, upto: int) -> list[tuple[float, float]]:
        """Test (accuracy, loss) after epochs ``0..upto`` of plain full-batch GD, cached on the task.

        Eqs. (3)-(5) with ``G = X^T X Theta - X^T Y`` over all ``m`` points, in float64, from
        ``Theta = 0``. Exactly decoding schemes (CodedPaddedFL, CodedSecAgg: Prop. 3 of Schlegel et
        al.) follow this trajectory whatever the stragglers, so their timing-only modes replay it.
        Delegates to :class:`fednet.learning.trajectory.FullBatchTrajectory` (cached while the
        hyperparameters are unchanged).

        Returns
        -------
        list of (float, float)
            Entry ``e`` is the test accuracy and loss after epoch ``e`` (entry 0: ``Theta = 0``).
        """
        key = (self.learning_rate, tuple(self.lr_milestones), self.lr_decay, self.weight_decay)
        tr = self._trajectory
        if tr is None or tr.key != key:
            tr = self._trajectory = FullBatchTrajectory(self.model, self.optimizer, self.X, self.Y,
                                                        self.x_test, self.y_test, key=key)
        return tr.upto(upto)
