"""The ``buffered`` backend: asynchronous clients and the server's buffer (FedBuff) without a process per client.

:func:`fednet.sim.engine.reference.buffered` runs :class:`fednet.protocol.buffered.BufferedAsync`'s clients as one
SimPy process each, started at the first take and living across rounds: wait for a model version not trained on,
download it, compute the update, upload it, repeat; the server takes the next ``K`` arrivals every round.
:class:`BufferedReplay` keeps every client's stage (download, compute, upload, waiting) and the time it ends as
arrays and moves them on with the same float sums and keyed draws, so a round costs a few vector operations
instead of ~16 SimPy events per update (``benchmarks/bench_sweep.py --protocols fedbuff``).

**How the replay decides SimPy's order.**  A client's draws are keyed by (client, purpose, round) and consumed in
its own order, so only two things depend on how the clients' events interleave: the order of the arrivals (which
``K`` updates a buffer holds, and the order they are summed in) and the round in which a stage starts (the keyed
draws of round ``r`` until the server's new version at ``T_r``, of ``r + 1`` from it on; a client that waited for
the version starts at ``T_r`` in round ``r + 1``).  A take moves every client whose stage ends before a lower bound
of the ``K``-th arrival (the ``m``-th smallest stage end, ``m`` updates still missing) -- those events precede it --
until the ``m``-th smallest end is an upload's; :meth:`ClientReplay.version_changed` then moves every client whose
stage ends before the server's new version.  Events at one time are ordered by SimPy's insertion order, which the
replay does not model: two arrivals at one time, or a stage ending exactly at a new version, raise
:class:`~fednet.sim.engine.results.EngineError` (the decline below makes them events of probability zero).

**When it declines** (:meth:`BufferedReplay.can_run`, at the first take; the choice holds for the run): a
subclass overriding the client loop or the round (``client_loop``, ``next_turn``, ``fill_buffer``, ``round``,
``new_model_version``); a concurrency limit below the number of clients (its first-come-first-served slots are not
replayed); an availability model other than always available; views recorded; a compute model without a
continuous random part on some device (arrivals could tie); and what every backend declines
(:func:`~fednet.sim.engine.events.fast_reason`: energy, latency floors, shared cells, overrides, other processes,
busy links).  Equality with the reference, trace by trace: ``tests/test_buffered_replay.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.sim.compute import AlwaysAvailable, ShiftedExponential, compute_seconds
from fednet.sim.network import transmission_times

from .. import wire
from ..events import draws_plain, event_at, fast_reason
from ..results import EngineError, UnchargedCompute, batch_of, payload_size
from ..step import Backend, Step

__all__ = ["BufferedReplay", "ClientReplay", "REPLAYED"]

#: The methods of the protocol base the replay stands for: a subclass overriding one runs on the reference.
REPLAYED = ("client_loop", "next_turn", "fill_buffer", "round", "new_model_version")

DOWN, COMPUTE, UP, WAIT = 0, 1, 2, 3
#: The factor on the lower bounds of stage times (:attr:`ClientReplay.least_down`): below any rounding of the floats.
SHORT = 1.0 - 1e-6


class BufferedReplay(Backend):
    """Asynchronous clients replayed as arrays (module docstring)."""

    name = "buffered"
    kind = "buffered"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if the replay gives the reference's results for the whole run, else the reason (module
        docstring); after the first take, whether the replay runs this pool's clients."""
        owner = step.owner
        clients = owner.clients
        if clients is not None:
            return True if isinstance(clients, ClientReplay) else \
                "the clients run as reference processes since the first take (they live across rounds)"
        over = [name for name in REPLAYED if getattr(type(owner), name) is not getattr(step.base, name)]
        if over:
            return f"{', '.join(over)} overridden (the replay stands for {step.base.__name__}'s client loop)"
        sim = net.sim
        n = len(step.nodes)
        if step.concurrency is not None and step.concurrency < n:
            return (f"a concurrency limit of {step.concurrency} for {n} clients (its first-come-first-served slots are "
                    "not replayed)")
        if type(sim.availability) is not AlwaysAvailable:
            return "an availability model other than always available (a client may skip a version)"
        if sim.record_views:
            return "the simulation records views (the replay files no messages)"
        if not draws_plain(sim.streams):
            return "the keyed draws are overridden"
        for node in step.nodes:
            model = node.compute_model
            if type(model) is not ShiftedExponential or not model.setup_fraction > 0:
                return (f"device {node.index}'s compute model {model!r} has no continuous random part (arrivals "
                        "could tie, and ties are ordered by SimPy's insertion order, which is not replayed)")
        return fast_reason(net, step.nodes)

    def run(self, net: Any, step: Step) -> Generator:
        """Take the next ``K`` arrivals (starting the replay at the first take)."""
        owner = step.owner
        if owner.clients is None:
            owner.clients = ClientReplay(net, step)
        return (yield from owner.clients.take(step.K))


