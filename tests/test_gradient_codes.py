"""Tests of cyclic gradient codes (Tandon et al. ICML 2017; paper Sec. II-C, V-A)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import MacMeter
from fednet.codes.gradient_codes import CyclicGradientCode, assignment_matrix

Q = FixedPoint(48, 24)


def test_reference_test_vector_n3_s1():
    """references.md: B = [[1/2,1,0],[0,1,-1],[1/2,0,1]], one decoding row per straggler."""
    B = np.array([[0.5, 1, 0], [0, 1, -1], [0.5, 0, 1]])
    A = np.array([[0, 1, 2], [1, 0, 1], [2, -1, 0]], dtype=float)
    code = CyclicGradientCode(2, 3, B=B)
    np.testing.assert_array_equal(code.B, B)
    np.testing.assert_allclose(A @ B, np.ones((3, 3)))
    for straggler in range(3):
        F = [i for i in range(3) if i != straggler]
        np.testing.assert_allclose(code.decoding_vector(F), A[straggler, F], atol=1e-12)
        assert np.all(code.decoding_defect(F) == 0)  # dyadic entries: exact in Q<48,24>


def test_assignment_matrix_example_1():
    # paper Example 1 (1-based): Omega = [[1, 2, 3], [2, 3, 1]]
    np.testing.assert_array_equal(assignment_matrix(2, 3), [[0, 1, 2], [1, 2, 0]])
    om = assignment_matrix(4, 7)
    assert om.shape == (4, 7) and np.all(om[0] == np.arange(7))
    with pytest.raises(ValueError, match="alpha must be"):
        assignment_matrix(8, 7)
    with pytest.raises(ValueError, match="D must be"):
        assignment_matrix(1, 0)


@pytest.mark.parametrize("alpha", range(1, 7))
def test_every_responder_set_decodes_D6(alpha):
    D = 6
    code = CyclicGradientCode(alpha, D, np.random.default_rng(alpha))
    # support of row i is column i of Omega (cyclic), alpha entries per row and column
    for i in range(D):
        assert set(np.flatnonzero(code.B[i])) == set(code.Omega[:, i].tolist())
    assert np.all((code.B != 0).sum(axis=0) == alpha)
    assert np.all(code.B[np.arange(D), np.arange(D)] != 0)
    sets = list(itertools.combinations(range(D), D - alpha + 1))
    assert len(code._patterns) == len(sets)  # all checked exhaustively
    for F in sets:
        a = code.decoding_vector(F)
        np.testing.assert_allclose(a @ code.B[list(F)], np.ones(D), atol=1e-6)
        assert np.abs(code.decoding_defect(F)).max() <= code.delta_max
    assert code.delta_max < 1e-6


def test_any_order_and_extra_responders():
    code = CyclicGradientCode(3, 6, np.random.default_rng(0))
    g = np.random.default_rng(1).standard_normal((6, 4, 2))
    P = code.encode(g)
    order = [5, 0, 3, 2, 1]  # 5 results, 4 needed, unsorted
    got = code.decode(order, P[order])
    np.testing.assert_allclose(got, g.sum(axis=0), atol=1e-6)
    with pytest.raises(ValueError, match="at least D - alpha \\+ 1 = 4"):
        code.decode([0, 1, 2], P[:3])
    with pytest.raises(ValueError, match="distinct"):
        code.decoding_vector([0, 0, 1, 2])


def test_decoding_error_within_stated_bound_fixed_point():
    """Devices compute P_i = sum_j b_ij g_j in Q<48,24>; the decode meets error_bound."""
    D, alpha = 10, 5
    code = CyclicGradientCode(alpha, D, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    g = rng.uniform(-2, 2, (D, 50))
    gbar = Q.encode(g)
    P = np.stack([Q.matmul(code.B_bar[i][None, :], gbar)[0] for i in range(D)])  # (D, 50)
    e_max = 2.0**-24  # one floor per exact inner sum
    g_sum = np.abs(Q.decode(gbar)).max(axis=1).sum()
    for trial in range(20):
        F = sorted(rng.choice(D, size=D - alpha + 1, replace=False).tolist())
        a = code.decoding_vector_fixed(F)
        dec = Q.decode(Q.matmul(a[None, :], P[F]))[0]
        err = np.abs(dec - Q.decode(gbar).sum(axis=0)).max()
        assert err <= code.error_bound(g_sum, e_max, F)
    assert err > 0  # the bound is not vacuous: fixed point does make an error


def test_conditioning_measured_and_wider_format_is_exact_to_1e_9():
    """Q<48,24> leaves defects ~1e-4 at D = 25; B in Q<62,48> and a in Q<62,40> reach 1e-10."""
    narrow = CyclicGradientCode(16, 25, np.random.default_rng(0), max_patterns=200)
    wide = CyclicGradientCode(
        16, 25, np.random.default_rng(0), fixed_point=FixedPoint(62, 48),
        a_format=FixedPoint(62, 40), max_patterns=200,
    )
    assert narrow.condition_max > 1e2  # ill-conditioned, as the literature reports
    assert narrow.delta_max > 1e-6
    assert wide.delta_max < 1e-9
    assert wide.condition_max == pytest.approx(narrow.condition_max, rel=1e-3)


def test_replication_and_uncoded_extremes():
    D = 5
    full = CyclicGradientCode(D, D, np.random.default_rng(0))
    np.testing.assert_allclose(full.B, np.ones((D, D)))
    assert full.n_responders == 1
    np.testing.assert_allclose(full.decoding_vector([3]), [1.0])
    none = CyclicGradientCode(1, D, np.random.default_rng(0))
    np.testing.assert_array_equal(none.B, np.eye(D))


def test_encode_decode_metered():
    code = CyclicGradientCode(2, 4, np.random.default_rng(0))
    g = np.ones((4, 3, 2))
    with MacMeter() as m:
        P = code.encode(g)
        code.decode(range(4), P)
    assert m.macs == 4 * 2 * 6 + 3 * 6


def test_invalid_arguments():
    with pytest.raises(ValueError, match="n_draws"):
        CyclicGradientCode(2, 4, np.random.default_rng(0), n_draws=0)
    with pytest.raises(ValueError, match="rng is required"):
        CyclicGradientCode(2, 4)
    with pytest.raises(ValueError, match="B must have shape"):
        CyclicGradientCode(2, 4, B=np.eye(3))
