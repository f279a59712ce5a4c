"""The model of time, pinned analytically and statistically (issue 2 acceptance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fednet.algebra.meter import MacMeter
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.protocol.base import Protocol
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.network import Message, transmission_time
from fednet.sim.rng import Streams, negative_binomial_from_uniform
from fednet.sim.simulation import Simulation
from fednet.protocols.conventional import minibatch_gradient
from fednet.topologies.lte import lte_star

D, d, c, n_i = 3, 20, 3, 10
RATES = [1e6, 2e6, 4e6]


def small_task(D: int = D, n: int = n_i, seed: int = 0) -> LearningTask:
    rng = np.random.default_rng(seed)
    X = [rng.normal(size=(n, d)) for _ in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n)] for _ in range(D)]
    xt = rng.normal(size=(30, d))
    return LearningTask(X, Y, xt, rng.integers(0, c, 30), learning_rate=0.01)


def lossless(D: int = D, rates=RATES, **kw) -> Simulation:
    g = lte_star(D, loss=0.0, device_mac_rates=rates, **kw)
    return Simulation(g, seed=1, device_compute=Deterministic())


def test_epoch_time_is_max_of_download_compute_upload() -> None:
    """Loss 0, deterministic compute: an epoch lasts max_i(down + comp + up) + server time, by hand."""
    sim = lossless()
    proto = registry.get("conventional")(sim, small_task(), {"minibatch_fraction": 0.5})
    rows = proto.run(3)
    bits = d * c * 32
    down = bits * 1.1 / 10e6
    up = bits * 1.1 / 5e6
    b = 5
    comp = [2 * b * d * c / r for r in RATES]
    server = D * d * c / 8.24e12            # the server's D axpy's of (d, c) gradients
    epoch = max((down + cp) + up for cp in comp) + server
    times = [r["time_s"] for r in rows]
    assert times[0] == 0.0
    for e in range(1, 4):
        assert times[e] - times[e - 1] == pytest.approx(epoch, rel=1e-12)
    assert rows[1]["bits_up"] == D * bits and rows[1]["bits_down"] == D * bits
    assert rows[1]["device_macs"] == D * 2 * b * d * c
    assert rows[1]["server_macs"] == D * d * c


def test_minibatch_gradient_macs_are_2bdc() -> None:
    rng = np.random.default_rng(3)
    X, Y, theta = rng.normal(size=(50, 7)), rng.normal(size=(50, 4)), rng.normal(size=(7, 4))
    rows = rng.choice(50, size=13, replace=False)
    with MacMeter() as m:
        g = minibatch_gradient(X, Y, theta, rows)
    assert m.macs == 2 * 13 * 7 * 4
    np.testing.assert_allclose(g, 50 / 13 * X[rows].T @ (X[rows] @ theta - Y[rows]))


class _Relay(Protocol):
    """Test protocol: one device-to-device message per round."""

    def round(self, epoch: int):
        msg = yield from self.net.send(self.devices[0], self.devices[2], np.zeros(1000), kind="share",
                                       element_bits=self.element_bits)
        self.used = [0]
        self.delivered = msg


def test_relayed_message_takes_upload_plus_download() -> None:
    sim = lossless()
    proto = _Relay(sim, small_task(), {"element_bits": 48})
    proto.run(1)
    bits = 1000 * 48 * 1.1
    assert sim.now == pytest.approx(bits / 5e6 + bits / 10e6, rel=1e-12)
    assert [h[0] for h in proto.delivered.hops] == ["up", "down"]
    assert proto.delivered.encrypted and proto.delivered in sim.devices[2].view
    assert proto.delivered in sim.server.relayed and proto.delivered not in sim.server.view
    assert proto.trace[1]["bits_up"] == proto.trace[1]["bits_down"] == 48000


@pytest.mark.parametrize("p,packet_bits", [(0.1, None), (0.3, None), (0.1, 1000), (0.5, 4000)])
def test_mean_tries_is_one_over_one_minus_p(p: float, packet_bits: int | None) -> None:
    """Mean transmission time / lossless time = 1/(1-p); tolerance 4 standard errors (20000 messages)."""
    s = Streams(7, 1)
    bits = 50_000
    base = bits * 1.1 / 5e6
    ratios = np.array([transmission_time(bits, 5e6, 0.1, p, packet_bits, s.uniform(0, "uplink", r))[0] / base
                       for r in range(20000)])
    n = 1 if packet_bits is None else math.ceil(bits * 1.1 / packet_bits)
    sd = math.sqrt(n * p) / (1 - p) / n          # sd of (n + NegBin(n, 1-p)) / n
    assert abs(ratios.mean() - 1 / (1 - p)) < 4 * sd / math.sqrt(len(ratios))


def test_negative_binomial_inversion_is_exact_quantile() -> None:
    for n, p in [(1, 0.1), (7, 0.3), (200, 0.1), (5000, 0.05)]:
        for u in np.linspace(0.001, 0.999, 37):
            assert negative_binomial_from_uniform(u, n, p) == stats.nbinom.ppf(u, n, 1 - p)


def test_negative_binomial_stored_cdf_equals_the_walk() -> None:
    """The stored-CDF lookup gives the count of the nbdtrik-then-nbdtr walk it replaced, also at (and one ulp
    beside) the CDF's own values and for tables too long to store (issue 12)."""
    from fednet.sim import rng as R
    g = np.random.default_rng(3)
    for n in (1, 2, 5, 13, 40, 300, 2000):
        for p in (0.01, 0.1, 0.3, 0.9):
            cdf = R._nb_cdf(n, p, 0.9999) or []
            us = [float(u) for u in g.random(60)] + [1 - 2**-53]
            us += [float(v) for c in cdf[:30] for v in (c, np.nextafter(c, 0.0), np.nextafter(c, 1.0)) if 0 < v < 1]
            for u in us:
                assert negative_binomial_from_uniform(u, n, p) == R._nb_quantile_walk(u, n, p), (u, n, p)


