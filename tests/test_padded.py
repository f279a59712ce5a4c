"""CodedPaddedFL's math (fednet.codes.padded; Schlegel et al., Sec. V, eqs. 6-12).

Each step is checked bit for bit against Python-int arithmetic, and the whole pipeline against
the plain gradient for every straggler pattern.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fednet.algebra.fixed_point import (
    FixedPoint,
    limbs_to_object,
    prepare,
    prepared_from_limbs,
    random_ring_limbs,
)
from fednet.algebra.meter import MacMeter
from fednet.codes.gradient_codes import CyclicGradientCode
from fednet.codes.padded import (
    coded_gradient,
    decode,
    decode_error,
    encode,
    encode_macs,
    encode_prepared,
    encoded_operands,
    epoch_macs,
    local_statistics,
    pack_upper,
    pad,
    remove_pads,
    ring_bits,
    share_elements,
    support,
    unpack_upper,
    unpad_and_decode,
    unpad_and_decode_macs,
)

Q = FixedPoint(48, 24)
W = ring_bits(48, 24, 24)


def _signed(v: int, k: int) -> int:
    v %= 1 << k
    return v - (1 << k) if v >= 1 << (k - 1) else v


def _data(D=5, n=20, d=6, c=2, seed=0):
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.2, 0.2, (n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    return X, Y


# ----------------------------------------------------------------------------- sizes
def test_ring_bits_and_share_elements():
    assert W == 96
    assert ring_bits(32, 16, 8) == 56
    assert share_elements(4, 3) == 10 + 12
    assert share_elements(2000, 10) == 2000 * 2001 // 2 + 20000
    with pytest.raises(ValueError, match="f must lie in \\[0, k = 20\\), got 20"):
        ring_bits(20, 20, 8)
    with pytest.raises(ValueError, match="code_fraction_bits must be >= 0, got -1"):
        ring_bits(48, 24, -1)


def test_pack_unpack_roundtrip():
    a = np.arange(16).reshape(4, 4)
    s = a + a.T
    np.testing.assert_array_equal(pack_upper(s), [0, 5, 10, 15, 10, 15, 20, 20, 25, 30])
    np.testing.assert_array_equal(unpack_upper(pack_upper(s), 4), s)
    batch = np.stack([s, 2 * s])
    np.testing.assert_array_equal(unpack_upper(pack_upper(batch), 4), batch)
    with pytest.raises(ValueError, match="d\\(d\\+1\\)/2"):
        unpack_upper(np.zeros(5), 4)


# ----------------------------------------------------------------------------- bit-exact steps
def test_local_statistics_bit_exact():
    X, Y = _data(D=1, n=30, d=5, c=3, seed=1)
    M, G1 = local_statistics(Q, X[0], Y[0])
    xb = Q.encode(X[0]).astype(object)
    yb = Q.encode(Y[0]).astype(object)
    M_ref = np.vectorize(lambda v: _signed(v >> 24, 48))(xb.T @ xb)
    G_ref = np.vectorize(lambda v: _signed(-(v >> 24), 48))(xb.T @ yb)
    np.testing.assert_array_equal(M, M_ref.astype(np.int64))
    np.testing.assert_array_equal(G1, G_ref.astype(np.int64))
    np.testing.assert_array_equal(M, M.T)


def test_pad_bit_exact_and_pads_from_the_stream():
    X, Y = _data(D=1, d=4, c=2, seed=2)
    M, G1 = local_statistics(Q, X[0], Y[0])
    Phi, Psi, RX, RG = pad(Q, W, M, G1, np.random.default_rng(5))
    Phi2, _, RX2, _ = pad(Q, W, M, G1, np.random.default_rng(5))
    np.testing.assert_array_equal(Phi, Phi2)               # the seed determines the pads
    assert Phi.shape == (6, 10) and Psi.shape == (6, 4, 2)
    mod = 1 << W
    phi, rx = limbs_to_object(Phi), limbs_to_object(RX)
    psi, rg = limbs_to_object(Psi), limbs_to_object(RG)
    ref_phi = (pack_upper(M).astype(object) + rx) % mod
    ref_psi = (G1.astype(object) + rg) % mod
    assert (phi == ref_phi).all() and (psi == ref_psi).all()
    assert all(0 <= int(v) < mod for v in rx.flat)


def test_encode_and_coded_gradient_bit_exact():
    """Eqs. (8), (9) and (11) against Python ints, with the module's dropped-bit rules."""
    rng = np.random.default_rng(3)
    d, c, alpha = 4, 2, 3
    code = CyclicGradientCode(alpha, 5, rng, fixed_point=FixedPoint(48, 24), a_format=Q, n_draws=1)
    members, coef = support(code, 1)
    Phis = [random_ring_limbs((share_elements(d, 0),), W, rng) for _ in members]
    Psis = [random_ring_limbs((d, c), W, rng) for _ in members]
    with MacMeter() as m:
        Cbar, C = encode(coef, Phis, Psis, W, 24, 72)
    assert m.macs == alpha * share_elements(d, c)
    ref_bar = sum(int(b) * limbs_to_object(p) for b, p in zip(coef, Phis)) % (1 << W)
    ref_c = sum(int(b) * limbs_to_object(p) for b, p in zip(coef, Psis)) % (1 << W)
    assert (limbs_to_object(Cbar) == (ref_bar >> 24) % (1 << 72)).all()
    assert (limbs_to_object(C) == (ref_c >> 24) % (1 << 72)).all()
    eps = Q.encode(rng.uniform(-3, 3, (d, c)))
    Cb, Cc = encoded_operands(Cbar, C, d)
    with MacMeter() as m:
        out = coded_gradient(Q, Cb, Cc, prepare(eps))
    assert m.macs == d * d * c                              # Sec. V-D: d^2 c per device and epoch
    full_bar = unpack_upper(limbs_to_object(Cbar), d)
    prod = (full_bar @ eps.astype(object)) % (1 << 72)
    ref = np.vectorize(lambda a, b: _signed(a + (b >> 24), 48))(limbs_to_object(C), prod)
    np.testing.assert_array_equal(out, ref.astype(np.int64))


