"""CodedSecAgg's set-up exchange (the relayed Shamir shares, ``relay_asap`` and ``relay_steps``) is pinned bit for bit
(and, below, its aggregation-tree epochs with absent devices, and CodedPaddedFL's share exchange on and off the replay).

Each scenario runs the set-up and two epochs and is reduced to a digest of its trace (floats by ``repr``), of every
node's view and relay list (kinds, ends, sizes, send and delivery times, hops) and of the keyed-draw counters
(:func:`test_fast_path.snapshot`), with views recorded and without.  The digests were recorded before the
exchange had an event-free path and must not move.  The scenarios cover grouping N > 1 and N = 1, both schedules,
both accountings (``paper``: every group encodes and shares on its own, the groups' exchanges overlapping), lossy
identical links (one packet a message: discrete link times, so equal upload ends at one receiver are common),
two uplink rates, and a loss-free deterministic network where every time ties.

Kernels: the digests that moved were recomputed on 2026-11-27 by c3c7045's code (which had reproduced the earlier
ones on other hosts) on an AVX2-only host, where floating-point results differ in their last digits (the same
scenarios' pinned traces: the test loss alone, ``tests/test_pinned_traces.py``): kernels that sum in another order
(AVX-512 ones where a host has them; ``fednet.PORTABLE_KERNELS`` now pins the AVX2 kernels everywhere).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fednet.protocols.codedsecagg import CodedSecAgg, CodedSecAggConfig
from fednet.sim.compute import Deterministic, ShiftedExponential
from fednet.sim.simulation import Simulation
from fednet.topologies.lte import lte_star

from test_fast_path import run_both, snapshot  # noqa: E402
from test_pinned_traces import SECRET_SEED, digits_task  # noqa: E402

#: These tests check the backends themselves (tests/conftest.py: every backend allowed).
pytestmark = pytest.mark.backends

#: name -> (D, seed, protocol parameters, network): "lossy" (loss 0.1, one uplink rate), "two_rates" (uplinks of
#: 5 and 2.5 Mbit/s, loss 0.1) or "ties" (loss 0, one MAC rate, deterministic compute)
SETUP_SCENARIOS = {
    "asap_N3": (12, 3, dict(z=1, groups=3, sharing_schedule="relay_asap"), "lossy"),
    "asap_N1": (10, 4, dict(z=2, groups=1, sharing_schedule="relay_asap"), "lossy"),
    "steps_N3": (12, 5, dict(z=1, groups=3, sharing_schedule="relay_steps"), "lossy"),
    "steps_N1": (10, 6, dict(z=2, groups=1, sharing_schedule="relay_steps"), "lossy"),
    "asap_N2_paper": (12, 7, dict(z=1, groups=2, sharing_schedule="relay_asap", **CodedSecAggConfig.paper_accounting),
                      "lossy"),
    "steps_N3_paper": (12, 8, dict(z=1, groups=3, sharing_schedule="relay_steps",
                                   **CodedSecAggConfig.paper_accounting), "lossy"),
    "asap_N2_two_rates": (16, 9, dict(z=1, groups=2, sharing_schedule="relay_asap"), "two_rates"),
    "asap_N1_ties": (9, 10, dict(z=2, groups=1, sharing_schedule="relay_asap"), "ties"),
    "steps_N3_ties": (9, 11, dict(z=1, groups=3, sharing_schedule="relay_steps"), "ties"),
    "asap_N3_full": (12, 12, dict(z=1, groups=3, sharing_schedule="relay_asap", mode="full"), "lossy"),
    "asap_N1_40_two_rates": (40, 13, dict(z=1, groups=1, sharing_schedule="relay_asap"), "two_rates"),
}


def setup_run(name: str, record_views: bool = True) -> CodedSecAgg:
    """The scenario ``name`` run for its set-up and two epochs (timing mode unless it says otherwise)."""
    D, seed, params, network = SETUP_SCENARIOS[name]
    rates = [2e6 * (1 + (i % 4)) for i in range(D)]
    if network == "ties":
        g, compute = lte_star(D, loss=0.0, device_mac_rates=[4e6] * D), Deterministic()
    else:
        uplinks = [5e6 if i % 2 else 2.5e6 for i in range(D)] if network == "two_rates" else 5e6
        g, compute = lte_star(D, loss=0.1, uplink_bps=uplinks, device_mac_rates=rates), ShiftedExponential(0.5)
    sim = Simulation(g, seed, device_compute=compute, record_views=record_views, secret_seed=SECRET_SEED)
    proto = CodedSecAgg(sim, digits_task(D, 16, "noniid"), dict(dict(mode="timing"), **params), label=name)
    proto.run(2)
    return proto


def digest(proto: CodedSecAgg) -> str:
    """SHA-256 (16 hex digits) of the run's :func:`test_fast_path.snapshot`."""
    return hashlib.sha256(repr(snapshot(proto)).encode()).hexdigest()[:16]


