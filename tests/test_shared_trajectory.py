"""Timing-mode runs whose model does not depend on their timing share one trajectory (issue 12, item 3).

LightSecAgg with ``U = D`` sums every user's quantised gradient each round, exactly, so its models depend on the
seed's minibatches, not on ``z`` or the network: the first run on a task computes them, the others take them from
the task (:class:`fednet.protocol.modes.SharedTrajectory`). These tests check that a run that takes them gives the
trace, the model and the counters of a run that computes its own, bit for bit, and that nothing is shared where
the model does depend on the run.
"""

from __future__ import annotations

import numpy as np
import pytest

import fednet.protocols.lightsecagg  # noqa: F401  (registers the protocol)
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.protocols.lightsecagg import LightSecAgg
from fednet.sim.compute import Deterministic
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star
from tests.factories import make_task

D, ROUNDS = 8, 5


def _sim(seed: int = 3, rate: float = 1e6, availability=None) -> Simulation:
    g = lte_star(D, device_mac_rates=[rate] * D, loss=0.1)
    return Simulation(g, seed, device_compute=Deterministic(), availability=availability)


def _run(task: LearningTask, params: dict, sim: Simulation | None = None) -> LightSecAgg:
    proto = registry.get("lightsecagg")(sim or _sim(), task, {"mode": "timing", **params})
    proto.run(ROUNDS)
    return proto


def _own(params: dict, sim: Simulation | None = None) -> LightSecAgg:
    """The run on a task of its own (nothing to share)."""
    return _run(make_task(D=D, n=30, d=5, c=3), params, sim)


def test_lightsecagg_groups_only_timing_runs_that_wait_for_every_user() -> None:
    cfg = LightSecAgg.Config
    group = LightSecAgg.trajectory_group(cfg(mode="timing", z=1), D)
    assert group is not None
    assert LightSecAgg.trajectory_group(cfg(mode="timing", z=3, U=D), D) == group     # z does not matter
    assert LightSecAgg.trajectory_group(cfg(mode="timing", z=1, U=D - 1), D) is None  # the fastest survive
    assert LightSecAgg.trajectory_group(cfg(mode="full", z=1), D) is None             # full mode runs the masks
    assert LightSecAgg.trajectory_group(cfg(mode="timing", z=1, quant_bits=12), D) != group


def test_a_run_on_a_shared_trajectory_equals_one_that_computes_its_own(monkeypatch) -> None:
    task = make_task(D=D, n=30, d=5, c=3)
    first = _run(task, {"z": 1})
    assert sorted(first.trajectory.thetas) == list(range(1, ROUNDS + 1))
    evaluations = []
    evaluate = LearningTask.evaluate
    monkeypatch.setattr(LearningTask, "evaluate", lambda self, theta: evaluations.append(1) or evaluate(self, theta))
    monkeypatch.setattr(LightSecAgg, "_host_gradient", lambda self, i: pytest.fail("a follower computed gradients"))
    second = _run(task, {"z": 3}, _sim(rate=3e5))                  # another z, slower devices: other times
    assert second.trajectory is first.trajectory
    assert len(evaluations) == 1                                    # round 0's model is the run's own zeros
    monkeypatch.undo()
    own = _own({"z": 3}, _sim(rate=3e5))
    assert own.trajectory is not first.trajectory
    assert second.trace == own.trace
    assert np.array_equal(second.theta, own.theta) and second.theta.tobytes() == own.theta.tobytes()
    assert [r["time_s"] for r in second.trace] != [r["time_s"] for r in first.trace]
    assert [r["accuracy"] for r in second.trace] == [r["accuracy"] for r in first.trace]


def test_a_longer_run_continues_the_shared_trajectory_with_its_own_gradients() -> None:
    task = make_task(D=D, n=30, d=5, c=3)
    proto = registry.get("lightsecagg")(_sim(), task, {"mode": "timing", "z": 1})
    proto.run(2)
    longer = _run(task, {"z": 2})                                   # follows 2 rounds, computes 3
    assert sorted(longer.trajectory.thetas) == list(range(1, ROUNDS + 1))
    own = _own({"z": 2})
    assert longer.trace == own.trace and longer.theta.tobytes() == own.theta.tobytes()


def test_a_warm_start_does_not_share() -> None:
    task = make_task(D=D, n=30, d=5, c=3)
    first = _run(task, {"z": 1})
    warm = registry.get("lightsecagg")(_sim(), task, {"mode": "timing", "z": 1})
    warm.theta = np.full_like(warm.theta, 0.01)
    warm.run(ROUNDS)
    assert warm.trajectory is not first.trajectory
    assert warm.trace[0]["loss"] != first.trace[0]["loss"]
    assert warm.theta.tobytes() != first.theta.tobytes()


def test_shared_models_are_read_only() -> None:
    first = _run(make_task(D=D, n=30, d=5, c=3), {"z": 1})
    assert first.theta is first.trajectory.thetas[ROUNDS]
    with pytest.raises(ValueError, match="read-only"):
        first.theta += 1.0


@pytest.mark.parametrize("params,availability", [({"z": 1, "U": D - 1}, None), ({"z": 1, "mode": "full"}, None),
                                                   ({"z": 1}, "dropout")])
def test_nothing_is_shared_where_the_model_depends_on_the_run(params: dict, availability) -> None:
    from fednet.sim.compute import BernoulliDropout

    avail = BernoulliDropout(0.0) if availability == "dropout" else None
    task = make_task(D=D, n=30, d=5, c=3)
    proto = registry.get("lightsecagg")(_sim(availability=avail), task, {"mode": "timing", **params})
    proto.run(1)
    assert proto.trajectory is None
