"""``[data] preprocess``: pixels / 255 (default, unchanged) or standardised with the training set's statistics.

DReS-FL (Shao et al., NeurIPS 2022, Sec. 6.1, App. B) does not state its preprocessing (issue 31, item 2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fednet.errors import ConfigError
from fednet.learning.datasets import load_dataset, preprocess, standardize
from fednet.study.config import Study, load_study
from fednet.study.runner import prepare_task

ROOT = Path(__file__).resolve().parents[1]
#: Tolerance of the standardised statistics (float64 sums over at most 60,000 rows).
TOL = 1e-9


def _study(**data):
    return Study.model_validate({"name": "p", "seeds": [0], "epochs": 1,
                                 "data": {"dataset": "digits", "features": "raw", "partition": "skewed_label", **data},
                                 "network": {"n_devices": 10},
                                 "runs": [{"protocol": "fedavg", "params": {"batch_size": 8, "hidden": [4]}}]})


def _check_standardised(raw, std):
    """Per non-constant feature: training mean 0 and std 1 within TOL; constant features 0; the test set scaled
    with the training mean and std, not its own."""
    mu, sd = raw.x_train.mean(axis=0), raw.x_train.std(axis=0)
    live = sd > 0
    assert live.sum() >= 0.5 * live.size and (~live).any()            # both kinds occur in these data sets
    np.testing.assert_allclose(std.x_train.mean(axis=0), 0, atol=TOL)
    np.testing.assert_allclose(std.x_train[:, live].std(axis=0), 1, rtol=TOL)
    assert not std.x_train[:, ~live].any()
    np.testing.assert_allclose(std.x_test[:, live], (raw.x_test[:, live] - mu[live]) / sd[live], rtol=0, atol=TOL)
    np.testing.assert_allclose(std.x_test[:, ~live], raw.x_test[:, ~live] - mu[~live], rtol=0, atol=TOL)
    # the test set's own statistics are not 0 and 1: it was not standardised with them
    assert np.abs(std.x_test[:, live].mean(axis=0)).max() > 0.01
    assert np.abs(std.x_test[:, live].std(axis=0) - 1).max() > 0.01
    assert np.array_equal(std.y_train, raw.y_train) and np.array_equal(std.y_test, raw.y_test)


def test_standardize_digits():
    raw = load_dataset("digits")
    _check_standardised(raw, standardize(raw))
    assert preprocess(raw, "unit") is raw


def test_standardize_mnist(data_dir):
    raw = load_dataset("mnist", data_dir)
    assert raw.x_train.min() == 0 and raw.x_train.max() == 1                    # "unit": pixels / 255
    np.testing.assert_allclose(raw.x_train[:100] * 255, np.round(raw.x_train[:100] * 255), rtol=0, atol=1e-12)
    _check_standardised(raw, preprocess(raw, "standardize"))


def test_the_study_pipeline_standardises_train_and_test_with_the_training_statistics():
    raw = load_dataset("digits")
    want = standardize(raw)
    task = prepare_task(_study(preprocess="standardize"))
    rows = np.concatenate(task.X)
    assert rows.shape == want.x_train.shape
    # the devices' rows are the standardised training rows (a permutation of them, by the partition)
    order = np.lexsort(rows.T[::-1])
    np.testing.assert_array_equal(rows[order], want.x_train[np.lexsort(want.x_train.T[::-1])])
    np.testing.assert_array_equal(task.x_test, want.x_test)


def test_default_is_pixels_in_unit_range_bit_for_bit():
    assert _study().data.preprocess == "unit"
    assert all(load_study(p).data.preprocess == "unit" for p in sorted((ROOT / "studies").glob("dresfl_*.toml")))
    raw = load_dataset("digits")
    default, unit = prepare_task(_study()), prepare_task(_study(preprocess="unit"))
    rows = np.concatenate(default.X)
    assert rows.min() == 0 and rows.max() == 1
    np.testing.assert_array_equal(default.x_test, raw.x_test)                   # the loader's arrays, untouched
    for a, b in zip(default.X, unit.X):
        np.testing.assert_array_equal(a, b)
    assert sorted(map(tuple, rows)) == sorted(map(tuple, raw.x_train))


@pytest.mark.parametrize("value", ['"zscore"', '"Standardize"', "1", '""'])
def test_a_bad_preprocess_is_refused_at_load_naming_it(value):
    with pytest.raises(ConfigError, match=r"data\.preprocess: Input should be 'unit' or 'standardize'"):
        load_study(ROOT / "studies/dresfl_table2.toml", sets=[f"data.preprocess={value}"])
    with pytest.raises(ValueError, match=r"kind must be one of \('unit', 'standardize'\), got 'zscore'"):
        preprocess(load_dataset("digits"), "zscore")


def test_vertical_split_refuses_preprocess():
    with pytest.raises(ConfigError, match="preprocess has no meaning for split = 'vertical'"):
        load_study(ROOT / "studies/fedvs_fig2.toml", sets=['data.preprocess="standardize"'])
