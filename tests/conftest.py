"""Shared test fixtures.

The original MNIST / Fashion-MNIST IDX files are read from ``$FEDNET_DATA`` (the Makefile points
it at ``../shared/data``); tests that need them skip with a clear reason when it is unset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fednet

# First, before any test module loads NumPy: the host settings the fednet command runs with (fednet.runtime) --
# the portable kernels (fednet.PORTABLE_KERNELS, where the Makefile has not exported them), glibc's malloc
# thresholds and Protocol.run's garbage-collector policy. Importing fednet alone changes none of them.
fednet.configure_host()


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread():
    """One BLAS/OpenMP thread for the whole session, as every study run has (``fednet.study.threads``): a product
    split over threads sums in another order, so the pinned traces would depend on the host's cores."""
    from fednet.study.threads import limit_threads

    with limit_threads(1):
        yield


@pytest.fixture(autouse=True)
def _backends_allowed(request, monkeypatch):
    """A test marked ``backends`` checks the engine's backends themselves (that one ran, how it declined): it runs
    with every backend allowed, whatever ``$FEDNET_ENGINE`` says, so that ``FEDNET_ENGINE=reference make test`` (run
    by ``.ci/run``) puts every other test on the reference semantics."""
    if request.node.get_closest_marker("backends"):
        monkeypatch.setenv("FEDNET_ENGINE", "all")
    yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Directory holding ``mnist/`` and ``fashion-mnist/`` IDX files (``$FEDNET_DATA``)."""
    value = os.environ.get("FEDNET_DATA")
    if not value or not (Path(value) / "mnist").is_dir():
        pytest.skip("FEDNET_DATA does not point at a directory with mnist/ (see README)")
    return Path(value)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A two-worker Dask ``LocalCluster`` client for one test module (what ``--jobs 2`` starts).

    Workers inherit the environment at start-up: ``FEDNET_DATA_URL`` points nowhere while they start, so no
    worker ever tries a download.
    """
    pytest.importorskip("distributed")
    from fednet.study.parallel import open_client

    before = os.environ.get("FEDNET_DATA_URL")
    os.environ["FEDNET_DATA_URL"] = (tmp_path_factory.mktemp("nowhere") / "none").as_uri()
    try:
        c = open_client(jobs=2)
    finally:
        if before is None:
            del os.environ["FEDNET_DATA_URL"]
        else:
            os.environ["FEDNET_DATA_URL"] = before
    yield c
    c.close()
