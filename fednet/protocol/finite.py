"""Finite checks: a run whose model diverges, or whose exact values overflow, ends as a recorded failure.

A model whose loss or parameters are no longer finite still "has" an accuracy (the argmax over NaN
picks a class), so without a check a diverged run would be credited with every target below the
share of that class, at the round it diverged. :meth:`fednet.protocol.base.Protocol.run` therefore
passes every trace row through :func:`checked`, and a round that raises one of :data:`RUNTIME_OVERFLOW`
(an exact computation whose values left its ring or field) through :func:`overflowed`:

- without ``strict`` the run's training ends at that round: the row is kept, with the reason in the
  extra trace column ``failure`` and no accuracy (``nan``: a non-finite model has none; an
  overflowed round keeps the previous model's), and no later round runs. The study's summary
  lists the run's seed under ``failed`` (round and reason), and a target is never credited at or
  after that row (:func:`fednet.study.results.crossing`);
- under ``strict`` (the study's ``strict = true``, :meth:`Protocol.run`'s default) it raises
  :class:`~fednet.errors.TrainingFailure` naming the run, the round and the reason.

Checked are the row's loss and the arrays of the protocol's model that are real numbers: its
``theta`` and ``params`` attributes (ndarrays, dicts or lists of them, torch tensors; integer and
field-element arrays are finite by construction and skipped), so a model evaluated only every few
rounds (``eval_every``) is still caught at the round it diverged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from fednet.algebra.rns import RnsCapacityError
from fednet.errors import CapacityError, FednetError, TrainingFailure
from fednet.learning.field_models import FieldOverflowError

from .trace import FAILURE_COLUMN, ends_training

__all__ = ["RUNTIME_OVERFLOW", "FAILURE_COLUMN", "nonfinite_reason", "checked", "overflowed", "failed",
           "MODEL_ATTRIBUTES"]

#: Errors a round raises when the values of an exact computation overflow its ring or field
#: (``OverflowError``: fixed-point aggregates leaving ``Z_<k+f>``, int64 kernels; the field models'
#: and RNS kernels' own checks; a FedVS field too small for the values met at run time).
RUNTIME_OVERFLOW: tuple[type[BaseException], ...] = (OverflowError, FieldOverflowError, RnsCapacityError,
                                                    CapacityError)

#: The protocol attributes that hold the model's real-valued parameters.
MODEL_ATTRIBUTES = ("theta", "params")


def _arrays(value: Any, name: str) -> Iterator[tuple[str, np.ndarray]]:
    """The real-valued arrays in ``value`` (ndarray, torch tensor, dict, list or tuple of them), named."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            yield name, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _arrays(v, f"{name}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _arrays(v, f"{name}[{i}]")
    elif hasattr(value, "detach") and hasattr(value, "is_floating_point"):    # a torch tensor
        if value.is_floating_point():
            yield name, value.detach().cpu().numpy()


def _all_finite(a: np.ndarray) -> bool:
    """Whether every entry of ``a`` is finite (a sum first: no temporary array on the common path)."""
    if a.size == 0:
        return True
    with np.errstate(all="ignore"):
        if np.isfinite(a.sum()):
            return True
    return bool(np.isfinite(a).all())


def nonfinite_reason(protocol: Any, loss: float) -> str | None:
    """Why the protocol's model is not finite, or None when it is.

    Parameters
    ----------
    protocol : Protocol
        Its :data:`MODEL_ATTRIBUTES` are checked.
    loss : float
        The test loss just evaluated.

    Returns
    -------
    str or None
        E.g. ``"non-finite test loss nan"`` or ``"non-finite model parameter params['W1'] (12 of 50176
        entries nan or inf)"``.
    """
    for attr in MODEL_ATTRIBUTES:
        for name, a in _arrays(getattr(protocol, attr, None), attr):
            if not _all_finite(a):
                bad = int(a.size - np.count_nonzero(np.isfinite(a)))
                return f"non-finite model parameter {name} ({bad} of {a.size} entries nan or inf)"
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(loss):
        return f"non-finite test loss {loss!r}"
    return None


def failed(row: dict[str, Any]) -> bool:
    """Whether ``row`` ends its run's training (it holds a reason in :data:`FAILURE_COLUMN`)."""
    return ends_training(row)


def _message(protocol: Any, round: int, reason: str) -> str:
    return (f"{protocol.label}: training failed at round {round}: {reason} (strict = true; without it the run is "
            f"recorded as failed at this round and no target is credited from it on)")


def _impossible_row(row: dict[str, Any]) -> str | None:
    """Why ``row`` cannot be a round's outcome: a simulated clock that is not finite (a step that waited ``nan`` or
    ``inf`` seconds) or an accuracy outside [0, 1] (an ``evaluate`` that is wrong); None when it can."""
    try:
        t = float(row.get("time_s", 0.0))
        acc = float(row.get("accuracy", 0.0))
    except (TypeError, ValueError):
        return f"the round's time_s or accuracy is not a number ({row.get('time_s')!r}, {row.get('accuracy')!r})"
    if not math.isfinite(t):
        return f"the simulated clock is not finite (time_s = {t!r}): a step waited a non-finite time"
    if math.isfinite(acc) and not 0.0 <= acc <= 1.0:
        return f"accuracy = {acc!r} is outside [0, 1] (the protocol's evaluate)"
    return None


def checked(protocol: Any, row: dict[str, Any], strict: bool) -> dict[str, Any]:
    """``row`` (just recorded), marked as the end of training if the model is not finite, the simulated clock is
    not finite or the accuracy lies outside [0, 1].

    Parameters
    ----------
    protocol : Protocol
    row : dict
        The trace row :meth:`Protocol._record` appended (changed in place).
    strict : bool
        Raise instead of marking.

    Returns
    -------
    dict
        ``row``; when the model is not finite, with ``accuracy = nan`` and the reason in
        :data:`FAILURE_COLUMN`.

    Raises
    ------
    fednet.errors.TrainingFailure
        Under ``strict``, when the model is not finite.
    """
    reason = _impossible_row(row) or nonfinite_reason(protocol, row.get("loss"))
    if reason is None:
        return row
    if strict:
        raise TrainingFailure(_message(protocol, row["round"], reason))
    row["accuracy"] = float("nan")
    row[FAILURE_COLUMN] = reason
    return row


def overflowed(protocol: Any, round: int, error: BaseException, strict: bool) -> dict[str, Any]:
    """The trace row of a round that raised a run-time overflow (:data:`RUNTIME_OVERFLOW`).

    The model is the one before the round; the row carries the reason in :data:`FAILURE_COLUMN` and
    training ends (the run loop stops at a :func:`failed` row).

    Raises
    ------
    fednet.errors.TrainingFailure
        Under ``strict``, or for the set-up phase (round 0), which always raises; an error that is
        already a :class:`~fednet.errors.FednetError` (a :class:`~fednet.errors.CapacityError` naming
        the smallest setting that works) is raised as it is.
    """
    reason = f"values overflowed the ring or field: {error}"
    if strict or round == 0:
        if isinstance(error, FednetError):      # already named (a CapacityError naming the setting that works)
            raise error
        raise TrainingFailure(_message(protocol, round, reason)) from error
    protocol.used = None
    row = protocol._record(round, failure=reason)
    row.pop("skip_reason", None)
    row[FAILURE_COLUMN] = reason
    return row
