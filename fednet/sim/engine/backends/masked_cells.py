"""The ``masked`` backend on shared round-robin cells: LightSecAgg's round replayed over the cells' airs.

:func:`fednet.sim.engine.backends.masked.replay_round` replays the round on the star, where each user's times follow
from its own draws.  In a cell (:mod:`fednet.sim.cells`) the users' transfers share the air, so a transfer's end
depends on every other transfer of its cell: :func:`replay_round_cells` walks the round's events in time order, one
:class:`~fednet.sim.engine.backends.airtime.Air` per cell direction (``SharedAir``'s float operations).  Each user is
the reference's processes (:func:`fednet.sim.engine.reference.masked`):

* processor, first come first served: the mask encoding (at the start), the training (once the model is in), the
  aggregation of the masks (a survivor, once its survivor list and its forward are in);
* uplink, a FIFO before the air (:meth:`fednet.sim.simulation.Simulation._hop`: the link's resource, then the keyed
  draw, then ``air.transmit``): the bundle of encoded shares (after the encoding), the masked upload (after the
  training), the aggregated mask (after the aggregation);
* downlink, a FIFO before the air: the model (at the start), then the forward of the shares addressed to it (requested
  at ``Tb``, the last bundle's arrival) and, a survivor, the survivor list (requested at ``T1``, the ``U``-th masked
  arrival), in the order requested -- the first granted takes the first ``downlink:mask`` draw; a survivor
  aggregates once its list and the shares of U1 addressed to it are in: its forward's, or, where U1 is itself
  alone (``U = 1``), its own share, in since its encoding (so ``T2`` may then come before ``Tb``, and bundles and
  encodings still running are cut too);

and the round ends at ``T2``, the last aggregated mask's arrival: the reference cancels the rest, so a transfer still
on the air leaves it then and every air is idle again (nothing after ``T2`` is replayed; the real airs are never
touched but for their ``transfers`` count).  Every time is computed with the keyed draws looked at, not taken, and no
effect is made before the round is known to be the reference's: where SimPy's order of events at one instant would
decide, the replay returns the reason and the processes run.  Those instants are

* a transfer asking for a cell's air at the instant the air's timeout fires, or two events at one instant (not one
  event and what it causes at once: a fire's ended transfers and their links' next transfers, the forwards at ``Tb``,
  the survivor lists at ``T1``) putting transfers on one air (their order is SimPy's insertion order);
* two masked uploads among the first ``U + 1`` arriving at one instant from different events (which is the ``U``-th,
  and the order of the survivors' uploads, would be SimPy's);
* ``Tb == T1`` (the forwards and the survivor lists requested at one instant);
* any event at ``T2`` but the arrival of aggregated masks (what the cancellation cuts would be SimPy's order).

With continuous compute times (a shifted exponential) these have probability zero; with deterministic compute and
identical users they are common, and the reference runs.  ``tests/test_masked_cells.py`` runs rounds both ways.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from fednet.sim.compute import compute_seconds
from fednet.sim.network import transmission_times

from .. import wire
from ..mailbox import Mailbox
from ..results import payload_size
from .airtime import Air
from .masked import _Draws, _metered, _seconds, _user_steps

__all__ = ["replay_round_cells"]

# a user's transfers (codes in a tag ``8 * user + code``) and computations
_DM, _UB, _UM, _FW, _LI, _UA = range(6)          # model down, bundle up, masked up, forward down, list down, agg up
_UP = (False, True, True, False, False, True)     # on the uplink (else the downlink)
_ENC, _TRAIN, _AGG = range(3)
_FIRE, _CPU, _END = range(3)                      # events: an air's timeout, a computation's end, a dedicated link's


class _Undecided(Exception):
    """SimPy's insertion order would decide the round (the message says where): the replay declines."""


