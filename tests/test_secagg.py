"""SecAgg (Bonawitz et al., CCS 2017) and SecAgg+ (Bell et al., CCS 2020): exact unmasking, dropouts, costs, privacy.

Closed forms checked here (per epoch, no dropouts, ``N`` users each with ``n`` neighbours -- ``n = N - 1`` in
SecAgg, ``n = k`` in SecAgg+ on the k-regular Harary graph --, threshold ``t``, ``m = d c`` inputs, ``K =
ceil(32 / floor((bitlen(p) - 1) / 8))`` field elements per 32-byte secret, ``e = ceil(bitlen(p) / 8)`` bytes an
element, shares of ``S = 8 + 2 K e`` plaintext bytes, ciphertexts of ``S + 16`` bytes; Bonawitz et al., Sec. 4
/ Fig. 4 and Sec. 7.1 (each user O(n) key agreements and O(m n) PRG work; the server O(m n^2) with dropouts)):

- devices, crypto: ``2 N`` key generations (round 0), ``2 n N`` key agreements (``c_uv`` in round 1, reused
  to decrypt in round 3; ``s_uv`` in round 2), ``8 m (n + 1) N`` PRG bytes (self mask and ``n`` pairwise
  masks), ``2 n N`` AEAD messages (encrypt in round 1, decrypt in round 3) of ``S`` bytes each;
- server, crypto: ``8 m N`` PRG bytes (the self masks of ``U3``) and ``P = sum_{v dropped after round 1, before
  round 2} |N(v) ∩ U3|`` key agreements plus ``8 m P`` PRG bytes;
- bits up: ``N (2 * 256 + n (S + 16) 8 + m ceil(log2 p) + n K ceil(log2 p))``;
  bits down: ``N (2 n 256 + n (S + 16) 8 + 32 m + 32 N)`` (keys, forwarded ciphertexts, float32 model, U3);
- device MACs: ``sum_i (2 b_i m) + N (m (n + 1) + 2 n t K)`` plus the MAC-equivalents of each step's
  operations (``fednet.algebra.crypto_meter``).
"""

from __future__ import annotations

import itertools
import math
import os

import networkx as nx
import numpy as np
import pytest
from scipy.stats import chi2_contingency, chisquare

import fednet.codes.pairwise_masks as pm
from factories import make_sim, make_task
from fednet.algebra.crypto import aead_decrypt, aead_encrypt, aead_nonce, prg_field, x25519_agree, x25519_keypair
from fednet.algebra.crypto_meter import (HOST_CRYPTO_RATES, REFERENCE_MAC_RATE, CryptoCounts, CryptoMeter,
                                         CryptoRates, run_crypto)
from fednet.algebra.meter import MacMeter
from fednet.errors import CapacityError, ConfigError
from fednet.codes.lightsecagg import quantised_gradient
from fednet.protocol.modes import Full, Timing
from fednet.protocols.conventional import ConventionalFL
from fednet.protocols.lightsecagg import LightSecAgg
from fednet.protocols.secagg import SecAgg, SecAggConfig, SecAggPlus, SecAggPlusConfig
from fednet.sim.compute import BernoulliDropout, Deterministic
from fednet.sim.simulation import Simulation
from fednet.testing import check_engine
from fednet.topologies.lte import lte_star

P = 2**32 - 5
ALPHA = 1e-4


# -- the crypto meter and kernels ----------------------------------------------------------------------------------
def test_kernels_are_real_and_counted():
    with CryptoMeter() as outer:
        a, b = x25519_keypair(os.urandom(32)), x25519_keypair(os.urandom(32))
        assert x25519_agree(a[0], b[1]) == x25519_agree(b[0], a[1])           # KA.agree is symmetric
        seed = os.urandom(32)
        r = prg_field(seed, 1000, P)
        assert np.array_equal(r, prg_field(seed, 1000, P)) and r.min() >= 0 and r.max() < P
        ct = aead_encrypt(seed, aead_nonce(1, 2, 3), b"share")
        assert aead_decrypt(seed, aead_nonce(1, 2, 3), ct) == b"share" and len(ct) == 5 + 16
        with pytest.raises(Exception):                                          # forged: InvalidTag
            aead_decrypt(seed, aead_nonce(1, 2, 3), ct[:-1] + bytes([ct[-1] ^ 1]))
    assert outer.counts == CryptoCounts(key_generations=2, key_agreements=2, prg_bytes=16000, aead_messages=2,
                                        aead_bytes=10)


