"""The everyday FL knobs (issue 30, item 7): client sampling, local steps / epochs, FedProx, FedAdam / FedYogi.

Reduced DReS-FL-like set-up (the MLP baselines on the synthetic task of ``tests/factories.py``, 12-8-8-3, batch 8),
a few rounds each: sampling all clients equals no sampling bit for bit; the sampled sets are paired across
protocols at a seed, differ across seeds, have exactly ``m`` members and include each client with frequency
``m / D``; ``local_steps = K`` meters exactly ``K`` gradients plus the element-wise work and equals ``K`` sequential
SGD steps; FedProx with ``mu = 0`` is FedAvg bit for bit; FedAdam's / FedYogi's server step equals a hand-computed
one on a 2-parameter model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from factories import make_task
from fednet.algebra.meter import MacMeter
from fednet.errors import ConfigError
from fednet.learning.federated import fedopt_server, local_sgd_steps
from fednet.protocol import registry
from fednet.protocol.sampling import SamplingConfig, sample_clients, sample_size
from fednet.protocol.trace import COLUMNS
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.dropout import ExtremeDropout
from fednet.sim.simulation import Simulation
from fednet.testing import check_protocol
from fednet.topologies.lte import lte_star

D = 6
SMALL = {"hidden": [8, 8], "batch_size": 8}


def _run(name: str, extra: dict | None = None, *, seed: int = 3, rounds: int = 4, dropout: bool = True,
         n_devices: int = D):
    task = make_task(D=n_devices, n=40, d=12, c=3)
    avail = ExtremeDropout(n_devices, seed) if dropout else AlwaysAvailable()
    sim = Simulation(lte_star(n_devices, device_mac_rates=[1e6] * n_devices), seed, availability=avail)
    proto = registry.get(name)(sim, task, dict(SMALL, **(extra or {})))
    return proto, proto.run(rounds)


def _same_run(a, b) -> None:
    """Every standard column of every row and the final parameters equal, bit for bit."""
    (pa, ta), (pb, tb) = a, b
    assert len(ta) == len(tb)
    for ra, rb in zip(ta, tb):
        for col in COLUMNS:
            if col != "protocol":
                assert repr(ra[col]) == repr(rb[col]), (col, ra["round"], ra[col], rb[col])
        assert ra["evaluated"] == rb["evaluated"] and ra["skipped"] == rb["skipped"]
    assert sorted(pa.params) == sorted(pb.params)
    for k in pa.params:
        assert pa.params[k].tobytes() == pb.params[k].tobytes(), k


# -- client sampling -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedavg", "fedavg_is"])
def test_sampling_every_client_is_no_sampling(name):
    base = _run(name)
    everyone = _run(name, {"clients_per_round": D})
    _same_run(base, everyone)
    assert "sampled" not in base[1][1]
    assert [r["sampled"] for r in everyone[1]] == [""] + [" ".join(map(str, range(D)))] * 4
    _same_run(base, _run(name, {"client_fraction": 1.0}))


def test_sampled_count_is_exact_and_used_dropped_partition_it():
    _, trace = _run("fedavg", {"clients_per_round": 3}, rounds=8)
    for row in trace[1:]:
        s = [int(i) for i in row["sampled"].split()]
        used = [int(i) for i in row["used"].split()]
        dropped = [int(i) for i in row["dropped"].split()]
        assert len(s) == len(set(s)) == 3 and s == sorted(s)
        assert sorted(used + dropped) == s                      # the availability model is asked about S_t only
    _, trace = _run("fedavg", {"client_fraction": 0.5}, rounds=3)
    assert all(len(r["sampled"].split()) == 3 for r in trace[1:])


def test_sample_size_rule():
    """McMahan et al. Alg. 1: m = max(C K, 1), floor, with C K near an integer taken as that integer."""
    assert sample_size(SamplingConfig(client_fraction=0.29), 100) == 29      # 0.29 * 100 = 28.999999999999996
    assert sample_size(SamplingConfig(client_fraction=0.1), 5) == 1           # floor(0.5) = 0 -> 1
    assert sample_size(SamplingConfig(client_fraction=0.35), 10) == 3
    assert sample_size(SamplingConfig(clients_per_round=4), 10) == 4
    assert sample_size(SamplingConfig(), 10) is None


def test_sampling_is_paired_across_protocols_and_differs_across_seeds():
    extra = {"clients_per_round": 2}
    runs = {name: _run(name, dict(extra, **({"local_steps": 2} if name == "fedprox" else {})), rounds=6)[1]
            for name in ("fedavg", "fedprox", "fedadam")}
    sets = {name: [r["sampled"] for r in t] for name, t in runs.items()}
    assert sets["fedavg"] == sets["fedprox"] == sets["fedadam"]
    other = [r["sampled"] for r in _run("fedavg", extra, seed=4, rounds=6)[1]]
    assert other != sets["fedavg"]
    assert len(set(sets["fedavg"][1:])) > 1                     # the set changes from round to round


class _Stub:
    """What :func:`sample_clients` reads of a protocol."""

    def __init__(self, seed: int, n: int, m: int) -> None:
        self.sim = Simulation(lte_star(n, device_mac_rates=[1e6] * n), seed)
        self.devices = self.sim.devices
        self.config = SamplingConfig(clients_per_round=m)


def test_each_client_is_sampled_with_probability_m_over_d():
    """Over 2000 rounds each of 10 clients is in S_t ~ Binomial(2000, 3/10) (two-sided test at 1e-4 per client;
    the pairs' co-inclusion ~ m (m-1) / (D (D-1)) = 1/15 the same way): uniform sampling without replacement."""
    stub, T = _Stub(seed=11, n=10, m=3), 2000
    counts = np.zeros(10, dtype=int)
    pair = 0
    for t in range(1, T + 1):
        s = [dev.index for dev in sample_clients(stub, t)]
        assert len(s) == 3
        counts[s] += 1
        pair += 0 in s and 1 in s
    for c in counts:
        assert stats.binomtest(int(c), T, 0.3).pvalue > 1e-4
    assert stats.binomtest(pair, T, 1 / 15).pvalue > 1e-4


def test_sampling_errors_name_the_option():
    with pytest.raises(ConfigError, match="clients_per_round must be at most the number of devices \\(6\\), got 7"):
        _run("fedavg", {"clients_per_round": 7})
    with pytest.raises(ConfigError, match="clients_per_round or client_fraction, not both"):
        _run("fedavg", {"clients_per_round": 2, "client_fraction": 0.5})
    with pytest.raises(ConfigError, match="client_fraction.*less than or equal to 1"):
        _run("fedavg", {"client_fraction": 1.5})
    with pytest.raises(ConfigError, match="local_steps or local_epochs, not both"):
        _run("fedavg", {"local_steps": 2, "local_epochs": 1})
    with pytest.raises(ConfigError, match="local_steps.*greater than or equal to 1"):
        _run("fedavg", {"local_steps": 0})


# -- local steps / epochs ------------------------------------------------------------------------------------------
def _gradient_macs(model, params, b: int) -> int:
    x = np.zeros((b, 12))
    y = np.zeros(b, dtype=int)
    with MacMeter() as m:
        model.gradient(params, x, y)
    return m.macs


@pytest.mark.parametrize("K", [1, 3])
def test_local_steps_meter_every_step(K):
    """Device MACs of a round: per client K gradients (batch 8) + K d_w (the -lr v) + 2 (K - 1) d_w (w_t + delta,
    delta + step); every client present (no dropout)."""
    proto, trace = _run("fedavg", {"local_steps": K}, dropout=False, rounds=2)
    G = _gradient_macs(proto.model, proto.params, 8)
    d_w = proto.learning.n_params
    assert d_w == 12 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3
    per_client = K * G + K * d_w + 2 * (K - 1) * d_w
    assert [r["device_macs"] for r in trace[1:]] == [D * per_client] * 2


def test_local_epochs_are_passes_over_the_rows():
    """E = 2 epochs of 40 rows in batches of 16: 2 x (16, 16, 8) minibatches, each gradient metered at its size."""
    proto, trace = _run("fedavg", {"local_epochs": 2, "batch_size": 16}, dropout=False, rounds=1)
    G16, G8 = _gradient_macs(proto.model, proto.params, 16), _gradient_macs(proto.model, proto.params, 8)
    d_w, K = proto.learning.n_params, 6
    assert trace[1]["device_macs"] == D * (4 * G16 + 2 * G8 + K * d_w + 2 * (K - 1) * d_w)
    batches = list(proto.learning.local_batches(proto.devices[0], epochs=2))
    assert [len(x) for x, _ in batches] == [16, 16, 8, 16, 16, 8]
    rows = np.concatenate([x for x, _ in batches[:3]])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, proto.task.X[0]))     # one epoch: every row once


