"""The Model interface: RidgeModel + SGD reproduce Protocol.step / LearningTask.evaluate bit for bit,
schedules, flatten/unflatten, the full-batch trajectory, metering."""

from __future__ import annotations

import numpy as np
import pytest

from fednet.algebra.meter import MacMeter
from fednet.learning.model import (
    SGD,
    ConstantSchedule,
    ExponentialSchedule,
    RidgeModel,
    StepSchedule,
    as_targets,
    flatten,
    unflatten,
)
from fednet.learning.models import ridge_gradient
from fednet.learning.task import LearningTask
from fednet.learning.trajectory import FullBatchTrajectory


def _task(D=4, n=15, d=7, c=3, seed=0, lr=6.0) -> LearningTask:
    rng = np.random.default_rng(seed)
    X = [rng.uniform(-0.5, 0.5, (n + i, d)) for i in range(D)]
    Y = [np.eye(c)[rng.integers(0, c, n + i)] for i in range(D)]
    return LearningTask(X, Y, rng.uniform(-0.5, 0.5, (50, d)), rng.integers(0, c, 50), learning_rate=lr,
                        lr_milestones=(3, 5), lr_decay=0.8, weight_decay=9e-3)


def _old_step_size(task: LearningTask, epoch: int) -> float:
    """LearningTask.step_size as it was before the Model interface (verbatim)."""
    return task.learning_rate * task.lr_decay ** sum(1 for e in task.lr_milestones if epoch >= e)


def _old_protocol_step(task: LearningTask, theta: np.ndarray, G: np.ndarray, m_used: int, epoch: int) -> np.ndarray:
    """Protocol.step of fednet/protocol/base.py (verbatim)."""
    mu = _old_step_size(task, epoch)
    return theta - mu * (G / m_used + task.weight_decay * theta)


def _old_evaluate(task: LearningTask, theta: np.ndarray) -> tuple[float, float]:
    """LearningTask.evaluate as it was before the Model interface (verbatim)."""
    y1 = np.eye(task.c)[np.asarray(task.y_test, dtype=np.int64)]
    pred = task.x_test @ theta
    acc = float(np.mean(np.argmax(pred, axis=1) == task.y_test))
    r = pred - y1
    loss = float(0.5 * np.sum(r * r) / len(task.y_test) + 0.5 * task.weight_decay * np.sum(theta * theta))
    return acc, loss


def _old_trajectory(task: LearningTask, upto: int) -> list[tuple[float, float]]:
    """LearningTask.full_batch_trajectory as it was (verbatim arithmetic)."""
    XtX = sum(x.T @ x for x in task.X)
    XtY = sum(x.T @ y for x, y in zip(task.X, task.Y))
    theta = np.zeros((task.d, task.c))
    rows = [_old_evaluate(task, theta)]
    for e in range(1, upto + 1):
        G = XtX @ theta - XtY
        theta = theta - _old_step_size(task, e) * (G / task.m + task.weight_decay * theta)
        rows.append(_old_evaluate(task, theta))
    return rows


def test_ridge_sgd_reproduces_protocol_step_and_evaluate_bit_for_bit() -> None:
    task = _task()
    model, opt = task.model, task.optimizer
    theta_old = theta_new = model.init_params()["theta"]
    rng = np.random.default_rng(5)
    for epoch in range(1, 9):
        used = sorted(rng.choice(task.n_devices, size=3, replace=False))
        G = sum(model.gradient(theta_new, task.X[i], task.Y[i])["theta"] for i in used)
        m_used = sum(task.n_points[i] for i in used)
        theta_old = _old_protocol_step(task, theta_old, G, m_used, epoch)
        theta_new = opt.step(theta_new, G, m_used, epoch)
        assert np.array_equal(theta_old, theta_new) and theta_new.dtype == np.float64
        assert task.evaluate(theta_new) == _old_evaluate(task, theta_old)
        assert model.evaluate({"theta": theta_new}, task.x_test, task.y_test) == _old_evaluate(task, theta_old)
        assert task.step_size(epoch) == _old_step_size(task, epoch)
    # the dict form gives the same arrays
    out = opt.step({"theta": theta_new}, {"theta": G}, 17, 4)
    assert np.array_equal(out["theta"], _old_protocol_step(task, theta_new, G, 17, 4))


