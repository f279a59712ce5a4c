"""The MAC meter: counts, nesting, and the measured-once cache of timing modes."""

from __future__ import annotations

import numpy as np

from fednet.algebra.meter import MacMeter, axpy, charge, macs_of, matmul


def test_counts_nest_and_vectors_count_as_one() -> None:
    with MacMeter() as outer:
        matmul(np.ones((3, 4)), np.ones((4, 5)))
        with MacMeter() as inner:
            matmul(np.ones(4), np.ones((4, 2)))
            axpy(2.0, np.ones((2, 3)), np.zeros((2, 3)))
    assert inner.macs == 4 * 2 + 6
    assert outer.macs == 60 + 14
    charge(5)                      # no meter open: nothing to count, no error


def test_macs_of_measures_once_and_charges_no_open_meter() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        matmul(np.ones((2, 3)), np.ones((3, 7)))

    with MacMeter() as m:
        assert macs_of(("test-step", 2, 3, 7), step) == 42
        assert macs_of(("test-step", 2, 3, 7), step) == 42
    assert len(calls) == 1 and m.macs == 0