def test_local_steps_equal_sequential_sgd():
    """delta after K steps equals w_K - w_t of plain sequential SGD w <- w - lr g(w) on the same batches."""
    proto, _ = _run("fedavg", dropout=False, rounds=0)
    dev = proto.devices[0]
    proto.epoch = 1
    batches = list(proto.learning.local_batches(dev, steps=4))
    assert len(batches) == 4 and not np.array_equal(batches[0][0], batches[1][0])
    w0 = proto.params
    delta = local_sgd_steps(proto.model, w0, batches, 0.1)
    w = {k: v.copy() for k, v in w0.items()}
    for x, y in batches:
        g = proto.model.gradient(w, x, y)
        w = {k: w[k] - 0.1 * np.asarray(g[k], np.float64) / len(x) for k in w}
    for k in w0:
        np.testing.assert_allclose(delta[k], w[k] - w0[k], rtol=1e-9, atol=1e-12)


def test_fedprox_step_by_hand():
    """FedProx's local steps on a 1-parameter ridge model: w <- w - lr (g(w) + mu (w - w_t)), by hand."""
    from fednet.learning.model import RidgeModel
    model = RidgeModel(1, 1)
    w0 = {"theta": np.array([[1.0]])}
    x, y = np.array([[2.0]]), np.array([[0.0]])       # loss 1/2 (2w)^2: gradient 4w
    lr, mu = 0.1, 0.5
    delta = local_sgd_steps(model, w0, [(x, y)] * 3, lr, mu)
    w = 1.0
    for _ in range(3):
        w = w - lr * (4 * w + mu * (w - 1.0))
    assert delta["theta"][0, 0] == pytest.approx(w - 1.0, rel=1e-12)


