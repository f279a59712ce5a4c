"""The inter-group aggregation tree of CodedSecAgg (Sec. VI-D, eqs. 14-15, Fig. 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.codes.secagg_tree import aggregation_tree, tree_coverage, tree_depth


def test_fig3_example():
    # paper groups 1..8 -> 0..7; step 1: 2->1, 4->3, 6->5, 8->7; step 2: 3->1, 7->5; step 3: 5->1
    assert aggregation_tree(8) == [[(1, 0), (3, 2), (5, 4), (7, 6)], [(2, 0), (6, 4)], [(4, 0)]]


@pytest.mark.parametrize("N", range(1, 17))
def test_tree_delivers_everything_to_master(N):
    steps = aggregation_tree(N)
    assert len(steps) == math.ceil(math.log2(N)) == tree_depth(N)
    done = set()
    for s, step in enumerate(steps, start=1):
        senders = [a for a, _ in step]
        receivers = [b for _, b in step]
        # at most one message out and one in per group (hence per device i of the group) per step
        assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers)
        assert not set(senders) & set(receivers)
        assert not set(senders) & done and not set(receivers) & done  # finished groups stay idle
        for a, b in step:
            assert a - b == 2 ** (s - 1) and a < N  # eq. (14): sender g mod 2**s == 2**(s-1)
            assert a % 2**s == 2 ** (s - 1)
        done |= set(senders)
    cov = tree_coverage(N)
    assert cov[-1][0] == frozenset(range(N))
    # eq. (15): a sender in step s holds the sum of groups g .. min(g + 2**(s-1) - 1, N - 1)
    for s, step in enumerate(steps, start=1):
        for a, _ in step:
            assert cov[s - 1][a] == frozenset(range(a, min(a + 2 ** (s - 1), N)))
    # every group's share reaches the master exactly once (simulate additive shares)
    vals = np.arange(1, N + 1) * 10
    held = vals.copy()
    for step in steps:
        nxt = held.copy()
        for a, b in step:
            nxt[b] += held[a]
        held = nxt
    assert held[0] == vals.sum()


def test_bad_n():
    with pytest.raises(ValueError, match="n_groups"):
        aggregation_tree(0)
