"""Running a study: data pipeline, networks, protocols, traces, summary, plot.

Output of :func:`run_study` (written to a temporary sibling directory and renamed into place
at the end, so a failed or interrupted study leaves no partial result directory; see
:mod:`fednet.study.output` for the marker, the lock and the clean-up of killed runs)::

    OUT/summary.json            time to each target per run and seed, across seeds, speed-ups
                                (strict JSON, reproducible numbers only: byte-identical at a seed)
    OUT/timing.json             host wall-clock seconds per run and seed, data loading (not reproducible)
    OUT/provenance.json         fednet version, git commit, every dependency's version (numpy, torch, dask,
                                pandas, matplotlib, ...), Python, platform, command line, UTC time, the
                                study's own modules (path, SHA-256) and data files (SHA-256)
    OUT/accuracy_vs_time.png    accuracy against simulated time, every run and seed
    OUT/study.json              the validated study, as run
    OUT/secret_seed.json        the study's secret seed (:func:`study_secret_seed`; mode 0600, private): it
                                replays the runs ``summary.json`` marks ``secret_dependent``
    OUT/<run label>/trace.csv   one row per (seed, round)
    OUT/.fednet-output          marker: the files fednet wrote (only such folders are replaced)
    .OUT.fednet-checkpoint/     beside OUT while the study runs: each finished (run, seed), kept after an
                                interruption for ``--resume`` (:mod:`fednet.study.checkpoint`)

``run_study(study, None)`` writes nothing and returns the results in memory (notebooks);
:meth:`StudyResult.frames` gives them as pandas DataFrames, like
:func:`fednet.study.results.load_results` does for a written directory.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from fednet.errors import CapacityError, ConfigError, FednetError, OutputError
from fednet.runtime import configure_host
from fednet.learning.datasets import load_dataset, preprocess
from fednet.learning.features import rbf_features
from fednet.learning.models import one_hot
from fednet.learning.partitions import partition
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.availability_trace import read_availability_trace
from fednet.sim.dropout import ExtremeDropout
from fednet.sim.rng import SECRET_SEED_ENV, Streams, secret_seed_from_env
from fednet.sim.engine.paths import EnginePaths
from fednet.sim.simulation import Simulation
from fednet.topologies import TOPOLOGIES, builder
from fednet.topologies.distributions import per_device
from fednet.topologies.groups import assign_groups, make_groups
from fednet.topologies.lte import assign_cells, lte_star

from .checkpoint import Checkpoint, Record
from .config import MAX_SEED, DataSpec, NetworkSpec, RunSpec, Study, slug
from .output import StagedOutput
from .progress import study_progress
from .threads import scoped_environment
from .usercode import study_imports, user_code_error, user_modules
from .results import Results, dumps_strict, format_per_seed, format_summary, rounds_frame, summarize, targets_frame

__all__ = ["prepare_task", "vertical_task", "load_source", "build_network", "check_graph", "build_simulation", "run_study", "StudyResult", "slug", "provenance",
           "write_results"]

from fednet.protocol.trace import COLUMNS

log = logging.getLogger(__name__)

#: Packages whose versions :func:`provenance` records.
PROVENANCE_PACKAGES = ("numpy", "scipy", "torch", "galois", "simpy", "pydantic", "scikit-learn", "networkx")

#: The standard trace columns, in order (defined once, by :class:`fednet.protocol.trace.TraceRow`).
TRACE_COLUMNS = list(COLUMNS)


def prepare_task(study: Study, data_dir: str | os.PathLike | None = None, *, feature_seed: int | None = None,
                 data: Any = None) -> LearningTask:
    """Load the data set, preprocess it (``data.preprocess``), embed it, split it over the devices, wrap it as a task.

    Parameters
    ----------
    study : Study
    data_dir : path-like, optional
        Directory with ``mnist/`` and ``fashion-mnist/`` (default ``$FEDNET_DATA``).
    feature_seed : int, optional
        ``random_state`` of the random-Fourier draw; default the study's (``feature_seed``, or
        :meth:`~fednet.study.config.DataSpec.feature_seed_for` of the first seed for ``"per_seed"``).
    data : fednet.learning.datasets.Dataset, optional
        An already loaded data set (skips loading).

    Raises
    ------
    fednet.learning.datasets.DatasetError
        For a missing or corrupted data file (before anything is written).
    fednet.errors.ConfigError
        When the partition cannot give every device at least one training point.
    """
    spec: DataSpec = study.data
    if spec.vertical:
        return vertical_task(study, data_dir)
    if data is None:
        data = load_dataset(spec.dataset, data_dir)
    data = preprocess(data, spec.preprocess)            # "unit": the data set itself (pixels in [0, 1])
    fs = spec.feature_seed_for(study.seeds[0]) if feature_seed is None else feature_seed
    feats = data if spec.features == "raw" else rbf_features(data, gamma=spec.rbf_gamma,
                                                            n_components=spec.n_components, seed=fs)
    try:
        parts = partition(data.y_train, study.network.n_devices, kind=spec.partition, alpha=spec.dirichlet_alpha,
                          rng=np.random.default_rng(spec.partition_seed))
    except ValueError as e:
        raise ConfigError(f"data.partition = {spec.partition!r} cannot split the {len(data.y_train)} training points "
                          f"of {spec.dataset!r} over network.n_devices = {study.network.n_devices}: {e}") from e
    empty = [i for i, idx in enumerate(parts) if len(idx) == 0]
    if empty:
        raise ConfigError(f"data.partition = {spec.partition!r} leaves device {empty[0]} (and {len(empty) - 1} more) "
                          f"without training points over network.n_devices = {study.network.n_devices}; use fewer "
                          f"devices or another partition")
    y = one_hot(data.y_train, data.n_classes)
    tr = study.training
    return LearningTask(
        X=[np.ascontiguousarray(feats.x_train[idx]) for idx in parts],
        Y=[y[idx] for idx in parts],
        x_test=feats.x_test, y_test=np.asarray(data.y_test),
        learning_rate=tr.learning_rate, lr_milestones=tuple(tr.lr_milestones), lr_decay=tr.lr_decay,
        weight_decay=tr.weight_decay)


def vertical_task(study: Study, data_dir: str | os.PathLike | None = None) -> LearningTask:
    """The task of a ``[data] split = "vertical"`` study: every device a feature block of every example.

    :func:`fednet.learning.vertical.load_vertical` splits the data set over ``network.n_devices``
    clients (FedVS, Sec. 6.1, App. C) and :func:`fednet.learning.vertical.as_learning_task` wraps it
    (``X[n]``: client ``n``'s block of all training rows; ``Y[n]``: the same labels for every ``n``,
    read by the server only); the vertical protocols unwrap it with
    :func:`fednet.learning.vertical.vertical_from_task`.

    Raises
    ------
    fednet.learning.datasets.DatasetError
        For a missing data set (the FedVS data sets not on this machine are named).
    fednet.errors.ConfigError
        When the data set cannot be split over ``network.n_devices`` (``handwritten`` has 6 views).
    """
    from fednet.learning.vertical import as_learning_task, load_vertical

    spec, n = study.data, study.network.n_devices
    if spec.dataset == "handwritten" and n != 6:
        raise ConfigError(f"data.dataset = 'handwritten' has 6 views, one per client: network.n_devices must be 6, "
                          f"got {n}")
    try:
        data = load_vertical(spec.dataset, None if spec.dataset == "handwritten" else n, data_dir,
                             max_train=spec.max_train, max_test=spec.max_test)
    except ValueError as e:
        if isinstance(e, FednetError):
            raise
        raise ConfigError(f"data.dataset = {spec.dataset!r} cannot be split over network.n_devices = {n}: {e}") from e
    return as_learning_task(data, learning_rate=study.training.learning_rate)


def load_source(study: Study, data_dir: str | os.PathLike | None = None) -> Any:
    """The raw data set a horizontal study's :func:`prepare_task` draws from (None for a vertical one).

    Loaded once per study and shared by its feature draws; a vertical study's task is built directly
    by :func:`vertical_task`.
    """
    return None if study.data.vertical else load_dataset(study.data.dataset, data_dir)


def _stream(seed: int, field: str, value: Any) -> np.random.Generator:
    """The stream of a drawn network field: keyed by (seed, "topology", field); a table's own seed wins."""
    own = value.get("seed") if isinstance(value, dict) else None
    return Streams(seed if own is None else own, 1).generator("topology", field)


