"""Study files: TOML validated by pydantic (unknown keys rejected, every bad value named).

A study names a data pipeline, a network, the training hyperparameters, seeds, target
accuracies and a list of runs (a protocol with its parameters). Example::

    name = "quickstart"
    seeds = [0, 1, 2]
    targets = [0.90, 0.95]
    baseline = "Conventional FL"        # label of the run speed-ups are measured against
    epochs = 400

    [data]
    dataset = "digits"                  # digits | mnist | fashion-mnist

    [network]
    n_devices = 25
    loss = { dist = "uniform", low = 0.05, high = 0.15 }   # or 0.1, or one value per device
    groups = { rule = "random", count = 5 }                # optional (NetworkSpec, GroupSpec)

    [[runs]]
    label = "Conventional FL"
    protocol = "conventional"                # or "package.module:Class", or an installed plugin's name
    params = { drop_slowest = 0 }
    network = { loss = 0.2 }                 # optional per-run overrides of [network]

Every protocol's ``params`` are validated by that protocol's ``Config`` when the study is
loaded, together with :meth:`~fednet.protocol.base.Protocol.check` against the network, so
a bad study fails before anything is computed or written.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from fednet.plugins import search_path
from fednet.protocol import registry

__all__ = ["Study", "DataSpec", "NetworkSpec", "GroupSpec", "TrainingSpec", "RunSpec", "load_study", "StudyError"]


class StudyError(ValueError):
    """A study file that cannot be read or does not validate (the message names every problem)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSpec(_Strict):
    """The data pipeline: dataset, random-Fourier features, split across devices.

    Attributes
    ----------
    dataset : {"digits", "mnist", "fashion-mnist"}
    rbf_gamma : float, optional
        RBF kernel parameter; default :func:`fednet.learning.features.default_gamma`.
    n_components : int
        Random-Fourier features d (2000 in Sec. VII).
    feature_seed : int
        Seed of the random frequencies (part of the problem, the same for every run and seed).
    partition : {"noniid", "dirichlet", "iid"}
        ``noniid``: sorted by label and cut into D consecutive shards (Sec. VII).
    dirichlet_alpha : float, optional
        Concentration for ``partition = "dirichlet"``.
    """

    dataset: Literal["digits", "mnist", "fashion-mnist"] = "digits"
    rbf_gamma: float | None = Field(None, gt=0)
    n_components: int = Field(2000, ge=1)
    feature_seed: int = Field(0, ge=0)
    partition: Literal["noniid", "dirichlet", "iid"] = "noniid"
    dirichlet_alpha: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _alpha_for_dirichlet(self) -> "DataSpec":
        if self.partition == "dirichlet" and self.dirichlet_alpha is None:
            raise ValueError("partition = 'dirichlet' needs dirichlet_alpha")
        return self


_RATE = TypeAdapter(Annotated[float, Field(gt=0)])
_LOSS = TypeAdapter(Annotated[float, Field(ge=0, lt=1)])
_RATES = TypeAdapter(list[Annotated[float, Field(gt=0)]])
_LOSSES = TypeAdapter(list[Annotated[float, Field(ge=0, lt=1)]])


def _first_error(adapter: TypeAdapter, value: Any) -> Any:
    """Validate with ``adapter``; re-raise its first error with the type and message pydantic gave it."""
    try:
        return adapter.validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        where = "".join(f"[{p}]" for p in err["loc"])
        msg = (f"entry {where}: " if where else "") + err["msg"]
        raise PydanticCustomError(err["type"], msg.replace("{", "(").replace("}", ")")) from None


def _per_device_value(value: Any, kind: str) -> Any:
    """A per-device field: a number, a list (one per device) or a distribution table."""
    if isinstance(value, dict):
        from fednet.topologies.distributions import check_distribution, support

        spec = check_distribution(value, "distribution")
        lo, hi, hi_open = support(spec)
        if kind == "rate" and not lo > 0:
            raise ValueError(f"draws of {spec['dist']} can be {lo} (rates must be positive)")
        if kind == "loss" and not (lo >= 0 and (hi < 1 or (hi == 1 and hi_open))):
            raise ValueError(f"draws of {spec['dist']} range over [{lo}, {hi}] (loss must be in [0, 1))")
        return spec
    if isinstance(value, list):
        return _first_error(_RATES if kind == "rate" else _LOSSES, value)
    return _first_error(_RATE if kind == "rate" else _LOSS, value)


