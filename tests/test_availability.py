"""Faults in every phase: availability drawn once per device and round, setup-phase dropouts with each
protocol's reaction, and paired draws across protocols (issue 14, item 4)."""

from __future__ import annotations

import pytest

from factories import make_task
from fednet.errors import DecodeFailure, FednetError
from fednet.protocol.base import SetupFailure
from fednet.sim.compute import Availability, BernoulliDropout, Deterministic
from fednet.sim.simulation import Simulation
from fednet.protocols.codedpaddedfl import CodedPaddedFL
from fednet.protocols.conventional import ConventionalFL
from fednet.protocols.lightsecagg import LightSecAgg
from fednet.topologies.lte import lte_star


class CountingDropout(Availability):
    """Bernoulli(p) dropout that counts its draws."""

    def __init__(self, p: float) -> None:
        self.p, self.calls = p, 0

    def available(self, node, round, draw):
        self.calls += 1
        return draw() >= self.p


def sim(D=6, p=0.0, seed=1, availability=None) -> Simulation:
    av = availability or (BernoulliDropout(p) if p else None)
    return Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.0), seed,
                      device_compute=Deterministic(), availability=av)


def test_availability_is_drawn_once_per_device_and_round():
    model = CountingDropout(0.5)
    s = sim(D=6, availability=model)
    first = [[s.available(dev, r) for dev in s.devices] for r in range(1, 6)]
    again = [[s.available(dev, r) for dev in s.devices] for r in range(1, 6)]
    assert first == again and model.calls == 30                 # 5 rounds x 6 devices, no redraw
    assert any(not a for row in first for a in row) and any(a for row in first for a in row)
    assert s.absent(3) == [i for i, a in enumerate(first[2]) if not a]
    # the answer is the first keyed uniform of (device, "dropout", round): another simulation agrees
    other = sim(D=6, p=0.5)
    assert [[other.available(dev, r) for dev in other.devices] for r in range(1, 6)] == first
    # a setup attempt (phase >= 1) is its own draw, also taken once
    s.available(s.devices[0], 0, phase=2)
    calls = model.calls
    assert s.available(s.devices[0], 0, phase=2) == s.available(s.devices[0], 0, phase=2) and model.calls == calls


def test_server_is_always_available_and_bad_phase_is_refused():
    s = sim(p=0.9)
    assert s.available(s.server, 4)
    with pytest.raises(ValueError, match="phase must be non-negative"):
        s.available(s.devices[0], 1, phase=-1)


def test_two_protocols_see_identical_draws(monkeypatch):
    """Conventional FL and LightSecAgg at one seed: same minibatch rows per (device, round), same
    availability per (device, round): the comparison is paired."""
    from fednet.protocol.base import Protocol

    seen: dict[str, dict] = {}
    real_rows, real_avail = Protocol.minibatch_rows, Simulation.available

    def rows(self, dev, batch, epoch=None):
        out = real_rows(self, dev, batch, epoch)
        seen[self.name]["rows"][(dev.index, self.epoch if epoch is None else epoch)] = tuple(out)
        return out

    def avail(self, node, round=None, *, phase=0):
        out = real_avail(self, node, round, phase=phase)
        seen[self.tag]["available"][(node.index, self.round if round is None else round)] = out
        return out

    monkeypatch.setattr(Protocol, "minibatch_rows", rows)
    monkeypatch.setattr(Simulation, "available", avail)
    task = make_task(D=6, n=15, d=5, c=2, lr=0.5)
    for cls, cfg in ((ConventionalFL, dict(drop_slowest=3)), (LightSecAgg, dict(z=1, U=3, mode="full"))):
        seen[cls.name] = {"rows": {}, "available": {}}
        s = sim(D=6, p=0.2, seed=4)
        s.tag = cls.name
        cls(s, task, cfg).run(5)
    a, b = seen["conventional"], seen["lightsecagg"]
    common = a["rows"].keys() & b["rows"].keys()
    assert len(common) >= 10 and all(a["rows"][k] == b["rows"][k] for k in common)
    common = a["available"].keys() & b["available"].keys()
    assert len(common) >= 30 and all(a["available"][k] == b["available"][k] for k in common)
    assert not all(a["available"][k] for k in common)            # some dropouts happened


def test_reshare_repeats_the_setup_until_every_device_is_present():
    """CodedPaddedFL (reaction "reshare"): repeated until every device has been present once; with
    deterministic time, each attempt costs one full setup."""
    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)
    base = CodedPaddedFL(sim(D=6), task, dict(alpha=2)).run(0)[0]
    proto = CodedPaddedFL(sim(D=6, p=0.3, seed=2), task, dict(alpha=2))
    row = proto.run(0)[0]
    absent = [set(a) for a in proto.setup_absent]
    assert proto.setup_attempts == len(absent) == row["setup_attempts"] > 1
    # it stops at the first attempt by which every device has been present at least once
    assert set.intersection(*absent) == set() and set.intersection(*absent[:-1]) != set()
    assert row["time_s"] == pytest.approx(proto.setup_attempts * base["time_s"], rel=1e-12)
    assert row["bits_up"] == proto.setup_attempts * base["bits_up"]        # every attempt re-shares


