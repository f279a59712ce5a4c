"""Fault injection (issue 14, item 6): bad input, bad output targets, kills, dropouts.

Every case declares its expected outcome and asserts it:

``error``
    a named :class:`fednet.errors.FednetError` (and, through the CLI, exit status 2 with one
    message on stderr naming the key, no traceback, nothing written);
``recorded``
    a recorded failure: the run completes and the trace marks the round (``decode_failed =
    True``, the reason in ``skip_reason``), the model unchanged by it;
``correct``
    a correct result (the value is accepted and used, the output is complete, or the decoded
    model is the one without the fault).

The counts per outcome are in :data:`OUTCOMES` (``python -m pytest tests/test_faults.py`` runs
them all; ``test_case_counts`` checks there are at least 100 across every protocol and the CLI).
Tiny studies on the bundled digits data keep the file fast.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import fednet.study.output as output_mod
import fednet.study.plots as plots_mod
import fednet.study.runner as runner_mod
import fednet.protocols  # noqa: F401  (registers the built-in protocols)
from fednet.cli import main
from fednet.errors import (CapacityError, ConfigError, DataError, DecodeFailure, FednetError, OutputError,
                           OutputLocked, SetupFailure)
from fednet.learning.datasets import DatasetError
from fednet.protocol import registry
from fednet.protocol.base import StragglerShortfall
from fednet.sim.compute import Availability, BernoulliDropout, ShiftedExponential, TraceCompute
from fednet.sim.simulation import Simulation
from fednet.study.checkpoint import CHECKPOINT
from fednet.study.config import StudyError, load_study
from fednet.study.output import MARKER, StagedOutput, pid_alive
from fednet.topologies.lte import lte_star

from factories import make_task

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ["conventional", "codedpaddedfl", "cfl", "codedsecagg", "lightsecagg", "approx_gc"]

#: Params that make each protocol valid on the 6-device template (approx_gc: 10 devices for its
#: default single-class setting at run time; its load-time checks need only d < D).
VALID = {
    "conventional": "{}",
    "codedpaddedfl": "{ alpha = 2 }",
    "cfl": "{ redundancy = 0.2 }",
    "codedsecagg": "{ z = 1, groups = 2 }",
    "lightsecagg": "{ z = 1 }",
    "approx_gc": "{ k = 5, d = 2 }",
}


def study_text(*, top: str = "", data: str = "", network: str = "", training: str = "",
               protocol: str = "conventional", params: str | None = None, runs: str | None = None,
               epochs: int = 2, n_devices: int = 6) -> str:
    """A tiny study: digits, 40 random features, ``n_devices`` devices, ``epochs`` rounds."""
    if runs is None:
        runs = f'[[runs]]\nprotocol = "{protocol}"\nparams = {VALID[protocol] if params is None else params}\n'
    return (f'name = "tiny"\nseeds = [0]\ntargets = [0.5]\nepochs = {epochs}\nrun_to_end = true\n{top}\n'
            f'[data]\ndataset = "digits"\nn_components = 40\n{data}\n'
            f'[network]\nn_devices = {n_devices}\ncompute = "deterministic"\nloss = 0.0\n{network}\n'
            f'[training]\n{training}\n{runs}')


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def expect_cli_error(tmp_path: Path, capsys, args: list[str], needle: str) -> str:
    """Run the CLI; assert exit 2, the needle in stderr, no traceback; return stderr."""
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    assert err.startswith("fednet: ")
    return err


# ---------------------------------------------------------------------------------------------
# 1. Study and protocol fields at their bounds and beyond (load time; CLI exit 2 naming the key)
# ---------------------------------------------------------------------------------------------
HUGE = 10**30

#: (section, line, expected, needle): ``expected`` is "error" (needle in the message) or "correct"
#: (the study loads; needle is the key whose value is checked).
FIELD_CASES = [
    # [network]
    ("network", "n_devices = 0", "error", "network.n_devices"),
    ("network", "n_devices = -3", "error", "network.n_devices"),
    ("network", f"n_devices = {HUGE}", "error", "network.n_devices"),
    ("network", "n_devices = 2.5", "error", "network.n_devices"),
    ("network", 'n_devices = "6"', "error", "network.n_devices"),
    ("network", "n_devices = true", "error", "network.n_devices"),
    ("network", "uplink_bps = inf", "error", "network.uplink_bps"),
    ("network", "uplink_bps = nan", "error", "network.uplink_bps"),
    ("network", "uplink_bps = -1e6", "error", "network.uplink_bps"),
    ("network", "uplink_bps = 0.0", "error", "network.uplink_bps"),
    ("network", "uplink_bps = 1e-300", "error", "uplink_bps: Input should be greater than or equal to 1"),
    ("network", 'uplink_bps = "fast"', "error", "network.uplink_bps"),
    ("network", "downlink_bps = inf", "error", "network.downlink_bps"),
    ("network", "downlink_bps = -inf", "error", "network.downlink_bps"),
    ("network", "downlink_bps = nan", "error", "network.downlink_bps"),
    ("network", "loss = 1.0", "error", "network.loss"),
    ("network", "loss = 0.9999", "error", "loss: Input should be less than or equal to 0.999"),
    ("network", "loss = -0.1", "error", "network.loss"),
    ("network", "loss = nan", "error", "network.loss"),
    ("network", "loss = inf", "error", "network.loss"),
    ("network", "header_overhead = inf", "error", "network.header_overhead"),
    ("network", "header_overhead = nan", "error", "network.header_overhead"),
    ("network", "header_overhead = -0.1", "error", "network.header_overhead"),
    ("network", "header_overhead = 1e9", "error", "network.header_overhead"),
    ("network", "packet_bits = 0", "error", "network.packet_bits"),
    ("network", "packet_bits = -8", "error", "network.packet_bits"),
    ("network", f"packet_bits = {HUGE}", "error", "network.packet_bits"),
    ("network", "packet_bits = 1.5", "error", "network.packet_bits"),
    ("network", "server_mac_rate = inf", "error", "network.server_mac_rate"),
    ("network", "server_mac_rate = nan", "error", "network.server_mac_rate"),
    ("network", "server_mac_rate = 0.0", "error", "network.server_mac_rate"),
    ("network", "server_mac_rate = 0.5", "error", "server_mac_rate must be at least 1 MAC/s"),
    ("network", "device_mac_rates = [1e6, 1e6, 1e6, 1e6, 1e6, inf]", "error", "network.device_mac_rates"),
    ("network", "device_mac_rates = [1e6, 1e6, 1e6, 1e6, 1e6, nan]", "error", "network.device_mac_rates"),
    ("network", "device_mac_rates = [1e6, 1e6, 1e6, 1e6, 1e6, 0.0]", "error", "entry 5 is 0.0"),
    ("network", "device_mac_rates = [1e6, 1e6]", "error", "device_mac_rates has 2 entries for n_devices = 6"),
    ("network", 'device_mac_rates = "fast"', "error", "network.device_mac_rates"),
    ("network", "setup_fraction = inf", "error", "network.setup_fraction"),
    ("network", "setup_fraction = nan", "error", "network.setup_fraction"),
    ("network", "setup_fraction = -1.0", "error", "network.setup_fraction"),
    ("network", "dropout = 1.0", "error", "network.dropout"),
    ("network", "dropout = -0.1", "error", "network.dropout"),
    ("network", "dropout = nan", "error", "network.dropout"),
    ("network", 'compute = "magic"', "error", "network.compute"),
    ("network", 'kind = "mesh"', "error", "network.kind"),
    ("network", "loss = 0.999", "correct", "loss"),
    ("network", "dropout = 0.0", "correct", "dropout"),
    ("network", "header_overhead = 0.0", "correct", "header_overhead"),
    ("network", "uplink_bps = 1.0", "correct", "uplink_bps"),
    # [data]
    ("data", "n_components = 0", "error", "data.n_components"),
    ("data", "n_components = -5", "error", "data.n_components"),
    ("data", f"n_components = {HUGE}", "error", "data.n_components"),
    ("data", "feature_seed = -1", "error", "data.feature_seed"),
    ("data", f"feature_seed = {2**64}", "error", "data.feature_seed"),
    ("data", "rbf_gamma = 0.0", "error", "data.rbf_gamma"),
    ("data", "rbf_gamma = inf", "error", "data.rbf_gamma"),
    ("data", "rbf_gamma = nan", "error", "data.rbf_gamma"),
    ("data", 'partition = "random"', "error", "data.partition"),
    ("data", 'partition = "dirichlet"', "error", "partition = 'dirichlet' needs dirichlet_alpha"),
    ("data", 'partition = "dirichlet"\ndirichlet_alpha = nan', "error", "data.dirichlet_alpha"),
    ("data", 'dataset = "cifar"', "error", "data.dataset"),
    ("data", "n_components = 1", "correct", "n_components"),
    # [training]
    ("training", "learning_rate = 0.0", "error", "training.learning_rate"),
    ("training", "learning_rate = -1.0", "error", "training.learning_rate"),
    ("training", "learning_rate = inf", "error", "training.learning_rate"),
    ("training", "learning_rate = nan", "error", "training.learning_rate"),
    ("training", "lr_decay = 0.0", "error", "training.lr_decay"),
    ("training", "lr_decay = inf", "error", "training.lr_decay"),
    ("training", "weight_decay = -1e-6", "error", "training.weight_decay"),
    ("training", "weight_decay = nan", "error", "training.weight_decay"),
    ("training", "lr_milestones = [0]", "error", "lr_milestones must be epochs"),
    ("training", "lr_milestones = [-5]", "error", "lr_milestones must be epochs"),
    ("training", "weight_decay = 0.0", "correct", "weight_decay"),
    # top level
    ("top", "seeds = [-1]", "error", "seeds must be in [0, 2**63 - 1]"),
    ("top", f"seeds = [{2**64}]", "error", "seeds must be in [0, 2**63 - 1]"),
    ("top", "seeds = []", "error", "seeds"),
    ("top", "seeds = [0, 0]", "error", "seeds must be distinct"),
    ("top", "seeds = [0.5]", "error", "seeds.0"),
    ("top", "targets = [1.5]", "error", "targets must be accuracies in (0, 1]"),
    ("top", "targets = [nan]", "error", "targets"),
    ("top", "targets = [0.0]", "error", "targets must be accuracies in (0, 1]"),
    ("top", "epochs = -1", "error", "epochs"),
    ("top", f"epochs = {HUGE}", "error", "epochs"),
    ("top", "epochs = 1.5", "error", "epochs"),
    ("top", "stop_at = 0.0", "error", "stop_at"),
    ("top", "stop_at = 1.5", "error", "stop_at"),
    ("top", "stop_at = nan", "error", "stop_at"),
    ("top", 'baseline = "nobody"', "error", "baseline 'nobody' is not the label of a run"),
    ("top", 'strict = "yes"', "error", "strict"),
    ("top", "colour = 3", "error", "colour: Extra inputs are not permitted"),
    ("top", "record_views = 1", "error", "record_views"),
    ("top", "strict = true", "correct", "strict"),
    ("top", f"seeds = [{2**63 - 1}]", "correct", "seeds"),
]


def _edit(section: str, line: str) -> str:
    kw = {"top": "top", "network": "network", "data": "data", "training": "training"}[section]
    text = study_text(**{kw: line})
    # the edited key replaces the template's own (a repeated key would be invalid TOML)
    key = line.split("=")[0].strip()
    lines = text.splitlines()
    mine = lines.index(line.splitlines()[0])
    return "\n".join(x for i, x in enumerate(lines) if not (x.startswith(key + " =") and i != mine)) + "\n"


@pytest.mark.parametrize("section,line,expected,needle", FIELD_CASES,
                         ids=[f"{s}:{l.splitlines()[-1][:40]}" for s, l, _, _ in FIELD_CASES])
def test_field_bounds(tmp_path, capsys, section, line, expected, needle) -> None:
    path = write(tmp_path, _edit(section, line))
    if expected == "correct":
        study = load_study(path)
        spec = study if section == "top" else getattr(study, section)
        import tomllib

        want = tomllib.loads(line)[needle]
        assert getattr(spec, needle) == want
        return
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert isinstance(err.value, ConfigError) and isinstance(err.value, ValueError)
    assert needle in str(err.value)
    out = tmp_path / "out"
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(out), "--quiet"], needle)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


#: (protocol, params, expected, needle) -- every protocol's Config at its bounds and beyond.
PARAM_CASES = [
    ("conventional", "{ minibatch_fraction = 0.0 }", "error", "params.minibatch_fraction"),
    ("conventional", "{ minibatch_fraction = 1.5 }", "error", "params.minibatch_fraction"),
    ("conventional", "{ minibatch_fraction = nan }", "error", "params.minibatch_fraction"),
    ("conventional", "{ minibatch_fraction = inf }", "error", "params.minibatch_fraction"),
    ("conventional", "{ drop_slowest = -1 }", "error", "params.drop_slowest"),
    ("conventional", "{ drop_slowest = 6 }", "error", "drop_slowest must be less than the number of devices (6)"),
    ("conventional", f"{{ drop_slowest = {HUGE} }}", "error", "drop_slowest"),
    ("conventional", "{ drop_slowest = 1.5 }", "error", "params.drop_slowest"),
    ("conventional", "{ element_bits = 0 }", "error", "params.element_bits"),
    ("conventional", f"{{ element_bits = {HUGE} }}", "error", "params.element_bits"),
    ("conventional", "{ dropslowest = 1 }", "error", "params.dropslowest: Extra inputs"),
    ("conventional", "{ minibatch_fraction = 1.0, drop_slowest = 5 }", "correct", "drop_slowest"),
    ("codedpaddedfl", "{}", "error", "params.alpha: Field required"),
    ("codedpaddedfl", "{ alpha = 0 }", "error", "params.alpha"),
    ("codedpaddedfl", "{ alpha = 7 }", "error", "alpha must be at most the smallest group size"),
    ("codedpaddedfl", "{ alpha = nan }", "error", "params.alpha"),
    ("codedpaddedfl", "{ alpha = 2, groups = 0 }", "error", "params.groups"),
    ("codedpaddedfl", "{ alpha = 2, groups = 7 }", "error", "groups must be at most the number of devices"),
    ("codedpaddedfl", "{ alpha = 2, k = 7 }", "error", "params.k"),
    ("codedpaddedfl", f"{{ alpha = 2, k = {HUGE} }}", "error", "params.k"),
    ("codedpaddedfl", "{ alpha = 2, f = 0 }", "error", "params.f"),
    ("codedpaddedfl", "{ alpha = 2, k = 48, f = 48 }", "error", "params: f must be less than k = 48, got 48"),
    ("codedpaddedfl", "{ alpha = 2, code_fraction_bits = 41 }", "error", "params.code_fraction_bits"),
    ("codedpaddedfl", "{ alpha = 2, code_draws = 0 }", "error", "params.code_draws"),
    ("codedpaddedfl", '{ alpha = 2, mode = "fast" }', "error", "params.mode"),
    ("codedpaddedfl", f"{{ alpha = 2, element_bits = {HUGE} }}", "error", "params.element_bits"),
    ("codedpaddedfl", f"{{ alpha = 2, code_draws = {HUGE} }}", "error", "params.code_draws"),
    ("codedpaddedfl", "{ alpha = 6 }", "correct", "alpha"),
    ("cfl", "{}", "error", "params.redundancy: Field required"),
    ("cfl", "{ redundancy = 0.0 }", "error", "params.redundancy"),
    ("cfl", "{ redundancy = 1.0 }", "error", "params.redundancy"),
    ("cfl", "{ redundancy = nan }", "error", "params.redundancy"),
    ("cfl", "{ redundancy = inf }", "error", "params.redundancy"),
    ("cfl", "{ redundancy = -0.5 }", "error", "params.redundancy"),
    ("cfl", "{ redundancy = 0.2, load_grid = 1 }", "error", "params.load_grid"),
    ("cfl", "{ redundancy = 0.2, max_tries = 0 }", "error", "params.max_tries"),
    ("cfl", f"{{ redundancy = 0.2, load_grid = {HUGE} }}", "error", "params.load_grid"),
    ("cfl", "{ redundancy = 0.2, max_tries = 1000000 }", "error", "params.max_tries"),
    ("cfl", "{ redundancy = 0.8 }", "correct", "redundancy"),
    ("codedsecagg", "{ z = -1 }", "error", "params.z"),
    ("codedsecagg", "{ z = 1, k_prime = 1 }", "error", "k_prime must exceed z = 1"),
    ("codedsecagg", "{ z = 1, groups = 4 }", "error", "groups must divide the number of devices (6)"),
    ("codedsecagg", "{ z = 1, groups = 0 }", "error", "params.groups"),
    ("codedsecagg", "{ z = 2, groups = 3 }", "error", "every group needs at least k_prime = 3 devices"),
    ("codedsecagg", "{ z = 1, k = 63 }", "error", "params.k"),
    ("codedsecagg", "{ z = 1, k = 48, f = 48 }", "error", "f must be less than k = 48"),
    ("codedsecagg", "{ z = 1, share_element_bits = 0 }", "error", "params.share_element_bits"),
    ("codedsecagg", "{ z = 1, groups = 2, z = 2 }", "error", "invalid TOML"),
    ("codedsecagg", f"{{ z = 1, share_element_bits = {HUGE} }}", "error", "params.share_element_bits"),
    ("codedsecagg", "{ z = 0, groups = 6 }", "correct", "groups"),
    ("lightsecagg", "{ z = -1 }", "error", "params.z"),
    ("lightsecagg", "{ z = 1, U = 1 }", "error", "U must exceed z = 1"),
    ("lightsecagg", "{ z = 1, U = 7 }", "error", "U must satisfy T = 1 < U <= N = 6, got 7"),
    ("lightsecagg", "{ z = 1, p = 4 }", "error", "params: p = 4 is not usable"),
    ("lightsecagg", f"{{ z = 1, p = {2**31 - 1} }}", "correct", "p"),
    ("lightsecagg", "{ z = 1, quant_bits = -1 }", "error", "params.quant_bits"),
    ("lightsecagg", "{ z = 1, quant_bits = 41 }", "error", "params.quant_bits"),
    ("lightsecagg", "{ z = 1, minibatch_fraction = nan }", "error", "params.minibatch_fraction"),
    ("lightsecagg", '{ z = 1, mask_relay = "carrier pigeon" }', "error", "params.mask_relay"),
    ("lightsecagg", "{ z = 1, element_bits = 5000 }", "error", "params.element_bits"),
    ("lightsecagg", "{ z = 1, U = 6 }", "correct", "U"),
    ("approx_gc", "{ k = 0 }", "error", "params.k"),
    ("approx_gc", "{ c = 1.5 }", "error", "params.c"),
    ("approx_gc", "{ c = nan }", "error", "params.c"),
    ("approx_gc", "{ d = -1 }", "error", "params.d"),
    ("approx_gc", "{ d = 6 }", "error", "d must be at most n_devices - 1 = 5"),
    ("approx_gc", "{ p = 1.0 }", "error", "params.p"),
    ("approx_gc", "{ p = nan }", "error", "params.p"),
    ("approx_gc", "{ learning_rate = inf }", "error", "params.learning_rate"),
    ("approx_gc", "{ lr_decay = 1.5 }", "error", "params.lr_decay"),
    ("approx_gc", '{ setting = "dirichlet" }', "error", "setting = 'dirichlet' needs alpha"),
    ("approx_gc", '{ setting = "dirichlet", alpha = 0.0 }', "error", "params.alpha"),
    ("approx_gc", "{ d = 5, c = 1.0 }", "correct", "d"),
]


@pytest.mark.parametrize("protocol,params,expected,needle", PARAM_CASES,
                         ids=[f"{p}:{q}" for p, q, _, _ in PARAM_CASES])
def test_protocol_params(tmp_path, capsys, protocol, params, expected, needle) -> None:
    path = write(tmp_path, study_text(protocol=protocol, params=params))
    if expected == "correct":
        import tomllib

        run = load_study(path).runs[0]
        cfg = registry.get(protocol).Config.model_validate(run.params)
        assert getattr(cfg, needle) == tomllib.loads(f"x = {params}")["x"][needle]
        return
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert needle in str(err.value)
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"], needle)
    assert not (tmp_path / "out").exists()


#: Cross-checks of combinations: (network lines, runs TOML, expected, needle).
COMBO_CASES = [
    ("dropout = 0.1", '[[runs]]\nprotocol = "conventional"\n', "error",
     "network.dropout = 0.1 leaves 5.4 of 6 devices available on average, fewer than the D - drop_slowest = 6"),
    ("dropout = 0.3", '[[runs]]\nprotocol = "conventional"\nparams = { drop_slowest = 1 }\n', "error",
     "set drop_slowest >= 2"),
    ("dropout = 0.3", '[[runs]]\nprotocol = "conventional"\nparams = { drop_slowest = 2 }\n', "correct", ""),
    ("dropout = 0.2", '[[runs]]\nprotocol = "codedpaddedfl"\nparams = { alpha = 1 }\n', "error",
     "D_g - alpha + 1 = 6"),
    ("dropout = 0.2", '[[runs]]\nprotocol = "codedpaddedfl"\nparams = { alpha = 3 }\n', "correct", ""),
    ("dropout = 0.3", '[[runs]]\nprotocol = "codedsecagg"\nparams = { z = 1, groups = 2 }\n', "error",
     "fewer than the k_prime = 2 the decoder needs"),
    ("dropout = 0.1", '[[runs]]\nprotocol = "codedsecagg"\nparams = { z = 1, groups = 2 }\n', "correct", ""),
    ("dropout = 0.2", '[[runs]]\nprotocol = "lightsecagg"\nparams = { z = 1 }\n', "error",
     "fewer than U = 6 survivors"),
    ("dropout = 0.2", '[[runs]]\nprotocol = "lightsecagg"\nparams = { z = 1, U = 4 }\n', "correct", ""),
    ("dropout = 0.9", '[[runs]]\nprotocol = "cfl"\nparams = { redundancy = 0.2 }\n', "correct", ""),
    ("dropout = 0.5", '[[runs]]\nprotocol = "approx_gc"\nparams = { d = 2 }\n', "correct", ""),
    ("", '[[runs]]\nlabel = "a b"\nprotocol = "conventional"\n[[runs]]\nlabel = "a_b"\nprotocol = "cfl"\n'
         'params = { redundancy = 0.2 }\n', "error", "map to the same output folder 'a_b'"),
    ("", '[[runs]]\nlabel = "Run"\nprotocol = "conventional"\n[[runs]]\nlabel = "run"\nprotocol = "cfl"\n'
         'params = { redundancy = 0.2 }\n', "error", "map to the same output folder"),
    ("", '[[runs]]\nlabel = "summary.json"\nprotocol = "conventional"\n', "error", "the name of an output file"),
    ("", '[[runs]]\nlabel = ".."\nprotocol = "conventional"\n', "correct", ""),
    ("", '[[runs]]\nlabel = ""\nprotocol = "conventional"\n', "error", "runs.0.label"),
    ("", '[[runs]]\nprotocol = "conventional"\n[[runs]]\nprotocol = "conventional"\n', "error",
     "run labels must be unique"),
    ("", '[[runs]]\nprotocol = "teleport"\n', "error", "unknown protocol 'teleport'"),
    ("", "", "error", "runs"),
]


@pytest.mark.parametrize("network,runs,expected,needle", COMBO_CASES,
                         ids=[f"combo{i}" for i in range(len(COMBO_CASES))])
def test_combinations(tmp_path, capsys, network, runs, expected, needle) -> None:
    path = write(tmp_path, study_text(network=network, runs=runs))
    if expected == "correct":
        assert load_study(path).network.dropout == (float(network.split("=")[1]) if network else 0.0)
        return
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert needle in str(err.value)
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"], needle)


#: Bad study files: (file content or None for missing, expected needle).
FILE_CASES = [
    (None, "study file not found"),
    (b"name = \"caf\xe9\"\n", "not UTF-8 text"),
    ("<dir>", "is a folder"),
    ("name = \n", "invalid TOML"),
    ("\x00\x01binary", "invalid TOML"),
    ('name = "x"\n', "runs: Field required"),
    ('name = "../escape"\n[[runs]]\nprotocol = "conventional"\n', "name must be a plain name"),
    ('name = "/abs"\n[[runs]]\nprotocol = "conventional"\n', "name must be a plain name"),
    ('name = ""\n[[runs]]\nprotocol = "conventional"\n', "name"),
    ('name = "x"\nruns = 3\n', "runs"),
    ('name = "x"\n[network]\nn_devices = 3\n[[runs]]\nprotocol = "conventional"\n[[runs]]\nprotocol = 5\n',
     "runs.1.protocol"),
]


@pytest.mark.parametrize("content,needle", FILE_CASES, ids=[f"file{i}" for i in range(len(FILE_CASES))])
def test_bad_study_files(tmp_path, capsys, content, needle) -> None:
    path = tmp_path / "s.toml"
    if content == "<dir>":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert needle in str(err.value)
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"], needle)


@pytest.mark.parametrize("args,needle", [
    (["--seed", "-1"], "seeds must be in [0, 2**63 - 1], got [-1]"),
    (["--seed", str(2**70)], "seeds must be in [0, 2**63 - 1]"),
])
def test_bad_cli_seed(tmp_path, capsys, args, needle) -> None:
    path = write(tmp_path, study_text())
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet", *args], needle)


def test_unknown_study_name(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    expect_cli_error(tmp_path, capsys, ["run", "no_such_study", "--quiet"], "study file not found: no_such_study")


#: Damaged saved results for ``fednet summarize`` / ``fednet plot``: (command, summary.json text, needle).
SAVED_CASES = [
    ("summarize", "{bad", "Expecting property name"),
    ("plot", "{bad", "Expecting property name"),
    ("summarize", '{"runs": 5}', "summary.json holds no table of runs"),
    ("summarize", '[1, 2]', "summary.json holds no table of runs"),
    ("plot", '{"runs": {"a": {"trace_csv": "a/trace.csv"}}, "targets": []}', "trace of run 'a' is missing"),
    ("summarize", None, "holds no summary.json"),
]


@pytest.mark.parametrize("cmd,text,needle", SAVED_CASES, ids=[f"saved{i}" for i in range(len(SAVED_CASES))])
def test_damaged_saved_results(tmp_path, capsys, cmd, text, needle) -> None:
    d = tmp_path / "res"
    d.mkdir()
    if text is not None:
        (d / "summary.json").write_text(text)
    expect_cli_error(tmp_path, capsys, [cmd, str(d)], needle)


def test_data_dependent_misfit_is_a_named_error_before_any_output(tmp_path, capsys) -> None:
    # approx_gc's default single-class setting needs n_devices == 10 classes: found with the data.
    path = write(tmp_path, study_text(protocol="approx_gc"))
    err = expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"],
                           "setting = 'single-class' needs n_devices == n_classes = 10, got 6")
    assert "runs[0] (approx_gc).params" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


#: The engine's own checks (Python API): (constructor, expected needle).
def _sim(**graph_attrs):
    g = lte_star(D, device_mac_rates=[1e6] * D, loss=0.0)
    g.graph.update(graph_attrs)
    return Simulation(g, 0)


def _sim_edge(**edge):
    g = lte_star(D, device_mac_rates=[1e6] * D, loss=0.0)
    for _, _, e in g.edges(data=True):
        e.update(edge)
    return Simulation(g, 0)


def _sim_mac(rate):
    g = lte_star(D, device_mac_rates=[1e6] * D, loss=0.0)
    last = [n for n, a in g.nodes(data=True) if a.get("role") != "server"][-1]
    g.nodes[last]["mac_rate"] = rate          # the engine's own check, past the topology builder's
    return Simulation(g, 0)


ENGINE_CASES = [
    (lambda: ShiftedExponential(float("inf")), "setup_fraction must be a finite number"),
    (lambda: ShiftedExponential(float("nan")), "setup_fraction must be a finite number"),
    (lambda: ShiftedExponential(-0.5), "setup_fraction must be a finite number"),
    (lambda: TraceCompute({0: [float("nan")]}), "delays[0] must be a non-empty sequence of finite seconds"),
    (lambda: TraceCompute({1: [1.0, float("inf")]}), "delays[1]"),
    (lambda: TraceCompute({2: []}), "delays[2]"),
    (lambda: BernoulliDropout(float("nan")), "dropout probability p must be in [0, 1)"),
    (lambda: BernoulliDropout(1.0), "dropout probability p must be in [0, 1)"),
    (lambda: _sim(header_overhead=float("inf")), "header_overhead must be a finite fraction"),
    (lambda: _sim(header_overhead=float("nan")), "header_overhead must be a finite fraction"),
    (lambda: _sim(packet_bits=float("inf")), "packet_bits must be a finite positive number"),
    (lambda: _sim(packet_bits=0), "packet_bits must be a finite positive number"),
    (lambda: _sim_edge(uplink_bps=float("inf")), "uplink_bps of device"),
    (lambda: _sim_edge(downlink_bps=float("nan")), "downlink_bps of device"),
    (lambda: _sim_edge(uplink_bps=-1.0), "uplink_bps of device"),
    (lambda: _sim_edge(uplink_loss=float("nan")), "uplink loss of device"),
    (lambda: _sim_edge(downlink_loss=1.0), "downlink loss of device"),
    (lambda: _sim_mac(float("inf")), "mac_rate of device"),
    (lambda: _sim_mac(float("nan")), "mac_rate of device"),
    (lambda: _sim_mac(0.0), "mac_rate of device"),
    (lambda: registry.get("conventional")(_sim(), make_task(D=D), {"drop_slowest": float("nan")}),
     "conventional drop_slowest"),
    (lambda: registry.get("cfl")(_sim(), make_task(D=D), {"redundancy": float("inf")}),
     "cfl redundancy: Input should be a finite number"),
    (lambda: registry.get("codedpaddedfl")(_sim(), make_task(D=D), None), "codedpaddedfl alpha: Field required"),
    (lambda: registry.get("lightsecagg")(_sim(), make_task(D=D), {"z": 1, "U": 9}), "lightsecagg: U must satisfy"),
]


@pytest.mark.parametrize("make,needle", ENGINE_CASES, ids=[f"engine{i}" for i in range(len(ENGINE_CASES))])
def test_engine_refuses_non_finite_and_out_of_range_values(make, needle) -> None:
    with pytest.raises(ConfigError) as err:
        make()
    assert needle in str(err.value)
    assert isinstance(err.value, ValueError)


#: Studies that validate but misfit the data: found once the data are loaded, still before any
#: output: (study text, needle).
DATA_MISFITS = [
    (study_text(n_devices=2000), "cannot split the 1347 training points of 'digits' over network.n_devices = 2000"),
    (_edit("data", 'partition = "dirichlet"\ndirichlet_alpha = 0.001'), "without training points"),
    (study_text(protocol="approx_gc", params="{ k = 1000, d = 2 }", n_devices=10),
     "k = 1000 exceeds the smallest class of the training data (131)"),
]


@pytest.mark.parametrize("text,needle", DATA_MISFITS, ids=[f"misfit{i}" for i in range(len(DATA_MISFITS))])
def test_data_misfits_are_named_errors(tmp_path, capsys, text, needle) -> None:
    path = write(tmp_path, text)
    expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"], needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


#: Exact formats too narrow for the data: the capacity checks (issue 14, item 1;
#: fednet.algebra.capacity, LightSecAgg's check of U 2^quant_bits against its prime) refuse them
#: before training with a CapacityError naming the parameter and the smallest setting that works.
#: Expected: exit 2, one message, no traceback, nothing written: (protocol, params, needle).
TOO_NARROW = [
    ("codedpaddedfl", "{ alpha = 2, k = 8, f = 4 }", "k = 8 too small: Q<8,4> holds magnitudes below 2^3 = 8"),
    ("codedsecagg", "{ z = 1, groups = 2, k = 8, f = 4 }", "the smallest k that works with f = 4 is k = "),
    ("lightsecagg", "{ z = 1, quant_bits = 40 }", "the smallest prime that works is p = 13194139533349"),
    ("codedpaddedfl", "{ alpha = 2, k = 62, f = 61 }", "no k <= 62 works with f = 61"),
]


@pytest.mark.parametrize("protocol,params,needle", TOO_NARROW, ids=[f"{p}:{q}" for p, q, _ in TOO_NARROW])
def test_too_narrow_formats_are_refused_before_training(tmp_path, capsys, protocol, params, needle) -> None:
    path = write(tmp_path, study_text(protocol=protocol, params=params))
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fednet: ") and "Traceback" not in err
    assert needle in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 2. Error family and the CLI's handling
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,bases", [
    (StudyError, (ConfigError, ValueError)), (CapacityError, (ConfigError, ValueError)),
    (DatasetError, (DataError, RuntimeError)), (StragglerShortfall, (DecodeFailure, RuntimeError)),
    (OutputLocked, (OutputError, OSError)),
])
def test_error_family(cls, bases) -> None:
    assert issubclass(cls, FednetError)
    for b in bases:
        assert issubclass(cls, b)


def test_unexpected_exception_keeps_its_traceback(tmp_path, monkeypatch) -> None:
    def boom(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(runner_mod, "prepare_task", boom)
    path = write(tmp_path, study_text())
    with pytest.raises(ZeroDivisionError):
        main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]   # no staging folder, no lock


def test_every_protocol_runs_end_to_end_through_the_cli(tmp_path, capsys) -> None:
    runs = "".join(f'[[runs]]\nprotocol = "{p}"\nparams = {VALID[p]}\n' for p in PROTOCOLS if p != "approx_gc")
    path = write(tmp_path, study_text(runs=runs))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MARKER, "summary.json", "study.json", "timing.json", "provenance.json", "accuracy_vs_time.png",
                            "secret_seed.json"] + [p for p in PROTOCOLS if p != "approx_gc"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.toml"]


# ---------------------------------------------------------------------------------------------
# 3. Bad --out targets
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def tiny(tmp_path) -> Path:
    return write(tmp_path, study_text(epochs=1))


def run_cli(study: Path, out: Path | str) -> int:
    return main(["run", str(study), "--out", str(out), "--quiet"])


def test_out_dot_refuses_and_keeps_the_current_folder(tmp_path, tiny, capsys, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", ".", "--quiet"], "current folder")
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", "..", "--quiet"], "current folder")
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(tmp_path / "work" / "x" / ".."), "--quiet"],
                     "current folder")
    (tmp_path / "alias").symlink_to(work)
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(tmp_path / "alias" / "sub" / ".."),
                                        "--quiet"], "current folder")
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_out_on_a_users_folder_refuses_and_leaves_it(tmp_path, tiny, capsys) -> None:
    user = tmp_path / "thesis"
    (user / "chapter").mkdir(parents=True)
    (user / "chapter" / "draft.tex").write_text("precious")
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(user), "--quiet"], "did not write")
    assert (user / "chapter" / "draft.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml", "thesis"]


def test_out_on_a_file_refuses(tmp_path, tiny, capsys) -> None:
    f = tmp_path / "results.txt"
    f.write_text("keep")
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(f), "--quiet"], "not a folder")
    assert f.read_text() == "keep"


def test_out_on_a_symlink_refuses(tmp_path, tiny, capsys) -> None:
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(tmp_path / "link"), "--quiet"],
                     "symbolic link")


def test_out_under_a_file_is_a_named_error(tmp_path, tiny, capsys) -> None:
    (tmp_path / "plain").write_text("x")
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(tmp_path / "plain" / "out"), "--quiet"],
                     "cannot create the parent folder")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_where_nothing_can_be_written(tmp_path, tiny, capsys) -> None:
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", "/proc/fednet_out", "--quiet"],
                     "cannot write next to --out '/proc/fednet_out'")


def test_rerun_replaces_only_fednets_own_folder(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "out"
    assert run_cli(tiny, out) == 0
    first = (out / "conventional" / "trace.csv").read_text()
    marker = (out / MARKER).read_bytes()
    assert run_cli(tiny, out) == 0                          # correct: replaced
    assert (out / "conventional" / "trace.csv").read_text() == first
    assert (out / MARKER).read_bytes() == marker           # reproducible: no pid or time in it
    assert sorted(json.loads(marker)["files"]) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                                                         if p.name != MARKER)
    (out / "my_notes.txt").write_text("mine")               # a user's file inside fednet's folder
    expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(out), "--quiet"], "my_notes.txt")
    assert (out / "my_notes.txt").read_text() == "mine"
    assert (out / "conventional" / "trace.csv").read_text() == first


def test_empty_and_nested_new_folders_are_used(tmp_path, tiny) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(tiny, empty) == 0 and (empty / "summary.json").is_file()
    nested = tmp_path / "a" / "b" / "c"
    assert run_cli(tiny, nested) == 0 and (nested / MARKER).is_file()


def test_failed_run_removes_the_parent_folders_it_created(tmp_path, tiny, monkeypatch) -> None:
    def bad(*a, **k):
        raise DatasetError("digits: simulated corrupt file")

    monkeypatch.setattr(runner_mod, "prepare_task", bad)
    assert run_cli(tiny, tmp_path / "new" / "deeper" / "out") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
time.sleep(60)
"""


