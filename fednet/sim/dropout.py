"""Per-client dropout probabilities as an availability model (DReS-FL's extreme scenario).

Source: Shao, Sun, Li, Zhang, "DReS-FL: Dropout-resilient secure federated learning for non-IID
clients via secret data sharing", Sec. 6.1: "the dropout rate of each client is set to 0.99 with a
probability of 0.5 or is uniformly sampled from [0, 0.1] otherwise".

Two levels of randomness, both derived from the public seed and independent of the protocol:

* the per-client *rates* ``p_i``, drawn once per run from the sequential stream
  ``("dropout-rates", attempt)`` of :class:`fednet.sim.rng.Streams` (:class:`ExtremeDropout`), by default of
  the run's seed (a new draw per study seed), or of a fixed ``rates_seed`` (one draw for every study seed:
  the reading of DReS-FL's Table 2, whose +-0.05 spreads over five runs imply one draw of the rates);
* each round's *presence*, ``U >= p_i`` for the keyed uniform ``U`` of ``(node, "dropout",
  round)`` (:meth:`fednet.sim.Simulation.available`), so DReS-FL and its baselines lose the same
  clients in the same rounds at a seed (the primitives ask once per node and round).

Under the extreme scenario with ``N = 20`` about a quarter of the rate draws leave fewer than 9
reliable clients (``P[Binomial(20, 1/2) <= 8] = 25.2 %``), so DReS-FL with ``K = T = 1`` could
rarely decode. :func:`decodable_probability` gives the exact per-round probability that at least
``R`` clients are present (a Poisson-binomial tail); ``min_reliable`` conditions the rate draw on
at least that many reliable clients (rejection sampling over attempts, each attempt its own keyed
stream), an option a study must state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .compute import Availability, UniformDraw
from .rng import Streams

__all__ = ["PerClientDropout", "ExtremeDropout", "extreme_dropout_rates", "decodable_probability"]


class PerClientDropout(Availability):
    """Client ``i`` is absent in a round with its own probability ``rates[i]``, independently over rounds.

    Parameters
    ----------
    rates : sequence of float
        Dropout probability of each client, each in [0, 1).

    Raises
    ------
    ValueError
        If a rate lies outside [0, 1).
    """

    def __init__(self, rates: Sequence[float]) -> None:
        r = np.asarray(rates, dtype=np.float64)
        if r.ndim != 1 or r.size == 0 or not np.all((r >= 0) & (r < 1)):
            raise ValueError(f"rates must be a non-empty list of probabilities in [0, 1), got {list(rates)!r}")
        self.rates = r

    @property
    def participation(self) -> np.ndarray:
        """``1 - rates``: each client's probability of taking part in a round (FedAvg-IS weights)."""
        return 1.0 - self.rates

    def rate(self, node: int) -> float:
        """Dropout probability of client ``node``.

        Raises
        ------
        ValueError
            For a node index outside the rates.
        """
        if not 0 <= node < self.rates.size:
            raise ValueError(f"node must be in [0, {self.rates.size}), got {node}")
        return float(self.rates[node])

    def available(self, node: int, round: int, draw: UniformDraw) -> bool:
        """False with probability ``rates[node]``, from the keyed uniform of (node, "dropout", round)."""
        p = self.rate(node)
        return p == 0.0 or draw() >= p

    def __repr__(self) -> str:
        return f"PerClientDropout({np.round(self.rates, 4).tolist()})"


