"""``Net.gather_groups``: the groups' gathers replayed without processes equal the SimPy processes, bit for bit.

Every scenario runs with the ``groups`` backend allowed and disallowed and must give the same trace
(floats by ``repr``), the same messages in every node's view (kind, ends, sizes, send and delivery times, hops) and
the same keyed-draw counters; the replay must really be taken.  Ties (identical devices, no loss, deterministic
compute) check that SimPy's order across groups is reproduced: the server's view and the order in which it decodes
the groups.
"""

from __future__ import annotations

import pytest

import fednet.sim.engine.backends.groups as groups_backend
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import Recorder, engine, snapshot
from test_pinned_traces import SECRET_SEED, digits_task

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends


def count_replays(monkeypatch) -> list[int]:
    """``[n]``: how often the groups backend has run since (it keeps counting)."""
    calls = [0]
    real = groups_backend.fast_groups

    def counting(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(groups_backend, "fast_groups", counting)
    return calls


def run_both(make, monkeypatch) -> tuple[tuple, tuple, int]:
    """Snapshots of ``make()`` with the ``groups`` backend allowed and disallowed, and how often the replay ran with it on."""
    calls = count_replays(monkeypatch)
    engine(monkeypatch)
    on = snapshot(make())
    taken = calls[0]
    engine(monkeypatch, ("groups",))
    off = snapshot(make())
    assert calls[0] == taken
    return on, off, taken


@pytest.mark.parametrize("name", ["codedpaddedfl_grouped_timing", "codedpaddedfl_grouped_full"])
def test_pinned_grouped_scenarios(name: str, monkeypatch) -> None:
    on, off, calls = run_both(Recorder(name), monkeypatch)
    assert calls > 0
    assert on == off


def _cpfl(D: int, params: dict, rounds: int, *, ties: bool = False, dropout: float = 0.0, seed: int = 5,
          random_server: bool = False):
    from fednet.protocols.codedpaddedfl import CodedPaddedFL
    from fednet.sim.compute import BernoulliDropout

    def make():
        if ties:
            g = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D)
            sim = Simulation(g, seed, device_compute=Deterministic(), secret_seed=SECRET_SEED,
                             server_compute=ShiftedExponential(0.5) if random_server else None)
        else:
            g = lte_star(D, loss=0.1, device_mac_rates=[1e6 * (1 + (i % 5)) for i in range(D)])
            sim = Simulation(g, seed, device_compute=ShiftedExponential(0.5), secret_seed=SECRET_SEED,
                             availability=BernoulliDropout(dropout) if dropout else None)
        proto = CodedPaddedFL(sim, digits_task(D, 12, "noniid"), params, label="cpfl")
        proto.run(rounds)
        return proto
    return make


def test_groups_resume_in_simpy_order(monkeypatch) -> None:
    """Every group's last awaited arrival at one instant: what follows each gather (here: the group's place in a
    list, then server work of a size that differs by group) runs in the order SimPy resumes the groups, and the
    server's drawn decoding times go to the same groups."""
    def make_order():
        proto = _cpfl(9, dict(alpha=3, groups=3, mode="timing"), 1, ties=True, random_server=True)()
        order = []

        def then(g, result):
            order.append((g, repr(proto.env.now), [n.index for n in result.nodes]))
            yield from proto.net.server_compute(None, macs=10**6 * (g + 1))
            order.append((g, repr(proto.env.now)))

        def step():
            groups = [[proto.devices[i] for i in group] for group in proto.groups]
            yield from proto.net.gather_groups(groups, proto._device_epoch, kind="coded_gradient", first=[2, 2, 2],
                                               then=then, download=proto.theta, download_kind="epsilon",
                                               download_bits=proto.element_bits, upload_bits=proto.element_bits)
        proto.env.process(step())
        proto.env.run()
        return order

    calls = count_replays(monkeypatch)
    on = make_order()
    assert calls[0] == 2                                   # the run's round and this step
    engine(monkeypatch, ("groups",))
    off = make_order()
    assert on == off
    assert len({t for _, t, *_ in on[:3]}) == 1           # the three groups' arrivals tie


@pytest.mark.parametrize("D,params,ties,dropout", [
    (9, dict(alpha=3, groups=3, mode="timing"), True, 0.0),           # every time ties, within and across groups
    (8, dict(alpha=2, groups=4, mode="timing"), True, 0.0),           # groups of two
    (24, dict(alpha=4, groups=4, mode="timing"), False, 0.0),
    (24, dict(alpha=6, groups=4, mode="timing", sharing_schedule="relay_asap"), False, 0.0),
    (20, dict(alpha=3, groups=5, mode="timing"), False, 0.15),        # absentees: fewer responders some rounds
    (12, dict(alpha=3, groups=3, mode="full"), False, 0.0),
])
def test_replay_equals_processes(D: int, params: dict, ties: bool, dropout: float, monkeypatch) -> None:
    on, off, calls = run_both(_cpfl(D, params, 4, ties=ties, dropout=dropout), monkeypatch)
    assert calls > 0
    assert on[0] == off[0]
    assert on[1] == off[1]
    assert on[2] == off[2]


def test_arguments_are_checked() -> None:
    make = _cpfl(6, dict(alpha=2, groups=2, mode="timing"), 1)
    proto = make()
    nodes = proto.devices

    def drive(gen):
        proto.env.process(gen)
        proto.env.run()

    with pytest.raises(ValueError, match="first gives 1 counts for 2 groups"):
        drive(proto.net.gather_groups([nodes[:3], nodes[3:]], None, kind="x", first=[1], then=None))
    with pytest.raises(ValueError, match="disjoint"):
        drive(proto.net.gather_groups([nodes[:3], nodes[2:]], None, kind="x", first=[1, 1], then=None))
