"""The full-batch gradient-descent trajectory that exactly decoding protocols follow.

CodedPaddedFL and CodedSecAgg decode the exact full gradient every epoch (Schlegel et al.,
Prop. 3), so their model after epoch ``e`` is the model of plain full-batch gradient descent,
whatever the stragglers: ``G = sum_i G_i`` over all ``m`` rows, then eqs. (4)-(5). Their timing
modes replay this trajectory instead of executing the coded math. :class:`FullBatchTrajectory`
computes it once per task and caches the test ``(accuracy, loss)`` of every epoch.

For the ridge model the gradient is ``G = (X^T X) Theta - X^T Y`` with the Gram matrices summed
over the devices once (``sum_i X_i^T X_i``, ``sum_i X_i^T Y_i``), exactly the floats the cache of
``LearningTask.full_batch_trajectory`` has always produced; any other :class:`Model` sums its
:meth:`~fednet.learning.model.Model.gradient` over the devices. Nothing here is metered (the
replay charges the MACs the real kernels meter, elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.learning.model import Model, Optimizer, Params, RidgeModel

__all__ = ["FullBatchTrajectory"]


class FullBatchTrajectory:
    """Test ``(accuracy, loss)`` after each epoch of full-batch GD from the model's initial parameters.

    Parameters
    ----------
    model : Model
        The model (a :class:`RidgeModel` uses the Gram-matrix form of the gradient).
    optimizer : Optimizer
        The server update, called as ``optimizer.step(theta, G, m, epoch)``.
    X : sequence of ndarray, each (n_i, d)
        Training inputs of every device.
    Y : sequence of ndarray, each (n_i, c) or (n_i,)
        Training targets of every device.
    x_test : ndarray, (m_test, d)
    y_test : ndarray, (m_test,) int
    key : hashable, optional
        Description of the hyperparameters; :meth:`rows_for` recomputes when it changes.

    Attributes
    ----------
    rows : list of (float, float)
        Entry ``e``: test accuracy and loss after epoch ``e`` (entry 0: the initial parameters).
    """

    def __init__(self, model: Model, optimizer: Optimizer, X: Sequence[np.ndarray], Y: Sequence[np.ndarray],
                 x_test: np.ndarray, y_test: np.ndarray, key: object = None) -> None:
        if len(X) != len(Y) or not X:
            raise ValueError(f"X and Y must list the same positive number of devices, got {len(X)} and {len(Y)}")
        self.model = model
        self.optimizer = optimizer
        self.X, self.Y = list(X), list(Y)
        self.x_test, self.y_test = x_test, y_test
        self.key = key
        self.m = sum(x.shape[0] for x in self.X)
        if isinstance(model, RidgeModel):
            self._XtX = sum(x.T @ x for x in self.X)
            self._XtY = sum(x.T @ y for x, y in zip(self.X, self.Y))
        theta = model.init_params(0)
        self._theta: Params | np.ndarray = theta["theta"] if isinstance(model, RidgeModel) else theta
        self.rows: list[tuple[float, float]] = [model.evaluate(self._theta, x_test, y_test)]

    def _gradient_sum(self) -> Params | np.ndarray:
        if isinstance(self.model, RidgeModel):
            return self._XtX @ self._theta - self._XtY
        total: Params | None = None
        for x, y in zip(self.X, self.Y):
            g = self.model.gradient(self._theta, x, y)
            total = g if total is None else {k: total[k] + g[k] for k in total}
        return total

    def upto(self, epoch: int) -> list[tuple[float, float]]:
        """The cached rows, extended to cover epochs ``0..epoch``.

        Parameters
        ----------
        epoch : int
            Last epoch needed (>= 0).

        Returns
        -------
        list of (float, float)
            At least ``epoch + 1`` rows (the cache itself; do not modify).
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        while len(self.rows) <= epoch:
            e = len(self.rows)
            self._theta = self.optimizer.step(self._theta, self._gradient_sum(), self.m, e)
            self.rows.append(self.model.evaluate(self._theta, self.x_test, self.y_test))
        return self.rows

    @property
    def params(self) -> Params | np.ndarray:
        """Parameters after the last cached epoch."""
        return self._theta
