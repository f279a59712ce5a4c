"""fednet.protocol — the ``Protocol`` base class, its primitives, modes, trace, and the registry by name."""

from .base import NodeState, Outgoing, Protocol, ProtocolConfig, ServerState, StragglerShortfall, payload_size
from .modes import Full, Mode, Shape, Timing, make_mode
from .primitives import GatherResult, UnchargedCompute, cyclic_steps
from .registry import get, names, register
from .trace import COLUMNS, TraceRow

__all__ = ["Outgoing", "Protocol", "ProtocolConfig", "NodeState", "ServerState", "StragglerShortfall",
           "UnchargedCompute", "GatherResult", "cyclic_steps", "payload_size", "Mode", "Full", "Timing", "Shape",
           "make_mode", "TraceRow", "COLUMNS", "get", "names", "register"]