def replay_round_cells(net: Any, step: Any) -> tuple[list[int], list, list, float] | str:
    """Replay a ``masked`` step over every user on a network of round-robin cells (module docstring), or the reason
    it cannot (nothing changed: no draw taken, nothing counted, no time passed).

    Parameters
    ----------
    net : Net
    step : Step
        The step (:meth:`fednet.protocol.primitives.Net.masked_sum`); ``nodes`` must be every user, in index order,
        and every cell air they share idle and round robin (:meth:`~fednet.sim.engine.backends.masked.MaskedReplay.
        can_run`).

    Returns
    -------
    U1 : list of int
        The survivors (the first U masked uploads), ascending.
    online : list of (Node, Any)
        The survivors' masked uploads, in order of arrival.
    replies : list of (Node, Any)
        Their aggregated encoded masks, in index order.
    t_end : float
        Simulated seconds at which the last aggregated mask arrives; the caller resumes there.
    """
    try:
        return _replay(net, step)
    except _Undecided as why:
        return str(why)


def _replay(net: Any, step: Any) -> tuple[list[int], list, list, float] | str:
    """:func:`replay_round_cells`; raises :class:`_Undecided` where SimPy's order would decide."""
    sim, nodes, L, U = net.sim, step.nodes, step.piece_length, step.first
    N = len(nodes)
    bits = wire.declared(step.element_bits, kind=step.kinds[1], where=f"{net.label}: ").bits    # the field's numbers
    bits_m = wire.width(step.download, step.download_bits, "model", arg="download_bits", where=f"{net.label}: ")
    t0 = float(sim.env.now)
    idx = np.arange(N, dtype=np.intp)
    rate_d, loss_d, rate_u, loss_u, mac_rate, frac = sim.node_table(nodes)[:, 1:].T   # frac -1: deterministic
    draws = _Draws(sim, idx)
    over, packet = sim.overhead, sim.packet_bits

    def link(n_bits: int, rate: np.ndarray, loss: np.ndarray, u: np.ndarray) -> tuple[list, list]:
        """Airtime (seconds) and retransmissions of one message of ``n_bits`` per user (keyed uniforms ``u``)."""
        s, x = transmission_times(np.int64(n_bits), rate, over, loss, packet, u, arrays=True)
        return s.tolist(), x.tolist()

    # -- what each user's steps charge (timing mode: no values computed but the stand-ins) -------------------
    charged = _user_steps(step, nodes)
    if isinstance(charged, str):
        return charged
    encoded, enc_macs, trained, train_macs = charged
    theta32 = step.download
    # -- every airtime and compute time, the keyed draws looked at -------------------------------------------
    n_model, n_bundle, n_up, n_list = payload_size(theta32), L * (N - 1), int(step.upload_elements), U
    air_s: list[list] = [None] * 6               # per transfer code: seconds per user
    air_x: list[list] = [None] * 6               # and retransmissions
    air_s[_DM], air_x[_DM] = link(n_model * bits_m, rate_d, loss_d, draws.u("downlink"))
    air_s[_UB], air_x[_UB] = link(n_bundle * bits, rate_u, loss_u, draws.u("uplink:mask"))
    air_s[_UM], air_x[_UM] = link(n_up * bits, rate_u, loss_u, draws.u("uplink"))
    air_s[_UA], air_x[_UA] = link(L * bits, rate_u, loss_u, draws.u("uplink:mask", ahead=1))
    u_m = (draws.u("downlink:mask"), draws.u("downlink:mask", ahead=1))    # the first and second granted
    fw = [link(n_bundle * bits, rate_d, loss_d, u) for u in u_m]
    li = [link(n_list * bits, rate_d, loss_d, u) for u in u_m]
    s_enc, d_enc = _seconds(np.array(enc_macs), mac_rate, frac, draws.u("compute-mask"))
    s_tr, d_tr = _seconds(np.array(train_macs), mac_rate, frac, draws.u("compute"))
    cpu_s: list[list] = [s_enc.tolist(), s_tr.tolist(), [0.0] * N]

    # -- the cells: one replayed air per real air, a user's links' airs by index (None: a dedicated link) ------
    airs: list[Air] = []
    reals: list[Any] = []
    key_of: dict[int, int] = {}

    def air_index(real: Any) -> int | None:
        """The replayed :class:`Air` index of a link's real cell air (one per real air), None on a dedicated link."""
        if real is None:
            return None
        k = key_of.get(id(real))
        if k is None:
            k = key_of[id(real)] = len(airs)
            airs.append(Air())
            reals.append(real)
        return k
    up_air = [air_index(dev.uplink.air) for dev in nodes]
    down_air = [air_index(dev.downlink.air) for dev in nodes]
    touch_t = [math.nan] * len(airs)             # per air: the instant and the event (cause) that last touched it
    touch_c = [0] * len(airs)
    asked = [0] * len(airs)                      # transfers that asked for each air

    # -- per user: its resources and what has happened ---------------------------------------------------------
    heap: list[tuple] = []
    seq = [0]

    def push(t: float, kind: int, a: int, b: int) -> None:
        """Queue an event at ``t`` seconds (ties in time broken by the order of queueing)."""
        seq[0] += 1
        heapq.heappush(heap, (t, seq[0], kind, a, b))

    up_busy, down_busy, cpu_busy = [False] * N, [False] * N, [False] * N
    up_q: list[list] = [[] for _ in range(N)]
    down_q: list[list] = [[] for _ in range(N)]
    cpu_q: list[list] = [[] for _ in range(N)]
    granted = [[False] * N for _ in range(6)]    # per transfer code: granted (its draw taken), ended
    ended = [[False] * N for _ in range(6)]
    started = [[False] * N for _ in range(3)]    # per computation: started (charged, its draw taken), ended
    done = [[False] * N for _ in range(3)]
    n_dmask = [0] * N                            # downlink:mask draws taken (forward and list, in grant order)
    pick = [[0] * N, [0] * N]                    # which of the two downlink:mask draws the forward / list took
    survivor = [False] * N
    arrivals: list[tuple[float, int, int]] = []  # masked uploads: (time, cause, user) in order of arrival
    state = {"bundles": 0, "Tb": math.nan, "T1": math.nan, "T2": math.nan, "aggs": 0, "U1": None,
             "agg": None, "agg_macs": None, "d_ag": None}

    def arrive(i: int, code: int, t: float, cause: int) -> None:
        """Transfer ``code`` of user ``i`` is granted its link at ``t``: its draw is taken, it asks for the air."""
        granted[code][i] = True
        if code == _FW or code == _LI:
            k = n_dmask[i]
            n_dmask[i] = k + 1
            pick[code - _FW][i] = k
            w = (fw if code == _FW else li)[k][0][i]
        else:
            w = air_s[code][i]
        a = up_air[i] if _UP[code] else down_air[i]
        if a is None:                            # a dedicated link: a timeout of w
            push(t + w, _END, 8 * i + code, 0)
            return
        if w == 0.0:                             # SharedAir.transmit returns at once
            finish(i, code, t, cause)
            return
        air = airs[a]
        if air.fire == t:
            raise _Undecided("a transfer asks for its cell's air at the instant the air's timeout fires (SimPy's "
                             "order decides)")
        if touch_t[a] == t and touch_c[a] != cause:
            raise _Undecided("two events at one instant put transfers on one cell's air (SimPy's order decides)")
        touch_t[a], touch_c[a] = t, cause
        asked[a] += 1
        air.arrive(t, w, 8 * i + code)
        push(air.fire, _FIRE, a, air.gen)

    def request(i: int, code: int, t: float, cause: int) -> None:
        """User ``i`` asks for its link for transfer ``code`` at ``t`` (the link's FIFO)."""
        if _UP[code]:
            busy, q = up_busy, up_q
        else:
            busy, q = down_busy, down_q
        if busy[i]:
            q[i].append(code)
        else:
            busy[i] = True
            arrive(i, code, t, cause)

    def compute(i: int, what: int, t: float, cause: int) -> None:
        """User ``i`` asks for its processor for computation ``what`` at ``t``."""
        if cpu_busy[i]:
            cpu_q[i].append(what)
            return
        cpu_busy[i] = True
        started[what][i] = True
        s = cpu_s[what][i]
        if s > 0:
            push(t + s, _CPU, i, what)
        else:
            computed(i, what, t, cause)

    def computed(i: int, what: int, t: float, cause: int) -> None:
        """User ``i``'s computation ``what`` ends at ``t``: the processor's next, then what follows it."""
        cpu_busy[i] = False
        done[what][i] = True
        if cpu_q[i]:
            compute(i, cpu_q[i].pop(0), t, cause)
        request(i, _UB if what == _ENC else _UM if what == _TRAIN else _UA, t, cause)

    def finish(i: int, code: int, t: float, cause: int) -> None:
        """Transfer ``code`` of user ``i`` ends at ``t``: its link's next transfer, then what follows it."""
        ended[code][i] = True
        busy, q = (up_busy, up_q) if _UP[code] else (down_busy, down_q)
        if q[i]:
            arrive(i, q[i].pop(0), t, cause)
        else:
            busy[i] = False
        if code == _DM:
            compute(i, _TRAIN, t, cause)
        elif code == _UB:
            state["bundles"] += 1
            if state["bundles"] == N:            # the server forwards every user's shares, in index order
                state["Tb"] = t
                for j in range(N):
                    request(j, _FW, t, cause)
        elif code == _UM:
            arrivals.append((t, cause, i))
            if len(arrivals) == U:               # the server stops waiting: the survivors' lists go out
                state["T1"] = t
                survivors(t, cause)
        elif code == _FW:                        # the shares of U1 addressed to i are in (its own since encoding)
            if survivor[i] and ended[_LI][i] and len(state["U1"]) > 1:
                compute(i, _AGG, t, cause)
        elif code == _LI:                        # U1 = {i}: its own share is all it waits for
            if ended[_FW][i] or len(state["U1"]) == 1:
                compute(i, _AGG, t, cause)
        else:
            state["aggs"] += 1
            if state["aggs"] == len(state["U1"]):
                state["T2"] = t

    def survivors(t: float, cause: int) -> None:
        """At ``T1 = t``: U1, the survivors' aggregations (charged and timed), their list downloads in order."""
        U1 = sorted(i for _, _, i in arrivals)
        state["U1"] = U1
        for i in U1:
            survivor[i] = True
        U1_at = np.asarray(U1, dtype=np.int64)
        box = Mailbox(sim.env)                   # timing mode charges the closed form: reads no share
        agg, agg_macs = zip(*(_metered(step.aggregate, nodes[i], U1_at, box) for i in U1))
        if len(U1) > 1 and min(agg_macs) == 0:
            raise _Undecided("a survivor's aggregation charged 0 MACs (the processes raise UnchargedCompute)")
        at = np.asarray(U1, dtype=np.intp)
        s_ag, d_ag = compute_seconds(np.array(agg_macs, dtype=float), mac_rate[at], frac[at],
                                     lambda m: draws.u("compute-mask", at[m], ahead=1))
        for i, s in zip(U1, s_ag.tolist()):
            cpu_s[_AGG][i] = s
        state.update(agg=agg, agg_macs=agg_macs, d_ag=d_ag)
        for i in U1:
            request(i, _LI, t, cause)

    # -- the round: the model downloads and the encodings start now, in order --------------------------------
    for i in range(N):
        request(i, _DM, t0, 0)
    for i in range(N):
        compute(i, _ENC, t0, 0)
    t_other = -math.inf                          # the last instant of an event that is not an aggregated mask's end
    while heap:
        t, cause, kind, a, b = heapq.heappop(heap)
        if kind == _FIRE:
            air = airs[a]
            if b != air.gen:
                continue                         # rescheduled since (the reference's timeout would be stale)
            if touch_t[a] == t:
                raise _Undecided("a cell's air fires at the instant another event puts a transfer on it (SimPy's "
                                 "order decides)")
            touch_t[a], touch_c[a] = t, cause
            out = air.fire_now()
            if air.fire == t:
                raise _Undecided("a cell's air fires twice at one instant (SimPy's order decides)")
            if air.fire < math.inf:
                push(air.fire, _FIRE, a, air.gen)
            for tag in out:
                if tag & 7 != _UA:
                    t_other = t
                finish(tag >> 3, tag & 7, t, cause)
        elif kind == _CPU:
            t_other = t
            computed(a, b, t, cause)
        else:
            if a & 7 != _UA:
                t_other = t
            finish(a >> 3, a & 7, t, cause)
        if state["T2"] == t:
            break
    T2, T1, Tb = state["T2"], state["T1"], state["Tb"]
    if not T2 == T2:                             # NaN: the loop ran dry (it cannot; be safe)
        return "the cells replay of the masked round found no end (the processes run)"
    # -- the instants where SimPy's order would decide ----------------------------------------------------------
    if Tb == T1:
        return "the forwards and the survivor lists are requested at one instant (SimPy's order decides)"
    k = 0
    while k < U:                                 # each instant at which one of the first U masked uploads arrives
        at, causes = arrivals[k][0], set()
        while k < len(arrivals) and arrivals[k][0] == at:
            causes.add(arrivals[k][1])
            k += 1
        if len(causes) > 1:
            return ("masked uploads that arrive at one instant from different events include one of the first U "
                    "(which are the survivors, and their order, is SimPy's order)")
    while heap and heap[0][2] == _FIRE and heap[0][4] != airs[heap[0][3]].gen:
        heapq.heappop(heap)                      # stale timeouts
    if t_other == T2 or (heap and heap[0][0] == T2):
        return "another event at the last aggregated mask's arrival (SimPy's order decides)"
    # -- from here on, the round happens --------------------------------------------------------------------
    U1 = state["U1"]
    surv = np.zeros(N, dtype=bool)
    surv[U1] = True
    draws.take("downlink", np.ones(N, dtype=bool))
    draws.take("compute-mask", d_enc)
    draws.take("uplink:mask", np.array(granted[_UB]))
    trained_ok = np.array(started[_TRAIN])
    draws.take("compute", trained_ok & d_tr)
    draws.take("uplink", np.array(granted[_UM]))
    n_mask_down = np.array(n_dmask)
    sim.streams.advance(idx[n_mask_down > 0], "downlink:mask", sim.round, n_mask_down[n_mask_down > 0])
    agg_draw = np.zeros(N, dtype=bool)
    agg_draw[surv] = state["d_ag"]
    draws.take("compute-mask", agg_draw)
    draws.take("uplink:mask", surv)
    counters = sim.counters
    counters.device_macs += (int(sum(enc_macs)) + int(sum(m for m, s in zip(train_macs, started[_TRAIN]) if s))
                             + int(sum(state["agg_macs"])))
    landed, bundled, arrived, fwd_in, list_in = (ended[_DM], ended[_UB], ended[_UM], ended[_FW], ended[_LI])
    n_landed, n_bundled, n_arrived, n_fwd = sum(landed), sum(bundled), sum(arrived), sum(fwd_in)
    counters.bits_down += n_model * bits_m * n_landed + n_bundle * bits * n_fwd + n_list * bits * len(U1)
    counters.bits_up += n_bundle * bits * n_bundled + n_up * bits * n_arrived + L * bits * len(U1)
    counters.messages += n_landed + n_bundled + n_arrived + n_fwd + 2 * len(U1)
    x_fw = [fw[k][1][i] for i, k in enumerate(pick[0])]
    x_li = [li[k][1][i] for i, k in enumerate(pick[1])]
    counters.retransmissions += int(sum(x for xs, flags in ((air_x[_DM], landed), (air_x[_UB], bundled),
                                                            (air_x[_UM], arrived), (x_fw, fwd_in), (x_li, list_in))
                                        for x, e in zip(xs, flags) if e)
                                    + sum(air_x[_UA][i] for i in U1))
    for real, n in zip(reals, asked):
        real.transfers += n
    for dev, enc, coded, got in zip(nodes, encoded, done[_ENC], landed):
        if coded:                                # an encoding cut at T2 sets nothing
            dev.state.encoded = enc
        if got:
            dev.state.received = theta32
    online = [(nodes[i], trained[i]) for _, _, i in arrivals[:U]]
    return U1, online, [(nodes[i], r) for i, r in zip(U1, state["agg"])], float(T2)
