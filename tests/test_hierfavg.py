"""Edge servers and hierarchical FedAvg (issue 28, item 5): the hierarchy's routing and timing in closed form, HierFAVG
on one cell equal to FedAvg bit for bit, the edge and cloud aggregations weighted by data size, check_protocol, the
backends' reason to decline, a study on two cells, and ``fednet topology`` drawing cells, edge servers and cloud."""

from __future__ import annotations

import numpy as np
import pytest

from factories import make_task
from fednet.errors import ConfigError
from fednet.learning.federated import local_sgd_delta
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.compute import Deterministic
from fednet.sim.network import Message
from fednet.sim.simulation import Simulation
from fednet.topologies.hierarchy import edge_key, hierarchy
from fednet.topologies.lte import lte_star

SMALL = {"hidden": [8, 8], "batch_size": 8}


def _params_bytes(params: dict) -> bytes:
    return b"".join(np.ascontiguousarray(params[k]).tobytes() for k in sorted(params))


def test_routes_and_backhaul_closed_form() -> None:
    """A message takes the tree's path; each hop its closed-form time; the backhaul's latency delays delivery, not
    the link; every node on the way files a relayed message."""
    g = hierarchy(4, n_cells=2, device_mac_rates=[1e6] * 4, loss=0.0, header_overhead=0.0, shared_air=False,
                  backhaul_bps=1e8, backhaul_latency_s=0.02, uplink_bps=1e6, downlink_bps=2e6)
    sim = Simulation(g, 0)
    d0, d1, d2 = sim.devices[0], sim.devices[1], sim.devices[2]
    e0, e1 = sim.edge_servers
    assert (e0.index, e1.index, sim.server.index) == (5, 6, 4) and e0.name == edge_key(0)
    assert sim.route(d0, e0) == ([d0], []) and sim.route(d0, sim.server) == ([d0, e0], [])
    assert sim.route(sim.server, d2) == ([], [e1, d2]) and sim.route(d0, d1) == ([d0], [d1])
    assert sim.route(d0, d2) == ([d0, e0], [e1, d2])
    bits = 10_000
    m = Message(d0.index, d2.index, "share", None, bits, 1)
    sim.run(sim.transfer(m))
    # up 1e6, backhaul up 1e8 + 0.02, backhaul down 1e8 + 0.02, down 2e6
    expected = bits / 1e6 + (bits / 1e8 + 0.02) * 2 + bits / 2e6
    assert m.delivered_at == pytest.approx(expected, rel=1e-12)
    assert [h[0] for h in m.hops] == ["up", "backhaul_up", "backhaul_down", "down"]
    assert m.hops[1][3] == pytest.approx(bits / 1e6 + bits / 1e8, rel=1e-12)      # the link is free before the latency
    assert m.encrypted and e0.relayed == [m] and sim.server.relayed == [m] and e1.relayed == [m]
    assert d2.view == [m]
    c = sim.take_counters()
    assert (c.bits_up, c.bits_down, c.bits_backhaul, c.messages) == (bits, bits, 2 * bits, 4)


def test_bad_hierarchies_are_refused() -> None:
    with pytest.raises(ValueError, match=r"n_cells must be an integer in \[1, n_devices = 3\], got 4"):
        hierarchy(3, n_cells=4, device_mac_rates=[1e6] * 3)
    with pytest.raises(ValueError, match="backhaul_bps must be a finite positive number, got 0"):
        hierarchy(3, backhaul_bps=0, device_mac_rates=[1e6] * 3)
    with pytest.raises(ValueError, match="backhaul_latency_s must be finite and >= 0 seconds, got -1"):
        hierarchy(3, backhaul_latency_s=-1, device_mac_rates=[1e6] * 3)
    g = hierarchy(3, device_mac_rates=[1e6] * 3)
    g.remove_edge(edge_key(1), "server")
    with pytest.raises(ValueError, match=r"edge server \('edge', 1\) has no backhaul link to the server"):
        Simulation(g, 0)
    g = hierarchy(3, device_mac_rates=[1e6] * 3)
    g.add_edge(0, edge_key(1), uplink_bps=1e6, downlink_bps=1e6)
    with pytest.raises(ValueError, match=r"device 0 is linked to 2 edge servers"):
        Simulation(g, 0)
    with pytest.raises(ConfigError, match="hierfavg needs a network with edge servers"):
        registry.get("hierfavg")(Simulation(lte_star(3, device_mac_rates=[1e6] * 3), 0), make_task(D=3), SMALL)


