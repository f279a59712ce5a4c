"""Table 2 of DReS-FL beside fednet's: test accuracy at the last round, mean and spread over seeds.

Usage: python studies/dresfl_table2_report.py RESULT_DIR [RESULT_DIR ...]
(directories written by ``fednet run studies/dresfl_table2.toml`` / ``dresfl_table2_fashion.toml``).
Also prints, for DReS-FL, the decodable fraction of its rounds (rows with decode_failed = false) and the
exact per-round expectation from row 0 (decodable_probability), per seed.
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


def report(directory: Path) -> None:
    """Print the Table 2 comparison (paper accuracy next to fednet's, per method) for one study folder.

    Parameters
    ----------
    directory : Path
        Output folder of a DReS-FL Table 2 study (holds ``study.json`` and the traces).
    """
    study = json.loads((directory / "study.json").read_text())
    dataset = study["data"]["dataset"]
    print(f"\n{study['name']} ({dataset}), {directory}")
    print(f"{'method':12s} {'paper %':>14s} {'fednet %':>16s} {'rounds':>7s} {'seeds':>5s}  DReS-FL decodable")
    for run in study["runs"]:
        label = run.get("label") or run["protocol"]
        rows = list(csv.DictReader(open(directory / _slug(label) / "trace.csv")))
        by_seed: dict[str, list[dict]] = {}
        for r in rows:
            by_seed.setdefault(r["seed"], []).append(r)
        accs = [100 * float(rs[-1]["accuracy"]) for rs in by_seed.values()]
        last = max(int(rs[-1]["round"]) for rs in by_seed.values())
        extra = ""
        if "decode_failed" in rows[0] and "decodable_probability" in rows[0]:
            parts = []
            for s, rs in by_seed.items():
                ok = [r["decode_failed"] == "False" for r in rs[1:]]
                parts.append(f"seed {s}: {sum(ok) / max(1, len(ok)):.3f} (expected {float(rs[0]['decodable_probability']):.3f})")
            extra = "; ".join(parts)
        p = PAPER.get(dataset, {}).get(label)
        ptxt = f"{p[0]:.2f} +- {p[1]:.2f}" if p else "-"
        spread = f" +- {stdev(accs):.2f}" if len(accs) > 1 else ""
        print(f"{label:12s} {ptxt:>14s} {mean(accs):>9.2f}{spread:7s} {last:>7d} {len(accs):>5d}  {extra}")


def _slug(label: str) -> str:
    import re
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


if __name__ == "__main__":
    for d in sys.argv[1:]:
        report(Path(d))
