"""Validation of fednet's radio layer against Chen et al.'s FL-over-wireless model (issue 28).

Usage: python studies/radio_validation_report.py [--quick] [--seed S]

The source.  M. Chen, Z. Yang, W. Saad, C. Yin, H. V. Poor, S. Cui, "A joint learning and communications framework
for federated learning over wireless networks", IEEE Trans. Wireless Commun. 20(1), 2021 (arXiv 1909.07972).  The
stored copies of the paper that the search tool reaches (pdfslide.us, arxiv-vanity) give only the beginning of each
page (title, abstract), so its Sec. II equations and Table I could not be read here.  The numbers below therefore come
from the authors' own published simulation code, linked from the paper (github.com/mzchen0/Wireless-FL, ``FLMIN.m``,
commit d7b002e), which states the model it simulates in closed form:

* users at distance ``d ~ U(0, 500)`` m from the base station (``d = rand(usernumber, 1) * 500``), channel gain
  ``h = d^-2``, no shadowing, transmit power ``P = 0.01`` W;
* packet error rate of user i on resource block n (the paper's waterfall model):
  ``q = 1 - exp(-1.08 (I_n + 1e-14) / (P h))``, i.e. waterfall threshold ``m = 1.08``, noise ``B N0 = 1e-14`` W;
* interference over the uplink RBs, six RBs: ``I = (0.05, 0.07, ..., 0.15) - 0.04`` (x 1e-6 W) =
  1e-8 .. 1.1e-7 W; downlink interference ``Id = 0.06 x 3e-6 = 1.8e-7`` W;
* uplink rate ``c^U = log2(1 + P h / I_n)`` Mbit/s (``B^U = 1`` MHz), downlink ``c^D = 20 log2(1 + h / Id)`` Mbit/s
  (``B^D = 20`` MHz, ``P_B = 1`` W);
* model size ``Z = 39760 x 16 / 1024 / 1024`` "Mbit" (39,760 parameters of 16 bits), uplink delay ``l^U = Z /
  c^U``, downlink delay ``l^D = Z / c^D``;
* energy ``e = 1e-27 x 40 x 1e18 x Z + P l^U`` (``varsigma omega theta^2 Z + P l^U``, the paper's energy model);
* the round's budgets: delay ``l^U + l^D < 0.5`` s and energy ``e < 0.003`` J (``drequirement``,
  ``erequirement``): a user outside them cannot be given that RB.

fednet side.  ``studies/radio_validation.toml``'s ``[network]`` configures :func:`fednet.topologies.radio.radio_star`
with these parameters (power-law path loss with exponent 2, 10 dBm, 30 dBm at the BS, noise -170 dBm/Hz x 1 MHz =
1e-14 W, interference, Shannon rates, the ``"waterfall"`` BLER model with ``m = 1.08``, one packet per message, no
header overhead, a lossless downlink, 0.01 W of transmit power in the energy model).  The script builds that network
through the study's own loader (:func:`fednet.study.runner.build_simulation`), sends real messages of ``Z`` bits
over it with :meth:`fednet.sim.simulation.Simulation.transfer` and reads what the simulator did: each hop's airtime
(``Message.hops``), the retransmissions its keyed loss draws decided and the device joules it charged
(``Simulation.counters``).  The paper's column is the closed form of the code above.

Differences, each explained in the table's last column: ``Z`` is sent as the code's effective 606,689 bits (its
``/1024/1024`` turns 636,160 bits into 0.6067 "Mbit" which it divides by rates in 1e6 bit/s); fednet's rate keeps
the noise ``B N0`` beside ``I`` (the code drops it from the rate: a relative difference below 1e-6); fednet
retransmits a lost packet (ARQ) where Chen et al. drop the user's model from the round, so ``q`` is measured as
the first attempt's failure frequency and the delay as one attempt's airtime (the ARQ mean ``l^U / (1 - q)`` is
reported too); fednet draws ``d`` on ``[1, 500]`` m (``h = d^-2`` is infinite at 0); the code's computation energy
(2.4e-8 J) is not charged (``kappa = 0``: fednet charges ``kappa f^2`` per metered MAC, which this check has none
of).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import integrate, optimize, special

STUDY = Path(__file__).with_name("radio_validation.toml")

# -- Chen et al.'s model, as their FLMIN.m computes it (module docstring) ------------------------------------------
P_W = 0.01                    #: user transmit power P (W)
M_WATERFALL = 1.08            #: waterfall threshold m (linear)
NOISE_W = 1e-14               #: B^U N0 (W) in the packet error rate
RB_INTERFERENCE_W = tuple(round((x - 0.04) * 1e-6, 12) for x in (0.05, 0.07, 0.09, 0.11, 0.13, 0.15))  #: I_n (W)
DOWN_INTERFERENCE_W = 0.06 * 0.000003                                                                   #: Id (W)
B_DOWN_OVER_UP = 20.0         #: B^D / B^U (20 MHz / 1 MHz)
Z_CODE = 39760 * 16 / 1024 / 1024   #: model size as the code writes it ("Mbit", divided by Mbit/s)
Z_BITS = round(Z_CODE * 1e6)        #: the bits that make the code's delays: 606,689
Z_TRUE_BITS = 39760 * 16            #: the model's real size: 636,160 bits
COMPUTE_J = 1e-27 * 40 * 1e18 * Z_CODE   #: the code's varsigma omega theta^2 Z (2.4e-8 J)
DELAY_BUDGET_S = 0.5          #: drequirement
ENERGY_BUDGET_J = 0.003       #: erequirement
RADIUS_M = 500.0


def paper_q(d: np.ndarray | float, interference_w: float) -> np.ndarray:
    """Chen et al.'s packet error rate ``1 - exp(-m (I + B N0) / (P d^-2))``."""
    return -np.expm1(-M_WATERFALL * (interference_w + NOISE_W) * np.asarray(d, float) ** 2 / P_W)


