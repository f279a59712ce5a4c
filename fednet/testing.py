"""Public harnesses a protocol author runs on their own protocol (and the test suite on every built-in).

:func:`check_engine` runs a protocol on the engine's reference semantics (plain SimPy processes) and with its
backends, under the same seeds, and asserts that everything simulated is the same, bit for bit: the trace (every
column, floats by ``repr``), the keyed-draw counters, the simulation's counters, and every message in every node's
view and relay list.  A backend that stood for the processes of your protocol and changed a number fails it, naming
the first difference; the report says which backends ran your steps (so a check that only ran the reference says
so).

:func:`check_protocol` runs every check an author needs before trusting a protocol's numbers: the engine check
above, the same run twice (determinism at a seed), the same public seed under two secret seeds (secrets independent
of the public randomness: the same times, bits, MACs and public draws), and, for a protocol with a ``mode``, full
against timing mode on every trace column (a timing-mode stand-in billed to the clock, or a closed form that differs
from what the kernels meter, shows as a different MAC or time column), and wire widths consistent with the payloads:
in a full-mode run on the reference semantics every message's integers must fit the width it is billed at (a
:func:`~fednet.sim.engine.wire.field` declaration ``[0, p)``, :func:`~fednet.sim.engine.wire.fixed` its signed
range, a plain width ``[0, 2^bits)`` or the signed range), so 61-bit field elements billed at 32 bits fail, naming the
message kind and the round (:func:`check_wires`).  A computation step that charges zero MACs without ``free=True``
raises :class:`~fednet.protocol.primitives.UnchargedCompute` in any of these runs, and a message whose width is
neither declared nor known from its payload :class:`~fednet.sim.engine.wire.WireWidthError`.

Example::

    from fednet.testing import check_protocol
    report = check_protocol(MyProtocol, {"mode": "timing"}, task=my_task, rounds=3)
    print(report.explain())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from fednet.algebra.meter import DeclaredCostError
from fednet.sim.compute import Availability, ComputeModel, ShiftedExponential
from fednet.sim.engine import EngineConfig, EnginePaths, wire
from fednet.sim.simulation import Simulation

__all__ = ["EngineReport", "ProtocolReport", "check_engine", "check_protocol", "check_wires", "engine_snapshot",
           "FULL_ONLY", "LOSS_RTOL"]

#: Trace columns only full mode fills (observers of the exact math, not part of the simulated trajectory).
FULL_ONLY = frozenset({"decode_error", "decode_bound", "max_abs_error", "checked_rounds"})
#: Timing mode follows the plain float64 trajectory where full mode decodes a fixed-point gradient exactly, so the
#: test loss (not the accuracy) may differ in its last digits: measured 3e-10 relative on fig7's runs.
LOSS_RTOL = 1e-7


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
        """Each message's kind, ends, bits, send and delivery times and hops."""
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
    configs = [""] if configurations is None else list(configurations)

    def run(config: str) -> tuple[dict[str, Any], EnginePaths]:
        snapshot, _, paths = _run(protocol, params or {}, task=task, graph=graph, rounds=rounds, seed=seed,
                                  secret_seed=secret_seed, compute=compute, availability=availability, label=label,
                                  engine=config, record_views=record_views)
        return snapshot, paths

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


#: Trace columns that may depend on the secret draws (full-mode fixed-point rounding of padded values, say).
_SECRET_DEPENDENT = frozenset({"accuracy", "loss"}) | FULL_ONLY


@dataclass
class ProtocolReport:
    """What :func:`check_protocol` checked.

    Attributes
    ----------
    engine : EngineReport
        The engine check (reference against backends).
    checks : list of str
        Every check passed, in order.
    """

    engine: EngineReport
    checks: list[str]

    def explain(self) -> str:
        """The checks passed, then the engine paths."""
        return "\n".join(["checks passed:", *(f"  {c}" for c in self.checks), self.engine.explain()])


