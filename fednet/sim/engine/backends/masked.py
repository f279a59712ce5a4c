"""The ``masked`` backend: a masked secure sum (LightSecAgg's round) without a SimPy process per user.

The reference (:func:`fednet.sim.engine.reference.masked`, the step of
:meth:`fednet.protocol.primitives.Net.masked_sum`) runs, per user, a background mask phase (encoding on the processor,
one bundled upload, the server's forward once every bundle is in) beside the online phase (model download, training on
the same processor after the encoding, masked upload on the same uplink after the bundle), then a second gather over the
survivors U1 (survivor list download on the downlink the forward uses, the aggregation once the masks are in, its
upload), and cancels whatever is still running.  At D = 1000 that is ~34 SimPy events a user-round and most of the host
time of a Fig. 8 LightSecAgg run.

Every resource here is one user's processor, uplink or downlink, served first come first served, so each user's times
follow from its own keyed draws and three instants shared by all: ``T1``, the U-th masked upload's arrival (the server
stops waiting), ``T_b``, the last bundle's arrival (the forwards start), and ``T2``, the last aggregated mask's arrival
(the round ends and the rest is cancelled).  :func:`replay_round` computes them as vectors, with the floats SimPy's
timeouts give (``now + seconds``), and commits what the processes would have done by ``T2``: a transfer is counted, a
computation charged and a keyed draw consumed iff its event comes before ``T2`` (an interrupted transfer is not counted;
a computation is charged when it starts).  Where SimPy's order of events at one instant would decide (the U-th and the
next arrival at one time, the forwards starting at ``T1``, another user's event at ``T2``) or the round is not the plain
one (values that need their inputs -- full mode --, a user absent, views recorded, an engine method overridden, another
process running), it declines before any simulated effect (no draw taken, nothing counted, no time passed; only the
users' timing-mode mask stand-ins are set, as the processes set them again), and the processes run.  The step's
``precomputed`` says whether its values may be computed before their inputs arrive (timing mode's stand-ins: LightSecAgg
passes ``type(self.mode) is Timing``).

On shared round-robin cells (:mod:`fednet.sim.cells`) the users' transfers share their cells' airs, so the times
are not each user's own: :func:`fednet.sim.engine.backends.masked_cells.replay_round_cells` replays the same round as
an event loop over the airs (with the same principle: every time computed with the draws looked at, a decline
wherever SimPy's order would decide, then the effects); a proportional-fair or busy cell is declined
(:func:`~fednet.sim.engine.backends.airtime.cells_air_reason`).

``tests/test_lightsecagg_replay.py`` (star) and ``tests/test_masked_cells.py`` (cells) run rounds both ways: traces
and draw counters are equal.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from fednet.algebra.meter import MacMeter
from fednet.sim.compute import compute_seconds
from fednet.sim.network import transmission_times

from ..events import draws_plain, event_at, fast_reason
from ..mailbox import Mailbox
from ..results import payload_size
from .. import wire
from ..step import Backend, Declined, Step
from .airtime import airs_reason

__all__ = ["MaskedReplay", "replay_round"]


class MaskedReplay(Backend):
    """A masked secure sum's round without a process per user (module docstring)."""

    name = "masked"
    kind = "masked"

    def can_run(self, net: Any, step: Step) -> bool | str:
        """``True`` if this backend gives the reference\'s results for ``step`` now, else the reason."""
        sim, nodes = net.sim, step.nodes
        if not step.precomputed:
            return "the values need their inputs (full mode): computed as the processes reach them"
        if not (step.parallel and step.relay == "bundled"):
            return "the masks are not relayed bundled, in parallel with training"
        if not sim.engine.allows("bundled"):
            return "the bundled backend is not allowed (the replay stands for a bundled exchange)"
        if sim.record_views:
            return "views are recorded (Simulation(record_views=True)); the replay does not file messages in views"
        if sim.d2d:
            return "the network has direct device-to-device links"
        if len(nodes) != sim.n_devices or len(nodes) < 2 or any(n.index != p for p, n in enumerate(nodes)):
            return "not every user takes part (a user is absent)"
        if not draws_plain(sim.streams):
            return "the keyed draws are overridden"
        ok = fast_reason(net, nodes, cells=True)        # engine, queue, idle processors and links
        if ok is not True:
            return ok
        if sim.cells:                                   # replayed by masked_cells: idle round-robin airs only
            ok = airs_reason(air for pair in sim.cells.values() for air in pair)     # every user's: every cell's
            if ok is not True:
                return ok
        if sim.node_table(nodes) is None:
            return "a compute model other than shifted-exponential or deterministic"
        return True

    def run(self, net: Any, step: Step) -> Generator:
        """Execute ``step`` (module docstring); a :class:`~fednet.sim.engine.step.Declined` if it cannot."""
        if net.sim.cells:
            from .masked_cells import replay_round_cells     # here: that module imports this one's helpers
            got = replay_round_cells(net, step)
        else:
            got = replay_round(net, step)
        if isinstance(got, str):
            return Declined(got)
        U1, online, replies, t_end = got
        yield event_at(net.sim.env, t_end)
        return U1, online, replies


