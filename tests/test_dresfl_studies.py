"""The DReS-FL studies: they load, refuse absent data sets clearly, and run end to end on a small set-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fednet.learning.datasets import DatasetError
from fednet.sim.dropout import ExtremeDropout
from fednet.study import load_study, run_study
from fednet.study.runner import build_simulation

ROOT = Path(__file__).resolve().parents[1]


def test_studies_load():
    t2 = load_study(ROOT / "studies/dresfl_table2.toml")
    assert [r.name for r in t2.runs] == ["FedAvg", "FedAvg-IS", "SCAFFOLD", "DReS-FL", "Centralized"]
    assert t2.epochs == 15000 and t2.network.n_devices == 20 and t2.data.partition == "skewed_label"
    assert load_study(ROOT / "studies/dresfl_table2_fashion.toml").data.dataset == "fashion-mnist"
    lat = load_study(ROOT / "studies/dresfl_latency.toml")
    assert [r.name for r in lat.runs] == ["FedAvg", "FedAvg+LightSecAgg", "DReS-FL K=1", "DReS-FL K=2"]
    drop = load_study(ROOT / "studies/dresfl_latency_dropouts.toml")
    assert [r.name for r in drop.runs] == ["FedAvg", "FedAvg+LightSecAgg", "DReS-FL K=1"]
    assert drop.network.availability == "dresfl_extreme" and lat.network.availability == "bernoulli"
    # the latency set-up otherwise: the same network, data and run parameters
    same = {"availability"}
    assert {k: v for k, v in drop.network.model_dump().items() if k not in same} == \
        {k: v for k, v in lat.network.model_dump().items() if k not in same}
    assert drop.data == lat.data and (drop.epochs, drop.stop_at, drop.targets) == (lat.epochs, lat.stop_at, lat.targets)
    assert drop.runs[2].params == {**lat.runs[2].params, "K": 1}


def test_extreme_availability_from_the_study():
    study = load_study(ROOT / "studies/dresfl_table2.toml").model_copy(deep=True)
    sim = build_simulation(study.network.model_copy(update={"min_reliable": 9}), seed=4)
    assert isinstance(sim.availability, ExtremeDropout) and sim.availability.n_reliable >= 9


def _tiny(**data):
    return {"name": "tiny", "seeds": [0], "epochs": 3,
            "data": {"dataset": "digits", "features": "raw", "partition": "skewed_label", **data},
            "network": {"n_devices": 10, "availability": "dresfl_extreme", "min_reliable": 9},
            "runs": [{"protocol": "fedavg", "params": {"batch_size": 8, "hidden": [4, 4]}},
                     {"protocol": "dresfl", "params": {"batch_size": 8, "hidden": [4, 4], "mode": "timing"}}]}


@pytest.mark.parametrize("name", ["emnist", "cifar10", "cifar100", "svhn"])
def test_absent_datasets_refused_clearly(name, tmp_path):
    from fednet.study.config import Study

    with pytest.raises(DatasetError, match="not available on this machine"):
        run_study(Study.model_validate(_tiny(dataset=name)), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_tiny_study_end_to_end():
    from fednet.study.config import Study

    res = run_study(Study.model_validate(_tiny()), None, progress=False, plot=False)
    fed, dres = res.traces["fedavg"][0], res.traces["dresfl"][0]
    assert len(fed) == len(dres) == 4
    assert [r["dropped"] for r in fed[1:]] == [r["dropped"] for r in dres[1:]]
    assert dres[0]["bits_up"] > 0 and dres[0]["time_s"] > 0            # the one-time sharing
    assert 0 < dres[0]["decodable_probability"] <= 1


def test_convergence_rule_of_the_table2_report():
    """W(t) = mean of the evaluations in (t - 500, t]; converged at the first t >= 2000 with
    |W(t) - W(t - 1500)| < 0.2 pp: a curve rising 1.25 pp per 1000 rounds until 4000 and flat after has
    W(5500) - W(4000) = 85 - 84.75 = 0.25 (not converged) and W(5600) - W(4100) = 85 - 84.85 = 0.15."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rep", ROOT / "studies" / "dresfl_table2_report.py")
    rep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rep)
    rounds = list(range(0, 8001, 100))
    acc = [80 + min(t, 4000) / 800 for t in rounds]
    assert rep.window_mean(rounds, acc, 1000) == pytest.approx(81.0)          # 600..1000
    assert rep.converged_round(rounds, acc) == 5600
    assert rep.converged_round(rounds[:50], acc[:50]) is None                      # not by 4900
    assert rep.accuracy_at(rounds, acc, 150) == 80.125
    # the extrapolation: the last period's gain shrinking x0.65 per period falls below 0.2 pp after k periods
    assert rep.predicted_round(5.82, 3000) == 3000 + 8 * 1500 and rep.predicted_round(1.38, 3000) == 10500
    assert rep.predicted_round(0.1, 3000) == 3000


