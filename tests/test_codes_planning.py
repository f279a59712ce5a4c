"""The accounting rules, group planning and checks that CodedPaddedFL and CodedSecAgg take from
:mod:`fednet.codes.padded` and :mod:`fednet.codes.secagg` (Schlegel et al., Sec. V-D, V-E, VI-D, Remark 3)."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.fields import uniform
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import MacMeter, charge
from fednet.algebra.modp import PreparedMatrix
from fednet.codes import padded, secagg
from fednet.codes.gram import local_statistics


def test_encode_charge_counts_alpha_minus_1_terms():
    """Sec. V-D: the paper charges (alpha - 1) of the alpha metered terms per shared element."""
    for count, want in [("alpha", 300), ("alpha_minus_1", 200)]:
        with MacMeter() as m:
            with padded.encode_charge(3, count):
                charge(300)
        assert m.macs == want
    with pytest.raises(ValueError, match="encode_count must be"):
        padded.encode_charge(3, "alpha_plus_1")


def test_sharing_steps_follow_the_rows_of_omega():
    """Step r delivers to device i of each group the data of device Omega[r, i] (Sec. V-A)."""
    q = FixedPoint(48, 24)
    groups = [[0, 1, 2, 3], [4, 5, 6]]
    codes = padded.group_codes(3, [4, 3], [np.random.default_rng(g) for g in range(2)], q, 24, 1, search=False)
    steps = padded.sharing_steps(3, groups, codes, [0, 1])
    assert len(steps) == 2 and all(len(step) == 7 for step in steps)
    for r, step in enumerate(steps, start=1):
        for g, members in enumerate(groups):
            for local, dev in enumerate(members):
                assert (members[codes[g].Omega[r, local]], dev) in step
    assert padded.sharing_steps(3, groups, codes, [1])[0] == [(4 + codes[1].Omega[1, i], 4 + i) for i in range(3)]
    assert padded.sharing_steps(1, groups, codes, [0]) == []


def test_padded_statistics_are_local_statistics_then_pads():
    q, rng = FixedPoint(48, 24), np.random.default_rng(0)
    X, Y = rng.normal(size=(7, 4)), rng.normal(size=(7, 2))
    out = padded.padded_statistics(q, 96, X, Y, np.random.default_rng(5))
    M, G1 = local_statistics(q, X, Y)
    assert np.array_equal(out[0], M) and np.array_equal(out[1], G1)
    for a, b in zip(out[2:], padded.pad(q, 96, M, G1, np.random.default_rng(5))):
        assert np.array_equal(a, b)
    assert [a.shape for a in out] == list(padded.padded_statistics_shapes(96, 4, 2))


def test_padded_group_checks_name_the_parameter():
    padded.check_groups(3, [3, 4])
    with pytest.raises(ValueError, match=r"alpha must be at most the smallest group size \(3 with 2 groups of 7"):
        padded.check_groups(4, [4, 3])
    padded.check_dropout(2, [4, 4], 0.25)                  # 3 of 4 on average, 3 needed
    with pytest.raises(ValueError, match="leaves 2.8 of the 4 devices of group 0"):
        padded.check_dropout(2, [4, 4], 0.3)


def test_field_primes_of_remark_3():
    assert secagg.field_prime(48, 24) == 2**72 + 15
    assert secagg.field_prime(48, 24, "largest_below") == 2**72 - 93
    with pytest.raises(ValueError, match="field_prime must be"):
        secagg.field_prime(48, 24, "nearest")


def test_secagg_closed_forms_match_the_metered_kernels():
    q, d, c = secagg.field_prime(16, 8), 5, 3
    rng = np.random.default_rng(1)
    Phi = PreparedMatrix(uniform(rng, q, (d, d)), q, rhs_bits=16)
    Psi, part = uniform(rng, q, (d, c)), uniform(rng, q, (d, c))
    eps = rng.integers(-2**15, 2**15, (d, c))
    with MacMeter() as m:
        share = secagg.device_share(Phi, Psi, eps, q)
    assert m.macs == secagg.device_share_macs(d, c) == d * d * c + d * c
    with MacMeter() as m:
        secagg.add_shares(share, part, q)
    assert m.macs == secagg.add_macs(d, c) == d * c
    assert secagg.share_size(d, c) == 15 + 15 and secagg.combine_macs(4, 30) == 90
    assert secagg.decode_macs(3, d, c) == 45


def test_widened_charges_ceil_k_plus_f_over_k():
    """Remark 3: integer work in Z_<k+f> costs (k + f)/k times the k-bit work, rounded up."""
    for on, want in [(False, 100), (True, 150)]:
        with MacMeter() as m:
            with secagg.widened(48, 24, on):
                charge(100)
        assert m.macs == want
    with MacMeter() as m:
        with secagg.widened(48, 24, True):
            charge(3)
    assert m.macs == 5                                       # ceil(4.5)


def test_secagg_group_checks_name_the_parameter():
    q = secagg.field_prime(48, 24)
    secagg.check_groups(6, 2, 2, q, 1)
    with pytest.raises(ValueError, match=r"groups must divide the number of devices \(6\), got 4"):
        secagg.check_groups(6, 4, 2, q, 1)
    with pytest.raises(ValueError, match="every group needs at least k_prime = 3 devices; groups = 3 gives 2"):
        secagg.check_groups(6, 3, 3, q, 2)
    with pytest.raises(ValueError, match="z must satisfy"):
        secagg.check_groups(6, 2, 2, q, 2)
    secagg.check_dropout(8, 2, 2, 0.25)                      # 4 * 0.75^2 = 2.25 complete columns
    with pytest.raises(ValueError, match="leaves 1.96 of 4 share columns complete"):
        secagg.check_dropout(8, 2, 2, 0.3)
