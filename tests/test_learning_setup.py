"""The learning set-up as a component (fednet.protocol.learning): a protocol subclasses Protocol only and is
configured with RidgeLearning (default), NeuralLearning or VerticalLearning through its ``Learning`` declaration."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from factories import make_sim, make_task
from fednet.learning.federated import add_scaled, local_sgd_delta, weighted_sum
from fednet.learning.models import minibatch_gradient, sum_gradients
from fednet.learning.vertical import VerticalData, as_learning_task
from fednet.protocol import registry
from fednet.protocols.fedvs_baselines import mean_embedding
from fednet.protocol.base import Protocol, ProtocolConfig
from fednet.protocol.learning import Learning, RidgeLearning
from fednet.protocol.neural import NeuralConfig, NeuralLearning, NeuralProtocol
from fednet.protocol.vertical import VerticalConfig, VerticalLearning, VerticalProtocol
from fednet.sim import Deterministic, Simulation
from fednet.topologies.lte import lte_star


def _vertical_task(n: int = 4, M: int = 60, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(0, 1, size=(M + 20, d)) for _ in range(n)]
    y = (sum(x[:, 0] for x in xs) > n / 2).astype(np.int64)
    return as_learning_task(VerticalData([x[:M] for x in xs], y[:M], [x[M:] for x in xs], y[M:], 2, "synthetic"))


def _vertical_sim(n: int = 4, seed: int = 3) -> Simulation:
    g = lte_star(n, uplink_bps=300e6, downlink_bps=300e6, loss=0.0, header_overhead=0.0, server_mac_rate=1e10,
                 device_mac_rates=[1e8] * n)
    return Simulation(g, seed, device_compute=Deterministic(), record_views=False)


class _RidgeSum(Protocol):
    """Minibatch ridge SGD on the default set-up: gather each device's gradient, sum, ``self.mode.update``."""

    def local(self, dev):
        rows = self.minibatch_rows(dev, 3)
        return minibatch_gradient(self.task.X[dev.index], self.task.Y[dev.index], dev.state.received, rows)

    def round(self, epoch):
        replies = yield from self.net.gather(self.devices, self.local, kind="gradient", download=self.theta)
        G = yield from self.net.server_compute(sum_gradients, replies.values)
        self.used = [dev.index for dev in replies.nodes]
        self.mode.update(self, G, 3 * len(self.used))


class _NeuralAvg(Protocol):
    """A two-line FedAvg on the MLP set-up: Learning = NeuralLearning, Config deriving from NeuralConfig."""

    Config = NeuralConfig
    Learning = NeuralLearning
    setup_dropouts = "none"

    def local(self, dev):
        x, y = self.learning.batch(dev)
        return local_sgd_delta(self.model, dev.state.received, x, y, self.learning.lr)[0]

    def round(self, epoch):
        replies = yield from self.net.gather(self.devices, self.local, kind="update", download=self.params)
        self.used = [dev.index for dev in replies.nodes]
        w = [1.0 / len(replies)] * len(replies)
        self.params = yield from self.net.server_compute(
            lambda vs: add_scaled(self.params, 1.0, weighted_sum(vs, w)), replies.values)


class _VerticalMean(Protocol):
    """Each client embeds the round's batch and uploads after its Sec. 6.2 delay; the server steps the split model."""

    Config = VerticalConfig
    Learning = VerticalLearning

    def round(self, epoch):
        rows = self.learning.batch_rows(epoch, self.config.batch_size)
        work = [(dev, self.learning.delayed_upload(dev, lambda d: self.model.embedding(d.index, rows),
                                                   kind="embedding", key_round=epoch)) for dev in self.devices]
        got = yield from self.net.first_k(work, self.sim.n_devices)
        self.used = sorted(dev.index for dev in got.nodes)
        H = yield from self.net.server_compute(mean_embedding, got.values)
        g_H = yield from self.net.server_compute(self.model.server_step, H, rows)
        yield from self.net.compute_each(self.devices, lambda dev: self.model.client_step(dev.index, rows, g_H,
                                                                                          scale=0.25))


def test_ridge_is_the_default_learning_and_theta_is_its_model() -> None:
    p = _RidgeSum(make_sim(D=4), make_task(D=4))
    assert type(p.learning) is RidgeLearning and p.Learning is RidgeLearning
    assert p.theta is p.learning.theta and p.theta.shape == (p.task.d, p.task.c)
    assert not hasattr(p.learning, "params") and getattr(p, "params", None) is None   # finite.py reads it so
    trace = p.run(3)
    assert len(trace) == 4 and np.any(p.theta != 0)
    assert trace[-1]["accuracy"] == p.task.evaluate(p.theta)[0]


