"""DReS-FL on the engine (Shao et al., Alg. 1): exactness, modes, threshold, paired dropouts, privacy audit."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from factories import make_task
from fednet.codes.dresfl import DRESFL_PRIME_200
from fednet.protocol import registry
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.dropout import ExtremeDropout, PerClientDropout
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

CFG = {"hidden": [3, 3], "batch_size": 8, "weight_bits": 4}          # deg(g) = 8, R = 9 with K = T = 1


def _run(D=10, seed=3, rounds=4, availability=None, task=None, **cfg):
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), seed,
                     availability=availability or PerClientDropout([0.05] * D))
    proto = registry.get("dresfl")(sim, task or make_task(D=D, n=20, d=6, c=3), {**CFG, **cfg})
    proto.run(rounds)
    return proto


def test_full_and_timing_agree_and_decode_exactly():
    """Full mode decodes every round bit for bit (its observer raises otherwise); timing mode gives the
    same times, traffic, MACs and parameters without the coded data."""
    full, timing = _run(mode="full"), _run(mode="timing")
    cols = ["time_s", "bits_up", "bits_down", "device_macs", "server_macs", "used", "decode_failed"]
    assert [[r[c] for c in cols] for r in full.trace] == [[r[c] for c in cols] for r in timing.trace]
    for k in full.params:
        assert np.array_equal(np.asarray(full.params[k]), np.asarray(timing.params[k]))
    assert full.decoded_rounds == 4
    # one-time sharing: N (N - 1) shares of (m_i / K)(d_x + d_y) elements of 200 bits each
    assert full.trace[0]["bits_up"] == 10 * 9 * 20 * (6 + 3) * 200
    assert full.trace[1]["bits_up"] == full.R * full.learning.n_params * 200      # the first R uploads


def test_observer_catches_a_wrong_decode(monkeypatch):
    from fednet.protocols import dresfl

    real = dresfl.decode_gradients

    def corrupt(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0]["b1"] = (np.asarray(out[0]["b1"]).astype(object) + 1) % DRESFL_PRIME_200
        return out

    monkeypatch.setattr(dresfl, "decode_gradients", corrupt)
    with pytest.raises(AssertionError, match="differs"):
        _run(rounds=1)


def test_recovery_threshold_and_skipped_rounds():
    """Theorem 1: N = R clients decode with no dropout; fewer present clients skip the round (footnote 6)."""
    with pytest.raises(ValueError, match="needs N >= "):
        _run(D=8)
    p = _run(D=9, availability=AlwaysAvailable(), rounds=2)
    assert p.decoded_rounds == 2 and not any(r["decode_failed"] for r in p.trace)
    q = _run(D=10, availability=PerClientDropout([0.02] * 8 + [0.6] * 2), rounds=12, seed=4)
    failed = [r["decode_failed"] for r in q.trace[1:]]
    assert any(failed) and not all(failed)
    for r in q.trace[1:]:
        n_present = 10 - len(r["dropped"].split())
        assert r["decode_failed"] == (n_present < 9)
        assert r["skipped"] == r["decode_failed"]


def test_dropouts_paired_with_baselines():
    D, seed = 10, 21
    task = make_task(D=D, n=20, d=6, c=3)
    dres = _run(D=D, seed=seed, availability=ExtremeDropout(D, seed), rounds=10, task=task, mode="timing")
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D), seed, availability=ExtremeDropout(D, seed))
    fed = registry.get("fedavg")(sim, task, {"hidden": [3, 3], "batch_size": 8})
    fed.run(10)
    assert [r["dropped"] for r in dres.trace[1:]] == [r["dropped"] for r in fed.trace[1:]]


def _coded_view(T: int) -> np.ndarray:
    """Everything client 0 received in the sharing phase, as field elements."""
    p = _run(D=10, T=T, rounds=0, mode="full")
    vals = []
    for msg in p.devices[0].view:
        if msg.kind == "coded_data":
            vals.append(np.asarray(msg.payload.x.to_field()).reshape(-1))
            vals.append(np.asarray(msg.payload.y.to_field()).reshape(-1))
    return np.concatenate(vals)


def test_privacy_audit_one_colluder_sees_uniform_shares():
    """T = 1: a colluding client's view of the others' coded data is uniform over GF(p) (chi-square over 16
    equal bins of the field); the same audit rejects T = 0 (power check: the shares are then the data)."""
    bins = 16
    for T, uniform in ((1, True), (0, False)):
        v = _coded_view(T)
        assert v.size == 9 * 20 * 9
        idx = np.array([int(x) * bins // DRESFL_PRIME_200 for x in v])
        counts = np.bincount(idx, minlength=bins)
        pvalue = stats.chisquare(counts).pvalue
        assert (pvalue > 1e-3) if uniform else (pvalue < 1e-6)


class _Scripted:
    """Round-0 availability by setup attempt: ``absent[a]`` is the set of clients absent in attempt ``a``;
    every training round everybody is present. (Each (client, round, attempt) is asked once: the engine
    caches the draw, so the k-th round-0 question about a client is about attempt k - 1.)"""

    def __init__(self, absent):
        from fednet.sim.compute import Availability

        class _A(Availability):
            def available(inner, node, round, draw):
                if round:
                    return True
                a = self.asked.get(node, 0)
                self.asked[node] = a + 1
                return node not in (self.absent[a] if a < len(self.absent) else set())

        self.absent, self.asked, self.model = absent, {}, _A()


def _reshare_run(absent, mode="timing", D=10):
    from fednet.sim.compute import Deterministic

    script = _Scripted(absent)
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.0), 3, device_compute=Deterministic(),
                     availability=script.model)
    ends: list[float] = []

    class Timed(registry.get("dresfl")):
        def setup(self):
            yield from super().setup()
            ends.append(self.sim.now)

    proto = Timed(sim, make_task(D=D, n=20, d=6, c=3), {**CFG, "mode": mode, "setup_dropouts": "reshare"})
    proto.run(2)
    return proto, ends


def test_setup_reshare_absent_client_sends_its_shares_when_back_analytic_time():
    """setup_dropouts = "reshare": client 3, absent from the sharing, encodes and sends its 9 shares when it is
    back (attempt 1) while the server forwards the 9 shares stored for it. With deterministic compute and
    loss-free links, attempt 1 lasts E + 9 u + d exactly (E: its LCC encoding, N (K + T)(m_i / K)(d_x + d_y)
    MACs at 1e6 MAC/s; u, d: one share's upload and download; its downlink's 9 forwards, 9 d, end earlier as
    u = 2 d), and the traffic is that of the one-time exchange plus the 9 stored shares' second hop."""
    from fednet.sim.network import transmission_time

    proto, ends = _reshare_run([{3}, set()])
    none, _ = _reshare_run([set()])
    assert proto.setup_absent == [[3], []] and proto.setup_attempts == 2 and len(ends) == 2
    assert proto.trace[0]["setup_attempts"] == 2 and proto.shares_forwarded == 9
    sim, N, rows, bits = proto.sim, 10, 20, 200
    share_bits = rows * (6 + 3) * bits
    dev = sim.devices[3]
    E = N * 2 * rows * (6 + 3) / 1e6
    u = transmission_time(share_bits, dev.uplink.rate_bps, sim.overhead, 0.0, sim.packet_bits, 0.5)[0]
    d = transmission_time(share_bits, dev.downlink.rate_bps, sim.overhead, 0.0, sim.packet_bits, 0.5)[0]
    assert u == pytest.approx(2 * d) and 9 * d < E + 9 * u + d
    assert ends[1] - ends[0] == pytest.approx(E + 9 * u + d, rel=1e-12)
    # traffic: every share crosses one uplink and one downlink, as without the absence (the stored ones later)
    assert proto.trace[0]["bits_up"] == none.trace[0]["bits_up"] == N * (N - 1) * share_bits
    assert proto.trace[0]["bits_down"] == none.trace[0]["bits_down"]
    # the absence costs time: the sharing ends later than with everybody present
    assert ends[1] > none.trace[0]["time_s"] - 1e-12 and ends[1] > ends[0]
    # training is unchanged by the sharing's schedule (timing mode: same trajectory)
    for k in proto.params:
        assert np.array_equal(np.asarray(proto.params[k]), np.asarray(none.params[k]))


