"""The model interface: parameters as named arrays, metered forward / loss / gradient, an optimiser.

Every learning model of fednet (the ridge model of Schlegel et al. on random-Fourier features, the
torch networks of :mod:`fednet.learning.torch_models`, the prime-field polynomial networks of
:mod:`fednet.learning.field_models`) implements :class:`Model`. A model is *stateless*: it
describes the architecture, and the parameters travel separately as :data:`Params`, a ``dict``
mapping a parameter's name to an array. The server holds the global parameters, a device computes
its gradient at the copy it downloaded, secure aggregation masks the flattened vector
(:func:`flatten` / :func:`unflatten`), and an :class:`Optimizer` turns the aggregated gradient
into the next parameters.

Conventions shared by every model (a field model follows them over ``GF(p)``):

``forward(params, x)``
    The model's output on a batch, shape ``(b, n_outputs)``; **metered**: charges the MACs the
    kernels execute at the shapes actually run (:mod:`fednet.algebra.meter`).
``loss(params, x, y)``
    The objective on the batch, ``(1/b) sum_j l(f(x_j), y_j) + R(params)``, a float; metered.
``gradient(params, x, y)``
    The gradient of the *summed* data term ``sum_j l(f(x_j), y_j)`` over the ``b`` rows, without
    the regulariser ``R``, as :data:`Params` of the parameters' shapes; metered. This is the
    device gradient ``G_i = X_i^T (X_i Theta - Y_i)`` of eq. (3) of Schlegel et al.: gradients
    of disjoint batches add up, and the optimiser divides the sum by the number of rows behind
    it and adds the regulariser's gradient (weight decay), eqs. (4)-(5).
``backward(params, x, grad_output, *, input_grad=True)``
    Vector-Jacobian product for a bottom model of a split model (FedVS, Sec. 3: the clients'
    bottom models receive ``dL/dH`` from the server): the gradients of ``sum(forward(params, x) *
    grad_output)`` w.r.t. the parameters (and the input); metered, the backward pass only.
    Optional.
``gradient_with_input(params, x, y)``
    :meth:`Model.gradient` and ``dL/dx`` together (a top model returns ``dL/dH``); metered.
    Optional.
``predict(params, x)`` and ``evaluate(params, x, labels)``
    Predicted classes and ``(accuracy, loss)`` on a test set; *not* metered (the observer's
    work, never charged to a device).

``y`` is either ``(b,)`` integer class labels or ``(b, n_outputs)`` float targets (one-hot rows);
a model converts to what its loss needs.

Implementing a model
--------------------
Subclass :class:`Model`; set ``n_inputs`` and ``n_outputs``; implement ``param_shapes`` (name ->
shape, in a fixed order), ``init_params(seed)`` (a deterministic function of the seed),
``forward``, ``loss``, ``gradient``, ``predict`` and ``evaluate``; ``backward`` and
``gradient_with_input`` only if the model is a part of a split model. Charge MACs only through
the metered kernels (:func:`fednet.algebra.meter.matmul`, ``charge`` from an exact kernel such as
:mod:`fednet.algebra.modp`, or the torch counter of :mod:`fednet.learning.torch_models`), never by
a hand formula beside the computation. Accept a bare array for a one-parameter model through
:meth:`Model.as_params`. A model over a prime field (DReS-FL, Sec. 3.1; FedVS, Sec. 3) keeps the
same signatures: its parameters are integer arrays (field elements), ``forward`` and
``gradient`` are exact over ``GF(p)`` (the gradient summed over the rows, so that coded partial
gradients add up before decoding), and ``loss``/``evaluate`` decode to real numbers with the
fixed-point scale; its server update (decode, psi, clip, stochastic rounding) is an
:class:`Optimizer` with the same ``step(params, gradient_sum, m_used, epoch)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np

from fednet.algebra.meter import charge, matmul, unmetered  # noqa: F401 (unmetered re-exported: its old home)
from fednet.algebra.slices import rows_matmul
from fednet.learning.models import ridge_gradient

__all__ = [
    "Params",
    "ParamsOrArray",
    "Model",
    "Schedule",
    "ConstantSchedule",
    "StepSchedule",
    "ExponentialSchedule",
    "Optimizer",
    "SGD",
    "RidgeModel",
    "flatten",
    "unflatten",
    "as_targets",
    "unmetered",
    "check_model",
]

#: Parameters of a model: name -> array (float64/float32 for real models, integers in
#: ``{0..p-1}`` or the signed set for field models). Insertion order is the canonical order of
#: :func:`flatten`.
Params = dict[str, np.ndarray]

#: What the model methods accept: :data:`Params`, or a bare array for a one-parameter model.
ParamsOrArray = Union[Params, np.ndarray]


def as_targets(y: np.ndarray, n_outputs: int, name: str = "y") -> np.ndarray:
    """Float targets ``(b, n_outputs)``: one-hot rows for ``(b,)`` labels, else ``y`` checked.

    Parameters
    ----------
    y : ndarray, shape (b,) int or (b, n_outputs) float
        Class labels in ``{0..n_outputs-1}`` or targets.
    n_outputs : int
        Number of outputs ``c``.
    name : str
        Argument name used in error messages.

    Returns
    -------
    ndarray, shape (b, n_outputs), float64
        ``np.eye(n_outputs)[y]`` for labels; ``y`` itself (no copy) for 2-D targets.

    Raises
    ------
    ValueError
        If ``y`` has another shape, or a label is out of range.
    """
    y = np.asarray(y)
    if y.ndim == 1:
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_outputs):
            raise ValueError(f"{name} labels must be integers in [0, {n_outputs - 1}], got dtype {y.dtype}")
        return np.eye(n_outputs)[y.astype(np.int64)]
    if y.ndim == 2 and y.shape[1] == n_outputs:
        return y
    raise ValueError(f"{name} must be (b,) labels or (b, {n_outputs}) targets, got shape {y.shape}")


def _as_labels(y: np.ndarray, name: str = "labels") -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2:
        return np.argmax(y, axis=1).astype(np.int64)
    if y.ndim != 1:
        raise ValueError(f"{name} must be (b,) labels or (b, c) one-hot rows, got shape {y.shape}")
    return y


class Model(ABC):
    """A stateless learning model: architecture here, parameters passed as :data:`Params`.

    Subclasses implement :meth:`param_shapes`, :meth:`init_params`, :meth:`forward`,
    :meth:`loss`, :meth:`gradient`, :meth:`predict` and :meth:`evaluate` (module docstring for
    the conventions), and :meth:`backward` (a bottom model) or :meth:`gradient_with_input` (a
    top model) if they serve as a part of a split model
    (:class:`fednet.learning.split_model.SplitModel`).

    Attributes
    ----------
    n_inputs : int
        Number of input features ``d`` (columns of ``x``).
    n_outputs : int
        Number of outputs ``c`` (classes).
    """

    n_inputs: int
    n_outputs: int

    # -- description ------------------------------------------------------------------------
    @abstractmethod
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every parameter, in the canonical order of :func:`flatten`."""

    @abstractmethod
    def init_params(self, seed: int | np.random.Generator | None = None) -> Params:
        """Initial parameters, a deterministic function of ``seed``.

        Parameters
        ----------
        seed : int or Generator or None
            Seed of the initialisation (ignored by models that start at zero).

        Returns
        -------
        Params
            Fresh arrays of the shapes of :meth:`param_shapes`.
        """

    @property
    def n_params(self) -> int:
        """Total number of scalar parameters (the length of :func:`flatten`)."""
        return int(sum(int(np.prod(s)) for s in self.param_shapes().values()))

    def zeros(self) -> Params:
        """All-zero parameters of the right shapes (float64)."""
        return {k: np.zeros(s) for k, s in self.param_shapes().items()}

    def as_params(self, p: ParamsOrArray) -> Params:
        """``p`` as :data:`Params`: a bare array is accepted for a single-parameter model.

        Raises
        ------
        ValueError
            If ``p`` is a bare array and the model has several parameters, or a name is missing.
        """
        shapes = self.param_shapes()
        if isinstance(p, np.ndarray):
            if len(shapes) != 1:
                raise ValueError(f"params must be a dict naming {list(shapes)}, got a bare array {p.shape}")
            return {next(iter(shapes)): p}
        missing = [k for k in shapes if k not in p]
        if missing:
            raise ValueError(f"params lacks {missing}; expected names {list(shapes)}")
        return dict(p)

    # -- metered computation ----------------------------------------------------------------
    @abstractmethod
    def forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Model output ``f(x)``, shape ``(b, n_outputs)``; charges the MACs executed."""

    @abstractmethod
    def loss(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> float:
        """``(1/b) sum_j l(f(x_j), y_j) + R(params)`` on the batch; charges the MACs executed."""

    @abstractmethod
    def gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """Gradient of ``sum_j l(f(x_j), y_j)`` (summed data term, no regulariser); metered."""

    def backward(self, params: ParamsOrArray, x: np.ndarray, grad_output: np.ndarray, *,
                 input_grad: bool = True) -> tuple[Params, np.ndarray | None]:
        """Vector-Jacobian product of :meth:`forward` (split models); metered.

        Charges the backward pass only: the device ran (and was charged for) the forward pass
        on ``x`` before ``grad_output`` arrived and kept what it needs.

        Parameters
        ----------
        params : Params
        x : ndarray, shape (b, n_inputs)
        grad_output : ndarray, shape (b, n_outputs)
            ``dL/df(x)`` for some scalar ``L``.
        input_grad : bool
            Whether to compute (and charge) ``dL/dx`` too; a bottom model does not need it.

        Returns
        -------
        grads : Params
            ``dL/dparams``.
        grad_input : ndarray, shape (b, n_inputs), or None
            ``dL/dx`` (None without ``input_grad``).

        Raises
        ------
        NotImplementedError
            If the model does not support it.
        """
        raise NotImplementedError(f"{type(self).__name__} has no backward()")

    def gradient_with_input(self, params: ParamsOrArray, x: np.ndarray,
                            y: np.ndarray) -> tuple[Params, np.ndarray]:
        """Gradients of ``sum_j l(f(x_j), y_j)`` w.r.t. the parameters and the input; metered.

        The top model of a split model (FedVS, Sec. 3) needs both: it updates its parameters and
        returns ``dL/dH`` to the bottom models.

        Returns
        -------
        grads : Params
            As :meth:`gradient`.
        grad_input : ndarray, shape (b, n_inputs)

        Raises
        ------
        NotImplementedError
            If the model does not support it.
        """
        raise NotImplementedError(f"{type(self).__name__} has no gradient_with_input()")

    # -- observer ---------------------------------------------------------------------------
    @abstractmethod
    def predict(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """Predicted classes, shape ``(b,)`` int64 (not metered)."""

    @abstractmethod
    def evaluate(self, params: ParamsOrArray, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """``(accuracy, loss)`` on a test set (not metered): the trace's two learning columns."""


