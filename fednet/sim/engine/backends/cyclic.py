"""The ``cyclic`` backend: an all-to-all in groups (:class:`~fednet.sim.engine.mailbox.CyclicSteps`) of alike shares,
replayed on ``relay_steps`` or ``relay_asap`` with index arrays, no object per pair.

:class:`CyclicReplay` stands for the per-message processes of :func:`fednet.sim.engine.reference.exchange` where the
pairs are a :class:`~fednet.sim.engine.mailbox.CyclicSteps` (step ``r``: local node ``i`` of each group sends to
``(i + r) mod n``) and every share is one timing-mode stand-in (the caller's ``alike=True``, CodedSecAgg's set-up,
Schlegel et al., Sec. VI-A): the same keyed draws, times, counters and end of the exchange as the ``relays`` backend
(:func:`~fednet.sim.engine.backends.relays.replay_relays`), bit for bit, without the ``N n (n - 1)`` pairs, payloads,
per-pair mapping or list of steps of Node pairs that backend forms (50 M pairs at D = 20,000 in 8 groups: issue 32).

``relay_steps``: in each step every member sends one message and receives one, so each link serves one message a
step; a step's messages all start at the step's start ``t``, upload ``t + up`` and are delivered at ``(t + up) +
down`` (the float operations of :func:`~fednet.sim.engine.events.fifo_links`), the next step starting at the latest
delivery.  The draws of a chunk of steps are taken at once (:meth:`fednet.sim.rng.Streams.uniforms_repeated`: each
link's draws in step order, as step by step), only the running start is a loop over steps.  ``relay_asap``: the one
batch of all messages through :func:`~fednet.sim.engine.backends.relays.relay_batch` with the senders and receivers
as arrays (``O(N n^2)`` array memory: a few GB at D = 20,000, where ``relay_steps`` needs ``O(N n)``).

It returns an :class:`~fednet.sim.engine.mailbox.AlikeDelivered` (every pair's payload the one stand-in).  Views
recorded (every message is kept as an object), full mode (``alike`` off) or any other exchange: the ``relays``
backend or the reference.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from fednet.algebra.shape import Shape
from fednet.sim.network import transmission_times

from .. import wire
from ..mailbox import AlikeDelivered, CyclicSteps
from ..step import Backend, Declined, Step
from .relays import link_arrays, link_grants, relay_batch, relay_reason, resume_at

__all__ = ["CyclicReplay", "replay_cyclic", "CHUNK_MESSAGES"]

#: Messages per chunk of ``relay_steps`` steps whose draws and link times are computed at once (memory ~ 100 B each).
CHUNK_MESSAGES = 1 << 20


class CyclicReplay(Backend):
    """A :class:`~fednet.sim.engine.mailbox.CyclicSteps` exchange of alike shares replayed as arrays (module
    docstring)."""

    name = "cyclic"
    kind = "exchange"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        pairs = step.steps
        if not isinstance(pairs, CyclicSteps):
            return "the pairs are not a CyclicSteps description"
        if step.schedule not in ("relay_asap", "relay_steps"):
            return f"schedule {step.schedule!r} is not a relay schedule"
        if not step.args.get("alike"):
            return "the shares are not declared alike (alike=True in timing mode)"
        if step.prepare is not None or step.mailbox is not None:
            return "the senders prepare (prepare=...) or the shares go to a mailbox"
        if not len(pairs) or not len(pairs.index):
            return "no message to send"
        if net.sim.record_views:
            return "views are recorded (every message is kept: the relays backend forms them)"
        members = np.sort(pairs.index.reshape(-1))
        if (members[1:] == members[:-1]).any():
            return "a node is in two groups"
        return relay_reason(net, step, members, members)

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        value = alike_value(step.steps, step.payload)
        if isinstance(value, Declined):
            return value
        return (yield from replay_cyclic(net, step.steps, value, kind=step.kind_of, schedule=step.schedule,
                                         n_elements=step.n_elements, element_bits=step.element_bits,
                                         timing_key=step.timing_key, name=step.name,
                                         verify=step.args.get("verify", False)))


def _signature(value: Any) -> Any:
    """``(shape, dtype)`` of a stand-in, or a tuple of them for a tuple or list of stand-ins; None for anything else
    (a real array, a stand-in carrying a value)."""
    if isinstance(value, Shape):
        return None if value.value is not None else (tuple(value.shape), np.dtype(value.dtype).str)
    if isinstance(value, (tuple, list)) and value:
        parts = tuple(_signature(v) for v in value)
        return None if any(p is None for p in parts) else parts
    return None


def alike_value(pairs: CyclicSteps, payload: Any) -> Any:
    """The one payload of an alike exchange: ``payload`` of the first pair of step 1, checked against each sender's
    share of step 1 (one call per sender): all must be value-less stand-ins of one shape and dtype (else a
    :class:`~fednet.sim.engine.step.Declined`: the caller's ``alike`` does not hold)."""
    senders = [node for members in pairs.groups for node in members]
    to = pairs.receivers(1).tolist()
    by_index = {node.index: node for node in senders}
    first = payload(senders[0], by_index[to[0]])
    want = _signature(first)
    if want is None:
        return Declined("the shares are not value-less timing-mode stand-ins (Shape, or a tuple of them)")
    for src, j in zip(senders, to):
        if _signature(payload(src, by_index[j])) != want:
            return Declined(f"the shares are not alike: node {src.index}'s differs from node {senders[0].index}'s")
    return first


def replay_cyclic(net: Any, pairs: CyclicSteps, value: Any, *, kind: str, schedule: str, n_elements: int,
                  element_bits: int, timing_key: str, name: str = "exchange", verify: bool = False) -> Generator:
    """A :class:`~fednet.sim.engine.mailbox.CyclicSteps` exchange of one payload ``value`` on ``relay_steps`` or
    ``relay_asap``, without processes or per-pair objects (module docstring).

    Parameters
    ----------
    pairs : CyclicSteps
        ``N`` groups of ``n >= 2`` distinct devices.
    value : Any
        Every pair's payload.
    kind, n_elements, element_bits, timing_key, name
        As :meth:`fednet.protocol.primitives.Net.exchange` (``n_elements > 0``, ``element_bits`` declared).
    schedule : {"relay_steps", "relay_asap"}
    verify : bool
        Other processes were scheduled at the start (the caller's ``exclusive=True``): check after the fact that
        none of them used the exchange's links (:func:`~fednet.sim.engine.backends.relays.resume_at`).

    Returns
    -------
    AlikeDelivered
        ``{(src, dst): value}`` over the pairs, once the last share is delivered.
    """
    sim = net.sim
    members = pairs.index.reshape(-1)
    grants = link_grants(sim, np.unique(members), np.unique(members)) if verify else None
    bits_each = int(n_elements) * wire.declared(element_bits, kind=kind, where=f"{net.label}: ").bits
    up_purpose = f"uplink:{timing_key}" if timing_key else "uplink"
    down_purpose = f"downlink:{timing_key}" if timing_key else "downlink"
    rates = link_arrays(sim)
    now = float(sim.env.now)
    if schedule == "relay_asap":
        steps = np.arange(1, pairs.n)
        s = np.broadcast_to(members, (len(steps), len(members))).reshape(-1)     # launch order: step, sender
        d = pairs.receivers(steps).reshape(-1)
        down_end = relay_batch(sim, s, d, now, bits_each, rates, up_purpose, down_purpose, False)[3]
        now = float(down_end.max())
    else:
        now = _steps(sim, pairs, now, bits_each, rates, up_purpose, down_purpose)
    yield from resume_at(net, now, name, grants, "cyclic")
    return AlikeDelivered(pairs, value)


def link_classes(rate: np.ndarray, loss: np.ndarray) -> list[tuple[float, float, np.ndarray | None]]:
    """The links' classes of one rate and loss: ``(rate, loss, columns)``, columns None where there is one class.

    Parameters
    ----------
    rate, loss : ndarray of float, (m,)
        Each link's rate (bit/s) and per-packet loss probability.
    """
    if (rate == rate[0]).all() and (loss == loss[0]).all():
        return [(float(rate[0]), float(loss[0]), None)]
    keys = sorted(set(zip(rate.tolist(), loss.tolist())))
    return [(r, p, np.flatnonzero((rate == r) & (loss == p))) for r, p in keys]


def _link_seconds(sim: Any, u: np.ndarray, bits_each: int, classes: list) -> tuple[np.ndarray, int]:
    """:func:`~fednet.sim.network.transmission_times` of messages on the links of the columns of ``u``, called once
    per class of links (:func:`link_classes`) with scalar operands: the same float operations on each element.

    Parameters
    ----------
    u : ndarray of float, (k, m)
        The keyed uniforms, column ``p`` on link ``p``.
    bits_each : int
    classes : list of (float, float, ndarray or None)

    Returns
    -------
    seconds : ndarray of float, (k, m)
    retransmissions : int
        Their sum.
    """
    if len(classes) == 1:                               # one class (the star's usual links): no column selection
        rate, loss, _ = classes[0]
        secs, extra = transmission_times(bits_each, rate, sim.overhead, loss, sim.packet_bits, u, arrays=True)
        return secs, int(extra.sum())
    secs, extra_sum = np.empty(u.shape), 0
    for rate, loss, cols in classes:
        secs[:, cols], extra = transmission_times(bits_each, rate, sim.overhead, loss, sim.packet_bits, u[:, cols],
                                                  arrays=True)
        extra_sum += int(extra.sum())
    return secs, extra_sum


def _steps(sim: Any, pairs: CyclicSteps, now: float, bits_each: int, rates: tuple, up_purpose: str,
           down_purpose: str) -> float:
    """``relay_steps`` of ``pairs`` from ``now``: draws, counters, and the end of the last step (module docstring)."""
    up_rate, up_loss, down_rate, down_loss = rates
    members = pairs.index.reshape(-1)                       # column g n + i: local node i of group g
    N, n = pairs.index.shape
    m = len(members)
    chunk = max(1, CHUNK_MESSAGES // m)
    rnd, counters = sim.round, sim.counters
    local = np.arange(n)
    base = (np.arange(N) * n)[None, :, None]
    up_classes = link_classes(up_rate[members], up_loss[members])
    down_classes = link_classes(down_rate[members], down_loss[members])
    for r0 in range(1, n, chunk):
        steps = np.arange(r0, min(r0 + chunk, n))
        k = len(steps)
        u_up = sim.streams.uniforms_repeated(members, k, up_purpose, rnd)         # (k, m): link by link, in step order
        u_down = sim.streams.uniforms_repeated(members, k, down_purpose, rnd)
        up, extra_up = _link_seconds(sim, u_up, bits_each, up_classes)
        down, extra_down = _link_seconds(sim, u_down, bits_each, down_classes)
        to = (base + (local[None, None, :] + steps[:, None, None]) % n).reshape(k, m)   # receiver's column
        down = np.take_along_axis(down, to, axis=1)                                 # by sender
        for t in range(k):                                  # step start + upload, + download; next step at the last
            now = float(((now + up[t]) + down[t]).max())
        counters.bits_up += bits_each * m * k
        counters.bits_down += bits_each * m * k
        counters.messages += 2 * m * k
        counters.retransmissions += extra_up + extra_down
    return now
