"""The straggler delay pattern of FedVS's experiments (Li, Yao, Liu, ICML 2023, Sec. 6.2), keyed by round.

"Before the clients upload their computed embeddings, 50% of them add a random delay sampled from an
exponential distribution with a mean of 0.1s. The other 50% are modelled as stragglers, whose delays are
sampled from exponential distributions with incremental means, i.e., 2 + 4i/N, i in [N/2]. Besides, the
straggler effect in the model sharing phase of FedVS is also simulated by adding an exponential delay at
each client, whose mean ... is (log^2 N)/|B| times of the corresponding delay's mean for embedding
uploading."  All links run at 300 Mbit/s (Sec. 6.2, :data:`FEDVS_LINK_BPS`).

Choices the paper leaves open, fixed here: the stragglers are the *last* ``floor(N/2)`` clients (client
``N - floor(N/2) - 1 + i`` has mean ``2 + 4 i / N``, ``i = 1..floor(N/2)``), the others have mean 0.1 s;
other fractions of stragglers (Sec. 2.2, Fig. 1: "We select 60% clients as stragglers") keep the pattern with
``s = round(fraction N)`` stragglers (halves rounded down, so 0.5 gives ``floor(N/2)``; 60 % of 16 is 10), the
last ``s`` clients, means ``2 + 4 i / N``, ``i = 1..s`` (:func:`n_stragglers`);
``log`` is ``log2`` (the complexity analysis of Sec. 5.3 counts ``N log^2 N`` field operations of a
fast multipoint evaluation, base 2); ``|B|`` is the protocol's batch as it passes it.

Keying: the delay of client ``n`` for ``round`` r (for an asynchronous method, its r-th upload) is
``mean_n * E`` with ``E = -log1p(-U)`` and ``U`` the ``n``-th of ``N`` uniforms of a generator keyed by
``(seed, purpose, r)`` (:class:`numpy.random.SeedSequence` spawn key), so every method run with the same
seed sees the same delay for the same (client, round), however many other draws it makes.  The delays
are added to the computation time, which is still charged from metered MACs at the node's MAC rate.
"""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import numpy as np

__all__ = ["FedVSDelays", "FEDVS_LINK_BPS", "n_stragglers", "straggler_means"]

#: Link rate of every client and the server in Sec. 6.2 (bit/s), as measured on AWS EC2 by So et al.
FEDVS_LINK_BPS = 300e6


