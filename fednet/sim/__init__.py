"""fednet.sim — the SimPy engine: nodes, links, compute-time and dropout models, keyed random streams and secret streams.

The engine moves messages and advances time; it does no protocol math (DESIGN.md, layers).
"""

from .compute import (AlwaysAvailable, Availability, BernoulliDropout, ComputeModel, Deterministic,
                      ShiftedExponential, TraceCompute)
from .network import Link, Message, transmission_time
from .rng import SECRET_SEED_ENV, Streams, negative_binomial_from_uniform, secret_seed_from_env
from .simulation import Counters, Node, Simulation

__all__ = [
    "AlwaysAvailable", "Availability", "BernoulliDropout", "ComputeModel", "Deterministic", "ShiftedExponential",
    "TraceCompute", "Link", "Message", "transmission_time", "Streams", "negative_binomial_from_uniform",
    "SECRET_SEED_ENV", "secret_seed_from_env",
    "Counters", "Node", "Simulation",
]
