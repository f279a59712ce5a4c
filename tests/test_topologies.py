"""Topologies: per-device values, grouping rules, the group tree, user builders, D2D links, `fednet topology`."""

from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from fednet.cli import main
from fednet.codes.secagg_tree import aggregation_tree
from fednet.protocol import registry
from fednet.sim.network import Message, transmission_time
from fednet.sim.rng import Streams
from fednet.sim.simulation import Simulation
from fednet.study.config import NetworkSpec, StudyError, load_study
from fednet.study.runner import build_network, build_simulation, prepare_task, run_study
from fednet.errors import ConfigError
from fednet.topologies.distributions import draw
from fednet.topologies.groups import equal_groups, make_groups, membership
from fednet.topologies.lte import paper_mac_rates
from fednet.topologies.secagg_tree import device_tree, group_tree

MINI = """
name = "net"
seeds = [0]
targets = [0.5]
epochs = 2
run_to_end = true
[data]
dataset = "digits"
n_components = 200
[network]
n_devices = 8
{network}
[[runs]]
label = "a"
protocol = "{protocol}"
params = {params}
{more}
"""


def _study(tmp_path: Path, network: str = "", protocol: str = "conventional", params: str = "{}",
           more: str = "", name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(MINI.format(network=network, protocol=protocol, params=params, more=more))
    return p


# ------------------------------------------------------------------------------------------ groups
def test_grouping_rules() -> None:
    assert make_groups("consecutive", 25, 4) == equal_groups(25, 4) == [
        list(range(0, 7)), list(range(7, 13)), list(range(13, 19)), list(range(19, 25))]
    g = make_groups("random", 10, 3, rng=np.random.default_rng(5))
    assert sorted(len(m) for m in g) == [3, 3, 4] and sorted(i for m in g for i in m) == list(range(10))
    assert g == make_groups("random", 10, 3, rng=np.random.default_rng(5)) != equal_groups(10, 3)
    rates = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]  # snake: 8 1 | 7 2 ... -> equal sums
    assert make_groups("mac_balanced", 8, 2, mac_rates=rates) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert [sum(rates[i] for i in m) for m in make_groups("mac_balanced", 8, 2, mac_rates=rates)] == [18.0, 18.0]
    with pytest.raises(ValueError, match="grouping rule must be one of"):
        make_groups("nope", 4, 2)


def test_membership_reads_the_graph_and_names_a_mismatch() -> None:
    g = build_network(NetworkSpec(n_devices=6, groups={"membership": [[4, 5], [0, 1], [2, 3]]}), 0)
    assert [g.nodes[i]["group"] for i in range(6)] == [1, 1, 2, 2, 0, 0]
    assert membership(g) == [[4, 5], [0, 1], [2, 3]] == membership(g, 3)
    with pytest.raises(ValueError, match="groups = 2 but the network defines 3 groups"):
        membership(g, 2)
    plain = build_network(NetworkSpec(n_devices=6), 0)
    assert membership(plain, 4) == equal_groups(6, 4)


# ------------------------------------------------------------------------------------------ group tree
def test_group_tree_is_the_tree_of_eqs_14_15() -> None:
    t = group_tree(8)
    steps = aggregation_tree(8)
    assert sorted((u, v, a["step"]) for u, v, a in t.edges(data=True) if v != "server") == sorted(
        (u, v, s) for s, st in enumerate(steps, 1) for u, v in st)
    assert nx.is_arborescence(t.reverse())  # every group reaches the server along one path
    assert t.graph["depth"] == 3 and t.edges[4, 0]["covers"] == [4, 5, 6, 7] and t.edges[0, "server"]["step"] == 4
    assert [t.nodes[g]["level"] for g in range(8)] == [4, 1, 2, 1, 3, 1, 2, 1]
    dt = device_tree([[0, 1], [2, 3], [4, 5]])
    assert sorted(dt.edges(data="step")) == [(2, 0, 1), (3, 1, 1), (4, 0, 2), (5, 1, 2)]


