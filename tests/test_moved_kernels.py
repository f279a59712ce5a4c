"""The math moved out of ``protocols/`` (issue 26) into the layers that own it: each helper does what the protocol
did inline, its closed-form MAC count equals what its kernel meters, and the protocols still re-export the names
tests and benchmarks import from them.  The simulated numbers themselves are pinned by test_pinned_traces,
test_fig7_identical, the protocols' full/timing comparisons and the DReS-FL/LightSecAgg digests."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.fields import lagrange_coefficients
from fednet.algebra.fixed_point import FixedPoint
from fednet.algebra.meter import MacMeter, charged_alike, matmul
from fednet.algebra.modp import lincomb_mod
from fednet.codes import dresfl, fedvs as fv, lightsecagg as lsa, padded, secagg
from fednet.codes.gram import local_statistics
from fednet.learning import field_models as fm, models

P = 2**31 - 1


def test_charged_alike_runs_once_and_charges_n_times() -> None:
    calls = []

    def step(a, b):
        calls.append(1)
        return matmul(a, b)

    with MacMeter() as m:
        values, macs = charged_alike(4, step, np.ones((2, 3)), np.ones((3, 5)))
    assert len(calls) == 1 and macs == [30] * 4 and m.macs == 120
    assert all(v is values[0] for v in values)


def test_secagg_device_secrets_is_statistics_then_secrets() -> None:
    rng = np.random.default_rng(0)
    fp, X, Y = FixedPoint(48, 24), rng.uniform(-1, 1, (12, 4)), rng.uniform(-1, 1, (12, 3))
    q = secagg.field_prime(48, 24)
    M, G1, phi, psi = secagg.device_secrets(fp, q, X, Y)
    M0, G0 = local_statistics(fp, X, Y)
    phi0, psi0 = secagg.share_secrets(fp, q, M0, G0)
    assert np.array_equal(M, M0) and np.array_equal(G1, G0)
    assert np.array_equal(phi, phi0) and np.array_equal(psi, psi0)
    assert (phi.shape, psi.shape) == secagg.secret_shapes(4, 3)


def test_padded_encoded_shapes_match_the_encoding() -> None:
    assert padded.encoded_shapes(72, 5, 3) == ((5, 5), (5, 5, 3))   # 72 bits: five 16-bit limbs


def test_fedvs_batch_shares_decode_to_the_batch_segments() -> None:
    """The keyed block shares interpolate back to the block's quantised segments (eq. 2), and are reproducible."""
    K, T, N, D, l_x = 2, 1, 5, 2, 6
    rng = np.random.default_rng(1)
    x, rows = rng.uniform(0, 1, (20, 3)), np.array([1, 4, 7])
    seg = fv.batch_segments(x, rows, 10, K, D, l_x, P)
    ref = np.stack([fv.quantize_data(fv.powers(x[k * 10 + rows], D), l_x, P) for k in range(K)])
    assert np.array_equal(seg, ref)
    alphas, betas = fv.default_points(K, T, N)
    with MacMeter() as m:
        shares = fv.batch_data_shares(seg, 12345, rows, T, alphas, betas, P)
    assert m.macs == fv.share_macs(N, K, T, seg[0].size)
    assert np.array_equal(shares, fv.batch_data_shares(seg, 12345, rows, T, alphas, betas, P))
    back = lincomb_mod(lagrange_coefficients(alphas[:K + T], betas[:K], P), shares[:K + T], P)
    assert np.array_equal(back, seg)


def test_fedvs_model_shares_equal_share_model_with_the_same_draws() -> None:
    K, T, N = 2, 1, 4
    alphas, betas = fv.default_points(K, T, N)
    w_bar = fv.quantize_model(np.random.default_rng(2).normal(0, 1, (6, 3)), 8, P, np.random.default_rng(3))
    masks = fv.draw_masks(np.random.default_rng(4), P, T, w_bar.shape)
    with MacMeter() as m:
        got = fv.model_shares(w_bar, masks, K, alphas, betas, P)
    assert np.array_equal(got, fv.share_model(w_bar, K, T, alphas, betas, P, np.random.default_rng(4)))
    assert m.macs == fv.share_macs(N, K, T, w_bar.size)


def test_fedvs_embedding_and_decode_macs_and_the_int64_plain_sum() -> None:
    K, T, N, b, h = 1, 1, 3, 4, 2
    alphas, betas = fv.default_points(K, T, N)
    rng = np.random.default_rng(5)
    widths = [2, 3, 1]
    xs = [fv.quantize_data(rng.uniform(0, 1, (b, w)), 6, P) for w in widths]
    ws = [fv.quantize_model(rng.normal(0, 1, (w, h)), 8, P, rng) for w in widths]
    with MacMeter() as m:
        coded = [fv.coded_embedding(xs, ws, P) for _ in range(N)]
    assert m.macs == N * fv.coded_embedding_macs(b, widths, h)
    with MacMeter() as m:
        fv.decode_embedding_sum(coded, alphas, betas, K, T, P)
    assert m.macs == fv.decode_macs(K, T, b, h)
    assert np.array_equal(fv.plain_sum_int64(iter(xs), ws, P).astype(object), fv.plain_quantized_sum(xs, ws, P))