def check_protocol(protocol: type, params: Mapping[str, Any] | None = None, *, task: Any,
                   graph: nx.Graph | Callable[[], nx.Graph] | None = None, rounds: int = 3, seed: int = 0,
                   compute: ComputeModel | None = None, availability: Callable[[], Availability] | None = None,
                   label: str | None = None) -> ProtocolReport:
    """Every check a protocol author runs before trusting its numbers (module docstring).

    Parameters
    ----------
    protocol, params, task, graph, rounds, seed, compute, availability, label
        As :func:`check_engine`.

    Returns
    -------
    ProtocolReport

    Raises
    ------
    AssertionError
        Naming the check and the first difference.
    fednet.protocol.primitives.UnchargedCompute
        If a computation step charged no MAC without ``free=True``.
    """
    params = dict(params or {})
    common = dict(task=task, graph=graph, rounds=rounds, seed=seed, compute=compute, availability=availability,
                  label=label)
    checks = []
    engine = check_engine(protocol, params, **common)
    checks.append("the reference semantics and the backends give the same simulation")

    first, _, _ = _run(protocol, params, secret_seed=20261128, **common)
    again, _, _ = _run(protocol, params, secret_seed=20261128, **common)
    diff = _first_difference(first, again)
    if diff is not None:
        raise AssertionError(f"{protocol.__name__}: two runs at one seed differ at {diff} (not deterministic)")
    checks.append("two runs at one public and one secret seed are identical")

    other, _, _ = _run(protocol, params, secret_seed=7_700_001, **common)
    public = {k: v for k, v in first.items() if k != "trace"}
    public["trace"] = [{k: v for k, v in row.items() if k not in _SECRET_DEPENDENT} for row in first["trace"]]
    other_public = {k: v for k, v in other.items() if k != "trace"}
    other_public["trace"] = [{k: v for k, v in row.items() if k not in _SECRET_DEPENDENT} for row in other["trace"]]
    other_public["draws"] = {k: v for k, v in other["draws"].items() if k in first["draws"]}
    public["draws"] = {k: v for k, v in first["draws"].items() if k in other["draws"]}
    diff = _first_difference(public, other_public)
    if diff is not None:
        raise AssertionError(f"{protocol.__name__}: another secret seed changes a public quantity at {diff} "
                             f"(a secret drawn from the public streams, or a time that depends on a secret)")
    checks.append("another secret seed leaves every time, bit, MAC count and public draw unchanged")

    declared = protocol.secret_dependent(protocol.Config.model_validate(params))
    if not declared:
        for r, (a, b) in enumerate(zip(first["trace"], other["trace"])):
            for col in ("accuracy", "loss"):
                if a.get(col) != b.get(col) and not (a.get(col) != a.get(col) and b.get(col) != b.get(col)):
                    raise AssertionError(
                        f"{protocol.__name__}: another secret seed changes round {r}'s {col!r} ({a.get(col)} != "
                        f"{b.get(col)}) but {protocol.__name__}.secret_dependent(config) is False: declare it, so "
                        f"that a study records that these numbers replay only under their secret seed")
        checks.append("the model does not depend on the secret draws (secret_dependent is False)")
    else:
        checks.append("the model may depend on the secret draws (declared secret_dependent)")

    mode_field = getattr(protocol, "Config", None) and protocol.Config.model_fields.get("mode")
    if mode_field is not None:
        try:
            full, full_rows, _ = _run(protocol, {**params, "mode": "full"}, secret_seed=20261128, **common)
        except DeclaredCostError as err:
            raise AssertionError(f"{protocol.__name__}: full mode refuses a declared cost: {err}") from err
        timing, timing_rows, _ = _run(protocol, {**params, "mode": "timing"}, secret_seed=20261128, **common)
        for r, (a, b) in enumerate(zip(full["trace"], timing["trace"])):
            for col in sorted(set(a) | set(b)):
                if col in FULL_ONLY or col == "loss":
                    continue
                if a.get(col) != b.get(col):
                    raise AssertionError(f"{protocol.__name__}: full and timing mode differ in round {r}, column "
                                         f"{col!r}: {a.get(col)} != {b.get(col)} (timing mode must charge what the "
                                         f"kernels meter in full mode, and follow the same trajectory)")
            la, lb = float(full_rows[r]["loss"]), float(timing_rows[r]["loss"])
            if not (la == lb or abs(la - lb) <= LOSS_RTOL * max(abs(la), abs(lb))):
                raise AssertionError(f"{protocol.__name__}: round {r}: the test loss differs beyond {LOSS_RTOL} "
                                     f"relative between full ({la!r}) and timing ({lb!r}) mode")
        if len(full["trace"]) != len(timing["trace"]):
            raise AssertionError(f"{protocol.__name__}: full mode ran {len(full['trace'])} rows, timing "
                                 f"{len(timing['trace'])}")
        checks.append("full and timing mode give the same trace (test loss within LOSS_RTOL)")
    n_messages = check_wires(protocol, {**params, "mode": "full"} if mode_field is not None else params, **common)
    checks.append(f"every message's integers fit the width it is billed at ({n_messages} messages, full mode)")
    return ProtocolReport(engine, checks)