def build_network(spec: NetworkSpec, seed: int) -> nx.Graph:
    """The topology graph of a network spec for one seed.

    Dispatches on ``spec.kind``: the built-in ``lte_star`` gets the spec's link, loss and MAC-rate
    fields (numbers, per-device lists, or distributions drawn here); a user builder
    ``"module:function"`` is called as ``function(n_devices, rng=..., **spec.params)``. Then
    ``spec.groups`` is written onto the graph (:func:`fednet.topologies.groups.assign_groups`).

    The "paper" MAC rates keep the stream they always had (``Streams(seed, 1).generator("topology")``),
    so existing studies draw the same rates; every other drawn field has its own stream
    (:func:`_stream`).

    Raises
    ------
    fednet.errors.ConfigError
        If a user builder returns a graph the simulation cannot run (:func:`check_graph`).
    """
    D = spec.n_devices
    topo_rng = Streams(seed, 1).generator("topology")
    if spec.kind in ("lte_star", "lte_cells"):       # the network fields; lte_cells adds the cells (params)
        if spec.device_mac_rates == "paper":
            rates = None
        else:
            rates = per_device(spec.device_mac_rates, D, _stream(seed, "device_mac_rates", spec.device_mac_rates),
                               "device_mac_rates")
        link = {name: per_device(getattr(spec, name), D, _stream(seed, name, getattr(spec, name)), name)
                for name in ("uplink_bps", "downlink_bps", "loss")}
        g = lte_star(D, **link, header_overhead=spec.header_overhead, packet_bits=spec.packet_bits,
                     server_mac_rate=spec.server_mac_rate, device_mac_rates=rates, rng=topo_rng,
                     hop_latency_s=spec.hop_latency_s, energy=spec.energy)
        if spec.kind == "lte_cells":
            g = assign_cells(g, **{"n_cells": 1, **spec.params})      # one cell unless given, as lte_cells()
    else:
        g = builder(spec.kind)(D, rng=topo_rng, **spec.params)
        check_graph(g, spec.kind, D)
    gs = spec.groups
    if gs is not None:
        if gs.membership is not None:
            members = gs.membership
        elif gs.rule == "cells":
            members = cell_groups(g, gs.count, spec.kind)
        else:
            macs = [a.get("mac_rate") for _, a in g.nodes(data=True) if a.get("role") == "device"]
            members = make_groups(gs.rule, D, gs.count, mac_rates=macs,
                                  rng=Streams(seed if gs.seed is None else gs.seed, 1).generator("topology", "groups"))
        assign_groups(g, members)
    return g