def paper_delay_up(d: np.ndarray | float, interference_w: float) -> np.ndarray:
    """``l^U = Z / log2(1 + P d^-2 / I)`` seconds (rate in Mbit/s over 1 MHz)."""
    return Z_CODE / np.log2(1.0 + P_W * np.asarray(d, float) ** -2.0 / interference_w)


def paper_delay_down(d: np.ndarray | float) -> np.ndarray:
    """``l^D = Z / (20 log2(1 + d^-2 / Id))`` seconds."""
    return Z_CODE / (B_DOWN_OVER_UP * np.log2(1.0 + np.asarray(d, float) ** -2.0 / DOWN_INTERFERENCE_W))


def paper_energy(d: np.ndarray | float, interference_w: float) -> np.ndarray:
    """``e = varsigma omega theta^2 Z + P l^U`` joules."""
    return COMPUTE_J + P_W * paper_delay_up(d, interference_w)


def paper_meets(d: np.ndarray | float, interference_w: float) -> np.ndarray:
    """Whether a user at ``d`` on an RB with interference ``I`` meets both budgets."""
    return ((paper_delay_up(d, interference_w) + paper_delay_down(d) < DELAY_BUDGET_S)
            & (paper_energy(d, interference_w) < ENERGY_BUDGET_J))


def paper_mean_q(interference_w: float, lo: float = 0.0, hi: float = RADIUS_M) -> float:
    """``E q`` for ``d ~ U(lo, hi)``: ``1 - sqrt(pi) (erf(sqrt(a) hi) - erf(sqrt(a) lo)) / (2 sqrt(a) (hi - lo))``,
    ``a = m (I + B N0) / P``."""
    ra = math.sqrt(M_WATERFALL * (interference_w + NOISE_W) / P_W)
    return 1.0 - math.sqrt(math.pi) * (special.erf(ra * hi) - special.erf(ra * lo)) / (2.0 * ra * (hi - lo))


def paper_mean_std(f, lo: float = 0.0, hi: float = RADIUS_M) -> tuple[float, float]:
    """Mean and standard deviation of ``f(d)`` for ``d ~ U(lo, hi)`` (quadrature)."""
    m1 = integrate.quad(lambda x: float(f(x)), lo, hi, limit=200)[0] / (hi - lo)
    m2 = integrate.quad(lambda x: float(f(x)) ** 2, lo, hi, limit=200)[0] / (hi - lo)
    return m1, math.sqrt(max(m2 - m1 * m1, 0.0))