def _metered(fn: Any, *args: Any) -> tuple[Any, int]:
    """``fn(*args)`` and the MACs it metered (as :meth:`fednet.sim.simulation.Simulation.compute_now` meters)."""
    meter = MacMeter()
    with meter:
        value = fn(*args)
    return value, meter.macs


class _Draws:
    """The keyed draws of one round, looked at before it is known which are taken (:meth:`Streams.uniforms`)."""

    def __init__(self, sim: Any, idx: np.ndarray) -> None:
        self.sim, self.idx, self.rnd = sim, idx, sim.round

    def u(self, purpose: str, at: np.ndarray | None = None, ahead: int = 0) -> np.ndarray:
        """The ``ahead + 1``-th next uniform of ``(user, purpose, round)`` of every user (or of users ``at``)."""
        nodes = self.idx if at is None else self.idx[at]
        return self.sim.streams.uniforms(nodes, purpose, self.rnd, advance=False, ahead=ahead)

    def take(self, purpose: str, taken: np.ndarray) -> None:
        """Consume one draw of ``purpose`` for each user where ``taken`` (bool, per user)."""
        self.sim.streams.advance(self.idx[taken], purpose, self.rnd)


def _user_steps(step: Step, nodes: list) -> tuple[tuple, tuple, tuple, tuple] | str:
    """Every user's prepared encoding and local step, run metered (timing mode computes only their stand-ins):
    ``(encoded, encoding MACs, trained, training MACs)``, one entry per user, or the reason a replay cannot stand for
    the processes (a step that charged 0 MACs: they raise UnchargedCompute).  Shared by the star and cell replays."""
    for dev in nodes:
        step.prepare(dev)
    encoded, enc_macs = zip(*(_metered(step.encode, dev) for dev in nodes))
    trained, train_macs = zip(*(_metered(step.local, dev) for dev in nodes))
    if min(enc_macs) == 0 or min(train_macs) == 0:
        return "a user's encoding or local step charged 0 MACs (the processes raise UnchargedCompute)"
    return encoded, enc_macs, trained, train_macs


