"""A reduced fig7_mnist gives the same traces serially, with ``--jobs 2`` and with the speed-ups off (issue 12).

The study is the bundled ``studies/fig7_mnist.toml`` itself (CodedSecAgg under both schedules and
accountings, CodedPaddedFL, LightSecAgg with U < D and U = D), shrunk with overrides to the embedded
digits data, 40 random features, 2 seeds and 3 epochs, so that it runs in seconds. "Speed-ups off"
means: every per-task memo recomputed (:meth:`LearningTask.memo`), the full-batch trajectory rebuilt
on every request, LightSecAgg's minibatch rows redrawn on every request and its timing-mode
gradients computed the way they were before (every available user's, survivor or not, with one stacked
``np.matmul`` over users of the same shapes, a :func:`~fednet.algebra.quantize.quantize` per user).
"""

from __future__ import annotations

import numpy as np
import pytest

from fednet.errors import TrainingFailure
from fednet.algebra.quantize import quantize
from fednet.learning.task import LearningTask
from fednet.learning.trajectory import FullBatchTrajectory
from fednet.study.config import load_study
from fednet.study.runner import run_study

RUNS = ["CodedSecAgg z=1 N=2 relay_asap fednet", "CodedSecAgg z=12 N=3 relay_steps paper",
        "CodedPaddedFL N=8 alpha=12 relay_asap paper", "LightSecAgg z=1 U=120", "LightSecAgg z=1 U=96",
        "LightSecAgg z=12 U=120"]


def _study():
    return load_study("studies/fig7_mnist.toml", sets=['data.dataset="digits"', "data.n_components=40",
                                                       "seeds=[0,1]"], only_runs=RUNS, max_epochs=3)


def _stacked_host_gradient(self, i: int) -> np.ndarray:
    """LightSecAgg's timing-mode gradients as computed before issue 12's rewrite (the reference): every available
    user's at once, when the first is asked for, with a quantize check per user."""
    if self._host_batch[0] != self.epoch:
        b, epoch = self.config.quant_bits, self.epoch
        theta = self.theta.astype(np.float32).astype(np.float64)
        out: dict[int, np.ndarray] = {}
        shapes: dict[tuple[int, int], list] = {}
        for dev in (dev for dev in self.devices if self.net.available(dev)):
            shapes.setdefault((self.task.X[dev.index].shape[0], dev.state.batch), []).append(dev)
        for (n, bsz), group in shapes.items():
            for start in range(0, len(group), 32):
                part = group[start:start + 32]
                rows = [self.minibatch_rows(dev, dev.state.batch, epoch) for dev in part]
                Xb = np.stack([self.task.X[dev.index][r] for dev, r in zip(part, rows)])
                Yb = np.stack([self.task.Y[dev.index][r] for dev, r in zip(part, rows)])
                G = np.matmul(Xb.transpose(0, 2, 1), np.matmul(Xb, theta) - Yb) * (n / bsz)
                for dev, g in zip(part, G):
                    quantize(g.reshape(-1), b, self.config.p, n_summands=self.U)
                    out[dev.index] = np.rint(g * 2.0**b) / 2.0**b
        self._host_batch = (self.epoch, out)
    return self._host_batch[1][i]


def _uncached_trajectory(self, upto: int):
    key = (self.learning_rate, tuple(self.lr_milestones), self.lr_decay, self.weight_decay)
    return FullBatchTrajectory(self.model, self.optimizer, self.X, self.Y, self.x_test, self.y_test,
                               key=key).upto(upto)


def _traces(result) -> dict:
    return {label: {seed: [dict(r) for r in rows] for seed, rows in by.items()} for label, by in result.traces.items()}


@pytest.fixture(scope="module")
def serial():
    study = _study()
    assert [r.name for r in study.runs] == RUNS and study.seeds == [0, 1]
    return run_study(study, None, progress=False, plot=False)


