"""CFL's math: return probabilities, deadline and load planning, and the parity Gram matrix.

Source: Prakash, Dhakal, Akdeniz, Yona, Talwar, Avestimehr, Himayat, "Coded computing for
low-latency federated learning over wireless edge networks", IEEE JSAC 39(1), 2021 ([42] in
Schlegel et al.), as outlined in ``shared/references.md`` ("Coded FL of Prakash et al.") and
modelled in Schlegel et al., "CodedPaddedFL and CodedSecAgg", Sec. VII-A (redundancy
``delta = c_p / m`` of 0.1 and 0.8). Pure functions, no SimPy, no protocol.

Time model of one device ``j`` with load ``l`` (number of its points processed):
``T_j(l)`` = download of ``Theta`` + ``l * seconds_per_point`` of deterministic compute + an
exponential set-up time with mean ``setup_fraction * l * seconds_per_point`` (the shifted
exponential) + upload of the gradient, each message taking a geometric number of tries (one
packet per message). :func:`return_probability` gives ``P_j(l, t) = P(T_j(l) <= t)`` exactly
(finite sums over tries of the exponential's CDF). :func:`optimise_deadline` finds the smallest
deadline ``t*`` whose best loads (each maximising ``l P_j(l, t)``) reach an expected return of
``(1 - delta) m`` points. :func:`weighted_gram` and :func:`parity_gram` give the server's Gram
matrix of the summed parity data ``G W [X, Y]`` (weights ``sqrt(1 - P_j)`` on the loaded
points), sampled exactly in distribution without forming the ``c_p x m`` matrix ``G``.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["return_probability", "optimise_deadline", "load_weights", "weighted_gram", "parity_gram"]


def return_probability(t: float, loads: np.ndarray, *, down_s: float, up_s: float, p_down: float,
                       p_up: float, seconds_per_point: float, setup_fraction: float,
                       max_tries: int = 12) -> np.ndarray:
    """``P(T(l) <= t)`` for each load ``l`` (the module docstring's time model).

    Parameters
    ----------
    t : float
        Deadline, simulated seconds from the start of the epoch.
    loads : ndarray of int, (L,)
        Candidate numbers of points.
    down_s, up_s : float
        Simulated seconds per try of the model download / gradient upload (headers included).
    p_down, p_up : float
        Loss probabilities per try (tries are geometric).
    seconds_per_point : float
        Deterministic compute seconds per point (``2 d c / tau``, ``tau`` in MAC/s).
    setup_fraction : float
        Mean of the exponential set-up time over the deterministic time (0: deterministic).
    max_tries : int
        Tries per message summed exactly (the geometric tail beyond is ignored).

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
        Expected number of returned points to reach (``(1 - delta) m``).
    grid : int
        Candidate loads per device (evenly spaced in ``[0, n_j]``).
    max_tries : int
        As in :func:`return_probability`.

    Returns
    -------
    t_star : float
        Smallest deadline in simulated seconds (bisection to 1e-6 relative) with expected
        return >= target.
    loads : list of int
    probabilities : list of float
        ``P_j(l_j, t*)``.

    Raises
    ------
    ValueError
        If ``target`` exceeds the total number of points, or no deadline below 1e9 s reaches it.
    """
    if target > sum(n_points):
        raise ValueError(f"target {target} exceeds the {sum(n_points)} points")
    cands = [np.unique(np.linspace(0, n, min(grid, n + 1)).round().astype(int)) for n in n_points]

    def _best(t: float):
        loads, probs, total = [], [], 0.0
        for c, prm in zip(cands, params):
            p = return_probability(t, c, max_tries=max_tries, **prm)
            k = int(np.argmax(c * p))
            loads.append(int(c[k]))
            probs.append(float(p[k]))
            total += c[k] * p[k]
        return total, loads, probs

    hi = 1.0
    while _best(hi)[0] < target:
        hi *= 2
        if hi > 1e9:
            raise ValueError("no deadline reaches the target return")
    lo = 0.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if _best(mid)[0] >= target:
            hi = mid
        else:
            lo = mid
    _, loads, probs = _best(hi)
    return hi, loads, probs


def load_weights(n: int, rows: np.ndarray, p: float) -> np.ndarray:
    """Diagonal of ``W_j``: ``sqrt(1 - P_j)`` on the loaded points, 1 on the others.

    Parameters
    ----------
    n : int
        ``n_j``, the device's number of points.
    rows : ndarray of int, (l_j,)
        Indices of the points of its load.
    p : float
        ``P_j(l_j, t*)``, the probability that the load returns by the deadline.

    Returns
    -------
    ndarray, (n,) float64
    """
    w = np.ones(n)
    w[rows] = np.sqrt(max(0.0, 1.0 - p))
    return w


def weighted_gram(X: np.ndarray, Y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``A^T A`` with ``A = diag(w) [X, Y]``, a device's share of the parity Gram matrix.

    Offline parity encoding (not timed, like CodedPaddedFL's offline ``X_i^T X_i``, Sec. VII):
    plain float64, deliberately unmetered.

    Parameters
    ----------
    X : ndarray, (n, d)
    Y : ndarray, (n, c)
    w : ndarray, (n,)
        :func:`load_weights`.

    Returns
    -------
    ndarray, (d + c, d + c)
    """
    A = np.hstack([X, Y]) * w[:, None]
    return A.T @ A


def parity_gram(A: np.ndarray, c_p: int, rng: np.random.Generator) -> np.ndarray:
    """Gram matrix of ``G A`` for ``G`` (c_p x m) with i.i.d. N(0, 1/c_p) entries, sampled exactly.

    ``[X~, Y~] = G W [X, Y]`` has i.i.d. rows ``N(0, A^T A / c_p)``, so its Gram matrix is
    ``L S L^T / c_p`` with ``L L^T = A^T A`` and ``S`` a Wishart(``c_p``, I) draw (Bartlett):
    the same distribution as forming ``G``, without the ``c_p x m`` matrix.

    Parameters
    ----------
    A : ndarray, (r, r)
        ``A^T A`` of the weighted data ``A = W [X, Y]`` (r = d + c).
    c_p : int
        Number of parity rows (``round(delta m)``).
    rng : numpy.random.Generator
        The server's parity stream.

    Returns
    -------
    ndarray, (r, r)
        ``(G A)^T (G A)``; the blocks ``[:d, :d]`` and ``[:d, d:]`` are ``X~^T X~`` and
        ``X~^T Y~``.
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
