"""FedBuff (Nguyen et al., AISTATS 2022; issue 29): with K = D, no staleness weight and server_lr = 1 it is
conventional FL bit for bit; staleness is the number of server versions between a client's download and the
step that uses its update; the weights and the buffered sum are the paper's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from factories import make_task
from fednet.algebra.meter import MacMeter
from fednet.protocol import registry
from fednet.protocols.fedbuff import FedBuff, buffered_sum, staleness_weight
from fednet.sim.compute import ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

RATES = [2e6, 5e5, 1e6, 3e6, 7.5e5]


def _sim(D: int, seed: int = 3, compute=None) -> Simulation:
    g = lte_star(D, device_mac_rates=[RATES[i % len(RATES)] for i in range(D)], loss=0.1)
    return Simulation(g, seed, device_compute=compute or ShiftedExponential(0.5), secret_seed=11)


def test_with_k_equal_d_it_is_conventional_fl_bit_for_bit() -> None:
    D, task = 6, make_task(D=6)
    conv = registry.get("conventional")(_sim(D), task, {"minibatch_fraction": 0.5}).run(5)
    buff = FedBuff(_sim(D), task, {"buffer_size": D, "staleness": "none", "minibatch_fraction": 0.5}).run(5)
    assert len(conv) == len(buff) == 6
    for a, b in zip(conv, buff):
        extra = {"version", "staleness", "max_staleness", "protocol"}
        assert {k: v for k, v in b.items() if k not in extra} == {k: v for k, v in a.items() if k != "protocol"}
        assert b["max_staleness"] == 0
    assert [r["version"] for r in buff] == list(range(6))


@pytest.mark.parametrize("K,concurrency", [(2, None), (2, 4), (3, 3)])
def test_staleness_counts_the_versions_between_download_and_step(K: int, concurrency: int | None) -> None:
    """Each buffered update's recorded staleness is the server's version at the step minus the version the
    client downloaded for it (matched download by download, per client, from the messages themselves)."""
    D = 8
    proto = FedBuff(_sim(D, compute=ShiftedExponential(2.0)), make_task(D=8),
                    {"buffer_size": K, "concurrency": concurrency, "staleness": "sqrt"})
    downloads: dict[int, list[int]] = {}
    send = proto.net.send

    def spy(src, dst, payload, *, kind, **kw):
        if kind == "model":                              # the model of the server's current version
            downloads.setdefault(dst.index, []).append(proto.version)
        return (yield from send(src, dst, payload, kind=kind, **kw))
    proto.net.send = spy
    expected = []
    step = FedBuff.round

    def round_(self, epoch):
        before = self.version
        yield from step(self, epoch)
        expected.append([before - downloads[i].pop(0) for i in self.used])       # arrival order
    proto.round = round_.__get__(proto)
    rows = proto.run(15)
    got = [[int(x) for x in r["staleness"].split()] for r in rows[1:]]
    assert got == expected and all(len(s) == K for s in got)
    assert max(map(max, got)) >= 1                      # slow clients do arrive late
    assert [r["version"] for r in rows] == list(range(16))
    assert all(r["max_staleness"] == max(s) for r, s in zip(rows[1:], got))


def test_the_weights_and_the_sum() -> None:
    assert staleness_weight("sqrt", 0) == 1.0 and staleness_weight("sqrt", 3) == 0.5
    assert staleness_weight("none", 7) == 1.0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_weight("sqrt", -1)
    g = [np.full((2, 3), 1.0), np.full((2, 3), 4.0)]
    with MacMeter() as m:
        out = buffered_sum(g, [1.0, 0.5], 2.0)
    assert np.array_equal(out, np.full((2, 3), 2.0 * (1.0 + 2.0))) and m.macs == 2 * 6 + 2 * 6 + 6
    with MacMeter() as m:
        plain = buffered_sum(g, [1.0, 1.0], 1.0)
    assert np.array_equal(plain, np.full((2, 3), 5.0)) and m.macs == 2 * 6


def test_bad_settings_are_refused() -> None:
    from fednet.errors import ConfigError

    with pytest.raises(ConfigError, match="buffer_size must be at most concurrency"):
        FedBuff(_sim(6), make_task(D=6), {"buffer_size": 5, "concurrency": 4})
    with pytest.raises(ConfigError, match="concurrency must be at most the number of devices"):
        FedBuff(_sim(6), make_task(D=6), {"concurrency": 7})
    assert math.isclose(staleness_weight("sqrt", 8), 1 / 3)


def test_check_protocol_passes() -> None:
    from fednet.testing import check_protocol

    report = check_protocol(FedBuff, {"buffer_size": 3, "concurrency": 5}, task=make_task(D=8), rounds=4)
    assert "two runs at one public and one secret seed are identical" in report.explain()
