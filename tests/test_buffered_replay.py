"""The ``buffered`` backend (issue 29: FedBuff at scale) against the reference: FedBuff's asynchronous clients
replayed as arrays give the reference processes' traces bit for bit (times, counters, staleness, the model and its
accuracy), the backend declines with a recorded reason where it cannot, and it refuses ties rather than guess."""

from __future__ import annotations

import numpy as np
import pytest

from factories import make_task
from fednet.protocol import registry
from fednet.protocols.fedbuff import FedBuff
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.engine import EngineConfig
from fednet.sim.engine.backends.buffered import UP, WAIT, ClientReplay
from fednet.sim.engine.results import EngineError
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

pytestmark = pytest.mark.backends

RATES = [2e6, 5e5, 1e6, 3e6, 7.5e5, 2.5e5]


def _run(engine: str, D: int, params: dict, *, seed: int = 3, frac: float = 0.5, loss: float = 0.1,
         epochs: int = 25, rates: list[float] | None = None, compute=None, views: bool = False, availability=None,
         protocol: type = FedBuff):
    g = lte_star(D, device_mac_rates=rates or [RATES[i % len(RATES)] for i in range(D)], loss=loss)
    sim = Simulation(g, seed, device_compute=compute or ShiftedExponential(frac), secret_seed=11,
                     record_views=views, engine=EngineConfig.parse(engine), availability=availability)
    proto = protocol(sim, make_task(D=D), params)
    rows = proto.run(epochs)
    return rows, proto, sim


CASES = [  # D, params, seed, setup fraction, loss, epochs
    (6, {"buffer_size": 2}, 3, 0.5, 0.1, 30),
    (8, {"buffer_size": 3, "staleness": "none", "server_lr": 0.5}, 1, 2.0, 0.1, 30),
    (10, {"buffer_size": 10, "staleness": "none"}, 0, 0.5, 0.0, 12),       # K = D: conventional FL
    (12, {"buffer_size": 1}, 5, 1.0, 0.3, 60),
    (20, {"buffer_size": 5, "concurrency": 20, "minibatch_fraction": 0.5}, 2, 0.05, 0.1, 40),
]


@pytest.mark.parametrize("D,params,seed,frac,loss,epochs", CASES)
def test_the_replay_gives_the_reference_trace_bit_for_bit(D, params, seed, frac, loss, epochs) -> None:
    ref, p_ref, s_ref = _run("reference", D, params, seed=seed, frac=frac, loss=loss, epochs=epochs)
    got, p_got, s_got = _run("", D, params, seed=seed, frac=frac, loss=loss, epochs=epochs)
    assert isinstance(p_got.clients, ClientReplay) and p_ref.clients == "reference"
    assert got == ref                                    # every column: time, counters, staleness, accuracy, loss
    assert np.array_equal(p_got.theta, p_ref.theta)
    assert max(r["max_staleness"] for r in got) >= (1 if params["buffer_size"] < D else 0)
    assert s_got.engine_paths.counts[("buffered", "buffered 'gradient'", "buffered")] == epochs
    assert [d.state.iteration for d in p_got.devices] == [d.state.iteration for d in p_ref.devices]


def test_random_networks_and_buffers_agree_with_the_reference() -> None:
    """Twelve drawn set-ups: device count, rates over two decades, loss, buffer size, staleness rule, seed."""
    rng = np.random.default_rng(29)
    for _ in range(12):
        D = int(rng.integers(3, 16))
        params = {"buffer_size": int(rng.integers(1, D + 1)), "staleness": str(rng.choice(["sqrt", "none"])),
                  "minibatch_fraction": float(rng.choice([0.2, 0.5, 1.0]))}
        kw = dict(seed=int(rng.integers(0, 1000)), frac=float(rng.uniform(0.01, 3.0)),
                  loss=float(rng.uniform(0.0, 0.4)), epochs=int(rng.integers(5, 30)),
                  rates=[float(r) for r in 10 ** rng.uniform(5, 7, D)])
        ref, _, _ = _run("reference", D, params, **kw)
        got, proto, _ = _run("", D, params, **kw)
        assert isinstance(proto.clients, ClientReplay)
        assert got == ref, (D, params, kw)


@pytest.mark.parametrize("case,reason", [
    ("concurrency", "a concurrency limit of 3 for 8 clients"),
    ("deterministic", "has no continuous random part"),
    ("views", "the simulation records views"),
    ("dropout", "an availability model other than always available"),
    ("lightsecagg", "client_loop, round overridden"),
])
def test_it_declines_with_the_reason_and_the_reference_runs(case: str, reason: str) -> None:
    kw: dict = {}
    params: dict = {"buffer_size": 2}
    protocol: type = FedBuff
    if case == "concurrency":
        params["concurrency"] = 3
    elif case == "deterministic":
        kw["compute"] = Deterministic()
    elif case == "views":
        kw["views"] = True
    elif case == "dropout":
        kw["availability"] = BernoulliDropout(0.1)
    else:
        protocol = registry.get("fedbuff_lightsecagg")
        params = {"buffer_size": 2, "z": 1, "U": 5}
    rows, proto, sim = _run("", 8, params, epochs=4, protocol=protocol, **kw)
    assert proto.clients == "reference"
    reasons = [r for (kind, _, r), n in sim.engine_paths.reasons.items() if kind == "buffered"]
    assert any(reason in r for r in reasons), reasons
    ref, _, _ = _run("reference", 8, params, epochs=4, protocol=protocol, **kw)
    assert rows == ref


def test_two_arrivals_at_one_time_are_refused_not_guessed() -> None:
    """SimPy orders simultaneous arrivals by insertion, which the replay does not model: it raises instead."""
    _, proto, sim = _run("", 6, {"buffer_size": 2}, epochs=2)
    replay = proto.clients
    replay.stage[:], replay.end[:], replay.version[:] = WAIT, np.inf, proto.version   # everyone waits...
    replay.stage[[1, 4]], replay.end[[1, 4]] = UP, sim.now + 1.0                      # ...but two, who tie
    with pytest.raises(EngineError, match="two updates .* arrive at one time"):
        replay._advance(sim.round, need=2)