def test_rates_scale_with_the_mac_rate_and_give_node_independent_mac_equivalents():
    c = CryptoCounts(key_agreements=10, prg_bytes=10**6)
    host = HOST_CRYPTO_RATES.seconds(c)
    device = HOST_CRYPTO_RATES.for_mac_rate(REFERENCE_MAC_RATE / 100)
    assert device.seconds(c) == pytest.approx(100 * host)
    eq = HOST_CRYPTO_RATES.mac_equivalents(c)
    assert eq == round(REFERENCE_MAC_RATE * host)
    assert eq / (REFERENCE_MAC_RATE / 100) == pytest.approx(device.seconds(c))    # E / tau = the node's seconds
    with pytest.raises(ValueError, match="key_agreements"):
        CryptoRates(1.0, 0.0, 1.0, 1.0, 1.0)


def test_run_crypto_checks_the_closed_form_in_full_mode_and_charges_it_in_timing():
    seed = os.urandom(32)
    for mode in (Full(), Timing()):
        tally = []
        with MacMeter() as mm, CryptoMeter() as cm:
            run_crypto(mode, lambda: prg_field(seed, 10, P), crypto=CryptoCounts(prg_bytes=80), macs=0,
                       tally=tally.append)
        assert cm.counts == CryptoCounts(prg_bytes=80) and tally == [cm.counts]
        assert mm.macs == HOST_CRYPTO_RATES.mac_equivalents(cm.counts) > 0
    with pytest.raises(AssertionError, match="closed form"):
        run_crypto(Full(), lambda: prg_field(seed, 10, P), crypto=CryptoCounts(prg_bytes=8), macs=0)


# -- the math: every subset of a small N ------------------------------------------------------------------------------
def _setup(N, t, p, m, rng, nbrs):
    keys = {u: pm.advertise(os.urandom(32), os.urandom(32)) for u in range(N)}
    seeds = {u: os.urandom(32) for u in range(N)}
    x = {u: rng.integers(0, p, m) for u in range(N)}
    return keys, seeds, x


@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_decoded_sum_is_exact_for_every_dropout_pattern(graph):
    """Every U2 (dropped after round 0-1), U3 (after round 2), U4 (after round 3) with enough shares: SecAgg's
    complete graph on N = 5, SecAgg+'s 3-regular Harary graph on N = 6; both with t = 2."""
    N = 5 if graph == "complete" else 6
    t, p, m, epoch = 2, P, 6, 1
    rng = np.random.default_rng(0)
    nbrs = ({u: [v for v in range(N) if v != u] for u in range(N)} if graph == "complete"
            else {u: sorted(nx.hkn_harary_graph(3, N).neighbors(u)) for u in range(N)})
    keys, seeds, x = _setup(N, t, p, m, rng, nbrs)
    c_pks, s_pks = {u: keys[u][1] for u in range(N)}, {u: keys[u][3] for u in range(N)}
    checked = failed = 0
    subsets = lambda s, lo: itertools.chain.from_iterable(itertools.combinations(s, r) for r in range(lo, len(s) + 1))
    for U2 in subsets(range(N), 1):
        in2 = set(U2)
        sent, ck = {}, {}
        for u in U2:
            sent[u], ck[u] = pm.share_keys(u, seeds[u], keys[u][2], keys[u][0], nbrs[u], c_pks, t, p, rng, epoch)
        nb2 = {u: [v for v in nbrs[u] if v in in2] for u in U2}
        for U3 in subsets(U2, 1):
            y = {u: pm.masked_input(x[u], u, seeds[u], keys[u][2], nb2[u], s_pks, p) for u in U3}
            for U4 in subsets(U3, 1):
                resp = {u: pm.unmask_response(u, {v: sent[v][u] for v in nb2[u]}, ck[u], set(U3), p, epoch)
                        for u in U4}
                holders = {v: [u for u in U4 if v in nb2[u]] for v in U2}
                if any(len(h) < t for h in holders.values()):
                    failed += 1
                    continue
                shares = {v: (holders[v][:t], np.stack([resp[h][1][resp[h][0].index(v)] for h in holders[v][:t]]))
                          for v in U2}
                with MacMeter() as mm, CryptoMeter() as cm:
                    z = pm.unmask(y, shares, nb2, s_pks, t, p)
                pairs = pm.expected_pairs(U2, U3, nb2)
                assert np.array_equal(z, sum(x[u] for u in U3) % p)
                assert mm.macs == pm.unmask_macs(m, len(U3), len(U2), pairs, t, p)
                assert cm.counts == pm.unmask_counts(m, len(U3), pairs)
                checked += 1
    assert checked > 50 and failed > 0