def test_a_protocol_configured_with_the_mlp_learns_and_records_its_columns() -> None:
    p = _NeuralAvg(make_sim(D=4), make_task(D=4), {"hidden": [8], "batch_size": 4, "eval_every": 2})
    assert isinstance(p.learning, NeuralLearning)
    assert p.params is p.learning.params and p.model is p.learning.model
    assert getattr(p, "theta", None) is None            # no ridge model on this set-up
    start = {k: v.copy() for k, v in p.params.items()}
    trace = p.run(3)
    assert [r["evaluated"] for r in trace] == [True, False, True, True]    # every 2 rounds and the last one
    assert all(r["skipped"] is False for r in trace)
    assert any(not np.array_equal(start[k], p.params[k]) for k in start)


def test_a_protocol_configured_with_the_vertical_split_model_runs_on_the_delays() -> None:
    cfg = {"embedding": 4, "hidden": [8], "batch_size": 16, "lr_client": 0.5, "lr_server": 0.5}
    p = _VerticalMean(_vertical_sim(), _vertical_task(), cfg)
    assert isinstance(p.learning, VerticalLearning) and p.model is p.learning.model
    assert p.learning.data.n_clients == 4 and len(p.learning.order) == 60
    trace = p.run(2)
    assert len(trace) == 3 and trace[-1]["time_s"] > 0
    assert trace[-1]["accuracy"] == p.learning.evaluate()[0]


def test_the_built_in_protocols_declare_their_learning() -> None:
    for name in ("centralized", "fedavg", "fedavg_is", "fedavg_lightsecagg", "scaffold", "dresfl"):
        cls = registry.get(name)
        assert cls.Learning is NeuralLearning and NeuralProtocol not in cls.__mro__, name
    for name in ("fedvs", "fedvs_wait", "fedvs_ignore", "fedvs_wait_dp", "fedvs_vafl"):
        cls = registry.get(name)
        assert cls.Learning is VerticalLearning and VerticalProtocol not in cls.__mro__, name
    for name in ("conventional", "codedsecagg", "lightsecagg", "secagg"):
        assert registry.get(name).Learning is RidgeLearning, name


def test_a_learning_whose_config_section_is_missing_is_refused_naming_config() -> None:
    with pytest.raises(TypeError, match=r"Bad\.Config = ProtocolConfig must derive from NeuralConfig.*NeuralLearning"):
        class Bad(Protocol):
            Learning = NeuralLearning

    with pytest.raises(TypeError, match=r"Bad2\.Config = .*must derive from VerticalConfig"):
        class Bad2(Protocol):
            Config = NeuralConfig
            Learning = VerticalLearning


def test_a_learning_that_is_not_a_learning_class_is_refused_naming_learning() -> None:
    for wrong in (None, object, "neural", RidgeLearning.step):
        with pytest.raises(TypeError, match=r"Bad\.Learning must be a subclass of fednet\.protocol\.learning\.Learning"):
            class Bad(Protocol):
                Learning = wrong


def test_a_custom_learning_set_up_plugs_in() -> None:
    class ZeroConfig(ProtocolConfig):
        answer: float = 0.25

    class Constant(Learning):
        Config = ZeroConfig

        def evaluate(self):
            return self.protocol.config.answer, 1.0

        def round_metrics(self, round):
            return {"constant": True}

    class Idle(Protocol):
        Config = ZeroConfig
        Learning = Constant

        def round(self, epoch):
            yield from self.net.delay(1.0)

    trace = Idle(make_sim(D=2), make_task(D=2), {"answer": 0.5}).run(2)
    assert [r["accuracy"] for r in trace] == [0.5] * 3 and all(r["constant"] for r in trace)


def test_the_old_base_classes_still_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match="NeuralProtocol is deprecated"):
        class OldAvg(NeuralProtocol):
            def local(self, dev):
                x, y = self.batch(dev)                       # the old names forward to self.learning
                return local_sgd_delta(self.model, dev.state.received, x, y, self.lr)[0]

            def round(self, epoch):
                replies = yield from self.net.gather(self.devices, self.local, kind="update", download=self.params)
                self.used = [dev.index for dev in replies.nodes]
                w = [1.0 / len(replies)] * len(replies)
                self.params = yield from self.net.server_compute(
                    lambda vs: add_scaled(self.params, 1.0, weighted_sum(vs, w)), replies.values)

    cfg = {"hidden": [8], "batch_size": 4}
    old, new = OldAvg(make_sim(D=4), make_task(D=4), cfg), _NeuralAvg(make_sim(D=4), make_task(D=4), cfg)
    assert old.n_params == new.learning.n_params and old.participation() is None
    old.skipped = True
    assert old.learning.skipped is True
    old.skipped = False
    assert old.run(2) == [dict(r, protocol=old.label) for r in new.run(2)]       # the same numbers, bit for bit

    with pytest.warns(DeprecationWarning, match="VerticalProtocol is deprecated"):
        class OldVertical(VerticalProtocol):
            def round(self, epoch):
                yield from self.net.delay(self.delays.upload_delay(0, epoch))

    p = OldVertical(_vertical_sim(), _vertical_task(), {"batch_size": 16})
    assert p.data is p.learning.data and p.order is p.learning.order
    assert np.array_equal(p.batch_rows(1, 16), p.learning.batch_rows(1, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.run(1)
