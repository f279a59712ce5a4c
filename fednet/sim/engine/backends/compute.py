"""The ``compute`` backend: :meth:`~fednet.protocol.primitives.Net.compute_each` without a process per node.

:class:`ComputeReplay` stands for :func:`fednet.sim.engine.reference.compute` (a SimPy process per node: request its
processor, compute, hold it for the charged time) where nothing else is scheduled and the nodes' processors and links
are idle (:func:`~fednet.sim.engine.events.fast_reason`): then every process starts at once, each request is granted
at once, in the nodes' order, so the computations run in that order at ``now``
(:meth:`fednet.sim.simulation.Simulation.compute_now`: the same meters, keyed draws and counters), each processor is
held until ``now + seconds``, and the caller resumes when the last is released: at the largest of those floats
(``now`` where none holds it).  The same results, times, draws and counters, bit for bit; ``O(1)`` Python work per
node instead of a process and its events (CodedSecAgg's encoding and combining at D = 20,000: issue 32).

Where a computation raises, the reference's later computations at that instant still run (their processes were
granted their processors before the failure reaches the caller), so here too every node computes -- the same MACs
and draws counted, which a recorded failure's trace row shows -- and the first exception is raised after the last
(at ``now``).  One difference remains, in failure only: the reference's other processes go on holding their
processors after the caller has the exception; a computation that raises ends the run, so nothing uses them again.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ..events import event_at, fast_reason
from ..step import Backend, Step

__all__ = ["ComputeReplay", "replay_compute"]


class ComputeReplay(Backend):
    """``compute_each`` replayed without processes (module docstring)."""

    name = "compute"
    kind = "compute"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        nodes = step.nodes
        if not nodes:
            return "no node computes"
        if len({id(n) for n in nodes}) != len(nodes):
            return "a node computes twice (its processor would queue)"
        return fast_reason(net, nodes, cells=True)           # computing uses no airtime

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring)."""
        return (yield from replay_compute(net, step.nodes, step.run, step.macs, step.timing_key))


def replay_compute(net: Any, nodes: list, run: Any, macs: Any, timing_key: str) -> Generator:
    """Run ``run(node)`` on every node of ``nodes`` (distinct, idle, nothing else scheduled) as the reference's
    processes would (module docstring) and resume at the last processor's release.

    Parameters
    ----------
    nodes : list of Node
    run : callable(Node) -> Any, or None
        The charged computation.
    macs : callable(Node) -> int, or None
        Known MACs added to the metered ones (evaluated for every node first, as the reference's processes are
        created).
    timing_key : str
        The compute draw's key.

    Returns
    -------
    dict of int -> Any
        ``{node.index: result}``.
    """
    sim = net.sim
    now, rnd = sim.env.now, sim.round
    known = [None if macs is None else macs(n) for n in nodes]
    out, end, failed = {}, now, None
    for node, extra in zip(nodes, known):
        node.cpu.grants += 1                                 # what its request would count
        try:
            out[node.index], seconds = sim.compute_now(node, run, (node,), {}, extra, rnd, timing_key=timing_key)
        except Exception as e:                               # the others still compute (module docstring)
            failed = failed or e
            continue
        if seconds > 0:
            end = max(end, now + seconds)
    if failed is not None:
        raise failed
    yield event_at(sim.env, end)
    return out