def test_steps_of_a_setup_attempt_read_that_attempts_draw():
    """Inside setup attempt a, ``self.available`` (every primitive's question) answers from attempt a's
    draw -- the one the reaction used -- not from attempt 0's."""
    seen: list[list[int]] = []

    class Watching(CodedPaddedFL):
        def setup(self):
            seen.append([dev.index for dev in self.devices if not self.net.available(dev)])
            yield from super().setup()

    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)
    proto = Watching(sim(D=6, p=0.3, seed=2), task, dict(alpha=2))
    proto.run(1)
    assert proto.setup_attempts > 1 and seen == proto.setup_absent
    assert len({tuple(a) for a in seen}) > 1                     # the attempts' draws differ
    assert proto.sim.phase == 0                                  # rounds read phase 0 again


def test_reshare_gives_up_after_max_attempts_and_fail_fails_at_once():
    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)

    class Impatient(CodedPaddedFL):
        max_setup_attempts = 1

    class Strict(CodedPaddedFL):
        setup_dropouts = "fail"

    with pytest.raises(SetupFailure, match="max_setup_attempts = 1"):
        Impatient(sim(D=6, p=0.3, seed=2), task, dict(alpha=2)).run(1)
    with pytest.raises(SetupFailure, match=r"devices \[.*\] are absent in the setup phase") as err:
        Strict(sim(D=6, p=0.3, seed=2), task, dict(alpha=2)).run(1)
    assert isinstance(err.value, DecodeFailure) and isinstance(err.value, FednetError)


def test_protocols_without_setup_exchange_record_absentees_and_proceed():
    task = make_task(D=6, n=12, d=5, c=2, lr=0.5)
    proto = ConventionalFL(sim(D=6, p=0.3, seed=2), task, dict(drop_slowest=4))
    rows = proto.run(2)
    assert proto.setup_dropouts == "none" and proto.setup_absent and proto.setup_absent[0]
    assert "setup_attempts" not in rows[0] and len(rows) == 3


def test_bad_setup_reaction_is_refused():
    class Odd(ConventionalFL):
        setup_dropouts = "retry"

    with pytest.raises(ValueError, match="setup_dropouts must be one of"):
        Odd(sim(), make_task(D=6, n=12, d=5, c=2), {})


def test_training_steps_of_two_protocols_use_the_same_timing_draw(monkeypatch):
    """LightSecAgg's mask steps draw under their own keys ("compute-mask", "uplink:mask", ...), so its
    training step, model download and gradient upload take the same keyed draws -- index 0 of
    (device, "compute" / "downlink" / "uplink", round) -- as conventional FL's: both straggle and lose
    packets alike."""
    from fednet.sim.rng import Streams

    calls: dict[str, list] = {}
    real = Streams.uniform

    def spy(self, node, purpose, round):
        value = real(self, node, purpose, round)
        calls[self.tag].append((node, purpose, round, value))
        return value

    real_many = Streams.uniforms

    def spy_many(self, nodes, purpose, round):          # the vectorised draws of gather's fast path
        values = real_many(self, nodes, purpose, round)
        calls[self.tag].extend((int(n), purpose, round, float(v)) for n, v in zip(nodes, values))
        return values

    monkeypatch.setattr(Streams, "uniform", spy)
    monkeypatch.setattr(Streams, "uniforms", spy_many)
    task = make_task(D=6, n=15, d=5, c=2, lr=0.5)
    for cls, cfg in ((ConventionalFL, {}), (LightSecAgg, dict(z=1, U=6, mode="full"))):
        s = Simulation(lte_star(6, device_mac_rates=[1e6] * 6, loss=0.1), 4)     # shifted-exponential compute
        s.streams.tag = cls.name
        calls[cls.name] = []
        cls(s, task, cfg).run(3)
    for purpose in ("compute", "downlink", "uplink"):
        train = {name: sorted((n, r, v) for n, p, r, v in c if p == purpose and n < 6 and r > 0)
                 for name, c in calls.items()}
        assert train["conventional"] == train["lightsecagg"], purpose    # same draws, one per device and round
        assert len(train["conventional"]) == 6 * 3
    assert {"compute-mask", "uplink:mask", "downlink:mask"} <= {p for _, p, _, _ in calls["lightsecagg"]}
