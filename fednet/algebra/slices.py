"""Threads inside one simulation: a step that many devices (or many rows) take alike, cut into slices.

A study parallelises over its (run, seed) pairs (:mod:`fednet.study.parallel`); a study of fewer
pairs than cores (``conventional_mnist`` is one run) leaves cores idle. :func:`compute_threads` lends
such a run threads, and the kernels that are independent across devices or rows run their slices on
them at once, each slice with one BLAS thread (NumPy releases the GIL in BLAS, ``take`` and ufuncs).

Exactness: a slice computes what the whole computes, bit for bit, by construction:

- **over devices** (:func:`map_slices` over a device index): each device's product is the same BLAS
  call whatever thread runs it;
- **over rows** (:func:`rows_matmul`): a row of ``a @ b`` depends only on that row of ``a``, but
  OpenBLAS computes the rows of a panel's remainder with other kernels, so the cuts fall on multiples
  of :data:`ROW_BLOCK` rows (measured on this project's OpenBLAS: unaligned cuts change the last bits,
  aligned ones never did; ``tests/test_slices.py`` checks the shapes fednet uses).

Metering: each slice runs in a copy of the caller's :class:`contextvars.Context` with no
:class:`~fednet.algebra.meter.MacMeter` open (and no pool: a slice that slices again runs its slices
itself), so the slices charge nothing; the caller charges the MACs the whole step executes, as the
unsliced code does, and simulated time does not depend on the thread count.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from fednet.algebra.meter import _ACTIVE

__all__ = ["ROW_BLOCK", "compute_threads", "threads", "cuts", "map_slices", "rows_matmul"]

T = TypeVar("T")

#: Row cuts of a sliced product fall on multiples of this (above every OpenBLAS kernel's unroll of M).
ROW_BLOCK = 64

_POOL: contextvars.ContextVar[ThreadPoolExecutor | None] = contextvars.ContextVar("fednet_compute_pool",
                                                                                 default=None)
_THREADS: contextvars.ContextVar[int] = contextvars.ContextVar("fednet_compute_threads", default=1)


@contextlib.contextmanager
def compute_threads(n: int) -> Iterator[None]:
    """Lend the sliced kernels run in this context ``n`` threads (1: none, everything in the caller).

    Parameters
    ----------
    n : int
        Threads (>= 1), the calling one included.

    Raises
    ------
    ValueError
        If ``n`` is not an integer >= 1.
    """
    if int(n) != n or n < 1:
        raise ValueError(f"threads must be an integer >= 1, got {n!r}")
    with contextlib.ExitStack() as stack:
        pool = None if n == 1 else stack.enter_context(
            ThreadPoolExecutor(max_workers=int(n) - 1, thread_name_prefix="fednet-slice"))
        tokens = _POOL.set(pool), _THREADS.set(int(n))
        try:
            yield
        finally:
            _POOL.reset(tokens[0])
            _THREADS.reset(tokens[1])


def threads() -> int:
    """Threads the sliced kernels use in this context (1 outside :func:`compute_threads`)."""
    return _THREADS.get()


def cuts(n: int, parts: int, block: int = 1) -> list[int]:
    """Boundaries ``0 = c_0 <= c_1 <= ... <= c_k = n`` of at most ``parts`` near-equal slices of ``range(n)``.

    Every inner boundary is a multiple of ``block``; empty slices are dropped (so fewer than ``parts``
    slices when ``n`` is small).
    """
    inner = sorted({(n * j // parts) // block * block for j in range(1, parts)} - {0, n})
    return [0, *[c for c in inner if 0 < c < n], n]


def _unmetered() -> contextvars.Context:
    """A copy of the current context without open meters or a pool (one per slice: a context runs in one thread)."""
    ctx = contextvars.copy_context()
    ctx.run(_ACTIVE.set, ())
    ctx.run(_POOL.set, None)
    ctx.run(_THREADS.set, 1)
    return ctx


def map_slices(fn: Callable[[int, int], T], n: int, *, block: int = 1) -> list[T]:
    """``[fn(start, stop) for each slice]`` of ``range(n)``, the slices at once on :func:`threads` threads.

    Each call runs in a copy of the caller's context in which no meter is open (the caller charges)
    and no pool is lent. With one thread (or one slice), the single call still runs unmetered, so
    metering never depends on the thread count.

    Parameters
    ----------
    fn : callable(start, stop)
    n : int
        Items to cut.
    block : int
        Inner boundaries fall on multiples of it.

    Returns
    -------
    list
        The slices' results, in order of ``start``.
    """
    bounds = cuts(n, threads(), block)
    pool = _POOL.get()
    if pool is None or len(bounds) <= 2:
        return [_unmetered().run(fn, a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    later = [pool.submit(_unmetered().run, fn, a, b) for a, b in zip(bounds[1:-1], bounds[2:])]
    first = _unmetered().run(fn, bounds[0], bounds[1])
    return [first, *(f.result() for f in later)]


def rows_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for a 2-D ``a`` (m, k) and ``b`` (k, n), its rows cut at :data:`ROW_BLOCK` multiples (not metered).

    Equal to ``a @ b`` bit for bit (see the module's notes); float64 operands.
    """
    a, b = np.asarray(a), np.asarray(b)
    if threads() == 1 or a.ndim != 2 or b.ndim != 2 or a.shape[0] < 2 * ROW_BLOCK:
        return a @ b
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))

    def part(start: int, stop: int) -> None:
        """Rows ``start:stop`` of the product, written in place."""
        np.matmul(a[start:stop], b, out=out[start:stop])

    map_slices(part, a.shape[0], block=ROW_BLOCK)
    return out