def test_lightsecagg_probes_meter_the_closed_forms_and_the_dropout_check() -> None:
    N, U, T, d, c = 6, 4, 1, 5, 3
    L = lsa.lsa_piece_length(d * c, U, T)
    with MacMeter() as m:
        lsa.encode_mask_probe(N, U, T, d * c)
    assert m.macs == N * U * L
    with MacMeter() as m:
        lsa.masked_gradient_probe((20, d), (20, c), 4, d, c, 16, 2**32 - 5, U)
    assert m.macs == 2 * 4 * d * c + d * c
    alphas, betas = lsa.default_lsa_points(N, U)
    with MacMeter() as m:
        lsa.unmask_probe(5, alphas[:U], betas, U, T, L, (d, c))
    assert m.macs == (U - T) * U * L + 5 * d * c
    lsa.check_lsa_dropout(10, 8, 1, 0.2)
    with pytest.raises(ValueError, match=r"network.dropout = 0.3 leaves 7 of 10 users .* set U <= 7"):
        lsa.check_lsa_dropout(10, 8, 1, 0.3)


def test_dresfl_checks_and_payload() -> None:
    assert dresfl.parse_prime("2^200-75") == 2**200 - 75 and dresfl.parse_prime(" 2 ** 7 - 1 ") == 127
    assert dresfl.parse_prime(13) == 13
    with pytest.raises(ValueError, match="p must be an integer or '2\\^a-b'"):
        dresfl.parse_prime("2^x")
    assert dresfl.shard_rows([np.zeros((6, 2)), np.zeros((4, 2))], 2) == [3, 2]
    with pytest.raises(ValueError, match=r"clients \[1\] hold \[5\] rows"):
        dresfl.shard_rows([np.zeros((6, 2)), np.zeros((5, 2))], 2)
    dresfl.check_clients(9, 1, 1, 2)                          # deg(g) = 8, R = 9
    with pytest.raises(ValueError, match="needs N >= deg"):
        dresfl.check_clients(8, 1, 1, 2)
    assert dresfl.share_dataset_macs(5, 2, 1, 3, 4, 2) == 5 * 3 * 3 * 6
    assert dresfl.DataShare(np.zeros((3, 4)), np.zeros((3, 2))).size == 18


def test_dresfl_decoding_helpers() -> None:
    q = dresfl.DRESFL_PRIME_200
    model = fm.FieldPolyMLP([3, 2, 2], q, weight_bits=4, max_inner=64)
    params = model.init_params(0)
    rng = np.random.default_rng(6)
    X, Y = [rng.uniform(0, 1, (4, 3)) for _ in range(2)], [rng.integers(0, 2, 4) for _ in range(2)]
    data = fm.global_datasets(model, X, Y, [2, 2], 2)
    assert len(data) == 2 and data[0][0].shape == (4, 3)
    assert np.array_equal(data[1][0], model.transform(np.concatenate([X[0][2:], X[1][2:]])))
    gs = [model.integer_gradient(params, x, y, transformed=True) for x, y in data]
    total = fm.sum_over_k(gs, list(params))
    assert all(np.array_equal(total[n], gs[0][n] + gs[1][n]) for n in params)
    decoded = [{n: np.asarray(g[n], dtype=object) % q for n in params} for g in gs]   # field elements of gs
    dresfl.check_decoded(decoded, gs, q, list(params), what="round 1")
    flat = fm.decoded_sum(decoded, q, list(params))
    assert flat.shape == (sum(np.asarray(v).size for v in params.values()),)
    decoded[1]["b1"] = (decoded[1]["b1"] + 1) % q
    with pytest.raises(AssertionError, match=r"round 1: decoded global gradient 1 differs .* in \['b1'\]"):
        dresfl.check_decoded(decoded, gs, q, list(params), what="round 1")
    with MacMeter() as probe:
        model.field_gradient_probe(params, 5)
    with MacMeter() as real:
        model.field_gradient(params, np.ones((5, 3), np.int64), np.ones((5, 2), np.int64))
    assert probe.macs == real.macs > 0


def test_protocols_still_export_what_tests_and_benchmarks_import() -> None:
    from fednet.protocols import codedpaddedfl, codedsecagg, conventional, lightsecagg

    assert conventional.minibatch_gradients is models.minibatch_gradients
    assert conventional.sum_gradients is models.sum_gradients and conventional.STACK_BYTES == models.STACK_BYTES
    assert lightsecagg.mask_upload is lsa.mask_upload and lightsecagg.unmask_aggregate is lsa.unmask_aggregate
    assert lightsecagg.minibatch_gradient is models.minibatch_gradient
    assert codedsecagg.share_secrets is secagg.share_secrets and codedsecagg.device_share is secagg.device_share
    assert codedpaddedfl.local_statistics is local_statistics