def test_live_lock_refuses_at_once_naming_the_pid(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / ".out.fednet-lock")],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline().strip() == "locked"
        t0 = time.perf_counter()
        err = expect_cli_error(tmp_path, capsys, ["run", str(tiny), "--out", str(out), "--quiet"],
                               f"process id {sleeper.pid}")
        assert time.perf_counter() - t0 < 5 and "in use by another fednet run" in err
        assert not out.exists()
        assert (tmp_path / ".out.fednet-lock").read_text().strip() == str(sleeper.pid)   # not ours to remove
    finally:
        sleeper.kill()
        sleeper.wait()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


@pytest.mark.parametrize("holder", ["dead", "alive-but-unlocked"])
def test_stale_lock_file_is_taken_over(tmp_path, tiny, holder) -> None:
    # a lock file nobody holds (its writer was killed; or its pid now belongs to another process)
    pid = dead_pid() if holder == "dead" else os.getppid()
    (tmp_path / ".out.fednet-lock").write_text(f"{pid}\n")
    assert run_cli(tiny, tmp_path / "out") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.toml"]


@pytest.mark.parametrize("holder", ["dead", "reused-pid"])
def test_stale_partial_is_cleaned_but_a_users_lookalike_is_not(tmp_path, tiny, holder) -> None:
    pid = dead_pid() if holder == "dead" else os.getppid()
    stale = tmp_path / f".out.partial-{pid}-abcd"
    stale.mkdir()
    (stale / MARKER).write_text('{"fednet": "output", "files": []}')
    (stale / "summary.json").write_text("{}")
    lookalike = tmp_path / f".out.partial-{pid}-user"
    lookalike.mkdir()
    (lookalike / "keep.txt").write_text("mine")
    planted = tmp_path / f".out.partial-{pid}-planted"      # a forged marker beside the user's own file
    planted.mkdir()
    (planted / MARKER).write_text('{"fednet": "output", "files": []}')
    (planted / "thesis.tex").write_text("mine too")
    assert run_cli(tiny, tmp_path / "out") == 0
    assert not stale.exists()
    assert (lookalike / "keep.txt").read_text() == "mine"
    assert (planted / "thesis.tex").read_text() == "mine too"


