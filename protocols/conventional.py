"""Conventional federated (minibatch) gradient descent — the baseline of Sec. VII.

Source: Schlegel, Kumar, Rosnes, Graell i Amat, "CodedPaddedFL and CodedSecAgg: Straggler
mitigation and secure aggregation in federated learning", Sec. III-A (eqs. 3-5) and
Sec. VII-A/B.

Each epoch the server broadcasts ``Theta`` (float32, d*c numbers); device i draws a minibatch
of ``b_i = round(minibatch_fraction * n_i)`` of its points without replacement (Sec. VII-A: "a
fifth of the data at each epoch"), computes the unbiased estimate of eq. (3)

    G_i = (n_i / b_i) X_b^T (X_b Theta - Y_b)          (2 b_i d c MACs)

and uploads it. The server waits for all devices, or for the ``D - drop_slowest`` first to
arrive (the client-drift variant of Sec. VII-B: the slowest are dropped each epoch), sums the
gradients (one MAC per element and gradient), and applies eqs. (4)-(5) with ``m`` replaced by
the number of points of the devices used.

What each party sees: the server sees every used device's local gradient estimate in the clear
(no privacy beyond not sharing raw data); devices see only the model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from fednet.algebra.meter import axpy, charge
from fednet.algebra.slices import map_slices
from fednet.learning.models import minibatch_gradient, ridge_gradients
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.sim.simulation import Node


class ConventionalFLConfig(ProtocolConfig):
    """Parameters of conventional FL.

    Attributes
    ----------
    minibatch_fraction : float
        Fraction of each device's points used per epoch, in (0, 1] (0.2 in Sec. VII-A).
    drop_slowest : int
        Number of slowest devices whose gradients the server does not wait for (Sec. VII-B).
    """

    minibatch_fraction: float = Field(0.2, gt=0.0, le=1.0)
    drop_slowest: int = Field(0, ge=0)


@dataclass
class ConventionalState(NodeState):
    """A device's state: its minibatch size ``b_i`` (the rows come from :meth:`Protocol.minibatch_rows`)."""

    batch: int = 0


#: Largest stack of the devices' points (bytes) that :func:`minibatch_gradients` keeps between rounds.
STACK_BYTES = 64 * 2**20


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
    ids = (tuple(map(id, X)), tuple(map(id, Y)))
    layout = None if cache is None else cache.get(ids)
    if layout is None:                              # devices of equal shapes and types, each group's stack
        shapes: dict[tuple, list[int]] = {}
        for p, (x, y) in enumerate(zip(X, Y)):
            shapes.setdefault((x.shape, y.shape, x.dtype, y.dtype), []).append(p)
        layout = []
        for (xs, ys, _, _), members in shapes.items():
            fits = cache is not None and len(members) * xs[0] * (xs[1] + ys[1]) * 8 <= STACK_BYTES
            layout.append((xs, members, (np.concatenate([X[p] for p in members]),   # (K n, d): row p n + r
                                         np.concatenate([Y[p] for p in members])) if fits else None))
        if cache is not None:
            cache[ids] = layout
            cache.setdefault("alive", []).append((list(X), list(Y)))   # the arrays stay alive: ids stay theirs
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
            if stacked is None:                     # large points: device by device (no stack to copy)
                done = map_slices(lambda s, e: [minibatch_gradient(X[p], Y[p], theta, rows[p]) for p in part[s:e]],
                                  len(part))
                for p, g in zip(part, itertools.chain.from_iterable(done)):
                    out[p], macs[p] = g, per
                continue
            sel = rows if whole and one else np.stack([rows[p] for p in part])
            if sel.size and (sel.min() < 0 or sel.max() >= xs[0]):
                raise IndexError(f"minibatch rows must lie in [0, {xs[0]}), got {sel.min()} ... {sel.max()}")
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


class ConventionalFL(Protocol):
    """Conventional federated minibatch gradient descent (Sec. III-A, VII-A/B)."""

    name = "conventional"
    Config = ConventionalFLConfig
    State = ConventionalState
    setup_dropouts = "none"                               # no setup exchange: absentees recorded only

    @classmethod
    def check(cls, config: ConventionalFLConfig, n_devices: int) -> None:
        """Refuse dropping as many devices as there are."""
        if config.drop_slowest >= n_devices:
            raise ValueError(f"drop_slowest must be less than the number of devices ({n_devices}), "
                             f"got {config.drop_slowest}")

    @classmethod
    def check_dropout(cls, config: ConventionalFLConfig, n_devices: int, dropout: float) -> None:
        """Refuse a dropout that leaves fewer than ``D - drop_slowest`` devices on average."""
        need = n_devices - config.drop_slowest
        mean = n_devices * (1.0 - dropout)
        if mean < need:
            s_min = math.ceil(n_devices * dropout - 1e-12)
            raise ValueError(f"network.dropout = {dropout} leaves {mean:.4g} of {n_devices} devices available on "
                             f"average, fewer than the D - drop_slowest = {need} each round waits for "
                             f"(drop_slowest = {config.drop_slowest}); set drop_slowest >= {s_min} or lower dropout")

    def setup(self) -> Generator:
        """No set-up phase: only each device's minibatch size."""
        for dev in self.devices:
            n = self.task.X[dev.index].shape[0]
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * n)))
        return
        yield  # pragma: no cover

    def local_gradient(self, dev: Node) -> np.ndarray:
        """Device ``dev``'s minibatch gradient on the model it received this round."""
        theta = dev.state.received.astype(np.float64)      # the float32 model it downloaded
        rows = self.minibatch_rows(dev, dev.state.batch)   # keyed (device, "minibatch", epoch): paired
        return minibatch_gradient(self.task.X[dev.index], self.task.Y[dev.index], theta, rows)

    def local_gradients(self, nodes: list[Node], received: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
        """:meth:`local_gradient` of every node of ``nodes`` on the model ``received``, batched
        (:data:`fednet.protocol.primitives.Batch`; :func:`minibatch_gradients`)."""
        theta = received.astype(np.float64)
        rows = self.minibatch_rows_many(nodes, [dev.state.batch for dev in nodes])
        if not hasattr(self, "_stacks"):
            self._stacks: dict = {}
        return minibatch_gradients([self.task.X[d.index] for d in nodes], [self.task.Y[d.index] for d in nodes],
                                   theta, rows, self._stacks)

    def round(self, epoch: int) -> Generator:
        """One epoch: download Theta, minibatch gradient (eq. 3), upload; the server sums the first D - s and updates (eqs. 4-5)."""
        replies = yield from self.net.gather(self.devices, self.local_gradient, kind="gradient",
                                             first=self.sim.n_devices - self.config.drop_slowest,
                                             download=self.theta.astype(np.float32), batch=self.local_gradients)
        if replies.stack_rows is not None:                  # the batch's stack and the arrivals' rows in it
            G = yield from self.net.server_compute(sum_gradients, *replies.stack_rows)          # eq. (3)
        else:
            G = yield from self.net.server_compute(sum_gradients, replies.values)
        self.used = replies.indices
        counts = self.point_counts
        m_used = int(counts.sum() if len(self.used) == len(counts) else counts[self.used].sum())
        self.mode.update(self, G, m_used)                                                 # eqs. (4)-(5)