def _seconds(work: Any, rate: np.ndarray, frac: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~fednet.sim.compute.compute_seconds` with every node's next uniform ``u`` already looked at."""
    return compute_seconds(np.asarray(work, dtype=float), rate, frac, lambda at: u[at])


def _after(t: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """When a step that starts at ``t`` and lasts ``seconds`` ends (a process yields a timeout only for > 0)."""
    return np.where(seconds > 0, t + seconds, t)


def replay_round(net: Any, step: Step) -> tuple[list[int], list, list, float] | str:
    """Replay a ``masked`` step over ``step.nodes`` (module docstring), or the reason it cannot (nothing changed).

    Parameters
    ----------
    net : Net
    step : Step
        The step (:meth:`fednet.protocol.primitives.Net.masked_sum`); ``nodes`` must be every user, in index order.

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
    sim, nodes, L, U = net.sim, step.nodes, step.piece_length, step.first
    N = len(nodes)
    bits = wire.declared(step.element_bits, kind=step.kinds[1], where=f"{net.label}: ").bits    # the field's numbers
    bits_m = wire.width(step.download, step.download_bits, "model", arg="download_bits", where=f"{net.label}: ")
    t0 = float(sim.env.now)
    idx = np.arange(N, dtype=np.intp)
    rate_d, loss_d, rate_u, loss_u, mac_rate, frac = sim.node_table(nodes)[:, 1:].T   # frac -1: deterministic
    draws = _Draws(sim, idx)
    over, packet = sim.overhead, sim.packet_bits

    def link(n_bits: int, rate: np.ndarray, loss: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seconds on the link and retransmissions of one message of ``n_bits`` per node (keyed uniforms ``u``)."""
        return transmission_times(np.int64(n_bits), rate, over, loss, packet, u, arrays=True)

    # -- what each user's steps charge (timing mode: no values computed but the stand-ins) -------------------
    charged = _user_steps(step, nodes)
    if isinstance(charged, str):
        return charged
    encoded, enc_macs, trained, train_macs = charged
    theta32 = step.download
    # -- the online phase and the mask phase up to the forwards -----------------------------------------------
    n_model = payload_size(theta32)
    s_dm, x_dm = link(n_model * bits_m, rate_d, loss_d, draws.u("downlink"))
    t1 = t0 + s_dm                                       # model downloaded
    s_enc, d_enc = _seconds(np.array(enc_macs), mac_rate, frac, draws.u("compute-mask"))
    te = _after(np.full(N, t0), s_enc)                   # encoding (granted at t0: the processor's first request)
    n_bundle = L * (N - 1)
    s_ub, x_ub = link(n_bundle * bits, rate_u, loss_u, draws.u("uplink:mask"))
    tb = te + s_ub                                       # bundle uploaded (the uplink's first request)
    g = np.maximum(t1, te)                               # training granted: the processor after the encoding
    s_tr, d_tr = _seconds(np.array(train_macs), mac_rate, frac, draws.u("compute"))
    t2 = _after(g, s_tr)
    su = np.maximum(t2, tb)                              # masked upload: the uplink after the bundle
    n_up = int(step.upload_elements)
    s_um, x_um = link(n_up * bits, rate_u, loss_u, draws.u("uplink"))
    t3 = su + s_um
    order = np.argsort(t3, kind="stable")
    t3s = t3[order]
    T1 = t3s[U - 1]
    if U < N and t3s[U] == T1:
        return "the U-th and the next masked upload arrive at one instant (SimPy's insertion order decides)"
    surv = np.zeros(N, dtype=bool)
    surv[order[:U]] = True
    U1 = np.flatnonzero(surv)
    Tb = tb.max()
    if Tb == T1:
        return "the forwards and the survivor lists are requested at one instant (SimPy's order decides)"
    # -- forwards (every user) and survivor lists (U1) on the downlinks, first come first served -------------
    n_list = U
    fs = np.maximum(Tb, t1)                              # forward requested at T_b, after the model download
    ls = np.full(N, np.nan)
    u_m0, u_m1 = draws.u("downlink:mask"), draws.u("downlink:mask", ahead=1)   # first and second on the key
    if Tb < T1:                                          # forward first; a survivor's list queued behind it
        s_f, x_f = link(n_bundle * bits, rate_d, loss_d, u_m0)
        fe = fs + s_f
        s_l, x_l = link(n_list * bits, rate_d, loss_d, u_m1)
        ls[surv] = np.maximum(T1, fe[surv])
    else:                                                # a survivor's list first (at T1), its forward behind it
        s_l, x_l = link(n_list * bits, rate_d, loss_d, u_m0)
        ls[surv] = T1
        fs = np.where(surv, np.maximum(Tb, ls + s_l), fs)
        s_f0, x_f0 = link(n_bundle * bits, rate_d, loss_d, u_m0)
        s_f1, x_f1 = link(n_bundle * bits, rate_d, loss_d, u_m1)
        s_f, x_f = np.where(surv, s_f1, s_f0), np.where(surv, x_f1, x_f0)
        fe = fs + s_f
    le = ls + s_l
    # -- aggregation of the masks (U1) and its upload --------------------------------------------------------
    U1_at = np.asarray(U1, dtype=np.int64)
    box = Mailbox(sim.env)                               # timing mode charges the closed form: reads no share
    replies, agg_macs = zip(*(_metered(step.aggregate, nodes[i], U1_at, box) for i in U1.tolist()))
    if len(U1) > 1 and min(agg_macs) == 0:
        return "a survivor's aggregation charged 0 MACs (the processes raise UnchargedCompute)"
    # after the list, once the masks of U1 are in: the forward's, or, U1 = {i} (U = 1), i's own, in since encoding
    ca = le[surv] if len(U1) == 1 else np.maximum(le[surv], fe[surv])
    s_ag, d_ag = _seconds(np.array(agg_macs), mac_rate[surv], frac[surv], draws.u("compute-mask", surv, ahead=1))
    ae = _after(ca, s_ag)
    s_ua, x_ua = link(L * bits, rate_u[surv], loss_u[surv], draws.u("uplink:mask", surv, ahead=1))
    a = ae + s_ua
    T2 = a.max()
    # -- what happened before T2 (the round process cancels the rest at T2) ----------------------------------
    others = ~surv
    late = others if len(U1) > 1 else np.ones(N, dtype=bool)     # U = 1: the survivor's forward may end at T2 too
    if (any((x[others] == T2).any() for x in (t1, g, su, t3)) or any((x[late] == T2).any() for x in (fs, fe))
            or not (tb < T2).all()):
        return "another event at the last aggregated mask's arrival (SimPy's order decides)"
    # -- from here on, the round happens --------------------------------------------------------------------
    counters = sim.counters
    draws.take("downlink", np.ones(N, dtype=bool))
    draws.take("compute-mask", d_enc)
    draws.take("uplink:mask", np.ones(N, dtype=bool))
    started = g < T2
    draws.take("compute", started & d_tr)
    draws.take("uplink", su < T2)
    fwd_started = fs < T2
    n_mask_down = fwd_started.astype(int) + surv                   # forwards and lists granted before T2
    sim.streams.advance(idx[n_mask_down > 0], "downlink:mask", sim.round, n_mask_down[n_mask_down > 0])
    agg_draw = np.zeros(N, dtype=bool)
    agg_draw[surv] = d_ag
    draws.take("compute-mask", agg_draw)
    draws.take("uplink:mask", surv)
    counters.device_macs += (int(sum(enc_macs)) + int(sum(m for m, s in zip(train_macs, started.tolist()) if s))
                             + int(sum(agg_macs)))
    landed, arrived, fwd_in = t1 < T2, t3 < T2, fe < T2
    counters.bits_down += (n_model * bits_m * int(landed.sum()) + n_bundle * bits * int(fwd_in.sum())
                           + n_list * bits * len(U1))
    counters.bits_up += n_bundle * bits * N + n_up * bits * int(arrived.sum()) + L * bits * len(U1)
    counters.messages += int(landed.sum()) + N + int(arrived.sum()) + int(fwd_in.sum()) + 2 * len(U1)
    counters.retransmissions += int(x_dm[landed].sum() + x_ub.sum() + x_um[arrived].sum() + x_f[fwd_in].sum()
                                    + x_l[surv].sum() + x_ua.sum())
    for dev, enc, got in zip(nodes, encoded, landed.tolist()):
        dev.state.encoded = enc
        if got:
            dev.state.received = theta32
    online = [(nodes[p], trained[p]) for p in order[:U].tolist()]
    return U1.tolist(), online, [(nodes[i], r) for i, r in zip(U1.tolist(), replies)], float(T2)
