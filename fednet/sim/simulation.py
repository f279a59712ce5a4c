"""The simulation: SimPy environment, nodes, links, random streams, accounting.

A :class:`Simulation` is built from a networkx graph (see :mod:`fednet.topologies`): one node with
``role="server"`` and devices with ``role="device"``, each device joined to the server by an
edge carrying ``uplink_bps``, ``downlink_bps`` and ``loss`` (or ``uplink_loss`` /
``downlink_loss``) -- a link parameter missing on the edge is read from the device's node
attributes, so a builder may keep per-device link rates and loss on the nodes; nodes carry
``mac_rate`` (MAC/s), optionally ``compute`` (a :class:`~fednet.sim.compute.ComputeModel`) and
``group``; the graph carries ``header_overhead`` and ``packet_bits``. Devices get indices ``0..D-1``
in graph order and the server index ``D``.

Device-to-device edges (both ends ``role="device"``, with ``rate_bps`` and optionally ``loss``)
are direct links: a message between their ends takes that link (full duplex: one FIFO link per
direction; one direction only in a ``DiGraph``) instead of being relayed through the server.
Topologies without such edges -- every bundled one, and the papers' model -- relay through the
server.

Edge servers (issue 28, item 5; :func:`fednet.topologies.hierarchy.hierarchy`): nodes with ``role="edge"`` (``mac_rate``,
optionally ``compute``), each joined to the server -- then the *cloud* -- by a **backhaul** edge carrying
``uplink_bps``, ``downlink_bps``, ``loss`` and ``latency_s``. A device joined to an edge server instead of the
server is in that edge server's cell: its uplink and downlink (the device--edge edge's attributes, as in the star)
end at the edge server. A message follows the tree: up from its source to the lowest node it shares with its
destination, then down (device to its edge server: the device's uplink only; edge server to cloud: the backhaul's
uplink; device to cloud: both; device to device in one cell: up and down through the edge server; in two cells: up,
backhaul up, backhaul down, down). A backhaul hop occupies its link for :func:`~fednet.sim.network.transmission_time`
at the backhaul's rate and loss (keyed draws ``(edge server, "edge:backhaul_up" / "edge:backhaul_down", round)``
of the edge servers' own streams) and is delivered ``latency_s`` later, the link meanwhile free; its bits count in
:attr:`Counters.bits_backhaul`, an edge server's MACs in :attr:`Counters.edge_macs`. Edge servers are indexed
``D+1 ..`` after the server (devices and server keep ``0..D``, and the devices' keyed draws are those of the star at
a seed, so runs on a hierarchy and on a star are paired). A graph without edge servers runs exactly as before.

The engine moves messages and advances time; it does no protocol math. Its two timed
operations are SimPy sub-generators used with ``yield from``:

* :meth:`Simulation.transfer` sends a :class:`~fednet.sim.network.Message` over the device's
  uplink, downlink, or both (device to device, relayed through the server), or over a direct
  device-to-device link where the topology has one;
* :meth:`Simulation.compute` runs a pure function under a MAC meter on a node and holds the
  node's processor for the time the compute model gives for the MACs that really ran.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import networkx as nx
import numpy as np
import simpy

from fednet.algebra.meter import MacMeter
from fednet.errors import ConfigError

from .engine.config import EngineConfig
from .engine.paths import EnginePaths
from .compute import AlwaysAvailable, Availability, BernoulliDropout, ComputeModel, Deterministic, ShiftedExponential
from .cells import SCHEDULERS, make_air
from .network import Link, Message, transmission_time
from .rng import Streams
from .stamp import STAMP, Stamped

__all__ = ["Node", "Simulation", "Counters", "Environment", "Slot", "SIMPY_VERIFIED", "SIMPY_CODE",
           "SIMPY_ATTRIBUTES"]

#: Link parameters a device's node may carry instead of its edge to the server.
_LINK_KEYS = ("uplink_bps", "downlink_bps", "loss", "uplink_loss", "downlink_loss")


@dataclass
class Counters:
    """Traffic and computation accumulated since the last :meth:`Simulation.take_counters`.

    Attributes
    ----------
    bits_up, bits_down : int
        Payload bits carried on uplinks / downlinks (a relayed message counts on both).
    bits_d2d : int
        Payload bits carried on direct device-to-device links.
    device_macs, server_macs : int
        MACs executed by devices / the server.
    messages : int
        Link traversals.
    retransmissions : int
        Retransmitted packets.
    device_energy_j : float
        Joules the devices spent (:attr:`Simulation.energy`: radio airtime and computation; 0 without a model).
    bits_backhaul : int
        Payload bits carried on edge servers' backhaul links, both directions (0 without edge servers).
    edge_macs : int
        MACs executed by edge servers (0 without edge servers).
    """

    bits_up: int = 0
    bits_down: int = 0
    bits_d2d: int = 0
    device_macs: int = 0
    server_macs: int = 0
    messages: int = 0
    retransmissions: int = 0
    device_energy_j: float = 0.0
    bits_backhaul: int = 0
    edge_macs: int = 0


@dataclass(eq=False)
class Node(Stamped):
    """A device, the server or an edge server.

    Attributes
    ----------
    index : int
        Devices ``0..D-1``, the server ``D``, edge servers ``D+1, D+2, ...``.
    name : Any
        The node's key in the topology graph.
    role : str
        ``"device"``, ``"server"`` or ``"edge"``.
    mac_rate : float
        MAC/s (the paper's tau).
    compute_model : ComputeModel
    cpu : simpy.Resource
        The processor: one computation at a time.
    uplink, downlink : Link or None
        The device's links to / from the server or its edge server; an edge server's backhaul to / from the server
        (None for the server).
    state : SimpleNamespace
        Private per-node state of the protocol.
    view : list of Message
        Every message the node received and can read, in order (for privacy audits), if views
        are recorded.
    relayed : list of Message
        Encrypted messages the node forwarded or stored for forwarding (the server): it knows
        their sizes and endpoints, not their payloads.
    attrs : dict
        The remaining graph attributes (e.g. ``group``).
    """

    index: int
    name: Any
    role: str
    mac_rate: float
    compute_model: ComputeModel
    cpu: Any
    uplink: Link | None = None
    downlink: Link | None = None
    state: SimpleNamespace = field(default_factory=SimpleNamespace)
    view: list[Message] = field(default_factory=list)
    relayed: list[Message] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_server(self) -> bool:
        """True for the server node (the cloud in a hierarchy; an edge server is not)."""
        return self.role == "server"

    @property
    def is_edge(self) -> bool:
        """True for an edge server."""
        return self.role == "edge"

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.role}, name={self.name!r})"


#: The SimPy release whose internals :data:`SIMPY_CODE` and :data:`SIMPY_ATTRIBUTES` describe (pyproject.toml pins it).
SIMPY_VERIFIED = "4.1.2"

#: SimPy's code that fednet copies or reproduces -- the one list of it; ``tests/test_simpy_contract.py`` compares each
#: function of the installed SimPy with its digest here (SHA-256 of ``ast.unparse`` of its source without comments
#: or docstrings, first 16 hex digits). A different digest means SimPy changed that code: compare the new source
#: with fednet's copy named in the comment, carry the change over, then record the new digest (the failing test
#: prints it). SimPy 4.1.0 and 4.1.1 differ in ``step`` (no ``StopSimulation`` handling), hence the pin.
SIMPY_CODE = {
    "simpy.core.Environment.step": "17d877492f5a4e60",             # copied: Environment.step below (+ current)
    "simpy.core.Environment.schedule": "8a8a880d33f176dc",         # its queue entry, written directly: the engine's
    #                                                                events.event_at and mailbox.Mailbox._materialise
    "simpy.core.Environment.__init__": "4d7c9cc4a1e4e7b1",         # _now, _queue, _eid (SIMPY_ATTRIBUTES)
    "simpy.events.Event.__init__": "e1d27b4f7f6cc266",             # callbacks a list; _value PENDING (class attribute)
    "simpy.events.Event.succeed": "3abade844d00efa8",              # reproduced: _ok, _value = True, None, then queued
    "simpy.events.Event.defused": "8b50b51eecbd4eb5",              # step's hasattr(event, "_defused")
    "simpy.events.Timeout.__init__": "ce83e5677e81e424",           # event_at: a timeout at an absolute time, NORMAL
    "simpy.resources.base.BaseResource.__init__": "0169823b34458287",   # _env, put_queue
    "simpy.resources.resource.Resource._do_put": "5a1cce7c8f84c4fb",    # Slot wraps it: granted iff no user
    "simpy.resources.resource.Resource._do_get": "55a2bdb830ff037b",    # Slot wraps it: the release of the user
}

#: SimPy's internal names fednet reads or writes and what it assumes of them (``tests/test_simpy_contract.py`` checks
#: each on live objects of the installed SimPy). Users: this module (Environment.step, Slot, Simulation.idle) and
#: the engine, :mod:`fednet.sim.engine` (the Mailbox, ``events.event_at``, the backends and ``events.alone``).
SIMPY_ATTRIBUTES = {
    "simpy.core.Environment._queue": "a heapq list of (time, priority, event id, event) entries, the next one first",
    "simpy.core.Environment._now": "the simulated time; step sets it to the time of the event it pops",
    "simpy.core.Environment._eid": "an itertools.count whose next() is the id of the next scheduled event; "
                                   "replaced by a later count to skip ids (Mailbox.put_many)",
    "simpy.core.EventPriority": "the type of an entry's priority; EventPriority(-1) comes before URGENT",
    "simpy.core.EmptySchedule": "raised by step on an empty queue",
    "simpy.core.StopSimulation": "raised through step by run(until=...)",
    "simpy.events.URGENT": "0: before NORMAL at the same time (a process's start, an interrupt)",
    "simpy.events.NORMAL": "1: timeouts and succeeded events",
    "simpy.events.Event._ok": "True for a succeeded event, False for a failed one",
    "simpy.events.Event._value": "the value; PENDING until triggered",
    "simpy.events.Event.callbacks": "a list of callables taking the event; None once processed",
    "simpy.events.Event._defused": "present (hasattr) once a failure is defused",
    "simpy.resources.base.BaseResource._env": "the resource's environment",
    "simpy.resources.base.BaseResource.put_queue": "the pending requests of a resource",
    "simpy.resources.resource.Resource.users": "the granted requests (a list)",
    "simpy.resources.resource.Resource.queue": "the requests waiting (the put queue)",
    "simpy.resources.resource.Release": "the release event; .resource is its resource",
}


class Environment(simpy.Environment):
    """A :class:`simpy.Environment` that remembers the place of the event it is processing.

    ``current`` is ``(time, priority, id)`` of that event -- SimPy's heap key -- so that lazily
    materialised events (:class:`fednet.sim.engine.mailbox.Mailbox`) can tell whether an event
    scheduled at a known key would already have been processed. :meth:`step` is SimPy 4.1.2's, plus
    that one assignment (:data:`SIMPY_CODE` lists it with every other SimPy internal fednet relies on).
    """

    #: Key of the event being processed (``(time, priority, id)``); before the first step, one below any.
    current: tuple = (-math.inf, 0, -1)
    #: How many :class:`Slot` resources of this environment are held (kept by the slots).
    held: int = 0

    def step(self) -> None:
        """Process the next event (:meth:`simpy.Environment.step`), recording its key in ``current``."""
        try:
            now, prio, eid, event = heapq.heappop(self._queue)
        except IndexError:
            raise simpy.core.EmptySchedule from None
        self._now = now
        self.current = (now, prio, eid)
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except simpy.core.StopSimulation:
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            self.schedule(event, simpy.core.EventPriority(-1))
            raise
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class Slot(simpy.Resource):
    """A processor or a link: a capacity-1 FIFO :class:`simpy.Resource` that keeps ``env.held`` (:class:`Environment`),
    the number of its environment's slots that are held, so that :meth:`Simulation.idle` need not look at each."""

    def __init__(self, env: Environment) -> None:
        super().__init__(env, capacity=1)
        #: How many requests this slot has granted (a backend that stood for processes checks it did not change).
        self.grants = 0

    def _do_put(self, event: Any) -> None:
        if not self.users:                       # granted (capacity 1); otherwise it stays queued, as in SimPy
            super()._do_put(event)
            self._env.held += 1
            self.grants += 1

    def _do_get(self, event: Any) -> None:
        held = bool(self.users)
        super()._do_get(event)
        if held and not self.users:
            self._env.held -= 1


def _positive(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a positive number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigError(f"{what} must be a finite positive number, got {value!r}")
    return v


def _probability(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a probability in [0, 1), got {value!r}") from None
    if not 0.0 <= v < 1.0:
        raise ConfigError(f"{what} must be in [0, 1), got {value!r}")
    return v



def _mean_snr(dev: "Node", key: str, scheduler: str) -> float:
    """The linear mean SNR of a device's link from its node attribute ``key`` (dB), for a ``scheduler`` that needs it.

    Raises
    ------
    fednet.errors.ConfigError
        When the attribute is missing or not a finite number.
    """
    v = dev.attrs.get(key)
    if v is None:
        raise ConfigError(f"device {dev.name!r} is in a {scheduler} cell but has no {key}: that scheduler needs each "
                          f"device's mean SNR (radio_star sets it; lte_cells, assign_cells and hierarchy take snr_db)")
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
        raise ConfigError(f"{key} of device {dev.name!r} must be a finite number of dB, got {v!r}")
    return 10.0 ** (float(v) / 10.0)


class Simulation:
    """One simulated network and its clock.

    Parameters
    ----------
    graph : networkx.Graph
        The topology (module docstring for its attributes).
    seed : int
        Root seed of every random stream.
    device_compute : ComputeModel, optional
        Default compute model of devices without a ``compute`` attribute
        (shifted exponential with setup fraction 0.5).
    server_compute : ComputeModel, optional
        Default compute model of the server and of edge servers (deterministic).
    availability : Availability, optional
        Dropout model of devices (every device always available).
    record_views : bool, optional
        Keep every received message in the receiver's ``view``.
    engine : EngineConfig, optional
        Which engine backends may run and whether their paths are recorded (default: ``$FEDNET_ENGINE``,
        :mod:`fednet.sim.engine.config`).
    secret_seed : int, optional
        Root of the secret streams (:meth:`secret_rng`: pads, masks, Shamir coefficients) for a
        reproducible experiment; must differ from ``seed``.  Default: OS entropy
        (:class:`~fednet.sim.rng.Streams`).

    Raises
    ------
    ValueError
        For a graph without exactly one server, a device linked neither to it nor to exactly one edge server, an
        edge server without a backhaul to the server, a non-positive rate or MAC rate, a loss probability outside
        [0, 1), a negative overhead or backhaul latency.
    """

    def __init__(self, graph: nx.Graph, seed: int, *, device_compute: ComputeModel | None = None,
                 server_compute: ComputeModel | None = None, availability: Availability | None = None,
                 record_views: bool = True, secret_seed: int | None = None,
                 engine: EngineConfig | None = None) -> None:
        self.env = Environment()
        self.graph = graph
        self.record_views = record_views
        #: Which engine backends may run (:class:`~fednet.sim.engine.config.EngineConfig`; default ``$FEDNET_ENGINE``).
        self.engine = EngineConfig.from_env() if engine is None else engine
        if not isinstance(self.engine, EngineConfig):
            raise TypeError(f"engine must be an EngineConfig, got {type(engine).__name__}")
        #: Which backend ran each step, or why the reference did (:class:`~fednet.sim.engine.paths.EnginePaths`).
        self.engine_paths = EnginePaths()
        self.availability = availability or AlwaysAvailable()
        bind = getattr(self.availability, "bind", None)
        if bind is not None:                      # a model that reads simulated time (TraceAvailability)
            bind(lambda: self.env.now)
        self.overhead = float(graph.graph.get("header_overhead", 0.0))
        if not (self.overhead >= 0 and math.isfinite(self.overhead)):
            raise ConfigError(f"header_overhead must be a finite fraction >= 0, got {self.overhead!r}")
        #: Latency floor of every hop, simulated seconds (graph attribute ``hop_latency_s``, default 0: the papers'):
        #: a message is delivered this long after its last bit left the link, which meanwhile serves the next one.
        self.hop_latency = float(graph.graph.get("hop_latency_s", 0.0))
        if not (math.isfinite(self.hop_latency) and self.hop_latency >= 0):
            raise ConfigError(f"hop_latency_s must be finite and >= 0 seconds, got {self.hop_latency!r}")
        pb = graph.graph.get("packet_bits")
        self.packet_bits = None if pb is None else int(_positive(pb, "packet_bits"))

        servers = [n for n, a in graph.nodes(data=True) if a.get("role") == "server"]
        if len(servers) != 1:
            raise ValueError(f"the topology needs exactly one node with role='server', found {len(servers)}")
        device_keys = [n for n, a in graph.nodes(data=True) if a.get("role") == "device"]
        edge_keys = [n for n, a in graph.nodes(data=True) if a.get("role") == "edge"]
        others = [n for n, a in graph.nodes(data=True) if a.get("role") not in ("device", "server", "edge")]
        if others:
            raise ValueError(f"nodes {others[:5]} have a role other than 'device', 'server' or 'edge'")
        if not device_keys:
            raise ValueError("the topology has no devices")
        self.streams = Streams(seed, len(device_keys) + 1, secret_seed=secret_seed)
        self.seed = self.streams.seed
        #: The edge servers' keyed draws (their own streams and purposes, ``"edge:<purpose>"``: the devices' draws
        #: stay those of the star at a seed); None without edge servers.
        self.edge_streams: Streams | None = Streams(seed, len(edge_keys)) if edge_keys else None

        dev_default = device_compute or ShiftedExponential(0.5)
        srv_default = server_compute or Deterministic()
        edge_index = {key: len(device_keys) + 1 + e for e, key in enumerate(edge_keys)}
        #: Each device's and edge server's parent in the hierarchy, by index (the server's, or an edge server's);
        #: empty without edge servers (every device's parent is the server).
        self.parent: dict[int, int] = {}
        self.devices: list[Node] = []
        for i, key in enumerate(device_keys):
            attrs = dict(graph.nodes[key])
            up_to = servers[0]
            if not graph.has_edge(key, servers[0]):
                at = [k for k in graph.neighbors(key) if k in edge_index] if edge_keys else []
                if len(at) != 1:
                    raise ValueError(f"device {key!r} has no link to the server" if not at else
                                     f"device {key!r} is linked to {len(at)} edge servers {at[:3]}; it needs one")
                up_to = at[0]
                self.parent[i] = edge_index[up_to]
            elif edge_keys:
                self.parent[i] = len(device_keys)
            e = {**{k: attrs[k] for k in _LINK_KEYS if k in attrs}, **graph.edges[key, up_to]}
            for k in _LINK_KEYS:
                attrs.pop(k, None)
            up, down = self._duplex(e, f"device {key!r}")
            self.devices.append(Node(
                index=i, name=key, role="device",
                mac_rate=_positive(attrs.pop("mac_rate", None), f"mac_rate of device {key!r}"),
                compute_model=attrs.pop("compute", None) or dev_default,
                cpu=Slot(self.env), uplink=up, downlink=down,
                attrs={k: v for k, v in attrs.items() if k != "role"}))
        sattrs = dict(graph.nodes[servers[0]])
        self.server = Node(
            index=len(self.devices), name=servers[0], role="server",
            mac_rate=_positive(sattrs.pop("mac_rate", None), "mac_rate of the server"),
            compute_model=sattrs.pop("compute", None) or srv_default,
            cpu=Slot(self.env),
            attrs={k: v for k, v in sattrs.items() if k != "role"})
        #: The edge servers (``role="edge"``), indices ``D+1, D+2, ...``; empty: the star (module docstring).
        self.edge_servers: list[Node] = []
        for e, key in enumerate(edge_keys):
            attrs = dict(graph.nodes[key])
            if not graph.has_edge(key, servers[0]):
                raise ValueError(f"edge server {key!r} has no backhaul link to the server")
            b = graph.edges[key, servers[0]]
            what = f"the backhaul of edge server {key!r}"
            latency = float(b.get("latency_s", 0.0))
            if not (math.isfinite(latency) and latency >= 0):
                raise ConfigError(f"latency_s of {what} must be finite and >= 0 seconds, got {latency!r}")
            up, down = self._duplex(b, what, latency)
            index = edge_index[key]
            self.parent[index] = len(device_keys)
            self.edge_servers.append(Node(
                index=index, name=key, role="edge",
                mac_rate=_positive(attrs.pop("mac_rate", None), f"mac_rate of edge server {key!r}"),
                compute_model=attrs.pop("compute", None) or srv_default,
                cpu=Slot(self.env), uplink=up, downlink=down,
                attrs={k: v for k, v in attrs.items() if k != "role"}))
        self.nodes: list[Node] = [*self.devices, self.server, *self.edge_servers]
        #: Each device's energy model (issue 28, item 4), from its node attributes ``tx_power_w``, ``rx_power_w`` (W
        #: while its radio sends / receives: joules = power x airtime) and ``j_per_mac`` (J per MAC: the standard
        #: ``kappa f^2`` per CPU cycle times cycles per MAC): ``{device index: (tx W, rx W, J/MAC)}``; empty: none
        #: (the papers'), and no ``energy_j`` trace column.
        self.energy: dict[int, tuple[float, float, float]] = {}
        for dev in self.devices:
            spec = [dev.attrs.get(k) for k in ("tx_power_w", "rx_power_w", "j_per_mac")]
            if any(v is not None for v in spec):
                vals = tuple(0.0 if v is None else float(v) for v in spec)
                if not all(math.isfinite(v) and v >= 0 for v in vals):
                    raise ConfigError(f"device {dev.name!r}: tx_power_w, rx_power_w and j_per_mac must be finite "
                                      f"and >= 0, got {spec}")
                self.energy[dev.index] = vals
        #: The shared cells by id: ``(uplink air, downlink air)`` (:mod:`fednet.sim.cells`; a
        #: :class:`~fednet.sim.cells.SharedAir` each under ``round_robin``, a
        #: :class:`~fednet.sim.cells.ProportionalFairAir` under ``proportional_fair``); empty: the star.
        self.cells: dict[Any, tuple[Any, Any]] = {}
        scheduler = graph.graph.get("cell_scheduler", "round_robin")
        for dev in self.devices:
            cell = dev.attrs.get("cell")
            if cell is None:
                continue
            if scheduler not in SCHEDULERS:
                raise ConfigError(f"cell_scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
            if cell not in self.cells:
                self.cells[cell] = (make_air(scheduler, self.env, f"cell {cell} uplink"),
                                    make_air(scheduler, self.env, f"cell {cell} downlink"))
            up_air, down_air = self.cells[cell]
            if scheduler == "round_robin":
                dev.uplink.air, dev.downlink.air = up_air, down_air
            else:                                   # proportional fair: each link at its own mean SNR
                dev.uplink.air = up_air.port(_mean_snr(dev, "snr_up_db", scheduler))
                dev.downlink.air = down_air.port(_mean_snr(dev, "snr_down_db", scheduler))
        index = {d.name: d.index for d in self.devices}
        #: Direct device-to-device links by (sender index, receiver index).
        self.d2d: dict[tuple[int, int], Link] = {}
        for u, v, e in graph.edges(data=True):
            if u in index and v in index:
                what = f"device-to-device link {u!r}-{v!r}"
                rate = _positive(e.get("rate_bps"), f"rate_bps of the {what}")
                loss_ = _probability(e.get("loss", 0.0), f"loss of the {what}")
                pairs = [(u, v)] if graph.is_directed() else [(u, v), (v, u)]
                for a, b in pairs:
                    self.d2d[index[a], index[b]] = Link(rate, loss_, Slot(self.env))
        self.counters = Counters()
        self.round = 0
        #: Repetition of the current round's phase (a setup attempt, set by the protocol's run loop):
        #: the default ``phase`` of :meth:`available`.
        self.phase = 0
        # availability of each device, drawn once per round (round 0: the setup phase); -1 = not drawn
        self._available: dict[tuple[int, int], np.ndarray] = {}
        # _node_entry: (node ids) -> (STAMP.value when made, the nodes, their table or None, their resources, slots)
        self._tables: dict[tuple[int, ...], tuple[int, list[Node], np.ndarray | None, list[Any], bool]] = {}

    # -- helpers ------------------------------------------------------------------------
    def _duplex(self, e: dict, what: str, latency_s: float = 0.0) -> tuple[Link, Link]:
        """The uplink and downlink of an edge's attributes ``e`` (``uplink_bps``, ``downlink_bps``, ``loss`` or
        ``uplink_loss`` / ``downlink_loss``), checked, errors naming ``what`` (a device, a backhaul)."""
        loss = e.get("loss", 0.0)
        up = Link(_positive(e.get("uplink_bps"), f"uplink_bps of {what}"),
                  _probability(e.get("uplink_loss", loss), f"uplink loss of {what}"), Slot(self.env),
                  latency_s=latency_s)
        down = Link(_positive(e.get("downlink_bps"), f"downlink_bps of {what}"),
                    _probability(e.get("downlink_loss", loss), f"downlink loss of {what}"), Slot(self.env),
                    latency_s=latency_s)
        return up, down

    @property
    def now(self) -> float:
        """Current simulated time in seconds."""
        return float(self.env.now)

    @property
    def n_devices(self) -> int:
        """Number of devices D."""
        return len(self.devices)

    def node(self, index: int) -> Node:
        """The node with this index (devices ``0..D-1``, server ``D``)."""
        return self.nodes[index]

    def node_table(self, nodes: Sequence[Node]) -> np.ndarray | None:
        """The timing parameters of ``nodes`` as one read-only float table, or None where a vector replay cannot use it.

        Row ``p`` is node ``p``'s ``(index, downlink rate, downlink loss, uplink rate, uplink loss, MAC rate,
        setup fraction)`` in bit/s, probabilities and MAC/s, the setup fraction -1 for a
        :class:`~fednet.sim.compute.Deterministic` compute model. None where a node is the server or has another
        compute model (and for an edge server). Kept between calls with the same nodes while no node, link or compute model attribute was
        assigned (:data:`fednet.sim.stamp.STAMP`): a replay reads it every round.

        Parameters
        ----------
        nodes : sequence of Node

        Returns
        -------
        ndarray of float64, (len(nodes), 7), or None
        """
        return self._node_entry(nodes)[2]

    def idle(self, nodes: Sequence[Node], *, settled: bool = False) -> bool:
        """Whether every processor and link of ``nodes`` is free: no holder, nobody queued.

        ``settled``: the caller knows that no release whose resource has a queue is pending
        (:func:`fednet.sim.engine.events.alone`). A request waits only behind a holder, or at a
        resource just released whose release event has yet to run; so then, when no :class:`Slot` of this
        simulation is held (``env.held``) and the nodes' resources are all its slots, every one is free, and
        none is looked at.
        """
        entry = self._node_entry(nodes)
        if settled and entry[4] and self.env.held == 0:
            return True
        return not any(r.users or r.queue for r in entry[3])

    def _node_entry(self, nodes: Sequence[Node]) -> tuple[int, list[Node], np.ndarray | None, list[Any], bool]:
        """``(STAMP.value, nodes, node_table, [cpu, downlink, uplink resources of each node], all of them this
        simulation's slots)``, kept as :meth:`node_table` says."""
        key = tuple(map(id, nodes))
        hit = self._tables.get(key)
        if hit is not None and hit[0] == STAMP.value:
            return hit
        rows: list[tuple] | None = []                  # None once a node has no row (the server, another model)
        resources: list[Any] = []
        for node in nodes:
            down, up = node.downlink, node.uplink
            resources += (node.cpu, *(link.resource for link in (down, up) if link is not None))
            model = node.compute_model
            kind = type(model)
            if rows is None or node.role != "device" or (kind is not ShiftedExponential and kind is not Deterministic):
                rows = None
                continue
            rows.append((node.index, down.rate_bps, down.loss, up.rate_bps, up.loss, node.mac_rate,
                         model.setup_fraction if kind is ShiftedExponential else -1.0))
        table: np.ndarray | None = None
        if rows is not None:
            table = np.array(rows, dtype=float).reshape(len(rows), 7)
            table.flags.writeable = False
        if len(self._tables) >= 16:                      # a handful of node sets a run replays
            self._tables.pop(next(iter(self._tables)))
        slots = all(type(r) is Slot and r._env is self.env for r in resources)
        entry = self._tables[key] = (STAMP.value, list(nodes), table, resources, slots)   # nodes kept: ids stay theirs
        return entry

    def take_counters(self) -> Counters:
        """Return the counters accumulated so far and start new ones."""
        c, self.counters = self.counters, Counters()
        return c

    def rng(self, node: Node | int, purpose: str, *more: int | str) -> np.random.Generator:
        """An independent *public* sequential stream for (node, purpose, ...): data sampling, codes.

        Derived from the public seed: never use it for secrets (pads, masks, shares); see
        :meth:`secret_rng`.
        """
        idx = node.index if isinstance(node, Node) else int(node)
        return self.streams.generator(idx, purpose, *more)

    def secret_rng(self, node: Node | int, purpose: str, *more: int | str) -> np.random.Generator:
        """An independent *secret* stream for (node, purpose, ...): pads, masks, noise, Shamir coefficients.

        Rooted in OS entropy or the ``secret_seed`` (never the public seed); see
        :meth:`fednet.sim.rng.Streams.secret`.
        """
        idx = node.index if isinstance(node, Node) else int(node)
        return self.streams.secret(idx, purpose, *more)

    def available(self, node: Node, round: int | None = None, *, phase: int | None = None) -> bool:
        """Whether a device takes part in a round under the availability model (the server, edge servers: always).

        The availability of a device in a round is drawn once -- the first keyed uniform of
        ``(device, "dropout", round)`` -- and every later question about the same device and round
        reads the same answer.  Round 0 is the setup phase; ``phase = a >= 1`` asks about the
        ``a``-th repetition of a phase of that round (a setup attempt), drawn under the purpose
        ``"dropout-setup-a"``, also once.  ``round`` and ``phase`` default to the current ones
        (:attr:`round`, :attr:`phase`), so a step of a repeated setup attempt reads that attempt's draw.

        Raises
        ------
        ValueError
            For a negative ``round`` or ``phase``.
        """
        if node.role != "device":
            return True
        phase = self.phase if phase is None else int(phase)
        r = self.round if round is None else int(round)
        if r < 0:
            raise ValueError(f"round must be non-negative, got {r}")
        if phase < 0:
            raise ValueError(f"phase must be non-negative, got {phase}")
        key = (r, int(phase))
        flags = self._available.get(key)
        if flags is None:
            flags = self._available[key] = np.full(self.n_devices, -1, dtype=np.int8)
        i = node.index
        if flags[i] < 0:
            purpose = "dropout" if phase == 0 else f"dropout-setup-{phase}"
            flags[i] = bool(self.availability.available(
                i, r, lambda: self.streams.uniform(i, purpose, r)))
        return bool(flags[i])

    def available_many(self, nodes: Sequence[Node], round: int | None = None, *,
                       phase: int | None = None) -> np.ndarray:
        """:meth:`available` of each of ``nodes`` at once: a bool array, (len(nodes),).

        The same draws as :meth:`available` (one keyed uniform of ``(device, "dropout", round)`` per
        device not yet asked, for :class:`~fednet.sim.compute.BernoulliDropout`; none for
        :class:`~fednet.sim.compute.AlwaysAvailable`), drawn as one vector; other availability models
        are asked device by device.
        """
        if type(self).available is not _AVAILABLE:               # an override must see every question
            return np.array([self.available(node, round, phase=phase) for node in nodes], dtype=bool)
        out = np.ones(len(nodes), dtype=bool)
        phase_ = self.phase if phase is None else int(phase)
        r = self.round if round is None else int(round)
        if type(self.availability) is AlwaysAvailable and r >= 0 and phase_ >= 0:
            return out                                              # nothing to draw (or to remember)
        dev = [p for p, node in enumerate(nodes) if node.role == "device"]
        if not dev:
            return out
        if r < 0 or phase_ < 0:
            self.available(nodes[dev[0]], round, phase=phase)      # raises the named error
        key = (r, phase_)
        flags = self._available.get(key)
        if flags is None:
            flags = self._available[key] = np.full(self.n_devices, -1, dtype=np.int8)
        idx = np.fromiter((nodes[p].index for p in dev), dtype=np.intp, count=len(dev))
        missing = np.unique(idx[flags[idx] < 0])
        if missing.size:
            model = self.availability
            if type(model) is BernoulliDropout and model.p == 0.0:
                flags[missing] = 1
            elif type(model) is BernoulliDropout:
                purpose = "dropout" if phase_ == 0 else f"dropout-setup-{phase_}"
                flags[missing] = self.streams.uniforms(missing, purpose, r) >= model.p
            else:
                for i in missing:
                    self.available(self.devices[int(i)], r, phase=phase_)
        out[dev] = flags[idx] > 0
        return out

    def absent(self, round: int | None = None, *, phase: int | None = None) -> list[int]:
        """Indices of the devices absent in ``round`` and ``phase`` (default: the current ones), drawn as in
        :meth:`available`."""
        return [dev.index for dev in self.devices if not self.available(dev, round, phase=phase)]

    # -- timed operations -----------------------------------------------------------------
    def hop_draw(self, msg: Message, device: Node, direction: str) -> tuple[float, int]:
        """The keyed draw of one hop of ``msg`` on ``device``'s uplink or downlink: (seconds, retransmissions).

        Consumes the next keyed uniform of (device, "uplink"/"downlink", msg.round) -- for an edge server's backhaul,
        of (edge server, "edge:backhaul_up"/"edge:backhaul_down", msg.round) in :attr:`edge_streams`; the link's
        occupation time follows :func:`~fednet.sim.network.transmission_time`.
        """
        link = device.uplink if direction == "up" else device.downlink
        purpose = "uplink" if direction == "up" else "downlink"
        if device.role == "edge":                  # a backhaul hop: the edge servers' own keyed streams
            purpose = "edge:backhaul_up" if direction == "up" else "edge:backhaul_down"
            u = self.edge_streams.uniform(device.index - self.n_devices - 1,
                                          f"{purpose}:{msg.timing_key}" if msg.timing_key else purpose, msg.round)
        else:
            u = self.streams.uniform(device.index, f"{purpose}:{msg.timing_key}" if msg.timing_key else purpose,
                                     msg.round)
        seconds, _n, extra = transmission_time(msg.bits, link.rate_bps, self.overhead, link.loss,
                                               self.packet_bits, u)
        return seconds, extra

    def hop_done(self, msg: Message, device: Node, direction: str, extra: int, start: float, end: float) -> None:
        """Account a finished hop (``start`` .. ``end`` simulated seconds): counters and ``msg.hops``."""
        if direction == "up":
            self.counters.bits_up += msg.bits
        else:
            self.counters.bits_down += msg.bits
        self.counters.messages += 1
        self.counters.retransmissions += extra
        msg.hops.append((direction, device.index, start, end))

    def _hop(self, msg: Message, device: Node, direction: str) -> Generator:
        link = device.uplink if direction == "up" else device.downlink
        with link.resource.request() as req:
            yield req
            seconds, extra = self.hop_draw(msg, device, direction)
            start = self.now
            held = None
            try:
                if link.air is None:
                    yield self.env.timeout(seconds)
                else:                               # a shared cell: the airtime is served by its scheduler
                    held = yield from link.air.transmit(seconds)
            except simpy.Interrupt as stop:         # cancelled: its radio was on until now (issue 28, item 4)
                self._radio_energy(device, direction, getattr(stop, "held_s", self.now - start))
                raise
        self.hop_done(msg, device, direction, extra, start, self.now)
        # round robin: the airtime at its own rate; proportional fair: the slots it held (fewer, at higher rates)
        self._radio_energy(device, direction, seconds if held is None else held)
        if self.hop_latency:                        # the floor: scheduling, grant and core latency (link free)
            yield self.env.timeout(self.hop_latency)

    def _radio_energy(self, device: Node, direction: str, seconds: float) -> None:
        """Charge ``device``'s radio for ``seconds`` of its own airtime (transmit power up, receive power down), if it
        has an energy model: a finished hop's airtime, or a cancelled one's until it was cancelled (on a dedicated
        link the time since it started; on a cell the airtime it was served, ``held_s`` of the interrupt,
        :meth:`fednet.sim.cells.SharedAir._leave`)."""
        if self.energy and device.index in self.energy:   # its radio is on for its own airtime only
            tx, rx, _ = self.energy[device.index]
            self.counters.device_energy_j += (tx if direction == "up" else rx) * seconds

    def _d2d_energy(self, src: Node, dst: int, seconds: float) -> None:
        """Charge a device-to-device hop's ``seconds``: the sender's transmit and the receiver's receive power."""
        if self.energy:
            self.counters.device_energy_j += (self.energy.get(src.index, (0.0, 0.0, 0.0))[0]
                                              + self.energy.get(dst, (0.0, 0.0, 0.0))[1]) * seconds

    def _direct_hop(self, msg: Message, link: Link, src: Node) -> Generator:
        with link.resource.request() as req:
            yield req
            u = self.streams.uniform(src.index, "d2d", msg.round)
            seconds, _n, extra = transmission_time(msg.bits, link.rate_bps, self.overhead, link.loss,
                                                   self.packet_bits, u)
            start = self.now
            try:
                yield self.env.timeout(seconds)
            except simpy.Interrupt:             # cancelled: both radios were on until now
                self._d2d_energy(src, msg.dst, self.now - start)
                raise
        self.counters.bits_d2d += msg.bits
        self.counters.messages += 1
        self.counters.retransmissions += extra
        msg.hops.append(("d2d", src.index, start, self.now))
        self._d2d_energy(src, msg.dst, seconds)
        if self.hop_latency:
            yield self.env.timeout(self.hop_latency)

    def _backhaul_hop(self, msg: Message, edge: Node, direction: str) -> Generator:
        """One hop of ``msg`` on an edge server's backhaul (module docstring): its link for the keyed transmission
        time, then the backhaul's ``latency_s`` with the link free."""
        link = edge.uplink if direction == "up" else edge.downlink
        with link.resource.request() as req:
            yield req
            seconds, extra = self.hop_draw(msg, edge, direction)
            start = self.now
            yield self.env.timeout(seconds)
        self.counters.bits_backhaul += msg.bits
        self.counters.messages += 1
        self.counters.retransmissions += extra
        msg.hops.append((f"backhaul_{direction}", edge.index, start, self.now))
        if link.latency_s:
            yield self.env.timeout(link.latency_s)

    def route(self, src: Node, dst: Node) -> tuple[list[Node], list[Node]]:
        """The hops of a message from ``src`` to ``dst`` in a hierarchy: ``(up, down)``.

        ``up`` are the nodes whose uplinks it climbs (from ``src`` to the lowest node it shares with ``dst``),
        ``down`` those whose downlinks it descends, in order. In the star: a device's own link one way, both
        links of a device-to-device message.
        """
        def chain(node: Node) -> list[int]:
            out = [node.index]
            while out[-1] != self.server.index:
                out.append(self.parent.get(out[-1], self.server.index))
            return out
        a, b = chain(src), chain(dst)
        shared = set(b)
        top = next(i for i in a if i in shared)
        up = [self.nodes[i] for i in a[:a.index(top)]]
        down = [self.nodes[i] for i in reversed(b[:b.index(top)])]
        return up, down

    def _routed(self, msg: Message, src: Node, dst: Node) -> Generator[Any, Any, Message]:
        """:meth:`transfer` in a hierarchy: up the tree, then down (module docstring). A device-to-device message
        is end-to-end encrypted; every node it passes through on the way files it in its ``relayed`` list (it sees
        the size and the endpoints), as the star's server does."""
        up, down = self.route(src, dst)
        if src.role == "device" and dst.role == "device":
            msg.encrypted = True
        hops = [(node, "up") for node in up] + [(node, "down") for node in down]
        for node, direction in hops:
            yield from (self._backhaul_hop(msg, node, direction) if node.role == "edge"
                        else self._hop(msg, node, direction))
            at = self.nodes[self.parent.get(node.index, self.server.index)] if direction == "up" else node
            if at is not dst and self.record_views:
                at.relayed.append(msg)
        self.deliver(msg, self.now)
        return msg

    def transfer(self, msg: Message) -> Generator[Any, Any, Message]:
        """Move a message to its destination (``yield from``); returns it once delivered.

        Device to server uses the device's uplink, server to device its downlink, and device to
        device both in turn (relayed through the server; such messages are end-to-end encrypted,
        Sec. III-B, so the server records them in ``relayed``, not in its ``view``) -- or, where the
        topology has a device-to-device edge between them, that direct link (keyed draw ``"d2d"``
        of the sender; the server sees nothing). With edge servers, the path of :meth:`route` (module
        docstring).
        """
        if msg.src == msg.dst:
            raise ValueError(f"message {msg.kind!r} from node {msg.src} to itself")
        src, dst = self.nodes[msg.src], self.nodes[msg.dst]
        msg.sent_at = self.now
        direct = self.d2d.get((src.index, dst.index)) if self.d2d else None
        if direct is not None:
            msg.encrypted = True
            yield from self._direct_hop(msg, direct, src)
            msg.delivered_at = self.now
            if self.record_views:
                dst.view.append(msg)
            return msg
        if self.edge_servers:                       # a hierarchy: along the tree
            return (yield from self._routed(msg, src, dst))
        if not src.is_server:
            yield from self._hop(msg, src, "up")
            if not dst.is_server:
                msg.encrypted = True
                if self.record_views:
                    self.server.relayed.append(msg)
        if not dst.is_server:
            yield from self._hop(msg, dst, "down")
        self.deliver(msg, self.now)
        return msg

    def deliver(self, msg: Message, at: float) -> None:
        """Mark a relayed or server-to-device message delivered at ``at`` seconds and file it in the receiver's view."""
        msg.delivered_at = at
        if self.record_views:
            dst = self.nodes[msg.dst]
            (dst.relayed if dst.is_server and msg.encrypted else dst.view).append(msg)

    def compute(self, node: Node, fn: Callable[..., Any] | None, *args: Any,
                macs: int | None = None, round: int | None = None, timing_key: str = "compute",
                **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on ``node`` and hold its processor for the charged time.

        The MACs are those counted by the meter while ``fn`` ran; ``macs=`` adds a known count
        instead (timing-only mode replays counts metered in a real run). Returns ``fn``'s result.
        The random part of the time is the next keyed draw of ``(node, timing_key, round)``: the
        training step of every protocol uses the default key ``"compute"``, and steps that only
        some protocols have (mask encoding, say) use their own key, so that the training steps of
        two protocols at one seed straggle alike (a paired comparison).
        """
        r = self.round if round is None else round
        with node.cpu.request() as req:
            yield req
            result, seconds = self.compute_now(node, fn, args, kwargs, macs, r, timing_key=timing_key)
            if seconds > 0:
                yield self.env.timeout(seconds)
        return result

    def compute_now(self, node: Node, fn: Callable[..., Any] | None, args: tuple, kwargs: dict,
                    macs: int | None = None, round: int | None = None, *,
                    timing_key: str = "compute") -> tuple[Any, float]:
        """The body of :meth:`compute` once the processor is held: run ``fn`` metered, draw, count.

        The random part of the time is the next keyed draw of ``(node, timing_key, round)``.
        Returns ``(result, seconds)``; the caller holds the processor for ``seconds`` (when > 0).
        """
        r = self.round if round is None else round
        meter = MacMeter()
        result = None
        if fn is not None:
            with meter:
                result = fn(*args, **kwargs)
        total = meter.macs + (int(macs) if macs is not None else 0)
        if node.role == "edge":                      # its own keyed streams (module docstring)
            seconds = node.compute_model.duration(
                node.index, r, total, node.mac_rate,
                lambda: self.edge_streams.standard_exponential(node.index - self.n_devices - 1,
                                                               f"edge:{timing_key}", r))
            self.counters.edge_macs += total
            return result, seconds
        seconds = node.compute_model.duration(
            node.index, r, total, node.mac_rate,
            lambda: self.streams.standard_exponential(node.index, timing_key, r))
        if node.is_server:
            self.counters.server_macs += total
        else:
            self.counters.device_macs += total
            if self.energy and node.index in self.energy:
                self.counters.device_energy_j += self.energy[node.index][2] * total
        return result, seconds

    def run(self, process: Generator, until: float | None = None) -> Any:
        """Run a top-level generator as a SimPy process to completion; returns its value."""
        proc = self.env.process(process)
        self.env.run(until=proc if until is None else until)
        return proc.value if proc.triggered else None


#: :meth:`Simulation.available` as defined here (:meth:`Simulation.available_many` defers to an override).
_AVAILABLE = Simulation.available
