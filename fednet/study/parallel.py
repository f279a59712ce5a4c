"""A study's runs x seeds as independent tasks on ``dask.distributed``; BLAS thread limits.

The (run, seed) pairs of a study share nothing but the prepared data, so :func:`simulate_parallel`
submits each as one task (:func:`run_task`: the validated study, the run's index, the seed) to a
``dask.distributed`` cluster: a :class:`~distributed.LocalCluster` of ``jobs`` single-threaded
worker processes, or an existing cluster at a scheduler address. Each worker process prepares the
features of a data draw once and keeps them (:func:`cached_task`, keyed by the data spec, the
device count, the training spec and the feature seed), so a worker that runs several seeds of the
same draw pays for the random-Fourier embedding once. The client gathers the traces into the same
dictionaries, in the same order, as the serial runner, so ``trace.csv`` and ``summary.json`` are
byte-identical to a serial run at the same seeds (``timing.json`` holds host seconds and differs).
Within a data draw the runs that compute their own trajectory are submitted first
(:func:`_submission_order`): the long tasks start early and the sweep ends on short ones. Runs of one seed that share
a learning trajectory (:meth:`fednet.protocol.base.Protocol.trajectory_group`: LightSecAgg with ``U = D`` at every
``z``) go to one worker as one task (:func:`run_tasks`, :func:`_task_units`), so that the first computes the models and
the others follow them, as in a serial run.

Threads: every worker runs one task at a time with one BLAS/OpenMP thread (:func:`limit_threads`,
through ``threadpoolctl``; a :class:`BlasLimits` worker plugin sets it at worker start-up, and
each task sets it again for libraries loaded since). On a loaded host the default OpenBLAS thread
count made runs 4-11x slower (issue 12); parallelism comes from running tasks side by side instead.
The serial runner uses the same limit, so both paths do their floating-point reductions in the
same order. A study of fewer tasks than ``jobs`` starts only as many workers as tasks and lends
each task the spare cores as threads for its sliced kernels (:mod:`fednet.algebra.slices`: the
devices' like work, or a product's rows, cut so that every slice is computed as the whole would be).

Environment: the variables named in :data:`FORWARDED_ENV` (``FEDNET_SECRET_SEED``, read by the
simulation when it draws secret pads and masks) are captured in the client and set (or unset)
in the worker for the duration of each task, so a worker on another host behaves like the serial
run whatever its own environment holds. The secret then travels inside the task graph: use TLS
between client and scheduler if the network is not trusted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    from distributed import KilledWorker
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError as e:  # pragma: no cover - dask is a dependency
    raise ImportError("parallel runs (--jobs, --scheduler) need dask.distributed: "
                      "pip install 'dask[distributed]'") from e

from fednet.errors import ClusterError, ConfigError
from fednet.sim.engine.paths import EnginePaths
from fednet.sim.rng import SECRET_SEED_ENV
from fednet.algebra.slices import compute_threads

from .config import Study
from .threads import limit_threads, scoped_environment
from .usercode import check_workers

__all__ = ["FORWARDED_ENV", "SECRET_SEED_ENV", "scoped_environment", "BlasLimits", "limit_threads", "cached_task", "run_task", "run_tasks",
           "open_client",
           "simulate_parallel", "default_jobs", "check_jobs", "free_cores", "usable_cores"]

log = logging.getLogger(__name__)

#: Environment variables the client forwards into every task (value, or None for unset).
FORWARDED_ENV = (SECRET_SEED_ENV,)

#: Prepared tasks kept per worker process (a data draw of MNIST at 2000 features is ~0.5 GB).
CACHE_SIZE = 2

_TASKS: OrderedDict[str, Any] = OrderedDict()
_DATA: dict[tuple[str, str | None], Any] = {}


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; the core count where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def free_cores() -> tuple[int, int, float | None]:
    """``(free, usable, load)``: the usable cores less those the 1-minute load average says are busy (at least 1).

    ``load`` is None where the platform has no load average (then every usable core counts as free).
    """
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not on Unix
        return cores, cores, None
    return max(1, min(cores, cores - int(round(load)))), cores, load


def default_jobs() -> int:
    """The number of worker processes ``--jobs`` without a value starts: the usable cores that are free.

    A worker per core on a host where other processes hold some cores makes every run slower (measured 0.7x of a
    serial run with one core busy, issue 32): so the cores the load average shows busy are left out, with a warning
    that says so (``--jobs N`` sets the count; :func:`check_jobs` warns when it exceeds the free cores).
    """
    free, cores, load = free_cores()
    if free < cores:
        log.warning("--jobs: %d of %d cores are busy (load average %.2f): starting %d worker%s (--jobs N to choose)",
                    cores - free, cores, load, free, "" if free == 1 else "s")
    return free


def check_jobs(jobs: int) -> None:
    """Warn when ``jobs`` workers exceed the free cores (:func:`free_cores`): the runs then share cores and a
    parallel study can be slower than a serial one."""
    free, cores, load = free_cores()
    if jobs > free:
        log.warning("--jobs %d: only %d of %d cores are free (load average %.2f); the workers will share cores and "
                    "each run will be slower (a serial run may finish sooner)", jobs, free, cores, load or 0.0)


class BlasLimits(WorkerPlugin):
    """A ``dask.distributed`` worker plugin: fednet's host configuration and one BLAS/OpenMP pool size.

    Parameters
    ----------
    n : int
        Threads per pool in every worker process (>= 1).

    Raises
    ------
    ValueError
        If ``n`` is below 1.
    """

    name = "fednet-blas-limits"

    def __init__(self, n: int = 1) -> None:
        if int(n) < 1:
            raise ValueError(f"blas_threads must be >= 1, got {n!r}")
        self.n = int(n)
        self._limits: Any = None

    def setup(self, worker: Any) -> None:
        """Apply the host configuration, load numpy and scipy's BLAS, limit every loaded pool to ``n`` threads.

        :func:`fednet.runtime.configure_host` gives the worker the serial runner's settings: glibc's malloc
        thresholds (:data:`fednet.runtime.MALLOC_SETTINGS`, which also undo the ``MALLOC_TRIM_THRESHOLD_=65536``
        that Dask's nanny sets: with it every array above 128 KiB is a fresh ``mmap``, 2-3x the host time of a
        quickstart run), the garbage-collector policy of :meth:`fednet.protocol.base.Protocol.run`, and the
        portable-kernel variables where unset (workers a ``--jobs`` client starts inherit its environment, where
        they are set already). BLAS pools are process-wide; OpenMP's thread count is a per-thread setting, which
        :func:`run_task` sets again in the thread that runs the task.
        """
        from fednet.runtime import configure_host

        configure_host()
        import numpy  # noqa: F401
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits

        self._limits = threadpool_limits(limits=self.n)  # stays in effect for the worker's life

    def teardown(self, worker: Any) -> None:
        """Restore the pools' original sizes."""
        if self._limits is not None:
            self._limits.restore_original_limits()