def test_setup_reshare_full_mode_coded_data_complete_and_decodes():
    """Full mode: after two absent attempts for client 5 and one for client 1, every client holds its whole
    coded data set (the observer then checks each decoded gradient bit for bit); "offline" records only."""
    proto, ends = _reshare_run([{1, 5}, {5}, set()], mode="full")
    assert proto.setup_attempts == 3 and len(ends) == 3 and proto.decoded_rounds == 2
    assert all(dev.state.x_coded is not None and dev.state.x_coded.shape[0] == 10 * 20 for dev in proto.devices)
    assert proto.shares_forwarded == 8 + 9      # client 1: the 8 stored in attempt 0; client 5: 8 + 1 (from 1)
    # client 5 shared in attempt 0 but is absent when 3 comes back (attempt 1): the server keeps 3's share for
    # it, so a third attempt runs although every client has been present once (setup_waiting)
    late, ends = _reshare_run([{3}, {5}, set(), set()], mode="full")
    assert late.setup_attempts == 3 and late.setup_absent == [[3], [5], []] and late.shares_forwarded == 9 + 1
    assert all(dev.state.x_coded.shape[0] == 10 * 20 for dev in late.devices) and late.decoded_rounds == 2
    off = _Scripted([{3}])
    sim = Simulation(lte_star(10, device_mac_rates=[1e6] * 10, loss=0.0), 3, availability=off.model)
    p = registry.get("dresfl")(sim, make_task(D=10, n=20, d=6, c=3), {**CFG, "mode": "timing"})
    row = p.run(0)[0]
    assert p.setup_dropouts == "offline" and p.setup_attempts == 1 and row["dropped"] == "3"


def test_latency_study_K4_is_refused_with_the_threshold():
    """K = 4 at N = 20 (the latency study's third K): deg(g)(K + T - 1) + 1 = 33 > 20 is refused by name."""
    cls = registry.get("dresfl")
    with pytest.raises(ValueError, match=r"K = 4, T = 1, deg\(g\) = 8 needs N >= deg\(g\)\(K \+ T - 1\) \+ 1 = 33 .*N = 20"):
        cls.check(cls.Config(K=4, T=1), 20)
    cls.check(cls.Config(K=2, T=1), 20)                  # 17 <= 20