def _round_times(kappa_2: int, backhaul_latency_s: float = 0.02):
    """HierFAVG on two cells of three equal devices, deterministic compute, no loss: the round-1 row."""
    D, R_up, R_down, R_b, tau, tau_e, tau_c = 6, 1e6, 2e6, 5e7, 1e6, 2e8, 4e8
    g = hierarchy(D, n_cells=2, uplink_bps=R_up, downlink_bps=R_down, loss=0.0, header_overhead=0.1,
                  device_mac_rates=[tau] * D, edge_mac_rate=tau_e, server_mac_rate=tau_c, backhaul_bps=R_b,
                  backhaul_latency_s=backhaul_latency_s)
    sim = Simulation(g, 0, device_compute=Deterministic())
    proto = registry.get("hierfavg")(sim, make_task(D=D), {**SMALL, "kappa_1": 2, "kappa_2": kappa_2})
    rows = proto.run(1)
    bits = proto.learning.n_params * 32                            # payload bits of one model (float32)
    return rows[1], dict(D=D, R_up=R_up, R_down=R_down, R_b=R_b, tau=tau, tau_e=tau_e, tau_c=tau_c, bits=bits,
                         b=bits * 1.1, n_params=proto.learning.n_params)        # b: air bits (10 % headers)


def test_one_edge_round_and_one_cloud_round_in_closed_form() -> None:
    """Cloud period = backhaul down + kappa_2 edge rounds (3 devices sharing a cell's downlink: 3 b / R_down;
    compute rho / tau; sharing the uplink: 3 b / R_up; edge aggregation rho_e / tau_e) + backhaul up + the
    cloud's aggregation; each backhaul hop b / R_b plus its latency."""
    for kappa_2 in (1, 2):
        row, p = _round_times(kappa_2)
        rho = row["device_macs"] / (p["D"] * kappa_2)                # each device's MACs per edge period
        rho_e = row["edge_macs"] / (2 * kappa_2)
        edge_round = 3 * p["b"] / p["R_down"] + rho / p["tau"] + 3 * p["b"] / p["R_up"] + rho_e / p["tau_e"]
        cloud = 2 * (p["b"] / p["R_b"] + 0.02) + row["server_macs"] / p["tau_c"]
        assert row["time_s"] == pytest.approx(cloud + kappa_2 * edge_round, rel=1e-12)
        assert row["bits_backhaul"] == 2 * 2 * p["bits"]                      # one model each way per edge server
        assert row["bits_up"] == row["bits_down"] == kappa_2 * p["D"] * p["bits"]
    one, _ = _round_times(1)
    two, p = _round_times(2)
    assert two["time_s"] - one["time_s"] == pytest.approx(
        3 * p["b"] / p["R_down"] + two["device_macs"] / 12 / p["tau"] + 3 * p["b"] / p["R_up"]
        + two["edge_macs"] / 4 / p["tau_e"], rel=1e-9)
    assert one["server_macs"] == 2 * p["n_params"]                   # the cloud: one MAC per element and edge model


def test_one_cell_equals_fedavg_bit_for_bit() -> None:
    """kappa_1 = kappa_2 = 1 on one cell: FedAvg's model bit for bit (module docstring of protocols.hierfavg), given
    the edge server receives the updates in FedAvg's order: here compute times 2x apart, so both see the devices
    in order of MAC rate."""
    D, rates = 5, [8e5, 4e5, 2e5, 1e5, 5e4]
    task = make_task(D=D, n=40, d=12, c=3)
    flat = Simulation(lte_star(D, device_mac_rates=rates, loss=0.1), 3, device_compute=Deterministic())
    tree = Simulation(hierarchy(D, n_cells=1, device_mac_rates=rates, loss=0.1), 3, device_compute=Deterministic())
    a = registry.get("fedavg")(flat, task, SMALL)
    b = registry.get("hierfavg")(tree, task, {**SMALL, "kappa_1": 1, "kappa_2": 1})
    ra, rb = a.run(4), b.run(4)
    assert _params_bytes(a.params) == _params_bytes(b.params)
    assert [(r["accuracy"], r["loss"], r["device_macs"]) for r in ra] == \
           [(r["accuracy"], r["loss"], r["device_macs"]) for r in rb]
    assert all(rb[r]["time_s"] > ra[r]["time_s"] for r in range(1, 5))   # the shared cell and the backhaul cost time
    # more local steps per round change the model (the test can tell them apart)
    c = registry.get("hierfavg")(Simulation(hierarchy(D, n_cells=1, device_mac_rates=rates, loss=0.1), 3,
                                            device_compute=Deterministic()), task, {**SMALL, "kappa_1": 2, "kappa_2": 1})
    c.run(4)
    assert _params_bytes(c.params) != _params_bytes(a.params)


