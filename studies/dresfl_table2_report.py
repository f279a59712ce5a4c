"""Table 2 of DReS-FL beside fednet's: test accuracy at the last round, mean and spread over seeds.

Usage: python studies/dresfl_table2_report.py RESULT_DIR [RESULT_DIR ...] [--at ROUND]
(directories written by ``fednet run studies/dresfl_table2.toml`` / ``dresfl_table2_fashion.toml``).
Also prints, for DReS-FL, the decodable fraction of its rounds (rows with decode_failed = false) and the
exact per-round expectation from row 0 (decodable_probability), per seed.

Two spreads over seeds (issue 31, item 2): by default (``network.rates_seed`` unset) every study seed redraws the
extreme dropout rates (0.99 w.p. 0.5, else U[0, 0.1]; Shao et al., Sec. 6.1), so the std over seeds includes the
rate draw (a quarter of the draws leave DReS-FL fewer than R = 9 reliable clients).  With ``network.rates_seed = S``
(``--set network.rates_seed=S``) every seed sees seed S's rates and only the per-round presence draws and the
training differ: the reading of the paper's Table 2, whose +-0.05 spreads a redraw per run cannot give.  The report
reads the draw from each folder's ``study.json`` and prints one table per (data set, draw), headed by which draw it
is, so folders of both kinds given together report both spreads side by side.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from statistics import mean, stdev

#: Shao et al., Table 2 (mean +- std over five runs), in %.
PAPER = {
    "mnist": {"FedAvg": (96.17, 0.05), "FedAvg-IS": (97.06, 0.10), "SCAFFOLD": (71.89, 3.92),
              "DReS-FL": (97.38, 0.08), "Centralized": (97.99, 0.04)},
    "fashion-mnist": {"FedAvg": (81.20, 0.07), "FedAvg-IS": (85.94, 0.16), "SCAFFOLD": (55.22, 1.83),
                      "DReS-FL": (86.60, 0.32), "Centralized": (89.02, 0.11)},
}


#: The convergence rule (stated in studies/dresfl_table2.toml): W(t) is the mean test accuracy of the
#: evaluations in (t - WINDOW, t]; a run has converged at the first evaluated round t >= SPAN + WINDOW with
#: |W(t) - W(t - SPAN)| < TOL_PP percentage points (one learning-rate period, App. B: x0.65 every 1500 rounds).
WINDOW, SPAN, TOL_PP = 500, 1500, 0.2
#: The learning rate's decay per period (App. B), used by :func:`predicted_round`.
DECAY = 0.65


def evaluations(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Rounds and test accuracies (%) of the evaluated rows of one run and seed (round 0 included).

    Parameters
    ----------
    rows : list of dict
        One seed's trace rows (``trace.csv``), in round order.

    Returns
    -------
    rounds : list of int
    accuracy : list of float
        In percent.
    """
    out = [(int(r["round"]), 100 * float(r["accuracy"])) for r in rows
           if r.get("evaluated", "True") == "True" or r["round"] == "0"]
    return [t for t, _ in out], [a for _, a in out]


def window_mean(rounds: list[int], acc: list[float], t: int, window: int = WINDOW) -> float:
    """``W(t)``: mean accuracy of the evaluations in ``(t - window, t]`` (nan if there are none)."""
    xs = [a for r, a in zip(rounds, acc) if t - window < r <= t]
    return sum(xs) / len(xs) if xs else float("nan")


def converged_round(rounds: list[int], acc: list[float], window: int = WINDOW, span: int = SPAN,
                    tol_pp: float = TOL_PP) -> int | None:
    """First evaluated round ``t`` with ``|W(t) - W(t - span)| < tol_pp`` (the rule above), or None.

    Parameters
    ----------
    rounds, acc : list
        From :func:`evaluations` (accuracy in %).
    window, span : int
        Rounds.
    tol_pp : float
        Percentage points.
    """
    for t in rounds:
        if t >= span + window and abs(window_mean(rounds, acc, t, window) - window_mean(rounds, acc, t - span, window)) < tol_pp:
            return t
    return None