def cell_groups(g: Any, count: int, kind: str) -> list[list[int]]:
    """One group per cell of a built network (``groups.rule = "cells"``): the devices (in index order) of each cell
    that holds devices, cells in increasing order; ``count`` must be their number.

    Raises
    ------
    fednet.errors.ConfigError
        If a device has no ``cell`` attribute, or the cells holding devices are not ``count``.
    """
    cells = [a.get("cell") for _, a in g.nodes(data=True) if a.get("role") == "device"]
    if any(c is None for c in cells):
        raise ConfigError(f"network.groups.rule = 'cells': network kind {kind!r} puts no device in a cell (lte_cells, "
                          f"radio_star and hierarchy do)")
    order = sorted(set(cells))
    if len(order) != count:
        raise ConfigError(f"network.groups.rule = 'cells' with count = {count}: the network has {len(order)} cells "
                          f"holding devices; set groups.count = {len(order)}")
    at = {c: k for k, c in enumerate(order)}
    members: list[list[int]] = [[] for _ in order]
    for i, c in enumerate(cells):
        members[at[c]].append(i)
    return members


def check_graph(g: Any, kind: str, n_devices: int) -> None:
    """Refuse a user builder's graph that a :class:`~fednet.sim.simulation.Simulation` cannot run.

    Parameters
    ----------
    g : object
        What the builder returned.
    kind : str
        The builder (``"package.module:function"``), for messages.
    n_devices : int
        ``network.n_devices``.

    Raises
    ------
    fednet.errors.ConfigError
        Naming the problem: not a networkx graph; a node whose ``role`` is not ``"device"``, ``"server"`` or
        ``"edge"`` (a relay: fednet models one server, edge servers, devices and direct device-to-device edges);
        not exactly one server; another number of devices than ``n_devices``; a device linked neither to the
        server nor to exactly one edge server; an edge server without a backhaul to the server.
    """
    if not isinstance(g, nx.Graph):
        raise ConfigError(f"network builder {kind!r} returned {type(g).__name__}, not a networkx graph")
    roles: dict[Any, list[Any]] = {}
    for k, a in g.nodes(data=True):
        roles.setdefault(a.get("role"), []).append(k)
    others = {r: ks for r, ks in roles.items() if r not in ("device", "server", "edge")}
    if others:
        role, keys = next(iter(others.items()))
        raise ConfigError(f"network builder {kind!r} built node(s) {keys[:3]} with role {role!r}: fednet simulates one "
                          f"node with role 'server', nodes with role 'device' and edge servers with role 'edge' (no "
                          f"relays; devices reach each other through the server or their edge server, or over "
                          f"device-to-device edges)")
    servers = roles.get("server", [])
    if len(servers) != 1:
        raise ConfigError(f"network builder {kind!r} built {len(servers)} nodes with role 'server'; the network needs "
                          f"exactly one")
    devices = roles.get("device", [])
    if len(devices) != n_devices:
        raise ConfigError(f"network builder {kind!r} built {len(devices)} devices for n_devices = {n_devices}")
    edges = set(roles.get("edge", []))
    unlinked = [k for k in devices if not g.has_edge(k, servers[0])
                and sum(1 for v in g.neighbors(k) if v in edges) != 1]
    if unlinked:
        raise ConfigError(f"network builder {kind!r}: device(s) {unlinked[:3]} have no edge to the server "
                          f"{servers[0]!r}" + (" or to exactly one edge server" if edges else ""))
    cut_off = [k for k in edges if not g.has_edge(k, servers[0])]
    if cut_off:
        raise ConfigError(f"network builder {kind!r}: edge server(s) {cut_off[:3]} have no backhaul edge to the "
                          f"server {servers[0]!r}")


def build_simulation(spec: NetworkSpec, seed: int, *, record_views: bool = False) -> Simulation:
    """A fresh :class:`Simulation` of the network spec under ``seed``."""
    compute = (ShiftedExponential(spec.setup_fraction) if spec.compute == "shifted_exponential"
               else Deterministic())
    if spec.availability == "dresfl_extreme":
        availability = ExtremeDropout(spec.n_devices, seed, rates_seed=spec.rates_seed,
                                      min_reliable=spec.min_reliable)
    elif spec.availability == "trace":
        availability = read_availability_trace(spec.availability_trace, spec.n_devices)
    else:
        availability = BernoulliDropout(spec.dropout) if spec.dropout > 0 else None
    return Simulation(build_network(spec, seed), seed, device_compute=compute, availability=availability,
                      record_views=record_views, secret_seed=secret_seed_from_env())


def _git_commit() -> tuple[str | None, bool | None]:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip() != ""
        return head or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def _package_names() -> list[str]:
    """:data:`PROVENANCE_PACKAGES` and every dependency fednet's metadata declares (extras excluded), each once."""
    import re

    names = list(PROVENANCE_PACKAGES)
    try:
        requires = importlib.metadata.requires("fednet") or []
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        requires = []
    for req in requires:
        if "extra ==" in req:
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[([^\]]*)\])?", req)
        if m:
            names.append(m.group(1))
            names += [x.strip() for x in (m.group(3) or "").split(",") if x.strip()]   # dask[distributed]
    return list(dict.fromkeys(n.lower() for n in names))