def test_remove_pads_and_decode_bit_exact():
    rng = np.random.default_rng(4)
    code = CyclicGradientCode(2, 4, rng, a_format=Q, n_draws=1)
    P = Q.encode(rng.uniform(-5, 5, (3, 3, 2)))
    pads = Q.encode(rng.uniform(-5, 5, (3, 3, 2)))
    sent = Q.add(P, pads)
    np.testing.assert_array_equal(remove_pads(Q, sent, pads), P)
    responders = [2, 0, 3]
    with MacMeter() as m:
        G = decode(Q, code, responders, P)
    assert m.macs == 3 * 3 * 2
    a = code.decoding_vector_fixed(sorted(responders)).astype(object)
    order = np.argsort(responders)
    acc = np.tensordot(a, P[order].astype(object), axes=1)
    ref = np.vectorize(lambda v: _signed(v >> 24, 48))(acc).astype(np.int64)
    np.testing.assert_array_equal(G, Q.decode(ref))


def test_support_is_the_column_of_omega():
    code = CyclicGradientCode(3, 5, np.random.default_rng(0), n_draws=1)
    members, coef = support(code, 4)
    np.testing.assert_array_equal(members, [4, 0, 1])      # omega_1i = i, then cyclic
    np.testing.assert_array_equal(coef, code.B_bar[4, [4, 0, 1]])
    assert np.count_nonzero(code.B_bar[4]) == 3
    with pytest.raises(ValueError, match="local must lie in \\[0, 5\\), got 5"):
        support(code, 5)


# ----------------------------------------------------------------------------- the pipeline
def one_epoch(D=5, alpha=3, d=6, c=2, seed=0, theta_scale=3.0):
    """Pads, shares, encoding and every device's unpadded coded gradient of one epoch."""
    rng = np.random.default_rng(seed)
    X, Y = _data(D=D, d=d, c=c, seed=seed)
    out = Q.k + Q.f
    code = CyclicGradientCode(alpha, D, rng, a_format=Q)
    stats = [local_statistics(Q, x, y) for x, y in zip(X, Y)]
    padded = [pad(Q, W, M, G1, rng) for M, G1 in stats]
    theta = rng.uniform(-theta_scale, theta_scale, (d, c))
    eps = Q.encode(theta)
    P = []
    for i in range(D):
        sup, coef = support(code, i)
        Cbar, C = encode(coef, [padded[j][0] for j in sup], [padded[j][1] for j in sup], W, 24, out)
        Rbar, R = encode(coef, [padded[j][2] for j in sup], [padded[j][3] for j in sup], W, 24, out)
        sent = coded_gradient(Q, *encoded_operands(Cbar, C, d), eps)
        pad_part = coded_gradient(Q, prepared_from_limbs(unpack_upper(Rbar, d)), R, eps)
        P.append(remove_pads(Q, sent, pad_part))
    return (X, Y), code, stats, theta, eps, np.stack(P)