def test_ridge_model_gradient_is_ridge_gradient_and_metered() -> None:
    task = _task()
    model = task.model
    rng = np.random.default_rng(1)
    theta = rng.normal(size=(task.d, task.c))
    x, y = task.X[2], task.Y[2]
    b, d, c = x.shape[0], task.d, task.c
    with MacMeter() as m:
        g = model.gradient(theta, x, y)
    assert m.macs == 2 * b * d * c
    assert np.array_equal(g["theta"], ridge_gradient(x, y, theta))
    # labels instead of one-hot rows give the same gradient
    assert np.array_equal(model.gradient(theta, x, np.argmax(y, axis=1))["theta"], g["theta"])
    with MacMeter() as m:
        out = model.forward({"theta": theta}, x)
    assert m.macs == b * d * c and np.array_equal(out, x @ theta)
    with MacMeter() as m:
        val = model.loss(theta, x, y)
    assert m.macs == b * d * c + b * c + d * c
    r = x @ theta - y
    assert val == pytest.approx(0.5 * np.sum(r * r) / b + 0.5 * task.weight_decay * np.sum(theta * theta), rel=1e-14)
    with MacMeter() as m:
        gp, gx = model.backward(theta, x, r)
    assert m.macs == 2 * b * d * c
    np.testing.assert_allclose(gp["theta"], g["theta"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, r @ theta.T, rtol=1e-12)
    with MacMeter() as m:
        g2, gx2 = model.gradient_with_input(theta, x, y)
    assert m.macs == 3 * b * d * c
    assert np.array_equal(g2["theta"], g["theta"]) and np.array_equal(gx2, gx)
    with MacMeter() as m:
        task.evaluate(theta)
        model.predict(theta, x)
    assert m.macs == 0  # the observer's work is free


def test_sgd_charges_two_macs_per_parameter_and_checks_arguments() -> None:
    opt = SGD(StepSchedule(0.5), weight_decay=0.1)
    with MacMeter() as m:
        out = opt.step({"a": np.ones((2, 3)), "b": np.ones(4)}, {"a": np.ones((2, 3)), "b": np.zeros(4)}, 2, 1)
    assert m.macs == 2 * 10
    np.testing.assert_array_equal(out["a"], np.full((2, 3), 1 - 0.5 * (0.5 + 0.1)))
    np.testing.assert_array_equal(out["b"], np.full(4, 1 - 0.5 * 0.1))
    with pytest.raises(ValueError, match="m_used"):
        opt.step(np.ones(2), np.ones(2), 0, 1)
    with pytest.raises(ValueError, match="shape"):
        opt.step(np.ones(2), np.ones(3), 1, 1)
    with pytest.raises(ValueError, match="name"):
        opt.step({"a": np.ones(2)}, {"b": np.ones(2)}, 1, 1)
    with pytest.raises(ValueError, match="weight_decay"):
        SGD(0.1, weight_decay=-1.0)


def test_schedules() -> None:
    s = StepSchedule(6.0, (200, 350), 0.8)
    assert [s(e) for e in (1, 199, 200, 349, 350, 1000)] == [6.0, 6.0, 6.0 * 0.8, 6.0 * 0.8, 6.0 * 0.8 ** 2,
                                                             6.0 * 0.8 ** 2]
    dres = StepSchedule(0.1, decay=0.65, every=1500)  # DReS-FL, App. B
    assert dres(1499) == 0.1 and dres(1500) == 0.1 * 0.65 and dres(4500) == 0.1 * 0.65 ** 3
    assert ExponentialSchedule(0.1, 0.97)(1) == 0.1 and ExponentialSchedule(0.1, 0.97)(3) == 0.1 * 0.97 ** 2
    assert ConstantSchedule(0.3)(77) == 0.3
    with pytest.raises(ValueError, match="learning_rate"):
        StepSchedule(0.0)
    with pytest.raises(ValueError, match="every"):
        StepSchedule(0.1, every=0)
    with pytest.raises(ValueError, match="decay"):
        ExponentialSchedule(0.1, 1.5)


def test_flatten_unflatten_roundtrip() -> None:
    shapes = {"w1": (3, 4), "b1": (4,), "w2": (4, 2)}
    rng = np.random.default_rng(0)
    p = {k: rng.normal(size=s) for k, s in shapes.items()}
    v = flatten(p)
    assert v.shape == (24,)
    assert np.array_equal(v[:12], p["w1"].ravel()) and np.array_equal(v[12:16], p["b1"])
    back = unflatten(v, shapes)
    assert list(back) == list(shapes) and all(np.array_equal(back[k], p[k]) for k in shapes)
    with pytest.raises(ValueError, match="expected \\(24,\\)"):
        unflatten(v[:-1], shapes)


def test_full_batch_trajectory_bit_identical_to_the_old_cache() -> None:
    task = _task()
    rows = task.full_batch_trajectory(8)
    assert rows == _old_trajectory(task, 8)
    assert task.full_batch_trajectory(3) is rows  # cached
    # a generic model (not the Gram path) sums Model.gradient: same numbers to rounding
    class Plain(RidgeModel):
        pass

    plain = FullBatchTrajectory(Plain(task.d, task.c, task.weight_decay), task.optimizer, task.X, task.Y,
                                task.x_test, task.y_test)
    np.testing.assert_allclose(np.array(plain.upto(8)), np.array(rows), rtol=1e-10)


def test_params_and_argument_errors() -> None:
    model = RidgeModel(3, 2, 0.0)
    assert model.n_params == 6 and model.param_shapes() == {"theta": (3, 2)}
    with pytest.raises(ValueError, match="theta"):
        model.forward({"w": np.zeros((3, 2))}, np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"x must have shape \(b, 3\)"):
        model.forward(np.zeros((3, 2)), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="n_inputs"):
        RidgeModel(0, 2)
    with pytest.raises(ValueError, match="labels"):
        as_targets(np.array([0, 2]), 2)


def test_sgd_equals_the_real_protocol_step() -> None:
    """Against fednet.protocol.base.Protocol.step itself (what the coordinator replaces by the optimizer)."""
    from factories import make_sim

    from fednet.protocol.base import Protocol

    task = _task(D=4)
    proto = Protocol(make_sim(D=4), task)
    rng = np.random.default_rng(7)
    theta = proto.theta
    for epoch in range(1, 7):
        proto.epoch = epoch
        G = rng.normal(size=theta.shape)
        proto.step(G, 23)
        theta = task.optimizer.step(theta, G, 23, epoch)
        assert np.array_equal(proto.theta, theta)
        assert proto.evaluate() == task.model.evaluate(theta, task.x_test, task.y_test)


def test_check_model_accepts_the_ridge_model_and_catches_a_breach() -> None:
    from fednet.learning.model import check_model

    task = _task()
    p = check_model(task.model, task.X[0], task.Y[0])
    assert np.array_equal(p["theta"], np.zeros((task.d, task.c)))

    class FreeForward(RidgeModel):
        def forward(self, params, x):
            return np.asarray(x) @ self.as_params(params)["theta"]  # plain numpy: charged nothing

    with pytest.raises(AssertionError, match="forward charged no MACs"):
        check_model(FreeForward(task.d, task.c), task.X[0], task.Y[0])