# ---------------------------------------------------------------------------------------------
# 4. Kills during each output phase (forked children and a real CLI subprocess)
# ---------------------------------------------------------------------------------------------
PHASES = ["lock", "data", "run", "trace", "summary", "plot", "commit"]


def _patch_phase(phase: str, sig: int) -> None:
    """In a forked child: make the process send itself ``sig`` when ``phase`` starts."""
    def killer(orig):
        def f(*a, **k):
            # to the main thread itself (a process-directed signal may land on a helper thread, and
            # its handler would then run later, inside library code)
            signal.pthread_kill(threading.main_thread().ident, sig)
            time.sleep(2)                      # SIGTERM's handler raises before this returns
            return orig(*a, **k)
        return f

    if phase == "lock":
        output_mod.StagedOutput.remove_stale = killer(output_mod.StagedOutput.remove_stale)
    elif phase == "data":
        runner_mod.prepare_task = killer(runner_mod.prepare_task)
    elif phase == "run":
        runner_mod._run_one = killer(runner_mod._run_one)
    elif phase == "trace":
        runner_mod.csv.DictWriter = killer(runner_mod.csv.DictWriter)
    elif phase == "summary":
        runner_mod.summarize = killer(runner_mod.summarize)
    elif phase == "plot":
        plots_mod.plot_accuracy_vs_time = killer(plots_mod.plot_accuracy_vs_time)
    elif phase == "commit":
        output_mod.StagedOutput.commit = killer(output_mod.StagedOutput.commit)


