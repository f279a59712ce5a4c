"""Sweeps on Dask: ``fednet run --jobs 2`` writes the serial run's outputs byte for byte;
workers run with one BLAS thread (threadpoolctl); task errors and environment reach the client."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fednet.cli import main
from fednet.study.config import load_study
from fednet.study.threads import limit_threads

distributed = pytest.importorskip("distributed")

from fednet.study.parallel import cached_task, scoped_environment  # noqa: E402

SMALL = """
name = "small"
seeds = [0, 1]
targets = [0.5, 0.99]
baseline = "Conventional FL"
epochs = 4
[data]
dataset = "digits"
n_components = 200
feature_seed = "{fs}"
[network]
n_devices = 6
compute = "shifted_exponential"
[[runs]]
label = "Conventional FL"
protocol = "conventional"
params = {{ minibatch_fraction = 0.5 }}
[[runs]]
label = "Conventional FL, drop 1"
protocol = "conventional"
params = {{ minibatch_fraction = 0.5, drop_slowest = 1 }}
"""


def _blas_threads(apis: tuple[str, ...] = ("blas", "openmp")) -> list[int]:
    from threadpoolctl import threadpool_info

    return [d["num_threads"] for d in threadpool_info() if d["user_api"] in apis]


def test_jobs_2_outputs_are_byte_identical_to_serial(tmp_path: Path, monkeypatch, caplog) -> None:
    """... and on a host whose load average shows one of two cores busy, ``--jobs 2`` says so in one line and
    timing.json records the jobs chosen against the free cores (issue 32, item 4)."""
    import logging

    import fednet.study.parallel as parallel

    study = tmp_path / "small.toml"
    study.write_text(SMALL.format(fs="per_seed"))
    serial, par = tmp_path / "serial", tmp_path / "par"
    assert main(["run", str(study), "--out", str(serial), "--quiet"]) == 0
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    with caplog.at_level(logging.WARNING, logger="fednet.study.parallel"):
        assert main(["run", str(study), "--out", str(par), "--quiet", "--jobs", "2"]) == 0
    assert caplog.text.count("--jobs 2: only 1 of 2 cores are free (load average 1.20)") == 1
    names = ["summary.json", "Conventional_FL/trace.csv", "Conventional_FL_drop_1/trace.csv"]
    for name in names:
        a, b = (serial / name).read_bytes(), (par / name).read_bytes()
        assert a == b, name
    rows = (serial / "Conventional_FL/trace.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 5  # header, 2 seeds x (round 0 + 4 epochs)
    timing = json.loads((par / "timing.json").read_text())
    assert timing["parallel"]["workers"] == 2
    assert {k: timing["parallel"][k] for k in ("jobs", "free_cores", "usable_cores", "load_1min")} == {
        "jobs": 2, "free_cores": 1, "usable_cores": 2, "load_1min": 1.2}
    assert set(timing["runs"]["Conventional FL"]) == {"0", "1"}
    assert "parallel" not in json.loads((serial / "timing.json").read_text())


def test_fewer_tasks_than_jobs_lend_the_spare_cores_as_threads(tmp_path: Path) -> None:
    """Two (run, seed) pairs with --jobs 4: two workers, two threads inside each run; one pair with --jobs 3: no
    cluster, three threads; serial --threads 2 too: the outputs are the serial one-thread run's, byte for byte."""
    study = tmp_path / "small.toml"
    study.write_text(SMALL.format(fs="per_seed"))
    two = ["run", str(study), "--quiet", "--runs", "Conventional FL"]
    outs = {k: tmp_path / k for k in ("serial", "threads", "jobs")}
    assert main([*two, "--out", str(outs["serial"])]) == 0
    assert main([*two, "--out", str(outs["threads"]), "--threads", "2"]) == 0
    assert main([*two, "--out", str(outs["jobs"]), "--jobs", "4"]) == 0
    for name in ("summary.json", "Conventional_FL/trace.csv"):
        assert len({(out / name).read_bytes() for out in outs.values()}) == 1, name
    timing = json.loads((outs["jobs"] / "timing.json").read_text())
    assert timing["parallel"]["workers"] == 2 and timing["parallel"]["threads"] == 2
    one = tmp_path / "one"
    assert main([*two, "--seed", "1", "--out", str(one), "--jobs", "3"]) == 0
    assert "parallel" not in json.loads((one / "timing.json").read_text())      # one task: run here, no cluster
    seed1 = [r for r in (outs["serial"] / "Conventional_FL/trace.csv").read_text().splitlines()[1:]
             if r.split(",")[1] == "1"]                                    # protocol, seed, round, ...
    assert seed1 and (one / "Conventional_FL/trace.csv").read_text().splitlines()[1:] == seed1


