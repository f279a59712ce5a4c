"""Approximate gradient coding with privacy-flexible data sharing (Makkonen et al.).

Source: O. Makkonen, S. Niemelä, C. Hollanti, S. Kas Hanna, "Approximate gradient coding for
privacy-flexible federated learning with non-IID data": Sec. II-B (system and straggler model),
Sec. III-A (randomized data sharing), Sec. III-B (eqs. 10-11), Sec. IV-A (set-up).

Setup (round 0), with ``N`` devices and ``L`` classes:

1. The problem: ``K`` examples of every class are drawn from the task's pooled training data
   (``M = K L``) and placed on the devices in one of the paper's label-heterogeneous settings
   (single-class, ``X^l = e^l``; per-class ``Dir_N(alpha)``; or IID), a fraction ``c`` of every
   device's examples of every class being non-private (footnote 1, rounded down). This initial
   placement is the problem, not a protocol step, and costs nothing.
2. Randomized sharing (offline, Sec. III-A): every non-private example is placed at other devices
   (:func:`fednet.codes.approx_gc.share_randomly`: independently with probability
   ``d / (N - 1)`` each, or at exactly ``d`` random others). Every device uploads its non-private
   examples once (``n_np (F + 1)`` float32 numbers: features and label); the server, which
   relays, sends every device the examples it receives plus the replication counts ``d_j`` of
   all the examples it holds (``S_i (F + 1) + |S_i|`` numbers). Two steps, each as long as its
   slowest transfer; costed by the network model like any message.

Each round ``t`` (Sec. III-B): the server broadcasts ``beta`` (float32, ``F c`` numbers); a device
is a straggler with the probability ``p`` of the engine's dropout model
(:class:`fednet.sim.compute.BernoulliDropout`, keyed by device, "dropout" and round, so runs
with one seed face the same stragglers); every present device computes
``f_i = sum_{j in S_i} W_j g_j = X_i^T diag(W) (softmax(X_i beta) - Y_i)`` with
``W_j = 1 / ((1 - p) d_j)`` (eq. 10; ``2 |S_i| F c + |S_i| c`` MACs, metered) and uploads it;
the server adds the responses (eq. 11; one MAC per element and response) and takes the SGD step
``beta <- beta - eta_t g_hat / M``, ``eta_t = learning_rate * lr_decay^(t-1)`` (0.1 and 0.97 in
Sec. IV-A). ``g_hat`` is unbiased: ``E g_hat = sum_j g_j``.

With ``c = 0`` (or ``d = 0``) nothing is shared: the plain non-IID (or, with
``setting = "iid"``, IID) baselines of Sec. IV, still with the unbiased weights ``1 / (1 - p)``.

What each party sees: the server sees every non-private example (it relays them), the
responding devices' weighted gradient sums and the sharing plan; a device sees the model and
the non-private examples placed at it. Private examples never leave their owner.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.codes.approx_gc import example_weights, share_randomly, sum_responses
from fednet.learning.heterogeneity import make_partition
from fednet.learning.models import accuracy, logistic_gradient, logistic_loss
from fednet.protocol.base import NodeState, Outgoing, Protocol, ProtocolConfig
from fednet.sim.compute import AlwaysAvailable, BernoulliDropout
from fednet.sim.simulation import Node

__all__ = ["ApproxGCConfig", "ApproxGC", "ApproxGCState", "Sharing"]


class ApproxGCConfig(ProtocolConfig):
    """Parameters of approximate gradient coding (Makkonen et al.; symbols are the paper's).

    Attributes
    ----------
    setting : {"single-class", "dirichlet", "iid"}
        Initial label-heterogeneous placement (Sec. II-B; IID as in Sec. IV-A (i)).
    k : int
        Examples per class ``K`` drawn from the task's pooled training data (30 in Sec. IV-A).
    c : float
        Privacy parameter: fraction of each device's examples of each class that is non-private.
    d : int
        Replication factor of the randomized sharing, ``0 <= d <= N - 1``.
    alpha : float, optional
        Dirichlet concentration (``setting = "dirichlet"``; 0.1 in Sec. IV-A).
    placement : {"bernoulli", "subset"}
        Sharing rule (see :data:`fednet.codes.approx_gc.PLACEMENTS`).
    p : float, optional
        Straggling probability used in the weights; default the network's dropout probability
        (a different value is an error: the weights must match the straggler model).
    learning_rate, lr_decay : float
        SGD step ``eta_t = learning_rate * lr_decay^(t-1)`` (0.1 and 0.97 in Sec. IV-A).
    """

    setting: Literal["single-class", "dirichlet", "iid"] = "single-class"
    k: int = Field(30, ge=1)
    c: float = Field(0.0, ge=0.0, le=1.0)
    d: int = Field(0, ge=0)
    alpha: float | None = Field(None, gt=0)
    placement: Literal["bernoulli", "subset"] = "bernoulli"
    p: float | None = Field(None, ge=0.0, lt=1.0)
    learning_rate: float = Field(0.1, gt=0)
    lr_decay: float = Field(0.97, gt=0, le=1)

    @model_validator(mode="after")
    def _alpha_for_dirichlet(self) -> "ApproxGCConfig":
        if self.setting == "dirichlet" and self.alpha is None:
            raise ValueError("setting = 'dirichlet' needs alpha")
        return self


@dataclass
class ApproxGCState(NodeState):
    """Private state of device ``i`` after the sharing (Sec. III-A).

    Attributes
    ----------
    X : ndarray, (|S_i|, F)
        Features of the examples it holds (its own and the non-private ones placed at it).
    Y : ndarray, (|S_i|, L)
        Their one-hot labels.
    W : ndarray, (|S_i|,)
        Their weights ``W_j = 1 / ((1 - p) d_j)`` (eq. 10).
    """

    X: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    Y: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    W: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class Sharing:
    """The problem and its sharing plan, drawn in the set-up (known to the server).

    Attributes
    ----------
    m : int
        ``M = K L`` examples.
    owner : ndarray of int, (M,)
        Initial owner of each example.
    nonprivate : ndarray of bool, (M,)
        Which examples may be shared.
    holders : ndarray of bool, (N, M)
        ``holders[i, j]`` iff ``j in S_i`` after sharing.
    shared_copies : int
        Copies placed by the sharing, ``sum_j (d_j - 1)``.
    """

    m: int
    owner: np.ndarray
    nonprivate: np.ndarray
    holders: np.ndarray
    shared_copies: int


class ApproxGC(Protocol):
    """Randomized data sharing + approximate gradient coding (Makkonen et al., Sec. III).

    Attributes
    ----------
    p : float
        Straggling probability of the weights (set by :meth:`validate`).
    sharing : Sharing
        The examples' owners and holders (set by :meth:`setup`).
    grad_sq_norm : float
        ``||g_hat / M||^2`` of the last round (NaN before the first).
    """

    name = "approx_gc"
    Config = ApproxGCConfig
    State = ApproxGCState
    setup_dropouts = "offline"                            # data sharing is offline (Sec. III-A): recorded only
    p: float
    sharing: Sharing
    grad_sq_norm: float = float("nan")

    @classmethod
    def check(cls, config: ApproxGCConfig, n_devices: int) -> None:
        """Reject fewer than 2 devices and ``d > N - 1`` (ValueError naming the value)."""
        if n_devices < 2:
            raise ValueError(f"approx_gc needs at least 2 devices, got {n_devices}")
        if config.d > n_devices - 1:
            raise ValueError(f"d must be at most n_devices - 1 = {n_devices - 1}, got {config.d}")

    def validate(self) -> None:
        """Check ``p`` against the network's dropout model and the settings against the data.

        Raises
        ------
        ValueError
            If ``p`` differs from the engine's dropout probability, the single-class setting
            has ``N != L``, ``N`` does not divide ``M`` for IID, or ``k`` exceeds a class.
        """
        super().validate()
        avail = self.sim.availability
        if isinstance(avail, BernoulliDropout):
            p_net = avail.p
        elif isinstance(avail, AlwaysAvailable):
            p_net = 0.0
        else:
            p_net = None
        cfg = self.config
        if p_net is None and cfg.p is None:
            raise ValueError("p must be given for an availability model other than BernoulliDropout")
        if p_net is not None and cfg.p is not None and abs(cfg.p - p_net) > 1e-12:
            raise ValueError(f"p = {cfg.p} differs from the network's dropout probability {p_net}")
        self.p = float(cfg.p if cfg.p is not None else p_net)
        n_classes = self.task.c
        if cfg.setting == "single-class" and self.sim.n_devices != n_classes:
            raise ValueError(f"setting = 'single-class' needs n_devices == n_classes = {n_classes}, "
                             f"got {self.sim.n_devices}")
        if cfg.setting == "iid" and (cfg.k * n_classes) % self.sim.n_devices:
            raise ValueError(f"setting = 'iid' needs n_devices to divide M = k L = {cfg.k * n_classes}")
        labels = np.argmax(np.vstack(self.task.Y), axis=1)
        smallest = int(np.bincount(labels, minlength=n_classes).min())
        if cfg.k > smallest:
            raise ValueError(f"k = {cfg.k} exceeds the smallest class of the training data ({smallest})")

    # -- phase 1 ------------------------------------------------------------------------------
    def setup(self) -> Generator:
        """Draw the examples and their placement, then share the non-private ones (Sec. III-A)."""
        cfg, n, L = self.config, self.sim.n_devices, self.task.c
        x_pool = np.vstack(self.task.X)
        y_pool = np.argmax(np.vstack(self.task.Y), axis=1)
        rng_data = self.sim.rng(self.server, "data")
        idx = np.concatenate([rng_data.choice(np.flatnonzero(y_pool == c), cfg.k, replace=False)
                              for c in range(L)])  # class-sorted, as make_partition's labels
        part = make_partition(cfg.setting, n, L, cfg.k, cfg.c, 1, alpha=cfg.alpha,
                              rng=self.sim.rng(self.server, "partition"))
        owner, nonprivate, labels = part.owner[0], part.nonprivate[0], part.labels[0]
        x, y = x_pool[idx], np.eye(L)[labels]
        shares = cfg.c > 0 and cfg.d > 0
        if shares:
            holders = share_randomly(owner, nonprivate, n, cfg.d, self.sim.rng(self.server, "sharing"),
                                     cfg.placement)[0]
        else:
            holders = owner[None, :] == np.arange(n)[:, None]
        weights = example_weights(holders, self.p)[0]
        self.sharing = Sharing(x.shape[0], owner, nonprivate, holders, int(holders.sum() - x.shape[0]))
        if shares:
            ups = [Outgoing(dev, self.server, (x[j], labels[j]), kind="nonprivate data",
                            n_elements=len(j) * (x.shape[1] + 1), element_bits=self.element_bits)
                   for dev in self.devices
                   if len(j := np.flatnonzero((owner == dev.index) & nonprivate))]
            downs = []
            for dev in self.devices:
                held = np.flatnonzero(holders[dev.index])
                got = held[owner[held] != dev.index]
                downs.append(Outgoing(self.server, dev, (x[got], labels[got], holders[:, held].sum(0)),
                                      kind="shared data", n_elements=len(got) * (x.shape[1] + 1) + len(held),
                                      element_bits=self.element_bits))
            yield from self.net.send_all([ups, downs])
        for dev in self.devices:
            held = np.flatnonzero(holders[dev.index])
            dev.state.X, dev.state.Y, dev.state.W = x[held], y[held], weights[held]

    # -- phase 2 ------------------------------------------------------------------------------
    def local_sum(self, dev: Node) -> np.ndarray:
        """``f_i = sum_{j in S_i} W_j g_j`` on the model ``dev`` received (eq. 10), metered.

        A device holding no example (possible under Dirichlet placement) sends zeros, at no cost.
        """
        beta = dev.state.received.astype(np.float64)
        if dev.state.X.shape[0] == 0:
            return np.zeros_like(beta)
        return logistic_gradient(dev.state.X, dev.state.Y, beta, weights=dev.state.W)

    def round(self, epoch: int) -> Generator:
        """Broadcast ``beta``; present devices send ``f_i`` (eq. 10); sum (eq. 11); SGD step."""
        empty = any(dev.state.X.shape[0] == 0 for dev in self.devices)   # an empty f_i costs nothing
        replies = yield from self.net.gather(self.devices, self.local_sum, kind="weighted gradient",
                                             download=self.theta.astype(np.float32), free=empty,
                                             download_bits=self.element_bits, upload_bits=self.element_bits)
        g_hat = yield from self.net.server_compute(sum_responses, replies.values, self.theta.shape,
                                                   free=not replies.results)                          # eq. (11)
        self.used = [dev.index for dev in replies.nodes]
        eta = self.config.learning_rate * self.config.lr_decay ** (epoch - 1)
        m = self.sharing.m
        self.grad_sq_norm = float(np.sum((g_hat / m) ** 2))
        self.theta = self.theta - eta * g_hat / m

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy (argmax) and mean test cross-entropy of ``beta``."""
        acc = accuracy(self.task.x_test, self.task.y_test, self.theta)
        return acc, logistic_loss(self.task.x_test, np.eye(self.task.c)[self.task.y_test], self.theta)

    def round_metrics(self, round: int) -> dict:
        """``grad_sq_norm`` (||g_hat / M||^2 of the round) and ``shared_copies`` (examples shared)."""
        return {"grad_sq_norm": self.grad_sq_norm if round else float("nan"),
                "shared_copies": self.sharing.shared_copies}