def test_reduced_fig7_runs_every_protocol(serial) -> None:
    for label in RUNS:
        for seed in (0, 1):
            rows = serial.traces[label][seed]
            assert [r["round"] for r in rows] == [0, 1, 2, 3]
            assert rows[-1]["time_s"] > rows[1]["time_s"] > 0.0
    # exactly decoding schemes follow one trajectory per seed; the feature draw differs between seeds
    acc = {s: [r["accuracy"] for r in serial.traces[RUNS[0]][s]] for s in (0, 1)}
    for label in RUNS[1:3]:
        for s in (0, 1):
            assert [r["accuracy"] for r in serial.traces[label][s]] == acc[s]
    assert acc[0] != acc[1]


def test_reduced_fig7_is_identical_with_the_speed_ups_off(serial, monkeypatch) -> None:
    import fednet.protocols.lightsecagg as lsa

    monkeypatch.setattr(LearningTask, "memo", lambda self, key, compute: compute())
    monkeypatch.setattr(LearningTask, "full_batch_trajectory", _uncached_trajectory)
    monkeypatch.setattr(lsa.LightSecAgg, "_rows", lambda self, dev, epoch: self.minibatch_rows(dev, dev.state.batch,
                                                                                                epoch))
    monkeypatch.setattr(lsa.LightSecAgg, "_host_gradient", _stacked_host_gradient)
    plain = run_study(_study(), None, progress=False, plot=False)
    assert _traces(plain) == _traces(serial)
    assert plain.summary == serial.summary


def test_reduced_fig7_is_identical_with_jobs_2(serial) -> None:
    pytest.importorskip("distributed")
    par = run_study(_study(), None, progress=False, plot=False, jobs=2)
    assert _traces(par) == _traces(serial)
    assert par.summary == serial.summary


def test_per_user_gradients_equal_the_stacked_product_at_fig7_shapes() -> None:
    """At MNIST's shapes (b = 100 of n = 500 rows, d = 2000, c = 10) a 2-D product per user gives the
    stacked ``np.matmul``'s floats bit for bit (both are one BLAS GEMM per user)."""
    rng = np.random.default_rng(7)
    X = [rng.standard_normal((500, 2000)) * 0.03 for _ in range(3)]
    Y = [np.eye(10)[rng.integers(0, 10, 500)] for _ in range(3)]
    theta = rng.standard_normal((2000, 10)).astype(np.float32).astype(np.float64)
    rows = [rng.choice(500, size=100, replace=False) for _ in range(3)]
    Xb = np.stack([x[r] for x, r in zip(X, rows)])
    Yb = np.stack([y[r] for y, r in zip(Y, rows)])
    stacked = np.matmul(Xb.transpose(0, 2, 1), np.matmul(Xb, theta) - Yb) * 5.0
    for i in range(3):
        one = (X[i][rows[i]].T @ (X[i][rows[i]] @ theta - Y[i][rows[i]])) * 5.0
        assert np.array_equal(one, stacked[i])


@pytest.mark.parametrize("scale,error", [(1e9, "the smallest prime that works"),
                                         (np.nan, "must be finite|non-finite model parameter theta")])
def test_lightsecagg_timing_gradients_keep_the_capacity_check(scale: float, error: str) -> None:
    """One check per round over every user still refuses a quantised gradient the field cannot sum
    (with quantize's own message), and a non-finite one."""
    from tests.factories import make_sim, make_task

    import fednet.protocols.lightsecagg  # noqa: F401
    from fednet.protocol import registry

    proto = registry.get("lightsecagg")(make_sim(D=6), make_task(D=6, n=20, d=6, c=3),
                                        dict(z=1, U=5, mode="timing"))
    proto.run(1)                                    # a normal round
    proto.theta = np.full_like(proto.theta, scale)
    with pytest.raises((ValueError, TrainingFailure), match=error):    # a NaN model: refused as such (issue 33)
        proto.run(2)
