"""FedVS and its baselines on the engine (tiny synthetic vertical task, seconds)."""

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.codes import fedvs as fv
from fednet.learning.vertical import VerticalData, as_learning_task
from fednet.protocol import registry
from fednet.sim import Deterministic, Simulation
from fednet.topologies.lte import lte_star

N = 7


def _task(n=N, M=120, d=3, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(0, 1, size=(M + 40, d)) for _ in range(n)]
    y = (sum(x[:, 0] for x in xs) > n / 2).astype(np.int64) + 2 * (xs[0][:, 1] > 0.5)
    data = VerticalData([x[:M] for x in xs], y[:M], [x[M:] for x in xs], y[M:], 4, "synthetic")
    return as_learning_task(data)


def _sim(n=N, seed=3, secret_seed=None):
    g = lte_star(n, uplink_bps=300e6, downlink_bps=300e6, loss=0.0, header_overhead=0.0, server_mac_rate=1e10,
                 device_mac_rates=[1e8] * n)
    return Simulation(g, seed, device_compute=Deterministic(), record_views=False, secret_seed=secret_seed)


BASE = {"embedding": 4, "hidden": [8, 8], "batch_size": 16, "lr_client": 0.5, "lr_server": 0.5}


def test_fedvs_decodes_exactly_every_round_from_the_first_threshold_uploads():
    proto = registry.get("fedvs")(_sim(), _task(), dict(BASE, K=2, T=1))
    trace = proto.run(4)
    assert [r["checked_rounds"] for r in trace] == [0, 1, 2, 3, 4]
    for r in trace[1:]:
        assert len(r["used"].split()) == fv.recovery_threshold(2, 1) == 5
        assert not r["decode_failed"]
    assert all(b["time_s"] > a["time_s"] for a, b in zip(trace, trace[1:]))
    # the first 5 uploads come mostly from the non-stragglers (clients 0-3 have mean 0.1 s, 4-6 2+4i/7 s)
    fast = sum(int(i) < 4 for r in trace[1:] for i in r["used"].split())
    assert fast >= 4 * 4


def test_setup_charges_the_metered_encoding_count_and_sends_shares_of_bits_p():
    task = _task()
    proto = registry.get("fedvs")(_sim(), task, dict(BASE, K=2, T=1))
    trace = proto.run(0)
    M2 = 120 // 2
    # what share_data meters for one client, times N clients
    with MacMeter() as m:
        fv.share_data(np.zeros((120, 3), np.int64), 2, 1, *fv.default_points(2, 1, N), 2**31 - 1,
                      np.random.default_rng(0))
    assert trace[0]["device_macs"] == N * m.macs == N * (N * 3 * M2 * 3)
    # each client uploads its N-1 shares of (M/K) x d elements at 31 bits; the server forwards as many
    assert trace[0]["bits_up"] == N * (N - 1) * M2 * 3 * 31


def test_too_few_uploads_by_the_deadline_is_a_recorded_decode_failure():
    proto = registry.get("fedvs")(_sim(), _task(), dict(BASE, K=3, T=1, deadline=1e-4))
    before = [w.copy() for w in proto.model.W]
    trace = proto.run(2)
    assert [r["decode_failed"] for r in trace] == [False, True, True]
    assert all(len(r["used"].split()) < fv.recovery_threshold(3, 1) for r in trace[1:])
    assert all(np.array_equal(a, b) for a, b in zip(before, proto.model.W))      # no update


def test_configuration_is_refused_with_names():
    with pytest.raises(ValueError, match=r"2\(K\+T-1\)\+1 = 9 clients"):
        registry.get("fedvs")(_sim(), _task(), dict(BASE, K=4, T=1))
    with pytest.raises(fv.FieldTooSmall, match="smallest sufficient prime"):
        registry.get("fedvs")(_sim(), _task(), dict(BASE, p=65537)).run(0)


