"""Secrets come from a secret stream, never from the public seed (README, "Threat model")."""

from __future__ import annotations

import numpy as np
import pytest

from factories import make_sim, make_task
from fednet.errors import ConfigError
from fednet.sim.rng import SECRET_SEED_ENV, Streams, secret_seed_from_env
from fednet.sim.simulation import Simulation
from fednet.protocols.codedpaddedfl import CodedPaddedFL
from fednet.protocols.codedsecagg import CodedSecAgg
from fednet.protocols.lightsecagg import LightSecAgg
from fednet.topologies.lte import lte_star


def draws(gen: np.random.Generator) -> np.ndarray:
    return gen.integers(0, 2**62, 8, dtype=np.int64)


def test_default_secrets_come_from_os_entropy():
    a, b = Streams(7, 4), Streams(7, 4)          # same public seed
    assert not np.array_equal(draws(a.secret(0, "pads")), draws(b.secret(0, "pads")))
    assert np.array_equal(draws(a.generator(0, "pads")), draws(b.generator(0, "pads")))   # public: replays
    assert isinstance(a.secret(0, "pads").bit_generator, np.random.Philox)


def test_secret_seed_reproduces_secrets_and_is_not_the_public_stream():
    a, b, c = Streams(7, 4, secret_seed=99), Streams(7, 4, secret_seed=99), Streams(7, 4, secret_seed=98)
    assert np.array_equal(draws(a.secret(1, "masks", 3)), draws(b.secret(1, "masks", 3)))
    assert not np.array_equal(draws(a.secret(1, "masks", 3)), draws(c.secret(1, "masks", 3)))
    assert not np.array_equal(draws(a.secret(1, "masks", 3)), draws(a.secret(1, "masks", 4)))
    assert not np.array_equal(draws(a.secret(1, "masks", 3)), draws(a.generator(1, "masks", 3)))
    # one secret seed serves several public seeds with different secrets
    assert not np.array_equal(draws(a.secret(0, "pads")), draws(Streams(8, 4, secret_seed=99).secret(0, "pads")))


@pytest.mark.parametrize("bad", [-1, 7, True, 1.5])
def test_bad_secret_seed_is_refused(bad):
    with pytest.raises(ConfigError, match="secret_seed"):
        Streams(7, 4, secret_seed=bad)


def test_secret_seed_from_env():
    assert secret_seed_from_env({}) is None
    assert secret_seed_from_env({SECRET_SEED_ENV: " 12 "}) == 12
    assert secret_seed_from_env({SECRET_SEED_ENV: "0x10"}) == 16
    for bad in ("-3", "abc", "1.5"):
        with pytest.raises(ConfigError, match=SECRET_SEED_ENV):
            secret_seed_from_env({SECRET_SEED_ENV: bad})


def sim(secret_seed=None, D=6) -> Simulation:
    return Simulation(lte_star(D, device_mac_rates=[1e6] * D), 1, secret_seed=secret_seed)


def flat(payload) -> np.ndarray:
    parts = payload if isinstance(payload, tuple) else (payload,)
    return np.concatenate([np.asarray(p, dtype=object).ravel() for p in parts])


def shares(s: Simulation, kind: str) -> list:
    return [flat(m.payload) for dev in s.devices for m in dev.view if m.kind == kind]


@pytest.mark.parametrize("cls, cfg, kind", [
    (CodedSecAgg, dict(z=1, groups=2), "shamir_share"),
    (LightSecAgg, dict(z=1, U=5), "encoded_mask_relay"),
])
def test_secrets_change_views_not_traces(cls, cfg, kind):
    """Masks and Shamir coefficients cancel exactly: other secrets, same trace; the shares differ."""
    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)
    runs = [(s, cls(s, task, cfg).run(3)) for s in (sim(), sim(secret_seed=5))]
    assert runs[0][1] == runs[1][1]
    a, b = (shares(s, kind) for s, _ in runs)
    assert a and len(a) == len(b)
    assert not any(np.array_equal(x, y) for x, y in zip(a, b))


def test_codedpaddedfl_full_mode_is_reproducible_with_a_secret_seed():
    """Full-mode CodedPaddedFL rounds each padded value within one unit of 2^-f depending on the pad
    (README): with one secret seed, the trace replays bit for bit."""
    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)
    t1 = CodedPaddedFL(sim(secret_seed=5), task, dict(alpha=2)).run(3)
    t2 = CodedPaddedFL(sim(secret_seed=5), task, dict(alpha=2)).run(3)
    assert t1 == t2 and t1[-1]["decode_error"] <= t1[-1]["decode_bound"]


def test_a_share_cannot_be_unpadded_from_the_public_seed():
    """The attack of issue 14: regenerate device j's pad from the public seed and subtract it from the
    padded share a group-mate received; with secret pads the result is not X_j^T X_j."""
    from fednet.algebra.fixed_point import random_ring_limbs, ring_add, ring_from_int
    from fednet.protocols.codedpaddedfl import pack_upper

    s = sim(D=6)
    proto = CodedPaddedFL(s, make_task(D=6, n=12, d=5, c=2, lr=0.5), dict(alpha=2))
    proto.run(0)
    W, d = proto.config.ring_bits, proto.task.d
    msg = next(m for dev in s.devices for m in dev.view if m.kind == "share")
    j = msg.src
    guess = random_ring_limbs((d * (d + 1) // 2,), W, s.rng(s.devices[j], "pads"))   # the old derivation
    recovered = ring_add(msg.payload[0], guess, W, subtract=True)
    truth = ring_from_int(pack_upper(s.devices[j].state.M), W)
    assert not np.array_equal(recovered, truth)
    assert np.mean(recovered == truth) < 0.01                   # not even partly: limbs agree by chance only