def predicted_round(gain_pp: float, end: int, span: int = SPAN, tol_pp: float = TOL_PP,
                    decay: float = None) -> int:
    """Round by which the rule would hold if each later period's gain shrank like the learning rate.

    Assumes ``W(t + span) - W(t) = gain_pp * decay^k`` for the k-th period after ``end`` (App. B: the rate is
    multiplied by ``decay = 0.65`` every 1500 rounds): the first ``end + k span`` with ``|gain| decay^k <
    tol_pp``.  An extrapolation, stated as such beside the measured curve.
    """
    decay = DECAY if decay is None else decay
    k = 0
    while abs(gain_pp) * decay ** k >= tol_pp:
        k += 1
    return end + k * span


def accuracy_at(rounds: list[int], acc: list[float], t: int) -> float:
    """Accuracy (%) of the last evaluation at or before round ``t``."""
    return [a for r, a in zip(rounds, acc) if r <= t][-1]


def rates_draw(network: dict) -> str:
    """How a run's dropout rates were drawn, from its ``[network]`` table (``study.json``, run overrides merged).

    Returns
    -------
    str
        ``"redrawn per seed"`` (``availability = "dresfl_extreme"`` without ``rates_seed``: the spread over seeds
        includes the rate draw), ``"fixed: network.rates_seed = S"`` (one draw for every seed: the spread is the
        presence draws' and training's only), either followed by ``", conditioned on >= R reliable clients"``
        when ``min_reliable`` is set, or ``"none (availability = ...)"`` without per-client rates.
    """
    if network.get("availability", "bernoulli") != "dresfl_extreme":
        return f"none (availability = {network.get('availability', 'bernoulli')!r})"
    seed = network.get("rates_seed")
    text = "redrawn per seed" if seed is None else f"fixed: network.rates_seed = {seed}"
    if network.get("min_reliable") is not None:
        text += f", conditioned on >= {network['min_reliable']} reliable clients"
    return text


def spread_note(draw: str) -> str:
    """What the std over seeds measures under the rates draw ``draw`` (:func:`rates_draw`); "" without rates."""
    if draw.startswith("redrawn"):
        return "the std over seeds includes the draw of the dropout rates (one draw per seed)"
    if draw.startswith("fixed"):
        return ("one draw of the dropout rates for every seed: the std over seeds is the per-round presence "
                "draws' and training's only (the reading of the paper's Table 2)")
    return ""


def reliable_clients(network: dict, seeds: list[str]) -> dict[str, int]:
    """Clients with a dropout rate below 0.99 at each study seed, recomputed from the network table.

    The rates are drawn as the runner draws them (:class:`fednet.sim.dropout.ExtremeDropout` of the seed,
    ``rates_seed`` and ``min_reliable``), so this needs fednet importable; {} without ``dresfl_extreme``.
    """
    if network.get("availability") != "dresfl_extreme":
        return {}
    from fednet.sim.dropout import ExtremeDropout

    return {s: ExtremeDropout(int(network.get("n_devices", 25)), int(s), rates_seed=network.get("rates_seed"),
                              min_reliable=network.get("min_reliable")).n_reliable for s in seeds}


def collect(directories: list[Path], networks: dict | None = None
            ) -> dict[tuple[str, str], dict[str, dict[str, list[dict]]]]:
    """``{(dataset, rates draw): {label: {seed: rows}}}`` over several study folders (a seed found twice: the
    longer run); the rates draw is :func:`rates_draw` of each run's network, so folders run with and without a
    fixed ``network.rates_seed`` are never pooled.  ``networks``, when given, receives each group's network
    table (the last one read)."""
    out: dict[tuple[str, str], dict[str, dict[str, list[dict]]]] = {}
    for directory in directories:
        study = json.loads((directory / "study.json").read_text())
        dataset = study["data"]["dataset"]
        for run in study["runs"]:
            label = run.get("label") or run["protocol"]
            path = directory / _slug(label) / "trace.csv"
            if not path.exists():
                continue
            network = {**study.get("network", {}), **(run.get("network") or {})}
            group = (dataset, rates_draw(network))
            if networks is not None:
                networks[group] = network
            for r in csv.DictReader(open(path)):
                seeds = out.setdefault(group, {}).setdefault(label, {})
                key = (str(directory), r["seed"])
                seeds.setdefault(key, []).append(r)
    for dataset, labels in out.items():      # one run per seed: keep the longest
        for label, runs in labels.items():
            best: dict[str, list[dict]] = {}
            for (_, seed), rows in runs.items():
                if seed not in best or len(rows) > len(best[seed]):
                    best[seed] = rows
            labels[label] = best
    return out


