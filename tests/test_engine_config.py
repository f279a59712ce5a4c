"""The engine's configuration, its recorded paths and the preconditions it checks instead of trusting
(:mod:`fednet.sim.engine`): no silent change of a time, no silent fallback, no protocol name shadowing the engine."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from fednet.algebra.meter import matmul
from fednet.errors import ConfigError
from fednet.sim.compute import Deterministic
from fednet.sim.engine import BACKENDS, EngineConfig
from fednet.sim.engine.results import EngineError, batched
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star
from factories import make_task
from test_primitives import Probe, work  # noqa: E402 (shared probe protocol)

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends

D = 6


def sim_of(engine: EngineConfig | None = None, record_views: bool = False) -> Simulation:
    g = lte_star(D, loss=0.0, device_mac_rates=[1e3 * (i + 1) for i in range(D)])
    return Simulation(g, 0, device_compute=Deterministic(), record_views=record_views, engine=engine)


def run(body, sim: Simulation, rounds: int = 1) -> Probe:
    p = type("P", (Probe,), {"body": staticmethod(body)})(sim, make_task(D=D))
    p.run(rounds)
    return p


# -- configuration ---------------------------------------------------------------------------------------------------
def test_parse_names_and_errors() -> None:
    assert EngineConfig.parse(None).allowed == frozenset(BACKENDS)
    assert EngineConfig.parse("reference").reference
    assert EngineConfig.parse("-tree,-batched").allowed == frozenset(BACKENDS) - {"tree", "batched"}
    assert EngineConfig.parse("gather, batched").allowed == {"gather", "batched"}
    with pytest.raises(ConfigError, match="'treee'"):
        EngineConfig.parse("-treee")
    with pytest.raises(ConfigError, match="mixes"):
        EngineConfig.parse("gather,-tree")
    with pytest.raises(TypeError, match="EngineConfig"):
        Simulation(lte_star(2, device_mac_rates=[1e6, 1e6]), 0, engine="reference")


def test_environment_sets_the_default(monkeypatch) -> None:
    monkeypatch.setenv("FEDNET_ENGINE", "reference")
    assert sim_of().engine.reference
    monkeypatch.delenv("FEDNET_ENGINE")
    assert sim_of().engine.allowed == frozenset(BACKENDS)


# -- recorded paths ----------------------------------------------------------------------------------------------------
def test_paths_record_the_backend_and_the_reasons() -> None:
    p = run(lambda self: self.net.gather(self.devices, work, kind="g"), sim_of())
    assert p.sim.engine_paths.count("gather", "gather") == 1
    p = run(lambda self: self.net.gather(self.devices, work, kind="g"), sim_of(EngineConfig.parse("reference")))
    paths = p.sim.engine_paths
    assert paths.count("reference", "gather") == 1 and paths.count("gather") == 0
    assert "gather: not allowed by the engine configuration" in paths.explain()
    rows = paths.as_dict()
    assert json.loads(json.dumps(rows)) == rows                      # JSON-ready for timing.json
    p = run(lambda self: self.net.gather(self.devices, work, kind="g", deadline=10.0), sim_of())
    assert p.sim.engine_paths.count("reference", "gather") == 1
    assert "the step has a deadline" in p.sim.engine_paths.explain()


@batched(lambda nodes, received: ([work(n) for n in nodes], [1000] * len(nodes)))
def _work_batched(node):
    return work(node)


def _tree_round(self):
    tree = nx.DiGraph([(0, 1), (2, 1), (3, 4), (5, 4)])
    out = yield from self.net.tree_aggregate(
        tree, _work_batched, lambda a, b: a + b + 0 * matmul(np.ones((1, 1)), np.ones((1, 1))), kind="t",
        root_kind="r", n_elements=100, element_bits=32)
    return out


def test_recorded_views_fall_back_with_a_recorded_reason() -> None:
    """record_views=True no longer disables the tree replay silently: the fallback and its reason are recorded."""
    replayed = run(_tree_round, sim_of(record_views=False))
    assert replayed.sim.engine_paths.count("tree", "tree") == 1
    viewed = run(_tree_round, sim_of(record_views=True))
    assert viewed.sim.engine_paths.count("reference", "tree") == 1
    assert "views are recorded" in viewed.sim.engine_paths.explain()
    assert viewed.sim.now == replayed.sim.now                       # the same times either way


# -- exclusivity is checked, not trusted -------------------------------------------------------------------------------
def _exchange_with_background(exclusive: bool):
    def body(self):
        devs = self.devices
        pairs = [[(devs[0], devs[1]), (devs[2], devs[3])]]
        bg = self.net.background(self.net.send(devs[0], self.sim.server, np.zeros(20_000), kind="other",
                                                    element_bits=32))
        got = yield from self.net.exchange(pairs, lambda s, d: np.zeros(10_000), kind="share", n_elements=10_000,
                                           element_bits=32, schedule="relay_steps", exclusive=exclusive)
        yield bg
        return got
    return body


def test_a_violated_exclusive_promise_raises_instead_of_changing_a_time() -> None:
    """A background upload on an uplink of an exclusive exchange: the replay's times would be wrong (the issue's
    1.408 s instead of 1.45376 s); it raises EngineError naming the step, and without the promise the reference
    runs and gives the true time."""
    with pytest.raises(EngineError, match="exchange 'share'.*another process used"):
        run(_exchange_with_background(True), sim_of())
    honest = run(_exchange_with_background(False), sim_of())
    assert honest.sim.engine_paths.count("reference", "exchange") == 1
    reference = run(_exchange_with_background(True), sim_of(EngineConfig.parse("reference")))
    assert reference.sim.now == honest.sim.now


# -- composition ------------------------------------------------------------------------------------------------------
def test_a_protocol_method_cannot_shadow_the_engine() -> None:
    """A protocol method named like a primitive is the protocol's own: the engine (``self.net``) keeps its own,
    and the backends still run."""
    class Shadowing(Probe):
        def send(self, *a, **k):                                     # noqa: D102
            raise AssertionError("the engine must not call a protocol's send")

        def gather(self, *a, **k):                                   # noqa: D102
            raise AssertionError("the engine must not call a protocol's gather")

    p = Shadowing.__new__(type("S", (Shadowing,), {"body": staticmethod(
        lambda self: self.net.gather(self.devices, work, kind="g", download=np.zeros(3)))}))
    p.__init__(sim_of(), make_task(D=D))
    p.run(1)
    assert p.sim.engine_paths.count("gather", "gather") == 1
