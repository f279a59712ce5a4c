"""Thread-pool limits of a simulation: one BLAS/OpenMP thread by default (``threadpoolctl``).

Issue 12 measured the default OpenBLAS thread count making runs 4-11x slower on a loaded host;
fednet runs each simulation with one thread and parallelises over runs and seeds instead
(:mod:`fednet.study.parallel`). One thread also fixes the order of BLAS reductions, so a run's
floating-point results do not depend on the host's core count.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

__all__ = ["limit_threads", "scoped_environment"]


@contextlib.contextmanager
def limit_threads(n: int | None) -> Iterator[None]:
    """Limit BLAS and OpenMP thread pools (and torch's intra-op pool, if loaded) to ``n`` threads.

    Parameters
    ----------
    n : int or None
        Threads per pool (>= 1); None leaves the pools alone.

    Raises
    ------
    ValueError
        If ``n`` is not None and below 1.

    Notes
    -----
    ``threadpoolctl`` only sees libraries already loaded; scipy's own OpenBLAS is loaded here
    first so that it is limited too.
    """
    if n is None:
        yield
        return
    if int(n) < 1:
        raise ValueError(f"blas_threads must be >= 1 or None, got {n!r}")
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS before the limit is taken)
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    torch_before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=int(n)):
        if torch is not None:
            torch.set_num_threads(int(n))
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(torch_before)


@contextlib.contextmanager
def scoped_environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    """Set (a value) or unset (None) the variables of ``env`` while the block runs; restore them after."""
    if not env:
        yield
        return
    before = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
