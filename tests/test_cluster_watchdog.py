"""A Dask cluster without workers (one lost without a nanny, or all gone) ends a parallel study with ``ClusterError``
after the stated timeout, instead of leaving ``fednet run`` waiting with no message (issue 33)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fednet.errors import ClusterError
from fednet.study import parallel
from fednet.study.config import load_study


def test_no_worker_left_ends_the_study_with_a_named_error(monkeypatch) -> None:
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(parallel, "WORKERLESS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(parallel, "WORKER_CHECK_S", 0.2)
    study = load_study(Path(__file__).resolve().parents[1] / "studies" / "quickstart.toml", seeds=[0], max_epochs=1)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match="no worker for 1 s"):
            parallel.simulate_parallel(study, client=client, progress=False)
        assert time.monotonic() - t0 < 30
