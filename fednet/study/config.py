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

    [[runs]]
    label = "Conventional FL"
    protocol = "conventional"
    params = { drop_slowest = 0 }

Every protocol's ``params`` are validated by that protocol's ``Config`` when the study is
loaded, together with :meth:`~fednet.protocol.base.Protocol.check` against the network, so
a bad study fails before anything is computed or written.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fednet.protocol import registry

__all__ = ["Study", "DataSpec", "NetworkSpec", "TrainingSpec", "RunSpec", "load_study", "StudyError"]


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


class NetworkSpec(_Strict):
    """The LTE star of Sec. VII and the compute/dropout models.

    Attributes
    ----------
    kind : {"lte_star"}
    n_devices : int
        D.
    uplink_bps, downlink_bps : float
        bit/s (5e6 and 10e6).
    loss : float
        Per-packet loss probability in [0, 1) (0.1).
    header_overhead : float
        Fraction (0.1).
    packet_bits : int, optional
        Packet size on the air; omitted: each message is one packet (the paper's reading).
    server_mac_rate : float
        MAC/s (8.24e12).
    device_mac_rates : "paper" or list of float
        "paper": the mixes of Sec. VII (fixed for D = 25, drawn per seed otherwise).
    compute : {"shifted_exponential", "deterministic"}
        Device compute-time model.
    setup_fraction : float
        Mean setup time / deterministic time of the shifted exponential (0.5).
    dropout : float
        Probability that a device is absent in a round (independent, keyed draws).
    """

    kind: Literal["lte_star"] = "lte_star"
    n_devices: int = Field(25, ge=1)
    uplink_bps: float = Field(5e6, gt=0)
    downlink_bps: float = Field(10e6, gt=0)
    loss: float = Field(0.1, ge=0, lt=1)
    header_overhead: float = Field(0.1, ge=0)
    packet_bits: int | None = Field(None, gt=0)
    server_mac_rate: float = Field(8.24e12, gt=0)
    device_mac_rates: Literal["paper"] | list[float] = "paper"
    compute: Literal["shifted_exponential", "deterministic"] = "shifted_exponential"
    setup_fraction: float = Field(0.5, ge=0)
    dropout: float = Field(0.0, ge=0, lt=1)

    @field_validator("device_mac_rates")
    @classmethod
    def _positive_rates(cls, v: Any) -> Any:
        if isinstance(v, list):
            bad = [(i, r) for i, r in enumerate(v) if not r > 0]
            if bad:
                raise ValueError(f"device_mac_rates must be positive; entry {bad[0][0]} is {bad[0][1]}")
        return v

    @model_validator(mode="after")
    def _rates_match(self) -> "NetworkSpec":
        if isinstance(self.device_mac_rates, list) and len(self.device_mac_rates) != self.n_devices:
            raise ValueError(f"device_mac_rates has {len(self.device_mac_rates)} entries for n_devices = {self.n_devices}")
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
        Registered protocol name (``fednet list``).
    label : str, optional
        Name in plots and summaries (default: the protocol name); unique within the study.
    params : dict
        The protocol's parameters (validated by its ``Config``).
    epochs : int, optional
        Overrides the study's ``epochs`` for this run.
    """

    protocol: str
    label: str | None = None
    params: dict[str, Any] = {}
    epochs: int | None = Field(None, ge=0)

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
            try:
                cfg = cls.Config.model_validate(run.params)
                cls.check(cfg, self.network.n_devices)
            except ValidationError as e:
                for err in e.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    problems.append(f"runs[{i}] ({run.name}).params.{loc}: {err['msg']} (got {err.get('input')!r})")
            except ValueError as e:
                problems.append(f"runs[{i}] ({run.name}).params: {e}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

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