# -- network.rates_seed: one draw of the extreme dropout rates for every study seed (issue 31, item 2) ---------
#: Today's rates at study seeds 0 and 3 (N = 20), pinned: the default (rates_seed = None) redraws them per seed.
#: Seed 0 has 10 reliable clients (rate < 0.99), seed 3 has 8 (dresfl_table2.toml's header).
RATES_SEED_0 = [0.99, 0.99, 0.99, 0.04979692158116127, 0.08846496334727921, 0.03299984516689759, 0.99,
                0.07421556024555749, 0.99, 0.08280974903988148, 0.08779883414376363, 0.99, 0.99, 0.99,
                0.06665777538702136, 0.05977686707365881, 0.08084129406794327, 0.07822271663906372, 0.99, 0.99]
RATES_SEED_3 = [0.04503131787133388, 0.99, 0.99, 0.99, 0.01310300556472288, 0.07389292439113598, 0.99, 0.99,
                0.0440003356374441, 0.088717896422391, 0.99, 0.050778363324451084, 0.99, 0.99, 0.99, 0.99,
                0.0833666182477461, 0.0012598347934291933, 0.99, 0.99]


def _presence(sim, rounds=200):
    return [[sim.available(dev, r) for dev in sim.devices] for r in range(1, rounds + 1)]


def test_default_redraws_the_rates_per_seed_pinned():
    net = load_study(ROOT / "studies/dresfl_table2.toml").network
    assert net.rates_seed is None
    s0, s3 = build_simulation(net, seed=0).availability, build_simulation(net, seed=3).availability
    assert s0.rates.tolist() == RATES_SEED_0 and s3.rates.tolist() == RATES_SEED_3      # bit for bit
    assert (s0.n_reliable, s3.n_reliable) == (10, 8) and s0.rates_seed is None


def test_rates_seed_fixes_the_rates_but_not_the_presence():
    net = load_study(ROOT / "studies/dresfl_table2.toml", sets=["network.rates_seed=3"]).network
    assert net.rates_seed == 3
    a, b = build_simulation(net, seed=0), build_simulation(net, seed=1)
    # both study seeds see seed 3's draw of the rates (8 reliable clients) ...
    assert a.availability.rates.tolist() == b.availability.rates.tolist() == RATES_SEED_3
    assert a.availability.rates_seed == 3 and "rates_seed=3" in repr(a.availability)
    # ... while the per-round presence still follows the study seed: same rates, different rounds
    pa, pb = np.array(_presence(a)), np.array(_presence(b))
    assert not np.array_equal(pa, pb)
    reliable = np.array(RATES_SEED_3) < 0.99
    assert pa[:, reliable].mean() > 0.85 and pb[:, reliable].mean() > 0.85       # present w.p. >= 0.9
    assert pa[:, ~reliable].mean() < 0.05 and pb[:, ~reliable].mean() < 0.05     # present w.p. 0.01
    # and the presence at a study seed does not depend on where its rates came from (keyed by the study seed)
    c = build_simulation(net.model_copy(update={"rates_seed": 0}), seed=0)
    assert c.availability.rates.tolist() == RATES_SEED_0
    np.testing.assert_array_equal(np.array(_presence(c)), np.array(_presence(build_simulation(
        net.model_copy(update={"rates_seed": None}), seed=0))))