def paper_meet_fraction(interference_w: float, lo: float = 0.0, hi: float = RADIUS_M) -> float:
    """The share of ``d ~ U(lo, hi)`` meeting both budgets (both constraints fail beyond one distance)."""
    def slack(d: float) -> float:
        return min(DELAY_BUDGET_S - float(paper_delay_up(d, interference_w) + paper_delay_down(d)),
                   ENERGY_BUDGET_J - float(paper_energy(d, interference_w)))
    if slack(hi) > 0:
        return 1.0
    return (optimize.brentq(slack, max(lo, 1e-3), hi, xtol=1e-9) - lo) / (hi - lo)


# -- fednet: the study's network, real messages through the simulator -----------------------------------------------
def network_spec(**params):
    """``radio_validation.toml``'s ``[network]`` with ``params`` overriding its builder params (validated again)."""
    from fednet.study.config import NetworkSpec, load_study

    net = load_study(STUDY).network
    data = net.model_dump(exclude_unset=True)
    data["params"] = {**net.params, **params}
    if "distances_m" in params:
        data["n_devices"] = len(params["distances_m"])
    if "n_devices" in params:
        data["n_devices"] = data["params"].pop("n_devices")
    if data["n_devices"] != net.n_devices:           # no computation here: the study's per-device MAC rates go
        data["params"].pop("device_mac_rates", None)
    return NetworkSpec.model_validate(data)


@dataclass
class LinkRecord:
    """What the simulator did on one device's links.

    Attributes
    ----------
    first_failed : int
        Uploads whose first attempt was lost.
    sent, lost : int
        Upload attempts and lost attempts (all uploads).
    airtime_up_s : float
        Seconds of one upload attempt (a hop's airtime over its attempts).
    mean_up_s : float
        Mean seconds of an upload, retransmissions included.
    airtime_down_s : float
        Seconds of one download.
    joules_per_attempt : float
        Device joules charged per upload attempt.
    """

    first_failed: int
    sent: int
    lost: int
    airtime_up_s: float
    mean_up_s: float
    airtime_down_s: float
    joules_per_attempt: float


def simulate(spec, seed: int, n_uploads: int, bits: int = Z_BITS) -> list[LinkRecord]:
    """Send ``n_uploads`` uploads of ``bits`` bits (round k = 0..n-1, each on its own keyed draws) and one download
    from every device of the network ``spec`` builds, one message at a time, and record what the simulator did."""
    from fednet.sim.network import Message
    from fednet.study.runner import build_simulation

    sim = build_simulation(spec, seed)
    server = sim.server.index

    n = len(sim.devices)
    first_failed, lost = [0] * n, [0] * n
    up_s, attempts_s, joules, down_s = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n

    def run():
        for k in range(n_uploads):                 # rounds in order: the keyed draws of (device, "uplink", k)
            sim.round = k
            for i, dev in enumerate(sim.devices):
                extra0, j0 = sim.counters.retransmissions, sim.counters.device_energy_j
                msg = yield from sim.transfer(Message(dev.index, server, "model", None, bits, 1, round=k))
                extra = sim.counters.retransmissions - extra0
                (_, _, start, end), = msg.hops
                first_failed[i] += extra > 0
                lost[i] += extra
                up_s[i] += end - start
                attempts_s[i] += (end - start) / (1 + extra)
                joules[i] += (sim.counters.device_energy_j - j0) / (1 + extra)
        sim.round = n_uploads
        for i, dev in enumerate(sim.devices):
            down = yield from sim.transfer(Message(server, dev.index, "model", None, bits, 1, round=n_uploads))
            (_, _, start, end), = down.hops
            down_s[i] = end - start
    sim.env.process(run())
    sim.env.run()
    return [LinkRecord(first_failed[i], n_uploads + lost[i], lost[i], attempts_s[i] / n_uploads, up_s[i] / n_uploads,
                       down_s[i], joules[i] / n_uploads) for i in range(n)]