def n_stragglers(n_clients: int, fraction: float = 0.5) -> int:
    """Number of stragglers ``s`` among ``N`` clients for a straggler fraction: ``fraction N`` rounded, halves down.

    Parameters
    ----------
    n_clients : int
        ``N >= 1``.
    fraction : float
        In [0, 1]; 0.5 is Sec. 6.2 (``s = floor(N/2)``), 0.6 is Sec. 2.2's "60% clients" (``s = 10`` of 16).

    Returns
    -------
    int
        ``ceil(fraction N - 1/2)``, in ``[0, N]``.

    Raises
    ------
    ValueError
        For ``n_clients`` not a positive integer or ``fraction`` outside [0, 1].
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float, np.floating)) and 0 <= fraction <= 1):
        raise ValueError(f"straggler fraction must be a number in [0, 1], got {fraction!r}")
    return max(0, math.ceil(float(fraction) * int(n_clients) - 0.5))


def straggler_means(n_clients: int, fast_mean: float = 0.1, base: float = 2.0, slope: float = 4.0,
                    fraction: float = 0.5) -> np.ndarray:
    """Mean upload delay of every client (Sec. 6.2), simulated seconds.

    Parameters
    ----------
    n_clients : int
        ``N >= 1``.
    fast_mean : float
        Mean of the non-stragglers (0.1 s).
    base, slope : float
        Straggler ``i`` (1-based) has mean ``base + slope i / N`` (2 and 4).
    fraction : float
        Fraction of stragglers (:func:`n_stragglers`; 0.5 in Sec. 6.2, 0.6 in Sec. 2.2).

    Returns
    -------
    ndarray of float64, shape (N,)
        The first ``N - s`` entries are ``fast_mean``, the last ``s`` the stragglers' (``s = floor(N/2)`` at
        ``fraction = 0.5``).
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    for name, v in (("fast_mean", fast_mean), ("base", base), ("slope", slope)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite non-negative number of seconds, got {v!r}")
    N = int(n_clients)
    s = n_stragglers(N, fraction)
    out = np.full(N, float(fast_mean))
    out[N - s:] = base + slope * np.arange(1, s + 1) / N
    return out


@lru_cache(maxsize=4096)
def _exponentials(seed: int, pid: int, round: int, n: int) -> np.ndarray:
    ss = np.random.SeedSequence(seed, spawn_key=(0x5EDF5, pid, round))
    u = np.random.Generator(np.random.PCG64(ss)).random(n)
    e = -np.log1p(-u)
    e.setflags(write=False)
    return e


class FedVSDelays:
    """Keyed upload and model-sharing delays of the FedVS experiments (Sec. 6.2).

    Parameters
    ----------
    n_clients : int
        ``N``.
    seed : int
        Root seed of the run (the simulation's), non-negative.
    fast_mean, base, slope : float
        As :func:`straggler_means` (0.1, 2, 4 s).
    scale : float
        Multiplies every mean (1 in the paper; the "computation dominant" setting of Fig. 3 may shrink
        the delays instead of slowing the processors; 0: no added delay, Fig. 1's "without stragglers").
    straggler_fraction : float
        Fraction of stragglers, in [0, 1] (0.5: Sec. 6.2; 0.6: Sec. 2.2, Fig. 1; :func:`n_stragglers`).

    Attributes
    ----------
    upload_means : ndarray, shape (N,)
        Mean upload delay per client, simulated seconds.
    stragglers : list of int
        Indices of the straggling clients (the last ``s``: ``floor(N/2)`` at the default fraction).
    """

    def __init__(self, n_clients: int, seed: int, *, fast_mean: float = 0.1, base: float = 2.0,
                 slope: float = 4.0, scale: float = 1.0, straggler_fraction: float = 0.5) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not (np.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale must be a finite non-negative number, got {scale!r}")
        self.n_clients = int(n_clients)
        self.seed = int(seed)
        self.scale = float(scale)
        self.upload_means = straggler_means(n_clients, fast_mean, base, slope, straggler_fraction) * self.scale
        s = n_stragglers(self.n_clients, straggler_fraction)
        self.stragglers = list(range(self.n_clients - s, self.n_clients))

    def __repr__(self) -> str:
        return f"FedVSDelays(N={self.n_clients}, stragglers={len(self.stragglers)}, scale={self.scale})"

    def sharing_mean(self, client: int, batch: int) -> float:
        """Mean model-sharing delay: ``(log2 N)^2 / |B|`` times the client's upload mean (Sec. 6.2), seconds."""
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        return math.log2(self.n_clients) ** 2 / int(batch) * float(self.upload_means[self._client(client)])

    def _client(self, client: int) -> int:
        if not 0 <= int(client) < self.n_clients:
            raise ValueError(f"client must be in [0, {self.n_clients}), got {client!r}")
        return int(client)

    def _draw(self, purpose: str, client: int, round: int) -> float:
        if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
            raise ValueError(f"round must be a non-negative integer, got {round!r}")
        pid = zlib.crc32(purpose.encode())
        return float(_exponentials(self.seed, pid, int(round), self.n_clients)[self._client(client)])

    def upload_delay(self, client: int, round: int) -> float:
        """Delay client ``client`` adds before uploading its embedding in ``round`` (Exp, keyed), seconds."""
        return float(self.upload_means[self._client(client)]) * self._draw("fedvs_upload", client, round)

    def sharing_delay(self, client: int, round: int, batch: int) -> float:
        """Delay client ``client`` adds in FedVS's model-sharing phase of ``round`` (Exp, keyed), seconds."""
        return self.sharing_mean(client, batch) * self._draw("fedvs_sharing", client, round)
