"""Threads inside a run (:mod:`fednet.algebra.slices`): every sliced kernel equals its whole, bit for bit,
and charges what the unsliced kernel charged."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter, charge
from fednet.algebra.slices import ROW_BLOCK, compute_threads, cuts, map_slices, rows_matmul, threads
from fednet.learning.datasets import load_dataset
from fednet.learning.features import rbf_features
from fednet.learning.model import RidgeModel
from fednet.protocols.conventional import minibatch_gradient, minibatch_gradients


def test_compute_threads_refuses_and_restores() -> None:
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=f"threads must be an integer >= 1, got {bad!r}"):
            with compute_threads(bad):
                pass
    assert threads() == 1
    with compute_threads(3):
        assert threads() == 3
        with compute_threads(1):
            assert threads() == 1
        assert threads() == 3
    assert threads() == 1


@pytest.mark.parametrize("n, parts, block", [(10, 3, 1), (1000, 2, 64), (1000, 3, 64), (100, 4, 64),
                                             (5, 8, 1), (0, 2, 1), (129, 2, 64)])
def test_cuts_cover_in_blocks(n: int, parts: int, block: int) -> None:
    c = cuts(n, parts, block)
    assert c[0] == 0 and c[-1] == n and len(c) - 1 <= max(parts, 1)
    assert all(a < b for a, b in zip(c[:-1], c[1:])) or n == 0
    assert all(x % block == 0 for x in c[1:-1])


def test_map_slices_order_threads_and_no_meter() -> None:
    """The slices run at once (a barrier of n parties passes), in order, and charge no meter."""
    for n in (1, 3):
        barrier = threading.Barrier(n, timeout=10)
        names: set[str] = set()

        def fn(a: int, b: int) -> list[int]:
            charge(1000)                                   # no meter is open in a slice
            names.add(threading.current_thread().name)
            barrier.wait()                                 # every slice has started: they run at once
            return list(range(a, b))

        with compute_threads(n), MacMeter() as meter:
            out = map_slices(fn, 10)
        assert sum(out, []) == list(range(10)) and meter.macs == 0
        assert len(out) == n and len(names) == n


def test_map_slices_see_the_callers_context_but_no_meter() -> None:
    """A context variable the caller set (a kernel's mode, say) reaches every slice; its meters do not."""
    import contextvars
    mode = contextvars.ContextVar("mode", default="plain")
    token = mode.set("widened")
    try:
        with compute_threads(3), MacMeter() as meter:
            out = map_slices(lambda a, b: (mode.get(), charge(5))[0], 9)
    finally:
        mode.reset(token)
    assert out == ["widened"] * 3 and meter.macs == 0


def test_map_slices_nested_runs_inline() -> None:
    """A slice that slices again runs its inner slices itself (no pool inside a slice: no deadlock)."""
    with compute_threads(2):
        out = map_slices(lambda a, b: (threads(), map_slices(lambda c, d: d - c, b - a)), 8)
    assert out == [(1, [4]), (1, [4])]


@pytest.mark.parametrize("m, k, n", [(10_000, 2000, 10), (4999, 300, 10), (1797 - 1437, 64, 10),
                                     (7919, 500, 7), (129, 33, 3), (100, 20, 10)])
@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_rows_matmul_is_the_whole_product(m: int, k: int, n: int, n_threads: int) -> None:
    rng = np.random.default_rng(m * 31 + n_threads)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    with compute_threads(n_threads), MacMeter() as meter:
        out = rows_matmul(a, b)
    assert np.array_equal(out, a @ b) and meter.macs == 0


def _devices(rng: np.random.Generator, sizes: list[int], d: int, c: int) -> tuple[list, list]:
    X = [rng.standard_normal((s, d)) for s in sizes]
    Y = [np.eye(c)[rng.integers(0, c, s)] for s in sizes]
    return X, Y


@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_minibatch_gradients_threaded_equal_and_metered(stack: bool, n_threads: int) -> None:
    """Stacked groups (with a cache) and device-by-device ones (without): each device's gradient is
    minibatch_gradient's bit for bit, and the meter holds 2 b d c per device, for any thread count."""
    rng = np.random.default_rng(7)
    d, c = 40, 5
    X, Y = _devices(rng, [30] * 5 + [20] * 4, d, c)        # two groups of shapes
    rows = [rng.choice(len(x), 6 if i % 3 else 4, replace=False) for i, x in enumerate(X)]
    theta = rng.standard_normal((d, c))
    with compute_threads(n_threads), MacMeter() as meter:
        got, macs = minibatch_gradients(X, Y, theta, rows, {} if stack else None)
    with MacMeter() as alone:
        want = [minibatch_gradient(x, y, theta, r) for x, y, r in zip(X, Y, rows)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert macs == [2 * len(r) * d * c for r in rows] and meter.macs == sum(macs) == alone.macs


@pytest.mark.parametrize("n_threads", [2, 3])
def test_minibatch_gradients_one_stack_threaded(n_threads: int) -> None:
    rng = np.random.default_rng(3)
    X, Y = _devices(rng, [25] * 7, 30, 4)
    rows = np.stack([rng.choice(25, 5, replace=False) for _ in X])
    theta = rng.standard_normal((30, 4))
    cache: dict = {}
    whole, _ = minibatch_gradients(X, Y, theta, rows, cache)
    with compute_threads(n_threads), MacMeter() as meter:
        sliced, macs = minibatch_gradients(X, Y, theta, rows, cache)
    assert isinstance(sliced, np.ndarray) and sliced.shape == (7, 30, 4)
    assert np.array_equal(sliced, whole) and meter.macs == sum(macs) == 7 * 2 * 5 * 30 * 4


def test_features_and_evaluation_threaded_equal() -> None:
    data = load_dataset("digits")
    one = rbf_features(data, n_components=300, seed=4)
    with compute_threads(3):
        three = rbf_features(data, n_components=300, seed=4)
    assert np.array_equal(one.x_train, three.x_train) and np.array_equal(one.x_test, three.x_test)
    assert len(one.x_train) >= 2 * ROW_BLOCK                 # the rows were cut
    model = RidgeModel(300, 10, weight_decay=1e-3)
    theta = np.random.default_rng(0).standard_normal((300, 10))
    want = model.evaluate(theta, one.x_train, data.y_train)
    with compute_threads(2):
        assert model.evaluate(theta, one.x_train, data.y_train) == want
