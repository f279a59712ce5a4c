"""The ``bundled`` backend: an all-to-all exchange on the bundled schedule with each node's shares as one array.

:class:`BundledArrays` stands for the per-pair code of :func:`fednet.sim.engine.reference.exchange` on the
``bundled`` schedule for an :class:`~fednet.sim.engine.mailbox.AllToAll` given as ``rows``: the same processes,
messages (kinds, ends, sizes, in the same order) and mailbox keys; only the containers differ (a sender's upload is
its rows for its destinations, a forward the rows addressed to it, senders in index order), so the Python work is
``O(N)`` per exchange for ``N`` devices instead of ``O(N^2)`` (``tests/test_bulk_exchange.py``; LightSecAgg at
D = 1000).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from fednet.algebra.shape import Shape
from fednet.sim.simulation import Node

from ..events import spawner
from ..mailbox import AllToAll, Bundles, Mailbox, stack, take
from ..step import Backend, Step

__all__ = ["BundledArrays", "bulk_bundled"]


class BundledArrays(Backend):
    """An all-to-all bundled exchange moved as arrays (module docstring)."""

    name = "bundled"
    kind = "exchange"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        if not isinstance(step.steps, AllToAll):
            return "the pairs are not one AllToAll step"
        if step.schedule != "bundled":
            return f"schedule {step.schedule!r} is not bundled"
        if step.rows is None:
            return "the shares are given per pair (payload=...), not as rows"
        return True

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        return (yield from bulk_bundled(net, step.steps, step.rows, kind=step.kind_of, n_elements=step.n_elements,
                                        element_bits=step.element_bits, prepare=step.prepare, mailbox=step.mailbox,
                                        timing_key=step.timing_key))


def bulk_bundled(net, pairs: AllToAll, rows: Callable[[Node], Any], *, kind: str, n_elements: int | None,
                  element_bits: int | None, prepare: Callable[[Node], Generator] | None, mailbox: Mailbox | None,
                  timing_key: str) -> Generator:
    """An exchange of ``pairs`` on the ``bundled`` schedule with the shares as arrays.

    The same processes, messages (kinds, ends, sizes, in the same order) and mailbox keys as the per-pair
    code, which it replaces: only the containers differ (a sender's upload is its rows for its
    destinations, a forward the rows addressed to it, senders in index order), so the Python work is
    ``O(N)`` per exchange for ``N`` devices (the arrays' own work is numpy's).
    """
    env, server = net.sim.env, net.sim.server
    receivers = list(pairs.receivers)
    r_idx = np.array([dst.index for dst in receivers], dtype=np.int64)
    r_set = set(r_idx.tolist())
    senders = [src for src in pairs.senders if len(receivers) > (src.index in r_set)]  # someone to send to
    delivered = Bundles()
    if not senders:
        return delivered
    children: list[simpy.Process] = []

    spawn = spawner(env, children)

    def upload(src: Node) -> Generator:
        """Upload ``src``'s shares for its destinations to the server in one message."""
        if prepare is not None:
            yield from prepare(src)
        table = rows(src)
        to = r_idx[r_idx != src.index]
        yield from net.send(src, server, take(table, to), kind=kind,
                             n_elements=None if n_elements is None else n_elements * len(to),
                             element_bits=element_bits, encrypted=True, timing_key=timing_key)
        return table

    def forward(dst: Node, srcs: np.ndarray, block: Any) -> Generator:
        """Forward the rows the server holds for ``dst`` (from ``srcs``) in one download."""
        msg = yield from net.send(server, dst, block, kind=kind,
                                   n_elements=None if n_elements is None else n_elements * len(srcs),
                                   element_bits=element_bits, timing_key=timing_key)
        delivered.add(dst.index, srcs, msg.payload)
        if mailbox is not None:
            mailbox.put_many(srcs, dst.index, msg.payload)

    try:
        ups = [spawn(upload(src)) for src in senders]
        yield env.all_of(ups)
        s_idx = np.array([src.index for src in senders], dtype=np.int64)
        order = np.argsort(s_idx, kind="stable")
        s_sorted = s_idx[order]
        held = stack([ups[k].value for k in order.tolist()])    # (senders by index, N, ...)
        s_set = set(s_sorted.tolist())
        targets = sorted((dst for dst in receivers if len(senders) > (dst.index in s_set)),
                         key=lambda dst: dst.index)                   # someone sent to them
        fwd = []
        for dst in targets:
            if net.available(dst):
                sel = s_sorted != dst.index
                block = (Shape((int(sel.sum()), *held.shape[2:]), held.dtype) if isinstance(held, Shape)
                         else held[sel, dst.index])
                fwd.append((dst, s_sorted[sel], block))
        yield env.all_of([spawn(forward(dst, srcs, block)) for dst, srcs, block in fwd])
    except simpy.Interrupt:
        for p in children:
            if p.is_alive:
                p.interrupt("cancelled: the exchange is no longer needed")
    return delivered
