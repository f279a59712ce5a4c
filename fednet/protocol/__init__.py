"""fednet.protocol — the ``Protocol`` base class, its primitives, and the registry by name."""

from .base import Outgoing, Protocol, ProtocolConfig, SetupFailure, StragglerShortfall, payload_size
from .registry import get, names, register

__all__ = ["Outgoing", "Protocol", "ProtocolConfig", "SetupFailure", "StragglerShortfall", "payload_size", "get", "names",
           "register"]