def test_fixed_feature_draw_gathers_the_serial_traces_in_order(client, tmp_path: Path) -> None:
    from fednet.study.parallel import simulate_parallel
    from fednet.study.runner import run_study

    study_path = tmp_path / "s.toml"
    study_path.write_text(SMALL.format(fs=3).replace('"3"', "3").replace("seeds = [0, 1]", "seeds = [5, 2, 9]"))
    study = load_study(study_path)
    serial = run_study(study, None, progress=False)
    traces, wall, data_s, info = simulate_parallel(study, client=client, progress=True)  # rounds via events
    assert json.dumps(traces) == json.dumps(serial.traces)  # same rows, same dict order
    assert list(traces["Conventional FL"]) == [5, 2, 9]
    assert set(data_s) == {"3"} and data_s["3"] > 0 and info["workers"] == 2
    assert all(w > 0 for by in wall.values() for w in by.values())


def test_worker_thread_pools_follow_the_blas_limit(client) -> None:
    from fednet.study.parallel import BlasLimits

    for fut in [client.submit(_blas_threads, pure=False, workers=[w]) for w in client.scheduler_info()["workers"]]:
        threads = fut.result()
        assert threads and set(threads) == {1}
    # replacing the plugin changes the (process-wide) BLAS pools of every worker; OpenMP's setting
    # is per thread, which is why run_task also limits the pools in the task's own thread
    client.register_plugin(BlasLimits(2))
    try:
        threads = client.submit(_blas_threads, ("blas",), pure=False).result()
        assert set(threads) == {2}
    finally:
        client.register_plugin(BlasLimits(1))
    assert set(client.submit(_blas_threads, pure=False).result()) == {1}


def test_task_error_reaches_the_client(client, tmp_path: Path) -> None:
    from fednet.learning.datasets import DatasetError
    from fednet.study.parallel import simulate_parallel

    study_path = tmp_path / "s.toml"
    study_path.write_text(SMALL.format(fs=0).replace('"0"', "0").replace('"digits"', '"mnist"'))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="mnist"):
        simulate_parallel(load_study(study_path), client=client, data_dir=empty, progress=False)


def test_environment_is_set_and_restored(monkeypatch) -> None:
    monkeypatch.setenv("FEDNET_SECRET_SEED", "7")
    with scoped_environment({"FEDNET_SECRET_SEED": None}):
        assert "FEDNET_SECRET_SEED" not in os.environ
    assert os.environ["FEDNET_SECRET_SEED"] == "7"
    with scoped_environment({"FEDNET_SECRET_SEED": "11"}):
        assert os.environ["FEDNET_SECRET_SEED"] == "11"
    assert os.environ["FEDNET_SECRET_SEED"] == "7"


def test_limit_threads_in_process() -> None:
    with limit_threads(1):
        assert set(_blas_threads()) == {1}
    with pytest.raises(ValueError, match="blas_threads must be >= 1 or None, got 0"):
        with limit_threads(0):
            pass


def test_prepared_features_are_cached_per_feature_draw(tmp_path: Path) -> None:
    study_path = tmp_path / "s.toml"
    study_path.write_text(SMALL.format(fs="per_seed"))
    study = load_study(study_path)
    t0, s0 = cached_task(study, 0)
    t0b, s0b = cached_task(study, 0)
    t1, _ = cached_task(study, 1)
    assert t0b is t0 and s0 > 0 and s0b == 0.0
    assert t1 is not t0 and not (t1.X[0] == t0.X[0]).all()