def test_wait_ignore_use_all_and_the_fast_half_and_see_the_same_delays():
    tw = registry.get("fedvs_wait")(_sim(), _task(), BASE).run(3)
    ti = registry.get("fedvs_ignore")(_sim(), _task(), BASE).run(3)
    assert all(r["used"] == "0 1 2 3 4 5 6" for r in tw[1:])
    assert all(len(r["used"].split()) == N - N // 2 for r in ti[1:])
    # paired delays: Ignore's rounds end before Wait's (the same keyed delays, fewer awaited)
    assert ti[1]["time_s"] < tw[1]["time_s"]
    td = registry.get("fedvs_wait_dp")(_sim(), _task(), BASE).run(3)
    # the same delays; only the noise layer's MACs (2 per element) add compute time
    assert [r["time_s"] for r in td] == pytest.approx([r["time_s"] for r in tw], rel=1e-5)
    assert all(a["time_s"] > b["time_s"] for a, b in zip(td[1:], tw[1:]))


def test_vafl_records_one_update_per_arrival():
    proto = registry.get("fedvs_vafl")(_sim(), _task(), BASE)
    trace = proto.run(3)
    updates = [r for r in trace if r["event"] == "update"]
    assert len(updates) == 3 * N
    assert all(len(r["used"].split()) == 1 for r in updates)
    times = [r["time_s"] for r in updates]
    assert times == sorted(times)
    # asynchronous: the fast clients iterate more often than the stragglers
    counts = np.bincount([int(r["used"]) for r in updates], minlength=N)
    assert counts[:4].sum() > counts[4:].sum()
    assert [r["event"] for r in trace if r["event"] != "update"] == ["phase", "round", "round", "round"]


def test_wait_dp_noise_is_laplace_with_the_stated_scale():
    """Rows clipped to L1 norm C, then Laplace(2C / epsilon) per coordinate (Thapa et al.; module docstring)."""
    proto = registry.get("fedvs_wait_dp")(_sim(), _task(M=4000), dict(BASE, embedding=16, epsilon=5.0, dp_clip=0.5))
    proto.epoch = 1
    rows = np.arange(4000)
    dev = proto.devices[2]
    clean = proto.model.embedding(2, rows)
    clipped = clean * np.minimum(1.0, 0.5 / np.abs(clean).sum(axis=1, keepdims=True))
    noise = proto.embed(dev, rows) - clipped
    b = 2 * 0.5 / 5.0
    assert abs(np.abs(noise).mean() / b - 1) < 0.02          # E|Laplace(b)| = b; 64000 draws: s.e. 0.4 %
    assert abs(noise.std() / (np.sqrt(2) * b) - 1) < 0.03
    assert np.abs(clipped).sum(axis=1).max() <= 0.5 + 1e-12


@pytest.mark.parametrize("K,T,wait", [(1, 1, "all"), (2, 1, "all"), (2, 2, "own"), (1, 2, "own")])
def test_timing_mode_trace_equals_full_mode_bit_for_bit(K, T, wait):
    """Timing mode skips the LCC encodings, coded embeddings and interpolation; everything else is identical."""
    cfg = dict(BASE, K=K, T=T, sharing_wait=wait)
    full = registry.get("fedvs")(_sim(secret_seed=5), _task(), dict(cfg, mode="full"))
    tf = full.run(5)
    timing = registry.get("fedvs")(_sim(secret_seed=5), _task(), dict(cfg, mode="timing"))
    tt = timing.run(5)
    assert [r["checked_rounds"] for r in tf] == [0, 1, 2, 3, 4, 5]             # full mode verified every round
    assert [r["checked_rounds"] for r in tt] == [0] * 6                         # timing mode has no observer
    assert [{k: v for k, v in r.items() if k != "checked_rounds"} for r in tt] == \
        [{k: v for k, v in r.items() if k != "checked_rounds"} for r in tf]
    assert all(np.array_equal(a, b) for a, b in zip(full.model.W, timing.model.W))
    assert tt[-1]["device_macs"] > 0 and tt[-1]["server_macs"] > 0
    assert len({r["accuracy"] for r in tt}) > 1 or len({r["loss"] for r in tt}) > 1      # the model moves


def test_timing_mode_differs_from_full_mode_only_in_skipped_math():
    """A different secret seed changes the stochastic rounding: timing mode must not follow a fixed trajectory."""
    a = registry.get("fedvs")(_sim(secret_seed=5), _task(), dict(BASE, K=2, T=1, mode="timing")).run(3)
    b = registry.get("fedvs")(_sim(secret_seed=6), _task(), dict(BASE, K=2, T=1, mode="timing")).run(3)
    assert [r["time_s"] for r in a] == [r["time_s"] for r in b]                 # delays are public, keyed
    assert [r["loss"] for r in a[1:]] != [r["loss"] for r in b[1:]]            # rounding is secret


def test_sharing_wait_own_does_not_wait_for_the_stragglers_sharing_delays():
    """'all': every client waits for the slowest sharer; 'own': only its own delay (module docstring)."""
    sim_all, sim_own = _sim(secret_seed=5), _sim(secret_seed=5)
    p_all = registry.get("fedvs")(sim_all, _task(), dict(BASE, K=1, T=1, sharing_wait="all", mode="timing"))
    p_own = registry.get("fedvs")(sim_own, _task(), dict(BASE, K=1, T=1, sharing_wait="own", mode="timing"))
    t_all, t_own = p_all.run(4), p_own.run(4)
    d = p_all.learning.delays
    b = p_all.coded_batch
    for r in range(1, 5):
        dt_all = t_all[r]["time_s"] - t_all[r - 1]["time_s"]
        dt_own = t_own[r]["time_s"] - t_own[r - 1]["time_s"]
        slowest = max(d.sharing_delay(n, r, b) for n in range(N))
        used = [int(i) for i in t_own[r]["used"].split()]
        # 'all': the round lasts at least the slowest sharing delay plus the threshold-th upload delay
        assert dt_all >= slowest
        # 'own': the round lasts at least (sharing + upload delay) of the last responder, and less than 'all'
        assert dt_own >= max(d.sharing_delay(n, r, b) + d.upload_delay(n, r) for n in used) - 1e-12
        assert dt_own < dt_all
    assert d.sharing_mean(N - 1, b) == pytest.approx(np.log2(N) ** 2 / b * d.upload_means[N - 1])
