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

import math
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fednet.errors import ConfigError
from fednet.protocol import registry

__all__ = ["Study", "DataSpec", "NetworkSpec", "TrainingSpec", "RunSpec", "load_study", "StudyError", "slug",
           "RESERVED_NAMES"]

#: File and folder names a study's output folder holds besides the run folders (a run label must
#: not map to one of them).
RESERVED_NAMES = frozenset({"summary.json", "study.json", "timing.json", "accuracy_vs_time.png", ".fednet-output"})

#: Largest seed accepted (seeds feed ``numpy.random.SeedSequence``; kept to 63 bits so they also fit int64).
MAX_SEED = 2**63 - 1


class StudyError(ConfigError):
    """A study file that cannot be read or does not validate (the message names every problem).

    A :class:`fednet.errors.ConfigError` (hence a ``ValueError``).
    """


def slug(label: str) -> str:
    """A file-system-safe directory name for a run label (runs of other characters become ``_``)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
    return s if s and s not in {".", ".."} else "run"


class _Strict(BaseModel):
    # Non-finite floats (inf, nan: TOML has both) are refused in every field at load time.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    n_components: int = Field(2000, ge=1, le=100_000)
    feature_seed: int = Field(0, ge=0, le=MAX_SEED)
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
        D, in [1, 10000].
    uplink_bps, downlink_bps : float
        bit/s (5e6 and 10e6), finite and at least 1 bit/s.
    loss : float
        Per-packet loss probability in [0, 0.999] (0.1); 1 would never deliver.
    header_overhead : float
        Fraction (0.1), in [0, 100].
    packet_bits : int, optional
        Packet size on the air, in [1, 2**40] bits; omitted: each message is one packet (the
        paper's reading).
    server_mac_rate : float
        MAC/s (8.24e12), finite and at least 1 MAC/s.
    device_mac_rates : "paper" or list of float
        "paper": the mixes of Sec. VII (fixed for D = 25, drawn per seed otherwise); a list: one
        finite rate of at least 1 MAC/s per device.
    compute : {"shifted_exponential", "deterministic"}
        Device compute-time model.
    setup_fraction : float
        Mean setup time / deterministic time of the shifted exponential (0.5), in [0, 1000].
    dropout : float
        Probability that a device is absent in a round (independent, keyed draws), in [0, 1).

    Every float must be finite (``inf`` and ``nan`` are refused with the key named).
    """

    kind: Literal["lte_star"] = "lte_star"
    n_devices: int = Field(25, ge=1, le=10_000)
    uplink_bps: float = Field(5e6, gt=0)
    downlink_bps: float = Field(10e6, gt=0)
    loss: float = Field(0.1, ge=0, lt=1)
    header_overhead: float = Field(0.1, ge=0, le=100)
    packet_bits: int | None = Field(None, gt=0, le=2**40)
    server_mac_rate: float = Field(8.24e12, gt=0)
    device_mac_rates: Literal["paper"] | list[float] = "paper"
    compute: Literal["shifted_exponential", "deterministic"] = "shifted_exponential"
    setup_fraction: float = Field(0.5, ge=0, le=1000)
    dropout: float = Field(0.0, ge=0, lt=1)

    @field_validator("uplink_bps", "downlink_bps", "server_mac_rate")
    @classmethod
    def _at_least_one(cls, v: float, info: Any) -> float:
        if v < 1:
            unit = "MAC/s" if info.field_name == "server_mac_rate" else "bit/s"
            raise ValueError(f"{info.field_name} must be at least 1 {unit}, got {v!r}")
        return v

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: float) -> float:
        if v > 0.999:
            raise ValueError(f"loss must be at most 0.999 (each packet is resent until it arrives), got {v!r}")
        return v

    @field_validator("device_mac_rates")
    @classmethod
    def _positive_rates(cls, v: Any) -> Any:
        if isinstance(v, list):
            bad = [(i, r) for i, r in enumerate(v) if not (math.isfinite(r) and r >= 1)]
            if bad:
                raise ValueError(f"device_mac_rates must be finite and at least 1 MAC/s; "
                                 f"entry {bad[0][0]} is {bad[0][1]!r}")
        return v

    @model_validator(mode="after")
    def _rates_match(self) -> "NetworkSpec":
        if isinstance(self.device_mac_rates, list) and len(self.device_mac_rates) != self.n_devices:
            raise ValueError(f"device_mac_rates has {len(self.device_mac_rates)} entries for n_devices = {self.n_devices}")
        return self