def _fresh_signal_handlers() -> None:
    """In a forked child: the handlers a CLI process starts with, whatever earlier tests installed.

    The child inherits pytest's handlers; a library used by an earlier test in the same session
    (Dask's cluster, for one) may have replaced SIGINT's, and the child would then ignore the signal
    it is meant to be stopped by. A shell-started ``fednet`` has Python's defaults.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if s is not None:
            signal.signal(s, signal.SIG_DFL)


def _child(phase: str, sig: int, study: str, out: str) -> None:
    _fresh_signal_handlers()
    _patch_phase(phase, sig)
    sys.stderr = open(os.devnull, "w")
    code = main(["run", study, "--out", out, "--quiet"])
    os._exit(code)


def _kill_run(phase: str, sig: int, study: Path, out: Path) -> int:
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_child, args=(phase, sig, str(study), str(out)))
    p.start()
    p.join(60)
    assert not p.is_alive()
    return p.exitcode


def _debris(folder: Path) -> list[str]:
    """What a run on ``folder / "out"`` left beside it, except the checkpoint of its finished (run, seed) pairs:
    that is kept on purpose, for ``--resume`` (:mod:`fednet.study.checkpoint`; see the test below)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".out.") and p.name != ".out" + CHECKPOINT)


@pytest.mark.parametrize("phase", PHASES)
def test_sigterm_in_each_output_phase_leaves_no_debris_and_keeps_the_previous_result(tmp_path, tiny, phase) -> None:
    out = tmp_path / "out"
    assert run_cli(tiny, out) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    code = _kill_run(phase, signal.SIGTERM, tiny, out)
    assert code == 128 + signal.SIGTERM
    assert _debris(tmp_path) == []                       # no staging folder, no lock
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_in_each_output_phase_then_rerun_cleans_up(tmp_path, tiny, phase) -> None:
    out = tmp_path / "out"
    code = _kill_run(phase, signal.SIGKILL, tiny, out)
    assert code == -signal.SIGKILL
    left = _debris(tmp_path)
    assert ".out.fednet-lock" in left                    # a SIGKILL cannot clean: the lock stays
    if phase != "lock":
        assert any(".partial-" in n for n in left)
    assert not out.exists()
    assert run_cli(tiny, out) == 0                       # next start: stale lock and staging removed
    assert _debris(tmp_path) == []
    assert (out / "summary.json").is_file()