# -- FedProx ---------------------------------------------------------------------------------------------------
def test_fedprox_mu_zero_is_fedavg():
    for extra in ({"local_steps": 3}, {"local_steps": 2, "clients_per_round": 4}):
        _same_run(_run("fedavg", extra), _run("fedprox", dict(extra, mu=0.0)))
    # mu > 0 moves the model, and meters the proximal term: 2 d_w MACs per client and step after the first
    pa, ta = _run("fedavg", {"local_steps": 3}, dropout=False, rounds=1)
    pb, tb = _run("fedprox", {"local_steps": 3, "mu": 0.1}, dropout=False, rounds=1)
    assert tb[1]["device_macs"] - ta[1]["device_macs"] == D * 2 * 2 * pa.learning.n_params
    assert not all(np.array_equal(pa.params[k], pb.params[k]) for k in pa.params)


# -- FedAdam / FedYogi -------------------------------------------------------------------------------------------
def test_fedopt_server_step_by_hand():
    """Reddi et al. Alg. 2 on two parameters, one step from m = 0, v = tau^2, worked out by hand."""
    x = {"a": np.array([1.0, -2.0])}
    m = {"a": np.zeros(2)}
    tau = 1e-3
    v = {"a": np.full(2, tau ** 2)}
    delta = {"a": np.array([0.1, -0.2])}
    eta, b1, b2 = 0.01, 0.9, 0.99
    # m = 0.1 Delta = (0.01, -0.02)
    # Adam: v = 0.99 tau^2 + 0.01 Delta^2 = (0.99e-6 + 1e-4, 0.99e-6 + 4e-4)
    xa, ma, va = fedopt_server(x, m, v, delta, "adam", eta, b1, b2, tau)
    np.testing.assert_allclose(ma["a"], [0.01, -0.02], rtol=1e-13)
    np.testing.assert_allclose(va["a"], [0.99e-6 + 1e-4, 0.99e-6 + 4e-4], rtol=1e-13)
    np.testing.assert_allclose(xa["a"], [1.0 + 0.01 * 0.01 / (math.sqrt(1.0099e-4) + 1e-3),
                                         -2.0 - 0.01 * 0.02 / (math.sqrt(4.0099e-4) + 1e-3)], rtol=1e-14)
    # Yogi: v - tau^2 < Delta^2, so sign(v - Delta^2) = -1: v = tau^2 + 0.01 Delta^2 = (1.01e-6 + ..., )
    _, _, vy = fedopt_server(x, m, v, delta, "yogi", eta, b1, b2, tau)
    np.testing.assert_allclose(vy["a"], [1e-6 + 1e-4, 1e-6 + 4e-4], rtol=1e-13)
    # Adagrad: v = tau^2 + Delta^2
    _, _, vg = fedopt_server(x, m, v, delta, "adagrad", eta, b1, b2, tau)
    np.testing.assert_allclose(vg["a"], [1e-6 + 1e-2, 1e-6 + 4e-2], rtol=1e-13)
    # Yogi with v above Delta^2 decreases v towards it: v = 1 - 0.01 Delta^2
    _, _, vy2 = fedopt_server(x, m, {"a": np.ones(2)}, delta, "yogi", eta, b1, b2, tau)
    np.testing.assert_allclose(vy2["a"], [1 - 1e-4, 1 - 4e-4], rtol=1e-13)
    with MacMeter() as meter:
        fedopt_server(x, m, v, delta, "yogi", eta, b1, b2, tau)
    assert meter.macs == 10 * 2


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_fedopt_protocol_round_by_hand(name):
    """One round of the protocol equals FedAvg's weighted delta put through the hand-checked server step."""
    pf, _ = _run("fedavg", {"local_steps": 2}, dropout=False, rounds=1)
    _, t0 = _run(name, {"local_steps": 2}, dropout=False, rounds=0)
    po, to = _run(name, {"local_steps": 2}, dropout=False, rounds=1)
    init = _run("fedavg", dropout=False, rounds=0)[0].params
    delta = {k: pf.params[k] - init[k] for k in init}               # FedAvg's step = its weighted mean delta
    tau = 1e-3
    rule = name.removeprefix("fed")
    x, _, _ = fedopt_server(init, {k: np.zeros_like(v) for k, v in init.items()},
                            {k: np.full_like(v, tau ** 2) for k, v in init.items()}, delta, rule, 1e-2, 0.9, 0.99, tau)
    for k in init:
        np.testing.assert_allclose(po.params[k], x[k], rtol=1e-6, atol=1e-9)
    ops = {"adam": 9, "yogi": 10}[rule]
    assert to[1]["server_macs"] == D * pf.learning.n_params + ops * pf.learning.n_params


