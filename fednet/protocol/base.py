"""The ``Protocol`` base class: a setup phase, repeated rounds, per-node state, the run loop.

A protocol is a state machine written as two generators, :meth:`Protocol.setup` and
:meth:`Protocol.round`, that read like the paper's algorithm box. Math is done by pure
functions (arrays in, arrays out, metered kernels inside) evaluated through the protocol's
mode object ``self.mode`` (:mod:`fednet.protocol.modes`: full or timing, one code path);
time is advanced only by the primitives of :mod:`fednet.protocol.primitives` (``send``,
``broadcast``, ``send_all``, ``exchange``, ``compute_each``, ``server_compute``, ``first_k``,
``gather``, ``tree_aggregate``), used with ``yield from``.

Per-node private state: a protocol names a dataclass ``State`` (a subclass of
:class:`NodeState`); every device's ``node.state`` is a fresh instance at construction (the
server gets ``ServerState``). A node's computation may use only its own ``state`` and the
messages it received; every message a node receives is appended to its ``view`` (see
:class:`fednet.sim.Node`) so tests can check what a coalition of nodes, or the server, could learn.

Each finished round appends a :class:`~fednet.protocol.trace.TraceRow` to the trace (simulated
time, accuracy, loss, bits up and down, MACs per role, the devices used and dropped); round 0 is
the setup phase.

Dropouts in the setup phase: the availability model is consulted for the setup phase too (round 0,
one draw per device and setup attempt, by :meth:`fednet.sim.Simulation.available`), and each
protocol declares its reaction in :attr:`Protocol.setup_dropouts`:

``"none"``
    The setup exchanges nothing (conventional FL, LightSecAgg: masks are drawn each round);
    absent devices are only recorded (``setup_absent``, and round 0's ``dropped``).
``"offline"``
    The setup's exchange happens offline, before training, where the paper's straggler model does
    not apply (approximate gradient coding's data sharing, Makkonen et al. Sec. III-A); recorded
    only, as for ``"none"``.
``"reshare"`` (default)
    The setup needs every device (pads or shares along the code, Shamir shares, parity uploads):
    if devices are absent, the setup phase is run again until every device has been present in
    at least one attempt (the server stores the encrypted shares addressed to an absent device
    until it returns), at most :attr:`Protocol.max_setup_attempts` attempts; then
    :class:`~fednet.errors.SetupFailure`.  Each further attempt is charged a full setup phase
    (time and traffic: a conservative bound, the absentees being detected when a phase ends).
    Attempt ``a >= 1`` draws availability under the purpose ``"dropout-setup-a"``, round 0; the
    number of attempts is recorded (``setup_attempts`` on the round-0 trace row whenever an
    availability model is set).
``"fail"``
    Any absent device fails the setup with :class:`~fednet.errors.SetupFailure`.
"""

from __future__ import annotations

import functools
import gc
import hashlib
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import simpy
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fednet import runtime
from fednet.errors import ConfigError, FednetError, SetupFailure, TrainingFailure
from fednet.learning.task import LearningTask
from fednet.sim.compute import AlwaysAvailable
from fednet.sim import pcg
from fednet.sim.simulation import Node, Simulation

from . import finite, registry
from .learning import Learning, RidgeLearning, check_learning
from .modes import Mode, SharedTrajectory, make_mode
from .primitives import (
    GatherResult,
    Net,
    Outgoing,
    StragglerShortfall,
    UnchargedCompute,
    payload_size,
)
from .trace import TraceRow

__all__ = ["Protocol", "ProtocolConfig", "Learning", "RidgeLearning", "NodeState", "ServerState", "Outgoing", "StragglerShortfall",
           "SetupFailure", "UnchargedCompute", "GatherResult", "payload_size", "SETUP_DROPOUT_REACTIONS"]

#: The reactions a protocol may declare to devices absent in the setup phase (module docstring).
SETUP_DROPOUT_REACTIONS = ("none", "offline", "reshare", "fail")