def test_decoded_gradient_equals_plain_for_every_straggler_pattern():
    """One epoch, D = 5, alpha = 3: every responder set decodes X^T(X Theta - Y) within the bound."""
    D, alpha = 5, 3
    (X, Y), code, stats, theta, eps, P = one_epoch(D, alpha)
    e = Q.decode(eps)
    plain_real = sum(x.T @ (x @ e - y) for x, y in zip(X, Y))
    for F in itertools.combinations(range(D), D - alpha + 1):
        for order in (list(F), list(reversed(F))):
            G = decode(Q, code, order, P[order])
            err, bound = decode_error(Q, code, order, G, eps, stats)
            assert 0 < err <= bound < 1e-4
            # against the real-valued gradient: data quantisation (2^-25 per entry) adds ~1e-6
            assert np.abs(G - plain_real).max() < 1e-4


def test_decode_error_detects_a_wrong_gradient():
    D, alpha = 4, 2
    (X, Y), code, stats, theta, eps, P = one_epoch(D, alpha, seed=1)
    F = [0, 1, 2]
    G = decode(Q, code, F, P[F])
    _, bound = decode_error(Q, code, F, G, eps, stats)
    G_bad = G.copy()
    G_bad[0, 0] += 10 * bound
    err, _ = decode_error(Q, code, F, G_bad, eps, stats)
    assert err > bound


def test_pads_hide_the_shared_data():
    """Phi and Psi are uniform ring elements: two data sets give the same distribution."""
    rng = np.random.default_rng(3)
    M = Q.encode(np.eye(3))
    G1 = Q.encode(np.ones((3, 2)))
    phi, psi, RX, RG = pad(Q, W, M, G1, rng)
    assert phi.shape == (6, 6) and psi.shape == (6, 3, 2)   # ceil(96/16) limbs
    assert not np.array_equal(phi, RX)
    # top-limb means of many pads of a zero and of a large secret agree (uniform residues)
    means = []
    for secret in (0, 2**40):
        tops = [pad(Q, W, np.full((3, 3), secret), G1, rng)[0][-1] for _ in range(400)]
        means.append(np.mean(tops))
    assert abs(means[0] - means[1]) < 0.05 * 2**16


def test_closed_form_macs_match_the_metered_kernels():
    """encode_macs, epoch_macs and unpad_and_decode_macs (what timing mode charges) equal the meters."""
    D, alpha, d, c = 5, 3, 6, 2
    rng = np.random.default_rng(6)
    X, Y = _data(D=D, d=d, c=c, seed=6)
    code = CyclicGradientCode(alpha, D, rng, a_format=Q, n_draws=1)
    padded = [pad(Q, W, *local_statistics(Q, x, y), rng) for x, y in zip(X, Y)]
    enc, pads = [], []
    for i in range(D):
        sup, coef = support(code, i)
        with MacMeter() as m:
            enc.append(encode_prepared(coef, [padded[j][0] for j in sup], [padded[j][1] for j in sup], W, 24, 72, d))
        assert m.macs == encode_macs(alpha, d, c)
        pads.append(encode_prepared(coef, [padded[j][2] for j in sup], [padded[j][3] for j in sup], W, 24, 72, d))
    eps = Q.encode(rng.uniform(-1, 1, (d, c)))
    with MacMeter() as m:
        sent = [coded_gradient(Q, Cbar, C, eps) for Cbar, C in enc]
    assert m.macs == D * epoch_macs(d, c)
    F = [4, 1, 2]
    with MacMeter() as m:
        G = unpad_and_decode(Q, code, F, [sent[i] for i in F], [pads[i] for i in F], eps)
    assert m.macs == unpad_and_decode_macs(3, d, c)
    P = np.stack([remove_pads(Q, sent[i], coded_gradient(Q, *pads[i], eps)) for i in F])
    np.testing.assert_array_equal(G, decode(Q, code, F, P))
