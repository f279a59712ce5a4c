"""Models: linear ridge regression (Schlegel et al., Sec. III-A) and multinomial logistic
regression (Makkonen et al., Sec. IV-A), with metered gradients.

The local computations a protocol charges time for go through the metered kernels of
:mod:`fednet.algebra.meter`: the ridge gradient ``X^T (X Theta - Y)`` of a b-row minibatch with
``d`` features and ``c`` classes executes two products of ``b * d * c`` MACs each, so it is
charged ``2 b d c`` MACs. Additions, subtractions and the softmax's exponentials are not MACs
and are not charged.
"""

from __future__ import annotations

import numpy as np

from fednet.algebra.meter import axpy, bmatmul, charge, matmul

__all__ = [
    "one_hot",
    "ridge_gradient",
    "ridge_gradients",
    "minibatch_gradient",
    "ridge_loss",
    "ridge_step",
    "predict",
    "accuracy",
    "softmax",
    "logistic_gradient",
    "logistic_example_gradients",
    "logistic_loss",
]


def _as_2d(name: str, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {a.shape}")
    return a


def _check_shapes(x: np.ndarray, y: np.ndarray | None, theta: np.ndarray) -> None:
    if theta.shape[0] != x.shape[1]:
        raise ValueError(
            f"theta has {theta.shape[0]} rows but x has {x.shape[1]} columns (features)"
        )
    if y is not None and (y.shape[0] != x.shape[0] or y.shape[1] != theta.shape[1]):
        raise ValueError(
            f"y has shape {y.shape}; expected ({x.shape[0]}, {theta.shape[1]}) for x {x.shape} "
            f"and theta {theta.shape}"
        )


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """One-hot encode labels.

    Parameters
    ----------
    labels : ndarray, shape (m,), int
        Labels in ``{0, ..., n_classes - 1}``.
    n_classes : int
        Number of classes ``c``.

    Returns
    -------
    ndarray, shape (m, c), float64
        Row ``j`` is the ``labels[j]``-th unit vector.

    Raises
    ------
    ValueError
        If ``n_classes`` is not positive or a label is out of range.
    """
    labels = np.asarray(labels)
    if int(n_classes) != n_classes or n_classes < 1:
        raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(
            f"labels must lie in [0, {n_classes - 1}], got range [{labels.min()}, {labels.max()}]"
        )
    out = np.zeros((labels.size, int(n_classes)))
    out[np.arange(labels.size), labels.astype(np.int64)] = 1.0
    return out


def ridge_gradient(
    x: np.ndarray, y: np.ndarray, theta: np.ndarray, scale: float = 1.0
) -> np.ndarray:
    """Metered local gradient ``G = scale * X^T (X Theta - Y)`` (Schlegel et al., eq. 3).

    ``X^T (X Theta - Y) = X^T X Theta - X^T Y = n_i grad f_i(Theta)``; a conventional-FL
    device computing it on a b-row minibatch passes ``scale = n_i / b`` to estimate the
    full local gradient (or leaves 1 and lets the server scale).

    Parameters
    ----------
    x : ndarray, shape (b, d)
        Features of the rows used.
    y : ndarray, shape (b, c)
        One-hot labels of the same rows.
    theta : ndarray, shape (d, c)
        Current model.
    scale : float
        Factor applied to the result (not charged: a device folds it into the update).

    Returns
    -------
    ndarray, shape (d, c)
        The gradient; charges ``2 * b * d * c`` MACs to the open meters.

    Raises
    ------
    ValueError
        If the shapes do not agree.
    """
    x, y, theta = _as_2d("x", x), _as_2d("y", y), _as_2d("theta", theta)
    _check_shapes(x, y, theta)
    g = matmul(x.T, matmul(x, theta) - y)
    return g if scale == 1.0 else scale * g


def minibatch_gradient(X: np.ndarray, Y: np.ndarray, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Unbiased minibatch estimate of ``G_i = X^T X Theta - X^T Y`` (Schlegel et al., eq. 3), metered.

    Parameters
    ----------
    X : ndarray, (n_i, d)
    Y : ndarray, (n_i, c)
    theta : ndarray, (d, c)
    rows : ndarray of int, (b,)
        The minibatch.

    Returns
    -------
    ndarray, (d, c)
        ``(n_i / b) X_b^T (X_b Theta - Y_b)``; charges ``2 b d c`` MACs.
    """
    return ridge_gradient(X[rows], Y[rows], theta, scale=X.shape[0] / len(rows))


def ridge_gradients(x: np.ndarray, y: np.ndarray, theta: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """:func:`ridge_gradient` of a stack of ``B`` minibatches at one model, as one batched kernel.

    Slice ``i`` of the result equals ``ridge_gradient(x[i], y[i], theta, scale)`` bit for bit (the
    same BLAS products slice by slice, :func:`fednet.algebra.meter.bmatmul`, and the same
    element-wise operations); ``tests/test_batched.py`` checks it.

    Parameters
    ----------
    x : ndarray, shape (B, b, d)
    y : ndarray, shape (B, b, c)
    theta : ndarray, shape (d, c)
    scale : float

    Returns
    -------
    ndarray, shape (B, d, c)
        Charges ``2 * B * b * d * c`` MACs (``2 b d c`` per minibatch, as :func:`ridge_gradient`).

    Raises
    ------
    ValueError
        If the shapes do not agree.
    """
    x, y, theta = np.asarray(x), np.asarray(y), _as_2d("theta", theta)
    if x.ndim != 3 or y.ndim != 3 or x.shape[:2] != y.shape[:2]:
        raise ValueError(f"x and y must be stacks (B, b, d) and (B, b, c) of equal B and b, got {x.shape} and {y.shape}")
    _check_shapes(x[0], y[0], theta)
    r = bmatmul(x, theta)
    if r.dtype == np.result_type(r, y):             # in place: the same floats as ``r - y`` (and ``scale * g``)
        r -= y
    else:
        r = r - y
    g = bmatmul(x.transpose(0, 2, 1), r)
    if scale == 1.0:
        return g
    if g.dtype != np.result_type(g, scale):
        return scale * g
    g *= scale
    return g


def ridge_loss(x: np.ndarray, y: np.ndarray, theta: np.ndarray, lam: float) -> float:
    """Global ridge loss ``f(Theta) = 1/(2m) sum ||x_l Theta - y_l||^2 + lam/2 ||Theta||_F^2``.

    Source: Schlegel et al., Sec. III-A, eq. (2). Not metered (an evaluation, not a step a
    protocol charges for).

    Parameters
    ----------
    x : ndarray, shape (m, d)
    y : ndarray, shape (m, c)
    theta : ndarray, shape (d, c)
    lam : float
        Regularisation ``lambda >= 0``.

    Returns
    -------
    float
        The loss.
    """
    x, y, theta = _as_2d("x", x), _as_2d("y", y), _as_2d("theta", theta)
    _check_shapes(x, y, theta)
    if lam < 0:
        raise ValueError(f"lam must be non-negative, got {lam!r}")
    r = x @ theta - y
    return float(0.5 * np.sum(r * r) / x.shape[0] + 0.5 * lam * np.sum(theta * theta))


def ridge_step(theta: np.ndarray, g_sum: np.ndarray, m: int, mu: float, lam: float) -> np.ndarray:
    """Server update ``Theta - mu (G / m + lam Theta)`` (Schlegel et al., eqs. 4-5).

    Parameters
    ----------
    theta : ndarray, shape (d, c)
        Current model.
    g_sum : ndarray, shape (d, c)
        Aggregated gradient ``G = sum_i G_i`` (eq. 3 summed over devices).
    m : int
        Number of training points the gradient sums over.
    mu : float
        Learning rate.
    lam : float
        Regularisation ``lambda``.

    Returns
    -------
    ndarray, shape (d, c)
        The new model; charges ``2 d c`` MACs (two scaled additions).

    Raises
    ------
    ValueError
        If ``m`` is not positive or the shapes differ.
    """
    if m <= 0:
        raise ValueError(f"m must be positive, got {m!r}")
    theta, g_sum = np.asarray(theta), np.asarray(g_sum)
    if theta.shape != g_sum.shape:
        raise ValueError(f"g_sum has shape {g_sum.shape}, theta {theta.shape}")
    grad = axpy(lam, theta, g_sum / m)  # eq. (4)
    return axpy(-mu, grad, theta)  # eq. (5)


def predict(x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Predicted classes ``argmax_c (x Theta)_c`` (not metered).

    Parameters
    ----------
    x : ndarray, shape (m, d)
    theta : ndarray, shape (d, c)

    Returns
    -------
    ndarray, shape (m,), int64
    """
    x, theta = _as_2d("x", x), _as_2d("theta", theta)
    _check_shapes(x, None, theta)
    return np.argmax(x @ theta, axis=1).astype(np.int64)


def accuracy(x: np.ndarray, labels: np.ndarray, theta: np.ndarray) -> float:
    """Fraction of rows whose argmax prediction equals the label (not metered).

    Works for ridge (``x Theta``) and logistic regression (the softmax is monotone).

    Parameters
    ----------
    x : ndarray, shape (m, d)
    labels : ndarray, shape (m,), int
    theta : ndarray, shape (d, c)

    Returns
    -------
    float
        Accuracy in [0, 1].
    """
    labels = np.asarray(labels)
    if labels.shape != (np.asarray(x).shape[0],):
        raise ValueError(f"labels has shape {labels.shape}, expected ({np.asarray(x).shape[0]},)")
    return float(np.mean(predict(x, theta) == labels))


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax, numerically stable (max subtracted). Shape preserved; works on (..., c)."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def logistic_gradient(
    x: np.ndarray, y: np.ndarray, beta: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Metered weighted sum of per-example cross-entropy gradients, ``sum_j W_j g_j``.

    For multinomial logistic regression with loss
    ``L(x, y, beta) = -sum_c y_c log softmax(x beta)_c`` the per-example gradient is
    ``g_j = x_j^T (softmax(x_j beta) - y_j)``, so
    ``sum_j W_j g_j = X^T diag(W) (softmax(X beta) - Y)``: this is ``f_i`` of Makkonen et al.,
    eq. (10) (``weights=None`` gives the plain sum of Sec. II-B).

    Parameters
    ----------
    x : ndarray, shape (b, d)
        Features (append a column of ones for an intercept).
    y : ndarray, shape (b, c)
        One-hot labels.
    beta : ndarray, shape (d, c)
        Model.
    weights : ndarray, shape (b,), optional
        ``W_j`` per row.

    Returns
    -------
    ndarray, shape (d, c)
        Charges ``2 b d c`` MACs (two products) plus ``b c`` for the weighting.

    Raises
    ------
    ValueError
        If the shapes do not agree.
    """
    x, y, beta = _as_2d("x", x), _as_2d("y", y), _as_2d("beta", beta)
    _check_shapes(x, y, beta)
    r = softmax(matmul(x, beta)) - y
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (x.shape[0],):
            raise ValueError(f"weights has shape {weights.shape}, expected ({x.shape[0]},)")
        r = _scale_rows(weights, r)
    return matmul(x.T, r)


def _scale_rows(w: np.ndarray, r: np.ndarray) -> np.ndarray:
    charge(r.size)  # one multiplication per element
    return w[:, None] * r


def logistic_example_gradients(x: np.ndarray, y: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Per-example gradients ``g_j = x_j^T (softmax(x_j beta) - y_j)`` (not metered; tests).

    Parameters
    ----------
    x : ndarray, shape (b, d)
    y : ndarray, shape (b, c)
    beta : ndarray, shape (d, c)

    Returns
    -------
    ndarray, shape (b, d, c)
    """
    x, y, beta = _as_2d("x", x), _as_2d("y", y), _as_2d("beta", beta)
    _check_shapes(x, y, beta)
    r = softmax(x @ beta) - y
    return x[:, :, None] * r[:, None, :]


def logistic_loss(x: np.ndarray, y: np.ndarray, beta: np.ndarray) -> float:
    """Mean cross-entropy ``-(1/b) sum_j sum_c y_jc log softmax(x_j beta)_c`` (not metered).

    Parameters
    ----------
    x : ndarray, shape (b, d)
    y : ndarray, shape (b, c)
    beta : ndarray, shape (d, c)

    Returns
    -------
    float
    """
    x, y, beta = _as_2d("x", x), _as_2d("y", y), _as_2d("beta", beta)
    _check_shapes(x, y, beta)
    z = x @ beta
    zmax = z.max(axis=1, keepdims=True)
    logp = z - zmax - np.log(np.exp(z - zmax).sum(axis=1, keepdims=True))
    return float(-np.sum(y * logp) / x.shape[0])