#: Garbage collection in :meth:`Protocol.run`: after the set-up everything alive is frozen
#: (``gc.freeze``) and automatic collection is off; each round boundary collects the young
#: generations, every ``GC_ROUNDS``-th a full collection, whose survivors are frozen too (modules a
#: first round imports, long-lived caches: a full collection then looks at what is new only; conventional
#: FL, D = 1000: ~8 ms a full collection before); the previous state is restored at the end (frozen
#: objects still die by reference counting; a cycle among them waits for the end of the run).
#: 0 leaves the collector alone. (LightSecAgg, D = 120: 2x less host time; issue 12.) Only in a process whose host
#: configuration enabled it (:func:`fednet.runtime.configure_host`: the ``fednet`` command, the study runner, the
#: Dask workers); otherwise a run leaves the interpreter's collector alone.
GC_ROUNDS = 16


class ProtocolConfig(BaseModel):
    """Base of every protocol's parameters (unknown keys are rejected).

    Attributes
    ----------
    element_bits : int
        Width in bits of one transmitted number (32: float32 as in Sec. VII for the baselines),
        in [1, 4096]: what a protocol declares (``upload_bits=self.element_bits``...) where its paper
        bills its numbers so; never a default for an undeclared message (:mod:`fednet.sim.engine.wire`).

    Non-finite floats (``inf``, ``nan``) are refused in every field of every subclass.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    element_bits: int = Field(32, ge=1, le=4096)


@dataclass
class NodeState:
    """Private state of a device (a protocol subclasses it with its own fields).

    Attributes
    ----------
    received : Any
        The payload of the node's latest download by ``gather`` / ``tree_aggregate``.
    """

    received: Any = None


@dataclass
class ServerState:
    """Private state of the server (a protocol may subclass it)."""


class Protocol:
    """Base class of every protocol (module docstring for the primitives).

    A protocol subclasses ``Protocol`` only. The primitives reach it as one attribute, ``self.net``, the
    learning set-up (model, data, update, evaluation) as another, ``self.learning``; neither can be shadowed
    by a protocol's own names. The ten hooks a protocol author sets or overrides:

    ``name``
        Registry key (a class with a ``name`` is registered when defined).
    ``Config``
        The :class:`ProtocolConfig` subclass of its parameters (deriving from the learning set-up's section).
    ``State``
        Dataclass of each device's private state (a :class:`NodeState` subclass; ``ServerStateType`` for
        the server's).
    ``Learning``
        The learning set-up, a :class:`~fednet.protocol.learning.Learning` subclass:
        :class:`~fednet.protocol.learning.RidgeLearning` (default: the seed papers' ridge model),
        :class:`~fednet.protocol.neural.NeuralLearning` (the MLP baselines),
        :class:`~fednet.protocol.vertical.VerticalLearning` (FedVS's split model).
    ``setup_dropouts``
        Reaction to devices absent in the setup phase (module docstring).
    :meth:`check` / :meth:`validate`
        Refuse a configuration against the network size (before anything runs) / against the data.
    :meth:`setup`, :meth:`round`
        Round 0 and each training round, generators on ``self.net``.
    :meth:`evaluate`, :meth:`round_metrics`
        The trace row's accuracy and loss, and extra columns (default: the learning set-up's).

    Less common: ``ServerStateType``, ``exact_trajectory``, ``max_setup_attempts``, :meth:`check_dropout`,
    :meth:`trajectory_group`, :meth:`setup_waiting`. The rest are shorthands: ``env``, ``server``,
    ``devices``, ``element_bits``, ``theta`` / ``params`` / ``model`` (the learning set-up's model state),
    the keyed data draws :meth:`minibatch_rows` / :meth:`minibatch_rows_many` / ``point_counts``,
    :meth:`step` (the ridge update), :meth:`record` and :meth:`run`.

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

    Raises
    ------
    fednet.errors.ConfigError
        When ``config`` does not validate or :meth:`validate` refuses it against the network
        and data (a ``ValueError`` raised there is re-raised as a ``ConfigError``, a
        ``ValueError`` too, naming the protocol).

    Attributes
    ----------
    learning : Learning
        The learning set-up (built from ``Learning`` before :meth:`validate`).
    theta : ndarray, (d, c)
        The global ridge model, held by the server (``self.learning.theta``; ridge set-up only).
    used : list of int or None
        Devices whose results the current round used (set by the protocol).
    mode : Mode
        How steps execute (:mod:`fednet.protocol.modes`), from the config's ``mode`` (default full).
    round_dropped : set of int
        Devices found unavailable by a primitive this round (the trace's ``dropped``).
    decode_failed : bool
        Set by a protocol whose server could not decode this round (the trace's ``decode_failed``).
    trace : list of dict
        The rows recorded so far (:class:`~fednet.protocol.trace.TraceRow` columns, then
        :meth:`round_metrics`).
    setup_absent : list of list of int
        Devices absent in each setup attempt (module docstring).
    setup_attempts : int
        Setup attempts made (more than one only under ``setup_dropouts = "reshare"``).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[ProtocolConfig]] = ProtocolConfig
    #: Dataclass of each device's private state (None keeps the engine's plain namespace).
    State: ClassVar[type | None] = None
    #: Dataclass of the server's private state (None keeps the engine's plain namespace).
    ServerStateType: ClassVar[type | None] = None
    #: The learning set-up (:mod:`fednet.protocol.learning`): what is trained and how it is evaluated.
    Learning: ClassVar[type[Learning]] = RidgeLearning
    #: Whether the decoded update equals the plain full-batch gradient (Prop. 3 of Schlegel et
    #: al.), so that timing mode may follow the task's cached full-batch trajectory.
    exact_trajectory: ClassVar[bool] = False
    #: Reaction to devices absent in the setup phase (module docstring): "none", "offline",
    #: "reshare" or "fail".
    setup_dropouts: ClassVar[str] = "reshare"
    #: Most setup attempts under ``setup_dropouts = "reshare"`` before :class:`SetupFailure`.
    max_setup_attempts: ClassVar[int] = 100
    #: Whether secret draws reach the model (stochastic rounding, noise), or the modes in which they do:
    #: :meth:`secret_dependent`'s default.
    secrets_reach_model: ClassVar[bool | frozenset[str]] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_learning(cls)
        if cls.__dict__.get("name"):
            registry.register(cls)

    def __init__(self, sim: Simulation, task: LearningTask, config: ProtocolConfig | dict | None = None,
                 *, label: str | None = None) -> None:
        if self.setup_dropouts not in SETUP_DROPOUT_REACTIONS:
            raise ConfigError(f"{type(self).__name__}.setup_dropouts must be one of {SETUP_DROPOUT_REACTIONS}, "
                              f"got {self.setup_dropouts!r}")
        if task.n_devices != sim.n_devices:
            raise ConfigError(f"the task has data for {task.n_devices} devices but the network has {sim.n_devices}")
        try:
            if config is None:
                config = self.Config()
            elif isinstance(config, dict):
                config = self.Config.model_validate(config)
        except ValidationError as e:
            raise ConfigError("; ".join(
                f"{self.name} {'.'.join(str(p) for p in err['loc']) or 'config'}: "
                f"{err['msg'].removeprefix('Value error, ')}"
                + ("" if err["type"] == "value_error" or isinstance(err.get("input"), dict)
                   else f" (got {err.get('input')!r})") for err in e.errors())) from None
        if not isinstance(config, self.Config):
            raise TypeError(f"config must be a {self.Config.__name__} or a dict, got {type(config).__name__}")
        self.sim = sim
        #: The primitives (:class:`~fednet.protocol.primitives.Net`): ``yield from self.net.gather(...)``.
        self.net = Net(self)
        self.task = task
        self.config = config
        self.label = label or self.name
        self.epoch = 0
        self.used: list[int] | None = None
        self.round_dropped: set[int] = set()
        self.decode_failed = False
        self.trace: list[dict[str, Any]] = []
        self.setup_absent: list[list[int]] = []
        self.setup_attempts = 0
        self.mode: Mode = make_mode(getattr(config, "mode", "full"))
        #: The trajectory this run shares with others on its task (:meth:`trajectory_group`), set by :meth:`run`.
        self.trajectory: SharedTrajectory | None = None
        if self.State is not None:
            for dev in sim.devices:
                dev.state = self.State()
        if self.ServerStateType is not None:
            sim.server.state = self.ServerStateType()
        #: The learning set-up (:mod:`fednet.protocol.learning`) from the class's ``Learning``; validate may read it.
        self.learning: Learning = self.Learning(self)
        try:
            self.validate()
        except FednetError:
            raise
        except ValueError as e:
            raise ConfigError(f"{self.name}: {e}") from e

    # -- to override ----------------------------------------------------------------------
    @classmethod
    def check(cls, config: ProtocolConfig, n_devices: int) -> None:
        """Check a configuration against the network size before anything runs.

        Called when a study is loaded (so a bad study fails before any output is written) and
        again when the protocol is built. Raise ``ValueError`` naming the parameter and value.
        """

    @classmethod
    def check_dropout(cls, config: ProtocolConfig, n_devices: int, dropout: float) -> None:
        """Refuse a per-round dropout probability that leaves too few devices on average.

        Called when a study with ``network.dropout > 0`` is loaded. A round that happens to lose
        too many devices is recorded as skipped (or raises in strict mode); this check refuses
        the configurations where that is the expected case: fewer devices available on average
        (``n_devices * (1 - dropout)``) than one round needs. The default accepts everything
        (protocols that proceed with whoever is present). Raise ``ValueError`` naming
        ``network.dropout``, the parameter it conflicts with, and a setting that works.
        """

    @classmethod
    def secret_dependent(cls, config: ProtocolConfig) -> bool:
        """Whether the run's numbers (accuracy, loss, the model) depend on its secret draws (issue 31, item 5).

        True where secrets reach the model: a stochastic rounding or fixed-point rounding of padded values drawn
        from :meth:`fednet.sim.Simulation.secret_rng`, differential-privacy noise.  Such a run is reproducible only
        under its recorded secret seed (``secret_seed.json`` of a study's results; ``fednet run --secret-seed``);
        ``summary.json`` marks it ``secret_dependent``.  Times, bits and MAC counts never depend on secrets
        (``fednet.testing.check_protocol`` checks that, and checks a False here against a run under another
        secret seed).  Default: the class attribute :attr:`secrets_reach_model` (False: masks and pads that cancel
        exactly); override for a dependence on the configuration (a mode, say).
        """
        reach = cls.secrets_reach_model
        return reach if isinstance(reach, bool) else getattr(config, "mode", "full") in reach

    @classmethod
    def trajectory_group(cls, config: ProtocolConfig, n_devices: int) -> Hashable | None:
        """What this run's model trajectory depends on, if it does not depend on the run's timing; None otherwise.

        Runs of one protocol on one task (data draw) and seed, in an always-available network, whose groups are
        equal and not None follow the same models epoch by epoch, bit for bit, whatever their links, compute
        models and other parameters: the first computes them, the others take them from a
        :class:`~fednet.protocol.modes.SharedTrajectory` kept on the task (timing mode's ``update`` and
        ``evaluate``) and simulate only their own times. Return the configuration values the models do depend
        on. Default None: the model depends on the timing (who arrives first, deadlines) or on randomness of the
        run's own.

        Parameters
        ----------
        config : ProtocolConfig
        n_devices : int

        Returns
        -------
        hashable or None
        """
        return None

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
        """Test accuracy and loss of the current model (not charged: the observer's work): the learning
        set-up's (:meth:`Learning.evaluate <fednet.protocol.learning.Learning.evaluate>`)."""
        return self.learning.evaluate()

    def round_metrics(self, round: int) -> dict[str, Any]:
        """Protocol-specific columns added to the trace row of ``round``: the learning set-up's by default.

        The study runner writes every column a protocol returns here to ``trace.csv`` after the
        standard ones; an override that keeps the set-up's columns starts from ``super().round_metrics(round)``.
        """
        return self.learning.round_metrics(round)

    # -- shorthands -------------------------------------------------------------------------
    @property
    def theta(self) -> np.ndarray:
        """The ridge model ``theta`` (d, c): ``self.learning.theta`` (:class:`~.learning.RidgeLearning`)."""
        return self.learning.theta

    @theta.setter
    def theta(self, value: np.ndarray) -> None:
        self.learning.theta = value

    @property
    def params(self) -> Any:
        """The model's named parameter arrays: ``self.learning.params`` (e.g. ``NeuralLearning``)."""
        return self.learning.params

    @params.setter
    def params(self, value: Any) -> None:
        self.learning.params = value

    @property
    def model(self) -> Any:
        """The model being trained: ``self.learning.model``."""
        return self.learning.model

    @model.setter
    def model(self, value: Any) -> None:
        self.learning.model = value

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
        """The config's ``element_bits``: the width a protocol passes where it bills its numbers so (not a default)."""
        return self.config.element_bits

    @functools.cached_property
    def point_counts(self) -> np.ndarray:
        """``n_i``, the number of training points of each device: int64, (D,), read-only (the task's
        points do not change during a run)."""
        counts = np.array([x.shape[0] for x in self.task.X], dtype=np.int64)
        counts.flags.writeable = False
        return counts

    def minibatch_rows(self, dev: Node, batch: int, epoch: int | None = None) -> np.ndarray:
        """Device ``dev``'s minibatch of ``batch`` of its points in round ``epoch`` (default: the current one).

        Drawn without replacement from the public stream keyed ``(device, "minibatch", epoch)``, so
        every protocol that samples minibatches sees the same rows at a seed (paired comparisons),
        whichever earlier rounds the device took part in.

        Parameters
        ----------
        dev : Node
        batch : int
            Minibatch size ``b_i``, at most the device's number of points.
        epoch : int, optional

        Returns
        -------
        ndarray of int, (batch,)
        """
        n = self.task.X[dev.index].shape[0]
        e = self.epoch if epoch is None else epoch
        return self.sim.rng(dev, "minibatch", e).choice(n, size=batch, replace=False)

    def minibatch_rows_many(self, devs: Sequence[Node], batches: Sequence[int],
                            epoch: int | Sequence[int] | None = None) -> list[np.ndarray] | np.ndarray:
        """:meth:`minibatch_rows` of many devices at once (the same rows; ``Streams.choices`` draws
        the devices of equal size and batch as one vector where that is faster).  ``epoch`` may give each
        device its own round (an asynchronous client's iteration).

        Returns
        -------
        list of ndarray of int, (b_i,), or ndarray (len(devs), b)
            Each device's rows, in the order of ``devs``; one 2-D array when they were drawn as one.
        """
        e = self.epoch if epoch is None else epoch
        each = not isinstance(e, (int, np.integer))
        if each:
            e = np.asarray(e, dtype=np.int64).reshape(-1)
            if e.size != len(devs):
                raise ValueError(f"epoch gives {e.size} rounds for {len(devs)} devices")
        if type(self).minibatch_rows is not _MINIBATCH_ROWS:      # an override must see every device's draw
            return [self.minibatch_rows(dev, int(b), int(e[p]) if each else e)
                    for p, (dev, b) in enumerate(zip(devs, batches))]
        out: list[np.ndarray | None] = [None] * len(devs)
        idx = np.fromiter((dev.index for dev in devs), dtype=np.intp, count=len(devs))
        ns, bs = self.point_counts[idx], np.asarray(batches, dtype=np.int64).reshape(-1)
        groups: dict[tuple[int, int], list[int]]
        if len(devs) and (ns == ns[0]).all() and (bs == bs[0]).all():   # one size and batch (the common case)
            groups = {(int(ns[0]), int(bs[0])): list(range(len(devs)))}
        else:
            groups = {}
            for p, key in enumerate(zip(ns.tolist(), bs.tolist())):
                groups.setdefault(key, []).append(p)
        for (n, b), members in groups.items():
            K = len(members)
            if pcg.COMPILED or K * 15 > 24 * b * (1 + 0.005 * K):   # measured costs (microseconds): vector wins
                key = (e if K == len(devs) else e[members]) if each else e
                rows = self.sim.streams.choices(idx if K == len(devs) else idx[members], "minibatch", (key,), n, b)
                if K == len(devs):
                    return rows
                for j, p in enumerate(members):
                    out[p] = rows[j]
            else:
                for p in members:
                    out[p] = self.minibatch_rows(devs[p], b, int(e[p]) if each else e)
        return out

    def step(self, gradient_sum: np.ndarray, m_used: int) -> None:
        """The ridge update of eqs. (4)-(5), :meth:`RidgeLearning.step <fednet.protocol.learning.RidgeLearning.step>`
        (what ``self.mode.update`` calls)."""
        self.learning.step(gradient_sum, m_used)

    # -- the run loop --------------------------------------------------------------------
    def record(self, event: str = "update") -> dict[str, Any]:
        """Append a trace row now, e.g. after each update of an asynchronous protocol; returns it.

        The row's bits and MACs are those since the previous row (the counters restart), so the
        rows of a round add up to its totals; the run loop still records the round's last row.

        Raises
        ------
        ValueError
            For an event not in :data:`fednet.protocol.trace.EVENTS`.
        """
        return self._record(self.epoch, event)

    def _setup_absent(self, attempt: int) -> list[int]:
        """Devices absent in setup attempt ``attempt`` (one draw per device and attempt)."""
        return [dev.index for dev in self.devices if not self.sim.available(dev, 0, phase=attempt)]

    def setup_waiting(self, pending: set[int]) -> list[int]:
        """Devices a ``"reshare"`` setup still waits for: another attempt runs while this is non-empty.

        Parameters
        ----------
        pending : set of int
            Devices absent in every setup attempt so far.

        Returns
        -------
        list of int
            ``sorted(pending)`` here; a protocol whose setup also needs deliveries to devices that were present
            once but absent later (DReS-FL's stored shares) adds those devices.
        """
        return sorted(pending)

    def _setup_phase(self) -> Generator:
        """Run :meth:`setup` under the protocol's reaction to setup dropouts (module docstring).

        Raises
        ------
        fednet.errors.SetupFailure
            Under ``"fail"`` if a device is absent; under ``"reshare"`` if some device is absent in
            each of ``max_setup_attempts`` attempts.
        """
        reaction = self.setup_dropouts
        self.setup_absent = [self._setup_absent(0)]
        self.setup_attempts = 1
        if reaction == "fail" and self.setup_absent[0]:
            raise SetupFailure(f"{self.label}: devices {self.setup_absent[0]} are absent in the setup phase "
                               f"and {type(self).__name__} fails its setup without them")
        yield from self.setup()
        if reaction != "reshare":
            self.round_dropped.update(self.setup_absent[0])     # recorded only (round 0's dropped)
            return
        pending = set(self.setup_absent[0])          # devices not yet present in any attempt
        while waiting := self.setup_waiting(pending):
            if self.setup_attempts >= self.max_setup_attempts:
                raise SetupFailure(
                    f"{self.label}: devices {waiting} were absent in each of {self.setup_attempts} setup "
                    f"attempts; max_setup_attempts = {self.max_setup_attempts}")
            self.setup_absent.append(self._setup_absent(self.setup_attempts))
            self.sim.phase = self.setup_attempts      # steps of this attempt read its availability draw
            self.setup_attempts += 1
            pending &= set(self.setup_absent[-1])
            try:
                yield from self.setup()               # a further attempt, charged as a full phase
            finally:
                self.sim.phase = 0

    def _shared_trajectory(self) -> SharedTrajectory | None:
        """This run's :class:`~fednet.protocol.modes.SharedTrajectory` on its task, or None (:meth:`trajectory_group`).

        Shared only in timing mode, with every device always available (no round can fail for some runs and not
        others), and on a task that keeps memos; the key holds the protocol, its group, the seed (the minibatch
        draws), the number of devices and a digest of the model the run starts from (a warm start, or a second
        :meth:`run` of one object, starts a trajectory of its own)."""
        group = type(self).trajectory_group(self.config, self.sim.n_devices)
        memo = getattr(self.task, "memo", None)
        if (group is None or self.mode.name != "timing" or memo is None
                or not isinstance(self.sim.availability, AlwaysAvailable)):
            return None
        theta = self.theta
        start = hashlib.blake2b(digest_size=16)
        for name, array in sorted(theta.items()) if isinstance(theta, dict) else [("", theta)]:
            array = np.ascontiguousarray(array)
            start.update(repr((name, array.dtype.str, array.shape)).encode())
            start.update(array.tobytes())
        key = ("fednet.protocol.base.shared_trajectory", type(self).__module__, type(self).__qualname__, group,
               self.sim.seed, self.sim.n_devices, start.hexdigest())
        return memo(key, SharedTrajectory)

    def _used_text(self) -> str:
        """The trace's ``used`` column: :attr:`used`, sorted, as space-separated indices (the last one is
        kept: rounds that use the same devices -- every device, typically -- share the text)."""
        if self.used is None:
            return ""
        used = sorted(self.used)
        last = getattr(self, "_used_last", None)
        if last is None or last[0] != used:
            last = self._used_last = (used, " ".join(map(str, used)))
        return last[1]

    def _record(self, round: int, event: str | None = None, failure: str | None = None) -> dict[str, Any]:
        acc, loss = self.evaluate()
        c = self.sim.take_counters()
        row = TraceRow(
            protocol=self.label, seed=self.sim.seed, round=round, time_s=self.sim.now,
            accuracy=acc, loss=loss, bits_up=c.bits_up, bits_down=c.bits_down,
            device_macs=c.device_macs, server_macs=c.server_macs, retransmissions=c.retransmissions,
            used=self._used_text(),
            event=event or ("phase" if round == 0 else "round"),
            dropped=" ".join(map(str, sorted(self.round_dropped))), decode_failed=self.decode_failed,
        ).as_dict()
        if getattr(self.sim, "energy", None):                  # the devices' joules of this row (issue 28, item 4)
            row["energy_j"] = c.device_energy_j
        if getattr(self.sim, "edge_servers", None):            # a hierarchy (issue 28, item 5): backhaul and edges
            row["bits_backhaul"] = c.bits_backhaul
            row["edge_macs"] = c.edge_macs
        if round == 0 and self.setup_dropouts == "reshare" and not isinstance(self.sim.availability, AlwaysAvailable):
            row["setup_attempts"] = self.setup_attempts
        if failure is None:
            row.update(self.round_metrics(round))
        else:   # a round that could not complete: its protocol metrics would be stale
            row["skip_reason"] = failure
        self.trace.append(row)
        return row

    def run(self, epochs: int, *, stop_at: float | None = None,
            on_round: Callable[[dict[str, Any]], None] | None = None,
            strict: bool = True) -> list[dict[str, Any]]:
        """Run the setup phase and up to ``epochs`` rounds; returns the trace rows.

        Parameters
        ----------
        epochs : int
            Maximum number of rounds.
        stop_at : float, optional
            Stop after the first round whose test accuracy reaches this value.
        on_round : callable(row), optional
            Called after each round (progress bars).
        strict : bool
            True (default): a round that cannot complete raises. False: a training round that
            raises :class:`StragglerShortfall` (too few devices available or finishing) is
            recorded with ``decode_failed = True`` and its reason in the extra column
            ``skip_reason``, the model is left as it was, and the next round starts (the
            papers' "decoding failed" rounds). The setup phase (round 0) always raises.

        Raises
        ------
        StragglerShortfall
            With ``strict=True``, from the first round that cannot complete.
        fednet.errors.TrainingFailure
            With ``strict=True``, from the first round whose loss or model is not finite or whose values
            overflow their ring or field; without it that round ends the training as a recorded failure
            (the trace's ``failure`` column; :mod:`fednet.protocol.finite`). Always for a set-up that overflows.
        fednet.errors.SetupFailure
            If the setup phase cannot complete under the protocol's :attr:`setup_dropouts`.
        """
        if epochs < 0:
            raise ConfigError(f"epochs must be >= 0, got {epochs}")
        self.learning.start(epochs)
        self.trajectory = self._shared_trajectory()

        gc_rounds = GC_ROUNDS if runtime.host_config().gc_policy else 0   # off unless the host configuration set it

        def main() -> Generator:
            """The run's process: set-up (with its attempts), then the rounds."""
            self.sim.round = self.epoch = 0
            try:
                yield from self._setup_phase()
            except finite.RUNTIME_OVERFLOW as overflow:
                finite.overflowed(self, 0, overflow, strict)     # raises: a set-up that overflows is an error
            row = finite.checked(self, self._record(0), strict)
            if on_round:
                on_round(row)
            if finite.failed(row):               # a non-finite model from the start: no round runs
                return
            if gc_rounds:                       # the set-up's objects stay: keep the collector off them
                gc.freeze()
                gc.disable()
            for e in range(1, epochs + 1):
                if gc_rounds and e > 1:        # a round's cyclic garbage is dead at its end
                    if (e - 1) % gc_rounds:
                        gc.collect(1)
                    else:
                        gc.collect(2)
                        gc.freeze()             # the survivors are long-lived: the next full collection skips them
                self.sim.round = self.epoch = e
                self.used = None
                self.round_dropped = set()
                self.decode_failed = False
                try:
                    yield from self.round(e)
                except StragglerShortfall as failure:
                    if strict:
                        raise
                    self.used = None
                    self.decode_failed = True
                    row = self._record(e, failure=str(failure))
                except finite.RUNTIME_OVERFLOW as overflow:    # a recorded failure (fednet.protocol.finite)
                    row = finite.overflowed(self, e, overflow, strict)
                else:
                    row = finite.checked(self, self._record(e), strict)
                if on_round:
                    on_round(row)
                if finite.failed(row) or (stop_at is not None and row["accuracy"] >= stop_at):
                    break

        enabled = gc.isenabled()
        try:
            self.sim.run(main())
        except finite.RUNTIME_OVERFLOW as overflow:     # raised in a step's own process, outside round()
            finite.overflowed(self, self.epoch, overflow, strict)
        except RuntimeError as stall:
            if not str(stall).startswith("No scheduled events left"):
                raise
            self._stalled(strict)                       # a round that can never complete (SimPy ran dry)
        finally:
            if gc_rounds:
                gc.unfreeze()
                if enabled:
                    gc.enable()
        return self.trace

    def _stalled(self, strict: bool) -> None:
        """The round in progress can never complete: every process waits for an event nothing will trigger (SimPy's
        queue ran dry; e.g. FedBuff's buffer when fewer devices are available than ``buffer_size``).

        Without ``strict`` the round ends training as a recorded failure (:mod:`fednet.protocol.finite`'s
        ``failure`` column, the summary's ``failed``), as an overflow does.

        Raises
        ------
        fednet.errors.TrainingFailure
            Under ``strict``, or in the set-up phase (round 0); the message names the run and the round.
        """
        reason = ("the round can never complete: every process waits for an event that nothing will trigger "
                  "(for example fewer available devices than the round waits for)")
        if strict or self.epoch == 0:
            raise TrainingFailure(finite._message(self, self.epoch, reason)) from None
        self.used = None
        row = self._record(self.epoch, failure=reason)
        row.pop("skip_reason", None)
        row[finite.FAILURE_COLUMN] = reason


#: :meth:`Protocol.minibatch_rows` as defined here (:meth:`Protocol.minibatch_rows_many` defers to an override).
_MINIBATCH_ROWS = Protocol.minibatch_rows
