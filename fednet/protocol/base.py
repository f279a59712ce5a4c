"""The ``Protocol`` base class: a setup phase, repeated rounds, and SimPy primitives.

A protocol is a state machine written as two generators, :meth:`Protocol.setup` and
:meth:`Protocol.round`, that read like the paper's algorithm box. Math is done by pure
functions (arrays in, arrays out, metered kernels inside); time is advanced only by the
primitives below, used with ``yield from``:

==========================  ============================================================
:meth:`~Protocol.send`       one message (device to server, server to device, or device to
                             device relayed through the server)
:meth:`~Protocol.broadcast`  the server sends one payload to many devices in parallel
:meth:`~Protocol.send_all`   many messages: all at once (links queue them) or in steps with
                             a barrier between steps (successive relays, aggregation trees)
:meth:`~Protocol.compute_each`  a computation on each of a set of nodes, in parallel
:meth:`~Protocol.gather`     download, compute, upload on each node; returns the first
                             ``first`` results to reach the server and cancels the rest
:meth:`~Protocol.server_compute`  a computation on the server
==========================  ============================================================

A node's computation may use only its own ``state`` and the messages it received; every
message a node receives is appended to its ``view`` (see :class:`fednet.sim.Node`) so tests
can check what a coalition of nodes, or the server, could learn.

Each finished round appends a record to the trace (simulated time, accuracy, loss, bits up and
down, MACs per role, the devices whose results were used); round 0 is the setup phase.

Dropouts in the setup phase: the availability model is consulted for the setup phase too (round 0,
one draw per device and setup attempt), and each protocol declares its reaction in
:attr:`Protocol.setup_dropouts`:

``"none"``
    The setup exchanges nothing (conventional FL, LightSecAgg: masks are drawn each round);
    absent devices are only recorded (``setup_absent``).
``"offline"``
    The setup's exchange happens offline, before training, where the paper's straggler model does
    not apply (approximate gradient coding's data sharing, Makkonen et al. Sec. III-A); recorded only.
``"reshare"`` (default)
    The setup needs every device (pads or shares along the code, Shamir shares, parity uploads):
    if devices are absent, the setup phase is run again until every device has been present in
    at least one attempt (the server stores the encrypted shares addressed to an absent device
    until it returns), at most :attr:`Protocol.max_setup_attempts` attempts; then
    :class:`SetupFailure`.  Each further attempt is charged a full setup phase (time and traffic:
    a conservative bound, the absentees being detected when a phase ends).
    Attempt ``a >= 1`` draws availability under the purpose ``"dropout-setup-a"``, round 0; the
    number of attempts is recorded (``setup_attempts`` on the round-0 trace row whenever an
    availability model is set).
``"fail"``
    Any absent device fails the setup with :class:`SetupFailure`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import simpy
from pydantic import BaseModel, ConfigDict

from fednet.errors import DecodeFailure
from fednet.learning.task import LearningTask
from fednet.sim.compute import AlwaysAvailable
from fednet.sim.network import Message
from fednet.sim.simulation import Node, Simulation

from . import registry

__all__ = ["Protocol", "ProtocolConfig", "Outgoing", "StragglerShortfall", "SetupFailure", "payload_size"]

SETUP_DROPOUT_REACTIONS = ("none", "offline", "reshare", "fail")


class ProtocolConfig(BaseModel):
    """Base of every protocol's parameters (unknown keys are rejected).

    Attributes
    ----------
    element_bits : int
        Width in bits of one transmitted number (32: float32 as in Sec. VII for the baselines).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    element_bits: int = 32


class StragglerShortfall(RuntimeError):
    """Fewer nodes responded than a :meth:`Protocol.gather` needed."""


class SetupFailure(DecodeFailure):
    """The setup phase could not complete: devices were absent (see :attr:`Protocol.setup_dropouts`)."""


def payload_size(payload: Any) -> int:
    """Number of numbers in a payload: an array's size, or the sum over a tuple/list/dict of arrays."""
    if isinstance(payload, np.ndarray):
        return int(payload.size)
    if isinstance(payload, (tuple, list)):
        return sum(payload_size(p) for p in payload)
    if isinstance(payload, dict):
        return sum(payload_size(p) for p in payload.values())
    if isinstance(payload, (int, float, np.number)):
        return 1
    if hasattr(payload, "size"):
        return int(payload.size)
    raise TypeError(f"cannot size a payload of type {type(payload).__name__}; pass n_elements")