def report(directories: list[Path], at: int | None = None) -> None:
    """Print Table 2 (paper next to fednet: mean +- std over seeds at a common round) and the convergence rule.

    Parameters
    ----------
    directories : list of Path
        Output folders of DReS-FL Table 2 studies (``study.json`` and ``<run>/trace.csv``); seeds of one
        data set and one draw of the dropout rates (:func:`rates_draw`) are pooled over folders, one table each.
    at : int, optional
        The round at which every seed is read (default: the shortest run's last round, so that all seeds
        of all methods are read at the same round).
    """
    networks: dict = {}
    for (dataset, draw), labels in collect(directories, networks).items():
        runs = {lab: {s: evaluations(rows) for s, rows in seeds.items()} for lab, seeds in labels.items()}
        common = min(rs[-1] for seeds in runs.values() for rs, _ in seeds.values())
        t = common if at is None else at
        print(f"\n{dataset}: test accuracy % at round {t} (mean +- std over seeds; paper: 70,000 rounds)")
        note = spread_note(draw)
        print(f"dropout rates: {draw}" + (f"; {note}" if note else ""))
        seeds_seen = sorted({s for seeds in labels.values() for s in seeds}, key=int)
        reliable = reliable_clients(networks[dataset, draw], seeds_seen)
        if reliable:
            print("reliable clients (rate < 0.99) per seed: " + " ".join(f"{s}:{k}" for s, k in reliable.items()))
        print(f"{'method':12s} {'paper %':>14s} {'fednet %':>16s} {'seeds':>5s}  per seed; DReS-FL decodable fraction")
        for label, seeds in runs.items():
            ok = {s: ev for s, ev in seeds.items() if ev[0][-1] >= t}
            accs = [accuracy_at(*ev, t) for ev in ok.values()]
            if not accs:
                continue
            p = PAPER.get(dataset, {}).get(label)
            ptxt = f"{p[0]:.2f} +- {p[1]:.2f}" if p else "-"
            spread = f" +- {stdev(accs):.2f}" if len(accs) > 1 else ""
            per = " ".join(f"{s}:{a:.1f}" for s, a in zip(ok, accs))
            extra = ""
            rows0 = labels[label]
            if "decodable_probability" in next(iter(rows0.values()))[0]:
                fr = []
                for s, rs in rows0.items():
                    okr = [r["decode_failed"] == "False" for r in rs[1:t + 1]]
                    fr.append(f"{s}:{sum(okr) / max(1, len(okr)):.2f}/{float(rs[0]['decodable_probability']):.2f}")
                extra = "; decodable " + " ".join(fr)
            print(f"{label:12s} {ptxt:>14s} {mean(accs):>9.2f}{spread:7s} {len(accs):>5d}  {per}{extra}")
        print(f"convergence rule: |W(t) - W(t - {SPAN})| < {TOL_PP} pp, W = mean accuracy over the last {WINDOW} rounds")
        for label, seeds in runs.items():
            for s, (rounds, acc) in seeds.items():
                if rounds[-1] < SPAN + WINDOW:
                    continue
                c = converged_round(rounds, acc)
                end = rounds[-1]
                ws = " ".join(f"{window_mean(rounds, acc, k):.1f}" for k in range(WINDOW, end + 1, WINDOW))
                gain = window_mean(rounds, acc, end) - window_mean(rounds, acc, end - SPAN)
                print(f"  {label:12s} seed {s}: {'converged at ' + str(c) if c else 'not converged by ' + str(end)}; "
                      f"W at {WINDOW}, {2 * WINDOW}, ..., {end}: {ws}; W({end}) - W({end - SPAN}) = {gain:+.2f} pp; "
                      f"predicted (gain x {DECAY} per period): {predicted_round(gain, end)}")


def _slug(label: str) -> str:
    import re
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


if __name__ == "__main__":
    args = sys.argv[1:]
    at_round = None
    if "--at" in args:
        k = args.index("--at")
        at_round = int(args[k + 1])
        del args[k:k + 2]
    report([Path(d) for d in args], at_round)
