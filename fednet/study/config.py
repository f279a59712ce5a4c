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

A run entry may sweep a grid over any key a run may set, expanded into one labelled run per
combination (:func:`expand_sweeps`, :func:`sweep_target`)::

    [[runs]]
    label = "CodedPaddedFL"            # -> "CodedPaddedFL alpha=6", "CodedPaddedFL alpha=16", ...
    protocol = "codedpaddedfl"
    params = { groups = 1, mode = "timing" }
    sweep = { alpha = [6, 16, 23] }

    [[runs]]
    label = "CodedSecAgg {rule} N={count}"     # 2 grouping rules x 3 group counts: six runs
    protocol = "codedsecagg"
    params = { z = 1, mode = "timing" }
    sweep = { "network.groups.rule" = ["consecutive", "random"], "network.groups.count" = [1, 2, 4] }

``--set``, ``--runs`` and the output folders name runs by their labels after expansion; ``--set`` on
a key a sweep sets is refused (:func:`load_study`).

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
import fnmatch
import itertools
import math
import os
import re
import tomllib
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from fednet.errors import ConfigError
from fednet.plugins import import_callable, is_object_path, search_path
from fednet.protocol import registry

__all__ = ["Study", "DataSpec", "NetworkSpec", "GroupSpec", "TrainingSpec", "RunSpec", "load_study", "StudyError",
           "expand_sweeps", "sweep_target", "run_problems", "deep_merge", "parse_assignment", "apply_assignment", "select_runs",
           "slug", "RESERVED_NAMES"]

#: File and folder names a study's output folder holds besides the run folders (a run label must
#: not map to one of them).
RESERVED_NAMES = frozenset({"summary.json", "study.json", "timing.json", "provenance.json", "accuracy_vs_time.png",
                            ".fednet-output"})

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


#: The data sets fednet names (the last four of DReS-FL's Table 2 are refused when loaded; ``handwritten``: vertical).
_DATASET_NAMES = ("digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100", "svhn", "handwritten")


class DataSpec(_Strict):
    """The data pipeline: dataset, random-Fourier features, split across devices.

    Attributes
    ----------
    dataset : {"digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100", "svhn"} or "package.module:loader"
        The last four (DReS-FL's other Table 2 columns) validate but are refused when loaded
        (:data:`fednet.learning.datasets.UNAVAILABLE`: not on this machine). A user's loader, imported like a
        ``module:Class`` protocol (beside the study file), returns ``(x_train, y_train, x_test, y_test)``
        (:func:`fednet.learning.datasets.load_plugin_dataset`).
    features : {"rbf", "raw"}
        ``rbf``: random-Fourier features (Schlegel et al.); ``raw``: the pixels as ``preprocess`` leaves them
        (the MLPs of DReS-FL).
    preprocess : {"unit", "standardize"}
        Input scaling before the features and the split. ``unit`` (default): pixels scaled to [0, 1] (MNIST and
        Fashion-MNIST / 255, digits / 16; a user's loader as it gives them). ``standardize``: each feature minus
        the training set's mean, divided by its standard deviation (1 where it is 0), the test set with the
        training statistics (:func:`fednet.learning.datasets.standardize`). DReS-FL (Shao et al., NeurIPS 2022,
        Sec. 6.1, App. B) does not state its preprocessing; a study using ``standardize`` must say so. With
        ``features = "rbf"`` the default ``rbf_gamma`` is the one for pixels in [0, 1]: set ``rbf_gamma``.
        Horizontal split only (the vertical loaders scale their own data).
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
    split : {"horizontal", "vertical"}
        ``horizontal`` (default): every device holds some examples, all features (the pipeline above).
        ``vertical``: every device holds a block of features of *every* example and the labels sit at
        the server (FedVS, Li, Yao, Liu, ICML 2023, Sec. 3 and 6.1): ``fashion-mnist`` / ``mnist`` are
        split evenly over ``network.n_devices`` clients, ``handwritten`` (UCI mfeat) gives one of its 6
        views to each of 6 clients (:func:`fednet.learning.vertical.load_vertical`); the raw features
        are used (``features``, ``rbf_gamma``, ``n_components``, ``feature_seed``, ``partition`` and
        ``dirichlet_alpha`` have no meaning there and are refused when set).
    max_train, max_test : int, optional
        ``split = "vertical"`` only: keep the first training / test examples (reduced studies).
    """

    dataset: str = Field("digits", json_schema_extra={"examples": list(_DATASET_NAMES) + ["package.module:loader"]})
    features: Literal["rbf", "raw"] = "rbf"
    preprocess: Literal["unit", "standardize"] = "unit"
    rbf_gamma: float | None = Field(None, gt=0)
    n_components: int = Field(2000, ge=1, le=100_000)
    feature_seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | Literal["per_seed"] = 0
    partition: Literal["noniid", "skewed_label", "dirichlet", "iid"] = "noniid"
    dirichlet_alpha: float | None = Field(None, gt=0)
    split: Literal["horizontal", "vertical"] = "horizontal"
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)

    @field_validator("dataset")
    @classmethod
    def _dataset_name_or_loader(cls, name: str) -> str:
        """A bundled name, or a user's ``"package.module:loader"`` that imports (issue 30, item 7)."""
        if name in _DATASET_NAMES:
            return name
        if not is_object_path(name):
            raise ValueError(f"must be one of {list(_DATASET_NAMES)} or a loader 'package.module:loader', got {name!r}")
        import_callable(name, "dataset loader")
        return name

    @model_validator(mode="after")
    def _alpha_for_dirichlet(self) -> "DataSpec":
        if self.partition == "dirichlet" and self.dirichlet_alpha is None:
            raise ValueError("partition = 'dirichlet' needs dirichlet_alpha")
        return self

    @model_validator(mode="after")
    def _split_fields(self) -> "DataSpec":
        if self.split == "vertical":
            if self.dataset not in _VERTICAL_DATASETS:
                raise ValueError(f"split = 'vertical' needs dataset in {list(_VERTICAL_DATASETS)}, got "
                                 f"{self.dataset!r}")
            # a key counts when it says something: a default written out (model_dump round trips) is harmless
            unused = sorted(k for k in self.model_fields_set & _HORIZONTAL_ONLY
                            if getattr(self, k) != type(self).model_fields[k].default)
            if unused:
                raise ValueError(f"{', '.join(unused)} ha{'s' if len(unused) == 1 else 've'} no meaning for "
                                 f"split = 'vertical' (the clients hold raw feature blocks); remove "
                                 f"{'it' if len(unused) == 1 else 'them'}")
        else:
            if self.dataset == "handwritten":
                raise ValueError("dataset = 'handwritten' is a multi-view (vertical) data set: set split = 'vertical'")
            given = sorted(k for k in ("max_train", "max_test") if getattr(self, k) is not None)
            if given:
                raise ValueError(f"{', '.join(given)} only apply to split = 'vertical'")
        return self

    @property
    def vertical(self) -> bool:
        """Whether the devices hold feature blocks of every example (``split = "vertical"``)."""
        return self.split == "vertical"

    def feature_seed_for(self, seed: int) -> int:
        """The random-Fourier ``random_state`` used at study seed ``seed`` (see ``feature_seed``)."""
        return seed if self.feature_seed == "per_seed" else self.feature_seed

    @property
    def partition_seed(self) -> int:
        """Seed of the partition's draw (``feature_seed`` when fixed, 0 when ``"per_seed"``)."""
        return 0 if self.feature_seed == "per_seed" else self.feature_seed


