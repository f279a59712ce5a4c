"""Compute-time models and availability (dropout) models.

A node that executes ``rho`` MACs takes :meth:`ComputeModel.duration` simulated seconds. The
models only turn a MAC count and keyed random draws into seconds; the MAC count comes from the
meter around the math that really ran (:mod:`fednet.algebra.meter`), never from a formula.

Source: CodedPaddedFL/CodedSecAgg paper (Schlegel et al.), Sec. III-B: ``T = rho / tau +
Lambda`` with ``Lambda`` exponential, and Sec. VII: ``E[Lambda] = rho / (2 tau)`` ("setup times
... expected value of 50 % of the deterministic computation time").
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fednet.errors import ConfigError

from .stamp import Stamped

__all__ = [
    "ComputeModel",
    "ShiftedExponential",
    "Deterministic",
    "TraceCompute",
    "Availability",
    "AlwaysAvailable",
    "BernoulliDropout",
    "compute_seconds",
]

#: ``draw()`` returns the next keyed standard exponential of (node, "compute", round).
ExpDraw = Callable[[], float]
#: ``draw()`` returns the next keyed standard uniform of (node, "dropout", round).
UniformDraw = Callable[[], float]


class ComputeModel(Stamped, ABC):
    """Maps a MAC count on a node to simulated seconds."""

    @abstractmethod
    def duration(self, node: int, round: int, macs: int, mac_rate: float, draw: ExpDraw) -> float:
        """Simulated seconds for ``macs`` MACs on ``node`` (MAC rate ``mac_rate`` in MAC/s)."""


class ShiftedExponential(ComputeModel):
    """``rho / tau + Lambda``, ``Lambda ~ Exp(mean = setup_fraction * rho / tau)`` (Sec. III-B).

    Parameters
    ----------
    setup_fraction : float
        Mean setup time as a fraction of the deterministic time (0.5 in Sec. VII: eta = 2 tau / rho).

    Raises
    ------
    ValueError
        If ``setup_fraction`` is negative.
    """

    def __init__(self, setup_fraction: float = 0.5) -> None:
        if not (setup_fraction >= 0 and math.isfinite(setup_fraction)):
            raise ConfigError(f"setup_fraction must be a finite number >= 0, got {setup_fraction!r}")
        self.setup_fraction = float(setup_fraction)

    def duration(self, node: int, round: int, macs: int, mac_rate: float, draw: ExpDraw) -> float:
        """``rho / tau`` plus the keyed setup time scaled to ``setup_fraction * rho / tau`` (0 for no MACs)."""
        if macs == 0:
            return 0.0
        base = macs / mac_rate
        return base + self.setup_fraction * base * draw()

    def __repr__(self) -> str:
        return f"ShiftedExponential(setup_fraction={self.setup_fraction})"


class Deterministic(ComputeModel):
    """``rho / tau`` exactly: no random setup time (analytic tests, the server)."""

    def duration(self, node: int, round: int, macs: int, mac_rate: float, draw: ExpDraw) -> float:
        """``rho / tau`` (no random part)."""
        return macs / mac_rate

    def __repr__(self) -> str:
        return "Deterministic()"


class TraceCompute(ComputeModel):
    """Per-node, per-round extra delays read from a table, added to ``rho / tau``.

    Parameters
    ----------
    delays : mapping node -> sequence of seconds
        ``delays[node][round]`` is added to the deterministic time; rounds beyond the trace
        wrap around (the trace repeats). Nodes absent from the table get no extra delay.
    """

    def __init__(self, delays: Mapping[int, Sequence[float]]) -> None:
        for node, seq in delays.items():
            if len(seq) == 0 or not all(x >= 0 and math.isfinite(x) for x in seq):
                raise ConfigError(f"delays[{node}] must be a non-empty sequence of finite seconds >= 0, got {list(seq)!r}")
        self.delays = {int(k): [float(x) for x in v] for k, v in delays.items()}

    def duration(self, node: int, round: int, macs: int, mac_rate: float, draw: ExpDraw) -> float:
        """``rho / tau`` plus this node's trace entry for ``round`` (0 for nodes not in the table)."""
        seq = self.delays.get(node)
        extra = seq[round % len(seq)] if seq else 0.0
        return macs / mac_rate + extra


class Availability(ABC):
    """Decides whether a device takes part in a round (a dropout / straggler-by-absence model)."""

    @abstractmethod
    def available(self, node: int, round: int, draw: UniformDraw) -> bool:
        """True when ``node`` responds in ``round``."""


class AlwaysAvailable(Availability):
    """Every device responds in every round."""

    def available(self, node: int, round: int, draw: UniformDraw) -> bool:
        """Always True."""
        return True

    def __repr__(self) -> str:
        return "AlwaysAvailable()"


class BernoulliDropout(Availability):
    """Each device is absent with probability ``p``, independently across devices and rounds.

    The draw is keyed (node, "dropout", round), so protocols compared under one seed lose the
    same devices in the same rounds.

    Parameters
    ----------
    p : float
        Dropout probability in [0, 1).
    """

    def __init__(self, p: float) -> None:
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout probability p must be in [0, 1), got {p!r}")
        self.p = float(p)

    def available(self, node: int, round: int, draw: UniformDraw) -> bool:
        """False with probability ``p``, from the keyed uniform of (node, "dropout", round)."""
        return self.p == 0.0 or draw() >= self.p

    def __repr__(self) -> str:
        return f"BernoulliDropout(p={self.p})"


def compute_seconds(work: np.ndarray, rate: np.ndarray, frac: np.ndarray,
                    uniforms: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Compute times of many nodes at once, the floats of their compute models' ``duration`` (the vector replays of
    :mod:`fednet.sim.engine.backends`: the gather, tree and masked replays).

    Parameters
    ----------
    work : ndarray of float, (n,)
        MACs of each node's step (exact below 2^53, as Python's ``int / float`` converts them).
    rate : ndarray of float, (n,)
        Each node's MAC rate (MAC/s).
    frac : ndarray of float, (n,)
        The ``setup_fraction`` of a :class:`ShiftedExponential`, -1 for :class:`Deterministic`.
    uniforms : callable(mask) -> ndarray
        The keyed uniforms of the nodes where ``mask`` holds (those that draw), looked at, not consumed.

    Returns
    -------
    seconds : ndarray of float, (n,)
        Simulated seconds: ``rho / tau`` plus ``setup_fraction * rho / tau * Exp(1)`` (``-log1p(-U)``, as
        :meth:`fednet.sim.rng.Streams.standard_exponential`); 0 for no MACs.
    draws : ndarray of bool, (n,)
        Where a keyed draw is taken (a shifted exponential with MACs to run).
    """
    base = work / rate
    seconds = base.copy()
    draws = (frac >= 0) & (work != 0)
    if draws.any():
        expo = np.array([-math.log1p(-u) for u in uniforms(draws).tolist()])
        b = base[draws]
        seconds[draws] = b + frac[draws] * b * expo
    seconds[work == 0] = 0.0
    return seconds, draws