def check_wires(protocol: type, params: Mapping[str, Any] | None = None, *, task: Any,
                graph: nx.Graph | Callable[[], nx.Graph] | None = None, rounds: int = 3, seed: int = 0,
                compute: ComputeModel | None = None, availability: Callable[[], Availability] | None = None,
                label: str | None = None) -> int:
    """Run ``protocol`` on the reference semantics (every message through
    :meth:`~fednet.protocol.primitives.Net.send`) and check each message's integers against its billed width
    (:func:`fednet.sim.engine.wire.misfit`); returns the number of messages seen.

    Pass full-mode ``params``: timing mode's stand-ins carry no values to check.

    Raises
    ------
    AssertionError
        Naming the first message that does not fit: its kind, round, declaration and values.
    """
    seen: list[int] = [0]
    bad: list[str] = []
    where: dict[str, Any] = {}

    def observe(payload: Any, decl: Any, bits: int, kind: str) -> None:
        """Check one message (the first misfit is kept)."""
        seen[0] += 1
        if not bad:
            why = wire.misfit(payload, decl, bits)
            if why is not None:
                bad.append(f"round {where['sim'].round}, message kind {kind!r}: {why}")

    with wire.observing(observe):
        _run(protocol, params or {}, task=task, graph=graph, rounds=rounds, seed=seed, secret_seed=20261128,
             compute=compute, availability=availability, label=label, engine="reference", where=where)
    if bad:
        raise AssertionError(f"{protocol.__name__}: a wire width does not hold its payload: {bad[0]} (declare the "
                             f"width the values need: element_bits=/upload_bits=/download_bits= as "
                             f"fednet.sim.engine.wire.field(p), fixed(k, f) or an int)")
    return seen[0]


def _run(protocol: type, params: Mapping[str, Any], *, task: Any, graph: Any, rounds: int, seed: int,
         secret_seed: int, compute: ComputeModel | None, availability: Callable[[], Availability] | None,
         label: str | None, engine: str = "", record_views: bool = False, where: dict | None = None
         ) -> tuple[dict[str, Any], list[dict], EnginePaths]:
    """One run: its :func:`engine_snapshot`, its trace rows and its engine paths (``where["sim"]``: the simulation,
    set before it runs)."""
    sim = Simulation(_graph(task, graph), seed, device_compute=compute or ShiftedExponential(0.5),
                     record_views=record_views, availability=availability() if availability is not None else None,
                     secret_seed=secret_seed, engine=EngineConfig.parse(engine))
    if where is not None:
        where["sim"] = sim
    proto = protocol(sim, task, dict(params), label=label or getattr(protocol, "name", None) or "check")
    proto.run(rounds)
    return engine_snapshot(proto), proto.trace, sim.engine_paths


def _graph(task: Any, graph: nx.Graph | Callable[[], nx.Graph] | None) -> nx.Graph:
    """The network of a check: ``graph`` (a fresh copy), or the LTE star of the task's devices at mixed MAC rates
    and 10 % loss."""
    from fednet.topologies.lte import lte_star

    if graph is None:
        rates = [2e6, 5e5, 1e6, 3e6, 7.5e5]
        return lte_star(task.n_devices, device_mac_rates=[rates[i % len(rates)] for i in range(task.n_devices)],
                        loss=0.1)
    return graph() if callable(graph) else graph.copy()