class GroupSpec(_Strict):
    """Group membership of the devices (written on the topology as node attribute ``group``).

    Attributes
    ----------
    rule : {"consecutive", "random", "mac_balanced"}
        How ``count`` groups are formed (:mod:`fednet.topologies.groups`): consecutive runs of
        devices (the papers' grouping), a random permutation cut into balanced groups, or devices
        dealt by MAC rate so every group has a similar mix.
    count : int, optional
        N. A protocol with a ``groups`` parameter takes it when its run does not set one.
    membership : list of list of int, optional
        Explicit groups (a partition of ``0..D-1``), instead of ``rule`` and ``count``.
    seed : int, optional
        Fixes the ``random`` rule's permutation across the study's seeds (default: the run's seed).

    TOML: ``groups = 4`` (four consecutive groups), ``groups = { rule = "random", count = 4 }`` or
    ``groups = { membership = [[0, 1, 2], [3, 4]] }``.
    """

    rule: Literal["consecutive", "random", "mac_balanced"] = "consecutive"
    count: int | None = Field(None, ge=1)
    membership: list[list[int]] | None = None
    seed: int | None = Field(None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"count": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _one_way(self) -> "GroupSpec":
        if (self.count is None) == (self.membership is None):
            raise ValueError("groups needs exactly one of count (with a rule) or membership")
        return self

    @property
    def n_groups(self) -> int:
        """N."""
        return self.count if self.membership is None else len(self.membership)


class NetworkSpec(_Strict):
    """The network: a topology builder with its per-device parameters, groups, compute and dropout models.

    Attributes
    ----------
    kind : str
        ``"lte_star"`` (the LTE star of Sec. VII; the fields below) or a user builder
        ``"package.module:function"``, called as ``function(n_devices, rng=..., **params)`` and
        returning a networkx graph (:mod:`fednet.topologies`).
    n_devices : int
        D.
    uplink_bps, downlink_bps : float, list of float, or distribution table
        bit/s (5e6 and 10e6): one value, one per device, or a named distribution
        (:mod:`fednet.topologies.distributions`, e.g. ``{ dist = "uniform", low = 2e6, high = 8e6 }``).
    loss : float, list of float, or distribution table
        Per-packet loss probability in [0, 1) (0.1), likewise.
    header_overhead : float
        Fraction (0.1).
    packet_bits : int, optional
        Packet size on the air; omitted: each message is one packet (the paper's reading).
    server_mac_rate : float
        MAC/s (8.24e12).
    device_mac_rates : "paper", list of float, or distribution table
        "paper": the mixes of Sec. VII (fixed for D = 25, drawn per seed otherwise).
    groups : GroupSpec, optional
        Group membership written on the topology (default: none; grouped protocols then cut the
        devices into their ``groups`` consecutive groups, as in the papers).
    params : dict
        Keyword arguments of a user builder (``kind = "module:function"`` only).
    compute : {"shifted_exponential", "deterministic"}
        Device compute-time model.
    setup_fraction : float
        Mean setup time / deterministic time of the shifted exponential (0.5).
    dropout : float
        Probability that a device is absent in a round (independent, keyed draws).

    Drawn values (distributions, "paper" rates for D != 25, random groups) come from streams keyed
    by the run's seed and the field, so changing one field's distribution leaves the others' draws
    unchanged.
    """

    kind: str = "lte_star"
    n_devices: int = Field(25, ge=1)
    uplink_bps: float | list[float] | dict[str, Any] = 5e6
    downlink_bps: float | list[float] | dict[str, Any] = 10e6
    loss: float | list[float] | dict[str, Any] = 0.1
    header_overhead: float = Field(0.1, ge=0)
    packet_bits: int | None = Field(None, gt=0)
    server_mac_rate: float = Field(8.24e12, gt=0)
    device_mac_rates: Literal["paper"] | list[float] | dict[str, Any] = "paper"
    groups: GroupSpec | None = None
    params: dict[str, Any] = {}
    compute: Literal["shifted_exponential", "deterministic"] = "shifted_exponential"
    setup_fraction: float = Field(0.5, ge=0)
    dropout: float = Field(0.0, ge=0, lt=1)

    @field_validator("uplink_bps", "downlink_bps", mode="wrap")
    @classmethod
    def _rates(cls, v: Any, handler: Any) -> Any:
        return _per_device_value(v, "rate")

    @field_validator("loss", mode="wrap")
    @classmethod
    def _loss(cls, v: Any, handler: Any) -> Any:
        return _per_device_value(v, "loss")

    @field_validator("device_mac_rates", mode="wrap")
    @classmethod
    def _mac_rates(cls, v: Any, handler: Any) -> Any:
        if isinstance(v, str):
            return handler(v)
        if isinstance(v, list):
            bad = [(i, r) for i, r in enumerate(v) if isinstance(r, (int, float)) and not r > 0]
            if bad:
                raise ValueError(f"device_mac_rates must be positive; entry {bad[0][0]} is {bad[0][1]}")
        return _per_device_value(v, "rate")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        from fednet.topologies import builder

        builder(v)  # unknown names and unimportable builders fail when the study is loaded
        return v

    @model_validator(mode="after")
    def _per_device_lengths(self) -> "NetworkSpec":
        for name in ("uplink_bps", "downlink_bps", "loss", "device_mac_rates"):
            v = getattr(self, name)
            if isinstance(v, list) and len(v) != self.n_devices:
                raise ValueError(f"{name} has {len(v)} entries for n_devices = {self.n_devices}")
        if self.params and self.kind == "lte_star":
            raise ValueError(f"params are for user builders (kind = 'module:function'); "
                             f"lte_star takes the network fields, got params {sorted(self.params)}")
        g = self.groups
        if g is not None:
            from fednet.topologies.groups import check_membership

            if g.membership is not None:
                try:
                    check_membership(g.membership, self.n_devices)
                except ValueError as e:
                    raise ValueError(f"groups.membership: {e}") from None
            elif g.count > self.n_devices:
                raise ValueError(f"groups.count must be at most n_devices = {self.n_devices}, got {g.count}")
        return self


class TrainingSpec(_Strict):
    """Hyperparameters of eqs. (2)-(5) (Sec. VII: mu = 6.0, x0.8 at 200 and 350, lambda = 9e-6)."""

    learning_rate: float = Field(6.0, gt=0)
    lr_milestones: list[int] = [200, 350]
    lr_decay: float = Field(0.8, gt=0)
    weight_decay: float = Field(9e-6, ge=0)


class RunSpec(_Strict):
    """One protocol configuration of a study.

    Attributes
    ----------
    protocol : str
        Registered protocol name (``fednet list``: built-ins and installed ``fednet.protocols``
        entry points), or ``"package.module:Class"`` (importable from ``sys.path``, the study
        file's directory or the working directory; :mod:`fednet.protocol.registry`).
    label : str, optional
        Name in plots and summaries (default: the protocol name); unique within the study.
    params : dict
        The protocol's parameters (validated by its ``Config``).
    epochs : int, optional
        Overrides the study's ``epochs`` for this run.
    network : dict
        Overrides of the study's ``[network]`` fields for this run (e.g. ``{ loss = 0.2 }`` or
        ``{ groups = { rule = "random", count = 4 } }``; a field given here replaces the study's
        whole value), so one study can sweep groups or loss. ``n_devices`` cannot change (the data
        are split once per study).
    """

    protocol: str
    label: str | None = None
    params: dict[str, Any] = {}
    epochs: int | None = Field(None, ge=0)
    network: dict[str, Any] = {}

    @field_validator("network")
    @classmethod
    def _network_overrides(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "n_devices" in v:
            raise ValueError(f"a run cannot change n_devices (the data are split once per study), got {v['n_devices']}")
        unknown = sorted(set(v) - set(NetworkSpec.model_fields))
        if unknown:
            raise ValueError(f"unknown network fields {unknown}; known: {sorted(NetworkSpec.model_fields)}")
        return v

    @property
    def name(self) -> str:
        """The run's label, or its protocol name when it has none."""
        return self.label or self.protocol


class Study(_Strict):
    """A study: runs compared on one data set and network over several seeds.

    Attributes
    ----------
    name : str
    description : str
    seeds : list of int
        Root seeds; each (run, seed) pair is one simulation. Runs with one seed are paired.
    targets : list of float
        Test accuracies whose simulated time-to-reach the summary reports.
    baseline : str, optional
        Label of the run that speed-ups are measured against.
    epochs : int
        Maximum rounds per run.
    stop_at : float, optional
        Stop a run at the first round reaching this accuracy (default: max(targets)).
    run_to_end : bool
        Ignore ``stop_at`` and run every run for its full number of epochs (final-accuracy
        studies such as the client-drift comparison of Sec. VII-B).
    record_views : bool
        Keep every received message per node (privacy audits; memory-hungry in long runs).
    """

    name: str = Field(min_length=1)
    description: str = ""
    seeds: list[int] = Field([0], min_length=1)
    targets: list[float] = []
    baseline: str | None = None
    epochs: int = Field(100, ge=0)
    stop_at: float | None = Field(None, gt=0, le=1)
    run_to_end: bool = False
    record_views: bool = False
    data: DataSpec = DataSpec()
    network: NetworkSpec = NetworkSpec()
    training: TrainingSpec = TrainingSpec()
    runs: list[RunSpec] = Field(min_length=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError(f"seeds must be non-negative, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct, got {v}")
        return v

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[float]) -> list[float]:
        bad = [t for t in v if not 0 < t <= 1]
        if bad:
            raise ValueError(f"targets must be accuracies in (0, 1], got {bad}")
        return sorted(v)

    @model_validator(mode="after")
    def _runs(self) -> "Study":
        labels = [r.name for r in self.runs]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"run labels must be unique; repeated: {dup}")
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline {self.baseline!r} is not the label of a run; labels: {labels}")
        problems = []
        for i, run in enumerate(self.runs):
            try:
                cls = registry.get(run.protocol)
            except KeyError as e:
                problems.append(f"runs[{i}] ({run.name}): {e.args[0]}")
                continue
            except (ValueError, ImportError, TypeError) as e:
                problems.append(f"runs[{i}] ({run.name}).protocol: {e}")
                continue
            try:
                net = self.run_network(run)
            except ValidationError as e:
                problems += [f"runs[{i}] ({run.name}).network.{'.'.join(str(p) for p in err['loc'])}: "
                             f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
                continue
            try:
                cfg = cls.Config.model_validate(self.run_params(run))
                cls.check(cfg, self.network.n_devices)
                n_groups = getattr(cfg, "groups", None)
                if net.groups is not None and isinstance(n_groups, int) and n_groups != net.groups.n_groups:
                    raise ValueError(f"groups = {n_groups} but the network defines {net.groups.n_groups} groups")
            except ValidationError as e:
                for err in e.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    problems.append(f"runs[{i}] ({run.name}).params.{loc}: {err['msg']} (got {err.get('input')!r})")
            except ValueError as e:
                problems.append(f"runs[{i}] ({run.name}).params: {e}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def run_network(self, run: RunSpec) -> NetworkSpec:
        """The network of ``run``: the study's ``[network]`` with the run's ``network`` overrides.

        Raises
        ------
        pydantic.ValidationError
            If the overridden network does not validate.
        """
        if not run.network:
            return self.network
        return NetworkSpec.model_validate({**self.network.model_dump(exclude_unset=True), **run.network})

    def run_params(self, run: RunSpec) -> dict[str, Any]:
        """The protocol parameters of ``run``; a protocol whose ``Config`` has a ``groups`` field gets the
        network's number of groups when the run does not set it."""
        net = self.run_network(run)
        if net.groups is None or "groups" in run.params:
            return dict(run.params)
        cls = registry.get(run.protocol)
        if "groups" not in cls.Config.model_fields:
            return dict(run.params)
        return {**run.params, "groups": net.groups.n_groups}

    def run_epochs(self, run: RunSpec) -> int:
        """Maximum rounds of ``run`` (its own ``epochs`` or the study's)."""
        return self.epochs if run.epochs is None else run.epochs

    @property
    def stop_accuracy(self) -> float | None:
        """Accuracy at which runs stop early (None: run every epoch)."""
        if self.run_to_end:
            return None
        if self.stop_at is not None:
            return self.stop_at
        return max(self.targets) if self.targets else None


def load_study(path: str | Path, **overrides: Any) -> Study:
    """Read and validate a study TOML file.

    Parameters
    ----------
    path : path-like
    **overrides
        Top-level keys replacing the file's (e.g. ``seeds=[3]``).

    Raises
    ------
    StudyError
        For a missing file, invalid TOML, or a study that does not validate; the message names
        every offending key and value.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: invalid TOML: {e}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        with search_path(path.parent):  # "module:Class" protocols and builders may sit beside the study
            return Study.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(study)"
            msg = err["msg"].removeprefix("Value error, ")
            inp = err.get("input")
            shown = "" if isinstance(inp, dict) or err["type"] == "value_error" else f" (got {inp!r})"
            lines.append(f"  {loc}: {msg}{shown}")
        raise StudyError(f"{path}: invalid study:\n" + "\n".join(lines)) from None