def _child_mid_commit(study: str, out: str) -> None:
    _fresh_signal_handlers()
    calls = {"n": 0}
    orig = output_mod.check_output_target

    def third_call_kills(*a, **k):      # 1, 2: entering; 3: inside commit, signals blocked
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return orig(*a, **k)

    output_mod.check_output_target = third_call_kills
    sys.stderr = open(os.devnull, "w")
    os._exit(main(["run", study, "--out", out, "--quiet"]))


def test_sigterm_during_the_final_renames_is_deferred_until_the_result_is_in_place(tmp_path, tiny) -> None:
    out = tmp_path / "out"
    assert run_cli(tiny, out) == 0
    (out / "conventional" / "trace.csv").write_text("old")          # tell old from new
    p = multiprocessing.get_context("fork").Process(target=_child_mid_commit, args=(str(tiny), str(out)))
    p.start()
    p.join(60)
    assert p.exitcode == 128 + signal.SIGTERM
    assert (out / "conventional" / "trace.csv").read_text().startswith("protocol,")   # the new result
    assert _debris(tmp_path) == []


def test_previous_result_renamed_away_by_a_killed_run_is_restored(tmp_path, tiny) -> None:
    out = tmp_path / "out"
    assert run_cli(tiny, out) == 0
    old = tmp_path / f".out.replaced-{dead_pid()}-abcd"
    out.rename(old)                                                  # SIGKILL between the renames
    with pytest.raises(KeyboardInterrupt):
        with StagedOutput(out):
            assert (out / "summary.json").is_file() and not old.exists()  # restored under the lock
            raise KeyboardInterrupt
    assert (out / "summary.json").is_file() and _debris(tmp_path) == []