def test_shifted_exponential_mean_and_distribution() -> None:
    """T = rho/tau + Exp(mean 0.5 rho/tau): KS test of the setup time against Exp (alpha 1e-3)."""
    model = ShiftedExponential(0.5)
    s = Streams(11, 1)
    rho, tau = 1e6, 2e6
    t = np.array([model.duration(0, r, rho, tau, lambda r=r: s.standard_exponential(0, "compute", r))
                  for r in range(5000)])
    assert t.min() >= rho / tau
    setup = (t - rho / tau) / (0.5 * rho / tau)
    assert stats.kstest(setup, "expon").pvalue > 1e-3
    assert model.duration(0, 0, 0, tau, lambda: 1.0) == 0.0


def test_keyed_draws_do_not_move_when_others_draw() -> None:
    a, b = Streams(5, 4), Streams(5, 4)
    ref = [a.uniform(2, "compute", r) for r in range(1, 6)]
    b.uniform(0, "compute", 3)                      # other node
    b.uniform(2, "uplink", 1)                       # other purpose
    [b.uniform(2, "compute", 9) for _ in range(20)]   # other round, many draws (second block)
    assert [b.uniform(2, "compute", r) for r in range(1, 6)] == ref
    assert a.uniform(2, "compute", 1) != ref[0]    # the next draw of the same key is a new one
    assert Streams(6, 4).uniform(2, "compute", 1) != ref[0]


def test_same_seed_same_trace_and_other_seed_differs() -> None:
    task = small_task()

    def trace(seed: int):
        sim = Simulation(lte_star(D, device_mac_rates=RATES), seed=seed)
        return registry.get("conventional")(sim, task, {"drop_slowest": 1}).run(5)

    assert trace(3) == trace(3)
    assert [r["time_s"] for r in trace(3)] != [r["time_s"] for r in trace(4)]


def test_paired_protocols_face_the_same_stragglers() -> None:
    """Two protocols with different MAC loads, one seed: the same devices straggle every round.

    With negligible communication, device i's time is rho/tau_i (1 + 0.5 E_i,r); the keyed E is
    shared, and rho scales by the same factor for every device, so the set of the 3 slowest is
    identical in every round — while a different seed changes it.
    """
    D8 = 8
    task = small_task(D8, n=40)
    rates = [2e6] * D8

    def used(seed: int, frac: float) -> list[str]:
        g = lte_star(D8, device_mac_rates=rates, uplink_bps=1e15, downlink_bps=1e15, loss=0.0)
        sim = Simulation(g, seed=seed)
        rows = registry.get("conventional")(sim, task, {"minibatch_fraction": frac, "drop_slowest": 3}).run(15)
        return [r["used"] for r in rows[1:]]

    a, b = used(9, 0.25), used(9, 0.5)
    assert a == b
    assert len(set(a)) > 1                   # the stragglers change from round to round
    assert used(10, 0.25) != a


def test_dropout_model_is_keyed_and_has_rate_p() -> None:
    g = lte_star(50, device_mac_rates=[1e6] * 50)
    sim = Simulation(g, seed=2, availability=BernoulliDropout(0.3))
    absent = np.array([[not sim.available(dev, r) for dev in sim.devices] for r in range(1, 201)])
    se = math.sqrt(0.3 * 0.7 / absent.size)
    assert abs(absent.mean() - 0.3) < 4 * se
    sim2 = Simulation(g, seed=2, availability=BernoulliDropout(0.3))
    assert all(sim2.available(sim2.devices[i], 5) == (not absent[4, i]) for i in range(50))


