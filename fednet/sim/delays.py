"""The straggler delay pattern of FedVS's experiments (Li, Yao, Liu, ICML 2023, Sec. 6.2), keyed by round.

"Before the clients upload their computed embeddings, 50% of them add a random delay sampled from an
exponential distribution with a mean of 0.1s. The other 50% are modelled as stragglers, whose delays are
sampled from exponential distributions with incremental means, i.e., 2 + 4i/N, i in [N/2]. Besides, the
straggler effect in the model sharing phase of FedVS is also simulated by adding an exponential delay at
each client, whose mean ... is (log^2 N)/|B| times of the corresponding delay's mean for embedding
uploading."  All links run at 300 Mbit/s (Sec. 6.2, :data:`FEDVS_LINK_BPS`).

Choices the paper leaves open, fixed here: the stragglers are the *last* ``floor(N/2)`` clients (client
``N - floor(N/2) - 1 + i`` has mean ``2 + 4 i / N``, ``i = 1..floor(N/2)``), the others have mean 0.1 s;
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

__all__ = ["FedVSDelays", "FEDVS_LINK_BPS", "straggler_means"]

#: Link rate of every client and the server in Sec. 6.2 (bit/s), as measured on AWS EC2 by So et al.
FEDVS_LINK_BPS = 300e6


def straggler_means(n_clients: int, fast_mean: float = 0.1, base: float = 2.0, slope: float = 4.0) -> np.ndarray:
    """Mean upload delay of every client (Sec. 6.2), simulated seconds.

    Parameters
    ----------
    n_clients : int
        ``N >= 1``.
    fast_mean : float
        Mean of the non-stragglers (0.1 s).
    base, slope : float
        Straggler ``i`` (1-based) has mean ``base + slope i / N`` (2 and 4).

    Returns
    -------
    ndarray of float64, shape (N,)
        The first ``N - floor(N/2)`` entries are ``fast_mean``, the last ``floor(N/2)`` the stragglers'.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    for name, v in (("fast_mean", fast_mean), ("base", base), ("slope", slope)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite non-negative number of seconds, got {v!r}")
    N = int(n_clients)
    s = N // 2
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
        the delays instead of slowing the processors).

    Attributes
    ----------
    upload_means : ndarray, shape (N,)
        Mean upload delay per client, simulated seconds.
    stragglers : list of int
        Indices of the straggling clients (the last ``floor(N/2)``).
    """

    def __init__(self, n_clients: int, seed: int, *, fast_mean: float = 0.1, base: float = 2.0,
                 slope: float = 4.0, scale: float = 1.0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not (np.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale must be a finite non-negative number, got {scale!r}")
        self.n_clients = int(n_clients)
        self.seed = int(seed)
        self.scale = float(scale)
        self.upload_means = straggler_means(n_clients, fast_mean, base, slope) * self.scale
        self.stragglers = list(range(self.n_clients - self.n_clients // 2, self.n_clients))

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