LONG = study_text(epochs=1_000_000)


def _wait_for(pred, timeout=30.0) -> None:
    t0 = time.perf_counter()
    while not pred():
        assert time.perf_counter() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_real_cli_subprocess_sigterm_and_concurrent_run(tmp_path, capsys) -> None:
    study = write(tmp_path, LONG)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fednet.cli", "run", str(study), "--out", str(out), "--quiet"],
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(".partial-" in n for n in _debris(tmp_path)) or proc.poll() is not None)
        assert proc.poll() is None
        # a second run on the same --out fails at once, naming the first one's pid
        err = expect_cli_error(tmp_path, capsys, ["run", str(study), "--out", str(out), "--quiet"],
                               f"process id {proc.pid}")
        assert "in use" in err
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"Traceback" not in stderr
    assert _debris(tmp_path) == [] and not out.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_clean_like_sigterm(tmp_path, tiny, sig) -> None:
    code = _kill_run("plot", sig, tiny, tmp_path / "out")
    assert code == 128 + sig
    assert _debris(tmp_path) == [] and not (tmp_path / "out").exists()
    kept = tmp_path / (".out" + CHECKPOINT)                # every pair had finished: all kept for --resume
    assert sorted(p.name for p in kept.glob("run*.json")) == ["run0-seed0.json"]