# -- the two checks ---------------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One line of the table: quantity, paper, fednet, allowed ``|fednet - expect x paper|``, explanation."""

    what: str
    paper: float
    fednet: float
    tol: float
    why: str
    expect: float = 1.0

    @property
    def ok(self) -> bool:
        return abs(self.fednet - self.expect * self.paper) <= self.tol

    @property
    def ratio(self) -> float:
        return self.fednet / self.paper if self.paper else (1.0 if self.fednet == 0 else math.inf)


DISTANCES_M = (100.0, 200.0, 300.0, 400.0, 500.0)
#: The RBs of the per-distance check: the least and the most interfered of the six.
RBS = (0, 5)
EXACT = 1e-5    #: relative tolerance of deterministic quantities (noise in the rate, Z rounded to whole bits)


def per_distance(seed: int, n_uploads: int) -> list[Row]:
    """Per-user packet error, delays, energy and budget at fixed distances on RBs 1 and 6."""
    rows: list[Row] = []
    for rb in RBS:
        i_w = RB_INTERFERENCE_W[rb]
        spec = network_spec(distances_m=list(DISTANCES_M), interference_w=i_w)
        recs = simulate(spec, seed, n_uploads)
        for d, r in zip(DISTANCES_M, recs):
            q = float(paper_q(d, i_w))
            tag = f"RB{rb + 1} d={d:.0f}m"
            q_hat = r.lost / r.sent                                # lost / sent attempts (geometric trials)
            rows.append(Row(f"{tag} q", q, q_hat, 4 * math.sqrt(q * (1 - q) / r.sent) + 1e-12,
                            "sampling (4 sigma of lost/sent over the attempts)"))
            lu, ld = float(paper_delay_up(d, i_w)), float(paper_delay_down(d))
            rows.append(Row(f"{tag} l^U s", lu, r.airtime_up_s, EXACT * lu, "noise kept in fednet's rate (<1e-6)"))
            rows.append(Row(f"{tag} l^D s", ld, r.airtime_down_s, EXACT * ld, "noise kept in fednet's rate (<1e-6)"))
            e = float(paper_energy(d, i_w))
            rows.append(Row(f"{tag} e J", e, r.joules_per_attempt, max(EXACT * e, 1.5 * COMPUTE_J),
                            f"code's compute term {COMPUTE_J:.1e} J not charged"))
            ok_f = float((r.airtime_up_s + r.airtime_down_s < DELAY_BUDGET_S)
                         and (r.joules_per_attempt < ENERGY_BUDGET_J))
            rows.append(Row(f"{tag} meets budgets", float(paper_meets(d, i_w)), ok_f, 0.0, "same"))
            arq = lu / (1 - q)
            rows.append(Row(f"{tag} ARQ mean upload s", arq, r.mean_up_s,
                            4 * lu * math.sqrt(q) / (1 - q) / math.sqrt(n_uploads),
                            "fednet resends (ARQ); Chen drops: l^U/(1-q), 4 sigma"))
    return rows


def drawn(seed: int, n_devices: int) -> list[Row]:
    """Means over users drawn with ``d ~ U(1, 500)`` m (the code's draw; ``h`` is infinite at 0), one upload each, on
    each of the six RBs, against the closed forms over ``U(0, 500)``."""
    rows: list[Row] = []
    for rb, i_w in enumerate(RB_INTERFERENCE_W):
        spec = network_spec(interference_w=i_w, n_devices=n_devices)
        recs = simulate(spec, seed + rb, 1)
        tag = f"RB{rb + 1} (I={i_w:.2g} W) mean over {n_devices} users"
        qbar = paper_mean_q(i_w)
        q_hat = sum(r.first_failed for r in recs) / n_devices
        rows.append(Row(f"{tag}: q", qbar, q_hat, 4 * math.sqrt(qbar * (1 - qbar) / n_devices) + qbar / 500,
                        "sampling (4 sigma) + d from 1 m (<= q/500)"))
        mu, sd = paper_mean_std(lambda x: paper_delay_up(max(x, 1e-9), i_w))
        lu = sum(r.airtime_up_s for r in recs) / n_devices
        rows.append(Row(f"{tag}: l^U s", mu, lu, 4 * sd / math.sqrt(n_devices), "sampling (4 sigma)"))
        p = paper_meet_fraction(i_w)
        met = sum((r.airtime_up_s + r.airtime_down_s < DELAY_BUDGET_S) and (r.joules_per_attempt < ENERGY_BUDGET_J)
                  for r in recs) / n_devices
        rows.append(Row(f"{tag}: share meeting budgets", p, met, 4 * math.sqrt(p * (1 - p) / n_devices) + 1 / 500,
                        "sampling (4 sigma) + d from 1 m"))
    return rows