def _features_key(study: Study, feature_seed: int, data_dir: str | os.PathLike | None) -> str:
    return json.dumps({"data": study.data.model_dump(mode="json"), "n_devices": study.network.n_devices,
                       "training": study.training.model_dump(mode="json"), "feature_seed": int(feature_seed),
                       "data_dir": None if data_dir is None else os.fspath(data_dir)}, sort_keys=True)


def cached_task(study: Study, feature_seed: int, data_dir: str | os.PathLike | None = None) -> tuple[Any, float]:
    """The study's prepared :class:`~fednet.learning.task.LearningTask` for a feature draw, cached per process.

    Parameters
    ----------
    study : Study
    feature_seed : int
        ``random_state`` of the random-Fourier draw.
    data_dir : path-like, optional
        Directory with the data sets (default ``$FEDNET_DATA`` of this process).

    Returns
    -------
    task : LearningTask
    seconds : float
        Host seconds spent loading and preparing (0.0 when it came from the cache).

    Raises
    ------
    fednet.learning.datasets.DatasetError
        For a missing or corrupted data file.
    """
    from .runner import load_source, prepare_task

    key = _features_key(study, feature_seed, data_dir)
    if key in _TASKS:
        _TASKS.move_to_end(key)
        return _TASKS[key], 0.0
    t0 = time.perf_counter()
    dkey = (study.data.dataset, study.data.split, None if data_dir is None else os.fspath(data_dir))
    if dkey not in _DATA:
        _DATA.clear()
        _DATA[dkey] = load_source(study, data_dir)
    task = prepare_task(study, data_dir, feature_seed=feature_seed, data=_DATA[dkey])
    _TASKS[key] = task
    while len(_TASKS) > CACHE_SIZE:
        _TASKS.popitem(last=False)
    return task, time.perf_counter() - t0