def test_aggregations_weight_by_data_size() -> None:
    """Unequal data: w = sum_l |D^l| / |D| (w + sum_{i in l} |D_i| / |D^l| Delta_i) (Liu et al., Algorithm 1), against
    the deltas recomputed here; equal weights would give another model."""
    rng = np.random.default_rng(1)
    sizes, d, c = [10, 30, 20, 60], 5, 3
    X = [rng.uniform(-0.5, 0.5, (n, d)) for n in sizes]
    Y = [np.eye(c)[rng.integers(0, c, n)] for n in sizes]
    task = LearningTask(X, Y, rng.uniform(-0.5, 0.5, (30, d)), rng.integers(0, c, 30), learning_rate=1.0)
    sim = Simulation(hierarchy(4, n_cells=2, device_mac_rates=[1e6, 2e6, 3e6, 4e6], loss=0.1), 5)
    proto = registry.get("hierfavg")(sim, task, {**SMALL, "kappa_1": 1, "kappa_2": 1, "learning_rate": 0.5})
    w0 = {k: v.copy() for k, v in proto.params.items()}
    proto.run(1)
    lr = proto.learning.schedule(1)
    deltas = []
    for dev in sim.devices:
        rows = proto.learning.rows(dev, 1)
        deltas.append(local_sgd_delta(proto.model, w0, X[dev.index][rows], Y[dev.index][rows], lr)[0])

    def combine(weights_in_cell, weights_of_cells):
        out = {}
        for k in w0:
            cells = [w0[k] + sum(weights_in_cell[i] * deltas[i][k] for i in members)
                     for members in ([0, 1], [2, 3])]
            out[k] = sum(wc * m for wc, m in zip(weights_of_cells, cells))
        return out
    by_data = combine([10 / 40, 30 / 40, 20 / 80, 60 / 80], [40 / 120, 80 / 120])
    equal = combine([0.5] * 4, [0.5, 0.5])
    for k in w0:
        np.testing.assert_allclose(proto.params[k], by_data[k], rtol=1e-12, atol=1e-15)
    assert any(not np.allclose(proto.params[k], equal[k], rtol=1e-6, atol=0) for k in w0)


@pytest.mark.backends                    # the backends' reasons to decline (all allowed)
def test_check_protocol_passes_and_the_backends_decline_on_a_hierarchy() -> None:
    from fednet.testing import check_protocol

    def graph():
        return hierarchy(6, n_cells=2, device_mac_rates=[2e6, 5e5, 1e6, 3e6, 7.5e5, 1e6], loss=0.1,
                         backhaul_loss=0.05)
    report = check_protocol(registry.get("hierfavg"), {**SMALL, "kappa_1": 2, "kappa_2": 2}, task=make_task(D=6),
                            graph=graph, rounds=2)
    assert "two runs at one public and one secret seed are identical" in report.explain()
    # a flat protocol on the hierarchy: the engine runs its reference and says why
    sim = Simulation(graph(), 0)
    rows = registry.get("fedavg")(sim, make_task(D=6), SMALL).run(2)
    assert "edge servers and their backhaul" in sim.engine_paths.explain()
    assert rows[1]["bits_backhaul"] == 2 * rows[1]["bits_up"]           # every update and model crosses it


def test_the_study_runs_on_four_cells_and_topology_draws_it(tmp_path, capsys) -> None:
    """The bundled study, reduced (digits, two rounds), runs through the runner; ``fednet topology`` prints the
    cells, edge servers and backhaul and draws them (Agg)."""
    import matplotlib.pyplot as plt

    from fednet.cli import main
    from fednet.study.config import load_study
    from fednet.study.runner import run_study

    path = __import__("pathlib").Path(__file__).resolve().parents[1] / "studies" / "hierfavg_mnist.toml"
    study = load_study(path, max_epochs=2, seeds=[0], data={"dataset": "digits"},
                       only_runs=["FedAvg (cloud)", "HierFAVG k1=1 k2=1", "HierFAVG k1=5 k2=4"])
    res = run_study(study, None, progress=False, plot=False)
    rows = {label: traces[0] for label, traces in res.traces.items()}
    for label, trace in rows.items():
        assert len(trace) == 3 and trace[-1]["bits_backhaul"] > 0 and trace[-1]["time_s"] > 0, label
    flat, tree = rows["FedAvg (cloud)"], rows["HierFAVG k1=1 k2=1"]
    # the same model up to the order of the sums (per cell, then across cells) ...
    assert [r["loss"] for r in tree] == pytest.approx([r["loss"] for r in flat], rel=1e-9)
    assert flat[1]["bits_backhaul"] == 5 * tree[1]["bits_backhaul"]                 # ... 20 models over 4 backhauls
    png = tmp_path / "h.png"
    drawn = []
    close = plt.close
    plt.close = lambda fig=None: (drawn.append(fig), close(fig))
    try:
        assert main(["topology", str(path), "--plot", str(png)]) == 0
    finally:
        plt.close = close
    out = capsys.readouterr().out
    assert "edge servers: 4" in out and "backhaul" in out and png.stat().st_size > 0
    texts = {t.get_text() for ax in drawn[0].axes for t in ax.texts}
    assert {"cloud", "edge 0", "edge 1", "edge 2", "edge 3", "cell 0 (shared air)"} <= texts
