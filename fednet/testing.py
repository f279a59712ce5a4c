"""Public harnesses a protocol author runs on their own protocol (and the test suite on every built-in).

:func:`check_engine` runs a protocol on the engine's reference semantics (plain SimPy processes) and with its
backends, under the same seeds, and asserts that everything simulated is the same, bit for bit: the trace (every
column, floats by ``repr``), the keyed-draw counters, the simulation's counters, and every message in every node's
view and relay list.  A backend that stood for the processes of your protocol and changed a number fails it, naming
the first difference; the report says which backends ran your steps (so a check that only ran the reference says
so).

Example::

    from fednet.testing import check_engine
    report = check_engine(MyProtocol, {"mode": "timing"}, task=my_task, rounds=3)
    print(report.explain())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from fednet.sim.compute import Availability, ComputeModel, ShiftedExponential
from fednet.sim.engine import EngineConfig, EnginePaths
from fednet.sim.simulation import Simulation

__all__ = ["EngineReport", "check_engine", "engine_snapshot"]


def engine_snapshot(proto: Any) -> dict[str, Any]:
    """Everything a finished run simulated, as exact comparable values.

    Returns
    -------
    dict
        ``trace`` (rows, every value by ``repr``), ``draws`` (each keyed stream's counters), ``counters`` (the
        simulation's totals), ``views`` (per node: its view and relay list, each message's kind, ends, bits, send
        and delivery times and hops), ``now`` (the clock, by ``repr``).
    """
    sim = proto.sim

    def msgs(lst: list) -> list[tuple]:
        return [(m.kind, m.src, m.dst, m.bits, repr(m.sent_at), repr(m.delivered_at), repr(m.hops)) for m in lst]
    return {
        "trace": [{k: repr(v) for k, v in row.items()} for row in proto.trace],
        "draws": {repr(k): v[1].tolist() for k, v in sim.streams._entries.items()},
        "counters": repr(dataclasses.asdict(sim.counters)),
        "views": [(msgs(n.view), msgs(n.relayed)) for n in sim.nodes],
        "now": repr(sim.now),
    }


@dataclass
class EngineReport:
    """What :func:`check_engine` compared and which backends ran.

    Attributes
    ----------
    configurations : list of str
        The engine configurations run (``FEDNET_ENGINE`` syntax), the reference first.
    paths : dict of str -> EnginePaths
        Each configuration's recorded paths (:class:`~fednet.sim.engine.paths.EnginePaths`).
    """

    configurations: list[str]
    paths: dict[str, EnginePaths]

    def backends_used(self) -> set[str]:
        """The backends that ran at least one step in any configuration."""
        return {p for paths in self.paths.values() for (_, _, p), n in paths.counts.items()
                if n and p != "reference"}

    def explain(self) -> str:
        """Each configuration's paths (:meth:`EnginePaths.explain`)."""
        return "\n".join(f"FEDNET_ENGINE={name or 'all'}:\n{paths.explain()}" for name, paths in self.paths.items())


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (a path into nested dicts and lists), or None."""
    if type(a) is not type(b):
        return f"{where}: {a!r} != {b!r}"
    if isinstance(a, Mapping):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{where}[{k!r}]: present in only one run"
            d = _first_difference(a[k], b[k], f"{where}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{where}[{i}]")
            if d:
                return d
        return None if len(a) == len(b) else f"{where}: {len(a)} items != {len(b)}"
    return None if a == b else f"{where}: {a!r} != {b!r}"


def check_engine(protocol: type, params: Mapping[str, Any] | None = None, *, task: Any,
                 graph: nx.Graph | Callable[[], nx.Graph] | None = None, rounds: int = 3, seed: int = 0,
                 secret_seed: int = 20261128, compute: ComputeModel | None = None,
                 availability: Callable[[], Availability] | None = None, record_views: bool = False,
                 configurations: list[str] | None = None, label: str | None = None) -> EngineReport:
    """Run ``protocol`` on the reference semantics and with the engine's backends; assert the same simulation.

    Parameters
    ----------
    protocol : type
        A :class:`~fednet.protocol.base.Protocol` subclass.
    params : mapping, optional
        Its configuration.
    task : LearningTask
        The data (one device per node of the network).
    graph : networkx.Graph or callable() -> Graph, optional
        The network (default: the LTE star of ``task.n_devices`` devices at mixed MAC rates, 10 % loss).
    rounds : int
        Rounds after the set-up.
    seed, secret_seed : int
        The public seed and the secret seed (fixed, so that full-mode runs draw the same secrets in every run).
    compute : ComputeModel, optional
        Devices' compute model (default shifted-exponential, setup fraction 0.5).
    availability : callable() -> Availability, optional
        A fresh dropout model per run (default: every device always available).
    record_views : bool
        Keep every message in its receiver's view (then compared too; some backends decline).
    configurations : list of str, optional
        Engine configurations to compare with the reference (``FEDNET_ENGINE`` syntax; default: every backend
        allowed, ``""``).
    label : str, optional
        The runs' label (errors name it).

    Returns
    -------
    EngineReport

    Raises
    ------
    AssertionError
        Naming the configuration and the first difference (trace column, draw counter, counter or message).
    """
    from fednet.topologies.lte import lte_star

    n = task.n_devices
    if graph is None:
        rates = [2e6, 5e5, 1e6, 3e6, 7.5e5]

        def graph() -> nx.Graph:
            return lte_star(n, device_mac_rates=[rates[i % len(rates)] for i in range(n)], loss=0.1)
    configs = [""] if configurations is None else list(configurations)

    def run(config: str) -> tuple[dict[str, Any], EnginePaths]:
        g = graph() if callable(graph) else graph.copy()
        sim = Simulation(g, seed, device_compute=compute or ShiftedExponential(0.5), record_views=record_views,
                         availability=availability() if availability is not None else None,
                         secret_seed=secret_seed, engine=EngineConfig.parse(config))
        proto = protocol(sim, task, dict(params or {}), label=label or getattr(protocol, "name", None) or "check")
        proto.run(rounds)
        return engine_snapshot(proto), sim.engine_paths

    reference, ref_paths = run("reference")
    report = EngineReport(["reference", *configs], {"reference": ref_paths})
    for config in configs:
        got, paths = run(config)
        report.paths[config] = paths
        diff = _first_difference(reference, got)
        if diff is not None:
            raise AssertionError(f"{protocol.__name__}: FEDNET_ENGINE={config or 'all'} differs from the reference "
                                 f"at {diff}\nbackends that ran:\n{paths.explain()}")
    return report