def test_too_few_shares_cannot_rebuild_a_secret():
    p, t = P, 3
    secret = os.urandom(32)
    v = pm.encode_secret(secret, p)
    assert pm.decode_secret(v, p) == secret
    from fednet.codes.shamir import shamir_share, shamir_reconstruct
    sh = shamir_share(v, 5, t, p, np.random.default_rng(1), points=[2, 3, 5, 7, 11])
    assert pm.decode_secret(shamir_reconstruct(sh[1:4], [3, 5, 7], t, p), p) == secret
    with pytest.raises(ValueError, match="at least"):
        shamir_reconstruct(sh[:2], [2, 3], t, p)


# -- the protocols ------------------------------------------------------------------------------------------------------
class Recording:
    """Mixin: records each update's gradient sum and drops chosen users before chosen rounds."""

    plan: dict = {}

    def stage_dropouts(self, epoch, stage, users):
        return set(self.plan.get((epoch, stage), ())) & set(users)

    def step(self, gradient_sum, m_used):
        self.sums = getattr(self, "sums", {})
        self.sums[self.epoch] = (np.array(gradient_sum, copy=True), np.array(self.theta, copy=True))
        super().step(gradient_sum, m_used)


def _recording(cls, plan):
    return type(f"Rec{cls.__name__}", (Recording, cls), {"plan": plan, "name": f"rec_{cls.name}_{id(plan)}"})


@pytest.mark.parametrize("cls", [SecAgg, SecAggPlus])
def test_dropouts_in_every_round_below_threshold_decode_exactly(cls):
    """Round 0 drops by the availability model; rounds 1, 2 and 3 by a plan; the sum is U3's, exactly."""
    D = 10
    plan = {(1, 1): {3}, (2, 2): {1, 7}, (3, 3): {0, 5}, (4, 1): {2}, (4, 2): {4}, (4, 3): {6}}
    Rec = _recording(cls, plan)
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), 4, availability=BernoulliDropout(0.1))
    proto = Rec(sim, make_task(D=D), dict(t=3) if cls is SecAgg else dict(k=6, t=2))
    rows = proto.run(4)
    for e, row in enumerate(rows[1:], start=1):
        assert not row["decode_failed"]
        absent = set(sim.absent(e))
        gone_before_input = absent | plan.get((e, 1), set()) | plan.get((e, 2), set())
        U3 = [u for u in range(D) if u not in gone_before_input]
        assert row["used"] == " ".join(map(str, U3))
        assert set(map(int, row["dropped"].split())) == absent | set().union(*(plan.get((e, s), set()) for s in (1, 2, 3)))
        rows_e = proto.minibatch_rows_many(proto.devices, [d.state.batch for d in proto.devices], e)
        got, before = proto.sums[e]
        theta = before.astype(np.float32).astype(np.float64)
        want = sum(quantised_gradient(proto.task.X[u], proto.task.Y[u], theta, rows_e[u], 16, P, D) for u in U3)
        assert np.array_equal(got, want)                                # exact: integers times 2**-16
    assert any(sim.absent(e) for e in range(1, 5))                      # the availability model dropped someone


@pytest.mark.parametrize("cls,stage", [(SecAgg, 1), (SecAgg, 2), (SecAgg, 3), (SecAggPlus, 3)])
def test_beyond_threshold_is_a_decode_failure(cls, stage):
    D = 6
    Rec = _recording(cls, {(1, stage): {0, 1, 2, 3}})
    proto = Rec(make_sim(D, seed=2), make_task(D=D), dict(t=3) if cls is SecAgg else dict(k=4, t=3))
    before = proto.theta.copy()
    rows = proto.run(1)
    assert rows[1]["decode_failed"] and rows[1]["used"] == ""
    assert np.array_equal(proto.theta, before)


