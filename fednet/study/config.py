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

A run entry may sweep a parameter grid, expanded into one labelled run per combination
(:func:`expand_sweeps`)::

    [[runs]]
    label = "CodedPaddedFL"            # -> "CodedPaddedFL alpha=6", "CodedPaddedFL alpha=16", ...
    protocol = "codedpaddedfl"
    params = { groups = 1, mode = "timing" }
    sweep = { alpha = [6, 16, 23] }

``[data] feature_seed = "per_seed"`` makes the random-Fourier draw vary with the study seed
(paired across runs), so that intervals over seeds include it.

Every protocol's ``params`` are validated by that protocol's ``Config`` when the study is
loaded, together with :meth:`~fednet.protocol.base.Protocol.check` against the network, so
a bad study fails before anything is computed or written. :func:`load_study` reports every
problem of a file at once, one per line, with a "did you mean" for unknown keys, and applies
overrides (deep-merged tables, ``--set key.path=value`` assignments, run selection, an
epoch cap) before validating, so an override is checked exactly like the file.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import os
import tomllib
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fednet.protocol import registry

__all__ = ["Study", "DataSpec", "NetworkSpec", "TrainingSpec", "RunSpec", "load_study", "StudyError",
           "expand_sweeps", "run_problems", "deep_merge", "parse_assignment", "apply_assignment", "select_runs"]


