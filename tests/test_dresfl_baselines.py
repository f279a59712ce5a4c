"""DReS-FL baselines, the extreme dropout model and the skewed label partition (Shao et al., Sec. 6.1)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from factories import make_task
from fednet.learning.federated import fedavg_weights, scaffold_local, scaffold_server
from fednet.learning.model import RidgeModel
from fednet.learning.partitions import partition, skewed_label_split
from fednet.protocol import registry
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.dropout import ExtremeDropout, PerClientDropout, decodable_probability, extreme_dropout_rates
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

SMALL = {"hidden": [8, 8], "batch_size": 8}


def _sim(D=6, seed=3, availability="extreme"):
    avail = ExtremeDropout(D, seed) if availability == "extreme" else availability
    return Simulation(lte_star(D, device_mac_rates=[1e6] * D), seed, availability=avail)


# -- SCAFFOLD ---------------------------------------------------------------------------------------
def test_scaffold_two_clients_by_hand():
    """Karimireddy et al., Alg. 1 (K = 1, option II) on a 2x1 ridge model, numbers worked out by hand."""
    model = RidgeModel(2, 1)
    theta = {"theta": np.array([[1.0], [0.0]])}
    c = {"theta": np.array([[0.2], [0.2]])}
    c1, c2 = {"theta": np.array([[0.1], [0.0]])}, {"theta": np.array([[0.0], [0.3]])}
    # client 1: x = (1, 0), y = 0 -> g1 = (1, 0); client 2: x = (0, 2), y = 1 -> g2 = (0, -2)
    dy1, dc1, c1n = scaffold_local(model, theta, np.array([[1.0, 0.0]]), np.array([[0.0]]), 0.5, c, c1)
    dy2, dc2, c2n = scaffold_local(model, theta, np.array([[0.0, 2.0]]), np.array([[1.0]]), 0.5, c, c2)
    np.testing.assert_allclose(dy1["theta"].ravel(), [-0.55, -0.1])
    np.testing.assert_allclose(dy2["theta"].ravel(), [-0.1, 1.05])
    np.testing.assert_allclose(c1n["theta"].ravel(), [1.0, 0.0])       # option II with K = 1: c_i+ = g_i(x)
    np.testing.assert_allclose(c2n["theta"].ravel(), [0.0, -2.0])
    np.testing.assert_allclose(dc1["theta"].ravel(), [0.9, 0.0])
    np.testing.assert_allclose(dc2["theta"].ravel(), [0.0, -2.3])
    x, c_new = scaffold_server(theta, c, [dy1, dy2], [dc1, dc2], n_clients=4)
    np.testing.assert_allclose(x["theta"].ravel(), [0.675, 0.475])
    np.testing.assert_allclose(c_new["theta"].ravel(), [0.425, -0.375])
    # the fixed-rate variant: option II over eta_0 = 1 while the step uses 0.5, c_i+ = (1 - r)(c_i - c) + r g_i, r = 1/2
    _, _, c1v = scaffold_local(model, theta, np.array([[1.0, 0.0]]), np.array([[0.0]]), 0.5, c, c1, control_lr=1.0)
    np.testing.assert_allclose(c1v["theta"].ravel(), [0.5 * -0.1 + 0.5 * 1.0, 0.5 * -0.2 + 0.0])


# -- weights ----------------------------------------------------------------------------------------
def test_fedavg_weights():
    m = [10, 30, 60]
    np.testing.assert_allclose(fedavg_weights(m, [0, 2]), [10 / 70, 60 / 70])
    q = [0.5, 1.0, 0.01]
    np.testing.assert_allclose(fedavg_weights(m, [0, 2], q), [0.1 / 0.5, 0.6 / 0.01])
    np.testing.assert_allclose(fedavg_weights(m, [0, 2], q, "normalized"), np.array([0.2, 60]) / 60.2)
    with pytest.raises(ValueError, match="rule"):
        fedavg_weights(m, [0], q, "other")


def test_importance_weights_unbiased_over_dropouts():
    """E[sum_{i present} w_i v_i] = sum_i (m_i/m) v_i: exact expectation over all presence patterns."""
    m, q, v = [1, 2, 3], np.array([0.3, 0.9, 0.5]), np.array([1.0, -2.0, 4.0])
    expect = 0.0
    for pattern in range(1, 8):
        used = [i for i in range(3) if pattern >> i & 1]
        prob = np.prod([q[i] if i in used else 1 - q[i] for i in range(3)])
        expect += prob * float(fedavg_weights(m, used, q) @ v[used])
    assert expect == pytest.approx(float(np.dot(np.array(m) / 6, v)))


# -- the dropout model ------------------------------------------------------------------------------
def test_extreme_rates_distribution():
    rates = np.concatenate([extreme_dropout_rates(20, np.random.default_rng(s)) for s in range(200)])
    high = rates == 0.99
    assert stats.binomtest(int(high.sum()), rates.size, 0.5).pvalue > 1e-3
    low = rates[~high]
    assert low.min() >= 0 and low.max() < 0.1
    assert stats.kstest(low / 0.1, "uniform").pvalue > 1e-3


def test_extreme_dropout_presence_frequency_and_pairing():
    """Per-round presence follows 1 - p_i; two simulations with one seed draw the same presence."""
    D, R = 10, 400
    a, b = _sim(D, seed=11), _sim(D, seed=11)
    pres = np.array([[a.available(dev, r) for dev in a.devices] for r in range(1, R + 1)])
    pres_b = np.array([[b.available(dev, r) for dev in b.devices] for r in range(1, R + 1)])
    assert np.array_equal(pres, pres_b)
    np.testing.assert_array_equal(a.availability.rates, b.availability.rates)
    for i, p in enumerate(a.availability.rates):
        assert stats.binomtest(int(pres[:, i].sum()), R, 1 - p).pvalue > 1e-4


def test_conditioning_and_decodable_probability():
    n_reliable = [ExtremeDropout(20, s).n_reliable for s in range(300)]
    assert np.mean(np.array(n_reliable) < 9) == pytest.approx(stats.binom.cdf(8, 20, 0.5), abs=0.08)
    for s in range(20):
        d = ExtremeDropout(20, s, min_reliable=9)
        assert d.n_reliable >= 9 and d.attempts >= 1
    with pytest.raises(ValueError, match="min_reliable"):
        ExtremeDropout(5, 0, min_reliable=6)
    assert decodable_probability([0.7] * 20, 9) == pytest.approx(stats.binom.sf(8, 20, 0.7))
    q = [0.2, 0.5, 0.9]
    exact = sum(np.prod([q[i] if p >> i & 1 else 1 - q[i] for i in range(3)]) for p in range(8) if bin(p).count("1") >= 2)
    assert decodable_probability(q, 2) == pytest.approx(exact)
    with pytest.raises(ValueError, match="rates"):
        PerClientDropout([0.5, 1.0])


# -- partition ---------------------------------------------------------------------------------------
def test_skewed_label_partition():
    labels = np.repeat(np.arange(10), 30)[np.random.default_rng(0).permutation(300)]
    parts = skewed_label_split(labels, 20)
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))
    assert all(len(np.unique(labels[p])) == 1 for p in parts)        # 10 classes, 20 shards: one class each
    assert [p.tolist() for p in partition(labels, 20, kind="skewed_label")] == [p.tolist() for p in parts]


# -- protocols ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedavg", "fedavg_is", "scaffold", "centralized", "fedavg_lightsecagg"])
def test_smoke(name):
    task = make_task(D=6, n=40, d=12, c=3)
    params = dict(SMALL, **({"U": 3} if name == "fedavg_lightsecagg" else {}))
    proto = registry.get(name)(_sim(), task, params)
    trace = proto.run(6)
    assert len(trace) == 7 and trace[-1]["time_s"] > 0
    assert all(np.isfinite(v).all() for v in proto.params.values())


def test_dropouts_paired_across_baselines():
    task = make_task(D=6, n=40, d=12, c=3)
    used = {}
    for name in ["fedavg", "fedavg_is", "scaffold"]:
        trace = registry.get(name)(_sim(seed=5), task, SMALL).run(12)
        used[name] = [(r["used"], r["dropped"]) for r in trace[1:]]
    assert used["fedavg"] == used["fedavg_is"] == used["scaffold"]
    assert any(d for _, d in used["fedavg"])                        # some client dropped somewhere
    lsa = registry.get("fedavg_lightsecagg")(_sim(seed=5), task, dict(SMALL, U=2)).run(12)
    assert [r["dropped"] for r in lsa[1:]] == [d for _, d in used["fedavg"]]    # FedAvg+LightSecAgg records them too


def test_fedavg_is_refuses_without_rates():
    with pytest.raises(ValueError, match="availability"):
        registry.get("fedavg_is")(_sim(availability=AlwaysAvailable()), make_task(D=6, n=40, d=12, c=3), SMALL)


def test_lightsecagg_equals_fedavg_up_to_quantisation():
    task = make_task(D=6, n=40, d=12, c=3)
    a = registry.get("fedavg")(_sim(availability=AlwaysAvailable()), task, SMALL)
    b = registry.get("fedavg_lightsecagg")(_sim(availability=AlwaysAvailable()), task, dict(SMALL, U=4))
    a.run(3)
    b.run(3)
    err = max(float(np.max(np.abs(a.params[k] - b.params[k]))) for k in a.params)
    assert 0 < err < 3 * 2.0**-16
    assert b.trace[-1]["bits_up"] > a.trace[-1]["bits_up"]            # the masks cost traffic


@pytest.mark.parametrize("average", ["all", "present"])
def test_scaffold_control_average(average):
    """Alg. 1 line 17 keeps ``c = mean_i c_i`` through dropouts; the ``|S|`` variant does not."""
    task = make_task(D=6, n=40, d=12, c=3)
    proto = registry.get("scaffold")(_sim(seed=5), task, dict(SMALL, control_average=average))
    trace = proto.run(12)
    assert any(r["dropped"] for r in trace[1:]) and all(r["used"] for r in trace[1:])
    gap = max(float(np.abs(proto.c[k] - np.mean([d.state.c_i[k] for d in proto.devices], axis=0)).max())
              for k in proto.c)
    if average == "all":
        assert gap < 1e-5
    else:
        assert gap > 1e-3


def test_centralized_clipping():
    """``max_norm`` clips the summed minibatch gradient ``b g``: the step's norm is ``lr max_norm / b``."""
    task = make_task(D=6, n=40, d=12, c=3)
    cfg = dict(SMALL, activation="quadratic", loss="mse")

    def one_step(**extra):
        proto = registry.get("centralized")(_sim(availability=AlwaysAvailable()), task, dict(cfg, **extra))
        before = {k: v.copy() for k, v in proto.params.items()}
        proto.run(1)
        return np.sqrt(sum(float(np.sum((proto.params[k] - before[k]) ** 2)) for k in before)), proto.params

    free, p_free = one_step()
    loose, p_loose = one_step(max_norm=1e9)
    assert all(np.array_equal(p_free[k], p_loose[k]) for k in p_free)     # a bound that does not bind changes nothing
    b, lr = SMALL["batch_size"], 0.1
    tight = free * b / lr / 4                                               # a quarter of the unclipped ||b g||
    clipped, _ = one_step(max_norm=tight)
    assert clipped == pytest.approx(lr * tight / b, rel=1e-12)
    with pytest.raises(ValueError, match="max_norm"):
        one_step(max_norm=0.0)
