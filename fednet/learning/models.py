"""Models: linear ridge regression (Schlegel et al., Sec. III-A) and multinomial logistic
regression (Makkonen et al., Sec. IV-A), with metered gradients.

The local computations a protocol charges time for go through the metered kernels of
:mod:`fednet.algebra.meter`: the ridge gradient ``X^T (X Theta - Y)`` of a b-row minibatch with
``d`` features and ``c`` classes executes two products of ``b * d * c`` MACs each, so it is
charged ``2 b d c`` MACs. Additions, subtractions and the softmax's exponentials are not MACs
and are not charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fednet.algebra.meter import axpy, bmatmul, charge, matmul
from fednet.algebra.slices import map_slices

__all__ = [
    "one_hot",
    "ridge_gradient",
    "ridge_gradients",
    "minibatch_gradient",
    "minibatch_gradients",
    "minibatch_gradients_of",
    "sum_gradients",
    "STACK_BYTES",
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


#: Largest stack of the devices' points (bytes) that :func:`minibatch_gradients` keeps between rounds.
STACK_BYTES = 64 * 2**20


#: Largest buffer (bytes) of gathered minibatches that :func:`minibatch_gradients` forms at once from devices whose
#: points it keeps no stack of: their gradients are computed chunk by chunk, in bounded memory at any D (issue 32).
CHUNK_BYTES = 16 * 2**20


def _chunked_gradients(X: Sequence[np.ndarray], Y: Sequence[np.ndarray], rows: np.ndarray, theta: np.ndarray,
                       scale: float) -> np.ndarray:
    """:func:`ridge_gradients` of the minibatches ``X[p][rows[p]]`` of devices of one shape and batch size, gathered
    into a buffer of at most :data:`CHUNK_BYTES` a chunk of devices at a time (the rows were checked; the same
    BLAS products as device by device, so the same floats); the chunks run on the threads a run is lent."""
    K, b = rows.shape
    d, c = X[0].shape[1], Y[0].shape[1]
    step = max(1, CHUNK_BYTES // max(1, b * (d + c) * X[0].itemsize))

    def chunk(s: int, e: int) -> np.ndarray:
        parts = []
        for lo in range(s, e, step):
            hi = min(e, lo + step)
            xb = np.empty((hi - lo, b, d), dtype=X[0].dtype)
            yb = np.empty((hi - lo, b, c), dtype=Y[0].dtype)
            for j in range(lo, hi):
                np.take(X[j], rows[j], axis=0, out=xb[j - lo], mode="clip")
                np.take(Y[j], rows[j], axis=0, out=yb[j - lo], mode="clip")
            parts.append(ridge_gradients(xb, yb, theta, scale=scale))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    done = map_slices(chunk, K)
    return done[0] if len(done) == 1 else np.concatenate(done)


def _stack_layout(X: Sequence[np.ndarray], Y: Sequence[np.ndarray], cache: dict | None) -> list:
    """The devices grouped by equal shapes and types, each group ``(shape of X, members, stacks or None)``; a group's
    stacked points ``(K n, d)`` (row ``p n + r``) where a cache keeps them and they fit :data:`STACK_BYTES`."""
    ids = (tuple(map(id, X)), tuple(map(id, Y)))
    layout = None if cache is None else cache.get(ids)
    if layout is None:
        shapes: dict[tuple, list[int]] = {}
        for p, (x, y) in enumerate(zip(X, Y)):
            shapes.setdefault((x.shape, y.shape, x.dtype, y.dtype), []).append(p)
        layout = []
        for (xs, ys, _, _), members in shapes.items():
            fits = cache is not None and len(members) * xs[0] * (xs[1] + ys[1]) * 8 <= STACK_BYTES
            layout.append((xs, members, (np.concatenate([X[p] for p in members]),
                                         np.concatenate([Y[p] for p in members])) if fits else None))
        if cache is not None:
            cache[ids] = layout
            cache.setdefault("alive", []).append((list(X), list(Y)))   # the arrays stay alive: ids stay theirs
    return layout


def some_minibatch_gradients(X: Sequence[np.ndarray], Y: Sequence[np.ndarray], theta: np.ndarray,
                             which: Sequence[int], rows: Sequence[np.ndarray],
                             cache: dict) -> tuple[list[np.ndarray], list[int]]:
    """:func:`minibatch_gradients` of the devices ``which`` of a population ``X, Y`` whose stacks ``cache`` keeps
    (the same floats): for callers whose devices differ from call to call (asynchronous clients), so that one
    stack of the whole population serves every call.

    Parameters
    ----------
    X, Y : sequences of ndarray
        The whole population's points (the same arrays at every call).
    theta : ndarray, (d, c)
    which : sequence of int, (K,)
        Positions in ``X`` of the devices to compute, distinct.
    rows : sequence of ndarray of int
        ``rows[j]``: device ``which[j]``'s minibatch.
    cache : dict

    Returns
    -------
    gradients : list of ndarray (d, c), (K,)
    macs : list of int
        ``2 b_j d c`` each (their sum is charged here).
    """
    key = ("population", id(X), id(Y), len(X))
    kept = cache.get(key)
    if kept is None or kept[0] is not X or kept[1] is not Y:
        layout = _stack_layout(X, Y, cache)
        kept = cache[key] = (X, Y, layout, {p: (g, k) for g, (_, members, _) in enumerate(layout)
                                            for k, p in enumerate(members)})
    layout, group_of = kept[2], kept[3]
    out: list[np.ndarray | None] = [None] * len(which)
    macs = [0] * len(which)
    parts: dict[tuple[int, int], list[int]] = {}
    for j, p in enumerate(which):
        parts.setdefault((group_of[p][0], len(rows[j])), []).append(j)
    for (g, b), part in parts.items():
        xs, members, stacked = layout[g]
        per = 2 * b * xs[1] * theta.shape[1]
        charge(per * len(part))                     # the slices run unmetered (fednet.algebra.slices)
        sel = np.stack([rows[j] for j in part])
        if sel.size and (sel.min() < 0 or sel.max() >= xs[0]):
            raise IndexError(f"minibatch rows must lie in [0, {xs[0]}), got {sel.min()} ... {sel.max()}")
        if stacked is None:
            g_ = _chunked_gradients([X[which[j]] for j in part], [Y[which[j]] for j in part], sel, theta, xs[0] / b)
        else:
            at = (sel + (np.array([group_of[which[j]][1] for j in part]) * xs[0])[:, None]).ravel()
            xb = np.take(stacked[0], at, axis=0).reshape(len(part), b, -1)
            yb = np.take(stacked[1], at, axis=0).reshape(len(part), b, -1)
            done = map_slices(lambda s, e: ridge_gradients(xb[s:e], yb[s:e], theta, scale=xs[0] / b), len(part))
            g_ = done[0] if len(done) == 1 else np.concatenate(done)
        for k, j in enumerate(part):
            out[j], macs[j] = g_[k], per
    return out, macs


def minibatch_gradients(X: Sequence[np.ndarray], Y: Sequence[np.ndarray], theta: np.ndarray,
                        rows: Sequence[np.ndarray], cache: dict | None = None) -> tuple[list[np.ndarray], list[int]]:
    """:func:`minibatch_gradient` of many devices at one model, batched over devices of equal shapes.

    Devices with the same number of points and minibatch size form one stack and one batched kernel
    (:func:`fednet.learning.models.ridge_gradients`), when their points fit in :data:`STACK_BYTES`
    (larger points gain nothing from batching: they run device by device); each result equals
    ``minibatch_gradient(X[i], Y[i], theta, rows[i])`` bit for bit (``tests/test_batched.py``).
    The devices of a group are cut into slices that run at once on the threads a run is lent
    (:func:`fednet.algebra.slices.map_slices`: each device's products are the same BLAS calls on any
    thread), and this function charges the MACs itself (``2 b_i d c`` per device).

    Parameters
    ----------
    X, Y : sequences of ndarray, (n_i, d) and (n_i, c)
        The devices' points.
    theta : ndarray, (d, c)
    rows : sequence of ndarray of int, (b_i,), or ndarray (D, b)
        Each device's minibatch.
    cache : dict, optional
        Keeps each group's stacked points (up to :data:`STACK_BYTES`) between calls with the same
        arrays, so that a group's minibatches are gathered with one index (a caller passes the same
        dict every round; the points must not change).

    Returns
    -------
    gradients : list of ndarray (d, c), or one ndarray (D, d, c)
        In the order of ``X`` (the stack when every device is in one group).
    macs : list of int
        ``2 b_i d c`` per device (their sum is charged here).
    """
    layout = _stack_layout(X, Y, cache)
    out: list[np.ndarray | None] = [None] * len(X)
    macs = [0] * len(X)
    one = isinstance(rows, np.ndarray) and rows.ndim == 2
    for xs, members, stacked in layout:
        if one:
            by_size = {rows.shape[1]: members}
        else:
            by_size = {}
            for p in members:
                by_size.setdefault(len(rows[p]), []).append(p)
        for b, part in by_size.items():
            whole = len(part) == len(X)
            per = 2 * b * xs[1] * theta.shape[1]
            charge(per * len(part))                 # the slices run unmetered (fednet.algebra.slices)
            sel = rows if whole and one else np.stack([rows[p] for p in part])
            if sel.size and (sel.min() < 0 or sel.max() >= xs[0]):
                raise IndexError(f"minibatch rows must lie in [0, {xs[0]}), got {sel.min()} ... {sel.max()}")
            if stacked is None:                     # no stack kept: chunks of minibatches gathered device by device
                g = _chunked_gradients([X[p] for p in part], [Y[p] for p in part], sel, theta, xs[0] / b)
                if whole:
                    return g, [per] * len(X)
                for j, p in enumerate(part):
                    out[p], macs[p] = g[j], per
                continue
            which = np.arange(len(members)) if len(part) == len(members) else np.searchsorted(members, part)
            at = (sel + (which * xs[0])[:, None]).ravel()
            # the minibatches are gathered into buffers kept between rounds, one pair per group and batch
            # size, room for every member (issue 12: ~10 % more device-epochs/s at D = 1000 than fresh
            # arrays); the rows were checked above, so the gather needs no bounds mode (NumPy buffers
            # ``out`` under mode="raise")
            key = ("gather", id(stacked[0]), b)
            bufs = cache.get(key)
            if bufs is None:
                bufs = cache[key] = (np.empty((len(members) * b, xs[1]), dtype=stacked[0].dtype),
                                     np.empty((len(members) * b, stacked[1].shape[1]), dtype=stacked[1].dtype))

            def stack_part(s: int, e: int, b: int = b, at: np.ndarray = at, stacked: tuple = stacked,
                           n: int = xs[0], bufs: tuple = bufs) -> np.ndarray:
                """The gradients of the group's devices ``s:e`` (their minibatches gathered from the stack)."""
                xb = np.take(stacked[0], at[s * b:e * b], axis=0, out=bufs[0][s * b:e * b], mode="clip")
                yb = np.take(stacked[1], at[s * b:e * b], axis=0, out=bufs[1][s * b:e * b], mode="clip")
                return ridge_gradients(xb.reshape(e - s, b, -1), yb.reshape(e - s, b, -1), theta, scale=n / b)

            parts = map_slices(stack_part, len(part))
            g = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if whole:                               # one group, in order: the stack itself
                return g, [per] * len(X)
            for j, p in enumerate(part):
                out[p] = g[j]
                macs[p] = per
    return out, macs