@pytest.mark.parametrize("cls", [SecAgg, SecAggPlus])
def test_trains_like_conventional_fl(cls):
    """Masks cancel exactly: the same models as LightSecAgg (the same quantised sums), and within the quantisation
    of conventional FL on the same minibatches."""
    D, epochs = 8, 4
    sec = cls(make_sim(D, seed=3), make_task(D=D), {})
    r_sec = sec.run(epochs)
    lsa = LightSecAgg(make_sim(D, seed=3), make_task(D=D), dict(z=1))
    r_lsa = lsa.run(epochs)
    conv = ConventionalFL(make_sim(D, seed=3), make_task(D=D), {})
    r_conv = conv.run(epochs)
    assert np.array_equal(sec.theta, lsa.theta)
    assert [r["accuracy"] for r in r_sec] == [r["accuracy"] for r in r_lsa]
    assert np.allclose(sec.theta, conv.theta, rtol=0, atol=1e-3)
    assert [r["accuracy"] for r in r_sec] == pytest.approx([r["accuracy"] for r in r_conv], abs=0.05)


@pytest.mark.parametrize("cls,params", [(SecAgg, {}), (SecAggPlus, {})])
def test_bits_and_crypto_counts_match_the_closed_forms(cls, params):
    D, d, c = 10, 6, 3
    task = make_task(D=D, d=d, c=c)
    proto = cls(make_sim(D, deterministic=True), task, params)
    rows = proto.run(2)
    cfg = proto.config
    n = proto.degree(cfg, D)
    t = proto.threshold(cfg, D)
    if cls is SecAggPlus:
        assert n == 2 * math.ceil(math.log2(D)) == 8 and t == 5
    else:
        assert n == D - 1 and t == 5
    m, K, e, bits = d * c, pm.secret_elements(P), pm.element_bytes(P), math.ceil(math.log2(P))
    assert (K, e, bits) == (11, 4, 32)
    S = 8 + 2 * K * e
    for row in rows[1:]:
        assert row["bits_up"] == D * (2 * 256 + n * (S + 16) * 8 + m * bits + n * K * bits)
        assert row["bits_down"] == D * (2 * n * 256 + n * (S + 16) * 8 + 32 * m + 32 * D)
        dev = CryptoCounts(key_generations=2 * D, key_agreements=2 * n * D, prg_bytes=8 * m * (n + 1) * D,
                           aead_messages=2 * n * D, aead_bytes=2 * n * D * S)
        srv = CryptoCounts(prg_bytes=8 * m * D)
        assert {k: row[f"device_{k}"] for k in dev.as_dict()} == dev.as_dict()
        assert {k: row[f"server_{k}"] for k in srv.as_dict()} == srv.as_dict()
        eq = HOST_CRYPTO_RATES.mac_equivalents
        per_user = (eq(CryptoCounts(key_generations=2))
                    + eq(CryptoCounts(key_agreements=n, aead_messages=n, aead_bytes=n * S))
                    + eq(CryptoCounts(key_agreements=n, prg_bytes=8 * m * (n + 1)))
                    + eq(CryptoCounts(aead_messages=n, aead_bytes=n * S)))
        batches = [d_.state.batch for d_ in proto.devices]
        assert row["device_macs"] == (sum(2 * b * m for b in batches) + D * (m * (n + 1) + 2 * n * t * K)
                                      + D * per_user)
        assert row["server_macs"] == (D - 1) * m + D * t * K + D * m + eq(srv)


def test_crypto_time_is_in_the_clock():
    """Deterministic compute: slower MAC rates make the key and share rounds slower by the MAC-equivalents."""
    D = 6
    times = {}
    for rate in (1e6, 2e6):
        sim = Simulation(lte_star(D, device_mac_rates=[rate] * D), 1, device_compute=Deterministic())
        times[rate] = SecAgg(sim, make_task(D=D), {}).run(1)[1]["time_s"]
    eq = HOST_CRYPTO_RATES.mac_equivalents(CryptoCounts(key_generations=2))
    assert times[1e6] - times[2e6] > eq / 1e6 - eq / 2e6 > 0.05


