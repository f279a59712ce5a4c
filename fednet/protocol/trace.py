"""The per-round trace: its columns, defined once.

A run appends one :class:`TraceRow` per event to ``Protocol.trace`` (as a dict: the columns of
:class:`TraceRow` in order, then the protocol's own :meth:`~fednet.protocol.base.Protocol.round_metrics`);
the study runner writes them to ``trace.csv``.  Round 0 is the set-up phase (``event = "phase"``),
each synchronous round an ``event = "round"`` row; asynchronous protocols record ``"update"`` rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = ["TraceRow", "COLUMNS", "TEXT_COLUMNS", "EVENTS", "FAILURE_COLUMN", "ends_training"]

#: The kinds of trace events.
EVENTS = ("phase", "round", "update")


@dataclass
class TraceRow:
    """One row of the trace.

    Attributes
    ----------
    protocol : str
        The run's label.
    seed : int
    round : int
        Epoch (0: the set-up phase).
    time_s : float
        Simulated seconds since the start of the run.
    accuracy, loss : float
        Test accuracy and loss of the model after this event (the observer's, not charged).
    bits_up, bits_down : int
        Bits on the uplinks / downlinks since the previous row (headers and retransmissions included).
    device_macs, server_macs : int
        MACs charged to devices / the server since the previous row.
    retransmissions : int
        Packet retransmissions since the previous row.
    used : str
        Space-separated indices of the devices whose results the update used (sorted).
    event : {"phase", "round", "update"}
        What the row records.
    dropped : str
        Space-separated indices (sorted) of the devices that took no part in a step of this event because
        they were unavailable (availability model) or, in a ``tree_aggregate``, a member of their
        root's subtree was.
    decode_failed : bool
        Whether the server failed to decode this event's aggregate (the update was skipped).
    """

    protocol: str
    seed: int
    round: int
    time_s: float
    accuracy: float
    loss: float
    bits_up: int
    bits_down: int
    device_macs: int
    server_macs: int
    retransmissions: int
    used: str
    event: Literal["phase", "round", "update"] = "round"
    dropped: str = ""
    decode_failed: bool = False

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"event must be one of {EVENTS}, got {self.event!r}")

    def as_dict(self) -> dict[str, Any]:
        """The row as a dict in column order."""
        return asdict(self)


#: The standard columns, in order.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TraceRow))

#: The standard columns that hold text (an empty string is a value, not a missing one), and the optional
#: ``sampled`` of client sampling (:mod:`fednet.protocol.sampling`: indices as ``used``).
TEXT_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TraceRow)
                                      if f.type == "str" or str(f.type).startswith("Literal")) + ("sampled",)

#: The extra column that holds the reason on the row where a run's training ended (a non-finite model or a
#: run-time overflow; :mod:`fednet.protocol.finite`); absent from the other rows (empty in ``trace.csv``).
FAILURE_COLUMN = "failure"


def ends_training(row: Any) -> bool:
    """Whether a trace row (a dict, or a row read back from ``trace.csv``) ends its run's training.

    True when its :data:`FAILURE_COLUMN` holds a non-empty reason (a missing value read back by pandas is a
    float NaN: not a reason).
    """
    v = row.get(FAILURE_COLUMN) if hasattr(row, "get") else None
    return isinstance(v, str) and v != ""