def data_provenance(study: Study, data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The data a study read: data set, folder and each file's SHA-256.

    The IDX files of ``mnist`` and ``fashion-mnist`` are verified against their known SHA-256 when loaded
    (:func:`fednet.learning.datasets.verify_file`); their sums are taken from the folder's ``SHA256SUMS`` where it
    lists them, else from :data:`fednet.learning.datasets.SHA256` (the sums they were verified against). Other
    files (``handwritten``'s views) are hashed here; ``digits`` is embedded in scikit-learn (no file).

    Returns
    -------
    dict
        ``dataset``, ``split``, ``dir`` (None for embedded data), ``files`` ({"<dataset>/<file>": sha256}) and
        ``source`` (``"SHA256SUMS"``, ``"verified"``, ``"computed"`` or ``"embedded (scikit-learn)"``).
    """
    from fednet.learning.datasets import SHA256, resolve_data_dir

    name = study.data.dataset
    doc: dict[str, Any] = {"dataset": name, "split": study.data.split, "dir": None, "files": {}, "source": None}
    if name == "digits":
        doc["source"] = "embedded (scikit-learn)"
        return doc
    folder = resolve_data_dir(data_dir)
    doc["dir"] = str(folder.resolve())
    known = {k: v for k, v in SHA256.items() if k.startswith(name + "/")}
    if known:
        listed: dict[str, str] = {}
        try:
            for line in (folder / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2:
                    listed[parts[1].lstrip("*").removeprefix("./")] = parts[0].lower()
        except (OSError, UnicodeDecodeError):
            listed = {}
        from_sums = all(k in listed for k in known)
        doc["files"] = {k: listed[k] if from_sums else v for k, v in sorted(known.items())}
        doc["source"] = "SHA256SUMS" if from_sums else "verified"
        return doc
    import hashlib

    sub = folder / name
    files = sorted(p for p in sub.rglob("*") if p.is_file()) if sub.is_dir() else []
    doc["files"] = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    doc["source"] = "computed"
    return doc


def redact_secret_seed(command: Sequence[str]) -> list[str]:
    """``command`` with the value of ``--secret-seed N`` (or ``--secret-seed=N``) replaced by ``<secret>``.

    The command line goes into the public ``provenance.json``; the secret seed only into the private
    ``secret_seed.json``.
    """
    out, hide = [], False
    for arg in command:
        arg = str(arg)
        if hide:
            out.append("<secret>")
            hide = False
        elif arg == "--secret-seed":
            out.append(arg)
            hide = True
        elif arg.startswith("--secret-seed="):
            out.append("--secret-seed=<secret>")
        else:
            out.append(arg)
    return out


def provenance(command: Sequence[str] | None = None, study: Study | None = None,
               data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """What produced a result: fednet version, git commit, package versions, Python, command line, time, code, data.

    Parameters
    ----------
    command : sequence of str, optional
        The command line (default ``sys.argv``).
    study : Study, optional
        The study run: its own code (``user_code``) and data (``data``) are recorded.
    data_dir : path-like, optional
        The data folder the study read (default ``$FEDNET_DATA``).

    Returns
    -------
    dict
        ``fednet`` (version), ``git_commit`` and ``git_dirty`` (None outside a git checkout),
        ``packages`` ({name: version or None}: :data:`PROVENANCE_PACKAGES` and every dependency of fednet,
        dask, distributed, pandas and matplotlib among them), ``python``, ``platform``, ``command``,
        ``created_utc`` (ISO 8601, seconds), and with ``study``: ``user_code`` (the ``"module:Name"`` modules it
        loaded: spec, module, path, sha256, shipped; :mod:`fednet.study.usercode`) and ``data``
        (:func:`data_provenance`). ``provenance.json`` differs between runs (the time); ``summary.json`` and the
        traces do not.
    """
    import datetime

    import fednet

    versions = {}
    for name in _package_names():
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    commit, dirty = _git_commit()
    doc: dict[str, Any] = {
        "fednet": fednet.__version__, "git_commit": commit, "git_dirty": dirty, "packages": versions,
        "python": platform.python_version(), "platform": platform.platform(),
        "command": shlex.join(redact_secret_seed(sys.argv if command is None else command)),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if study is not None:
        try:
            doc["user_code"] = [m.as_dict() for m in user_modules(study)]
        except ImportError as e:         # the study ran, so its code imported; a module changed meanwhile
            doc["user_code"] = [{"error": str(e)}]
        doc["data"] = data_provenance(study, data_dir)
        traces = sorted({n.availability_trace for n in [study.network, *(study.run_network(r) for r in study.runs)]
                         if n.availability_trace is not None})
        if traces:                       # the on/off times the runs read (their path and SHA-256)
            doc["availability_traces"] = {t: _sha256_or_none(t) for t in traces}
    return doc


def _sha256_or_none(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class StudyResult:
    """What :func:`run_study` produced.

    Attributes
    ----------
    out_dir : Path or None
        Where the results were written (None: in memory only).
    summary : dict
        ``summary.json`` (:func:`~fednet.study.results.summarize`).
    traces : {label: {seed: rows}}
    wall_s : {label: {seed: host seconds}}
    timing : dict
        ``timing.json``: host seconds (data loading, each run and seed, total).
    provenance : dict
        ``provenance.json`` (:func:`provenance`).
    study : Study or None
    """

    out_dir: Path | None
    summary: dict[str, Any]
    traces: dict[str, dict[int, list[dict[str, Any]]]]
    wall_s: dict[str, dict[int, float]]
    timing: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    study: Study | None = None
    #: The study's secret seed (:func:`study_secret_seed`) and where it came from; kept apart from the public
    #: outputs (written to ``secret_seed.json``, mode 0600, never into ``summary.json`` or ``provenance.json``).
    secret_seed: int | None = None
    secret_source: str | None = None

    def table(self) -> str:
        """The summary as a plain-text table (:func:`~fednet.study.results.format_summary`)."""
        return format_summary(self.summary)

    def per_seed_table(self) -> str:
        """Per-seed crossings (:func:`~fednet.study.results.format_per_seed`)."""
        return format_per_seed(self.summary)

    def frames(self) -> Results:
        """The results as pandas DataFrames (like :func:`~fednet.study.results.load_results`)."""
        fs = self.summary.get("feature_seeds")
        return Results(rounds_frame(self.traces),
                       targets_frame(self.traces, self.summary["targets"], self.summary.get("baseline"),
                                     None if fs is None else {int(k): v for k, v in fs.items()}),
                       self.summary, json.loads(self.study.model_dump_json()) if self.study else {})


def training_task(study: Study, run: RunSpec, task: LearningTask) -> LearningTask:
    """The task ``run`` trains on: ``task`` with the run's own ``training`` overrides, if any.

    The data are the study's (loaded and split once); only the hyperparameters the run's ``training`` sets
    (:meth:`~fednet.study.config.Study.run_training`; e.g. a swept ``training.learning_rate``) change.
    """
    if not run.training:
        return task
    import dataclasses

    tr = study.run_training(run)
    return dataclasses.replace(task, **{k: tuple(getattr(tr, k)) if k == "lr_milestones" else getattr(tr, k)
                                        for k in run.training})


def _build_protocol(study: Study, run: RunSpec, seed: int, task: LearningTask) -> Any:
    """The protocol of ``run`` on a fresh simulation of ``seed``.

    Raises
    ------
    ConfigError
        When the protocol refuses its parameters against the data or network (its ``validate``
        raised ``ValueError``); the message names the run.
    PluginError
        When the study's own protocol or network builder raised (:func:`~.usercode.user_code_error`).
    """
    cls = registry.get(run.protocol)
    net = study.run_network(run)
    try:
        sim = build_simulation(net, seed, record_views=study.record_views)
    except (Exception, SystemExit) as e:     # a study's own builder that fails at a seed the load did not build
        named = None if net.kind in TOPOLOGIES else user_code_error(builder(net.kind), e, f"building the network of "
                                                                                         f"seed {seed}")
        if named is None:
            raise
        raise named from e
    try:
        return cls(sim, training_task(study, run, task), study.run_params(run), label=run.name)
    except ConfigError as e:
        i = study.runs.index(run)
        message = f"runs[{i}] ({run.name}).params: {e}"
        try:
            named = type(e)(message)
        except TypeError:                   # a subclass with its own constructor (fednet.codes.fedvs.FieldTooSmall)
            named = (CapacityError if isinstance(e, CapacityError) else ConfigError)(message)
        raise named from e
    except FednetError:
        raise
    except ValueError as e:
        i = study.runs.index(run)
        raise ConfigError(f"runs[{i}] ({run.name}).params: {e}") from e
    except (Exception, SystemExit) as e:                 # a study's own protocol that raised: named, one line
        named = user_code_error(cls, e, "when constructed")
        if named is None:
            raise
        raise named from e


#: Which engine backend ran each step of the runs this process made (label -> paths), for ``timing.json`` and
#: ``fednet run --explain-engine``: host facts like the host seconds beside them (the backend never changes a number).
ENGINE_PATHS: dict[str, EnginePaths] = {}


def _run_one(study: Study, run: RunSpec, seed: int, task: LearningTask,
             on_round: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    proto = _build_protocol(study, run, seed, task)
    try:
        return proto.run(study.run_epochs(run), stop_at=study.stop_accuracy, on_round=on_round, strict=study.strict)
    except (Exception, SystemExit) as e:                 # a study's own protocol that raised: named, one line
        named = user_code_error(type(proto), e, f"in {'the set-up' if not getattr(proto, 'epoch', 0) else f'round {proto.epoch}'} "
                                                f"of run {run.name!r}, seed {seed}")
        if named is None:
            raise
        raise named from e
    finally:
        ENGINE_PATHS.setdefault(run.name, EnginePaths()).merge(proto.sim.engine_paths)


def _write_trace(path: Path, by_seed: dict[int, list[dict[str, Any]]], seeds: Sequence[int]) -> None:
    extra = sorted({k for rows in by_seed.values() for r in rows for k in r} - set(TRACE_COLUMNS))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TRACE_COLUMNS + extra)
        w.writeheader()
        for seed in seeds:
            w.writerows(by_seed[seed])


def write_secret_seed(path: Path, study: Study, seed: int, source: str | None) -> None:
    """Write a study's secret seed to ``path`` (mode 0600 from its creation; never through a link).

    Keep the file private: with it anyone can regenerate every pad, mask and noise of the runs.  Replay with
    ``fednet run STUDY --secret-seed N`` (or ``FEDNET_SECRET_SEED=N``).
    """
    doc = {"secret_seed": int(seed), "source": source,
           "replay": f"fednet run {study.name} --secret-seed {int(seed)}  (or FEDNET_SECRET_SEED={int(seed)})",
           "note": "private: it regenerates every pad, mask, noise and stochastic rounding of these runs; the public "
                   "results (summary.json, trace.csv) do not depend on it except where summary.json marks a run "
                   "secret_dependent"}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")


def write_results(result: StudyResult, study: Study, directory: str | os.PathLike, *, plot: bool = True) -> None:
    """Write a study's result files into an existing ``directory`` (module docstring for the layout)."""
    directory = Path(directory)
    for run in study.runs:
        run_dir = directory / slug(run.name)
        run_dir.mkdir(exist_ok=True)
        _write_trace(run_dir / "trace.csv", result.traces[run.name], study.seeds)
    (directory / "summary.json").write_text(dumps_strict(result.summary), encoding="utf-8")
    (directory / "timing.json").write_text(dumps_strict(result.timing), encoding="utf-8")
    (directory / "provenance.json").write_text(dumps_strict(result.provenance), encoding="utf-8")
    (directory / "study.json").write_text(study.model_dump_json(indent=2), encoding="utf-8")
    if result.secret_seed is not None:
        write_secret_seed(directory / SECRET_FILE, study, result.secret_seed, result.secret_source)
    if plot:
        from .plots import plot_accuracy_vs_time

        plot_accuracy_vs_time(result.traces, study.targets, directory / "accuracy_vs_time.png", title=study.name)


def _simulate(study: Study, *, data_dir: str | os.PathLike | None, progress: bool,
              command: Sequence[str] | None, finished: Mapping[tuple[int, int], Record] | None = None,
              on_done: Callable[[int, int, Record], None] | None = None) -> StudyResult:
    """Run every (run, seed) of ``study`` in memory (data loaded once per feature draw).

    ``finished`` (``{(run index, seed): record}``, :mod:`fednet.study.checkpoint`) are taken as they
    are and not run (a feature draw whose pairs are all finished is not even loaded); ``on_done`` is
    called with each pair this call runs, as it finishes.
    """
    finished = finished or {}
    t_start = time.perf_counter()
    groups: dict[int, list[int]] = {}
    for seed in study.seeds:
        groups.setdefault(study.data.feature_seed_for(seed), []).append(seed)
    traces: dict[str, dict[int, list[dict[str, Any]]]] = {run.name: {} for run in study.runs}
    wall: dict[str, dict[int, float]] = {run.name: {} for run in study.runs}
    data_s: dict[str, float] = {}
    # progress weighted by measured host cost per run (set-up and rows), not by rounds (fednet.study.progress)
    with study_progress(study, enabled=progress) as bar:
        data = None
        for fs, seeds in groups.items():
            todo = [(i, seed) for i in range(len(study.runs)) for seed in seeds if (i, seed) not in finished]
            task = None
            if todo:
                bar.set_status(f"loading {study.data.dataset}, vertical split" if study.data.vertical else
                               f"loading {study.data.dataset}, {study.data.n_components} random features "
                               f"(draw {fs})")
                t0 = time.perf_counter()
                if data is None:
                    data = load_source(study, data_dir)
                task = prepare_task(study, data_dir, feature_seed=fs, data=data)
                data_s[str(fs)] = time.perf_counter() - t0
                log.info("%s: data %s with feature draw %d ready in %.1f s", study.name, study.data.dataset, fs,
                         data_s[str(fs)])
                for run in study.runs:             # refuse data-dependent misfits before any run
                    _build_protocol(study, run, seeds[0], task)
            else:
                data_s[str(fs)] = max(finished[(i, s)]["data_s"] for i in range(len(study.runs)) for s in seeds)
            for i, run in enumerate(study.runs):
                for seed in seeds:
                    if (i, seed) in finished:
                        rows, wall[run.name][seed] = finished[(i, seed)]["rows"], finished[(i, seed)]["wall_s"]
                        bar.finish((i, seed), len(rows), wall[run.name][seed], resumed=True)
                    else:
                        bar.set_status(f"{run.name} seed {seed}")
                        bar.start((i, seed))
                        count = [0]

                        def _on_round(row: dict[str, Any], key: tuple[int, int] = (i, seed)) -> None:
                            count[0] += 1
                            bar.update(key, count[0])

                        t0 = time.perf_counter()
                        rows = _run_one(study, run, seed, task, _on_round)
                        wall[run.name][seed] = time.perf_counter() - t0
                        bar.finish((i, seed), len(rows), wall[run.name][seed])
                        if on_done is not None:
                            on_done(i, seed, {"rows": rows, "wall_s": wall[run.name][seed],
                                              "data_s": data_s[str(fs)], "feature_seed": fs})
                    traces[run.name][seed] = rows
                    log.info("%s: %s seed %d: %d rounds, %.1f simulated s, %.1f host s%s", study.name, run.name,
                             seed, len(rows) - 1, rows[-1]["time_s"], wall[run.name][seed],
                             " (resumed)" if (i, seed) in finished else "")
    return _assemble(study, traces, wall, data_s, _resumed(study, finished), t_start, command, data_dir)


def _resumed(study: Study, finished: Mapping[tuple[int, int], Record] | None) -> dict[str, Any]:
    """``timing.json``'s list of the pairs taken from a checkpoint (empty: none)."""
    return {"resumed": [[study.runs[i].name, seed] for i, seed in sorted(finished)]} if finished else {}


def _assemble(study: Study, traces: dict[str, dict[int, list[dict[str, Any]]]], wall: dict[str, dict[int, float]],
              data_s: dict[str, float], extra_timing: dict[str, Any], t_start: float,
              command: Sequence[str] | None, data_dir: str | os.PathLike | None = None) -> StudyResult:
    """Summary, timing and provenance of gathered traces (shared by the serial and parallel paths)."""
    fseeds = {seed: study.data.feature_seed_for(seed) for seed in study.seeds}
    summary = {"study": study.name,
               **summarize(traces, study.targets, study.baseline,
                           feature_seeds=fseeds if study.data.feature_seed == "per_seed" else None)}
    for run in study.runs:
        summary["runs"][run.name]["trace_csv"] = f"{slug(run.name)}/trace.csv"
        cls = registry.get(run.protocol)
        if cls.secret_dependent(cls.Config.model_validate(study.run_params(run))):
            summary["runs"][run.name]["secret_dependent"] = True     # replay it with its secret_seed.json
    timing = {"unit": "host seconds (wall clock; not reproducible)", "data_s": data_s,
              "runs": {label: {str(s): v for s, v in by.items()} for label, by in wall.items()},
              **extra_timing, "total_s": time.perf_counter() - t_start,
              "engine": {label: ENGINE_PATHS.pop(label).as_dict() for label in wall if label in ENGINE_PATHS}}
    return StudyResult(None, summary, traces, wall, timing, provenance(command, study, data_dir), study)


def _simulate_parallel(study: Study, *, jobs: int | None, scheduler: str | None, data_dir: str | os.PathLike | None,
                       progress: bool, blas_threads: int | None, command: Sequence[str] | None,
                       finished: Mapping[tuple[int, int], Record] | None = None,
                       on_done: Callable[[int, int, Record], None] | None = None,
                       threads: int | None = None) -> StudyResult:
    """Run every (run, seed) of ``study`` as Dask tasks (:mod:`fednet.study.parallel`); as :func:`_simulate`."""
    from .parallel import simulate_parallel

    t_start = time.perf_counter()
    traces, wall, data_s, info = simulate_parallel(study, jobs=jobs, scheduler=scheduler, data_dir=data_dir,
                                                   progress=progress, blas_threads=blas_threads, finished=finished,
                                                   on_done=on_done, threads=threads)
    return _assemble(study, traces, wall, data_s, {"parallel": info, **_resumed(study, finished)}, t_start, command,
                     data_dir)


#: The file of a result folder that holds the study's secret seed (mode 0600; a user may withhold it).
SECRET_FILE = "secret_seed.json"


def study_secret_seed(study: Study, secret_seed: int | None = None,
                      finished: Mapping[tuple[int, int], Record] | None = None) -> tuple[int, str]:
    """The secret seed every run of a study draws its secrets from, and where it came from.

    Secrets (pads, masks, noise, Shamir coefficients, stochastic rounding) never derive from the public seeds, but a
    run whose numbers depend on them (:meth:`fednet.protocol.base.Protocol.secret_dependent`) must still be
    replayable: so every study runs under one recorded secret seed (issue 31, item 5).  In order:

    1. ``secret_seed`` (``fednet run --secret-seed N``);
    2. ``$FEDNET_SECRET_SEED``;
    3. the seed the finished pairs of a resumed checkpoint ran under (so a resumed study is one study);
    4. 63 fresh bits of OS entropy (:func:`secrets.randbits`), redrawn while equal to a public seed.

    Returns
    -------
    seed : int
    source : str
        ``"--secret-seed"``, ``"FEDNET_SECRET_SEED"``, ``"checkpoint"`` or ``"drawn"``.

    Raises
    ------
    fednet.errors.ConfigError
        For a ``secret_seed`` that is not an integer in [0, 2**63 - 1], one equal to a public seed of the study, or one that differs
        from the seed the resumed pairs ran under (their secrets would not be this study's).
    """
    import secrets as _secrets

    resumed = {rec.get("secret_seed") for rec in (finished or {}).values()}
    if len(resumed) > 1:
        raise ConfigError(f"the checkpoint's finished pairs ran under {len(resumed)} different secret seeds; "
                          f"run without --resume")
    before = next(iter(resumed), None)
    if secret_seed is not None:
        if isinstance(secret_seed, bool) or not isinstance(secret_seed, (int, np.integer)) or secret_seed < 0:
            raise ConfigError(f"secret_seed must be a non-negative integer, got {secret_seed!r}")
        if secret_seed > MAX_SEED:
            raise ConfigError(f"--secret-seed must be in [0, 2**63 - 1] (63 bits, as the public seeds), got "
                              f"{secret_seed}")
        seed, source = int(secret_seed), "--secret-seed"
    elif secret_seed_from_env() is not None:
        seed, source = int(secret_seed_from_env()), "FEDNET_SECRET_SEED"
    elif before is not None:
        seed, source = int(before), "checkpoint"
    else:
        seed = _secrets.randbits(63)
        while seed in study.seeds:
            seed = _secrets.randbits(63)
        return seed, "drawn"
    if seed in study.seeds:
        raise ConfigError(f"the secret seed ({source}) must differ from the study's public seeds {study.seeds}, "
                          f"got {seed}: secrets derived from a public seed are not secret")
    if before is not None and seed != before:
        raise ConfigError(f"the secret seed ({source}) differs from the one the checkpoint's finished pairs ran "
                          f"under; --resume with the same secret seed, or run without --resume")
    return seed, source


def run_study(study: Study, out_dir: str | os.PathLike | None = None, *,
              data_dir: str | os.PathLike | None = None, progress: bool = True, plot: bool = True,
              command: Sequence[str] | None = None, jobs: int | None = None, scheduler: str | None = None,
              blas_threads: int | None = 1, resume: bool = False, threads: int | None = None,
              secret_seed: int | None = None) -> StudyResult:
    """Run every (run, seed) of a study; write its results to ``out_dir`` unless it is None.

    Parameters
    ----------
    study : Study
    out_dir : path-like or None
        Output directory (module docstring for its files); None: nothing is written and the
        results come back in memory only (notebooks).
    data_dir : path-like, optional
        Directory with ``mnist/`` and ``fashion-mnist/`` (default ``$FEDNET_DATA``).
    progress : bool
        Show the progress: on a terminal a bar whose share and ETA weigh each (run, seed) by its measured host
        cost (set-up and rows, per run, else per protocol), elsewhere a line at most every 30 s
        (:mod:`fednet.study.progress`).
    plot : bool
        Draw ``accuracy_vs_time.png``.
    command : sequence of str, optional
        Command line recorded in ``provenance.json`` (default ``sys.argv``).
    jobs : int, optional
        Run the (run, seed) pairs as tasks on a local Dask cluster of this many single-threaded
        worker processes (:mod:`fednet.study.parallel`); None (and no ``scheduler``): serially,
        in this process. Same ``trace.csv`` and ``summary.json``, byte for byte. With one pair to
        run, no cluster starts: it runs here, lent ``jobs`` threads (``threads`` unless given).
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:8786``) to run the tasks on instead.
    blas_threads : int or None
        BLAS/OpenMP threads of each simulation (``threadpoolctl``; default 1: parallelise over
        runs instead); None leaves the thread pools alone.
    resume : bool
        Take the (run, seed) pairs that an interrupted run of the same study on the same
        ``out_dir`` finished from its checkpoint and run only the others
        (:mod:`fednet.study.checkpoint`); False (default): discard such a checkpoint.
    threads : int, optional
        Threads each simulation lends its sliced kernels (the devices' like work and the test
        evaluation's rows, :mod:`fednet.algebra.slices`; the outputs are the same for any count).
        Default: 1 serially and on a ``scheduler``; with ``jobs`` and fewer (run, seed) pairs than
        ``jobs``, the spare cores (``jobs // pairs``).
    secret_seed : int, optional
        The root of every run's secrets (:func:`study_secret_seed`: default ``$FEDNET_SECRET_SEED``, the resumed
        checkpoint's, or drawn). It is written to ``secret_seed.json`` (mode 0600) beside the public results, so
        that a run whose numbers depend on its secrets (``summary.json`` marks it ``secret_dependent``) can be
        replayed exactly; it never enters ``summary.json`` or ``provenance.json``.

    Returns
    -------
    StudyResult

    Raises
    ------
    fednet.errors.OutputError
        ``out_dir`` holds files fednet did not write, or is the current folder (checked first,
        before any simulation).
    fednet.errors.OutputLocked
        Another live fednet run writes to ``out_dir`` (its pid is in the message).
    fednet.learning.datasets.DatasetError
        For missing or corrupted data (nothing is left behind).
    fednet.errors.ConfigError
        A protocol refuses its parameters against the data (before any run starts); ``resume``
        without ``out_dir``, or with a checkpoint of another study.
    fednet.protocol.base.StragglerShortfall
        With ``study.strict``, from a round that cannot complete.

    Notes
    -----
    The output folder is checked and locked first; every simulation runs before the result files
    are written; the files then go to a staging folder renamed to ``out_dir``. An existing
    ``out_dir`` is replaced only if fednet wrote it (:class:`~fednet.study.output.StagedOutput`).
    Meanwhile each finished (run, seed) is kept in a checkpoint beside ``out_dir``, removed once
    ``out_dir`` is in place (:mod:`fednet.study.checkpoint`).

    Applies fednet's host configuration (:func:`fednet.runtime.configure_host`) in this process: the malloc
    thresholds, the garbage-collector policy of the runs and, where still unset, the portable-kernel variables
    (effective only for libraries loaded afterwards: call :func:`~fednet.runtime.configure_host` before importing
    NumPy for those).
    """
    configure_host()

    def _run(finished: Mapping[tuple[int, int], Record] | None = None,
             on_done: Callable[[int, int, Record], None] | None = None) -> StudyResult:
        with study_imports(study):         # the study's "module:Name" code, from its file's folder too
            return _run_here(finished, on_done)

    def _run_here(finished: Mapping[tuple[int, int], Record] | None = None,
                  on_done: Callable[[int, int, Record], None] | None = None) -> StudyResult:
        pending = len(study.runs) * len(study.seeds) - len(finished or {})
        one_task = scheduler is None and jobs is not None and pending <= 1
        if (jobs is not None or scheduler is not None) and not one_task:
            return _simulate_parallel(study, jobs=jobs, scheduler=scheduler, data_dir=data_dir, progress=progress,
                                      blas_threads=blas_threads, command=command, finished=finished,
                                      on_done=on_done, threads=threads)
        from fednet.algebra.slices import compute_threads

        from .threads import limit_threads

        for run in study.runs:  # import the protocols (and their libraries) before the thread limit
            registry.get(run.protocol)
        lent = threads or 1
        if one_task and threads is None:        # one (run, seed) left: no workers to start, the cores as threads
            if int(jobs) < 1:
                raise ValueError(f"jobs must be >= 1, got {jobs!r}")
            lent = int(jobs)
        with limit_threads(blas_threads), compute_threads(lent):
            return _simulate(study, data_dir=data_dir, progress=progress, command=command, finished=finished,
                             on_done=on_done)

    def _secret_run(finished: Mapping[tuple[int, int], Record] | None = None,
                    save: Callable[[int, int, Record], None] | None = None) -> StudyResult:
        """:func:`_run` under the study's secret seed (set in ``$FEDNET_SECRET_SEED`` while the runs run, so the
        Dask workers get it too; restored after), each finished pair's record keeping it for ``--resume``."""
        secret, source = study_secret_seed(study, secret_seed, finished)
        on_done = None if save is None else (lambda i, seed, rec: save(i, seed, {**rec, "secret_seed": secret}))
        with scoped_environment({SECRET_SEED_ENV: str(secret)}):
            result = _run(finished, on_done)
        result.secret_seed, result.secret_source = secret, source
        return result

    if out_dir is None:
        if resume:
            raise ConfigError("resume=True needs an output folder (out_dir is None): the checkpoint lives beside it")
        return _secret_run()
    out_dir = Path(out_dir)
    with StagedOutput(out_dir) as tmp:
        checkpoint = Checkpoint(out_dir, study)
        finished = checkpoint.open(resume)
        try:
            result = _secret_run(finished, checkpoint.save)
        except (ConfigError, ImportError):
            if not finished:             # a study that cannot run as written: nothing to resume
                checkpoint.discard()
            raise
        try:
            write_results(result, study, tmp, plot=plot)
        except OSError as e:            # a full disk, a read-only file system: one named error, nothing left
            raise OutputError(f"cannot write the results for --out {str(out_dir)!r}: {e.strerror or e}"
                              f"{f' ({e.filename})' if e.filename else ''}; the finished (run, seed) pairs are "
                              f"kept in {checkpoint.folder} for --resume") from None
    checkpoint.discard()
    result.out_dir = out_dir
    return result