class StudyError(ValueError):
    """A study file that cannot be read or does not validate (the message names every problem)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSpec(_Strict):
    """The data pipeline: dataset, random-Fourier features, split across devices.

    Attributes
    ----------
    dataset : {"digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100", "svhn"}
        The last four (DReS-FL's other Table 2 columns) validate but are refused when loaded
        (:data:`fednet.learning.datasets.UNAVAILABLE`: not on this machine).
    features : {"rbf", "raw"}
        ``rbf``: random-Fourier features (Schlegel et al.); ``raw``: the pixels scaled to [0, 1]
        (the MLPs of DReS-FL).
    rbf_gamma : float, optional
        RBF kernel parameter; default :func:`fednet.learning.features.default_gamma`.
    n_components : int
        Random-Fourier features d (2000 in Sec. VII).
    feature_seed : int or "per_seed"
        Seed of the random frequencies. An int fixes one draw for every run and seed (the draw is
        then part of the problem). ``"per_seed"`` makes the draw a random factor: study seed ``s``
        uses ``random_state = s`` for the random-Fourier draw, the same for every run at that seed
        (paired like every other draw), so the spread over seeds includes the feature draw. The
        partition's own draw keeps seed 0 either way.
    partition : {"noniid", "skewed_label", "dirichlet", "iid"}
        ``noniid``: sorted by label and cut into D consecutive shards (Sec. VII); ``skewed_label``:
        the same cut, DReS-FL's skewed label partition (Sec. 6.1).
    dirichlet_alpha : float, optional
        Concentration for ``partition = "dirichlet"``.
    """

    dataset: Literal["digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100", "svhn"] = "digits"
    features: Literal["rbf", "raw"] = "rbf"
    rbf_gamma: float | None = Field(None, gt=0)
    n_components: int = Field(2000, ge=1)
    feature_seed: Annotated[int, Field(ge=0)] | Literal["per_seed"] = 0
    partition: Literal["noniid", "skewed_label", "dirichlet", "iid"] = "noniid"
    dirichlet_alpha: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _alpha_for_dirichlet(self) -> "DataSpec":
        if self.partition == "dirichlet" and self.dirichlet_alpha is None:
            raise ValueError("partition = 'dirichlet' needs dirichlet_alpha")
        return self

    def feature_seed_for(self, seed: int) -> int:
        """The random-Fourier ``random_state`` used at study seed ``seed`` (see ``feature_seed``)."""
        return seed if self.feature_seed == "per_seed" else self.feature_seed

    @property
    def partition_seed(self) -> int:
        """Seed of the partition's draw (``feature_seed`` when fixed, 0 when ``"per_seed"``)."""
        return 0 if self.feature_seed == "per_seed" else self.feature_seed


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
    availability : {"bernoulli", "dresfl_extreme"}
        ``bernoulli``: every device absent with probability ``dropout``; ``dresfl_extreme``: DReS-FL's
        extreme scenario (Sec. 6.1), per-client rates 0.99 w.p. 0.5 else U[0, 0.1], drawn from the
        seed (:class:`fednet.sim.dropout.ExtremeDropout`).
    min_reliable : int, optional
        With ``dresfl_extreme``: condition the rate draw on at least this many clients with a rate
        below 0.99 (e.g. 9, DReS-FL's recovery threshold with K = T = 1); a study using it must say so.
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
    availability: Literal["bernoulli", "dresfl_extreme"] = "bernoulli"
    min_reliable: int | None = Field(None, ge=0)

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
    sweep : dict of str to list
        A parameter grid: ``sweep = { alpha = [6, 16, 23], groups = [1, 5] }`` expands this entry
        into one run per combination (Cartesian product, in the order written), each with those
        values merged into ``params``. Labels: ``label`` formatted with the values when it holds
        ``{alpha}``-style fields (sweep keys or params), else ``"<label> alpha=6, groups=1"``. Expanded when the study is
        loaded (:func:`expand_sweeps`); a validated study holds only expanded runs.
    """

    protocol: str
    label: str | None = None
    params: dict[str, Any] = {}
    epochs: int | None = Field(None, ge=0)
    sweep: dict[str, list[Any]] = Field({}, description="parameter grid expanded into labelled runs when loaded")

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
        Stop a run at the first round reaching this accuracy. Never below ``max(targets)``: a
        lower ``stop_at`` is raised to it, so no requested target is hidden (default:
        ``max(targets)``).
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

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("runs"), list):
            data = {**data, "runs": expand_sweeps(data["runs"])}
        return data

    @model_validator(mode="after")
    def _runs(self) -> "Study":
        labels = [r.name for r in self.runs]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"run labels must be unique; repeated: {dup}")
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline {self.baseline!r} is not the label of a run{_did_you_mean(self.baseline, labels)}; "
                             f"labels: {labels}")
        problems = run_problems([r.model_dump() for r in self.runs], self.network.n_devices)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def run_epochs(self, run: RunSpec) -> int:
        """Maximum rounds of ``run`` (its own ``epochs`` or the study's)."""
        return self.epochs if run.epochs is None else run.epochs

    @property
    def stop_accuracy(self) -> float | None:
        """Accuracy at which runs stop early (None: run every epoch)."""
        if self.run_to_end:
            return None
        top = max(self.targets) if self.targets else None
        if self.stop_at is None:
            return top
        return self.stop_at if top is None else max(self.stop_at, top)


# -- sweeps, overrides, suggestions --------------------------------------------------------------


def _did_you_mean(name: Any, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``candidates`` (difflib), else ``""``."""
    close = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def expand_sweeps(runs: list[Any]) -> list[Any]:
    """Expand every run entry holding a ``sweep`` grid into one entry per combination.

    Parameters
    ----------
    runs : list of dict
        Raw ``[[runs]]`` entries (entries that are not dicts or have no ``sweep`` pass through).

    Returns
    -------
    list of dict
        The runs, each sweep replaced by its combinations in ``itertools.product`` order; each
        combination's values are merged into ``params`` and named in the label
        (:class:`RunSpec` ``sweep``).

    Raises
    ------
    ValueError
        If a sweep is not a table of non-empty lists, or a label template names a key the
        sweep lacks (the message names the run and key).
    """
    out: list[Any] = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not run.get("sweep"):
            out.append(run)
            continue
        grid = run["sweep"]
        base = run.get("label") or run.get("protocol") or "run"
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise ValueError(f"runs[{i}] ({base}).sweep must be a table of non-empty lists, got {grid!r}")
        keys = list(grid)
        for combo in itertools.product(*(grid[k] for k in keys)):
            values = dict(zip(keys, combo))
            if "{" in base:
                try:
                    label = base.format(**{**dict(run.get("params") or {}), **values})
                except (KeyError, IndexError, ValueError) as e:
                    raise ValueError(f"runs[{i}].label {base!r} names {e}, which neither sweep {keys} "
                                     "nor params holds") from None
            else:
                label = f"{base} " + ", ".join(f"{k}={v}" for k, v in values.items())
            entry = {k: v for k, v in run.items() if k != "sweep"}
            entry["label"] = label
            entry["params"] = {**dict(run.get("params") or {}), **values}
            out.append(entry)
    return out


def run_problems(runs: list[Any], n_devices: Any) -> list[str]:
    """Every problem of the runs' protocols and parameters, one message per problem.

    Parameters
    ----------
    runs : list of dict
        Raw or dumped run entries (``protocol``, ``label``, ``params``).
    n_devices : int or None
        The network size for :meth:`~fednet.protocol.base.Protocol.check` (skipped if not an int).

    Returns
    -------
    list of str
        ``"runs[i] (label).params.key: message (got value)"``; unknown keys and protocol names
        carry a "did you mean" suggestion.
    """
    problems: list[str] = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("protocol"), str):
            continue
        name = run.get("label") or run["protocol"]
        try:
            cls = registry.get(run["protocol"])
        except KeyError as e:
            problems.append(f"runs[{i}] ({name}): {e.args[0]}{_did_you_mean(run['protocol'], registry.names())}")
            continue
        params = run.get("params") or {}
        try:
            cfg = cls.Config.model_validate(params)
            if isinstance(n_devices, int):
                cls.check(cfg, n_devices)
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    hint = _did_you_mean(err["loc"][-1], cls.Config.model_fields)
                    problems.append(f"runs[{i}] ({name}).params.{loc}: {err['msg']}{hint}")
                else:
                    msg = err["msg"].removeprefix("Value error, ")
                    problems.append(f"runs[{i}] ({name}).params.{loc}: {msg} (got {err.get('input')!r})")
        except ValueError as e:
            problems.append(f"runs[{i}] ({name}).params: {e}")
    return problems


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``override``, tables merged key by key (lists and scalars replaced)."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """Split ``"key.path=value"`` into its path and a TOML-parsed value.

    The path is split at dots; a segment in double quotes may hold dots and ``=``
    (``runs."CodedPaddedFL alpha=23".params.alpha=16``). The value, after the first ``=``
    outside quotes, is read as a TOML value (``0.1``, ``true``, ``[1, 2]``, ``"x"``,
    ``{ alpha = 6 }``); text that is not TOML is taken as a bare string (``mode=timing``).

    Raises
    ------
    StudyError
        If there is no ``=`` or the key is empty.
    """
    path: list[str] = []
    seg, quoted, i = "", False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == ".":
            path.append(seg.strip())
            seg = ""
        elif not quoted and ch == "=":
            break
        else:
            seg += ch
        i += 1
    path.append(seg.strip())
    value = text[i + 1:]
    if i >= len(text) or quoted or not all(path):
        raise StudyError(f"--set {text!r}: expected key.path=value, e.g. network.dropout=0.1 "
                         '(quote a segment holding dots or "=": runs."CodedPaddedFL alpha=23".epochs=50)')
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return path, parsed


def apply_assignment(raw: dict[str, Any], path: Sequence[str], value: Any, *, text: str = "") -> None:
    """Set ``raw[path] = value`` in place (missing tables are created; validation comes later).

    A path segment addressing a list (``runs``) is an index (``runs.0.params.alpha``), a run
    label (``runs.Conventional FL.epochs``) or ``*`` (every entry: ``runs.*.params.mode``).

    Raises
    ------
    StudyError
        For an index out of range, an unknown run label (with a suggestion) or a path through a
        value that is not a table.
    """
    where = text or ".".join(path)
    node: Any = raw
    for j, seg in enumerate(path[:-1]):
        rest = path[j + 1:]
        if isinstance(node, list):
            if seg == "*":
                for item in node:
                    apply_assignment(item, rest, value, text=where)
                return
            if seg.lstrip("-").isdigit():
                idx = int(seg)
                if not -len(node) <= idx < len(node):
                    raise StudyError(f"--set {where}: index {idx} out of range ({len(node)} entries)")
                node = node[idx]
                continue
            labels = [r.get("label") or r.get("protocol") for r in node if isinstance(r, dict)]
            if seg not in labels:
                raise StudyError(f"--set {where}: no run labelled {seg!r}{_did_you_mean(seg, labels)}")
            node = node[labels.index(seg)]
            continue
        if not isinstance(node, dict):
            raise StudyError(f"--set {where}: {'.'.join(path[:j])} is not a table")
        node = node.setdefault(seg, {})
    if not isinstance(node, dict):
        raise StudyError(f"--set {where}: {'.'.join(path[:-1])} is not a table")
    node[path[-1]] = value


def select_runs(raw_runs: list[Any], labels: Sequence[str], baseline: str | None) -> list[Any]:
    """The runs named in ``labels`` (plus the baseline, kept for the speed-ups), in study order.

    Raises
    ------
    StudyError
        For a label no run has (with a suggestion and the list of labels).
    """
    have = [r.get("label") or r.get("protocol") for r in raw_runs]
    unknown = [x for x in labels if x not in have]
    if unknown:
        hints = "; ".join(f"{x!r}{_did_you_mean(x, have)}" for x in unknown)
        raise StudyError(f"--runs: no run labelled {hints}; labels: {have}")
    keep = set(labels) | ({baseline} if baseline else set())
    return [r for r, name in zip(raw_runs, have) if name in keep]


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model that owns the last key of an error location inside a study."""
    model: Any = Study
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        for arg in (ann, *typing.get_args(ann)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
                break
        else:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _format_errors(e: ValidationError) -> list[str]:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(study)"
        msg = err["msg"].removeprefix("Value error, ")
        inp = err.get("input")
        if err["type"] == "extra_forbidden":
            model = _model_at(err["loc"])
            hint = _did_you_mean(err["loc"][-1], model.model_fields) if model else ""
            lines.append(f"  {loc}: {msg}{hint}")
            continue
        shown = "" if isinstance(inp, dict) or err["type"] == "value_error" else f" (got {inp!r})"
        for line in (msg + shown).split("\n"):
            lines.append(f"  {line}" if line.startswith("runs[") else f"  {loc}: {line}")
    return lines


def load_study(path: str | os.PathLike, *, sets: Sequence[str] = (), only_runs: Sequence[str] | None = None,
               max_epochs: int | None = None, **overrides: Any) -> Study:
    """Read a study TOML file, apply overrides, and validate it.

    Overrides are applied in this order: ``overrides`` (deep-merged), ``sets``, ``max_epochs``,
    sweep expansion, ``only_runs``; the result is validated as a whole, exactly like the file.

    Parameters
    ----------
    path : path-like
    sets : sequence of str
        ``"key.path=value"`` assignments (the CLI's ``--set``; :func:`apply_assignment`).
    only_runs : sequence of str, optional
        Keep only the runs with these labels (the baseline is always kept).
    max_epochs : int, optional
        Maximum rounds of every run (the study's ``epochs`` and every run's own).
    **overrides
        Keys merged into the file's; tables merge key by key (``network={"dropout": 0.1}``
        changes only the dropout), lists and scalars replace (``seeds=[3]``). ``None`` values
        are ignored.

    Raises
    ------
    StudyError
        For a missing file, invalid TOML, a bad assignment, or a study that does not validate;
        the message lists every problem on its own line, naming each key and value (unknown keys
        with a "did you mean" suggestion).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: invalid TOML: {e}") from None
    raw = deep_merge(raw, {k: v for k, v in overrides.items() if v is not None})
    raw = copy.deepcopy(raw)
    for text in sets:
        keys, value = parse_assignment(text)
        apply_assignment(raw, keys, value, text=text)
    if max_epochs is not None:
        raw["epochs"] = max_epochs
        for r in raw.get("runs", []) if isinstance(raw.get("runs"), list) else []:
            if isinstance(r, dict) and "epochs" in r:
                r["epochs"] = max_epochs
    note = f" (with --set {', '.join(sets)})" if sets else ""
    if isinstance(raw.get("runs"), list):
        try:
            raw["runs"] = expand_sweeps(raw["runs"])
        except ValueError as e:
            raise StudyError(f"{path}: invalid study{note}:\n  {e}") from None
        if only_runs:
            raw["runs"] = select_runs(raw["runs"], only_runs, raw.get("baseline"))
    try:
        return Study.model_validate(raw)
    except ValidationError as e:
        lines = _format_errors(e)
        if not any(err["loc"] == () for err in e.errors()) and isinstance(raw.get("runs"), list):
            n_dev = raw.get("network", {}).get("n_devices", NetworkSpec.model_fields["n_devices"].default) \
                if isinstance(raw.get("network", {}), dict) else None
            lines += [f"  {p}" for p in run_problems(raw["runs"], n_dev)]
        raise StudyError(f"{path}: invalid study{note}:\n" + "\n".join(lines)) from None
