"""Shared parts of the split vertical-FL protocols (FedVS and its baselines, Li, Yao, Liu, ICML 2023, Sec. 6).

:class:`VerticalConfig` holds what every method of Fig. 2 shares (data set, split model, learning rates,
batch, the Sec. 6.2 delay pattern); :class:`VerticalLearning`, the learning set-up of these protocols
(``Learning = VerticalLearning``, ``self.learning``), loads the vertical data (from the config's
``dataset``, or from the task by the convention of :func:`fednet.learning.vertical.as_learning_task`),
builds the split polynomial-network model, the keyed delays (:class:`fednet.sim.delays.FedVSDelays`) and the
public batch order, evaluates the split model, and offers :meth:`VerticalLearning.delayed_upload`: compute on
a client's processor, wait the client's keyed upload delay, upload to the server.  Concrete protocols
(``protocols/fedvs*.py``) subclass :class:`~fednet.protocol.base.Protocol` and write their rounds on these and
the primitives; :class:`VerticalProtocol` is a deprecated alias.

Batches: a public permutation of the training rows (seeded by the run's seed) cut into consecutive
blocks; round ``r`` uses block ``(r - 1) mod n_blocks`` (SGD over a fixed shuffled order, the same for
every method at a seed).
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from fednet.errors import ConfigError
from fednet.learning.task import LearningTask
from fednet.learning.vertical import SplitPN, VerticalData, load_vertical, vertical_from_task
from fednet.sim.delays import FedVSDelays
from fednet.sim.simulation import Node

from .base import Protocol, ProtocolConfig
from .learning import Learning

__all__ = ["VerticalConfig", "VerticalLearning", "VerticalProtocol"]

_DATA_CACHE: dict[tuple, VerticalData] = {}


def _is_vertical(task: LearningTask) -> bool:
    """Whether ``task`` is a vertical task (:func:`~fednet.learning.vertical.vertical_from_task` accepts it)."""
    try:
        vertical_from_task(task)
    except ValueError:
        return False
    return True


class VerticalConfig(ProtocolConfig):
    """Parameters shared by the vertical protocols (App. C for FashionMNIST; Sec. 6.2 delays).

    Attributes
    ----------
    dataset : str or None
        ``"fashion-mnist"``, ``"mnist"`` or ``"handwritten"`` (loaded with ``max_train``/``max_test``
        rows); None takes the blocks from the task.
    max_train, max_test : int or None
        Keep only the first rows of the data set.
    depth : int
        PN layers ``D_n`` of every client (1 for FashionMNIST, 2 for Handwritten).
    embedding : int
        Embedding width ``h``.
    hidden : list of int
        Widths of the server's hidden Linear-ReLU layers.
    lr_client, lr_server : float
        Learning rates ``eta_n``, ``eta_0`` (App. C: 0.05).
    batch_size : int
        Training examples per round (256 for FashionMNIST); FedVS uses ``batch_size / K`` coded rows.
    delay_scale : float
        Multiplies every delay mean of Sec. 6.2 (1 = the paper).
    straggler_base, straggler_slope, fast_mean : float
        The pattern's ``2 + 4 i / N`` and 0.1 s.
    straggler_fraction : float
        Fraction of the clients that straggle, in [0, 1]: 0.5 is Sec. 6.2 (the last ``floor(N/2)``), 0.6 is
        Sec. 2.2's Fig. 1 ("We select 60% clients as stragglers"; 10 of 16); rounded as
        :func:`fednet.sim.delays.n_stragglers`.  ``delay_scale = 0`` removes every added delay (Fig. 1's
        "without stragglers").
    aggregation : {"average", "concat", "max"}
        How the server aggregates the embeddings (Sec. 2.1-2.2, Fig. 1;
        :func:`fednet.learning.vertical.aggregate_embeddings`).  Only Wait, Ignore and VAFL take other values
        than ``"average"`` (Sec. 3's choice); FedVS and Wait-DP refuse them.
    init_seed : int
        Seed of the model initialisation (public; the same for every method).
    init_scale : float
        Client PN weights uniform on ``init_scale [-1, 1] / sqrt(d_n D_n)`` (1: torch's ``nn.Linear`` default).
    device_mac_rate : float or None
        Overrides every client's MAC rate (MAC/s) for this run: the "delay dominant" and "computation
        dominant" settings of Fig. 3 differ exactly in it.  None keeps the network's rates.
    """

    dataset: str | None = None
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)
    depth: int = Field(1, ge=1)
    embedding: int = Field(64, ge=1)
    hidden: list[int] = [64, 64]
    lr_client: float = Field(0.05, gt=0)
    lr_server: float = Field(0.05, gt=0)
    batch_size: int = Field(256, ge=1)
    delay_scale: float = Field(1.0, ge=0)
    straggler_base: float = Field(2.0, ge=0)
    straggler_slope: float = Field(4.0, ge=0)
    fast_mean: float = Field(0.1, ge=0)
    straggler_fraction: float = Field(0.5, ge=0, le=1)
    aggregation: Literal["average", "concat", "max"] = "average"
    init_seed: int = Field(0, ge=0)
    init_scale: float = Field(1.0, gt=0)
    device_mac_rate: float | None = Field(None, gt=0)


class VerticalLearning(Learning):
    """The split-VFL set-up (module docstring); ``self.learning`` of FedVS and its baselines.

    The task is used only when the config names no ``dataset``.

    Attributes
    ----------
    data : VerticalData
    model : SplitPN
        The clients' PNs and the server's MLP.
    delays : FedVSDelays
        The keyed Sec. 6.2 delays of this run's seed.
    order : ndarray of int
        The public batch order.

    Raises
    ------
    ValueError
        If the data set's number of clients differs from the network's.
    fednet.errors.ConfigError
        If ``dataset`` is set while the task is vertical already, or ``batch_size`` exceeds the training rows.
    fednet.learning.datasets.DatasetError
        For a data set that is not available.
    """

    Config: ClassVar[type[ProtocolConfig]] = VerticalConfig

    def __init__(self, protocol: Protocol) -> None:
        super().__init__(protocol)
        sim, task, c = protocol.sim, protocol.task, protocol.config
        if c.dataset is not None and _is_vertical(task):
            raise ConfigError(f"dataset = {c.dataset!r} would silently replace the study's vertical [data] (the task "
                              f"this run was given); set [data] dataset (and max_train, max_test) instead, or drop "
                              f"the parameter")
        if c.dataset is None:
            data = vertical_from_task(task)
        else:
            key = (c.dataset, sim.n_devices, c.max_train, c.max_test)
            if key not in _DATA_CACHE:
                _DATA_CACHE[key] = load_vertical(c.dataset, sim.n_devices if c.dataset != "handwritten" else None,
                                                 max_train=c.max_train, max_test=c.max_test)
            data = _DATA_CACHE[key]
        if data.n_clients != sim.n_devices:
            raise ValueError(f"the data set has {data.n_clients} clients but the network has {sim.n_devices}")
        self.data = data
        rows = len(data.y_train)
        if c.batch_size > rows:
            raise ConfigError(f"batch_size = {c.batch_size} exceeds the {rows} training examples of the data set; use "
                              f"batch_size <= {rows}")
        if c.device_mac_rate is not None:
            for dev in sim.devices:
                dev.mac_rate = float(c.device_mac_rate)
        self.model = SplitPN(data, c.depth, c.embedding, c.hidden, c.lr_client, c.lr_server, seed=c.init_seed,
                              init_scale=c.init_scale, aggregation=c.aggregation)
        self.delays = FedVSDelays(sim.n_devices, sim.seed, fast_mean=c.fast_mean, base=c.straggler_base,
                                  slope=c.straggler_slope, scale=c.delay_scale, straggler_fraction=c.straggler_fraction)
        self.order = np.random.default_rng([sim.seed, 0xBA7C4]).permutation(len(data.y_train))

    def batch_rows(self, r: int, size: int, population: int | None = None) -> np.ndarray:
        """Rows of block ``(r - 1) mod n_blocks`` of the public order over ``population`` rows (default all)."""
        order = self.order if population is None else self.order[self.order < population]
        n_blocks = max(1, len(order) // size)
        b = (int(r) - 1) % n_blocks
        return np.sort(order[b * size:(b + 1) * size])

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and cross-entropy of the split model (the observer's, not charged)."""
        return self.model.evaluate()

    def delayed_upload(self, node: Node, fn, *, kind: str, key_round: int, element_bits: int | None = None,
                       n_elements: int | None = None) -> Generator:
        """``fn(node)`` on the node's processor (metered), then its keyed upload delay, then the upload.

        Returns ``fn``'s result once it has reached the server (a ``first_k`` work item).
        """
        net = self.protocol.net
        result = yield from net.compute(node, fn, node)
        yield from net.delay(self.delays.upload_delay(node.index, key_round))
        yield from net.send(node, self.protocol.server, result, kind=kind, element_bits=element_bits,
                            n_elements=n_elements)
        return result


class VerticalProtocol(Protocol):
    """Deprecated: subclass :class:`~fednet.protocol.base.Protocol` with ``Learning = VerticalLearning``.

    Kept so that outside code does not break silently: subclassing warns (``DeprecationWarning``), and the
    old attribute names (``data``, ``delays``, ``order``, ``batch_rows``, ``delayed_upload``) forward to
    ``self.learning``.
    """

    Config: ClassVar[type[ProtocolConfig]] = VerticalConfig
    Learning = VerticalLearning

    def __init_subclass__(cls, **kwargs: Any) -> None:
        warnings.warn(f"{cls.__qualname__}: VerticalProtocol is deprecated; subclass fednet.protocol.base.Protocol "
                      f"with Learning = VerticalLearning (fednet.protocol.vertical)", DeprecationWarning, stacklevel=2)
        super().__init_subclass__(**kwargs)

    data = property(lambda self: self.learning.data, doc="``self.learning.data``.")
    delays = property(lambda self: self.learning.delays, doc="``self.learning.delays``.")
    order = property(lambda self: self.learning.order, doc="``self.learning.order``.")

    def batch_rows(self, r: int, size: int, population: int | None = None) -> np.ndarray:
        """``self.learning.batch_rows``."""
        return self.learning.batch_rows(r, size, population)

    def delayed_upload(self, node: Node, fn, **kwargs: Any) -> Generator:
        """``self.learning.delayed_upload``."""
        return self.learning.delayed_upload(node, fn, **kwargs)