def true_size_factor(seed: int) -> Row:
    """One upload of the model's real 636,160 bits against the code's l^U: the code's MiB/Mbit factor 2^20 / 10^6."""
    spec = network_spec(distances_m=[250.0], interference_w=RB_INTERFERENCE_W[0])
    r = simulate(spec, seed, 1, bits=Z_TRUE_BITS)[0]
    lu = float(paper_delay_up(250.0, RB_INTERFERENCE_W[0]))
    return Row("RB1 d=250m l^U s, real 636,160 bits", lu, r.airtime_up_s, EXACT * lu,
               "code's Z/1024/1024 over Mbit/s: expect x 2^20/10^6 = 1.048576", expect=2**20 / 1e6)


def one_round(seed: int) -> list[Row]:
    """One round of conventional FL (the study's run) on the study's network: the trace's round time and device
    joules against Chen et al.'s per-user delays and energies at the drawn distances, for the model's real
    ``Z = 636,160`` bits (fednet's protocol sends them; hence the factor 2^20 / 10^6 on the code's ``Z``).

    The round's time is ``max_i (l^D_i + l^U_i)`` when no upload is retransmitted (the devices compute at
    1e15 MAC/s, so computation adds nanoseconds) and the joules ``sum_i P l^U_i``; with ``R`` retransmissions in the
    round the joules lie between ``sum_i P l^U_i + R min_i P l^U_i`` and ``... + R max_i P l^U_i``."""
    from fednet.study.config import load_study
    from fednet.study.runner import build_network, run_study

    study = load_study(STUDY, sets=[f"seeds=[{seed}]"])
    row = run_study(study, None, progress=False).traces[study.runs[0].label][seed][-1]
    g = build_network(study.network, seed)
    d = np.array([g.nodes[i]["distance_m"] for i in range(study.network.n_devices)])
    i_w = study.network.params["interference_w"]
    scale = Z_TRUE_BITS / Z_BITS
    lu, ld = paper_delay_up(d, i_w) * scale, paper_delay_down(d) * scale
    r = int(row["retransmissions"])
    e_lo, e_hi = P_W * lu.sum() + r * P_W * lu.min(), P_W * lu.sum() + r * P_W * lu.max()
    tag = f"one FL round, {len(d)} users (seed {seed}, {r} retransmissions)"
    rows = [Row(f"{tag}: device joules", (e_lo + e_hi) / 2, row["energy_j"], (e_hi - e_lo) / 2 + EXACT * e_hi,
                "sum P l^U (code's Z x 2^20/10^6: the real model); retransmissions widen the band")]
    if r == 0:
        t = float((lu + ld).max())
        rows.append(Row(f"{tag}: round time s", t, row["time_s"], EXACT * t + 1e-6,
                        "max_i (l^U + l^D); computation at 1e15 MAC/s adds < 1 us"))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width table."""
    head = f"{'quantity':58s} {'paper':>11s} {'fednet':>11s} {'ratio':>8s} {'ok':>3s}  explanation"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.what:58s} {r.paper:11.5g} {r.fednet:11.5g} {r.ratio:8.5f} {'yes' if r.ok else 'NO':>3s}  "
                     f"{r.why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 when a row is outside its tolerance."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer draws (the test's size)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    n_uploads, n_devices = (400, 400) if a.quick else (4000, 3000)
    rows = (per_distance(a.seed, n_uploads) + drawn(a.seed, n_devices) + [true_size_factor(a.seed)]
            + one_round(a.seed))
    print(table(rows))
    bad = [r.what for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} within tolerance" + (f"; outside: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