#: (name, record_views) -> digest, recorded before the set-up exchange had an event-free path
PINNED: dict[tuple[str, bool], str] = {
    ("asap_N1", True): "bdc586ca610474b7",
    ("asap_N1", False): "fc8711fd4c985774",
    ("asap_N1_ties", True): "a73a1074c7221c5f",
    ("asap_N1_ties", False): "8ab2bab8a70464df",
    ("asap_N2_paper", True): "4cc4574f27e9ba77",
    ("asap_N2_paper", False): "696c217b37e9356d",
    ("asap_N1_40_two_rates", True): "2790bd2398140254",     # (recorded on the process path, BULK_EXCHANGE off)
    ("asap_N1_40_two_rates", False): "57711d6dfacac520",
    ("asap_N2_two_rates", True): "a5b4ecd1137ca60e",
    ("asap_N2_two_rates", False): "a41d5e9398107d83",
    ("asap_N3", True): "4c6d23de1bf4d9ef",
    ("asap_N3", False): "1c476d6086d5b195",
    ("asap_N3_full", True): "73066c64a4135ed9",
    ("asap_N3_full", False): "743f4943a759fe81",
    ("steps_N1", True): "8604ebe9deaf389b",
    ("steps_N1", False): "78a3185d9315cbd1",
    ("steps_N3", True): "097d19559de0fa7b",
    ("steps_N3", False): "cb3c09e456984c9e",
    ("steps_N3_paper", True): "7b9bb9b39dc0d659",
    ("steps_N3_paper", False): "7a476e4b65885e18",
    ("steps_N3_ties", True): "a8d8beaf5985ff2b",
    ("steps_N3_ties", False): "13b0a1e664a67393",
}


@pytest.mark.parametrize("record_views", [True, False])
@pytest.mark.parametrize("name", sorted(SETUP_SCENARIOS))
def test_setup_pinned(name: str, record_views: bool) -> None:
    assert digest(setup_run(name, record_views)) == PINNED[(name, record_views)]


#: (name, record_views) where the groups' exchanges overlap and views are recorded: the process path is kept
PROCESS_PATH = {("asap_N2_paper", True), ("steps_N3_paper", True)}


def cyclic_path(name: str, record_views: bool) -> bool:
    """Whether the set-up exchange takes the ``cyclic`` backend (timing mode without views recorded), not ``relays``."""
    return not record_views and SETUP_SCENARIOS[name][2].get("mode", "timing") == "timing"


@pytest.mark.parametrize("record_views", [True, False])
@pytest.mark.parametrize("name", sorted(SETUP_SCENARIOS))
def test_setup_replay_equals_processes(name: str, record_views: bool, monkeypatch) -> None:
    """The event-free relay replay (the ``relays`` backend, or the ``cyclic`` one: tests/test_codedsecagg_cyclic.py)
    is taken and changes nothing."""
    method = "_replay_cyclic" if cyclic_path(name, record_views) else "_replay_relays"
    on, off, taken = run_both(lambda: setup_run(name, record_views), monkeypatch, "BULK_EXCHANGE", method)
    assert (taken > 0) == ((name, record_views) not in PROCESS_PATH)
    assert on == off


