"""Running a study: data pipeline, networks, protocols, traces, summary, plot.

Output of :func:`run_study` (written to a temporary sibling directory and renamed into place
at the end, so a failed or interrupted study leaves no partial result directory)::

    OUT/summary.json            time to each target per run and seed, across seeds, speed-ups
    OUT/accuracy_vs_time.png    accuracy against simulated time, every run and seed
    OUT/study.json              the validated study, as run
    OUT/<run label>/trace.csv   one row per (seed, round)
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
from tqdm.auto import tqdm

from fednet.learning.datasets import load_dataset
from fednet.learning.features import rbf_features
from fednet.learning.models import one_hot
from fednet.learning.partitions import partition
from fednet.learning.task import LearningTask
from fednet.protocol import registry
from fednet.sim.compute import BernoulliDropout, Deterministic, ShiftedExponential
from fednet.sim.rng import Streams, secret_seed_from_env
from fednet.sim.simulation import Simulation
from topologies.lte import lte_star

from .config import DataSpec, NetworkSpec, RunSpec, Study
from .results import format_summary, summarize

__all__ = ["prepare_task", "build_network", "build_simulation", "run_study", "StudyResult", "slug"]

TRACE_COLUMNS = ["protocol", "seed", "round", "time_s", "accuracy", "loss", "bits_up", "bits_down",
                 "device_macs", "server_macs", "retransmissions", "used"]


def slug(label: str) -> str:
    """A file-system-safe directory name for a run label."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
    return s or "run"


def prepare_task(study: Study, data_dir: str | os.PathLike | None = None) -> LearningTask:
    """Load the data set, embed it, split it over the devices and wrap it as a task.

    Raises
    ------
    fednet.learning.datasets.DatasetError
        For a missing or corrupted data file (before anything is written).
    """
    spec: DataSpec = study.data
    data = load_dataset(spec.dataset, data_dir)
    feats = rbf_features(data, gamma=spec.rbf_gamma, n_components=spec.n_components, seed=spec.feature_seed)
    parts = partition(data.y_train, study.network.n_devices, kind=spec.partition, alpha=spec.dirichlet_alpha,
                      rng=np.random.default_rng(spec.feature_seed))
    y = one_hot(data.y_train, data.n_classes)
    tr = study.training
    return LearningTask(
        X=[np.ascontiguousarray(feats.x_train[idx]) for idx in parts],
        Y=[y[idx] for idx in parts],
        x_test=feats.x_test, y_test=np.asarray(data.y_test),
        learning_rate=tr.learning_rate, lr_milestones=tuple(tr.lr_milestones), lr_decay=tr.lr_decay,
        weight_decay=tr.weight_decay)


def build_network(spec: NetworkSpec, seed: int) -> nx.Graph:
    """The topology graph of a network spec for one seed (drawn MAC rates depend on the seed only)."""
    rates = None if spec.device_mac_rates == "paper" else spec.device_mac_rates
    return lte_star(spec.n_devices, uplink_bps=spec.uplink_bps, downlink_bps=spec.downlink_bps, loss=spec.loss,
                    header_overhead=spec.header_overhead, packet_bits=spec.packet_bits,
                    server_mac_rate=spec.server_mac_rate, device_mac_rates=rates,
                    rng=Streams(seed, 1).generator("topology"))


def build_simulation(spec: NetworkSpec, seed: int, *, record_views: bool = False) -> Simulation:
    """A fresh :class:`Simulation` of the network spec under ``seed``."""
    compute = (ShiftedExponential(spec.setup_fraction) if spec.compute == "shifted_exponential"
               else Deterministic())
    return Simulation(build_network(spec, seed), seed, device_compute=compute,
                      availability=BernoulliDropout(spec.dropout) if spec.dropout > 0 else None,
                      record_views=record_views, secret_seed=secret_seed_from_env())


@dataclass
class StudyResult:
    """What :func:`run_study` produced.

    Attributes
    ----------
    out_dir : Path
    summary : dict
    traces : {label: {seed: rows}}
    wall_s : {label: {seed: host seconds}}
    """

    out_dir: Path
    summary: dict[str, Any]
    traces: dict[str, dict[int, list[dict[str, Any]]]]
    wall_s: dict[str, dict[int, float]]

    def table(self) -> str:
        """The summary as a plain-text table (:func:`~fednet.study.results.format_summary`)."""
        return format_summary(self.summary)


def _run_one(study: Study, run: RunSpec, seed: int, task: LearningTask,
             on_round: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    cls = registry.get(run.protocol)
    sim = build_simulation(study.network, seed, record_views=study.record_views)
    proto = cls(sim, task, run.params, label=run.name)
    return proto.run(study.run_epochs(run), stop_at=study.stop_accuracy, on_round=on_round)


def run_study(study: Study, out_dir: str | os.PathLike, *, data_dir: str | os.PathLike | None = None,
              progress: bool = True, plot: bool = True) -> StudyResult:
    """Run every (run, seed) of a study and write its results to ``out_dir``.

    The data are loaded and checked before anything is written; results go to a temporary
    directory renamed to ``out_dir`` at the end (an existing ``out_dir`` is replaced).
    """
    task = prepare_task(study, data_dir)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    traces: dict[str, dict[int, list[dict[str, Any]]]] = {}
    wall: dict[str, dict[int, float]] = {}
    total = sum(study.run_epochs(r) + 1 for r in study.runs) * len(study.seeds)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        with tqdm(total=total, desc=study.name, unit="round", disable=not progress, leave=False,
                  mininterval=0.5) as bar:
            for run in study.runs:
                traces[run.name], wall[run.name] = {}, {}
                for seed in study.seeds:
                    bar.set_postfix_str(f"{run.name} seed {seed}")
                    t0 = time.perf_counter()
                    rows = _run_one(study, run, seed, task, lambda row: bar.update(1))
                    wall[run.name][seed] = time.perf_counter() - t0
                    bar.update(study.run_epochs(run) + 1 - len(rows))
                    traces[run.name][seed] = rows
                run_dir = tmp / slug(run.name)
                run_dir.mkdir()
                with open(run_dir / "trace.csv", "w", newline="") as fh:
                    extra = sorted({k for rows in traces[run.name].values() for r in rows for k in r} - set(TRACE_COLUMNS))
                    w = csv.DictWriter(fh, fieldnames=TRACE_COLUMNS + extra)
                    w.writeheader()
                    for seed in study.seeds:
                        w.writerows(traces[run.name][seed])
        summary = summarize(traces, study.targets, study.baseline, wall)
        summary["study"] = study.name
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
        (tmp / "study.json").write_text(study.model_dump_json(indent=2))
        if plot:
            from .plots import plot_accuracy_vs_time

            plot_accuracy_vs_time(traces, study.targets, tmp / "accuracy_vs_time.png", title=study.name)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return StudyResult(out_dir, summary, traces, wall)