#: Data sets a vertical split can load (:data:`fednet.learning.vertical.VERTICAL_DATASETS`).
_VERTICAL_DATASETS = ("fashion-mnist", "mnist", "handwritten")
#: Fields of the horizontal pipeline that a vertical split refuses when set.
_HORIZONTAL_ONLY = frozenset({"features", "preprocess", "rbf_gamma", "n_components", "feature_seed", "partition",
                              "dirichlet_alpha"})

#: Fields of [network] that only the star builders (lte_star, lte_cells) read; another kind refuses them when set.
_STAR_ONLY = frozenset({"uplink_bps", "downlink_bps", "loss", "header_overhead", "packet_bits", "hop_latency_s",
                        "energy", "server_mac_rate", "device_mac_rates"})

_RATE = TypeAdapter(Annotated[float, Field(ge=1, allow_inf_nan=False)])
_LOSS = TypeAdapter(Annotated[float, Field(ge=0, le=0.999, allow_inf_nan=False)])
_RATES = TypeAdapter(list[Annotated[float, Field(ge=1, allow_inf_nan=False)]])
_LOSSES = TypeAdapter(list[Annotated[float, Field(ge=0, le=0.999, allow_inf_nan=False)]])


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
    rule : {"consecutive", "random", "mac_balanced", "cells"}
        How ``count`` groups are formed (:mod:`fednet.topologies.groups`): consecutive runs of
        devices (the papers' grouping), a random permutation cut into balanced groups, devices
        dealt by MAC rate so every group has a similar mix, or one group per cell of the network
        (``cells``: the devices' ``cell`` attribute, set by ``lte_cells``, ``radio_star`` and
        ``hierarchy``; ``count`` must be the number of cells that hold devices, checked when the study is
        loaded), so that CodedSecAgg's groups and aggregation tree follow the cells (issue 28, item 5).
    count : int, optional
        N. A protocol with a ``groups`` parameter takes it when its run does not set one.
    membership : list of list of int, optional
        Explicit groups (a partition of ``0..D-1``), instead of ``rule`` and ``count``.
    seed : int, optional
        Fixes the ``random`` rule's permutation across the study's seeds (default: the run's seed).

    TOML: ``groups = 4`` (four consecutive groups), ``groups = { rule = "random", count = 4 }`` or
    ``groups = { membership = [[0, 1, 2], [3, 4]] }``.
    """

    rule: Literal["consecutive", "random", "mac_balanced", "cells"] = "consecutive"
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
        returning a networkx graph (:mod:`fednet.topologies`). The link, loss, packet, latency, energy and
        MAC-rate fields below reach ``lte_star`` and ``lte_cells`` only: another kind (``radio_star``, a user
        builder) refuses them when set to anything but their defaults, since it would ignore them (give them in
        ``params`` where the builder takes them).
    n_devices : int
        D, in [1, 10000].
    uplink_bps, downlink_bps : float, list of float, or distribution table
        bit/s (5e6 and 10e6), finite and at least 1 bit/s: one value, one per device, or a named
        distribution (:mod:`fednet.topologies.distributions`, e.g. ``{ dist = "uniform", low = 2e6, high = 8e6 }``).
    loss : float, list of float, or distribution table
        Per-packet loss probability in [0, 0.999] (0.1; 1 would never deliver), likewise.
    header_overhead : float
        Fraction (0.1), in [0, 100].
    packet_bits : int, optional
        Packet size on the air, in [1, 2**40] bits; omitted: each message is one packet (the
        paper's reading).
    hop_latency_s : float
        Latency floor of every hop, simulated seconds in [0, 10] (0: the papers'; about 0.01 for LTE, 0.004 for
        5G NR eMBB's one-way user-plane target, 3GPP TR 38.913 Sec. 7.5): scheduling, grant, core network.
    energy : table, optional
        The devices' energy model (``tx_power_w``, ``rx_power_w``, ``kappa``, ``cpu_hz``, ``cycles_per_mac``;
        :func:`fednet.topologies.lte.energy_attributes`): the trace gains ``energy_j`` per row and the summary the
        energy to each target; omitted: none (the papers').
    server_mac_rate : float
        MAC/s (8.24e12), finite and at least 1 MAC/s.
    device_mac_rates : "paper", list of float, or distribution table
        "paper": the mixes of Sec. VII (fixed for D = 25, drawn per seed otherwise); a list: one
        finite rate of at least 1 MAC/s per device.
    groups : GroupSpec, optional
        Group membership written on the topology (default: none; grouped protocols then cut the
        devices into their ``groups`` consecutive groups, as in the papers).
    params : dict
        Keyword arguments of the builder: a user builder's (``kind = "module:function"``), a built-in's
        (``radio_star``: ``rate_model`` one of ``"bler_target"``, ``"shannon"``, ``"cqi_table"``, ``n_cells``,
        ``scheduler``, ...; ``hierarchy``), or ``lte_cells``' ``n_cells``, ``scheduler`` (``"round_robin"`` or
        ``"proportional_fair"``, :data:`fednet.sim.cells.SCHEDULERS`) and ``snr_db`` (the devices' mean SNR in dB,
        which proportional fair needs); none for ``lte_star``.
    compute : {"shifted_exponential", "deterministic"}
        Device compute-time model.
    setup_fraction : float
        Mean setup time / deterministic time of the shifted exponential (0.5), in [0, 1000].
    dropout : float
        Probability that a device is absent in a round (independent, keyed draws), in [0, 1).
    availability : {"bernoulli", "dresfl_extreme", "trace"}
        ``bernoulli``: every device absent with probability ``dropout``; ``dresfl_extreme``: DReS-FL's
        extreme scenario (Sec. 6.1), per-client rates 0.99 w.p. 0.5 else U[0, 0.1], drawn from the
        seed (:class:`fednet.sim.dropout.ExtremeDropout`); ``trace``: per-device on/off times from the CSV file
        ``availability_trace`` (:mod:`fednet.sim.availability_trace`).
    availability_trace : str, optional
        With ``availability = "trace"``: the CSV file (``device,on_s,off_s``), relative to the study file's folder,
        then the working folder; read and checked when the study is loaded, kept as an absolute path.
    min_reliable : int, optional
        With ``dresfl_extreme``: condition the rate draw on at least this many clients with a rate
        below 0.99 (e.g. 9, DReS-FL's recovery threshold with K = T = 1); a study using it must say so.
        Refused with another ``availability``.
    rates_seed : int, optional
        With ``dresfl_extreme``: draw the per-client dropout rates once, from this seed (an integer in
        [0, 2^63 - 1]), for every study seed, while each round's presence draws still follow the study seed
        (:class:`fednet.sim.dropout.ExtremeDropout`). The spread over seeds then measures the presence draws and
        training only, not the rate draw: the apparent reading of DReS-FL's Table 2 (Shao et al., NeurIPS 2022,
        Sec. 6.1), whose +-0.05 spreads over five runs a redraw per run cannot give. Default None: the rates are
        redrawn from each study seed. ``min_reliable`` then conditions this one draw. Refused with another
        ``availability``.

    Every float must be finite (``inf`` and ``nan`` are refused with the key named). Drawn values
    (distributions, "paper" rates for D != 25, random groups) come from streams keyed by the run's
    seed and the field, so changing one field's distribution leaves the others' draws unchanged.
    """

    kind: str = "lte_star"
    n_devices: int = Field(25, ge=1, le=10_000)
    uplink_bps: float | list[float] | dict[str, Any] = 5e6
    downlink_bps: float | list[float] | dict[str, Any] = 10e6
    loss: float | list[float] | dict[str, Any] = 0.1
    header_overhead: float = Field(0.1, ge=0, le=100)
    packet_bits: int | None = Field(None, gt=0, le=2**40)
    hop_latency_s: float = Field(0.0, ge=0, le=10)
    energy: dict[str, float] | None = None
    server_mac_rate: float = Field(8.24e12, gt=0)
    device_mac_rates: Literal["paper"] | list[float] | dict[str, Any] = "paper"
    groups: GroupSpec | None = None
    params: dict[str, Any] = {}
    compute: Literal["shifted_exponential", "deterministic"] = "shifted_exponential"
    setup_fraction: float = Field(0.5, ge=0, le=1000)
    dropout: float = Field(0.0, ge=0, lt=1)
    availability: Literal["bernoulli", "dresfl_extreme", "trace"] = "bernoulli"
    availability_trace: str | None = None
    min_reliable: int | None = Field(None, ge=0)
    rates_seed: int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("availability_trace")
    @classmethod
    def _trace_file(cls, v: str | None) -> str | None:
        """The trace file found (the study's folder, then the working folder), kept as an absolute path."""
        if v is None:
            return v
        from fednet.plugins import find_file

        try:
            return str(find_file(v))
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None

    @field_validator("server_mac_rate")
    @classmethod
    def _server_at_least_one(cls, v: float) -> float:
        if v < 1:
            raise ValueError(f"server_mac_rate must be at least 1 MAC/s, got {v!r}")
        return v

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
            bad = [(i, r) for i, r in enumerate(v) if isinstance(r, (int, float)) and not (math.isfinite(r) and r >= 1)]
            if bad:
                raise ValueError(f"device_mac_rates must be finite and at least 1 MAC/s; entry {bad[0][0]} is {bad[0][1]!r}")
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
        if self.energy is not None:
            from fednet.topologies.lte import energy_attributes

            try:
                energy_attributes(self.energy)
            except ValueError as e:
                raise ValueError(str(e)) from None
        if self.kind == "lte_cells":
            extra = sorted(set(self.params) - {"n_cells", "scheduler", "snr_db"})
            if extra:
                raise ValueError(f"lte_cells takes the network fields and params n_cells, scheduler, snr_db; "
                                 f"got {extra}")
            n_cells = self.params.get("n_cells", 1)
            if isinstance(n_cells, bool) or not isinstance(n_cells, int) or not 1 <= n_cells <= self.n_devices:
                raise ValueError(f"params.n_cells must be an integer in [1, n_devices = {self.n_devices}], "
                                 f"got {n_cells!r}")
            from fednet.topologies.lte import _check_scheduler

            scheduler = self.params.get("scheduler", "round_robin")
            try:
                _check_scheduler(scheduler, self.params.get("snr_db"), self.n_devices)
            except ValueError as e:
                raise ValueError(f"params.{e}") from None
            if scheduler == "proportional_fair" and self.params.get("snr_db") is None:
                raise ValueError("params.scheduler = 'proportional_fair' needs params.snr_db, the devices' mean SNR "
                                 "in dB (one value or one per device): the lte_cells links have rates but no channel")
        elif self.kind != "lte_star":
            check_builder_params(self.kind, self.params)
            # the star's fields reach lte_star and lte_cells only: another builder would ignore them
            ignored = sorted(k for k in self.model_fields_set & _STAR_ONLY
                             if getattr(self, k) != type(self).model_fields[k].default)
            if ignored:
                raise ValueError(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} not used by network "
                                 f"kind {self.kind!r}, which builds its links itself (only lte_star and lte_cells "
                                 f"read them); give what the builder takes in network.params, e.g. params = "
                                 f"{{ {ignored[0]} = ... }} where it has that parameter")
        if self.availability != "dresfl_extreme":
            given = [f"{k} = {getattr(self, k)!r}" for k in ("min_reliable", "rates_seed") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{' and '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to availability "
                                 f"= 'dresfl_extreme' (per-client dropout rates), got availability = "
                                 f"{self.availability!r}")
        if (self.availability == "trace") != (self.availability_trace is not None):
            raise ValueError("availability = 'trace' and availability_trace go together: set both (the CSV file "
                             f"of on/off times) or neither; got availability = {self.availability!r}, "
                             f"availability_trace = {self.availability_trace!r}")
        if self.availability_trace is not None:
            from fednet.sim.availability_trace import read_availability_trace

            if self.dropout > 0:
                raise ValueError(f"dropout = {self.dropout} and availability = 'trace' exclude each other (the trace "
                                 f"says who is on)")
            try:
                read_availability_trace(self.availability_trace, self.n_devices)
            except ConfigError as e:
                raise ValueError(str(e)) from None
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


def check_builder_params(kind: str, params: Mapping[str, Any]) -> None:
    """Refuse ``params`` a user network builder cannot take, from its signature (at load time).

    The builder is called as ``function(n_devices, rng=..., **params)``
    (:func:`fednet.study.runner.build_network`).

    Parameters
    ----------
    kind : str
        ``"package.module:function"`` (importable: :func:`fednet.topologies.builder`).
    params : mapping
        The network's ``params``.

    Raises
    ------
    ValueError
        Naming each parameter the builder does not have (with a "did you mean") and the ones it takes, a
        required parameter ``params`` lacks, or ``params`` naming ``n_devices`` or ``rng`` (fednet passes them).
    """
    import inspect

    from fednet.topologies import builder

    fn = builder(kind)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):          # a builtin or C function: nothing to check against
        return
    taken = sorted(set(params) & {"n_devices", "rng"})
    if taken:
        raise ValueError(f"params of network builder {kind!r} may not set {taken}: fednet passes n_devices "
                         f"(network.n_devices) and rng (the seed's topology stream)")
    ps = list(sig.parameters.values())
    takes = [p.name for p in ps[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "rng"]
    if not any(p.kind is p.VAR_KEYWORD for p in ps):
        unknown = [k for k in params if k not in takes]
        if unknown:
            hints = "; ".join(f"{k!r}{_did_you_mean(k, takes)}" for k in unknown)
            raise ValueError(f"network builder {kind!r} has no parameter {hints}; it takes "
                             f"{', '.join(takes) or 'no params'}")
    try:
        sig.bind(0, rng=None, **params)
    except TypeError as e:
        raise ValueError(f"network builder {kind!r} cannot be called as {fn.__name__}(n_devices, rng=..., **params) "
                         f"with params {sorted(params)}: {e}") from None


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
        Registered protocol name (``fednet list``: built-ins and installed ``fednet.protocols``
        entry points), or ``"package.module:Class"`` (importable from ``sys.path``, the study
        file's directory or the working directory; :mod:`fednet.protocol.registry`).
    label : str, optional
        Name in plots and summaries (default: the protocol name); unique within the study.
    params : dict
        The protocol's parameters (validated by its ``Config``).
    epochs : int, optional
        Overrides the study's ``epochs`` for this run.
    sweep : dict of str to list
        A grid over any key a run may set: ``sweep = { alpha = [6, 16, 23], groups = [1, 5] }`` expands this
        entry into one run per combination (Cartesian product, in the order written). A key without a dot is a
        protocol parameter (``params.alpha`` says the same), except ``accounting`` and ``epochs`` (the run's
        own); ``"network.<field>"`` and ``"training.<field>"`` (quoted in TOML) set the run's network and
        training, a dotted key into a table changing that key only: ``sweep = { "network.groups.rule" =
        ["consecutive", "random"], "network.groups.count" = [2, 4, 5] }`` is six runs
        (:func:`sweep_target`; ``data.*``, ``seeds`` and ``network.n_devices`` are study-wide and refused).
        Labels: ``label`` formatted with the values when it holds ``{alpha}``-style fields (sweep keys,
        ``{network.groups.count}`` or its last segment ``{count}``, or params), else
        ``"<label> alpha=6, groups=1"``. Expanded when the study is loaded (:func:`expand_sweeps`); a validated
        study holds only expanded runs, and ``--set``, ``--runs`` and the output folders name them by these
        expanded labels (:func:`load_study`).
    network : dict
        Overrides of the study's ``[network]`` fields for this run (e.g. ``{ loss = 0.2 }`` or
        ``{ groups = { rule = "random", count = 4 } }``; a field given here replaces the study's
        whole value), so one study can sweep groups or loss. ``n_devices`` cannot change (the data
        are split once per study).
    accounting : {"fednet", "paper"}, optional
        Overrides the study's ``accounting`` for this run (so one study can report both).
    training : dict
        Overrides of the study's ``[training]`` fields for this run (e.g. ``{ learning_rate = 3.0 }``;
        :meth:`Study.run_training`), so that a sweep can vary them.
    """

    protocol: str
    label: str | None = Field(None, min_length=1, max_length=200)
    params: dict[str, Any] = {}
    epochs: int | None = Field(None, ge=0, le=10**7)
    sweep: dict[str, list[Any]] = Field({}, description="parameter grid expanded into labelled runs when loaded")
    network: dict[str, Any] = {}
    accounting: Literal["fednet", "paper"] | None = None
    training: dict[str, Any] = {}

    @field_validator("training")
    @classmethod
    def _training_overrides(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set(TrainingSpec.model_fields))
        if unknown:
            raise ValueError(f"unknown training fields {unknown}"
                             f"{_did_you_mean(unknown[0], TrainingSpec.model_fields)}; known: "
                             f"{sorted(TrainingSpec.model_fields)}")
        return v

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
        Stop a run at the first round reaching this accuracy. Never below ``max(targets)``: a
        lower ``stop_at`` is raised to it, so no requested target is hidden (default:
        ``max(targets)``).
    run_to_end : bool
        Ignore ``stop_at`` and run every run for its full number of epochs (final-accuracy
        studies such as the client-drift comparison of Sec. VII-B).
    record_views : bool
        Keep every received message per node (privacy audits; memory-hungry in long runs).
    strict : bool
        False (default): a round that cannot complete because too few devices are available or
        finish is recorded in the trace (``skipped = 1``, ``skip_reason``) and training goes on.
        True: such a round stops the study with :class:`~fednet.protocol.base.StragglerShortfall`.
    accounting : {"fednet", "paper"}
        How set-up and epoch costs are counted where fednet and Schlegel et al. differ.
        ``"fednet"`` (default): every protocol's own defaults (today's numbers).  ``"paper"``: each
        protocol whose ``Config`` has a ``paper_accounting`` table gets those parameters unless
        the run sets them itself (:meth:`run_params`): for CodedSecAgg the Shamir encoding
        uncharged (Sec. VI-C), ``(k+f)/k`` on the epochs' device work (Remark 3), the 72-bit
        field (Remark 3) and per-group phase 1 (Sec. VI-D); for CodedPaddedFL 48-bit shares and
        ``alpha - 1`` encoding MACs (Sec. V-D) and per-group encoding (Sec. V-E).  A run's own
        ``accounting`` overrides this.

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
    accounting: Literal["fednet", "paper"] = "fednet"
    data: DataSpec = DataSpec()
    network: NetworkSpec = NetworkSpec()
    training: TrainingSpec = TrainingSpec()
    runs: list[RunSpec] = Field(min_length=1)
    #: The folder of the study file (:func:`load_study`): its ``"module:Name"`` protocols and builders are imported
    #: from there too, wherever the study runs (:mod:`fednet.study.usercode`). Not part of the study's data.
    _folder: Path | None = PrivateAttr(None)

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

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("runs"), list):
            data = {**data, "runs": expand_sweeps(data["runs"], data.get("network"))}
        return data

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
            raise ValueError(f"baseline {self.baseline!r} is not the label of a run{_did_you_mean(self.baseline, labels)}; "
                             f"labels: {labels}")
        problems: list[str] = []
        dumped = []
        for i, run in enumerate(self.runs):
            d = run.model_dump()
            try:
                net = self.run_network(run)
            except ValidationError as e:
                problems += [f"runs[{i}] ({run.name}).network{''.join('.' + str(p) for p in err['loc'])}: "
                             f"{err['msg'].removeprefix('Value error, ')}{_shown(err)}" for err in e.errors()]
                net = None
            try:
                self.run_training(run)
            except ValidationError as e:
                problems += [f"runs[{i}] ({run.name}).training{''.join('.' + str(p) for p in err['loc'])}: "
                             f"{err['msg'].removeprefix('Value error, ')}{_shown(err)}" for err in e.errors()]
            try:
                d["params"] = self.run_params(run)
            except (KeyError, ValueError, ImportError, TypeError, ValidationError):
                pass  # run_problems names an unknown protocol; a bad network is named above
            n_groups = d["params"].get("groups")
            if (net is not None and net.groups is not None and isinstance(n_groups, int)
                    and n_groups != net.groups.n_groups):
                problems.append(f"runs[{i}] ({run.name}).params.groups: groups = {n_groups} but the network "
                                f"defines {net.groups.n_groups} groups")
            dumped.append(d)
        problems += run_problems(dumped, self.network.n_devices, dropout=self.network.dropout)
        if not problems:
            problems += self._builder_problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _builder_problems(self) -> list[str]:
        """Build every network other than the plain star (and a star grouped by cells) once, at the first seed, and
        check it.

        So that a builder that fails, or builds a graph the simulation cannot run (a node whose role is not
        ``"device"``, ``"server"`` or ``"edge"``, such as a relay; no or several servers; a device without a link to
        the server or an edge server; another number of devices), or groups by cells that do not match, is named when
        the study is loaded, not at run time.
        """
        from .runner import build_network

        problems, seen = [], set()
        for i, run in enumerate(self.runs):
            net = self.run_network(run)
            if net.kind == "lte_star" and (net.groups is None or net.groups.rule != "cells"):
                continue
            key = net.model_dump_json()
            if key in seen:
                continue
            seen.add(key)
            where = "network" if not run.network else f"runs[{i}] ({run.name}).network"
            try:
                build_network(net, self.seeds[0])
            except ConfigError as e:
                problems.append(f"{where}{'' if str(e).startswith('network.groups') else '.kind'}: {e}")
            except (Exception, SystemExit) as e:      # the builder's own bug (or exit): named with where it happened
                tb = e.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                at = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
                problems.append(f"{where}.kind: network builder {net.kind!r} failed for seed {self.seeds[0]}{at}: "
                                f"{type(e).__name__}: {e}")
        return problems

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

    def run_training(self, run: RunSpec) -> TrainingSpec:
        """The training hyperparameters of ``run``: the study's ``[training]`` with the run's ``training`` overrides.

        Raises
        ------
        pydantic.ValidationError
            If the overridden hyperparameters do not validate.
        """
        if not run.training:
            return self.training
        return TrainingSpec.model_validate({**self.training.model_dump(exclude_unset=True), **run.training})

    def run_accounting(self, run: RunSpec) -> str:
        """The accounting of ``run``: its own ``accounting`` or the study's."""
        return self.accounting if run.accounting is None else run.accounting

    def run_params(self, run: RunSpec) -> dict[str, Any]:
        """The protocol parameters of ``run``.

        A protocol whose ``Config`` has a ``groups`` field gets the network's number of groups
        when the run does not set it; under ``accounting = "paper"`` the ``Config``'s
        ``paper_accounting`` table fills the parameters the run does not set.
        """
        net = self.run_network(run)
        params = dict(run.params)
        paper = self.run_accounting(run) == "paper"
        if not paper and (net.groups is None or "groups" in params):
            return params
        cls = registry.get(run.protocol)
        if paper:
            params = {**dict(getattr(cls.Config, "paper_accounting", {})), **params}
        if net.groups is not None and "groups" not in params and "groups" in cls.Config.model_fields:
            params["groups"] = net.groups.n_groups
        return params

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


def _shown(err: Mapping[str, Any]) -> str:
    """``" (got value)"`` for a pydantic error on a value (nothing for a table or a model-level message)."""
    inp = err.get("input")
    return "" if err["type"] == "value_error" or isinstance(inp, dict) else f" (got {inp!r})"


def _did_you_mean(name: Any, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``candidates`` (difflib), else ``""``."""
    close = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def label_choices(name: Any, labels: Sequence[str], limit: int = 8) -> str:
    """The labels to offer for an unknown run label ``name``: all of them when few, else the closest ``limit``.

    A study of 136 runs (fig7_mnist) no longer prints every label on one line.
    """
    labels = list(labels)
    if len(labels) <= limit:
        return f"labels: {labels}"
    starting = [x for x in labels if x.startswith(str(name))]
    if starting:
        more = f" and {len(starting) - limit} more" if len(starting) > limit else ""
        return f"{len(labels)} labels, {len(starting)} starting with {str(name)!r}: {starting[:limit]}{more}"
    close = difflib.get_close_matches(str(name), labels, n=limit, cutoff=0.4)
    return f"{len(labels)} labels, {'the closest' if close else 'the first'}: {close or labels[:limit]}"


#: Run fields a sweep key may name without a section (everything else without a dot is a protocol parameter).
_RUN_FIELDS = ("accounting", "epochs")
#: Study sections a run cannot vary (the data are loaded and split once per study).
_STUDY_WIDE = {"data": "the data are loaded, embedded and split once per study",
               "seeds": "every run uses the study's seeds", "targets": "the targets are the study's",
               "name": "it names the study", "baseline": "it names a run", "runs": "it is the list of runs"}


def sweep_target(key: str, *, protocol: Any = None) -> list[str]:
    """The path inside a run entry that a sweep key sets.

    One syntax for every sweepable key (:class:`RunSpec` ``sweep``):

    * ``alpha`` (no dot): the protocol parameter ``params.alpha``; ``accounting`` and ``epochs`` are the run's
      own fields;
    * ``params.alpha``: the same parameter, explicitly;
    * ``network.<field>[.<key>...]``: the run's network (``network.loss``, ``network.groups.count``); a dotted
      key into a table (``groups``) changes that key only, the rest of the table coming from the run's
      ``network`` override or the study's ``[network]``;
    * ``training.<field>``: the run's training hyperparameters (``training.learning_rate``).

    Parameters
    ----------
    key : str
        The sweep key as written.
    protocol : str, optional
        The run's protocol: a bare key that its ``Config`` does not know is refused here (with a suggestion).

    Returns
    -------
    list of str
        The path, e.g. ``["params", "alpha"]``, ``["network", "groups", "count"]``, ``["accounting"]``.

    Raises
    ------
    ValueError
        For a key naming a study-wide section (``data.*``, ``seeds``, ...), ``network.n_devices``, an unknown
        network or training field or protocol parameter (with a "did you mean").
    """
    parts = [p.strip() for p in str(key).split(".")]
    if not all(parts):
        raise ValueError(f"sweep key {key!r} has an empty segment")
    head = parts[0]
    if len(parts) == 1 and head in _RUN_FIELDS:
        return parts
    if len(parts) == 1 or head == "params":
        path = ["params", *parts] if len(parts) == 1 else parts
        if len(path) < 2:
            raise ValueError(f"sweep key {key!r} names no parameter (params.<name>)")
        if isinstance(protocol, str):
            try:
                cfg = registry.get(protocol).Config
            except Exception:    # noqa: BLE001 - an unknown or broken protocol is named by run_problems
                cfg = None
            fields = getattr(cfg, "model_fields", None)
            if fields is not None and getattr(cfg, "model_config", {}).get("extra") == "forbid" \
                    and path[1] not in fields:
                raise ValueError(f"sweep key {key!r}: {protocol!r} has no parameter {path[1]!r}"
                                 f"{_did_you_mean(path[1], list(fields) + list(_RUN_FIELDS))}; a sweep key is a "
                                 f"protocol parameter, accounting, epochs, network.<field> or training.<field>")
        return path
    if head == "network":
        fields = NetworkSpec.model_fields
        if parts[1] == "n_devices":
            raise ValueError(f"sweep key {key!r}: a run cannot change n_devices (the data are split once per "
                             f"study); write one study per network size")
        if parts[1] not in fields:
            raise ValueError(f"sweep key {key!r}: no network field {parts[1]!r}{_did_you_mean(parts[1], fields)}")
        return parts
    if head == "training":
        fields = TrainingSpec.model_fields
        if len(parts) != 2 or parts[1] not in fields:
            raise ValueError(f"sweep key {key!r}: no training field {'.'.join(parts[1:])!r}"
                             f"{_did_you_mean(parts[1], fields)}; fields: {list(fields)}")
        return parts
    if head in _STUDY_WIDE or head in Study.model_fields:
        why = _STUDY_WIDE.get(head, "it is a study-wide setting")
        raise ValueError(f"sweep key {key!r}: {head} cannot vary between the runs of one study ({why}); "
                         f"write one study per value, or change it for the whole study with --set {key}=...")
    raise ValueError(f"sweep key {key!r}: not a protocol parameter, accounting, epochs, network.<field> or "
                     f"training.<field>{_did_you_mean(key, ['accounting', 'epochs', 'network', 'training'])}")


class _Fields:
    """Attribute access to a nested dict, so that label templates may name ``{network.groups.count}``."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        try:
            v = self._d[name]
        except KeyError:
            raise KeyError(name) from None
        return _Fields(v) if isinstance(v, Mapping) else v

    def __format__(self, spec: str) -> str:
        return format(dict(self._d), spec)


def _label(base: str, values: Mapping[str, Any], params: Mapping[str, Any], i: int, keys: list[str]) -> str:
    """The label of one combination: ``base`` formatted when it holds ``{...}`` fields, else ``"base k=v, ..."``."""
    if "{" not in base:
        return f"{base} " + ", ".join(f"{k}={v}" for k, v in values.items())
    fields: dict[str, Any] = dict(params)
    nested: dict[str, Any] = {}
    last: dict[str, list[Any]] = {}
    for k, v in values.items():
        parts = k.split(".")
        if len(parts) == 1:
            fields[k] = v
            continue
        node = nested
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
        last.setdefault(parts[-1], []).append(v)
    fields.update({k: _Fields(v) for k, v in nested.items() if k not in fields})
    # the last segment alone ({count} for network.groups.count) when no other key ends so
    fields.update({k: vs[0] for k, vs in last.items() if len(vs) == 1 and k not in fields})
    try:
        return base.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise ValueError(f"runs[{i}].label {base!r} names {e}, which neither sweep {keys} nor params holds") from None


def _set_path(entry: dict[str, Any], path: list[str], value: Any, network: Any, where: str) -> None:
    """Set ``path`` of a run entry (a copy) to ``value``; a dotted network key merges into the whole field."""
    if path[0] == "network" and len(path) > 2:
        net = entry.setdefault("network", {})
        if not isinstance(net, dict):
            raise ValueError(f"{where}: the run's network is not a table")
        field = path[1]
        if field in net:
            base = copy.deepcopy(net[field])
        else:
            base = copy.deepcopy(network.get(field)) if isinstance(network, Mapping) else None
        if field == "groups" and isinstance(base, int) and not isinstance(base, bool):
            base = {"count": base}                    # the shorthand groups = N
        node = base = {} if base is None else base
        for seg in path[2:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(seg, {})
        if not isinstance(node, dict):
            raise ValueError(f"{where}: network.{field} is {base!r}, not a table holding {'.'.join(path[2:])}")
        node[path[-1]] = value
        net[field] = base
        return
    node = entry
    for seg in path[:-1]:
        node = node.setdefault(seg, {})
        if not isinstance(node, dict):
            raise ValueError(f"{where}: {seg} is not a table")
    node[path[-1]] = value


def _expand(runs: list[Any], network: Any = None,
            swept: Sequence[Mapping[tuple[str, ...], Any]] | None = None) -> tuple[list[Any], list[dict]]:
    """:func:`expand_sweeps`, also returning each output run's swept paths (``{path tuple: value}``).

    ``swept`` gives the swept paths the input runs already have (a second expansion, after ``--set``).
    """
    out: list[Any] = []
    origins: list[dict] = []
    for i, run in enumerate(runs):
        before = dict(swept[i]) if swept is not None else {}
        if not isinstance(run, dict) or not run.get("sweep"):
            out.append(run)
            origins.append(before)
            continue
        grid = run["sweep"]
        base = run.get("label") or run.get("protocol") or "run"
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise ValueError(f"runs[{i}] ({base}).sweep must be a table of non-empty lists, got {grid!r}")
        keys = list(grid)
        paths: dict[str, list[str]] = {}
        for k in keys:
            try:
                paths[k] = sweep_target(k, protocol=run.get("protocol"))
            except ValueError as e:
                raise ValueError(f"runs[{i}] ({base}).sweep: {e} (values {grid[k]!r})") from None
        seen: dict[tuple[str, ...], str] = {}
        for k, p in paths.items():
            for q, other in list(seen.items()) + [(tuple(x), "an earlier sweep") for x in before]:
                n = min(len(p), len(q))
                if tuple(p[:n]) == tuple(q[:n]):
                    raise ValueError(f"runs[{i}] ({base}).sweep: key {k!r} sets {'.'.join(p)}, which {other!r} "
                                     f"already sweeps")
            seen[tuple(p)] = k
        for combo in itertools.product(*(grid[k] for k in keys)):
            values = dict(zip(keys, combo))
            entry = copy.deepcopy({k: v for k, v in run.items() if k != "sweep"})
            entry["label"] = _label(base, values, dict(run.get("params") or {}), i, keys)
            for k, v in values.items():
                _set_path(entry, paths[k], copy.deepcopy(v), network,
                          f"runs[{i}] ({base}).sweep {k} = {v!r}")
            out.append(entry)
            origins.append({**before, **{tuple(paths[k]): v for k, v in values.items()}})
    return out, origins


def expand_sweeps(runs: list[Any], network: Mapping[str, Any] | None = None) -> list[Any]:
    """Expand every run entry holding a ``sweep`` grid into one entry per combination.

    Parameters
    ----------
    runs : list of dict
        Raw ``[[runs]]`` entries (entries that are not dicts or have no ``sweep`` pass through).
    network : dict, optional
        The study's raw ``[network]`` table: a dotted key into a network table (``network.groups.count``)
        takes the rest of that table from it (unless the run's own ``network`` override sets the field).

    Returns
    -------
    list of dict
        The runs, each sweep replaced by its combinations in ``itertools.product`` order; each
        combination's values are set where their keys point (:func:`sweep_target`: a protocol parameter,
        ``accounting``, ``epochs``, ``network.*``, ``training.*``) and named in the label
        (:class:`RunSpec` ``sweep``).

    Raises
    ------
    ValueError
        If a sweep is not a table of non-empty lists, a key cannot be swept (:func:`sweep_target`), two keys set
        the same thing, or a label template names a key the sweep lacks (one line naming the run, key and values).
    """
    return _expand(runs, network)[0]


def _not_generators(cls: type) -> str:
    """Why a protocol's ``setup``/``round`` are not generator functions (the simulation ``yield from``s them), or ``""``."""
    import inspect

    bad = [m for m in ("setup", "round") if callable(getattr(cls, m, None))
           and not inspect.isgeneratorfunction(inspect.unwrap(getattr(cls, m)))]
    if not bad:
        return ""
    where = f"{cls.__module__}:{cls.__qualname__}"
    return (f"{where}.{bad[0]}() is not a generator function: the simulation runs it with 'yield from', so it "
            f"must yield its events (one that sends nothing ends with 'return' then 'yield')")


def run_problems(runs: list[Any], n_devices: Any, *, dropout: float = 0.0) -> list[str]:
    """Every problem of the runs' protocols and parameters, one message per problem.

    Parameters are validated strictly (no ``"5"`` for 5, no ``true`` for 1, no ``inf``/``nan``).

    Parameters
    ----------
    runs : list of dict
        Raw or dumped run entries (``protocol``, ``label``, ``params``).
    n_devices : int or None
        The network size for :meth:`~fednet.protocol.base.Protocol.check` (skipped if not an int).
    dropout : float
        The network's per-round dropout probability; when positive, each protocol's
        ``check_dropout`` refuses a dropout that leaves fewer devices on average than a round needs.

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
        except (ValueError, ImportError, TypeError) as e:  # a bad "module:Class" (fednet.plugins)
            problems.append(f"runs[{i}] ({name}).protocol: {e}")
            continue
        not_gen = _not_generators(cls)
        if not_gen:
            problems.append(f"runs[{i}] ({name}).protocol: {not_gen}")
            continue
        params = run.get("params") or {}
        try:
            cfg = cls.Config.model_validate(params, strict=True)
            if isinstance(n_devices, int):
                cls.check(cfg, n_devices)
                check_dropout = getattr(cls, "check_dropout", None)
                if check_dropout is not None and dropout > 0:
                    check_dropout(cfg, n_devices, dropout)
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    hint = _did_you_mean(err["loc"][-1], cls.Config.model_fields)
                    problems.append(f"runs[{i}] ({name}).params.{loc}: {err['msg']}{hint}")
                else:
                    msg = err["msg"].removeprefix("Value error, ")
                    inp = err.get("input")
                    shown = "" if err["type"] == "value_error" or isinstance(inp, dict) else f" (got {inp!r})"
                    problems.append(f"runs[{i}] ({name}).params{'.' + loc if loc else ''}: {msg}{shown}")
        except ValueError as e:
            problems.append(f"runs[{i}] ({name}).params: {e}")
        except (Exception, SystemExit) as e:        # a study's own Config or check() that raised: named, one line
            from .usercode import user_code_error

            named = user_code_error(cls, e, "validating its params (its Config or check)")
            if named is None:
                raise
            problems.append(f"runs[{i}] ({name}).params: {named}")
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
    label (``runs.Conventional FL.epochs``), a label pattern (``runs.CodedPaddedFL *.epochs``) or ``*``
    (every entry: ``runs.*.params.mode``). :func:`load_study` applies the ``runs.`` assignments to the runs
    after sweep expansion, so labels and indices are the expanded runs' (those of the outputs).

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
            labels = [r.get("label") or r.get("protocol") if isinstance(r, dict) else None for r in node]
            hits = _run_indices(labels, seg, where)
            if len(hits) > 1:
                for j in hits:
                    apply_assignment(node[j], rest, value, text=where)
                return
            node = node[hits[0]]
            continue
        if not isinstance(node, dict):
            raise StudyError(f"--set {where}: {'.'.join(path[:j])} is not a table")
        node = node.setdefault(seg, {})
    if not isinstance(node, dict):
        raise StudyError(f"--set {where}: {'.'.join(path[:-1])} is not a table")
    node[path[-1]] = value


def select_runs(raw_runs: list[Any], labels: Sequence[str], baseline: str | None) -> list[Any]:
    """The runs named in ``labels`` (plus the baseline, kept for the speed-ups), in study order.

    ``labels`` are the runs' labels after sweep expansion (those of the outputs), or patterns with ``*`` and
    ``?`` (``"CodedPaddedFL alpha=*"``).

    Raises
    ------
    StudyError
        For a label or pattern no run has (with a suggestion and the labels to choose from).
    """
    have = [r.get("label") or r.get("protocol") for r in raw_runs]
    unknown = [x for x in labels if x not in have and not (("*" in x or "?" in x)
                                                          and any(fnmatch.fnmatchcase(h, x) for h in have))]
    if unknown:
        hints = "; ".join(f"{x!r}{_did_you_mean(x, have)}" for x in unknown)
        raise StudyError(f"--runs: no run labelled {hints}; {label_choices(unknown[0], have)}")
    keep = {h for x in labels for h in have if h == x or (("*" in x or "?" in x) and fnmatch.fnmatchcase(h, x))}
    keep |= {baseline} if baseline else set()
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
            lines.append(f"  {line}" if line.startswith(("runs[", "network.kind")) else f"  {loc}: {line}")
    return lines


def _run_indices(labels: Sequence[Any], seg: str, where: str, what: str = "--set") -> list[int]:
    """Indices of the runs a path segment or ``--runs`` entry names: an exact label, else a pattern with ``*``/``?``.

    Raises
    ------
    StudyError
        When nothing matches (with a suggestion and the labels to choose from).
    """
    if seg in labels:
        return [i for i, x in enumerate(labels) if x == seg]
    if "*" in seg or "?" in seg:
        hits = [i for i, x in enumerate(labels) if isinstance(x, str) and fnmatch.fnmatchcase(x, seg)]
        if hits:
            return hits
    names = [x for x in labels if isinstance(x, str)]
    raise StudyError(f"{what} {where}: no run labelled {seg!r}{_did_you_mean(seg, names)}; "
                     f"{label_choices(seg, names)}")


def _overlap(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether one path is a prefix of the other (setting one changes the other)."""
    n = min(len(a), len(b))
    return tuple(a[:n]) == tuple(b[:n])


def _study_swept(runs: Any) -> list[tuple[list[str], int, str, str, Any]]:
    """The study-level paths the raw runs' sweeps set: ``(path, run index, base label, key, values)``."""
    out = []
    for i, run in enumerate(runs if isinstance(runs, list) else []):
        grid = run.get("sweep") if isinstance(run, dict) else None
        if not isinstance(grid, dict):
            continue
        for k, values in grid.items():
            try:
                path = sweep_target(k)
            except ValueError:
                continue                      # named by the expansion
            if path[0] != "params":           # params have no study-level counterpart
                out.append((path, i, run.get("label") or run.get("protocol") or "run", k, values))
    return out


def _refuse_swept(path: Sequence[str], what: str, runs: Any) -> None:
    """Refuse a study-level assignment to a key that a run's sweep sets (the sweep would silently win)."""
    for swept, i, base, key, values in _study_swept(runs):
        if _overlap(path, swept):
            raise StudyError(f"{what}: {'.'.join(path)} is swept by runs[{i}] ({base}) (sweep {key!r} = "
                             f"{values!r}), which sets it in each of its runs; change that grid in the study file, "
                             f"or keep some of its runs with --runs")


def _refuse_run_swept(rest: Sequence[str], value: Any, label: str, swept: Mapping[tuple[str, ...], Any],
                      text: str) -> None:
    """Refuse ``--set runs.<run>.<rest>`` where ``rest`` changes a value the run's sweep gave it (its label's)."""
    targets: list[list[str]] = []
    if not rest:
        targets = [[]]
    elif rest[0] == "sweep":
        keys = [rest[1]] if len(rest) > 1 else (list(value) if isinstance(value, dict) else [])
        for k in keys:
            try:
                targets.append(sweep_target(k))
            except ValueError:
                pass                           # named by the expansion
    else:
        targets = [list(rest)]
    for t in targets:
        for path, v in swept.items():
            if _overlap(t, path):
                raise StudyError(f"--set {text}: {'.'.join(path)} is swept in run {label!r} (its value {v!r} is "
                                 f"named in the label); keep the grid points you want with --runs, or change the "
                                 f"sweep in the study file")


def load_study(path: str | os.PathLike, *, sets: Sequence[str] = (), only_runs: Sequence[str] | None = None,
               max_epochs: int | None = None, **overrides: Any) -> Study:
    """Read a study TOML file, apply overrides, and validate it.

    Overrides are applied in this order: ``overrides`` (deep-merged), the ``sets`` of study keys, sweep expansion,
    the ``sets`` of run keys (``runs.<run>...``), ``max_epochs``, ``only_runs``; the result is validated as a
    whole, exactly like the file.

    One label scheme: ``sets`` (``runs.<label>...``, ``runs.<index>...``), ``only_runs``, the summary and the
    output folders all name a run by its label *after* sweep expansion (``"CodedPaddedFL alpha=6"``; an index
    counts the expanded runs, as the error messages do). A label may be a pattern with ``*`` and ``?``
    (``runs."CodedPaddedFL alpha=*".epochs=50``, ``only_runs=["CodedPaddedFL *"]``).

    A swept key is never overridden silently: an assignment to a key that a run's sweep sets (``--set
    runs.*.params.alpha=16`` or ``--set network.groups.count=4`` with ``sweep = { alpha = [...] }`` or
    ``{ "network.groups.count" = [...] }``), or a Python override of such a study key, is refused with a
    :class:`StudyError` naming the run, the key and its swept values: pick grid points with ``only_runs``
    (``--runs``) or change the grid in the file. A ``--set runs.<label>.sweep.<key>=[...]`` adds a sweep to
    that (expanded) run.

    Parameters
    ----------
    path : path-like
    sets : sequence of str
        ``"key.path=value"`` assignments (the CLI's ``--set``; :func:`apply_assignment`).
    only_runs : sequence of str, optional
        Keep only the runs with these labels or label patterns (the baseline is always kept).
    max_epochs : int, optional
        Maximum rounds of every run (the study's ``epochs`` and every run's own).
    **overrides
        Keys merged into the file's; tables merge key by key (``network={"dropout": 0.1}``
        changes only the dropout), lists and scalars replace (``seeds=[3]``). ``None`` values
        are ignored.

    Raises
    ------
    StudyError
        For a missing, unreadable or non-UTF-8 file, invalid TOML, a bad assignment (or one to a swept key), or a
        study that does not validate; the message lists every problem on its own line, naming each key and value
        (unknown keys with a "did you mean" suggestion).
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
    given = {k: v for k, v in overrides.items() if v is not None}
    if "runs" not in given:
        for leaf in _leaves(given):
            _refuse_swept(leaf, f"override {'.'.join(leaf)}", raw.get("runs"))
    raw = deep_merge(raw, given)
    raw = copy.deepcopy(raw)
    run_sets = []
    for text in sets:
        keys, value = parse_assignment(text)
        if keys[0] == "runs" and len(keys) > 1:
            run_sets.append((text, keys, value))       # after the expansion: runs are named as in the outputs
            continue
        if keys[0] != "runs":
            _refuse_swept(keys, f"--set {text}", raw.get("runs"))
        apply_assignment(raw, keys, value, text=text)
    note = f" (with --set {', '.join(sets)})" if sets else ""
    if isinstance(raw.get("runs"), list):
        try:
            raw["runs"], swept = _expand(raw["runs"], raw.get("network"))
        except ValueError as e:
            raise StudyError(f"{path}: invalid study{note}:\n  {e}") from None
        for text, keys, value in run_sets:
            labels = [r.get("label") or r.get("protocol") if isinstance(r, dict) else None for r in raw["runs"]]
            seg, rest = keys[1], keys[2:]
            if seg == "*":
                hits = list(range(len(labels)))
            elif seg.lstrip("-").isdigit():
                idx = int(seg)
                if not -len(labels) <= idx < len(labels):
                    raise StudyError(f"--set {text}: index {idx} out of range ({len(labels)} runs, counted after "
                                     f"sweep expansion)")
                hits = [idx % len(labels)]
            else:
                hits = _run_indices(labels, seg, text)
            for j in hits:
                _refuse_run_swept(rest, value, labels[j], swept[j], text)
                if not rest:
                    raw["runs"][j] = copy.deepcopy(value)
                elif not isinstance(raw["runs"][j], dict):
                    raise StudyError(f"--set {text}: runs[{j}] is not a table")
                else:
                    apply_assignment(raw["runs"][j], rest, copy.deepcopy(value), text=text)
        if run_sets:
            try:               # a sweep added from the command line
                raw["runs"], swept = _expand(raw["runs"], raw.get("network"), swept)
            except ValueError as e:
                raise StudyError(f"{path}: invalid study{note}:\n  {e}") from None
    if max_epochs is not None:
        raw["epochs"] = max_epochs
        for r in raw.get("runs", []) if isinstance(raw.get("runs"), list) else []:
            if isinstance(r, dict) and "epochs" in r:
                r["epochs"] = max_epochs
    if isinstance(raw.get("runs"), list) and only_runs:
        raw["runs"] = select_runs(raw["runs"], only_runs, raw.get("baseline"))
    try:
        with search_path(path.parent):  # "module:Class" protocols and builders may sit beside the study
            study = Study.model_validate(raw, strict=True)
        study._folder = path.parent.resolve()
        return study
    except ValidationError as e:
        lines = _format_errors(e)
        if not any(err["loc"] == () for err in e.errors()) and isinstance(raw.get("runs"), list):
            n_dev = raw.get("network", {}).get("n_devices", NetworkSpec.model_fields["n_devices"].default) \
                if isinstance(raw.get("network", {}), dict) else None
            lines += [f"  {p}" for p in run_problems(raw["runs"], n_dev)]
        raise StudyError(f"{path}: invalid study{note}:\n" + "\n".join(lines)) from None


def _leaves(d: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """The key paths of a nested mapping's leaves (``{"network": {"groups": {"count": 4}}}`` -> network.groups.count)."""
    out: list[list[str]] = []
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out += _leaves(v, (*prefix, str(k)))
        else:
            out.append([*prefix, str(k)])
    return out
