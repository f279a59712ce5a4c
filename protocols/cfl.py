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

import numpy as np
from pydantic import Field
from scipy import stats

from fednet.algebra.meter import matmul
from fednet.learning.models import ridge_gradient
from fednet.protocol.base import Protocol, ProtocolConfig
from fednet.sim.simulation import Node

__all__ = ["CFLConfig", "CFL", "return_probability", "optimise_deadline", "parity_gram"]


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


def return_probability(t: float, loads: np.ndarray, *, down_s: float, up_s: float, p_down: float,
                       p_up: float, seconds_per_point: float, setup_fraction: float,
                       max_tries: int = 12) -> np.ndarray:
    """``P(T(l) <= t)`` for each load ``l`` (see the module docstring).

    Parameters
    ----------
    t : float
        Deadline, simulated seconds from the start of the epoch.
    loads : ndarray of int, (L,)
        Candidate numbers of points.
    down_s, up_s : float
        Seconds per try of the model download / gradient upload (headers included).
    p_down, p_up : float
        Loss probabilities per try (tries are geometric).
    seconds_per_point : float
        Deterministic compute seconds per point (``2 d c / tau``).
    setup_fraction : float
        Mean of the exponential setup time over the deterministic time (0 for deterministic).
    max_tries : int

    Returns
    -------
    ndarray, (L,)
        Probabilities; load 0 returns with probability 1 (nothing to do, nothing to send).
    """
    loads = np.asarray(loads, dtype=np.float64)
    n = np.arange(1, max_tries + 1)
    pd = (1 - p_down) * p_down ** (n - 1)
    pu = (1 - p_up) * p_up ** (n - 1)
    comm = (n[:, None] * down_s + n[None, :] * up_s).reshape(-1)
    w = (pd[:, None] * pu[None, :]).reshape(-1)
    base = seconds_per_point * loads
    slack = t - comm[:, None] - base[None, :]                     # (tries, L)
    if setup_fraction > 0:
        scale = np.maximum(setup_fraction * base, 1e-300)
        cdf = np.where(slack >= 0, -np.expm1(-np.maximum(slack, 0) / scale[None, :]), 0.0)
    else:
        cdf = (slack >= 0).astype(np.float64)
    out = w @ cdf
    return np.where(loads == 0, 1.0, out)


def optimise_deadline(n_points: list[int], params: list[dict], target: float, grid: int = 200,
                      max_tries: int = 12) -> tuple[float, list[int], list[float]]:
    """Deadline ``t*`` and loads ``l_j`` reaching an expected return of ``target`` points.

    Parameters
    ----------
    n_points : list of int
        ``n_j`` per device.
    params : list of dict
        Keyword arguments of :func:`return_probability` per device (all but ``t``, ``loads``).
    target : float
        Expected number of returned points to reach (``(1 - redundancy) m``).
    grid : int
        Candidate loads per device (evenly spaced in ``[0, n_j]``).

    Returns
    -------
    t_star : float
        Smallest deadline (bisection to 1e-6 relative) with expected return >= target.
    loads : list of int
    probabilities : list of float
        ``P_j(l_j, t*)``.

    Raises
    ------
    ValueError
        If ``target`` exceeds the total number of points.
    """
    if target > sum(n_points):
        raise ValueError(f"target {target} exceeds the {sum(n_points)} points")
    cands = [np.unique(np.linspace(0, n, min(grid, n + 1)).round().astype(int)) for n in n_points]

    def best(t: float):
        loads, probs, total = [], [], 0.0
        for c, prm in zip(cands, params):
            p = return_probability(t, c, max_tries=max_tries, **prm)
            k = int(np.argmax(c * p))
            loads.append(int(c[k]))
            probs.append(float(p[k]))
            total += c[k] * p[k]
        return total, loads, probs

    hi = 1.0
    while best(hi)[0] < target:
        hi *= 2
        if hi > 1e9:
            raise ValueError("no deadline reaches the target return")
    lo = 0.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if best(mid)[0] >= target:
            hi = mid
        else:
            lo = mid
    _, loads, probs = best(hi)
    return hi, loads, probs