# -- the protocols pass check_protocol, and describe lists the options --------------------------------------------
@pytest.mark.backends
@pytest.mark.parametrize("name,params", [
    ("fedavg", dict(SMALL, clients_per_round=3, local_steps=2)),
    ("fedprox", dict(SMALL, local_steps=2, client_fraction=0.5)),
    ("fedadam", dict(SMALL, local_epochs=1)),
    ("fedyogi", dict(SMALL)),
])
def test_check_protocol(name, params):
    report = check_protocol(registry.get(name), params, task=make_task(D=6, n=20, d=6, c=3), rounds=2,
                            availability=lambda: ExtremeDropout(6, 1))
    assert report.engine.backends_used()


def test_describe_lists_the_options():
    from fednet.study.describe import describe_protocol
    text = describe_protocol("fedprox")
    for option in ("clients_per_round", "client_fraction", "local_steps", "local_epochs", "mu"):
        assert option in text
    text = describe_protocol("fedadam")
    for option in ("server_lr", "beta1", "beta2", "tau", "Reddi"):
        assert option in text


# -- a user's model: model = "module:factory" ---------------------------------------------------------------------
FACTORY = '''
from torch import nn


def tiny(n_inputs, n_outputs):
    """A user's own network: one hidden tanh layer of 5 units."""
    return nn.Sequential(nn.Linear(n_inputs, 5), nn.Tanh(), nn.Linear(5, n_outputs))


def not_a_module(n_inputs, n_outputs):
    return [n_inputs, n_outputs]
'''