def test_second_writer_in_the_same_process_is_refused(tmp_path) -> None:
    with StagedOutput(tmp_path / "out") as st:
        (st / "a.txt").write_text("1")
        with pytest.raises(OutputLocked, match=f"process id {os.getpid()}"):
            StagedOutput(tmp_path / "out").__enter__()
        assert st.is_dir()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MARKER, "a.txt"]
    assert _debris(tmp_path) == []


def test_staged_output_outside_the_main_thread_still_cleans_on_error(tmp_path) -> None:
    import threading

    box = {}

    def work():
        try:
            with StagedOutput(tmp_path / "out") as st:
                (st / "x").write_text("1")
                raise RuntimeError("fail")
        except RuntimeError as e:
            box["e"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "e" in box and sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# 5. Dropouts in each protocol's round phase: recorded failure, named error, or correct result
# ---------------------------------------------------------------------------------------------
class Absent(Availability):
    """Devices absent in given rounds: ``{round: {device, ...}}``."""

    def __init__(self, absent: dict[int, set[int]]) -> None:
        self.absent = absent

    def available(self, node: int, round: int, draw) -> bool:
        return node not in self.absent.get(round, ())


D = 6
API_PARAMS = {
    "conventional": {"drop_slowest": 1},
    "codedpaddedfl": {"alpha": 2},
    "cfl": {"redundancy": 0.2},
    "codedsecagg": {"groups": 2, "z": 1},
    "lightsecagg": {"z": 1, "U": 4},
    "approx_gc": {"setting": "iid", "k": 4, "d": 1, "p": 0.2},
}

#: (protocol, absent devices in round 2, expected): the round-2 outcome.
DROP_CASES = [
    ("conventional", {1}, "correct"),          # drop_slowest = 1 covers one absent device
    ("conventional", {1, 2}, "recorded"),
    ("conventional", set(range(D)), "recorded"),
    ("codedpaddedfl", {1}, "correct"),         # D - alpha + 1 = 5 responders suffice
    ("codedpaddedfl", {1, 3}, "recorded"),
    ("codedsecagg", {1}, "correct"),           # 2 of 3 columns complete, k' = 2
    ("codedsecagg", {0, 4}, "recorded"),       # only column 2 complete
    ("lightsecagg", {1, 2}, "correct"),        # U = 4 survivors
    ("lightsecagg", {1, 2, 3}, "recorded"),
    ("cfl", {1, 2, 3}, "correct"),             # deadline-based: proceeds with fewer
    ("cfl", set(range(D)), "correct"),
    ("approx_gc", {1, 2, 3}, "correct"),       # adds whoever is present
    ("approx_gc", set(range(D)), "correct"),
]


def _run_api(protocol: str, absent: dict[int, set[int]], strict: bool, epochs: int = 3):
    task = make_task(D=D, n=20, d=6, c=3)
    # a fixed secret seed: both runs of a comparison share their pads (the fixed-point rounding of a
    # padded product depends on the pad by one unit of 2^-f)
    sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.0), 1, availability=Absent(absent),
                     secret_seed=7)
    proto = registry.get(protocol)(sim, task, API_PARAMS[protocol])
    return proto.run(epochs, strict=strict), proto


@pytest.mark.parametrize("protocol,gone,expected", DROP_CASES,
                         ids=[f"{p}-absent{sorted(g)}" for p, g, _ in DROP_CASES])
def test_dropouts_in_the_round_phase(protocol, gone, expected) -> None:
    rows, _ = _run_api(protocol, {2: gone}, strict=False)
    clean, _ = _run_api(protocol, {}, strict=False)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    r1, r2 = rows[1], rows[2]
    if expected == "recorded":
        assert r2.get("decode_failed") is True and "round 2" in r2["skip_reason"] and r2["used"] == ""
        assert "decode_error" not in r2                                            # no stale metrics
        assert (r2["accuracy"], r2["loss"]) == (r1["accuracy"], r1["loss"])       # model unchanged
        assert r2["time_s"] >= r1["time_s"]
        with pytest.raises(StragglerShortfall, match="round 2") as err:            # strict: named error
            _run_api(protocol, {2: gone}, strict=True)
        assert isinstance(err.value, DecodeFailure)
    else:
        assert not any(r["decode_failed"] for r in rows)
        assert not set(map(int, r2["used"].split())) & gone
        if protocol in ("codedpaddedfl", "codedsecagg"):
            # exact decoding: the model is the one without the dropout (Prop. 3 / Sec. VI)
            assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in clean], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("strict", [False, True])
def test_shortfall_in_a_study_is_recorded_unless_strict(tmp_path, capsys, strict) -> None:
    # Bernoulli dropout 0.1 on 6 devices with drop_slowest = 1: allowed on average, but some rounds
    # lose two devices at this seed.
    text = study_text(top="strict = true" if strict else "", network="dropout = 0.1", epochs=12,
                      runs='[[runs]]\nprotocol = "conventional"\nparams = { drop_slowest = 1 }\n')
    path = write(tmp_path, text)
    out = tmp_path / "out"
    if strict:
        expect_cli_error(tmp_path, capsys, ["run", str(path), "--out", str(out), "--quiet"], "needs 5 results")
        assert not out.exists() and _debris(tmp_path) == []
        return
    assert run_cli(path, out) == 0
    import csv

    rows = list(csv.DictReader((out / "conventional" / "trace.csv").open()))
    skipped = [r for r in rows if r["decode_failed"] == "True"]
    assert skipped and all("needs 5 results" in r["skip_reason"] for r in skipped)
    assert len(rows) == 13


class AbsentInFirstSetupAttempt(Availability):
    """Devices ``gone`` absent in the first setup attempt only (the engine asks once per attempt)."""

    def __init__(self, gone: set[int]) -> None:
        self.gone, self.asked = gone, set()

    def available(self, node: int, round: int, draw) -> bool:
        if round != 0 or node not in self.gone:
            return True
        first = node not in self.asked
        self.asked.add(node)
        return not first