def minibatch_gradients_of(protocol: Any, nodes: list, received: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """The batched form of a protocol's device step "``G_i`` of eq. (3) on the model it received".

    What ``protocol.local_gradient(node)`` gives for every node of ``nodes`` (the same floats): the devices'
    minibatches from ``protocol.minibatch_rows_many`` (each node's ``state.batch`` rows), the model
    ``received`` as float64, and :func:`minibatch_gradients` with a cache kept on the protocol.  Declared on
    conventional FL's step with :func:`fednet.sim.engine.results.batched`, for the engine's ``batched``
    backend to pick.

    Returns
    -------
    gradients, macs
        As :func:`minibatch_gradients`.
    """
    theta = received.astype(np.float64)
    rows = protocol.minibatch_rows_many(nodes, [dev.state.batch for dev in nodes])
    stacks = protocol.__dict__.setdefault("_gradient_stacks", {})
    X, Y = protocol.task.X, protocol.task.Y
    return minibatch_gradients([X[d.index] for d in nodes], [Y[d.index] for d in nodes], theta, rows, stacks)


try:  # a compiled loop for the sum of a stack's rows in a given order (numba ships with galois)
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

if _numba is not None:
    @_numba.njit(cache=True)
    def _nb_rows_sum(flat, rows, out):  # pragma: no cover - compiled
        # out[j] = ((0 + flat[rows[0], j]) + flat[rows[1], j]) + ...: NumPy's add.reduce over axis 0 (initial 0),
        # one row after the other (adds only: nothing to contract or reassociate)
        for r in rows:
            for j in range(out.shape[0]):
                out[j] += flat[r, j]
else:  # pragma: no cover
    _nb_rows_sum = None


def sum_gradients(gradients: Sequence[np.ndarray] | np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """``G = sum_i G_i`` (eq. 3), one metered axpy per gradient (``d c`` MACs each), in the given order.

    ``gradients``: a sequence of (d, c) arrays, or their stack (K, d, c); with ``rows`` (ints), the stack's rows
    ``gradients[rows[0]], gradients[rows[1]], ...`` in that order (the same sum as ``sum_gradients(gradients[rows])``,
    without copying the stack: :attr:`fednet.protocol.primitives.GatherResult.stack_rows`).

    Same-shaped float64 gradients of two or more elements are added as one reduction over the stack
    (NumPy adds along the first axis one row after the other, from 0: the same sums as the loop of
    axpys, bit for bit; ``tests/test_batched.py``), a stack's rows in a given order by a compiled loop of the
    same additions.
    """
    if rows is not None:
        stack, rows = np.asarray(gradients), np.asarray(rows, dtype=np.intp)
        if (_nb_rows_sum is not None and stack.dtype == np.float64 and stack.ndim >= 2 and stack[0].size >= 2
                and len(rows) and stack.flags.c_contiguous):
            charge(len(rows) * stack[0].size)
            out = np.zeros(stack[0].size)
            _nb_rows_sum(stack.reshape(len(stack), -1), rows, out)
            return out.reshape(stack.shape[1:])
        gradients = stack[rows]
    if isinstance(gradients, np.ndarray) and gradients.dtype == np.float64 and gradients[0].size >= 2:
        charge(len(gradients) * gradients[0].size)          # a stack (rows in order): no copy to make
        return np.add.reduce(gradients.reshape(len(gradients), -1), axis=0, initial=0.0).reshape(gradients.shape[1:])
    g0 = gradients[0]
    if (isinstance(g0, np.ndarray) and g0.dtype == np.float64 and g0.size >= 2
            and all(isinstance(g, np.ndarray) and g.shape == g0.shape and g.dtype == g0.dtype for g in gradients)):
        charge(len(gradients) * g0.size)
        stack = np.stack(gradients).reshape(len(gradients), -1)
        return np.add.reduce(stack, axis=0, initial=0.0).reshape(g0.shape)
    total = np.zeros_like(gradients[0])
    for g in gradients:
        total = axpy(1.0, g, total)
    return total


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
