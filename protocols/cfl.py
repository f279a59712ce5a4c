"""CFL: the coded federated learning of Prakash et al. -- the baseline of Fig. 4.

Sources: Prakash, Dhakal, Akdeniz, Yona, Talwar, Avestimehr, Himayat, "Coded computing for
low-latency federated learning over wireless edge networks", IEEE JSAC 39(1), 2021 ([42] in
Schlegel et al.); as modelled in Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. VII-A
(redundancy 0.1 and 0.8), and the outline in ``shared/references.md``.

Our reading (the CodedPaddedFL paper gives only the outline)
------------------------------------------------------------
Set-up (round 0)
    The server fixes, from each device's compute and link statistics, a deadline ``t*`` and a
    load ``l_j`` per device (below).  Device ``j`` builds parity data
    ``[X~_j, Y~_j] = G_j W_j [X_j, Y_j]`` with ``G_j`` a ``(c_p x n_j)`` matrix of i.i.d.
    ``N(0, 1/c_p)`` entries, ``c_p = round(redundancy * m)`` parity rows in total, and ``W_j``
    diagonal: ``sqrt(1 - P_j)`` on the ``l_j`` points of its load (``P_j`` the probability that
    the device returns its load by ``t*``) and 1 on the points it never processes.  Each device
    uploads its ``c_p x (d + c)`` parity matrix (float32) once; the server sums them.  Since
    ``E[G^T G] = I``, the parity gradient ``X~^T (X~ Theta - Y~)`` is in expectation the gradient
    of every point weighted by ``1 - P``: it stands in for the points that do not return.
    The parity *encoding* is offline (not timed), like the offline ``X_i^T X_i`` of CodedPaddedFL
    (Sec. VII); its traffic is timed.
Deadline and loads
    ``T_j(l)`` = download of ``Theta`` + ``2 l d c`` MACs on the shifted exponential + upload
    of the gradient, with geometric tries per message (one packet per message: the paper's link
    model).  ``P_j(l, t) = P(T_j(l) <= t)`` is computed exactly (finite sums over tries of the
    exponential's CDF).  For a deadline ``t`` each device takes the load maximising its expected
    return ``l P_j(l, t)``; ``t*`` is the smallest ``t`` whose expected total return reaches
    ``(1 - redundancy) m`` (the parity data covers the rest).  Loads are searched on a grid of
    ``load_grid`` values per device.
Each epoch
    The server broadcasts ``Theta`` (float32) and computes the parity gradient in parallel
    (it keeps ``X~^T X~`` and ``X~^T Y~`` from the set-up: ``d^2 c`` MACs per epoch); device
    ``j`` computes the plain gradient of its ``l_j`` points (``2 l_j d c`` MACs) and uploads it;
    results that reach the server by ``t*`` are added to the parity gradient; the epoch lasts
    ``max(t*, server time)``; the update is eqs. (4)-(5) with ``m``.
Host shortcut (distribution-exact)
    ``[X~, Y~] = sum_j G_j W_j [X_j, Y_j]`` has i.i.d. rows ``N(0, A^T A / c_p)`` with
    ``A = W [X, Y]``, so its Gram matrix is ``L S L^T / c_p`` with ``L L^T = A^T A`` and ``S`` a
    Wishart(``c_p``, I) draw (Bartlett); the host samples that instead of forming the
    ``c_p x m`` matrix ``G`` (hours at ``c_p = 48000``).  The server's one-off Gram cost
    (``c_p d^2`` MACs at 8.24e12 MAC/s, well under a second) is therefore not charged.

Privacy: the server sees parity data of every device (a linear sketch of its data), which is
the leakage the CodedPaddedFL paper points out.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from fednet.algebra.meter import matmul
from fednet.codes.parity import load_weights, optimise_deadline, parity_gram, weighted_gram
from fednet.learning.models import ridge_gradient
from fednet.protocol.base import NodeState, Outgoing, Protocol, ProtocolConfig, ServerState
from fednet.sim.simulation import Node

__all__ = ["CFLConfig", "CFL", "CFLState", "CFLServerState", "CFLPlan"]


class CFLConfig(ProtocolConfig):
    """Parameters of CFL.

    Attributes
    ----------
    element_bits : int
        Wire width (32: float32, Sec. VII).
    redundancy : float
        ``delta = c_p / m`` in (0, 1) (0.1 and 0.8 in Fig. 4).
    load_grid : int
        Number of candidate loads per device in the deadline search.
    max_tries : int
        Tries per message summed exactly in ``P_j`` (the geometric tail beyond is ignored).
    """

    element_bits: int = Field(32, ge=1, le=4096)
    redundancy: float = Field(..., gt=0.0, lt=1.0)
    load_grid: int = Field(200, ge=2, le=100_000)
    max_tries: int = Field(12, ge=1, le=1000)


@dataclass
class CFLState(NodeState):
    """Private state of device ``j``.

    Attributes
    ----------
    rows : ndarray of int, (l_j,)
        Indices of the points of its load (drawn from the device's own "cfl-load" stream).
    X_load, Y_load : ndarray, (l_j, d) and (l_j, c)
        Its load's points ``X_j[rows]``, ``Y_j[rows]``, gathered once in the set-up (the load is fixed).
    """

    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    X_load: np.ndarray | None = None
    Y_load: np.ndarray | None = None


@dataclass
class CFLServerState(ServerState):
    """The server's parity statistics: ``X~^T X~`` (d, d) and ``X~^T Y~`` (d, c)."""

    XtX: np.ndarray | None = None
    XtY: np.ndarray | None = None


@dataclass(frozen=True)
class CFLPlan:
    """The set-up's plan (:func:`fednet.codes.parity.optimise_deadline`).

    Attributes
    ----------
    c_p : int
        Parity rows, ``max(1, round(redundancy m))``.
    t_star : float
        The deadline, simulated seconds per epoch.
    loads : list of int
        ``l_j`` per device.
    return_probabilities : list of float
        ``P_j(l_j, t*)``.
    """

    c_p: int
    t_star: float
    loads: list[int]
    return_probabilities: list[float]


class CFL(Protocol):
    """Coded FL of Prakash et al. (module docstring for the reading).

    Attributes
    ----------
    plan : CFLPlan
        Deadline, loads and parity size, fixed in the set-up.
    """

    name = "cfl"
    Config = CFLConfig
    State = CFLState
    ServerStateType = CFLServerState
    plan: CFLPlan

    def _device_params(self, dev: Node) -> dict:
        """Keyword arguments of :func:`fednet.codes.parity.return_probability` for ``dev``'s links and processor."""
        d, c = self.task.d, self.task.c
        bits = d * c * self.element_bits * (1 + self.sim.overhead)
        return dict(down_s=bits / dev.downlink.rate_bps, up_s=bits / dev.uplink.rate_bps,
                    p_down=dev.downlink.loss, p_up=dev.uplink.loss,
                    seconds_per_point=2 * d * c / dev.mac_rate,
                    setup_fraction=getattr(dev.compute_model, "setup_fraction", 0.0))

    def setup(self) -> Generator:
        """Set-up (Prakash et al.): deadline and loads from the link and compute statistics;
        the parity data uploaded once."""
        cfg, task = self.config, self.task
        d, c, m = task.d, task.c, task.m
        t_star, loads, probs = optimise_deadline(
            task.n_points, [self._device_params(dev) for dev in self.devices], (1 - cfg.redundancy) * m,
            cfg.load_grid, cfg.max_tries)
        plan = self.plan = CFLPlan(max(1, int(round(cfg.redundancy * m))), t_star, loads, probs)
        AtA = np.zeros((d + c, d + c))
        for dev, l_j, p_j in zip(self.devices, loads, probs):
            X, Y = task.X[dev.index], task.Y[dev.index]
            dev.state.rows = self.sim.rng(dev, "cfl-load").permutation(X.shape[0])[:l_j]
            dev.state.X_load, dev.state.Y_load = X[dev.state.rows], Y[dev.state.rows]
            AtA += weighted_gram(X, Y, load_weights(X.shape[0], dev.state.rows, p_j))   # offline
        gram = parity_gram(AtA, plan.c_p, self.sim.rng(self.server, "cfl-parity"))
        self.server.state.XtX, self.server.state.XtY = gram[:d, :d], gram[:d, d:]
        yield from self.net.send_all([[Outgoing(dev, self.server, None, "parity", plan.c_p * (d + c), self.element_bits)
                                       for dev in self.devices]])        # one upload each

    def round_metrics(self, round: int) -> dict:
        """The deadline and how many devices returned their load by it."""
        return {"deadline_s": self.plan.t_star, "returned": 0 if round == 0 else len(self.used or [])}

    def local_gradient(self, dev: Node) -> np.ndarray:
        """Plain gradient of the device's load (eq. 3 on ``l_j`` points); ``2 l_j d c`` MACs."""
        theta = dev.state.received.astype(np.float64)
        return ridge_gradient(dev.state.X_load, dev.state.Y_load, theta)

    def parity_gradient(self) -> np.ndarray:
        """Server: ``X~^T X~ Theta - X~^T Y~`` (``d^2 c`` MACs)."""
        return matmul(self.server.state.XtX, self.theta) - self.server.state.XtY

    def round(self, epoch: int) -> Generator:
        """One epoch: devices compute on their loads until the deadline t*, the server on the parity data.

        The results in by ``t*`` are added to the parity gradient (uncharged additions, as in the
        set-up's model) and the update is eqs. (4)-(5) with ``m``; the epoch lasts ``max(t*, server)``.
        """
        start = self.sim.now
        server = self.net.background(self.net.server_compute(self.parity_gradient))
        arrived = yield from self.net.gather([dev for dev, l_j in zip(self.devices, self.plan.loads) if l_j > 0],
                                             self.local_gradient, kind="gradient",
                                             download=self.theta.astype(np.float32), deadline=self.plan.t_star,
                                             download_bits=self.element_bits, upload_bits=self.element_bits)
        yield from self.net.delay(max(0.0, start + self.plan.t_star - self.sim.now))     # the epoch lasts >= t*
        G = yield server
        for g in arrived.values:
            G = G + g
        self.used = [dev.index for dev in arrived.nodes]
        self.mode.update(self, G, self.task.m)
