"""fednet.sim — the SimPy engine: nodes, links, compute-time and dropout models, keyed random streams.

The engine moves messages and advances time; it does no protocol math (DESIGN.md, layers).
"""

from .compute import (AlwaysAvailable, Availability, BernoulliDropout, ComputeModel, Deterministic,
                      ShiftedExponential, TraceCompute)
from .network import Link, Message, transmission_time
from .rng import Streams, negative_binomial_from_uniform
from .simulation import Counters, Node, Simulation

__all__ = [
    "AlwaysAvailable", "Availability", "BernoulliDropout", "ComputeModel", "Deterministic", "ShiftedExponential",
    "TraceCompute", "Link", "Message", "transmission_time", "Streams", "negative_binomial_from_uniform",
    "Counters", "Node", "Simulation",
]