class TrainingSpec(_Strict):
    """Hyperparameters of eqs. (2)-(5) (Sec. VII: mu = 6.0, x0.8 at 200 and 350, lambda = 9e-6)."""

    learning_rate: float = Field(6.0, gt=0, le=1e6)
    lr_milestones: list[int] = [200, 350]
    lr_decay: float = Field(0.8, gt=0, le=1e6)
    weight_decay: float = Field(9e-6, ge=0, le=1e6)

    @field_validator("lr_milestones")
    @classmethod
    def _milestones(cls, v: list[int]) -> list[int]:
        bad = [m for m in v if not 1 <= m <= 10**7]
        if bad:
            raise ValueError(f"lr_milestones must be epochs in [1, 10000000], got {bad}")
        return v


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
    label: str | None = Field(None, min_length=1, max_length=200)
    params: dict[str, Any] = {}
    epochs: int | None = Field(None, ge=0, le=10**7)

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
    strict : bool
        False (default): a round that cannot complete because too few devices are available or
        finish is recorded in the trace (``skipped = 1``, ``skip_reason``) and training goes on.
        True: such a round stops the study with :class:`~fednet.protocol.base.StragglerShortfall`.

    Cross-checks at load time: run labels are unique as folder names (after :func:`slug`,
    ignoring case) and are not the name of an output file; a ``network.dropout`` that leaves fewer
    devices on average than a run needs each round is refused (the protocol's
    ``check_dropout``).
    """

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    seeds: list[int] = Field([0], min_length=1)
    targets: list[float] = []
    baseline: str | None = None
    epochs: int = Field(100, ge=0, le=10**7)
    stop_at: float | None = Field(None, gt=0, le=1)
    run_to_end: bool = False
    record_views: bool = False
    strict: bool = False
    data: DataSpec = DataSpec()
    network: NetworkSpec = NetworkSpec()
    training: TrainingSpec = TrainingSpec()
    runs: list[RunSpec] = Field(min_length=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(not 0 <= s <= MAX_SEED for s in v):
            raise ValueError(f"seeds must be in [0, 2**63 - 1], got {v}")
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

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v.strip() in {"", ".", ".."} or any(ch in v for ch in "/\\\0"):
            raise ValueError(f"name must be a plain name without '/', backslash or NUL (it names the default "
                             f"output folder results/<name>), got {v!r}")
        return v

    @model_validator(mode="after")
    def _runs(self) -> "Study":
        labels = [r.name for r in self.runs]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"run labels must be unique; repeated: {dup}")
        folders: dict[str, str] = {}
        for label in labels:
            key = slug(label).lower()
            if key in folders:
                raise ValueError(f"run labels {folders[key]!r} and {label!r} map to the same output folder "
                                 f"{slug(label)!r}; make them differ in letters, digits or '._-'")
            if key in RESERVED_NAMES:
                raise ValueError(f"run label {label!r} maps to the folder {slug(label)!r}, the name of an output "
                                 f"file; choose another label")
            folders[key] = label
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
                cfg = cls.Config.model_validate(run.params, strict=True)
                cls.check(cfg, self.network.n_devices)
                check_dropout = getattr(cls, "check_dropout", None)
                if check_dropout is not None and self.network.dropout > 0:
                    check_dropout(cfg, self.network.n_devices, self.network.dropout)
            except ValidationError as e:
                for err in e.errors():
                    loc = "".join(f".{p}" for p in err["loc"])
                    inp = err.get("input")
                    shown = "" if err["type"] == "value_error" or isinstance(inp, dict) else f" (got {inp!r})"
                    problems.append(f"runs[{i}] ({run.name}).params{loc}: "
                                    f"{err['msg'].removeprefix('Value error, ')}{shown}")
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
        For a missing, unreadable or non-UTF-8 file, invalid TOML, or a study that does not
        validate; the message names every offending key and value.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except IsADirectoryError:
        raise StudyError(f"study file {path} is a folder, not a TOML file") from None
    except OSError as e:
        raise StudyError(f"cannot read study file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise StudyError(f"{path}: not UTF-8 text (byte {e.start}): a study is a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: invalid TOML: {e}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Study.model_validate(raw, strict=True)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(study)"
            msg = err["msg"].removeprefix("Value error, ")
            inp = err.get("input")
            shown = "" if isinstance(inp, dict) or err["type"] == "value_error" else f" (got {inp!r})"
            lines.append(f"  {loc}: {msg}{shown}")
        raise StudyError(f"{path}: invalid study:\n" + "\n".join(lines)) from None