class ClientReplay:
    """The clients of one :class:`~fednet.protocol.buffered.BufferedAsync` run, as arrays (module docstring).

    Position ``p`` is ``step.nodes[p]``.  Per client: ``stage`` (``DOWN``, ``COMPUTE``, ``UP``, ``WAIT``), ``end``
    (simulated seconds at which the stage ends; inf while waiting), ``version`` of its turn, its update and MACs
    (computed when the turn starts: a pure function of the version's model and the client's iteration) and the
    retransmissions of its current transfer (counted when it ends, as ``Simulation.hop_done`` does).
    """

    def __init__(self, net: Any, step: Step) -> None:
        sim = net.sim
        self.net, self.sim, self.owner, self.step = net, sim, step.owner, step
        self.nodes = list(step.nodes)
        n = len(self.nodes)
        self.idx = np.array([d.index for d in self.nodes], dtype=np.intp)
        self.down_rate = np.array([d.downlink.rate_bps for d in self.nodes])
        self.down_loss = np.array([d.downlink.loss for d in self.nodes])
        self.up_rate = np.array([d.uplink.rate_bps for d in self.nodes])
        self.up_loss = np.array([d.uplink.loss for d in self.nodes])
        self.mac_rate = np.array([d.mac_rate for d in self.nodes], dtype=float)
        self.frac = np.array([d.compute_model.setup_fraction for d in self.nodes])
        self.stage = np.full(n, WAIT, dtype=np.int8)
        self.end = np.full(n, np.inf)
        self.version = np.full(n, -1, dtype=np.int64)
        self.macs = np.zeros(n)
        self.extra = np.zeros(n, dtype=np.int64)
        self.updates: list[Any] = [None] * n
        self.queue: list[tuple[float, int, int, Any]] = []          # arrivals not taken: (time, p, version, update)
        self.models: dict[int, tuple[Any, int, int]] = {}           # version -> (payload, elements, bits)
        self.up_size: tuple[int, int] | None = None                 # (elements, bits) of an update
        self.changed_at: float | None = None                        # the last new version's time
        self.last_arrival = -np.inf
        #: Lower bounds of each client's download, compute and upload times (no retransmission, no random part; a
        #: relative millionth less, for the floats): for the bounds of :meth:`_advance` only, never for a time.
        self.least_down, self.least_compute, self.least_up = np.zeros(n), np.zeros(n), np.zeros(n)
        self.batch = batch_of(step.fn)
        self.where = f"{net.label}: "
        self.bits_down = -1

    # -- a turn's stages --------------------------------------------------------------------
    def _model(self, v: int) -> tuple[Any, int, int]:
        """Version ``v``'s download (the payload of ``step.download()`` when ``v`` is current), its size and bits."""
        got = self.models.get(v)
        if got is None:
            payload = self.step.download()
            bits = wire.width(payload, self.step.download_bits, self.step.download_kind, arg="element_bits",
                              where=self.where)
            got = self.models[v] = (payload, payload_size(payload), bits)
            self.models.pop(v - 2, None)                       # a turn starts on the current version only
        return got

    def _start(self, P: np.ndarray, t: np.ndarray, rnd: int) -> None:
        """Clients ``P`` start a turn at times ``t`` in round ``rnd``: the current version, the next iteration, the
        download's keyed draw; their updates, computed now (the same values the compute stage gives)."""
        v = self.owner.version
        payload, elements, bits = self._model(v)
        nodes = [self.nodes[p] for p in P.tolist()]
        for dev in nodes:
            st = dev.state
            st.version, st.iteration = v, st.iteration + 1
        self.version[P] = v
        if self.batch is not None:
            with MacMeter() as meter:
                values, macs = self.batch(nodes, payload)
            macs = [int(m) for m in macs]
            if meter.macs != sum(macs) or len(values) != len(nodes):
                raise EngineError(f"{self.where}the batch of {self.step.name} metered {meter.macs} MACs for "
                                  f"{len(values)} values but charged {sum(macs)} to {len(nodes)} clients")
        else:
            values, macs = [], []
            for dev in nodes:
                with MacMeter() as meter:
                    values.append(self.step.fn(dev, payload, dev.state.iteration))
                macs.append(meter.macs)
        if min(macs) == 0:
            raise UnchargedCompute(f"{self.where}step {self.step.name!r} charged 0 MACs to a client; compute with "
                                   f"metered kernels (fednet.algebra.meter)")
        for j, p in enumerate(P.tolist()):
            self.updates[p] = values[j]
        self.macs[P] = macs
        self.least_compute[P] = self.macs[P] / self.mac_rate[P] * SHORT
        u = self.sim.streams.uniforms(self.idx[P], "downlink", rnd)
        if self.bits_down != elements * bits:
            self.bits_down = elements * bits
            self.least_down = (1.0 + self.sim.overhead) * self.bits_down / self.down_rate * SHORT
        secs, extra = transmission_times(self.bits_down, self.down_rate[P], self.sim.overhead, self.down_loss[P],
                                         self.sim.packet_bits, u, arrays=True)
        self.stage[P], self.end[P], self.extra[P] = DOWN, t + secs, extra

    def _downloaded(self, P: np.ndarray, rnd: int) -> None:
        """Clients ``P``'s downloads end; their computations start (MACs counted now, the keyed compute draw)."""
        c = self.sim.counters
        c.bits_down += self.bits_down * len(P)
        c.messages += len(P)
        c.retransmissions += int(self.extra[P].sum())
        c.device_macs += int(self.macs[P].sum())
        idx = self.idx[P]
        secs, _ = compute_seconds(self.macs[P], self.mac_rate[P], self.frac[P],
                                  lambda mask: self.sim.streams.uniforms(idx[mask], "compute", rnd))
        self.stage[P], self.end[P] = COMPUTE, self.end[P] + secs

    def _computed(self, P: np.ndarray, rnd: int) -> None:
        """Clients ``P``'s computations end; their uploads start (the keyed uplink draw)."""
        if self.up_size is None:
            G = self.updates[int(P[0])]
            self.up_size = (payload_size(G), wire.width(G, self.step.upload_bits, self.step.upload_kind,
                                                        arg="element_bits", where=self.where))
            self.least_up = (1.0 + self.sim.overhead) * self.up_size[0] * self.up_size[1] / self.up_rate * SHORT
        elements, bits = self.up_size
        u = self.sim.streams.uniforms(self.idx[P], "uplink", rnd)
        secs, extra = transmission_times(elements * bits, self.up_rate[P], self.sim.overhead, self.up_loss[P],
                                         self.sim.packet_bits, u, arrays=True)
        self.stage[P], self.end[P], self.extra[P] = UP, self.end[P] + secs, extra

    def _arrived(self, P: np.ndarray, rnd: int) -> None:
        """Clients ``P``'s uploads end: their updates join the queue in time order; a client whose version is no
        longer current starts again at once, the others wait for a new version."""
        c = self.sim.counters
        elements, bits = self.up_size
        c.bits_up += elements * bits * len(P)
        c.messages += len(P)
        c.retransmissions += int(self.extra[P].sum())
        t = self.end[P]                                        # ascending (ClientReplay._advance)
        if len(t) > 1 and (t[1:] == t[:-1]).any() or t[0] <= self.last_arrival:
            raise EngineError(f"{self.where}two updates of {self.step.name} arrive at one time ({t[0]!r} s...): "
                              "their order is SimPy's insertion order, which the buffered replay does not model")
        self.last_arrival = float(t[-1])
        for p, tp in zip(P.tolist(), t.tolist()):
            self.queue.append((tp, p, int(self.version[p]), self.updates[p]))
            self.updates[p] = None
        stale = self.version[P] < self.owner.version
        self.stage[P[~stale]], self.end[P[~stale]] = WAIT, np.inf
        if stale.any():
            self._start(P[stale], t[stale], rnd)

    def _move(self, P: np.ndarray, rnd: int) -> None:
        """Every client of ``P`` ends its stage and starts the next (one stage each)."""
        stage = self.stage[P]
        for s, step in ((DOWN, self._downloaded), (COMPUTE, self._computed), (UP, self._arrived)):
            sel = P[stage == s]
            if sel.size:
                step(sel, rnd)

    # -- the server's side ------------------------------------------------------------------
    def _advance(self, rnd: int, *, need: int = 0, before: float = np.inf) -> None:
        """Move the clients on in time order (vectorised where the order cannot matter) until ``need`` more updates
        have arrived, or until every stage ending before ``before`` has ended.

        Each pass moves every download or computation that ends before a lower bound of the ``need``-th arrival
        (it precedes that arrival, so it happens in this round), then ends the uploads that end before every
        download and computation still running, in time order (:meth:`_in_order`).  The bound is the ``need``-th
        smallest of the clients' earliest arrivals: a stage's end plus the rest of the turn at its shortest (no
        retransmission, no random compute time), and for a client on an old version a second turn after that.
        """
        while need > 0 or before < np.inf:
            busy = np.flatnonzero(self.stage != WAIT)
            ends, stage = self.end[busy], self.stage[busy]
            bound = before
            if need > 0:
                soonest = ends + np.where(stage == DOWN, self.least_compute[busy] + self.least_up[busy],
                                          np.where(stage == COMPUTE, self.least_up[busy], 0.0))
                stale = self.version[busy] < self.owner.version
                if stale.any():
                    soonest = np.concatenate([soonest, soonest[stale] + self.least_down[busy[stale]]
                                              + self.least_up[busy[stale]]])
                if soonest.size < need:
                    raise EngineError(f"{self.where}{need} more updates are needed but only {busy.size} clients are "
                                      "training: the buffer can never fill")
                bound = min(bound, float(np.partition(soonest, need - 1)[need - 1]))
            moving = stage != UP
            early = busy[moving & (ends < bound)]
            if early.size:
                self._move(early, rnd)
                busy = np.flatnonzero(self.stage != WAIT)
                ends, moving = self.end[busy], self.stage[busy] != UP
            low = min(bound, float(ends[moving].min())) if moving.any() else bound
            up = busy[~moving & ((ends <= low) if need > 0 else (ends < low) | (ends == low) & (low < before))]
            if up.size:
                up = up[np.argsort(self.end[up], kind="stable")]
                n = self._in_order(up)
                if need > 0:
                    n = min(n, need)
                    need -= n
                self._arrived(up[:n], rnd)
                continue
            if early.size:
                continue
            at = busy[ends == bound]
            if need > 0 and at.size:                           # a download or computation ends at the bound
                self._move(at, rnd)
                continue
            if at.size:
                raise EngineError(f"{self.where}a client's stage ends at the new version's time ({bound!r} s): "
                                  "SimPy's insertion order decides its round, which the buffered replay does not model")
            return

    def _in_order(self, up: np.ndarray) -> int:
        """How many of the uploads ``up`` (ending in this order, before any download or computation ends) end before
        any client that starts again among them could arrive again (:attr:`least_down` plus :attr:`least_up` after
        its restart)."""
        t = self.end[up]
        stale = self.version[up] < self.owner.version
        if not stale.any():
            return up.size
        again = np.where(stale, t + self.least_down[up] + self.least_up[up], np.inf)
        soonest = np.minimum.accumulate(np.r_[np.inf, again[:-1]])      # over the uploads before each
        late = np.flatnonzero(t > soonest)
        return up.size if not late.size else int(late[0])

    def take(self, K: int) -> Generator:
        """The next ``K`` arrivals ``(dev, version, update)`` in arrival order; the clock moves to the ``K``-th
        (reference: ``K`` gets from the arrivals queue)."""
        sim = self.sim
        rnd, now = sim.round, sim.env.now
        if self.changed_at is not None and now != self.changed_at:
            raise EngineError(f"{self.where}{now - self.changed_at} s passed between a new version and the next take: "
                              "the waiting clients would start late")
        self._model(self.owner.version)                        # the current model, before the server changes it
        waiting = np.flatnonzero((self.stage == WAIT) & (self.version < self.owner.version))
        if waiting.size:                                       # they waited for this version (or the first one)
            self._start(waiting, np.full(waiting.size, now), rnd)
        if len(self.queue) < K:
            self._advance(rnd, need=K - len(self.queue))
        taken, self.queue = self.queue[:K], self.queue[K:]
        if taken[-1][0] > now:
            yield event_at(sim.env, taken[-1][0])
        return [(self.nodes[p], v, G) for _, p, v, G in taken]

    def version_changed(self) -> None:
        """The server starts a new version now: every stage ending before now ends in this round (an update
        arriving meanwhile is queued for the next buffer); the waiting clients start at the next take."""
        self._advance(self.sim.round, before=self.sim.env.now)
        self.changed_at = self.sim.env.now