def test_rates_seed_with_min_reliable_conditions_the_one_draw():
    net = load_study(ROOT / "studies/dresfl_table2.toml", sets=["network.rates_seed=3", "network.min_reliable=9"]).network
    a, b = build_simulation(net, seed=0).availability, build_simulation(net, seed=4).availability
    assert a.rates.tolist() == b.rates.tolist() and a.n_reliable >= 9 and a.attempts > 1   # seed 3's first: 8


@pytest.mark.parametrize("value, match", [("-1", "greater than or equal to 0"), ('"3"', "valid integer"),
                                          ("1.5", "valid integer"), ("true", "valid integer"),
                                          ("9223372036854775808", "less than or equal")])
def test_bad_rates_seed_refused_at_load(value, match):
    from fednet.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"network\.rates_seed: .*{match}"):
        load_study(ROOT / "studies/dresfl_table2.toml", sets=[f"network.rates_seed={value}"])


@pytest.mark.parametrize("key", ["rates_seed", "min_reliable"])
def test_rates_options_refused_without_extreme_dropouts(key):
    from fednet.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"{key} = 3 only applies to availability = 'dresfl_extreme'.*'bernoulli'"):
        load_study(ROOT / "studies/dresfl_latency.toml", sets=[f"network.{key}=3"])


def test_extreme_dropout_refuses_a_bad_rates_seed():
    with pytest.raises(ValueError, match="rates_seed must be a non-negative integer or None, got -2"):
        ExtremeDropout(20, 0, rates_seed=-2)
    with pytest.raises(ValueError, match="rates_seed .* got True"):
        ExtremeDropout(20, 0, rates_seed=True)


def test_table2_report_prints_both_spreads(tmp_path, capsys):
    """Folders run with and without network.rates_seed are reported as two tables, each saying which draw it is;
    under the fixed draw every seed has the same reliable clients, under the redraw they are each seed's own."""
    import importlib.util

    from fednet.study.config import Study

    spec = importlib.util.spec_from_file_location("rep", ROOT / "studies" / "dresfl_table2_report.py")
    rep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rep)
    base = {"name": "tiny", "seeds": [0, 3], "epochs": 2,
            "data": {"dataset": "digits", "features": "raw", "partition": "skewed_label"},
            "runs": [{"label": "FedAvg", "protocol": "fedavg", "params": {"batch_size": 8, "hidden": [4, 4]}}]}
    for name, extra in (("redraw", {}), ("fixed", {"rates_seed": 3})):
        study = Study.model_validate({**base, "network": {"n_devices": 20, "availability": "dresfl_extreme", **extra}})
        run_study(study, tmp_path / name, progress=False, plot=False)
    rep.report([tmp_path / "redraw", tmp_path / "fixed"])
    out = capsys.readouterr().out
    blocks = out.split("\ndigits: ")[1:]
    assert len(blocks) == 2
    redraw = next(b for b in blocks if "dropout rates: redrawn per seed; the std over seeds includes" in b)
    fixed = next(b for b in blocks if "dropout rates: fixed: network.rates_seed = 3; one draw" in b)
    assert "reliable clients (rate < 0.99) per seed: 0:10 3:8" in redraw          # each seed's own draw
    assert "reliable clients (rate < 0.99) per seed: 0:8 3:8" in fixed            # seed 3's draw for both
    assert all(b.count("\nFedAvg ") == 1 for b in blocks)                         # one row each, not pooled
    assert rep.rates_draw({"availability": "dresfl_extreme", "rates_seed": 3, "min_reliable": 9}) == \
        "fixed: network.rates_seed = 3, conditioned on >= 9 reliable clients"
    assert rep.rates_draw({"availability": "bernoulli"}) == "none (availability = 'bernoulli')"