@pytest.mark.parametrize("cls", [SecAgg, SecAggPlus])
def test_full_equals_timing_on_every_column(cls):
    D = 10
    rows = {}
    for mode in ("full", "timing"):
        sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.1), 7, availability=BernoulliDropout(0.1))
        rows[mode] = cls(sim, make_task(D=D), dict(mode=mode, stage_dropout=0.1, t=2)).run(4)
    assert rows["full"] == rows["timing"]
    assert any(r["dropped"] for r in rows["full"][1:])


def test_capacity_and_parameters_are_checked_before_training():
    with pytest.raises(CapacityError, match="p"):
        SecAgg(make_sim(8), make_task(D=8), dict(p=65537, quant_bits=16))
    with pytest.raises(ConfigError, match="t must satisfy"):
        SecAgg(make_sim(8), make_task(D=8), dict(t=8))
    with pytest.raises(ConfigError, match="k must be at most"):
        SecAggPlus(make_sim(8), make_task(D=8), dict(k=8))
    with pytest.raises(ValueError, match="prime"):
        SecAggConfig(p=2**32)
    with pytest.raises(ValueError, match="k"):
        SecAggPlusConfig(k=0)


@pytest.mark.parametrize("cls", [SecAgg, SecAggPlus])
def test_reference_equals_backends(cls):
    D = 8
    for mode in ("timing", "full"):
        check_engine(cls, dict(mode=mode, stage_dropout=0.1, t=2), task=make_task(D=D), rounds=2,
                     availability=lambda: BernoulliDropout(0.1))


def test_secrets_do_not_come_from_the_public_seed():
    """Two runs at one public seed and different secret seeds: other keys, the same trace."""
    D = 6
    runs = []
    for secret in (11, 12):
        sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), 3, secret_seed=secret)
        proto = SecAgg(sim, make_task(D=D), {})
        rows = proto.run(1)
        runs.append((rows, [d.state.keys[1] for d in proto.devices]))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] != runs[1][1]


# -- privacy audit ------------------------------------------------------------------------------------------------------
def server_view(x, N, p, M):
    """The masked inputs the server receives from N users with inputs x[u] (M coordinates each, all equal)."""
    keys = {u: pm.advertise(os.urandom(32), os.urandom(32)) for u in range(N)}
    s_pks = {u: keys[u][3] for u in range(N)}
    return [pm.masked_input(np.full(M, x[u], dtype=np.int64), u, os.urandom(32), keys[u][2],
                            [v for v in range(N) if v != u], s_pks, p) for u in range(N)]


def audit(p=257, M=60_000):
    """Two input vectors with the same sum; the server's view of user 0, and of users 0 and 1 together (their
    difference), must be uniform and the same under both: chi-square tests at ALPHA.  Returns the smallest p-value."""
    N = 3
    views = [server_view(x, N, p, M) for x in ([0, 5, 9], [100, 200, 5 + 9 - 300 + 2 * p])]
    ps = []
    for f in (lambda v: v[0], lambda v: (v[0] - v[1]) % p):
        counts = [np.bincount(f(v), minlength=p) for v in views]
        ps.append(chisquare(counts[0]).pvalue)
        table = np.stack(counts)
        ps.append(chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue if (table.sum(axis=0) > 0).sum() > 1
                  else 0.0)
    return min(ps)


def test_privacy_masked_inputs_are_uniform_given_the_sum():
    assert audit() > ALPHA


def test_privacy_mutation_zero_masks_fails_the_audit(monkeypatch):
    monkeypatch.setattr(pm, "prg_field", lambda seed, n, p: np.zeros(n, dtype=np.int64))
    assert audit() < ALPHA


def test_server_receives_shares_of_one_secret_per_user():
    """The server's plaintext view: keys, masked inputs and shares; ciphertexts are only relayed."""
    D = 6
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), 3, record_views=True)
    SecAgg(sim, make_task(D=D), {}).run(1)
    server = sim.nodes[D]
    assert {m.kind for m in server.view} == {"secagg_advertise", "masked_input", "secagg_unmask"}
    assert {m.kind for m in server.relayed} == {"secagg_shares"}