@pytest.fixture
def factory_folder(tmp_path, monkeypatch):
    """``w30_model.py`` in a folder that is neither the working folder nor on ``sys.path``."""
    import sys
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "w30_model.py").write_text(FACTORY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    yield folder
    sys.modules.pop("w30_model", None)


def test_model_plugin_builds_the_users_network(factory_folder):
    """The protocol trains the factory's network: its parameters, and per client and step exactly the MACs of its
    two Linear layers (forward b(d 5 + 5 c), weight gradients the same, the second layer's input gradient b 5 c)
    plus one per parameter for the step."""
    from fednet.plugins import search_path
    with search_path(factory_folder):
        proto, trace = _run("fedavg", {"model": "w30_model:tiny"}, dropout=False, rounds=1)
    d, c, b = 12, 3, 8
    assert {k: v.shape for k, v in proto.params.items()} == {"0.weight": (5, d), "0.bias": (5,), "2.weight": (c, 5),
                                                              "2.bias": (c,)}
    n_params = 5 * d + 5 + c * 5 + c
    assert trace[1]["device_macs"] == D * (2 * b * (d * 5 + 5 * c) + b * 5 * c + n_params)
    with search_path(factory_folder), pytest.raises(ConfigError, match="model = 'w30_model:not_a_module' returned a list"):
        _run("fedavg", {"model": "w30_model:not_a_module"}, rounds=0)
    with pytest.raises(ConfigError, match="model factory 'w30_nowhere:tiny': no module named 'w30_nowhere'"):
        _run("fedavg", {"model": "w30_nowhere:tiny"}, rounds=0)
    with pytest.raises(ConfigError, match="model must be 'package.module:factory', got 'tiny'"):
        _run("fedavg", {"model": "tiny"}, rounds=0)


STUDY = """
name = "knobs"
seeds = [0]
targets = [0.5]
epochs = 2
run_to_end = true
[data]
dataset = "digits"
features = "raw"
[network]
n_devices = 4
[[runs]]
label = "FedAvg"
protocol = "fedavg"
params = {{ batch_size = 16 }}
[[runs]]
label = "mine"
protocol = "{protocol}"
params = {{ model = "{model}", batch_size = 16, clients_per_round = 2, local_epochs = 1 }}
"""


def test_model_plugin_through_fednet_run(factory_folder, capsys):
    """``fednet run`` from another folder: the study's factory beside it is found, trains, and is in provenance;
    a factory that does not import is a one-line error (exit 2) before any output."""
    import json

    from fednet.cli import main
    study = factory_folder / "s.toml"
    study.write_text(STUDY.format(protocol="fedprox", model="w30_model:tiny"))
    out = factory_folder.parent / "out"
    assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0
    import pandas as pd
    trace = pd.read_csv(out / "mine" / "trace.csv", keep_default_na=False)
    assert [len(s.split()) for s in trace["sampled"]] == [0, 2, 2]
    assert trace["bits_down"].iloc[1] < pd.read_csv(out / "FedAvg" / "trace.csv")["bits_down"].iloc[1] / 4
    from fednet.study.results import load_results
    rows = load_results(out).rounds
    mine = rows[rows["run"] == "mine"]
    assert mine["sampled"].tolist()[0] == "" and all(len(s.split()) == 2 for s in mine["sampled"].tolist()[1:])
    specs = json.dumps(json.loads((out / "provenance.json").read_text()))
    assert "w30_model:tiny" in specs and "model factory" in specs
    capsys.readouterr()
    study.write_text(STUDY.format(protocol="fedavg", model="w30_model:missing"))
    assert main(["run", str(study), "--out", str(factory_folder.parent / "out2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model" in err and "has no attribute 'missing'" in err
    assert not (factory_folder.parent / "out2").exists()


# -- conventional FL (ridge, Schlegel et al.) with client sampling --------------------------------------------------
def _conventional(extra: dict | None = None, seed: int = 1, rounds: int = 4):
    from factories import make_sim
    task = make_task(D=8)
    proto = registry.get("conventional")(make_sim(D=8, seed=seed), task, dict({"minibatch_fraction": 0.5},
                                                                             **(extra or {})))
    return proto, proto.run(rounds)


def test_conventional_sampling_all_is_no_sampling_and_paired_with_fedavg():
    (pa, ta), (pb, tb) = _conventional(), _conventional({"clients_per_round": 8})
    for ra, rb in zip(ta, tb):
        assert all(repr(ra[c]) == repr(rb[c]) for c in COLUMNS)
    assert pa.theta.tobytes() == pb.theta.tobytes()
    _, tc = _conventional({"clients_per_round": 3, "drop_slowest": 1}, rounds=5)
    assert all(len(r["sampled"].split()) == 3 and len(r["used"].split()) == 2
               and set(r["used"].split()) <= set(r["sampled"].split()) for r in tc[1:])
    # the same draw as the FedAvg family's at this seed and D (the key (server, "sampling", round) is shared)
    _, tf = _run("fedavg", {"clients_per_round": 3}, seed=1, rounds=5, n_devices=8)
    assert [r["sampled"] for r in tc] == [r["sampled"] for r in tf]


def test_conventional_sampling_errors():
    with pytest.raises(ConfigError, match="drop_slowest must be less than the clients sampled per round \\(2\\)"):
        _conventional({"clients_per_round": 2, "drop_slowest": 2})
    from fednet.protocols.conventional import ConventionalFL, ConventionalFLConfig
    with pytest.raises(ValueError, match="leaves 3.6 of 4 sampled devices available on average, fewer than the "
                                         "m - drop_slowest = 4"):
        ConventionalFL.check_dropout(ConventionalFLConfig(clients_per_round=4), 8, 0.1)


@pytest.mark.backends
def test_conventional_sampling_passes_check_protocol():
    report = check_protocol(registry.get("conventional"), {"minibatch_fraction": 0.5, "clients_per_round": 5,
                                                           "drop_slowest": 1}, task=make_task(D=8), rounds=2)
    assert report.engine.backends_used()


# -- a user's data set: data.dataset = "module:loader" -------------------------------------------------------------
LOADER = '''
import numpy as np


def blobs():
    """Three Gaussian blobs in 5 dimensions: 120 training and 30 test rows."""
    rng = np.random.default_rng(7)
    centres = np.eye(3, 5) * 4
    y = np.arange(150) % 3
    x = centres[y] + rng.normal(size=(150, 5))
    return x[:120], y[:120], x[120:], y[120:]


def bad_labels():
    x = np.zeros((4, 2))
    return x, np.array([0.5, 1, 0, 1]), x, np.array([0, 1, 0, 1])
'''

DATA_STUDY = """
name = "data"
seeds = [0]
targets = [0.9]
epochs = 3
run_to_end = true
[data]
dataset = "{dataset}"
features = "raw"
partition = "iid"
[network]
n_devices = 4
[[runs]]
label = "FedAvg"
protocol = "fedavg"
params = {{ batch_size = 8, hidden = [8] }}
[[runs]]
label = "conventional"
protocol = "conventional"
"""


def test_dataset_plugin_through_fednet_run(tmp_path, monkeypatch, capsys):
    """A loader beside the study trains both learning set-ups from another folder; its module is in provenance; a
    typo, a missing loader and labels that are not integers are one-line errors (exit 2), nothing written."""
    import json
    import sys

    from fednet.cli import main
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "w30_data.py").write_text(LOADER)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    study = folder / "s.toml"
    try:
        study.write_text(DATA_STUDY.format(dataset="w30_data:blobs"))
        out = tmp_path / "out"
        assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert set(summary["runs"]) == {"FedAvg", "conventional"}
        import pandas as pd
        trace = pd.read_csv(out / "FedAvg" / "trace.csv")
        assert trace["accuracy"].iloc[-1] > 0.5                      # separable blobs: better than chance (1/3)
        prov = json.dumps(json.loads((out / "provenance.json").read_text()))
        assert "dataset loader" in prov and "w30_data.py" in prov
        for dataset, message in (("mnsit", "data.dataset: must be one of"),
                                 ("w30_data:nothing", "has no attribute 'nothing'"),
                                 ("w30_data:bad_labels", "y_train must hold integer class labels")):
            capsys.readouterr()
            study.write_text(DATA_STUDY.format(dataset=dataset))
            assert main(["run", str(study), "--out", str(tmp_path / "bad"), "--quiet"]) == 2
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err, err
            assert not (tmp_path / "bad").exists()
    finally:
        sys.modules.pop("w30_data", None)