def parity_gram(A: np.ndarray, c_p: int, rng: np.random.Generator) -> np.ndarray:
    """Gram matrix of ``G A`` for ``G`` (c_p x m) with i.i.d. N(0, 1/c_p) entries, sampled exactly.

    Parameters
    ----------
    A : ndarray, (r, r)
        ``A^T A`` of the weighted data ``A = W [X, Y]`` (r = d + c).
    c_p : int
        Number of parity rows.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray, (r, r)
        ``(G A)^T (G A) = L S L^T / c_p`` with ``L L^T = A^T A`` and ``S ~ Wishart(c_p, I)``.
    """
    vals, vecs = np.linalg.eigh(A)
    L = vecs * np.sqrt(np.clip(vals, 0, None))
    r = A.shape[0]
    if c_p >= r:
        S = stats.wishart(df=c_p, scale=np.eye(r)).rvs(random_state=rng)
    else:                                 # fewer parity rows than dimensions: sample Z directly
        Z = rng.standard_normal((c_p, r))
        S = Z.T @ Z
    return L @ S @ L.T / c_p


class CFL(Protocol):
    """Coded FL of Prakash et al. (module docstring for the reading).

    Attributes
    ----------
    t_star : float
        The deadline in simulated seconds.
    loads : list of int
        ``l_j`` per device.
    return_probabilities : list of float
        ``P_j(l_j, t*)``.
    """

    name = "cfl"
    Config = CFLConfig

    def _device_params(self, dev: Node) -> dict:
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
        self.c_p = max(1, int(round(cfg.redundancy * m)))
        self.t_star, self.loads, self.return_probabilities = optimise_deadline(
            task.n_points, [self._device_params(dev) for dev in self.devices], (1 - cfg.redundancy) * m,
            cfg.load_grid, cfg.max_tries)
        AtA = np.zeros((d + c, d + c))
        for dev, l_j, p_j in zip(self.devices, self.loads, self.return_probabilities):
            X, Y = task.X[dev.index], task.Y[dev.index]
            order = self.sim.rng(dev, "cfl-load").permutation(X.shape[0])
            dev.state.rows = order[:l_j]
            w = np.ones(X.shape[0])
            w[dev.state.rows] = np.sqrt(max(0.0, 1.0 - p_j))
            A = np.hstack([X, Y]) * w[:, None]
            AtA += A.T @ A                      # offline parity encoding (module docstring)
        gram = parity_gram(AtA, self.c_p, self.sim.rng(self.server, "cfl-parity"))
        self.server.state.XtX = gram[:d, :d]
        self.server.state.XtY = gram[:d, d:]
        uploads = [self.env.process(self.send(dev, self.server, None, kind="parity",
                                              n_elements=self.c_p * (d + c))) for dev in self.devices]
        yield self.env.all_of(uploads)

    def round_metrics(self, round: int) -> dict:
        """The deadline and how many devices returned their load by it."""
        return {"deadline_s": self.t_star, "returned": 0 if round == 0 else len(self.used or [])}

    def local_gradient(self, dev: Node) -> np.ndarray:
        """Plain gradient of the device's load (eq. 3 on ``l_j`` points); ``2 l_j d c`` MACs."""
        theta = dev.state.received.astype(np.float64)
        X, Y = self.task.X[dev.index][dev.state.rows], self.task.Y[dev.index][dev.state.rows]
        return ridge_gradient(X, Y, theta)

    def parity_gradient(self) -> np.ndarray:
        """Server: ``X~^T X~ Theta - X~^T Y~`` (``d^2 c`` MACs)."""
        return matmul(self.server.state.XtX, self.theta) - self.server.state.XtY

    def round(self, epoch: int) -> Generator:
        """One epoch: devices compute on their loads until the deadline t*, the server on the parity data; sum and update."""
        start = self.sim.now
        server = self.env.process(self.server_compute(self.parity_gradient))
        arrived = yield from self.gather([dev for dev, l_j in zip(self.devices, self.loads) if l_j > 0],
                                         self.local_gradient, kind="gradient",
                                         download=self.theta.astype(np.float32), deadline=self.t_star)
        yield self.env.timeout(max(0.0, start + self.t_star - self.sim.now))    # the epoch lasts >= t*
        G = yield server
        for _, g in arrived:
            G = G + g
        self.used = [dev.index for dev, _ in arrived]
        self.step(G, self.task.m)