#: Each protocol's declared reaction to setup-phase dropouts (issue 14, item 4).
SETUP_REACTIONS = {"conventional": "none", "lightsecagg": "none", "approx_gc": "offline",
                   "codedpaddedfl": "reshare", "codedsecagg": "reshare", "cfl": "reshare"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_setup_phase_dropouts_follow_the_declared_reaction(protocol) -> None:
    """Devices 1, 2, 3 absent in the first setup attempt: protocols without a setup exchange record them
    (round 0's ``dropped``) and proceed; the others re-share once, charged a second full phase. Either way
    the model is that of the clean run."""
    task = make_task(D=D, n=20, d=6, c=3)

    def run(availability):
        sim = Simulation(lte_star(D, device_mac_rates=[1e6] * D, loss=0.0), 1, availability=availability)
        proto = registry.get(protocol)(sim, task, API_PARAMS[protocol])
        return proto.run(2, strict=True), proto

    rows, proto = run(AbsentInFirstSetupAttempt({1, 2, 3}))
    clean, _ = run(Absent({}))
    assert proto.setup_dropouts == SETUP_REACTIONS[protocol]
    assert proto.setup_absent[0] == [1, 2, 3]
    # CodedPaddedFL decodes to its fixed-point resolution 2^-f (f = 24), and the two runs draw different secret pads
    # (OS entropy): their losses agree to that resolution, not bit for bit (at most 1.2e-9 relative over 150 pairs
    # of runs; 1e-9 was exceeded in each of two batches of 150)
    rel = 2.0**-24 if protocol == "codedpaddedfl" else 1e-9
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in clean], rel=rel, abs=1e-12)
    if proto.setup_dropouts == "reshare":
        assert proto.setup_attempts == 2 and rows[0]["setup_attempts"] == 2 and rows[0]["dropped"] == ""
        assert rows[0]["bits_up"] == 2 * clean[0]["bits_up"]                 # the whole phase again
    else:
        assert proto.setup_attempts == 1 and rows[0]["dropped"] == "1 2 3"
        assert rows[0]["bits_up"] == clean[0]["bits_up"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_absent_in_every_setup_attempt(protocol) -> None:
    """Device 1 never present in round 0: a protocol that needs every device in its setup gives up after
    ``max_setup_attempts`` with a named SetupFailure; the others proceed (correct result)."""
    if SETUP_REACTIONS[protocol] == "reshare":
        with pytest.raises(SetupFailure, match=r"devices \[1\] were absent in each of 100 setup attempts") as err:
            _run_api(protocol, {0: {1}}, strict=True)
        assert isinstance(err.value, DecodeFailure)
    else:
        rows, _ = _run_api(protocol, {0: {1}}, strict=True)
        clean, _ = _run_api(protocol, {}, strict=True)
        assert rows[0]["dropped"] == "1"
        assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in clean], rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# 6. Counts
# ---------------------------------------------------------------------------------------------
#: Outcome of every test that is not driven by a table with an ``expected`` column: a single
#: outcome, or a list (one per parametrized case). ``test_case_counts`` checks the list is complete.
def _numeric_fields(cls) -> list[str]:
    """The int/float fields of a protocol's Config (bools excluded)."""
    out = []
    for name, field in cls.Config.model_fields.items():
        ann = str(field.annotation)
        if ("float" in ann or "int" in ann) and "bool" not in ann:
            out.append(name)
    return out


#: Every registered protocol (the six above and those added since: DReS-FL, FedVS and their
#: baselines), every numeric parameter, each non-finite value: refused by name when validated.
def _builtin_protocols() -> list[str]:
    """Names of the protocols fednet ships (``protocols/``), not those other tests register."""
    registry.load_builtin()
    return sorted(n for n in registry.names() if registry.get(n).__module__.startswith("fednet.protocols."))


NONFINITE_CASES = [(p, f, v) for p in _builtin_protocols() for f in _numeric_fields(registry.get(p))
                   for v in (float("nan"), float("inf"), float("-inf"))]


@pytest.mark.parametrize("protocol,field,value", NONFINITE_CASES,
                         ids=[f"{p}.{f}={v}" for p, f, v in NONFINITE_CASES])
def test_every_protocol_refuses_non_finite_params(protocol, field, value) -> None:
    cls = registry.get(protocol)
    with pytest.raises(ValidationError) as err:
        cls.Config.model_validate({field: value})
    assert any(e["loc"] and e["loc"][0] == field for e in err.value.errors()), err.value


OTHER_OUTCOMES: dict[str, str | list[str]] = {
    "test_bad_study_files": ["error"] * len(FILE_CASES),
    "test_bad_cli_seed": ["error"] * 2,
    "test_unknown_study_name": "error",
    "test_damaged_saved_results": ["error"] * len(SAVED_CASES),
    "test_data_dependent_misfit_is_a_named_error_before_any_output": "error",
    "test_engine_refuses_non_finite_and_out_of_range_values": ["error"] * len(ENGINE_CASES),
    "test_data_misfits_are_named_errors": ["error"] * len(DATA_MISFITS),
    "test_too_narrow_formats_are_refused_before_training": ["error"] * len(TOO_NARROW),
    "test_error_family": ["correct"] * 5,
    "test_every_protocol_refuses_non_finite_params": ["error"] * len(NONFINITE_CASES),
    "test_unexpected_exception_keeps_its_traceback": "correct",
    "test_every_protocol_runs_end_to_end_through_the_cli": "correct",
    "test_out_dot_refuses_and_keeps_the_current_folder": "error",
    "test_out_on_a_users_folder_refuses_and_leaves_it": "error",
    "test_out_on_a_file_refuses": "error",
    "test_out_on_a_symlink_refuses": "error",
    "test_out_under_a_file_is_a_named_error": "error",
    "test_out_where_nothing_can_be_written": "error",
    "test_rerun_replaces_only_fednets_own_folder": ["correct", "error"],
    "test_empty_and_nested_new_folders_are_used": "correct",
    "test_failed_run_removes_the_parent_folders_it_created": "error",
    "test_live_lock_refuses_at_once_naming_the_pid": "error",
    "test_stale_lock_file_is_taken_over": ["correct"] * 2,
    "test_stale_partial_is_cleaned_but_a_users_lookalike_is_not": ["correct"] * 2,
    "test_sigterm_in_each_output_phase_leaves_no_debris_and_keeps_the_previous_result": ["correct"] * len(PHASES),
    "test_sigkill_in_each_output_phase_then_rerun_cleans_up": ["correct"] * len(PHASES),
    "test_sigterm_during_the_final_renames_is_deferred_until_the_result_is_in_place": "correct",
    "test_previous_result_renamed_away_by_a_killed_run_is_restored": "correct",
    "test_real_cli_subprocess_sigterm_and_concurrent_run": ["error", "correct"],
    "test_sigint_and_sighup_clean_like_sigterm": ["correct"] * 2,
    "test_second_writer_in_the_same_process_is_refused": "error",
    "test_staged_output_outside_the_main_thread_still_cleans_on_error": "correct",
    "test_shortfall_in_a_study_is_recorded_unless_strict": ["recorded", "error"],
    "test_setup_phase_dropouts_follow_the_declared_reaction": ["correct"] * len(PROTOCOLS),
    "test_device_absent_in_every_setup_attempt": ["error" if r == "reshare" else "correct"
                                                  for r in (SETUP_REACTIONS[p] for p in PROTOCOLS)],
}


def _outcomes() -> dict[str, int]:
    """Cases per declared outcome: ``error`` (named error / CLI exit 2), ``recorded`` (failure in the
    trace), ``correct`` (correct result)."""
    n = {"error": 0, "recorded": 0, "correct": 0}
    for cases in (FIELD_CASES, PARAM_CASES, COMBO_CASES):
        for c in cases:
            n[c[2]] += 1
    for _, _, expected in DROP_CASES:
        n[expected] += 1
        if expected == "recorded":
            n["error"] += 1               # the same case under strict=True: StragglerShortfall
    for v in OTHER_OUTCOMES.values():
        for o in ([v] if isinstance(v, str) else v):
            n[o] += 1
    return n


OUTCOMES = _outcomes()


def test_case_counts() -> None:
    table_driven = {"test_field_bounds", "test_protocol_params", "test_combinations", "test_dropouts_in_the_round_phase",
                    "test_case_counts"}
    tests = {name for name in globals() if name.startswith("test_")}
    assert tests - table_driven == set(OTHER_OUTCOMES)      # every test declares its outcome
    assert sum(OUTCOMES.values()) >= 100
    covered = {p for p, *_ in PARAM_CASES} | {p for p, *_ in DROP_CASES}
    assert covered == set(PROTOCOLS)
    assert {p for p, *_ in NONFINITE_CASES} == set(_builtin_protocols())   # every built-in protocol