def test_uniforms_in_turn_equal_scalar_draws() -> None:
    """Streams.uniforms_in_turn (repeated nodes, across blocks) equals uniform called in that order."""
    from fednet.sim.rng import Streams
    a, b = Streams(5, 40, width=3), Streams(5, 40, width=3)
    nodes = np.array([7, 3, 7, 39, 0, 7, 3, 12, 7, 7, 7])
    for _ in range(3):
        assert a.uniforms_in_turn(nodes, "uplink", 2).tolist() == [b.uniform(int(i), "uplink", 2) for i in nodes]
    assert a.uniform(7, "uplink", 2) == b.uniform(7, "uplink", 2)
    assert a.uniforms_in_turn(np.array([], dtype=int), "uplink", 2).size == 0


@pytest.mark.parametrize("schedule", ["relay_asap", "relay_steps"])
@pytest.mark.parametrize("paper", [False, True])
def test_codedpaddedfl_sharing_replay_equals_processes(schedule: str, paper: bool, monkeypatch) -> None:
    """CodedPaddedFL's share exchange along Omega (Sec. V-A) takes the relay replay too, also where every group
    shares in its own process at once (``encode_per_group``, the paper's accounting): the same results, bit for bit."""
    from fednet.protocols.codedpaddedfl import CodedPaddedFL, CodedPaddedFLConfig

    def make() -> CodedPaddedFL:
        D = 12
        g = lte_star(D, loss=0.1, device_mac_rates=[2e6 * (1 + (i % 4)) for i in range(D)])
        sim = Simulation(g, 21, device_compute=ShiftedExponential(0.5), record_views=False, secret_seed=SECRET_SEED)
        params = dict(mode="timing", alpha=3, groups=3, sharing_schedule=schedule,
                      **(CodedPaddedFLConfig.paper_accounting if paper else {}))
        proto = CodedPaddedFL(sim, digits_task(D, 16, "noniid"), params, label="cpfl")
        proto.run(2)
        return proto

    on, off, taken = run_both(make, monkeypatch, "BULK_EXCHANGE", "_replay_relays")
    assert taken > 0
    assert on == off


#: (groups, record_views) -> digest of six epochs of the aggregation tree with devices absent (BernoulliDropout 0.15:
#: incomplete columns are dropped, their members never asked past the first absent one), recorded before
#: ``tree_aggregate`` sized its download once and walked each root's subtree once
TREE_DROPOUT_PINNED: dict[tuple[int, bool], str] = {
    (2, True): "17d49f752372470b",
    (2, False): "f0dd581c42ad7b95",
    (3, True): "3e6a8ebb29eb888f",
    (3, False): "5105f105953f5a97",
}


@pytest.mark.parametrize("record_views", [True, False])
@pytest.mark.parametrize("groups", [2, 3])
def test_tree_epochs_with_dropout_pinned(groups: int, record_views: bool) -> None:
    """The tree epochs (N > 1, process path) with absent devices: trace, views, relays and draws, bit for bit."""
    from test_pinned_traces import lossy_sim
    sim = lossy_sim(12, 20 + groups, 0.15)
    sim.record_views = record_views
    proto = CodedSecAgg(sim, digits_task(12, 16, "noniid"), dict(mode="timing", z=1, groups=groups,
                                                                 sharing_schedule="relay_asap"),
                        label=f"tree_dropout_N{groups}")
    proto.run(6)
    assert any(row.get("dropped") for row in proto.trace[1:])
    assert digest(proto) == TREE_DROPOUT_PINNED[(groups, record_views)]