def _round_reporter(topic: str | None, tag: str) -> Any:
    """An ``on_round`` callback that logs the rounds done to ``topic`` (at most every 0.5 s), or None."""
    if topic is None:
        return None
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not inside a Dask worker
        return None
    state = {"rounds": 0, "last": 0.0, "t0": time.perf_counter(), "setup": None}

    def _on_round(row: dict[str, Any]) -> None:
        state["rounds"] += 1
        now = time.monotonic()
        elapsed = time.perf_counter() - state["t0"]       # host seconds since the pair's protocol was built
        if state["setup"] is None:
            state["setup"] = elapsed
        if now - state["last"] >= 0.5:
            state["last"] = now
            worker.log_event(topic, {"task": tag, "rounds": state["rounds"], "elapsed": elapsed,
                                     "setup": state["setup"]})

    return _on_round


def run_task(study: Study, run_index: int, seed: int, data_dir: str | os.PathLike | None = None,
             blas_threads: int | None = 1, env: Mapping[str, str | None] | None = None,
             progress_topic: str | None = None, threads: int = 1) -> dict[str, Any]:
    """One (run, seed) of a study, as a worker runs it.

    Parameters
    ----------
    study : Study
        The validated study.
    run_index : int
        Index into ``study.runs``.
    seed : int
        One of ``study.seeds``.
    data_dir : path-like, optional
        Directory with the data sets (default the worker's ``$FEDNET_DATA``).
    blas_threads : int or None
        Thread-pool size during the run (:func:`limit_threads`).
    env : mapping, optional
        Environment variables to set (None: unset) while the task runs (:data:`FORWARDED_ENV`).
    progress_topic : str, optional
        Dask event topic to which the rounds done so far are logged (``{"task": "RUN_INDEX:SEED",
        "rounds": n}``, at most every 0.5 s) when running inside a worker.
    threads : int
        Threads lent to the run's sliced kernels (:func:`fednet.algebra.slices.compute_threads`;
        the same trace for any count).

    Returns
    -------
    dict
        ``rows`` (the trace, one dict per round), ``wall_s`` (host seconds of the simulation),
        ``data_s`` (host seconds spent preparing the features; 0.0 if cached), ``feature_seed``.
    """
    from fednet.protocol import registry

    from .runner import ENGINE_PATHS, _run_one

    run = study.runs[run_index]
    fs = study.data.feature_seed_for(seed)
    registry.get(run.protocol)  # import the protocol (and its libraries) before the thread limit
    with scoped_environment(env), limit_threads(blas_threads), compute_threads(threads):
        task, data_s = cached_task(study, fs, data_dir)
        t0 = time.perf_counter()
        ENGINE_PATHS.pop(run.name, None)
        rows = _run_one(study, run, seed, task, _round_reporter(progress_topic, f"{run_index}:{seed}"))
        wall = time.perf_counter() - t0
    return {"rows": rows, "wall_s": wall, "data_s": data_s, "feature_seed": fs,
            "engine": ENGINE_PATHS.pop(run.name).as_dict()}


def run_tasks(study: Study, run_indices: Sequence[int], seed: int, *args: Any) -> list[dict[str, Any]]:
    """:func:`run_task` of several runs of one seed, one after the other in this worker (runs sharing a trajectory).

    Parameters
    ----------
    study : Study
    run_indices : sequence of int
        Indices into ``study.runs``, run in this order.
    seed : int
    *args
        The remaining arguments of :func:`run_task`.

    Returns
    -------
    list of dict
        One record per run, as :func:`run_task` returns them.
    """
    return [run_task(study, i, seed, *args) for i in run_indices]


#: Seconds :func:`open_client` waits for a ``--scheduler`` to answer before a named error.
SCHEDULER_TIMEOUT_S = 10.0

#: Seconds a running study waits while its Dask cluster has no worker (one lost without a nanny, or a scheduler whose
#: workers all left) before it ends with :class:`~fednet.errors.ClusterError`; checked every
#: :data:`WORKER_CHECK_S` seconds.
WORKERLESS_TIMEOUT_S = 60.0
WORKER_CHECK_S = 2.0