def extreme_dropout_rates(n_devices: int, rng: np.random.Generator, *, high: float = 0.99, p_high: float = 0.5,
                          low_max: float = 0.1) -> np.ndarray:
    """Rates of the extreme scenario (DReS-FL, Sec. 6.1): ``high`` w.p. ``p_high``, else U[0, ``low_max``].

    Parameters
    ----------
    n_devices : int
        Number of clients N.
    rng : numpy.random.Generator
    high, p_high, low_max : float
        0.99, 0.5, 0.1 in the paper.

    Returns
    -------
    ndarray, (N,) float64
        One draw per client: first the ``N`` coin flips, then the ``N`` uniforms.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be positive, got {n_devices}")
    if not (0 <= high < 1 and 0 <= p_high <= 1 and 0 <= low_max < 1):
        raise ValueError(f"need 0 <= high < 1, 0 <= p_high <= 1, 0 <= low_max < 1, got {high}, {p_high}, {low_max}")
    flips = rng.random(n_devices) < p_high
    lows = rng.uniform(0.0, low_max, n_devices)
    return np.where(flips, high, lows)


class ExtremeDropout(PerClientDropout):
    """The extreme scenario of DReS-FL Sec. 6.1, rates drawn from the public seed (module docstring).

    Parameters
    ----------
    n_devices : int
        N.
    seed : int
        The run's root seed (the same for every protocol of a paired comparison).
    rates_seed : int, optional
        Draw the rates from this seed's stream instead of ``seed``'s, so that every study seed sees the same
        rates (the per-round presence draws, keyed by the run's seed in
        :meth:`fednet.sim.Simulation.available`, still differ). None (default): ``seed``'s draw, a new set of
        rates per study seed. Table 2 of DReS-FL (Sec. 6.1) reports +-0.05 over five runs, which a redraw of
        the rates per run cannot give (module docstring): the paper's apparent choice is one fixed draw.
    min_reliable : int, optional
        Condition on at least this many reliable clients (rate below ``high``): rate draws with
        fewer are rejected and redrawn from the next attempt's stream. None: unconditioned.
    high, p_high, low_max : float
        0.99, 0.5, 0.1 (Sec. 6.1).
    max_attempts : int
        Give up after this many rejected draws.

    Attributes
    ----------
    attempts : int
        Rate draws made (1 when the first one was kept).
    n_reliable : int
        Clients with a rate below ``high``.
    rates_seed : int or None
        The seed the rates were drawn from when fixed (None: ``seed``'s draw).

    Raises
    ------
    ValueError
        If ``min_reliable`` exceeds ``n_devices``, no draw meets it in ``max_attempts``, or ``rates_seed`` is
        not a non-negative integer.
    """

    def __init__(self, n_devices: int, seed: int, *, rates_seed: int | None = None, min_reliable: int | None = None,
                 high: float = 0.99, p_high: float = 0.5, low_max: float = 0.1, max_attempts: int = 10_000) -> None:
        if min_reliable is not None and not 0 <= min_reliable <= n_devices:
            raise ValueError(f"min_reliable must be in [0, {n_devices}], got {min_reliable}")
        if rates_seed is not None and (isinstance(rates_seed, bool) or not isinstance(rates_seed, (int, np.integer))
                                       or rates_seed < 0):
            raise ValueError(f"rates_seed must be a non-negative integer or None, got {rates_seed!r}")
        streams = Streams(seed if rates_seed is None else int(rates_seed), 1)
        for attempt in range(max_attempts):
            rates = extreme_dropout_rates(n_devices, streams.generator("dropout-rates", attempt),
                                          high=high, p_high=p_high, low_max=low_max)
            if min_reliable is None or int(np.sum(rates < high)) >= min_reliable:
                break
        else:
            raise ValueError(f"no rate draw with min_reliable = {min_reliable} reliable clients in "
                             f"{max_attempts} attempts")
        super().__init__(rates)
        self.seed, self.high, self.min_reliable = int(seed), float(high), min_reliable
        self.rates_seed = None if rates_seed is None else int(rates_seed)
        self.attempts = attempt + 1
        self.n_reliable = int(np.sum(rates < high))

    def __repr__(self) -> str:
        fixed = "" if self.rates_seed is None else f", rates_seed={self.rates_seed}"
        return (f"ExtremeDropout(seed={self.seed}{fixed}, min_reliable={self.min_reliable}, "
                f"rates={np.round(self.rates, 4).tolist()})")


def decodable_probability(participation: Sequence[float], threshold: int) -> float:
    """``P[at least threshold clients present]`` for independent clients (a Poisson-binomial tail).

    Parameters
    ----------
    participation : sequence of float
        Each client's probability of being present, ``1 - p_i``.
    threshold : int
        The recovery threshold ``R`` (DReS-FL: ``deg(g)(K + T - 1) + 1``, eq. 1).

    Returns
    -------
    float
        The exact tail probability (dynamic programming over clients).
    """
    q = np.asarray(participation, dtype=np.float64)
    dist = np.zeros(q.size + 1)
    dist[0] = 1.0
    for qi in q:
        dist[1:] = dist[1:] * (1 - qi) + dist[:-1] * qi
        dist[0] *= 1 - qi
    return float(dist[max(0, int(threshold)):].sum())