def test_fednet_topology_draws_the_group_tree_of_a_grouped_codedsecagg_study(tmp_path, capsys) -> None:
    png = tmp_path / "tree.png"
    assert main(["topology", "fig7_mnist", "--run", "CodedSecAgg z=1 N=8 relay_steps fednet", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "120 devices, 8 group(s)" in out
    assert "step 3: G4 -> G0  (sum of groups [4, 5, 6, 7])" in out and "step 4: G0 -> server" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    # network groups (random, balanced) are shown and drawn too; the run takes their count
    study = _study(tmp_path, 'groups = { rule = "random", count = 2 }', "codedsecagg", '{ z = 1, mode = "timing" }')
    assert main(["topology", str(study), "--plot", str(tmp_path / "t2.png")]) == 0
    out = capsys.readouterr().out
    assert "8 devices, 2 group(s)\n" in out and "step 1: G1 -> G0" in out


# ------------------------------------------------------------------------------------------ per-device values
def test_per_device_rates_and_loss_reach_the_links() -> None:
    spec = NetworkSpec(n_devices=4, uplink_bps=[1e6, 2e6, 3e6, 4e6],
                       downlink_bps={"dist": "uniform", "low": 5e6, "high": 9e6, "seed": 3},
                       loss=[0.0, 0.1, 0.2, 0.3], device_mac_rates={"dist": "choice", "values": [1e6, 2e6]})
    sim = build_simulation(spec, 7)
    assert [d.uplink.rate_bps for d in sim.devices] == [1e6, 2e6, 3e6, 4e6]
    assert [d.uplink.loss for d in sim.devices] == [d.downlink.loss for d in sim.devices] == [0.0, 0.1, 0.2, 0.3]
    down = draw(spec.downlink_bps, 4, Streams(3, 1).generator("topology", "downlink_bps"))
    assert [d.downlink.rate_bps for d in sim.devices] == down and all(5e6 <= r < 9e6 for r in down)
    assert [d.downlink.rate_bps for d in build_simulation(spec, 8).devices] == down  # the table's seed fixes it
    macs = [d.mac_rate for d in sim.devices]
    assert macs == draw(spec.device_mac_rates, 4, Streams(7, 1).generator("topology", "device_mac_rates"))
    assert set(macs) <= {1e6, 2e6}
    loss = {"dist": "beta", "a": 2.0, "b": 8.0}
    l7 = [d.uplink.loss for d in build_simulation(NetworkSpec(n_devices=4, loss=loss), 7).devices]
    l8 = [d.uplink.loss for d in build_simulation(NetworkSpec(n_devices=4, loss=loss), 8).devices]
    assert l7 != l8 and all(0 < x < 1 for x in l7)  # without a seed the draw follows the run's seed
    # a message on device 3's uplink takes the time of its own rate and loss
    msg = Message(3, 4, "g", None, 1000, 32)
    sim.run(sim.transfer(msg))
    u = Streams(7, 5).uniform(3, "uplink", 0)
    assert sim.now == transmission_time(32000, 4e6, 0.1, 0.3, None, u)[0]


def test_default_lte_star_keeps_its_draws() -> None:
    """The bundled studies' networks: paper MAC rates from the seed's "topology" stream, scalar links."""
    g = build_network(NetworkSpec(n_devices=120), 2)
    assert [g.nodes[i]["mac_rate"] for i in range(120)] == paper_mac_rates(120, Streams(2, 1).generator("topology"))
    assert {(a["uplink_bps"], a["downlink_bps"], a["loss"]) for _, _, a in g.edges(data=True)} == {(5e6, 10e6, 0.1)}
    assert "group" not in g.nodes[0] and "n_groups" not in g.graph
    # adding a loss distribution does not move the MAC-rate draw
    g2 = build_network(NetworkSpec(n_devices=120, loss={"dist": "uniform", "low": 0.0, "high": 0.2}), 2)
    assert [g2.nodes[i]["mac_rate"] for i in range(120)] == [g.nodes[i]["mac_rate"] for i in range(120)]


def test_bad_network_values_are_named(tmp_path) -> None:
    for network, needle in [
        ("loss = [0.1, 0.1]", "network: loss has 2 entries for n_devices = 8"),
        ('loss = { dist = "uniform", low = 0.0, high = 1.5 }', "loss must be in [0, 1)"),
        ('uplink_bps = { dist = "gauss", mean = 1 }', "dist must be one of"),
        ("groups = 9", "groups.count must be at most n_devices = 8, got 9"),
        ("groups = { membership = [[0, 1], [1, 2, 3, 4, 5, 6, 7]] }", "device 1 is in groups 0 and 1"),
        ('kind = "nope"', "network kind must be one of ['hierarchy', 'lte_cells', 'lte_star', 'radio_star'] or 'package.module:function'"),
    ]:
        with pytest.raises(StudyError) as err:
            load_study(_study(tmp_path, network))
        assert needle in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ studies
def test_study_with_per_device_rates_and_random_balanced_groups_runs(tmp_path, capsys) -> None:
    network = """device_mac_rates = { dist = "loguniform", low = 1e6, high = 3e7 }
uplink_bps = [4e6, 5e6, 6e6, 5e6, 4e6, 5e6, 6e6, 5e6]
loss = { dist = "uniform", low = 0.0, high = 0.2 }
groups = { rule = "random", count = 2 }"""
    more = """[[runs]]
label = "b"
protocol = "codedsecagg"
params = { z = 1, mode = "timing" }
[[runs]]
label = "c"
protocol = "codedpaddedfl"
params = { alpha = 3, mode = "timing" }
network = { groups = { rule = "mac_balanced", count = 2 }, loss = 0.05 }"""
    path = _study(tmp_path, network, "codedpaddedfl", '{ alpha = 2, mode = "timing" }', more)
    study = load_study(path)
    assert [study.run_params(r)["groups"] for r in study.runs] == [2, 2, 2]  # taken from the network
    assert study.run_network(study.runs[2]).loss == 0.05 and study.run_network(study.runs[2]).groups.rule == "mac_balanced"
    result = run_study(study, tmp_path / "out", progress=False, plot=False)
    for label in "abc":
        rows = result.traces[label][0]
        assert len(rows) == 3 and rows[-1]["time_s"] > rows[0]["time_s"] > 0
    # the protocols use the network's random groups, not consecutive ones
    task = prepare_task(study)
    for run in study.runs[:2]:
        sim = build_simulation(study.run_network(run), 0)
        proto = registry.get(run.protocol)(sim, task, study.run_params(run))
        proto.run(1)
        assert proto.groups == membership(sim.graph) != equal_groups(8, 2)
    sim = build_simulation(study.run_network(study.runs[2]), 0)
    assert {d.uplink.loss for d in sim.devices} == {0.05}


def test_a_run_cannot_change_n_devices_nor_disagree_with_the_network_groups(tmp_path) -> None:
    with pytest.raises(StudyError, match="a run cannot change n_devices"):
        load_study(_study(tmp_path, more='[[runs]]\nlabel = "b"\nprotocol = "conventional"\nnetwork = { n_devices = 4 }'))
    with pytest.raises(StudyError, match="groups = 4 but the network defines 2 groups"):
        load_study(_study(tmp_path, "groups = 2", "codedpaddedfl", '{ alpha = 2, groups = 4, mode = "timing" }'))


# ------------------------------------------------------------------------------------------ user builders, D2D
BUILDER = '''
import networkx as nx


def ring(n_devices, *, rng, rate=1e6, d2d_bps=2e6):
    """A star whose devices also form a ring of direct links; link parameters on the nodes."""
    g = nx.Graph(header_overhead=0.0, packet_bits=None)
    g.add_node("server", role="server", mac_rate=1e12)
    for i in range(n_devices):
        g.add_node(i, role="device", mac_rate=float(rng.choice([1e6, 2e6])), uplink_bps=rate,
                   downlink_bps=2 * rate, loss=0.0)
        g.add_edge(i, "server")
    for i in range(n_devices):
        g.add_edge(i, (i + 1) % n_devices, rate_bps=d2d_bps)
    return g
'''


def test_user_builder_module_function_is_used_with_d2d_links(tmp_path, capsys) -> None:
    (tmp_path / "w4_ring_net.py").write_text(BUILDER)
    path = _study(tmp_path, 'kind = "w4_ring_net:ring"\nparams = { rate = 3e6 }')
    try:
        study = load_study(path)
        sim = Simulation(build_network(study.network, 0), 0)  # records views
        assert [d.uplink.rate_bps for d in sim.devices] == [3e6] * 8  # from the node attributes
        assert [d.downlink.rate_bps for d in sim.devices] == [6e6] * 8
        assert sorted(sim.d2d) == sorted([(i, (i + 1) % 8) for i in range(8)] + [((i + 1) % 8, i) for i in range(8)])
        assert {lk.rate_bps for lk in sim.d2d.values()} == {2e6}
        # a device-to-device message takes the direct link (one hop), others are relayed via the server
        direct, relayed = Message(0, 1, "share", None, 1000, 10), Message(0, 4, "share", None, 1000, 10)
        sim.run(sim.transfer(direct))
        assert sim.now == 10000 / 2e6 and [h[0] for h in direct.hops] == ["d2d"] and direct.encrypted
        assert sim.server.relayed == [] and sim.devices[1].view == [direct]
        sim.run(sim.transfer(relayed))
        assert [h[0] for h in relayed.hops] == ["up", "down"] and sim.server.relayed == [relayed]
        c = sim.take_counters()
        assert (c.bits_d2d, c.bits_up, c.bits_down) == (10000, 10000, 10000)
        assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
        assert main(["topology", str(path)]) == 0
        assert "device-to-device links: 8" in capsys.readouterr().out
    finally:
        sys.modules.pop("w4_ring_net", None)
    with pytest.raises(StudyError, match="params are for user builders"):
        load_study(_study(tmp_path, "params = { rate = 3e6 }"))


# ------------------------------------------------------------------------------------------ groups = cells
@pytest.mark.parametrize("network, cells", [
    ('kind = "lte_cells"\nparams = { n_cells = 4 }', [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ('kind = "hierarchy"\nparams = { n_cells = 2 }', [[0, 1, 2, 3], [4, 5, 6, 7]]),
])
def test_groups_follow_the_cells(tmp_path, network, cells) -> None:
    """``groups = { rule = "cells" }``: one group per cell, so CodedSecAgg's groups (and its tree's rows) are the
    cells (issue 28, item 5); the run takes the reference engine (cells) and finishes."""
    n = len(cells)
    path = _study(tmp_path, network + f'\ngroups = {{ rule = "cells", count = {n} }}', "codedsecagg",
                  '{ z = 1, mode = "timing" }')
    study = load_study(path)
    sim = build_simulation(study.run_network(study.runs[0]), 0)
    assert membership(sim.graph) == cells
    assert [sorted(i for i, d in enumerate(sim.devices) if d.attrs["cell"] == c) for c in range(n)] == cells
    result = run_study(study, None, progress=False)
    rows = result.traces["a"][0]
    assert len(rows) == 3 and rows[-1]["time_s"] > rows[0]["time_s"] > 0


@pytest.mark.parametrize("network, needle", [
    ('kind = "lte_cells"\nparams = { n_cells = 4 }\ngroups = { rule = "cells", count = 2 }',
     r"network: network.groups.rule = 'cells' with count = 2: the network has 4 cells holding devices; set "
     r"groups.count = 4"),
    ('groups = { rule = "cells", count = 2 }', r"network: network.groups.rule = 'cells': network kind 'lte_star' puts "
                                               r"no device in a cell"),
])
def test_groups_on_cells_errors_name_the_key(tmp_path, network, needle) -> None:
    with pytest.raises(StudyError, match=needle):      # when the study is loaded, naming network.groups
        load_study(_study(tmp_path, network, "codedsecagg", '{ z = 1, mode = "timing" }'))