def open_client(jobs: int | None = None, scheduler: str | None = None, *, blas_threads: int = 1) -> Any:
    """A ``distributed.Client`` on a new local cluster of ``jobs`` processes or on ``scheduler``.

    Parameters
    ----------
    jobs : int, optional
        Worker processes of a new :class:`~distributed.LocalCluster` (one thread each); default
        :func:`default_jobs`. Ignored with ``scheduler``.
    scheduler : str, optional
        Address of a running scheduler (``tcp://host:8786``).
    blas_threads : int
        Thread-pool size of every worker (:class:`BlasLimits`).

    Returns
    -------
    distributed.Client
        Closing it also closes a cluster it started.

    Raises
    ------
    ValueError
        If ``jobs`` is below 1.
    """
    from distributed import Client

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=SCHEDULER_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(f"--scheduler {scheduler!r}: no Dask scheduler answered within {SCHEDULER_TIMEOUT_S:g} s "
                              f"({type(e).__name__}: {e}); start one (dask scheduler) or check the address") from None
    else:
        n = default_jobs() if jobs is None else int(jobs)
        if n < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs!r}")
        if jobs is not None:
            check_jobs(n)
        import dask

        # worker processes as fast as the serial run: no MALLOC_TRIM_THRESHOLD_ (BlasLimits.setup
        # applies fednet.runtime.MALLOC_SETTINGS anyway), no statistical profiler sampling the simulation's deep stacks every
        # 10 ms; the client owns this cluster: closing the client closes it
        environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
                   if k != "MALLOC_TRIM_THRESHOLD_"}
        if not logging.getLogger("fednet").isEnabledFor(logging.INFO):   # without -v: no Dask start-up chatter
            logging.getLogger("distributed").setLevel(logging.WARNING)
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ,
                              "distributed.worker.profile.enabled": False}):
            client = Client(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                            silence_logs=logging.ERROR)
    client.register_plugin(BlasLimits(blas_threads))
    return client