@dataclass
class Outgoing:
    """A message to be sent by :meth:`Protocol.send_all`.

    Attributes
    ----------
    src, dst : Node
    payload : Any
    kind : str
    n_elements : int or None
        Defaults to :func:`payload_size` of the payload.
    element_bits : int or None
        Defaults to the protocol's ``element_bits``.
    """

    src: Node
    dst: Node
    payload: Any
    kind: str
    n_elements: int | None = None
    element_bits: int | None = None


class Protocol:
    """Base class of every protocol (module docstring for the primitives).

    Subclasses set ``name`` (registry key) and ``Config`` (a :class:`ProtocolConfig`
    subclass), and implement :meth:`round` and, if they have one, :meth:`setup`.

    Parameters
    ----------
    sim : Simulation
        The network and its clock.
    task : LearningTask
        Local data, test set and hyperparameters; device ``i`` of the task lives on node ``i``.
    config : ProtocolConfig or dict, optional
        The protocol's parameters (validated by ``Config``).
    label : str, optional
        Name of this run in traces (defaults to ``name``).

    Attributes
    ----------
    theta : ndarray, (d, c)
        The global model, held by the server.
    used : list of int or None
        Devices whose results the current round used (set by the protocol).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[ProtocolConfig]] = ProtocolConfig
    #: Reaction to devices absent in the setup phase (module docstring): "none", "offline",
    #: "reshare" or "fail".
    setup_dropouts: ClassVar[str] = "reshare"
    #: Most setup attempts under ``setup_dropouts = "reshare"`` before :class:`SetupFailure`.
    max_setup_attempts: ClassVar[int] = 100

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            registry.register(cls)

    def __init__(self, sim: Simulation, task: LearningTask, config: ProtocolConfig | dict | None = None,
                 *, label: str | None = None) -> None:
        if task.n_devices != sim.n_devices:
            raise ValueError(f"the task has data for {task.n_devices} devices but the network has {sim.n_devices}")
        if config is None:
            config = self.Config()
        elif isinstance(config, dict):
            config = self.Config.model_validate(config)
        elif not isinstance(config, self.Config):
            raise TypeError(f"config must be a {self.Config.__name__} or a dict, got {type(config).__name__}")
        self.sim = sim
        self.task = task
        self.config = config
        self.label = label or self.name
        self.theta = np.zeros((task.d, task.c))
        self.epoch = 0
        self.used: list[int] | None = None
        self.trace: list[dict[str, Any]] = []
        self.setup_absent: list[list[int]] = []
        self.setup_attempts = 0
        if self.setup_dropouts not in SETUP_DROPOUT_REACTIONS:
            raise ValueError(f"{type(self).__name__}.setup_dropouts must be one of {SETUP_DROPOUT_REACTIONS}, "
                             f"got {self.setup_dropouts!r}")
        self.validate()

    # -- to override ----------------------------------------------------------------------
    @classmethod
    def check(cls, config: ProtocolConfig, n_devices: int) -> None:
        """Check a configuration against the network size before anything runs.

        Called when a study is loaded (so a bad study fails before any output is written) and
        again when the protocol is built. Raise ``ValueError`` naming the parameter and value.
        """

    def validate(self) -> None:
        """Check the configuration against the network and task; raise ``ValueError`` if unfit.

        The default calls :meth:`check`; override to add checks that need the data.
        """
        type(self).check(self.config, self.sim.n_devices)

    def setup(self) -> Generator:
        """Phase 1 (round 0): nothing by default."""
        return
        yield  # pragma: no cover

    def round(self, epoch: int) -> Generator:
        """One training round (epoch ``epoch`` >= 1): must advance ``theta``."""
        raise NotImplementedError
        yield  # pragma: no cover

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss of the current model (not charged: the observer's work)."""
        return self.task.evaluate(self.theta)

    def round_metrics(self, round: int) -> dict[str, Any]:
        """Protocol-specific columns added to the trace row of ``round`` (none by default).

        The study runner writes every column a protocol returns here to ``trace.csv`` after the
        standard ones.
        """
        return {}

    # -- shorthands -------------------------------------------------------------------------
    @property
    def env(self) -> simpy.Environment:
        """The SimPy environment of the simulation."""
        return self.sim.env

    @property
    def server(self) -> Node:
        """The server node."""
        return self.sim.server

    @property
    def devices(self) -> list[Node]:
        """The device nodes, in index order."""
        return self.sim.devices

    @property
    def element_bits(self) -> int:
        """Wire width in bits of one number (the config's ``element_bits``)."""
        return self.config.element_bits

    def minibatch_rows(self, dev: Node, batch: int, epoch: int | None = None) -> np.ndarray:
        """Device ``dev``'s minibatch of ``batch`` of its points in round ``epoch`` (default: the current one).

        Drawn without replacement from the public stream keyed ``(device, "minibatch", epoch)``, so
        every protocol that samples minibatches sees the same rows at a seed (paired comparisons),
        whichever earlier rounds the device took part in.

        Returns
        -------
        ndarray of int, (batch,)
        """
        n = self.task.X[dev.index].shape[0]
        e = self.epoch if epoch is None else epoch
        return self.sim.rng(dev, "minibatch", e).choice(n, size=batch, replace=False)

    def step(self, gradient_sum: np.ndarray, m_used: int) -> None:
        """The update of eqs. (4)-(5): ``theta -= mu (G / m_used + lambda theta)``.

        Parameters
        ----------
        gradient_sum : ndarray, (d, c)
            ``G = sum_i G_i`` of eq. (3) over the devices used.
        m_used : int
            Number of training points behind ``G`` (``m`` when every device contributed).
        """
        mu = self.task.step_size(self.epoch)
        self.theta = self.theta - mu * (gradient_sum / m_used + self.task.weight_decay * self.theta)

    # -- primitives -------------------------------------------------------------------------
    def _message(self, src: Node, dst: Node, payload: Any, kind: str, n_elements: int | None,
                 element_bits: int | None, encrypted: bool = False, timing_key: str = "") -> Message:
        return Message(src.index, dst.index, kind, payload,
                       payload_size(payload) if n_elements is None else int(n_elements),
                       element_bits or self.element_bits, round=self.sim.round, encrypted=encrypted,
                       timing_key=timing_key)

    def send(self, src: Node, dst: Node, payload: Any, *, kind: str, n_elements: int | None = None,
             element_bits: int | None = None, encrypted: bool = False,
             timing_key: str = "") -> Generator[Any, Any, Message]:
        """Send one message and wait until it is delivered; returns the :class:`Message`.

        ``encrypted=True`` marks a message to the server that the server only stores and
        forwards (end-to-end encrypted for other devices): it goes to the server's ``relayed``
        list, not its view. Device-to-device messages are always encrypted.  ``timing_key``
        gives a message that only this protocol sends its own keyed loss draws
        (:class:`fednet.sim.network.Message`), leaving the model download and the gradient upload
        on the shared ones.
        """
        msg = self._message(src, dst, payload, kind, n_elements, element_bits, encrypted, timing_key)
        return (yield from self.sim.transfer(msg))

    def broadcast(self, payload: Any, *, kind: str, to: Iterable[Node] | None = None,
                  n_elements: int | None = None, element_bits: int | None = None) -> Generator:
        """Send ``payload`` from the server to every device in ``to`` (default: all) in parallel.

        Each device's downlink is its own resource, so this lasts as long as the slowest
        download. Returns the delivered messages, in the order of ``to``.
        """
        targets = list(self.devices if to is None else to)
        procs = [self.env.process(self.send(self.server, dev, payload, kind=kind, n_elements=n_elements,
                                            element_bits=element_bits)) for dev in targets]
        yield self.env.all_of(procs)
        return [p.value for p in procs]

    def send_all(self, steps: Sequence[Sequence[Outgoing]], *, barrier: bool = True) -> Generator:
        """Send messages in steps.

        Parameters
        ----------
        steps : sequence of sequences of Outgoing
            With ``barrier=True`` every message of a step is sent in parallel and the next step
            starts when the whole step is delivered (a synchronous schedule). With
            ``barrier=False`` all messages are launched at once, in order, and each link serves
            its queue first come, first served (each transfer starts as soon as its link is free).

        Returns
        -------
        list of list of Message
            The delivered messages, step by step.
        """
        out: list[list[Message]] = []
        if barrier:
            for step in steps:
                procs = [self.env.process(self.send(o.src, o.dst, o.payload, kind=o.kind, n_elements=o.n_elements,
                                                    element_bits=o.element_bits)) for o in step]
                yield self.env.all_of(procs)
                out.append([p.value for p in procs])
        else:
            launched = [[self.env.process(self.send(o.src, o.dst, o.payload, kind=o.kind, n_elements=o.n_elements,
                                                    element_bits=o.element_bits)) for o in step] for step in steps]
            yield self.env.all_of([p for step in launched for p in step])
            out = [[p.value for p in step] for step in launched]
        return out

    def compute_each(self, nodes: Iterable[Node], fn: Callable[[Node], Any], *,
                     macs: Callable[[Node], int] | None = None) -> Generator:
        """Run ``fn(node)`` on every node in parallel (each on its own processor); wait for all.

        ``macs(node)``, if given, adds a known MAC count (timing-only mode). Returns a dict
        ``{node.index: result}``.
        """
        nodes = list(nodes)
        procs = [self.env.process(self.sim.compute(n, fn, n, macs=None if macs is None else macs(n)))
                 for n in nodes]
        yield self.env.all_of(procs)
        return {n.index: p.value for n, p in zip(nodes, procs)}

    def server_compute(self, fn: Callable[..., Any] | None, *args: Any, macs: int | None = None,
                       **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on the server; returns its result."""
        return (yield from self.sim.compute(self.server, fn, *args, macs=macs, **kwargs))

    def gather(self, nodes: Iterable[Node], fn: Callable[[Node], Any] | None, *, kind: str,
               first: int | None = None, download: Any = None, download_kind: str = "model",
               download_elements: int | None = None, download_bits: int | None = None,
               upload_elements: int | Callable[[Any], int] | None = None, upload_bits: int | None = None,
               macs: Callable[[Node], int] | None = None, deadline: float | None = None) -> Generator:
        """Each node: receive ``download`` (if given), compute ``fn(node)``, upload the result.

        Nodes work in parallel, each starting its computation as soon as its own download
        arrives; the downloaded payload is in ``node.state.received`` when ``fn`` runs.
        Devices that the availability model marks absent this round take no part.
        When ``first`` results have reached the server, the remaining nodes are cancelled
        (their partial transfers and computations end; the round does not wait for them).

        Parameters
        ----------
        nodes : iterable of Node
        fn : callable(Node) -> Any, or None
            The node's computation (its result is uploaded). None computes nothing (timing-only
            mode with ``macs``).
        kind : str
            Kind of the uploaded messages.
        first : int, optional
            How many results to wait for (default: every available node).
        download : Any, optional
            Payload the server sends to each node first.
        upload_elements : int or callable(result) -> int, optional
            Size of an upload (default: :func:`payload_size` of the result).
        macs : callable(Node) -> int, optional
            MACs to charge in addition to those metered in ``fn``.
        deadline : float, optional
            Simulated seconds after which the server stops waiting: the results that arrived by
            then are returned (possibly fewer than ``first``) and the rest are cancelled.

        Returns
        -------
        list of (Node, Any)
            ``(node, result)`` in order of arrival at the server.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` nodes are available or finish (without a deadline).
        """
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, got {deadline}")
        nodes = [n for n in nodes if self.sim.available(n)]
        need = len(nodes) if first is None else int(first)
        if deadline is None and need > len(nodes):
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs {need} results but only "
                                     f"{len(nodes)} devices are available")
        arrived: list[tuple[Node, Any]] = []
        done = self.env.event()
        finished = 0

        def work(node: Node) -> Generator:
            nonlocal finished
            try:
                if download is not None:
                    msg = yield from self.send(self.server, node, download, kind=download_kind,
                                               n_elements=download_elements, element_bits=download_bits)
                    node.state.received = msg.payload
                result = yield from self.sim.compute(node, fn, node, macs=None if macs is None else macs(node))
                if callable(upload_elements):
                    size = upload_elements(result)
                elif upload_elements is not None:
                    size = upload_elements
                else:
                    size = payload_size(result)
                yield from self.send(node, self.server, result, kind=kind, n_elements=size, element_bits=upload_bits)
                arrived.append((node, result))
            except simpy.Interrupt:
                return
            finally:
                finished += 1
            if not done.triggered and (len(arrived) >= need or finished == len(nodes)):
                done.succeed()

        if need == 0 or not nodes:
            return []
        procs = [self.env.process(work(n)) for n in nodes]
        yield done if deadline is None else done | self.env.timeout(deadline)
        for p in procs:
            if p.is_alive:
                p.interrupt("cancelled: enough results arrived, or the deadline passed")
        if deadline is None and len(arrived) < need:
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs {need} results, got {len(arrived)}")
        return arrived[:need]

    # -- the run loop --------------------------------------------------------------------
    def _setup_absent(self, attempt: int) -> list[int]:
        """Devices absent in setup attempt ``attempt`` (one draw per device and attempt)."""
        if attempt == 0:
            return self.sim.absent(0)
        return [dev.index for dev in self.devices if not self.sim.available(dev, 0, phase=attempt)]

    def _setup_phase(self) -> Generator:
        """Run :meth:`setup` under the protocol's reaction to setup dropouts (module docstring)."""
        reaction = self.setup_dropouts
        self.setup_absent = [self._setup_absent(0)]
        self.setup_attempts = 1
        if reaction == "fail" and self.setup_absent[0]:
            raise SetupFailure(f"{self.label}: devices {self.setup_absent[0]} are absent in the setup phase "
                               f"and {type(self).__name__} fails its setup without them")
        yield from self.setup()
        if reaction != "reshare":
            return
        pending = set(self.setup_absent[0])          # devices not yet present in any attempt
        while pending:
            if self.setup_attempts >= self.max_setup_attempts:
                raise SetupFailure(
                    f"{self.label}: devices {sorted(pending)} were absent in each of {self.setup_attempts} setup "
                    f"attempts; max_setup_attempts = {self.max_setup_attempts}")
            self.setup_absent.append(self._setup_absent(self.setup_attempts))
            self.setup_attempts += 1
            pending &= set(self.setup_absent[-1])
            yield from self.setup()                   # a further attempt, charged as a full phase

    def _record(self, round: int) -> dict[str, Any]:
        acc, loss = self.evaluate()
        c = self.sim.take_counters()
        row = {
            "protocol": self.label, "seed": self.sim.seed, "round": round, "time_s": self.sim.now,
            "accuracy": acc, "loss": loss, "bits_up": c.bits_up, "bits_down": c.bits_down,
            "device_macs": c.device_macs, "server_macs": c.server_macs,
            "retransmissions": c.retransmissions,
            "used": "" if self.used is None else " ".join(map(str, sorted(self.used))),
        }
        if round == 0 and self.setup_dropouts == "reshare" and not isinstance(self.sim.availability, AlwaysAvailable):
            row["setup_attempts"] = self.setup_attempts
        row.update(self.round_metrics(round))
        self.trace.append(row)
        return row

    def run(self, epochs: int, *, stop_at: float | None = None,
            on_round: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run the setup phase and up to ``epochs`` rounds; returns the trace rows.

        Parameters
        ----------
        epochs : int
            Maximum number of rounds.
        stop_at : float, optional
            Stop after the first round whose test accuracy reaches this value.
        on_round : callable(row), optional
            Called after each round (progress bars).
        """
        if epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {epochs}")

        def main() -> Generator:
            self.sim.round = self.epoch = 0
            yield from self._setup_phase()
            row = self._record(0)
            if on_round:
                on_round(row)
            for e in range(1, epochs + 1):
                self.sim.round = self.epoch = e
                self.used = None
                yield from self.round(e)
                row = self._record(e)
                if on_round:
                    on_round(row)
                if stop_at is not None and row["accuracy"] >= stop_at:
                    break

        self.sim.run(main())
        return self.trace
