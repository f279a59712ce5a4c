"""Client sampling per round (the FedAvg-family protocols): a count or a fraction of the clients, public keyed draws.

Source: McMahan, Moore, Ramage, Hampson, Aguera y Arcas, "Communication-efficient learning of deep networks from
decentralized data", AISTATS 2017, Algorithm 1 (``m <- max(C K, 1)``; ``S_t <- (random set of m clients)``).

A protocol whose ``Config`` derives from :class:`SamplingConfig` draws, at the start of round ``t``, the set
``S_t`` of ``m`` clients uniformly without replacement from the public stream keyed ``(server, "sampling", t)``
(:meth:`fednet.sim.Simulation.rng`): every protocol compared at a seed, whatever it did in earlier rounds, samples
the same clients in round ``t`` (paired comparisons), and the draw is independent of every other keyed stream
(minibatches, availability), so sampling all ``D`` clients leaves a run bit for bit as without sampling.
The availability model is asked about the sampled clients only: a sampled client that is absent is ``dropped``;
an unsampled one takes no part and is in neither ``used`` nor ``dropped``. The trace gets a column ``sampled``
(the sorted indices of ``S_t``, space-separated as ``used``; empty on round 0) when sampling is configured, and
none otherwise (so the traces of runs without sampling keep their columns).

``m`` is ``clients_per_round``, or ``max(1, floor(C D))`` for ``client_fraction = C`` (``C D`` within ``1e-9`` of
an integer counts as that integer, so that ``0.29 * 100`` samples 29, not 28).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from fednet.sim.simulation import Node

from .base import ProtocolConfig

__all__ = ["SamplingConfig", "sample_size", "sample_clients", "sampled_text"]


class SamplingConfig(ProtocolConfig):
    """Client sampling per round (McMahan et al. 2017, Alg. 1; :mod:`fednet.protocol.sampling`).

    Attributes
    ----------
    clients_per_round : int or None
        ``m``: clients drawn each round (uniformly without replacement, public keyed draw ``(server,
        "sampling", round)``), at most the number of devices. None (default): every client takes part.
    client_fraction : float or None
        ``C`` in (0, 1]: ``m = max(1, floor(C D))`` clients each round (McMahan et al. Alg. 1). Exclusive
        with ``clients_per_round``; None (default): every client.
    """

    clients_per_round: int | None = Field(None, ge=1)
    client_fraction: float | None = Field(None, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _one_rule(self) -> SamplingConfig:
        if self.clients_per_round is not None and self.client_fraction is not None:
            raise ValueError(f"set clients_per_round or client_fraction, not both (got clients_per_round = "
                             f"{self.clients_per_round}, client_fraction = {self.client_fraction})")
        return self


def sample_size(config: SamplingConfig, n_devices: int) -> int | None:
    """``m``, the clients sampled per round, or None when every client takes part.

    Parameters
    ----------
    config : SamplingConfig
    n_devices : int
        ``D``.

    Returns
    -------
    int or None

    Raises
    ------
    ValueError
        If ``clients_per_round`` exceeds ``D`` (naming it and its value).
    """
    if config.clients_per_round is not None:
        if config.clients_per_round > n_devices:
            raise ValueError(f"clients_per_round must be at most the number of devices ({n_devices}), "
                             f"got {config.clients_per_round}")
        return config.clients_per_round
    if config.client_fraction is not None:
        cd = config.client_fraction * n_devices
        near = round(cd)
        return max(1, near if abs(cd - near) <= 1e-9 else math.floor(cd))
    return None


def sample_clients(protocol, epoch: int) -> list[Node]:
    """``S_t``: the clients sampled in round ``epoch``, in index order (all devices without sampling).

    Parameters
    ----------
    protocol : Protocol
        A protocol whose config derives from :class:`SamplingConfig`.
    epoch : int
        Round ``t >= 1``.

    Returns
    -------
    list of Node
        ``m`` distinct devices, sorted by index; ``protocol.devices`` itself when sampling is off.
    """
    sim = protocol.sim
    m = sample_size(protocol.config, sim.n_devices)
    if m is None:
        return protocol.devices
    idx = np.sort(sim.rng(sim.server, "sampling", epoch).choice(sim.n_devices, size=m, replace=False))
    return [protocol.devices[i] for i in idx.tolist()]


def sampled_text(nodes: list[Node] | None) -> str:
    """The trace's ``sampled`` column: the sorted indices, space-separated (empty for None)."""
    return "" if nodes is None else " ".join(str(i) for i in sorted(n.index for n in nodes))