def _submission_order(study: Study, order: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (run, seed) pairs in the order they are submitted (Dask starts equal-priority tasks first in, first out).

    Within each data draw (the serial order's blocks: a worker then holds few draws' features at once), the runs
    that compute their own learning trajectory come before those whose timing mode replays the task's cached
    full-batch one (:attr:`fednet.protocol.base.Protocol.exact_trajectory`: seconds a run, where the others take
    minutes), so that a sweep does not end on one long run while the other workers idle (fig7_mnist's
    LightSecAgg runs are last in its file). Otherwise the serial order; the outputs keep the serial order whatever
    the submission order.
    """
    from fednet.protocol import registry

    def replays(run: Any) -> bool:
        """Whether ``run`` (a RunSpec) is in timing mode of a protocol that replays the cached trajectory."""
        try:
            cls = registry.get(run.protocol)
        except Exception:                          # an unknown protocol fails in its task, with its own message
            return False
        return bool(getattr(cls, "exact_trajectory", False)) and run.params.get("mode") == "timing"

    cheap = [replays(run) for run in study.runs]
    draw = {seed: study.data.feature_seed_for(seed) for seed in study.seeds}
    block: dict[int, int] = {}
    for _, seed in order:
        block.setdefault(draw[seed], len(block))
    return sorted(order, key=lambda pair: (block[draw[pair[1]]], cheap[pair[0]]))


def _shared_key(study: Study, run_index: int, seed: int) -> tuple | None:
    """What the (run, seed) pair shares its learning trajectory under, or None: its protocol class and
    :meth:`~fednet.protocol.base.Protocol.trajectory_group`, the seed and its data draw, where no device drops out.

    A scheduling hint only: the run decides at run time whether it shares (``Protocol._shared_trajectory``)."""
    from fednet.protocol import registry

    run = study.runs[run_index]
    try:
        cls = registry.get(run.protocol)
        net = study.run_network(run)
        group = cls.trajectory_group(cls.Config.model_validate(study.run_params(run)), net.n_devices)
    except Exception:                              # an invalid run fails in its task, with its own message
        return None
    if group is None or net.dropout > 0 or net.availability != "bernoulli":
        return None
    return (cls.__module__, cls.__qualname__, group, seed, study.data.feature_seed_for(seed))


def _task_units(study: Study, order: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The (run, seed) pairs of ``order`` cut into Dask tasks: one per pair, except that the pairs sharing a learning
    trajectory (:func:`_shared_key`) are one task, in their order in ``order``, at the first one's place."""
    units: list[list[tuple[int, int]]] = []
    shared: dict[tuple, list[tuple[int, int]]] = {}
    for pair in order:
        key = _shared_key(study, *pair)
        if key is not None and key in shared:
            shared[key].append(pair)
            continue
        units.append([pair])
        if key is not None:
            shared[key] = units[-1]
    return units


def simulate_parallel(study: Study, *, jobs: int | None = None, scheduler: str | None = None, client: Any = None,
                      data_dir: str | os.PathLike | None = None, progress: bool = True,
                      blas_threads: int | None = 1, finished: Mapping[tuple[int, int], dict[str, Any]] | None = None,
                      on_done: Callable[[int, int, dict[str, Any]], None] | None = None,
                      threads: int | None = None) -> tuple[dict[str, dict[int, list[dict[str, Any]]]],
                                                             dict[str, dict[int, float]], dict[str, float],
                                                             dict[str, Any]]:
    """Run every (run, seed) of ``study`` as a Dask task and gather the traces in serial order.

    Parameters
    ----------
    study : Study
    jobs, scheduler : optional
        Where to run (:func:`open_client`); ignored when ``client`` is given.
    client : distributed.Client, optional
        An open client to use (left open).
    data_dir : path-like, optional
        Directory with the data sets, as the workers see it (default their ``$FEDNET_DATA``).
    progress : bool
        One progress display over all tasks, weighted by measured host cost (:mod:`fednet.study.progress`;
        the workers report each task's rows and host seconds while it runs, exact as each task completes).
    blas_threads : int or None
        Thread-pool size in every worker.
    finished : {(run index, seed): record}, optional
        Pairs taken as they are, not submitted (records as :func:`run_task` returns them; from a
        checkpoint, :mod:`fednet.study.checkpoint`).
    on_done : callable, optional
        Called in the client as ``on_done(run index, seed, record)`` for each task as it completes.
    threads : int, optional
        Threads each task lends its sliced kernels (:func:`fednet.algebra.slices.compute_threads`).
        Default: on a new local cluster with fewer tasks than ``jobs``, the spare cores
        (``jobs // tasks``, and only ``tasks`` worker processes start); otherwise 1.

    Returns
    -------
    traces : {label: {seed: rows}}
        In the serial runner's order (feature draw, then run, then seed).
    wall : {label: {seed: host seconds}}
    data_s : {feature seed: host seconds}
        The longest preparation of each feature draw on any worker.
    info : dict
        ``workers`` (how many), ``scheduler`` (address) and ``threads``, for ``timing.json``; on a new local cluster
        also ``jobs`` (asked for, or :func:`default_jobs`) and the host as the study started: ``free_cores``,
        ``usable_cores`` and ``load_1min`` (:func:`free_cores`).

    Raises
    ------
    fednet.errors.ConfigError
        When a worker cannot import a protocol or network builder the study names (checked before any task is
        submitted: the study's own modules are shipped to the workers first, :mod:`fednet.study.usercode`).
    Exception
        The first task's error (e.g. :class:`~fednet.learning.datasets.DatasetError`), re-raised
        in the client after the other tasks are cancelled.
    """
    from distributed import as_completed

    from .progress import study_progress

    groups: dict[int, list[int]] = {}
    for seed in study.seeds:
        groups.setdefault(study.data.feature_seed_for(seed), []).append(seed)
    order = [(i, seed) for seeds in groups.values() for i in range(len(study.runs)) for seed in seeds]
    finished = dict(finished or {})
    pending = max(1, sum(pair not in finished for pair in order))
    own = client is None
    local = own and scheduler is None
    host: dict[str, Any] = {}
    if local:
        jobs = default_jobs() if jobs is None else int(jobs)
        free, cores, load = free_cores()          # recorded in timing.json: the jobs chosen against the free cores
        host = {"jobs": jobs, "free_cores": free, "usable_cores": cores, "load_1min": load}
        if threads is None:
            threads = max(1, jobs // pending)     # fewer tasks than cores: the spare ones go inside the runs
        jobs = min(jobs, pending)
    threads = 1 if threads is None else int(threads)
    if own:
        client = open_client(jobs, scheduler, blas_threads=1 if blas_threads is None else blas_threads)
    try:
        check_workers(client, study)       # the study's own modules travel to the workers; all import them, or stop
        env = {k: os.environ.get(k) for k in FORWARDED_ENV}
        # progress weighted by measured host cost (fednet.study.progress): workers log the rows done per task, its
        # host seconds and its set-up time to a topic; a finished task reports its rows and host seconds
        n_workers = len(client.scheduler_info().get("workers", {})) or 1
        bar = study_progress(study, enabled=progress, workers=n_workers)
        for (i, seed), rec in finished.items():
            bar.finish((i, seed), len(rec["rows"]), rec["wall_s"], resumed=True)
        running: dict[str, int] = {}
        topic = f"fednet-progress-{os.urandom(6).hex()}"

        def _on_event(event: tuple[float, dict[str, Any]]) -> None:
            msg = event[1]
            if msg["task"] in running:
                i, seed = (int(x) for x in msg["task"].split(":"))
                bar.update((i, seed), int(msg["rounds"]), msg.get("elapsed"), msg.get("setup"))

        futures = {}
        for unit in _task_units(study, [pair for pair in _submission_order(study, order) if pair not in finished]):
            i, seed = unit[0]
            args = (data_dir, blas_threads, env, topic if progress else None, threads)
            running.update((f"{j}:{s}", 0) for j, s in unit)
            key = f"fednet-{study.runs[i].name}-seed{seed}-{os.urandom(4).hex()}"
            if len(unit) == 1:
                fut = client.submit(run_task, study, i, seed, *args, pure=False, key=key)
            else:
                fut = client.submit(run_tasks, study, [j for j, _ in unit], seed, *args, pure=False,
                                    key=f"{key}-and-{len(unit) - 1}")
            futures[fut] = unit
        if progress:
            client.subscribe_topic(topic, _on_event)
        results: dict[tuple[int, int], dict[str, Any]] = dict(finished)
        from .runner import ENGINE_PATHS                   # (runner imports this module)
        stop, lost = threading.Event(), []

        def watchdog() -> None:
            """Cancel the study's tasks once the cluster has had no worker for WORKERLESS_TIMEOUT_S seconds."""
            since = None
            while not stop.wait(WORKER_CHECK_S):
                try:
                    n = len(client.scheduler_info().get("workers", {}))
                except Exception:  # noqa: BLE001 - the scheduler itself is gone: the futures fail on their own
                    return
                if n:
                    since = None
                    continue
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= WORKERLESS_TIMEOUT_S:
                    lost.append(WORKERLESS_TIMEOUT_S)
                    client.cancel(list(futures))
                    return

        guard = threading.Thread(target=watchdog, name="fednet-workers", daemon=True)
        guard.start()
        with bar:
            try:
                for fut in as_completed(list(futures)):
                    if lost:
                        raise ClusterError(f"the Dask cluster ({client.scheduler.address}) has had no worker for "
                                           f"{lost[0]:g} s (a worker lost without a nanny?): the study stopped; "
                                           f"finished pairs are kept for --resume")
                    unit = futures[fut]
                    try:
                        records = fut.result()
                    except KilledWorker as e:            # every worker that ran it died (memory, a crash, an exit)
                        i, seed = unit[0]
                        raise ClusterError(
                            f"the Dask task of run {study.runs[i].name!r}, seed {seed} ended the process of every "
                            f"worker that ran it (a worker lost: out of memory, a crash or an exit in the "
                            f"simulation; {e.args[0] if e.args else ''}); the study stopped; finished pairs are "
                            f"kept for --resume") from None
                    for (i, seed), res in zip(unit, records if len(unit) > 1 else [records]):
                        results[(i, seed)] = res
                        if "engine" in res:                # the worker's engine paths, for timing.json
                            ENGINE_PATHS.setdefault(study.runs[i].name, EnginePaths()).merge(res["engine"])
                        if on_done is not None:
                            on_done(i, seed, res)
                        running.pop(f"{i}:{seed}", None)
                        bar.set_status(f"{study.runs[i].name} seed {seed} done")
                        bar.finish((i, seed), len(res["rows"]), res["wall_s"])
                        rows = res["rows"]
                        log.info("%s: %s seed %d: %d rounds, %.1f simulated s, %.1f host s", study.name,
                                 study.runs[i].name, seed, len(rows) - 1, rows[-1]["time_s"], res["wall_s"])
            except BaseException:
                client.cancel(list(futures))
                raise
            finally:
                stop.set()
                if progress:
                    client.unsubscribe_topic(topic)
        traces: dict[str, dict[int, list[dict[str, Any]]]] = {run.name: {} for run in study.runs}
        wall: dict[str, dict[int, float]] = {run.name: {} for run in study.runs}
        data_s: dict[str, float] = {}
        for i, seed in order:
            res = results[(i, seed)]
            name = study.runs[i].name
            traces[name][seed] = res["rows"]
            wall[name][seed] = res["wall_s"]
            k = str(res["feature_seed"])
            data_s[k] = max(data_s.get(k, 0.0), res["data_s"])
        info = {"workers": len(client.scheduler_info().get("workers", {})), "scheduler": client.scheduler.address,
                "threads": threads, **host}
        return traces, wall, data_s, info
    finally:
        if own:
            client.close()