def test_gather_cancels_stragglers_and_reports_shortfall() -> None:
    sim = lossless()
    proto = registry.get("conventional")(sim, small_task(), {"drop_slowest": 2})
    rows = proto.run(2)
    assert rows[1]["used"] == "2"                  # the fastest device (4e6 MAC/s) alone
    assert rows[1]["bits_up"] == d * c * 32        # the stragglers' uploads were cancelled

    sim = Simulation(lte_star(D, device_mac_rates=RATES), seed=0, availability=BernoulliDropout(0.9))
    from fednet.protocol.base import StragglerShortfall
    with pytest.raises(StragglerShortfall, match="needs 3 results"):
        registry.get("conventional")(sim, small_task(), {}).run(20)


@pytest.mark.parametrize("kwargs,match", [
    ({"uplink_bps": -1.0}, "uplink_bps must be positive, got -1.0"),
    ({"loss": 1.0}, r"loss must be in \[0, 1\), got 1.0"),
    ({"loss": -0.1}, r"loss must be in \[0, 1\), got -0.1"),
    ({"device_mac_rates": [1.0, 0.0, 1.0]}, r"device_mac_rates\[1\] must be positive, got 0.0"),
])
def test_bad_network_arguments_are_named(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        lte_star(3, **kwargs)


def test_bad_protocol_config_is_named() -> None:
    sim = lossless()
    with pytest.raises(ValueError, match="drop_slowest must be less than the number of devices"):
        registry.get("conventional")(sim, small_task(), {"drop_slowest": 3})
    with pytest.raises(ValueError, match="minibatch_fractio"):
        registry.get("conventional")(sim, small_task(), {"minibatch_fractio": 0.3})
    with pytest.raises(ValueError, match="n_elements must be >= 0"):
        Message(0, 1, "x", None, -1, 32)


def test_trace_compute_model_adds_per_round_delays() -> None:
    """A per-node trace of extra delays (rounds wrap around) on top of rho / tau."""
    from fednet.sim.compute import TraceCompute

    g = lte_star(D, loss=0.0, device_mac_rates=RATES, uplink_bps=1e15, downlink_bps=1e15)
    sim = Simulation(g, seed=0, device_compute=TraceCompute({0: [5.0, 1.0], 1: [0.0], 2: [2.0]}))
    rows = registry.get("conventional")(sim, small_task(), {"minibatch_fraction": 0.5}).run(3)
    comp = [2 * 5 * d * c / r for r in RATES]
    expected = [max(comp[0] + 5.0, comp[1], comp[2] + 2.0), max(comp[0] + 1.0, comp[1], comp[2] + 2.0)]
    steps = np.diff([r["time_s"] for r in rows])
    np.testing.assert_allclose(steps, [expected[1], expected[0], expected[1]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"delays\[3\]"):
        TraceCompute({3: []})


def test_round_metrics_extend_the_trace_row() -> None:
    base = registry.get("conventional")

    class Counting(base):
        def round_metrics(self, round: int) -> dict:
            return {"uploads_used": 0 if self.used is None else len(self.used)}

    rows = Counting(lossless(), small_task(), {"drop_slowest": 1}).run(2)
    assert [r["uploads_used"] for r in rows] == [0, 2, 2]


class _Deadline(Protocol):
    """Test protocol: gather with a deadline between the devices' finishing times."""

    deadline = 0.0

    def round(self, epoch: int):
        replies = yield from self.net.gather(self.devices, lambda dev: np.ones(10), kind="g", download=np.ones(10),
                                             macs=lambda dev: 1_000_000, deadline=self.deadline)
        self.used = [dev.index for dev, _ in replies]
        self.end = self.sim.now


def test_gather_deadline_returns_what_arrived_in_time() -> None:
    """Deterministic devices at 1, 2, 4 MMAC/s finish 1 MMAC at ~1, ~0.5, ~0.25 s (+ tiny transfers)."""
    proto = _Deadline(lossless(), small_task())
    proto.deadline = 0.6
    rows = proto.run(1)
    assert rows[1]["used"] == "1 2" and proto.end == pytest.approx(0.6)
    late = _Deadline(lossless(), small_task())
    late.deadline = -1.0
    with pytest.raises(ValueError, match="deadline must be >= 0 seconds, got -1"):
        late.run(1)