# -- flattening -------------------------------------------------------------------------------
def flatten(params: Mapping[str, np.ndarray], names: Sequence[str] | None = None) -> np.ndarray:
    """Concatenate the parameters into one vector (what secure aggregation masks).

    Parameters
    ----------
    params : Params
    names : sequence of str, optional
        Order of the parameters (default: the mapping's order, i.e. ``param_shapes()``).

    Returns
    -------
    ndarray, shape (n_params,)
        ``params[names[0]].ravel()``, ``params[names[1]].ravel()``, ... (a copy; the common dtype).
    """
    names = list(params) if names is None else list(names)
    if not names:
        return np.zeros(0)
    return np.concatenate([np.asarray(params[k]).ravel() for k in names])


def unflatten(vector: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> Params:
    """Inverse of :func:`flatten`: cut ``vector`` into arrays of ``shapes`` (in their order).

    Parameters
    ----------
    vector : ndarray, shape (n_params,)
    shapes : mapping name -> shape
        Usually ``model.param_shapes()``.

    Returns
    -------
    Params
        Views into ``vector`` (copy them before writing).

    Raises
    ------
    ValueError
        If ``vector``'s length differs from the total size of ``shapes``.
    """
    vector = np.asarray(vector)
    sizes = [int(np.prod(s)) for s in shapes.values()]
    if vector.ndim != 1 or vector.size != sum(sizes):
        raise ValueError(f"vector has shape {vector.shape}, expected ({sum(sizes)},) for shapes {dict(shapes)}")
    out: Params = {}
    start = 0
    for (k, s), n in zip(shapes.items(), sizes):
        out[k] = vector[start:start + n].reshape(s)
        start += n
    return out


# -- learning-rate schedules ------------------------------------------------------------------
class Schedule(ABC):
    """A learning-rate schedule: ``schedule(epoch)`` is the step size ``mu`` at a 1-based epoch."""

    @abstractmethod
    def __call__(self, epoch: int) -> float:
        """Step size at ``epoch`` (1-based round number)."""


class ConstantSchedule(Schedule):
    """``mu(epoch) = learning_rate``.

    Parameters
    ----------
    learning_rate : float
        Positive step size.

    Raises
    ------
    ValueError
        If ``learning_rate`` is not positive.
    """

    def __init__(self, learning_rate: float) -> None:
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
        self.learning_rate = float(learning_rate)

    def __call__(self, epoch: int) -> float:
        return self.learning_rate

    def __repr__(self) -> str:
        return f"ConstantSchedule({self.learning_rate!r})"


class StepSchedule(Schedule):
    """Piecewise-constant decay: ``mu = learning_rate * decay ** k``.

    ``k`` counts the milestones reached (``epoch >= milestone``) plus, with ``every``, the number
    of whole periods ``epoch // every``. Schlegel et al., Sec. VII: ``mu = 6.0``, ``decay = 0.8``
    at epochs 200 and 350 (:class:`fednet.learning.task.LearningTask`'s defaults). DReS-FL,
    App. B: ``0.1``, ``decay = 0.65``, ``every = 1500``.

    Parameters
    ----------
    learning_rate : float
        Initial step size (> 0).
    milestones : sequence of int
        Epochs at which ``mu`` is multiplied by ``decay``.
    decay : float
        Multiplicative factor (> 0).
    every : int, optional
        Also multiply by ``decay`` every ``every`` epochs.

    Raises
    ------
    ValueError
        If ``learning_rate`` or ``decay`` is not positive or ``every`` is not a positive integer.
    """

    def __init__(self, learning_rate: float, milestones: Sequence[int] = (), decay: float = 1.0,
                 every: int | None = None) -> None:
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
        if not decay > 0:
            raise ValueError(f"decay must be positive, got {decay!r}")
        if every is not None and (int(every) != every or every < 1):
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.learning_rate = learning_rate
        self.milestones = tuple(milestones)
        self.decay = decay
        self.every = None if every is None else int(every)

    def __call__(self, epoch: int) -> float:
        # the exact expression of LearningTask.step_size (bit-identical floats)
        k = sum(1 for e in self.milestones if epoch >= e)
        if self.every is not None:
            k += epoch // self.every
        return self.learning_rate * self.decay ** k

    def __repr__(self) -> str:
        return (f"StepSchedule({self.learning_rate!r}, milestones={self.milestones!r}, decay={self.decay!r}, "
                f"every={self.every!r})")


class ExponentialSchedule(Schedule):
    """``mu(epoch) = learning_rate * decay ** (epoch - 1)`` (Makkonen et al., Sec. IV-A: 0.1, 0.97).

    Parameters
    ----------
    learning_rate : float
        Step size of epoch 1 (> 0).
    decay : float
        Per-epoch factor in (0, 1].

    Raises
    ------
    ValueError
        If ``learning_rate`` is not positive or ``decay`` not in (0, 1].
    """

    def __init__(self, learning_rate: float, decay: float) -> None:
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
        self.learning_rate = learning_rate
        self.decay = decay

    def __call__(self, epoch: int) -> float:
        return self.learning_rate * self.decay ** (epoch - 1)

    def __repr__(self) -> str:
        return f"ExponentialSchedule({self.learning_rate!r}, {self.decay!r})"


# -- optimisers -------------------------------------------------------------------------------
class Optimizer(ABC):
    """Server update: new parameters from the aggregated gradient of a round.

    ``step(params, gradient_sum, m_used, epoch)`` takes the sum of the device gradients
    (:meth:`Model.gradient`) over ``m_used`` training rows and returns the next parameters. A
    field model's optimiser (DReS-FL eq. 7: decode, psi, clip, stochastic rounding Q) implements
    the same signature.
    """

    @abstractmethod
    def step(self, params: ParamsOrArray, gradient_sum: ParamsOrArray, m_used: int,
             epoch: int) -> ParamsOrArray:
        """Next parameters (same type as ``params``: a bare array or :data:`Params`)."""


class SGD(Optimizer):
    """Gradient descent with weight decay: ``theta <- theta - mu(epoch) (G / m_used + lambda theta)``.

    Schlegel et al., eqs. (4)-(5): ``grad f = G / m + lambda Theta`` (the gradient of eq. (2)),
    ``Theta <- Theta - mu grad f``. Bit-identical to ``Protocol.step`` of
    :mod:`fednet.protocol.base`: the same floating-point expression, evaluated in the same order,
    on every array.

    Parameters
    ----------
    schedule : Schedule or float
        Step size ``mu`` per epoch (a float means a constant step).
    weight_decay : float
        ``lambda >= 0`` (the regulariser ``lambda/2 ||theta||^2`` of eq. (2)).

    Raises
    ------
    ValueError
        If ``weight_decay`` is negative.
    """

    def __init__(self, schedule: Schedule | float, weight_decay: float = 0.0) -> None:
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
        self.schedule = schedule if isinstance(schedule, Schedule) else ConstantSchedule(schedule)
        self.weight_decay = weight_decay

    def step(self, params: ParamsOrArray, gradient_sum: ParamsOrArray, m_used: int,
             epoch: int) -> ParamsOrArray:
        """``theta - mu(epoch) * (gradient_sum / m_used + weight_decay * theta)`` per array.

        Parameters
        ----------
        params : ndarray or Params
            Current parameters ``theta``.
        gradient_sum : ndarray or Params
            ``G``, the sum of the device gradients (same names and shapes as ``params``).
        m_used : int
            Number of training rows behind ``G`` (> 0).
        epoch : int
            1-based round number (selects ``mu``).

        Returns
        -------
        ndarray or Params
            New arrays (the inputs are not modified). Charges ``2`` MACs per parameter (the two
            scaled additions) to the open meters.

        Raises
        ------
        ValueError
            If ``m_used`` is not positive, or names or shapes of the two arguments differ.
        """
        if not m_used > 0:
            raise ValueError(f"m_used must be positive, got {m_used!r}")
        mu = self.schedule(epoch)
        if isinstance(params, np.ndarray):
            return self._update(params, np.asarray(gradient_sum), m_used, mu)
        if not isinstance(gradient_sum, Mapping) or set(gradient_sum) != set(params):
            raise ValueError(f"gradient_sum must name the parameters {list(params)}")
        return {k: self._update(v, np.asarray(gradient_sum[k]), m_used, mu) for k, v in params.items()}

    def _update(self, theta: np.ndarray, g: np.ndarray, m_used: int, mu: float) -> np.ndarray:
        if theta.shape != g.shape:
            raise ValueError(f"gradient_sum has shape {g.shape}, params {theta.shape}")
        charge(2 * theta.size)
        # the exact expression of Protocol.step (bit-identical floats)
        return theta - mu * (g / m_used + self.weight_decay * theta)

    def __repr__(self) -> str:
        return f"SGD({self.schedule!r}, weight_decay={self.weight_decay!r})"


# -- the ridge model ---------------------------------------------------------------------------
class RidgeModel(Model):
    """Linear ridge regression on features (Schlegel et al., Sec. III-A, eq. 2).

    One parameter ``"theta"`` of shape ``(d, c)``; output ``x Theta``; per-row loss
    ``l = 1/2 ||x_j Theta - y_j||^2`` on one-hot targets; regulariser ``lambda/2 ||Theta||_F^2``.
    The features are the random-Fourier features of :mod:`fednet.learning.features` (or raw
    pixels). Reproduces, bit for bit, the gradient :func:`fednet.learning.models.ridge_gradient`
    and the evaluation ``LearningTask.evaluate`` that the protocols have used.

    Parameters
    ----------
    n_inputs : int
        Number of features ``d``.
    n_outputs : int
        Number of classes ``c``.
    weight_decay : float
        ``lambda >= 0`` (used by :meth:`loss` and :meth:`evaluate`; the optimiser applies its own
        ``weight_decay``, normally the same).

    Raises
    ------
    ValueError
        If a size is not a positive integer or ``weight_decay`` is negative.
    """

    def __init__(self, n_inputs: int, n_outputs: int, weight_decay: float = 0.0) -> None:
        for name, v in (("n_inputs", n_inputs), ("n_outputs", n_outputs)):
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
        self.n_inputs = int(n_inputs)
        self.n_outputs = int(n_outputs)
        self.weight_decay = weight_decay

    def __repr__(self) -> str:
        return f"RidgeModel({self.n_inputs}, {self.n_outputs}, weight_decay={self.weight_decay!r})"

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{"theta": (d, c)}``."""
        return {"theta": (self.n_inputs, self.n_outputs)}

    def init_params(self, seed: int | np.random.Generator | None = None) -> Params:
        """``Theta = 0`` (Schlegel et al., Sec. VII); ``seed`` is ignored."""
        return self.zeros()

    def _theta(self, params: ParamsOrArray) -> np.ndarray:
        theta = np.asarray(self.as_params(params)["theta"])
        if theta.shape != (self.n_inputs, self.n_outputs):
            raise ValueError(f"theta has shape {theta.shape}, expected ({self.n_inputs}, {self.n_outputs})")
        return theta

    def _x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_inputs:
            raise ValueError(f"x must have shape (b, {self.n_inputs}), got {x.shape}")
        return x

    def forward(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """``x Theta``, shape (b, c); charges ``b d c`` MACs."""
        return matmul(self._x(x), self._theta(params))

    def loss(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> float:
        """``1/(2b) ||x Theta - Y||_F^2 + lambda/2 ||Theta||_F^2`` (eq. 2 on the batch).

        Charges ``b d c`` (forward) ``+ b c`` (squared residual) ``+ d c`` (squared norm) MACs.
        """
        theta = self._theta(params)
        x = self._x(x)
        r = matmul(x, theta) - as_targets(y, self.n_outputs)
        charge(r.size + theta.size)
        return float(0.5 * np.sum(r * r) / x.shape[0] + 0.5 * self.weight_decay * np.sum(theta * theta))

    def gradient(self, params: ParamsOrArray, x: np.ndarray, y: np.ndarray) -> Params:
        """``{"theta": X^T (X Theta - Y)}`` (eq. 3); charges ``2 b d c`` MACs.

        The same kernel calls as :func:`fednet.learning.models.ridge_gradient` (same floats).
        """
        return {"theta": ridge_gradient(self._x(x), as_targets(y, self.n_outputs), self._theta(params))}

    def backward(self, params: ParamsOrArray, x: np.ndarray, grad_output: np.ndarray, *,
                 input_grad: bool = True) -> tuple[Params, np.ndarray | None]:
        """``({"theta": x^T g}, g Theta^T)``; charges ``b d c`` MACs per product computed."""
        theta, x = self._theta(params), self._x(x)
        g = np.asarray(grad_output)
        if g.shape != (x.shape[0], self.n_outputs):
            raise ValueError(f"grad_output has shape {g.shape}, expected ({x.shape[0]}, {self.n_outputs})")
        return {"theta": matmul(x.T, g)}, (matmul(g, theta.T) if input_grad else None)

    def gradient_with_input(self, params: ParamsOrArray, x: np.ndarray,
                            y: np.ndarray) -> tuple[Params, np.ndarray]:
        """``({"theta": X^T R}, R Theta^T)`` with ``R = X Theta - Y``; charges ``3 b d c`` MACs."""
        theta, x = self._theta(params), self._x(x)
        r = matmul(x, theta) - as_targets(y, self.n_outputs)
        return {"theta": matmul(x.T, r)}, matmul(r, theta.T)

    def predict(self, params: ParamsOrArray, x: np.ndarray) -> np.ndarray:
        """``argmax_c (x Theta)_c``, shape (b,) int64 (not metered)."""
        return np.argmax(self._x(x) @ self._theta(params), axis=1).astype(np.int64)

    def evaluate(self, params: ParamsOrArray, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """Test accuracy and the objective of eq. (2) on a test set (not metered).

        Parameters
        ----------
        params : ndarray (d, c) or Params
        x : ndarray, (m_test, d)
        labels : ndarray, (m_test,) int
            Class indices (or one-hot rows).

        Returns
        -------
        accuracy : float
            Fraction of rows whose argmax prediction equals the label.
        loss : float
            ``1/(2 m_test) ||X Theta - Y||_F^2 + lambda/2 ||Theta||_F^2``; the same expression,
            and floats, as ``LearningTask.evaluate`` had.
        """
        theta, x = self._theta(params), self._x(x)
        labels = _as_labels(labels)
        if labels.shape != (x.shape[0],):
            raise ValueError(f"labels has shape {labels.shape}, expected ({x.shape[0]},)")
        pred = rows_matmul(x, theta)                    # x @ theta, its rows over the lent threads
        acc = float(np.mean(np.argmax(pred, axis=1) == labels))
        r = pred - np.eye(self.n_outputs)[labels.astype(np.int64)]
        loss = float(0.5 * np.sum(r * r) / len(labels) + 0.5 * self.weight_decay * np.sum(theta * theta))
        return acc, loss


# -- conformance --------------------------------------------------------------------------------
def check_model(model: Model, x: np.ndarray, y: np.ndarray, *, seed: int = 0, additive: bool = True,
                rtol: float = 1e-5) -> Params:
    """Check that ``model`` keeps the :class:`Model` conventions on a batch; raise on the first breach.

    Checked: ``init_params`` names and shapes match ``param_shapes`` and repeat under a seed;
    ``forward`` returns ``(b, n_outputs)`` and charges MACs; ``loss`` is a finite float;
    ``gradient`` returns the parameters' names and shapes and charges MACs; ``predict`` returns
    ``(b,)`` int64 classes; ``evaluate`` returns ``(accuracy in [0, 1], float)`` and charges
    nothing; with ``additive``, the gradient of the whole batch equals the sum of the gradients
    of its two halves (the summed-data-term convention), to ``rtol`` (real models; a field model
    checks additivity mod p itself and passes ``additive=False``).

    Parameters
    ----------
    model : Model
    x : ndarray, (b, n_inputs), b >= 2
    y : ndarray, (b,) labels or (b, n_outputs) targets
    seed : int
        Seed of ``init_params``.
    additive : bool
        Check additivity of ``gradient`` over a split batch (float comparison).
    rtol : float
        Relative tolerance of the additivity check (scaled by the largest gradient entry).

    Returns
    -------
    Params
        The initial parameters used.

    Raises
    ------
    AssertionError
        Naming the convention broken.
    """
    from fednet.algebra.meter import MacMeter

    shapes = model.param_shapes()
    p = model.init_params(seed)
    assert list(p) == list(shapes), f"init_params names {list(p)} != param_shapes {list(shapes)}"
    for k, s in shapes.items():
        assert np.shape(p[k]) == tuple(s), f"init_params[{k!r}] has shape {np.shape(p[k])}, expected {s}"
    q = model.init_params(seed)
    assert all(np.array_equal(p[k], q[k]) for k in p), "init_params is not a function of the seed"
    b = np.shape(x)[0]
    assert b >= 2, f"check_model needs at least 2 rows, got {b}"
    with MacMeter() as m:
        out = model.forward(p, x)
    assert np.shape(out) == (b, model.n_outputs), f"forward returned {np.shape(out)}, expected {(b, model.n_outputs)}"
    assert m.macs > 0, "forward charged no MACs"
    val = model.loss(p, x, y)
    assert isinstance(val, float) and np.isfinite(val), f"loss returned {val!r}, expected a finite float"
    with MacMeter() as m:
        g = model.gradient(p, x, y)
    assert m.macs > 0, "gradient charged no MACs"
    assert list(g) == list(shapes), f"gradient names {list(g)} != param_shapes {list(shapes)}"
    for k, s in shapes.items():
        assert np.shape(g[k]) == tuple(s), f"gradient[{k!r}] has shape {np.shape(g[k])}, expected {s}"
    with MacMeter() as m:
        pred = model.predict(p, x)
        acc, loss = model.evaluate(p, x, y)
    assert m.macs == 0, f"predict/evaluate charged {m.macs} MACs (the observer's work is free)"
    pred = np.asarray(pred)
    assert pred.shape == (b,) and pred.dtype == np.int64, f"predict returned {pred.shape} {pred.dtype}"
    assert pred.min() >= 0 and pred.max() < model.n_outputs, "predict returned a class out of range"
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0 and isinstance(loss, float), \
        f"evaluate returned ({acc!r}, {loss!r})"
    if additive:
        h = b // 2
        g1, g2 = model.gradient(p, x[:h], y[:h]), model.gradient(p, x[h:], y[h:])
        for k in shapes:
            ref = np.asarray(g[k], dtype=np.float64)
            err = np.max(np.abs(ref - (np.asarray(g1[k], np.float64) + np.asarray(g2[k], np.float64))))
            scale = max(1.0, float(np.max(np.abs(ref))))
            assert err <= rtol * scale, f"gradient[{k!r}] is not additive over rows (error {err:.3g})"
    return p