def test_malloc_trim_from_the_nanny_is_undone() -> None:
    """Under the nanny's ``MALLOC_TRIM_THRESHOLD_`` the worker plugin's set-up still applies glibc's thresholds
    (:func:`fednet.configure_host`; a fresh interpreter, as a worker is)."""
    import platform
    import subprocess
    import sys

    code = ("from fednet.study.parallel import BlasLimits; import fednet.runtime as r; BlasLimits(1).setup(None); "
            "print(r.host_config().malloc, r.host_config().gc_policy)")
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("FEDNET_DEFAULT_MALLOC", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert out.stdout.split() == [str(glibc), "True"]


def test_workers_have_the_host_configuration(client) -> None:
    """Every worker ran :func:`fednet.configure_host` (the plugin): malloc thresholds and Protocol.run's GC policy."""
    def config() -> tuple[bool, bool]:
        import fednet.runtime

        return fednet.runtime.host_config().malloc, fednet.runtime.host_config().gc_policy

    import platform
    import sys

    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert client.run(config) and set(client.run(config).values()) == {(glibc, True)}


def test_local_cluster_workers_run_without_malloc_trim(client) -> None:
    def environ() -> tuple[str | None, bool]:
        import dask

        return os.environ.get("MALLOC_TRIM_THRESHOLD_"), dask.config.get("distributed.worker.profile.enabled")

    assert client.submit(environ, pure=False).result() == (None, False)


def test_scheduler_address_runs_on_an_existing_cluster(client, tmp_path: Path) -> None:
    from fednet.study.results import dumps_strict
    from fednet.study.runner import run_study

    study_path = tmp_path / "s.toml"
    study_path.write_text(SMALL.format(fs="per_seed").replace("epochs = 4", "epochs = 2"))
    study = load_study(study_path)
    serial = run_study(study, None, progress=False)
    remote = run_study(study, tmp_path / "out", progress=False, plot=False, scheduler=client.scheduler.address)
    assert dumps_strict(remote.summary) == dumps_strict(serial.summary)
    assert (tmp_path / "out" / "summary.json").read_text() == dumps_strict(serial.summary)
    assert remote.timing["parallel"]["scheduler"] == client.scheduler.address
    assert len(client.scheduler_info()["workers"]) == 2  # the cluster outlives the run


@pytest.mark.parametrize("feature_seed", ["per_seed", "fixed"])
def test_submission_order_starts_the_long_runs_first(feature_seed: str) -> None:
    """Within a data draw, runs that compute their own trajectory are submitted before those that replay the cached
    full-batch one; otherwise the serial order, and every pair exactly once."""
    from fednet.study.parallel import _submission_order
    sets = ['data.dataset="digits"', "data.n_components=40", "seeds=[0,1,2]"]
    if feature_seed == "fixed":
        sets.append("data.feature_seed=0")
    study = load_study("studies/fig7_mnist.toml", sets=sets, only_runs=[
        "CodedSecAgg z=1 N=2 relay_asap fednet", "CodedPaddedFL N=8 alpha=12 relay_asap paper",
        "LightSecAgg z=1 U=96", "LightSecAgg z=12 U=120"], max_epochs=3)
    order = [(i, s) for s in study.seeds for i in range(4)] if feature_seed == "per_seed" else \
        [(i, s) for i in range(4) for s in study.seeds]
    got = _submission_order(study, order)
    assert sorted(got) == sorted(order)
    if feature_seed == "per_seed":                       # one block per seed: LightSecAgg (runs 2, 3) first in each
        assert got == [(i, s) for s in study.seeds for i in (2, 3, 0, 1)]
    else:                                                # one block: every LightSecAgg pair first
        assert got == [(i, s) for i in (2, 3, 0, 1) for s in study.seeds]


def test_runs_sharing_a_trajectory_are_one_task() -> None:
    """LightSecAgg's U = D runs of one seed (every z) go to one worker as one task, in serial order, so that the
    first computes the models the others follow; every other pair is a task of its own."""
    from fednet.study.parallel import _task_units
    study = load_study("studies/fig7_mnist.toml", sets=['data.dataset="digits"', "data.n_components=40",
                                                        "seeds=[0,1]"], only_runs=[
        "LightSecAgg z=1 U=120", "LightSecAgg z=1 U=96", "CodedSecAgg z=1 N=2 relay_asap fednet",
        "LightSecAgg z=12 U=120", "LightSecAgg z=30 U=120"], max_epochs=3)
    names = [r.name for r in study.runs]
    full = [names.index(n) for n in ("LightSecAgg z=1 U=120", "LightSecAgg z=12 U=120", "LightSecAgg z=30 U=120")]
    order = [(i, s) for s in study.seeds for i in range(len(names))]
    units = _task_units(study, order)
    assert sorted(p for u in units for p in u) == sorted(order)
    for s in study.seeds:
        assert [(i, s) for i in full] in units
    assert all(len(u) == 1 for u in units if u[0][0] not in full)
    absent = load_study("studies/fig7_mnist.toml", sets=['data.dataset="digits"', "data.n_components=40",
                                                         "seeds=[0]", 'network.availability="dresfl_extreme"'],
                        only_runs=["LightSecAgg z=1 U=120", "LightSecAgg z=12 U=120"], max_epochs=3)
    assert _task_units(absent, [(0, 0), (1, 0)]) == [[(0, 0)], [(1, 0)]]     # devices may be absent: no sharing


def test_default_jobs_leaves_busy_cores_out_and_says_so(monkeypatch, caplog) -> None:
    """issue 32: a worker per core on a busy host is slower than serial; the busy cores are left out, loudly."""
    import logging

    import fednet.study.parallel as parallel

    monkeypatch.setattr(parallel, "usable_cores", lambda: 4)
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (1.4, 1.0, 1.0))
    with caplog.at_level(logging.WARNING, logger="fednet.study.parallel"):
        assert parallel.default_jobs() == 3
    assert "1 of 4 cores are busy (load average 1.40): starting 3 workers" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fednet.study.parallel"):
        parallel.check_jobs(4)
    assert "--jobs 4: only 3 of 4 cores are free" in caplog.text
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert parallel.free_cores()[0] == 1                          # never below one worker
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fednet.study.parallel"):
        assert parallel.default_jobs() == 4 and parallel.check_jobs(4) is None
    assert caplog.text == ""
