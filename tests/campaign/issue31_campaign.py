"""A new campaign of bad inputs and faults for issue 31, item 8 (none of them in the suite before it).

Run from the repository root::

    FEDNET_DATA=/work/shared/data .venv/bin/python tests/campaign/issue31_campaign.py [--list] [SUBSTRING ...]

The cases are new against ``tests/campaign/issue33_campaign.py`` and the tests: study keys of the newest protocols
(``fedbuff``, ``fedbuff_lightsecagg``, ``secagg``, ``secaggplus``) and network keys (``lte_cells``, ``radio_star``,
``energy``, ``hop_latency_s``), the secret seed (``--secret-seed``, ``$FEDNET_SECRET_SEED``, a resumed checkpoint's),
saved results read back (``fednet summarize --format``, ``fednet plot --log-x``), data files, signals at every phase
(SIGINT, SIGHUP, SIGTERM in a forked child), Dask workers lost mid-sweep, tampered checkpoints and plugins that fail
(protocols and network builders, at every stage).

Every case runs in a fresh temporary folder under a 120 s alarm, mostly in this process through ``fednet.cli.main``,
and is classified by an oracle that does not trust fednet's own verdict:

``named error``
    exit status 2, one ``fednet: ...`` message naming the argument (no traceback), nothing written at ``--out``;
``recorded failure``
    exit 0 and the summary lists the (run, seed) under ``failed``;
``correct``
    exit 0 and the case's own check of the output holds (or, for a run, every credited target lies before any
    non-finite row);
``traceback``
    an exception escaped ``main`` (or an exit status other than 0 and 2, or "Traceback" on stderr);
``silently wrong``
    exit 0 where the case needs a refusal, or its check of the output fails;
``hang``
    the alarm fired (or a child process did not end);
``lost``
    a file the case planted (a user's file) changed or vanished, or fednet left debris beside ``--out``.

The table printed at the end is the one the issue's closing note asks for.  ``tests/test_adversarial_campaign.py``
runs every case as a test.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import fednet.protocols  # noqa: E402,F401
from fednet.cli import main  # noqa: E402

OUTCOMES = ["named error", "recorded failure", "correct", "traceback", "silently wrong", "hang", "lost"]
GOOD = OUTCOMES[:3]
ALARM_S = 120


_UID = ["0"]


def uid() -> str:
    """A name part unique to the running case (plugin modules: one module name per case, as a fresh process)."""
    return _UID[0]


class Hang(BaseException):
    """The case's alarm fired."""


def _alarm(signum, frame):
    raise Hang()


# -- study texts -----------------------------------------------------------------------------------
def tiny(*, top: str = "", data: str = "", network: str = "", training: str = "", protocol: str = "conventional",
         params: str = "{}", epochs: int = 3, targets: str = "[0.05, 0.3]", n_devices: int = 6,
         seeds: str = "[0]", extra_runs: str = "") -> str:
    own = 'kind = "radio_star"' in network or 'kind = "w31_' in network      # builders that draw their own losses
    return (f'name = "c"\nseeds = {seeds}\ntargets = {targets}\nepochs = {epochs}\nrun_to_end = true\n{top}\n'
            f'[data]\ndataset = "digits"\nn_components = 40\n{data}\n'
            f'[network]\nn_devices = {n_devices}\ncompute = "deterministic"\n{"" if own else "loss = 0.0"}\n'
            f'{network}\n'
            f'[training]\n{training}\n[[runs]]\nprotocol = "{protocol}"\nparams = {params}\n{extra_runs}')


@dataclass
class Case:
    """One case.

    ``text`` (a study run by ``fednet run s.toml --out o --quiet ARGS``) or ``argv`` (a function of the case's folder
    and ``--out`` giving the whole command) or ``api`` (a function of the folder returning its verdict and detail).
    ``check(work, out)`` returns None when an exit-0 output is right, else what is wrong.  ``expect``: the outcomes
    the case may end as (a refusal of a valid input counts as a failure of the case too).
    """

    name: str
    text: str | None = None
    expect: tuple[str, ...] = ("named error",)
    args: tuple[str, ...] = ()
    argv: Callable[[Path, Path], list[str]] | None = None
    plant: Callable[[Path, Path], dict[Path, bytes | None]] | None = None
    prepare: Callable[[Path, Path], None] | None = None
    patch: Callable[[Path], Callable[[], None]] | None = None
    api: Callable[[Path], tuple[str, str]] | None = None
    check: Callable[[Path, Path], str | None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    needle: str = ""                    # a named error must name this (the argument or its value)
    slow: bool = False


# -- oracles ---------------------------------------------------------------------------------------
def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def judge_output(out: Path) -> str:
    """``recorded failure``, ``correct`` or ``silently wrong`` for a study that exited 0."""
    summary = json.loads((out / "summary.json").read_text())
    failed = any(r.get("failed") for r in summary["runs"].values())
    for label, run in summary["runs"].items():
        rows = list(csv.DictReader(open(out / run["trace_csv"])))
        bad = [int(r["round"]) for r in rows if not (_finite(r["loss"]) and _finite(r["accuracy"]))]
        first_bad = min(bad) if bad else None
        if first_bad is not None and not run.get("failed"):
            return "silently wrong"
        for t in run["per_target"].values():
            for seed, rnd in t["round"].items():
                if rnd is not None and first_bad is not None and rnd >= first_bad:
                    return "silently wrong"
    return "recorded failure" if failed else "correct"


def debris(work: Path, out: Path) -> list[str]:
    """What fednet left beside ``out`` besides the checkpoint (kept on purpose for ``--resume``)."""
    return sorted(p.name for p in work.iterdir()
                  if p.name.startswith(f".{out.name}.") and not p.name.endswith(".fednet-checkpoint"))


def run_case(case: Case, root: Path) -> tuple[str, str]:
    work = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    _UID[0] = f"{os.getpid()}_{work.name.replace('-', '_')}"
    out = work / "o"
    planted: dict[Path, bytes | None] = {}
    cwd = os.getcwd()
    os.chdir(work)
    undo = None
    err, stdout = io.StringIO(), io.StringIO()
    old_env = {k: os.environ.get(k) for k in case.env}
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    try:
        os.environ.update(case.env)
        if case.prepare is not None:
            case.prepare(work, out)
        if case.plant is not None:
            planted = case.plant(work, out)
        if case.patch is not None:
            undo = case.patch(work)
        if case.api is not None:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
                verdict, detail = case.api(work)
        else:
            if case.text is not None:
                (work / "s.toml").write_text(case.text.replace("W31UID", uid()))
            argv = case.argv(work, out) if case.argv is not None else \
                ["run", str(work / "s.toml"), "--out", str(out), "--quiet", *case.args]
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
                try:
                    code = main([a.replace("W31UID", uid()) for a in argv])
                except SystemExit as exc:     # argparse's usage errors: exit 2 with "error: argument ..."
                    if exc.code != 2 or "error: " not in err.getvalue():
                        raise
                    code = 2
                    err.write("fednet: " + err.getvalue().strip().splitlines()[-1] + "\n")
            e = err.getvalue()
            if "Traceback" in e or code not in (0, 2):
                verdict, detail = "traceback", f"exit {code}: {e.strip()[-300:]}"
            elif code == 2:
                lines = [x for x in e.strip().splitlines() if x.startswith("fednet: ")]
                ok = bool(lines) and not (argv[0] == "run" and (out / "summary.json").exists() and
                                          case.prepare is None)
                detail = " | ".join(x.strip() for x in e.strip().splitlines())[:300]
                verdict = "named error" if ok else "traceback"
                if ok and case.needle and case.needle not in e:
                    verdict, detail = "silently wrong", f"the message does not name {case.needle!r}: {detail}"
            else:
                detail = "exit 0"
                if case.check is not None:
                    why = case.check(work, out)
                    verdict = "correct" if why is None else "silently wrong"
                    detail = why or "checked"
                    if why is None and argv[0] == "run":
                        verdict = judge_output(out)
                elif argv[0] == "run":
                    verdict = judge_output(out)
                else:
                    verdict = "correct"
                if verdict == "correct" and "correct" not in case.expect:
                    verdict, detail = "silently wrong", "accepted an input it should refuse: " + detail
    except Hang:
        verdict, detail = "hang", f"no answer within {ALARM_S} s"
    except BaseException as exc:  # noqa: BLE001 - a traceback is a verdict here
        verdict, detail = "traceback", "".join(traceback.format_exception_only(type(exc), exc)).strip()[-300:]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        if undo is not None:
            undo()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(cwd)
    for path, content in planted.items():
        if content is not None and (not path.exists() or path.read_bytes() != content):
            verdict, detail = "lost", f"{path.name} changed or vanished"
    left = debris(work, out)
    if left and verdict in GOOD:
        verdict, detail = "lost", f"debris left beside --out: {left}"
    shutil.rmtree(work, ignore_errors=True)
    return verdict, detail


# -- checks of an exit-0 output ------------------------------------------------------------------
def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _rows(out: Path, label: str | None = None) -> list[dict]:
    s = _summary(out)
    label = label or next(iter(s["runs"]))
    return list(csv.DictReader(open(out / s["runs"][label]["trace_csv"])))


def check_energy(work: Path, out: Path) -> str | None:
    rows = _rows(out)
    if "energy_j" not in rows[0]:
        return "network.energy was given but the trace has no energy_j column"
    return None


def check_latency_floor(floor: float) -> Callable[[Path, Path], str | None]:
    def go(work: Path, out: Path) -> str | None:
        rows = [r for r in _rows(out) if r["event"] == "round"]
        t1 = float(rows[0]["time_s"])
        if t1 < 2 * floor:
            return f"network.hop_latency_s = {floor} was given but round 1 ended at {t1:.4g} s < 2 x {floor}"
        return None
    return go


# -- 1. study keys of the newest protocols -------------------------------------------------------
def protocol_cases() -> list[Case]:
    bad = [
        ("fedbuff", "{ buffer_size = 0 }", "buffer_size"),
        ("fedbuff", "{ buffer_size = 7 }", "buffer_size"),
        ("fedbuff", "{ buffer_size = 3, concurrency = 2 }", "buffer_size"),
        ("fedbuff", "{ buffer_size = 3, concurrency = 0 }", "concurrency"),
        ("fedbuff", "{ buffer_size = 3, concurrency = 7 }", "concurrency"),
        ("fedbuff", '{ buffer_size = 3, staleness = "linear" }', "staleness"),
        ("fedbuff", "{ buffer_size = 3, server_lr = 0.0 }", "server_lr"),
        ("fedbuff", "{ buffer_size = 3, server_lr = -1.0 }", "server_lr"),
        ("fedbuff", "{ buffer_size = 3, minibatch_fraction = 1.5 }", "minibatch_fraction"),
        ("fedbuff", "{ buffer_size = 3, element_bits = 0 }", "element_bits"),
        ("fedbuff", "{ buffer_size = true }", "buffer_size"),
        ("fedbuff", "{ buffer_size = 3.0 }", "buffer_size"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, z = 3, U = 3 }", "U"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, z = 6 }", "z"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, U = 7 }", "U"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, p = 4 }", "p"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, weight_bits = 25 }", "weight_bits"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, quant_bits = 41 }", "quant_bits"),
        ("secagg", "{ p = 4 }", "p"),
        ("secagg", "{ p = 251 }", "p"),
        ("secagg", "{ t = 7 }", "t"),
        ("secagg", "{ t = 0 }", "t"),
        ("secagg", "{ quant_bits = 40 }", "quant_bits"),
        ("secagg", "{ stage_dropout = 1.0 }", "stage_dropout"),
        ("secagg", '{ mode = "fast" }', "mode"),
        ("secagg", "{ minibatch_fraction = 0.0 }", "minibatch_fraction"),
        ("secaggplus", "{ k = 0 }", "k"),
        ("secaggplus", "{ k = 9 }", "k"),
        ("secaggplus", "{ k = 2, t = 4 }", "t"),
        ("secaggplus", "{ p = 1000000 }", "p"),
    ]
    cases = [Case(f"params {p} {q}", tiny(protocol=p, params=q, epochs=2), needle=n) for p, q, n in bad]
    # a field too small for the weighted buffered sums overflows at run time: recorded with its round (no load-time
    # bound exists for fedbuff_lightsecagg's sums; lightsecagg's is data-dependent too)
    cases += [Case(f"params {p} {q}", tiny(protocol=p, params=q, epochs=2), expect=("named error", "recorded failure"))
              for p, q in [("fedbuff_lightsecagg", "{ buffer_size = 3, p = 65537 }"),
                           ("fedbuff_lightsecagg", "{ buffer_size = 3, quant_bits = 40, weight_bits = 24 }")]]
    good = [
        ("fedbuff", '{ buffer_size = 6, staleness = "none" }'),
        ("fedbuff", "{ buffer_size = 1, concurrency = 1 }"),
        ("fedbuff_lightsecagg", "{ buffer_size = 3, z = 2, U = 6, check_decoding = true }"),
        ("secagg", '{ t = 5, mode = "timing" }'),
        ("secaggplus", "{ k = 3 }"),
    ]
    cases += [Case(f"params {p} {q} (valid)", tiny(protocol=p, params=q, epochs=2), expect=("correct",))
              for p, q in good]
    # the newest protocols under network dropout and per-run network overrides
    cases += [
        Case("secagg under network.dropout = 0.6", tiny(protocol="secagg", network="dropout = 0.6", epochs=3),
             expect=("named error", "recorded failure", "correct")),
        Case("fedbuff under network.dropout = 0.9", tiny(protocol="fedbuff", params="{ buffer_size = 3 }",
                                                         network="dropout = 0.9", epochs=2),
             expect=("named error", "recorded failure", "correct")),
        Case("fedbuff_lightsecagg run network override n_devices",
             tiny(protocol="fedbuff_lightsecagg", params="{ buffer_size = 3 }").replace(
                 "params = { buffer_size = 3 }", "params = { buffer_size = 3 }\nnetwork = { n_devices = 3 }"),
             needle="n_devices"),
        Case("secaggplus sweep with a bad k", tiny(protocol="secaggplus", epochs=2).replace(
            "params = {}", "params = {}\nsweep = { k = [3, 11] }"), needle="k"),
    ]
    return cases


# -- 2. network keys: lte_cells, radio_star, energy, hop_latency_s -------------------------------
def network_cases() -> list[Case]:
    bad = [
        ('kind = "lte_cells"\nparams = { n_cells = 0 }', "n_cells"),
        ('kind = "lte_cells"\nparams = { n_cells = 7 }', "n_cells"),
        ('kind = "lte_cells"\nparams = { n_cells = 2.0 }', "n_cells"),
        ('kind = "lte_cells"\nparams = { n_cells = 2, scheduler = "fifo" }', "scheduler"),
        ('kind = "lte_cells"\nparams = { cells = 2 }', "cells"),
        ('kind = "radio_star"\nparams = { bler = 0.0 }', "bler"),
        ('kind = "radio_star"\nparams = { radius_m = 30.0 }', "radius_m"),
        ('kind = "radio_star"\nparams = { pathloss = "okumura" }', "pathloss"),
        ('kind = "radio_star"\nparams = { rate_model = "magic" }', "rate_model"),
        ('kind = "radio_star"\nparams = { uplink_hz = 0.0 }', "uplink_hz"),
        ('kind = "radio_star"\nparams = { n_cells = 9 }', "n_cells"),
        ('kind = "radio_star"\nparams = { radius = 300.0 }', "radius"),
        ('kind = "radio_star"\nparams = { shadowing_db = -3.0 }', "shadowing_db"),
        ('kind = "radio_star"\nparams = { tx_power_dbm = nan }', "tx_power_dbm"),
        ('kind = "radio_star"\nparams = { device_mac_rates = [1e6] }', "device_mac_rates"),
        ('kind = "radio_star"\nhop_latency_s = 0.5', "hop_latency_s"),
        ('kind = "radio_star"\nenergy = { tx_power_w = 0.2 }', "energy"),
        ('kind = "radio_star"\nuplink_bps = 1e3', "uplink_bps"),
        ("energy = { tx_power_w = -1.0 }", "tx_power_w"),
        ("energy = { tx_power_w = inf }", "tx_power_w"),
        ("energy = { battery_wh = 10.0 }", "battery_wh"),
        ('energy = { kappa = "1e-28" }', "kappa"),
        ("energy = 5.0", "energy"),
        ("hop_latency_s = -0.01", "hop_latency_s"),
        ("hop_latency_s = 11.0", "hop_latency_s"),
        ('hop_latency_s = "0.01"', "hop_latency_s"),
        ("hop_latency_s = nan", "hop_latency_s"),
    ]
    cases = [Case(f"network {n.splitlines()[-1]} ({n.split(chr(10))[0]})", tiny(network=n, epochs=1), needle=needle)
             for n, needle in bad]
    sets = [("network.kind=radio_star", "loss"), ("network.energy.tx_power_w=-2.0", "tx_power_w"),
            ("network.hop_latency_s=1e9", "hop_latency_s"), ("network.params.n_cells=3", "params"),
            ("runs.0.params.buffer_size=0", "buffer_size"), ('network.kind="lte_cells"', ""),
            ("runs.*.protocol=secaggplus", ""), ("network.energy=off", "energy")]
    for s, needle in sets:
        ok = needle == ""
        cases.append(Case(f"--set {s}", tiny(epochs=1), args=("--set", s), needle=needle,
                          expect=("correct",) if ok else ("named error",)))
    cases += [
        Case("network energy with lte_cells (valid)",
             tiny(network='kind = "lte_cells"\nparams = { n_cells = 2 }\nenergy = { tx_power_w = 0.2 }', epochs=2),
             expect=("correct",), check=check_energy),
        Case("network hop_latency_s = 0.25 with lte_cells (valid)",
             tiny(network='kind = "lte_cells"\nparams = { n_cells = 3 }\nhop_latency_s = 0.25', epochs=2),
             expect=("correct",), check=check_latency_floor(0.25)),
        Case("network radio_star with its own hop_latency_s and energy (valid)",
             tiny(network='kind = "radio_star"\nparams = { hop_latency_s = 0.25, energy = { tx_power_w = 0.2 } }',
                  epochs=2), expect=("correct",),
             check=lambda w, o: check_latency_floor(0.25)(w, o) or check_energy(w, o)),
        Case("run override hop_latency_s on a radio_star study",
             tiny(network='kind = "radio_star"', epochs=1).replace('params = {}', 'params = {}\nnetwork = { '
                                                                                   'hop_latency_s = 0.3 }'),
             needle="hop_latency_s"),
        Case("fedbuff on lte_cells with energy (valid)",
             tiny(protocol="fedbuff", params="{ buffer_size = 3 }",
                  network='kind = "lte_cells"\nparams = { n_cells = 2 }\nenergy = {}', epochs=2),
             expect=("correct",), check=check_energy),
    ]
    return cases


# -- 3. secret seeds ----------------------------------------------------------------------------
def _secret_json(out: Path) -> dict:
    return json.loads((out / "secret_seed.json").read_text())


def _holds(doc: Any, seed: int) -> bool:
    """Whether a JSON document holds ``seed``: as an integer value, or as a word of a string (a command line)."""
    import re

    if isinstance(doc, dict):
        return any(_holds(k, seed) or _holds(v, seed) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_holds(v, seed) for v in doc)
    if isinstance(doc, str):
        return str(seed) in re.split(r"[\s=,:]+", doc)
    return isinstance(doc, int) and not isinstance(doc, bool) and doc == seed


def secret_cases() -> list[Case]:
    text = tiny(protocol="lightsecagg", params="{ z = 1 }", epochs=1)

    def recorded(seed: int, source: str) -> Callable[[Path, Path], str | None]:
        def go(work: Path, out: Path) -> str | None:
            doc = _secret_json(out)
            if (doc["secret_seed"], doc["source"]) != (seed, source):
                return f"secret_seed.json holds {doc['secret_seed']} from {doc['source']}, not {seed} from {source}"
            if (out / "secret_seed.json").stat().st_mode & 0o077:
                return "secret_seed.json is readable by others"
            for name in ("summary.json", "provenance.json", "timing.json"):
                if _holds(json.loads((out / name).read_text()), seed):
                    return f"the secret seed appears in {name}"
            return None
        return go

    cases = [
        Case("--secret-seed -1", text, args=("--secret-seed", "-1"), needle="-1"),
        Case("--secret-seed abc", text, args=("--secret-seed", "abc"), needle="abc"),
        Case("--secret-seed 1.5", text, args=("--secret-seed", "1.5"), needle="1.5"),
        Case("--secret-seed equal to the public seed", text, args=("--secret-seed", "0"), needle="0"),
        Case("--secret-seed 2**64", text, args=("--secret-seed", str(2**64)), needle=str(2**64)),
        Case("--secret-seed with --seed equal", text, args=("--secret-seed", "5", "--seed", "5"), needle="5"),
        Case("FEDNET_SECRET_SEED=abc", text, env={"FEDNET_SECRET_SEED": "abc"}, needle="abc"),
        Case("FEDNET_SECRET_SEED=-3", text, env={"FEDNET_SECRET_SEED": "-3"}, needle="-3"),
        Case("FEDNET_SECRET_SEED=1e3", text, env={"FEDNET_SECRET_SEED": "1e3"}, needle="1e3"),
        Case("FEDNET_SECRET_SEED=2**70", text, env={"FEDNET_SECRET_SEED": str(2**70)}, needle=str(2**70)),
        Case("FEDNET_SECRET_SEED equal to the public seed", text, env={"FEDNET_SECRET_SEED": "0"},
             needle="FEDNET_SECRET_SEED"),
        Case("FEDNET_SECRET_SEED with spaces ' 77 '", text, env={"FEDNET_SECRET_SEED": " 77 "},
             expect=("named error", "correct"), check=recorded(77, "FEDNET_SECRET_SEED")),
        Case("--secret-seed wins over FEDNET_SECRET_SEED (valid)", text, args=("--secret-seed", "12345"),
             env={"FEDNET_SECRET_SEED": "999"}, expect=("correct",), check=recorded(12345, "--secret-seed")),
        Case("--secret-seed 2**63-1 (valid)", text, args=("--secret-seed", str(2**63 - 1)), expect=("correct",),
             check=recorded(2**63 - 1, "--secret-seed")),
    ]
    return cases


# -- 4. saved results read back: summarize --format, plot --log-x ----------------------------------
_SAVED: dict[str, bytes] = {}


def _saved_result(work: Path, label: str = "conventional", epochs: int = 2) -> Path:
    """A real result folder (made once per label and copied: the cases damage their copy)."""
    key = f"{label}-{epochs}"
    src = Path(tempfile.gettempdir()) / f"fednet-campaign31-saved-{os.getpid()}-{abs(hash(key))}"
    if not (src / "summary.json").exists():
        text = tiny(epochs=epochs).replace('protocol = "conventional"', f'protocol = "conventional"\nlabel = '
                                                                        f'{json.dumps(label)}')
        (work / "base.toml").write_text(text)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            assert main(["run", str(work / "base.toml"), "--out", str(src), "--quiet",
                         "--secret-seed", "99"]) == 0
    dst = work / "saved"
    shutil.copytree(src, dst)
    return dst


def saved_cases() -> list[Case]:
    def damaged(edit: Callable[[Path], None], label: str = "conventional") -> Callable[[Path, Path], None]:
        def go(work: Path, out: Path) -> None:
            edit(_saved_result(work, label))
        return go

    def js(edit: Callable[[dict], Any]) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            s = json.loads((d / "summary.json").read_text())
            r = edit(s)
            (d / "summary.json").write_text(json.dumps(s if r is None else r))
        return go

    def trace(edit: Callable[[str], str]) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            p = next(d.glob("*/trace.csv"))
            p.write_text(edit(p.read_text()))
        return go

    def first_run(s: dict) -> dict:
        return next(iter(s["runs"].values()))

    summ = lambda *a: (lambda w, o: ["summarize", str(w / "saved"), *a])  # noqa: E731
    plot = lambda *a: (lambda w, o: ["plot", str(w / "saved"), *a])  # noqa: E731
    dmg = [
        ("runs is a list", js(lambda s: s.update(runs=[1, 2]))),
        ("per_target a string", js(lambda s: first_run(s).update(per_target="x"))),
        ("targets not numbers", js(lambda s: s.update(targets=["a"]))),
        ("summary is a JSON list", js(lambda s: [1])),
        ("time_s is a string", js(lambda s: first_run(s)["per_target"]["0.3"].update(time_s={"0": "soon"}))),
    ]
    cases = []
    for name, edit in dmg:
        for fmt in ("markdown", "latex", "csv"):
            cases.append(Case(f"summarize --format {fmt} on a summary whose {name}", argv=summ("--format", fmt),
                              prepare=damaged(edit), needle="saved"))
    tdmg = [
        ("trace.csv missing", lambda d: next(d.glob("*/trace.csv")).unlink()),
        ("trace.csv empty", trace(lambda t: "")),
        ("trace.csv time_s = -1", trace(lambda t: t.replace(",0.0,", ",-1.0,", 1))),
        ("trace.csv accuracy = abc", trace(lambda t: "\n".join(
            [t.splitlines()[0]] + [",".join(f if i != 4 else "abc" for i, f in enumerate(x.split(",")))
                                   for x in t.splitlines()[1:]]) + "\n")),
        ("trace.csv without the time_s column", trace(lambda t: t.replace("time_s", "tiempo", 1))),
        ("trace_csv path escapes the folder", js(lambda s: first_run(s).update(trace_csv="../../etc/passwd"))),
    ]
    for name, edit in tdmg:
        cases.append(Case(f"plot --log-x with {name}", argv=plot("--log-x", "--output", "p.png"),
                          prepare=damaged(edit), needle="saved"))

    def plotted(name: str) -> Callable[[Path, Path], str | None]:
        def go(w: Path, o: Path) -> str | None:
            p = w / name
            if not p.is_file() or p.stat().st_size == 0:
                return f"{name} not written"
            return None
        return go

    def deep(d: Path) -> None:
        (d / "summary.json").write_text("[" * 100000 + "]" * 100000)

    def deep_marker(work: Path, out: Path) -> dict:
        out.mkdir()
        (out / ".fednet-output").write_text("[" * 100000 + "]" * 100000)
        return {out / ".fednet-output": (out / ".fednet-output").read_bytes()}

    cases += [
        Case("summarize --format csv on a summary.json nested 100000 deep", argv=summ("--format", "csv"),
             prepare=damaged(deep), needle="saved"),
        Case("plot --log-x on a summary.json nested 100000 deep", argv=plot("--log-x"), prepare=damaged(deep),
             needle="saved"),
        Case("run onto a folder whose .fednet-output marker is nested 100000 deep", tiny(epochs=1), plant=deep_marker,
             needle="o"),
    ]
    cases += [
        Case("plot --log-x on a result whose first row is at time 0 (valid)", argv=plot("--log-x", "--output",
                                                                                       str(Path("p.svg"))),
             prepare=damaged(lambda d: None), expect=("correct",), check=lambda w, o: plotted("p.svg")(w, o)),
        Case("plot --output into a missing folder", argv=plot("--output", "nowhere/p.png"),
             prepare=damaged(lambda d: None), needle="--output"),
        Case("plot --output with an unknown extension", argv=plot("--output", "p.docx"),
             prepare=damaged(lambda d: None), needle="--output"),
        Case("plot --dpi 0", argv=plot("--dpi", "0"), prepare=damaged(lambda d: None), needle="0"),
        Case("plot --dpi 100000", argv=plot("--dpi", "100000", "--output", "p.png"),
             prepare=damaged(lambda d: None), needle="--dpi"),
        Case("plot --output onto the saved summary.json", argv=lambda w, o: ["plot", str(w / "saved"), "--output",
                                                                              str(w / "saved" / "summary.json")],
             prepare=damaged(lambda d: None), needle="--output"),
        Case("summarize --format html", argv=summ("--format", "html"), prepare=damaged(lambda d: None),
             needle="html"),
        Case("summarize --format latex escapes a label with & % _ # $ (valid)", argv=summ("--format", "latex"),
             prepare=damaged(lambda d: None, label="A&B 50% x_y #1 $"), expect=("correct",),
             check=lambda w, o: _latex_check(w)),
        Case("summarize --format markdown with a | in a label (valid)", argv=summ("--format", "markdown"),
             prepare=damaged(lambda d: None, label="a|b"), expect=("correct",),
             check=lambda w, o: _markdown_check(w)),
        Case("summarize --format csv with a comma and quote in a label (valid)", argv=summ("--format", "csv"),
             prepare=damaged(lambda d: None, label='x, "y"'), expect=("correct",),
             check=lambda w, o: _csv_check(w)),
    ]
    return cases


def _capture_cmd(w: Path, argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    return buf.getvalue()


def _latex_check(w: Path) -> str | None:
    text = _capture_cmd(w, ["summarize", str(w / "saved"), "--format", "latex"])
    import re

    if re.search(r"(?<!\\)[&%#$_]", next(x for x in text.splitlines() if "A" in x and "B" in x).split(" & ")[0]):
        return f"the label's LaTeX specials are not escaped: {[x for x in text.splitlines() if 'B' in x][:1]}"
    return None


def _markdown_check(w: Path) -> str | None:
    text = _capture_cmd(w, ["summarize", str(w / "saved"), "--format", "markdown"])
    rows = [x for x in text.splitlines() if x.startswith("|")]
    widths = {x.replace("\\|", "").count("|") for x in rows}
    if len(widths) != 1:
        return f"a | in a label breaks the Markdown table: column counts {sorted(widths)}"
    return None


def _csv_check(w: Path) -> str | None:
    import pandas as pd

    text = _capture_cmd(w, ["summarize", str(w / "saved"), "--format", "csv"])
    df = pd.read_csv(io.StringIO(text))
    if 'x, "y"' not in set(df.iloc[:, 0]):
        return f"the label does not read back from the CSV: {sorted(set(df.iloc[:, 0]))}"
    return None


# -- 5. data files ------------------------------------------------------------------------------
def data_cases() -> list[Case]:
    src = Path(os.environ.get("FEDNET_DATA", "/work/shared/data"))

    def mnist_dir(edit: Callable[[Path], None]) -> Callable[[Path, Path], None]:
        def go(work: Path, out: Path) -> None:
            d = work / "data" / "mnist"
            d.mkdir(parents=True)
            for f in sorted((src / "mnist").iterdir()):
                if f.is_file():
                    shutil.copyfile(f, d / f.name)
            edit(d)
        return go

    def first(d: Path, pat: str) -> Path:
        return sorted(p for p in d.iterdir() if pat in p.name)[0]

    def truncate(pat: str, n: int) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            p = first(d, pat)
            p.write_bytes(p.read_bytes()[:n])
        return go

    def flip_magic(pat: str) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            p = first(d, pat)
            b = bytearray(p.read_bytes())
            if p.name.endswith(".gz"):
                import gzip

                raw = bytearray(gzip.decompress(bytes(b)))
                raw[2] ^= 0x55
                p.write_bytes(gzip.compress(bytes(raw)))
            else:
                b[2] ^= 0x55
                p.write_bytes(bytes(b))
        return go

    def label_out_of_range(d: Path) -> None:
        p = first(d, "train-labels")
        import gzip

        gz = p.name.endswith(".gz")
        raw = bytearray(gzip.decompress(p.read_bytes()) if gz else p.read_bytes())
        raw[8 + 5] = 200
        p.write_bytes(gzip.compress(bytes(raw)) if gz else bytes(raw))

    mnist = ('name = "m"\nseeds = [0]\ntargets = [0.5]\nepochs = 1\n[data]\ndataset = "mnist"\nn_components = 20\n'
             '[network]\nn_devices = 4\n[[runs]]\nprotocol = "conventional"\n')
    args = ("--data-dir", "data")
    cases = [
        Case("data: mnist train images truncated", mnist, args=args, prepare=mnist_dir(truncate("train-images", 5000)),
             needle="mnist"),
        Case("data: mnist train labels truncated", mnist, args=args, prepare=mnist_dir(truncate("train-labels", 100)),
             needle="mnist"),
        Case("data: mnist test images empty", mnist, args=args, prepare=mnist_dir(truncate("t10k-images", 0)),
             needle="mnist"),
        Case("data: mnist test labels magic number wrong", mnist, args=args,
             prepare=mnist_dir(flip_magic("t10k-labels")), needle="mnist"),
        Case("data: mnist label 200 in a 10-class set", mnist, args=args, prepare=mnist_dir(label_out_of_range),
             needle="label"),
        Case("data: --data-dir is a file", mnist, args=("--data-dir", "afile"),
             prepare=lambda w, o: (w / "afile").write_text("x"), needle="afile"),
        Case("data: --data-dir missing", mnist, args=("--data-dir", "nowhere"), needle="nowhere"),
        Case("data: mnist folder without its files", mnist, args=args,
             prepare=lambda w, o: (w / "data" / "mnist").mkdir(parents=True), needle="mnist"),
        Case("data: handwritten folder empty",
             'name = "h"\nseeds = [0]\ntargets = [0.5]\nepochs = 1\n[data]\nsplit = "vertical"\n'
             'dataset = "handwritten"\n[network]\nn_devices = 6\n[[runs]]\nprotocol = "fedvs_wait"\n',
             args=args, prepare=lambda w, o: (w / "data" / "handwritten").mkdir(parents=True), needle="handwritten"),
    ]
    return cases


# -- 6. signals at every phase (forked children) ---------------------------------------------------
def _fresh_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@contextlib.contextmanager
def interrupt_after_first_pair():
    """Inside the block, ``fednet run`` finishes its first (run, seed) pair and is interrupted (``KeyboardInterrupt``)
    as the second starts, leaving a checkpoint of one pair (``fednet.study.runner._run_one`` patched, then restored)."""
    import fednet.study.runner as runner

    original, calls = runner._run_one, []

    def run_one(*a, **k):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return original(*a, **k)

    runner._run_one = run_one
    try:
        yield
    finally:
        runner._run_one = original


def _signal_child(phase: str, sig: int, argv: list[str]) -> None:
    import fednet.study.checkpoint as ck_mod
    import fednet.study.config as config_mod
    import fednet.study.output as output_mod
    import fednet.study.plots as plots_mod
    import fednet.study.runner as runner_mod

    _fresh_signal_handlers()

    def killer(orig):
        def f(*a, **k):
            signal.pthread_kill(threading.main_thread().ident, sig)
            time.sleep(2)
            return orig(*a, **k)
        return f

    if phase == "load":
        config_mod.Study.model_validate = killer(config_mod.Study.model_validate)
    elif phase == "source":
        runner_mod.load_source = killer(runner_mod.load_source)
    elif phase == "build":
        runner_mod._build_protocol = killer(runner_mod._build_protocol)
    elif phase == "checkpoint":
        ck_mod.write_own = killer(ck_mod.write_own)
    elif phase == "resume":
        ck_mod.Checkpoint._load = killer(ck_mod.Checkpoint._load)
    elif phase == "secret":
        runner_mod.write_secret_seed = killer(runner_mod.write_secret_seed)
    elif phase == "provenance":
        runner_mod.provenance = killer(runner_mod.provenance)
    elif phase == "replot":
        plots_mod.plot_results = killer(plots_mod.plot_results)
    elif phase == "replot-save":
        import matplotlib.figure

        matplotlib.figure.Figure.savefig = killer(matplotlib.figure.Figure.savefig)
    elif phase == "lock":
        output_mod.StagedOutput.remove_stale = killer(output_mod.StagedOutput.remove_stale)
    elif phase == "trace":
        runner_mod.csv.DictWriter = killer(runner_mod.csv.DictWriter)
    elif phase == "summary":
        runner_mod.summarize = killer(runner_mod.summarize)
    elif phase == "commit":
        output_mod.StagedOutput.commit = killer(output_mod.StagedOutput.commit)
    sys.stderr = open(os.devnull, "w")
    sys.stdout = open(os.devnull, "w")
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001
        code = 99                       # a traceback
    os._exit(code)


def signal_case(phase: str, sig: int, *, resume: bool = False, previous: bool = False) -> Case:
    text = tiny(epochs=2, seeds="[0, 1]")

    def api(work: Path) -> tuple[str, str]:
        study, out = work / "s.toml", work / "o"
        study.write_text(text)
        kept: dict[str, bytes] = {}
        if previous or phase.startswith("replot"):
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0
            kept = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        if resume:
            with interrupt_after_first_pair(), contextlib.redirect_stderr(io.StringIO()), \
                    contextlib.redirect_stdout(io.StringIO()):
                main(["run", str(study), "--out", str(out), "--quiet"])
        argv = (["plot", str(out), "--log-x", "--output", str(work / "p.png")] if phase.startswith("replot") else
                ["run", str(study), "--out", str(out), "--quiet", *(["--resume"] if resume else [])])
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_signal_child, args=(phase, sig, argv))
        p.start()
        p.join(90)
        if p.is_alive():
            p.kill()
            p.join()
            return "hang", "the child did not end within 90 s"
        code = p.exitcode
        if code == 99:
            return "traceback", "an exception escaped main in the child"
        if code not in (128 + sig, -sig):
            return "silently wrong", f"exit status {code}, not {128 + sig}"
        left = debris(work, out)
        if left:
            return "lost", f"left beside --out: {left}"
        now = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} \
            if out.exists() else {}
        if now != kept:
            return "lost", f"the previous result changed: {sorted(set(now) ^ set(kept))[:4]}"
        if phase.startswith("replot") and (work / "p.png").exists():
            return "lost", "a half-written plot was left at --output"
        return "correct", f"exit {code}, nothing left"

    name = {signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP", signal.SIGTERM: "SIGTERM"}[sig]
    return Case(f"signal {name} during {phase}{' (--resume)' if resume else ''}"
                f"{' over a previous result' if previous else ''}", api=api, expect=("correct",))


def signal_cases() -> list[Case]:
    cases = []
    for phase in ("lock", "trace", "summary", "commit"):
        cases.append(signal_case(phase, signal.SIGINT, previous=True))
        cases.append(signal_case(phase, signal.SIGHUP, previous=True))
    for phase in ("load", "source", "build", "checkpoint", "secret", "provenance"):
        cases.append(signal_case(phase, signal.SIGTERM))
        cases.append(signal_case(phase, signal.SIGINT))
    cases.append(signal_case("resume", signal.SIGTERM, resume=True))
    cases.append(signal_case("resume", signal.SIGINT, resume=True))
    cases.append(signal_case("replot-save", signal.SIGTERM))
    cases.append(signal_case("replot-save", signal.SIGINT))
    return cases


# -- 7. Dask workers lost mid-sweep --------------------------------------------------------------
KILLER = '''
import os
from pathlib import Path

from fednet.protocols.conventional import ConventionalFL


class {cls}(ConventionalFL):
    """Conventional FL whose worker process dies in round 2 of seed 1 ({how})."""

    def round(self, epoch):
        if epoch == 2 and self.sim.seed == 1 and _in_worker():
            flag = Path({flag!r})
            if {always} or not flag.exists():
                flag.write_text("died once")
                os._exit(1)
        return (yield from super().round(epoch))


def _in_worker():
    try:
        from distributed import get_worker
        get_worker()
        return True
    except (ImportError, ValueError):
        return False
'''


def _one_failure(work: Path) -> Callable[[], None]:
    """Dask gives up on a task after its second worker dies (default: the fourth), to keep the case short."""
    import dask

    ctx = dask.config.set({"distributed.scheduler.allowed-failures": 1})
    return lambda: ctx.__exit__(None, None, None)


def dask_cases() -> list[Case]:
    def plant(always: bool) -> Callable[[Path, Path], dict]:
        def go(work: Path, out: Path) -> dict:
            (work / f"w31_killer_{int(always)}.py").write_text(
                KILLER.format(cls="Killer", how="always" if always else "once", flag=str(work / "died"),
                              always=always))
            return {}
        return go

    def same_as_serial(work: Path, out: Path) -> str | None:
        s = _summary(out)
        if any(r.get("failed") for r in s["runs"].values()):
            return "a pair is recorded failed after its worker was replaced"
        if not (work / "died").exists():
            return "the worker never died (the case did not test anything)"
        rows = _rows(out)
        if sorted({r["seed"] for r in rows}) != ["0", "1"] or len(rows) != 2 * 4:
            return f"rows lost: {len(rows)}"
        return None

    text = lambda always: tiny(epochs=3, seeds="[0, 1]", protocol=f"w31_killer_{int(always)}:Killer")  # noqa
    return [
        Case("dask: a worker dies once mid-sweep (--jobs 2)", text(False), args=("--jobs", "2"), plant=plant(False),
             expect=("correct",), check=same_as_serial, slow=True),
        Case("dask: every worker running the pair dies (--jobs 2)", text(True), args=("--jobs", "2"),
             plant=plant(True), needle="worker", slow=True, patch=_one_failure),
    ]


# -- 8. tampered checkpoints (new kinds) ---------------------------------------------------------
def _ck(out: Path) -> Path:
    return out.parent / f".{out.name}.fednet-checkpoint"


def tamper_cases() -> list[Case]:
    text = tiny(epochs=2, seeds="[0, 1]")

    def interrupted(work: Path, out: Path, *, secret: str | None = None) -> None:
        (work / "s.toml").write_text(text)
        with interrupt_after_first_pair(), contextlib.redirect_stderr(io.StringIO()), \
                contextlib.redirect_stdout(io.StringIO()):
            main(["run", str(work / "s.toml"), "--out", str(out), "--quiet",
                  *(["--secret-seed", secret] if secret else [])])

    def resign(ck: Path, path: Path, doc: dict) -> None:
        """Forge a record and sign it with the folder's own key (an attacker who can write the folder can)."""
        import fednet.study.checkpoint as ckm
        from fednet.study.config import Study

        study = Study.model_validate_json((ck / "study.json").read_text())
        c = ckm.Checkpoint(ck.parent / ck.name[1:].removesuffix(".fednet-checkpoint"), study)
        m = __import__("re").match(r"run(\d+)-seed(\d+)\.json", path.name)
        key = (ck / "key").read_bytes()
        doc["digest"] = c._digest(key, c._body(int(m[1]), int(m[2]), doc["record"]))
        path.write_text(json.dumps(doc))

    def tamper(kind: str) -> Callable[[Path, Path], None]:
        def go(work: Path, out: Path) -> None:
            interrupted(work, out, secret="4242" if kind.startswith("secret") else None)
            ck = _ck(out)
            rec = ck / "run0-seed0.json"
            doc = json.loads(rec.read_text())
            if kind == "record is a JSON list":
                rec.write_text("[1, 2, 3]")
            elif kind == "record without rows":
                doc["record"].pop("rows")
                rec.write_text(json.dumps(doc))
            elif kind == "digest not a string":
                doc["digest"] = 12345
                rec.write_text(json.dumps(doc))
            elif kind == "format of a future fednet":
                doc["format"] = "fednet-checkpoint-record/99"
                rec.write_text(json.dumps(doc))
            elif kind == "record deeply nested":
                rec.write_text("[" * 100000 + "]" * 100000)
            elif kind == "record of 100 MB":
                with open(rec, "wb") as f:
                    f.truncate(100 * 2**20)
            elif kind == "study.json a link":
                (work / "st.json").write_bytes((ck / "study.json").read_bytes())
                (ck / "study.json").unlink()
                (ck / "study.json").symlink_to(work / "st.json")
            elif kind == "key empty":
                (ck / "key").write_bytes(b"")
            elif kind == "key a folder":
                (ck / "key").unlink()
                (ck / "key").mkdir()
            elif kind == "leftover .tmp record":
                (ck / "run0-seed1.json.tmp").write_text("{half")
            elif kind == "resigned record with no rows":
                doc["record"]["rows"] = []
                resign(ck, rec, doc)
            elif kind == "secret seed of a resume differs (--secret-seed 777)":
                pass
            elif kind == "secret seed changed in a resigned record":
                doc["record"]["secret_seed"] = 1
                resign(ck, rec, doc)
        return go

    kinds = ["record is a JSON list", "record without rows", "digest not a string", "format of a future fednet",
             "record deeply nested", "record of 100 MB", "study.json a link", "key empty", "key a folder",
             "resigned record with no rows", "secret seed changed in a resigned record"]
    cases = [Case(f"tampered checkpoint: {k}", text, args=("--resume",), prepare=tamper(k)) for k in kinds]
    # an interrupted write of fednet's own leaves a .tmp record: ignored, the pair run again
    cases.append(Case("checkpoint with a leftover .tmp record --resume (valid)", text, args=("--resume",),
                      prepare=tamper("leftover .tmp record"), expect=("correct",)))
    cases.append(Case("checkpoint resumed with another --secret-seed", text, args=("--resume", "--secret-seed", "777"),
                      prepare=tamper("secret seed of a resume differs (--secret-seed 777)"), needle="secret seed"))
    cases.append(Case("checkpoint resumed with its --secret-seed (valid)", text,
                      args=("--resume", "--secret-seed", "4242"),
                      prepare=tamper("secret seed of a resume differs (--secret-seed 777)"), expect=("correct",),
                      check=lambda w, o: None if _secret_json(o)["secret_seed"] == 4242 else "wrong secret seed"))
    return cases


# -- 9. plugins that fail ------------------------------------------------------------------------
PLUGINS = '''
import math
from pydantic import model_validator
from fednet.protocols.conventional import ConventionalFL, ConventionalFLConfig


class RaisesInRound(ConventionalFL):
    """Raises in round 2."""

    def round(self, epoch):
        if epoch == 2:
            raise ZeroDivisionError("plugin bug in round 2")
        return (yield from super().round(epoch))


class RaisesInSetup(ConventionalFL):
    """Raises in its setup."""

    def setup(self):
        yield from super().setup()
        raise KeyError("setup-key")


class RaisesInInit(ConventionalFL):
    """Raises when constructed."""

    def __init__(self, *a, **k):
        raise RuntimeError("plugin constructor bug")


class RaisesInCheck(ConventionalFL):
    """Its check raises something other than ValueError."""

    @classmethod
    def check(cls, config, n_devices):
        raise RuntimeError("plugin check bug")


class BadConfig(ConventionalFLConfig):
    @model_validator(mode="after")
    def _boom(self):
        raise RuntimeError("config validator bug")


class RaisesInConfig(ConventionalFL):
    """Its Config validator raises RuntimeError."""

    Config = BadConfig


class NanModel(ConventionalFL):
    """Its model becomes NaN in round 2."""

    def round(self, epoch):
        r = yield from super().round(epoch)
        if epoch == 2:
            self.theta = self.theta * float("nan")
        return r


class YieldsGarbage(ConventionalFL):
    """Yields a number instead of an event."""

    def round(self, epoch):
        yield 42


class NegativeDelay(ConventionalFL):
    """Waits a negative time."""

    def round(self, epoch):
        yield self.env.timeout(-1.0)


class NanDelay(ConventionalFL):
    """Waits NaN seconds."""

    def round(self, epoch):
        yield self.env.timeout(float("nan"))


class EvaluateRaises(ConventionalFL):
    """Its evaluate raises."""

    def evaluate(self):
        raise ValueError("evaluate bug")


class EvaluateOutOfRange(ConventionalFL):
    """Reports an accuracy above 1."""

    def evaluate(self):
        acc, loss = super().evaluate()
        return 1.5, loss


class RaisesKeyboard(ConventionalFL):
    """Raises SystemExit in a round."""

    def round(self, epoch):
        raise SystemExit(3)
        yield


class NotAClass:
    pass


not_a_class = 42
'''

BUILDERS = '''
import math
from fednet.topologies.lte import lte_star


def nan_rate(n_devices, rng=None):
    g = lte_star(n_devices, rng=rng)
    for u, v, a in g.edges(data=True):
        a["uplink_bps"] = float("nan")
    return g


def negative_mac(n_devices, rng=None):
    g = lte_star(n_devices, rng=rng)
    for k, a in g.nodes(data=True):
        if a.get("role") == "device":
            a["mac_rate"] = -1.0
    return g


def loss_above_one(n_devices, rng=None):
    g = lte_star(n_devices, rng=rng)
    for u, v, a in g.edges(data=True):
        a["loss"] = 1.5
    return g


def fails_on_seed_1(n_devices, rng=None, seed_flag=None):
    import numpy as np
    g = lte_star(n_devices, rng=rng)
    return g


_CALLS = []


def fails_on_second_call(n_devices, rng=None):
    """Builds once (the study's load-time check), then raises (the run's own build)."""
    _CALLS.append(1)
    if len(_CALLS) > 1:
        raise OSError("the builder's site survey file is gone")
    return lte_star(n_devices, rng=rng)


def returns_none(n_devices, rng=None):
    return None


def exits(n_devices, rng=None):
    raise SystemExit(0)
'''


def plugin_cases() -> list[Case]:
    def plant(work: Path, out: Path) -> dict:
        (work / f"w31_plugins_{uid()}.py").write_text(PLUGINS)
        (work / f"w31_builders_{uid()}.py").write_text(BUILDERS)
        return {}

    rows = [
        ("RaisesInRound", ("named error", "recorded failure"), "RaisesInRound"),
        ("RaisesInSetup", ("named error", "recorded failure"), "RaisesInSetup"),
        ("RaisesInInit", ("named error",), "RaisesInInit"),
        ("RaisesInCheck", ("named error",), "RaisesInCheck"),
        ("RaisesInConfig", ("named error",), "RaisesInConfig"),
        ("NanModel", ("named error", "recorded failure"), ""),
        ("YieldsGarbage", ("named error", "recorded failure"), "YieldsGarbage"),
        ("NegativeDelay", ("named error", "recorded failure"), "NegativeDelay"),
        ("NanDelay", ("named error", "recorded failure"), "NanDelay"),
        ("EvaluateRaises", ("named error", "recorded failure"), "EvaluateRaises"),
        ("EvaluateOutOfRange", ("named error", "recorded failure"), "EvaluateOutOfRange"),
        ("RaisesKeyboard", ("named error", "recorded failure"), "RaisesKeyboard"),
        ("NotAClass", ("named error",), "NotAClass"),
        ("not_a_class", ("named error",), "not_a_class"),
        ("Missing", ("named error",), "Missing"),
    ]
    cases = [Case(f"plugin protocol {name}", tiny(protocol=f"w31_plugins_W31UID:{name}", epochs=3), plant=plant,
                  expect=expect, needle=needle) for name, expect, needle in rows]
    cases += [Case(f"plugin protocol {name} under --jobs 2", tiny(protocol=f"w31_plugins_W31UID:{name}", epochs=3,
                                                                   seeds="[0, 1]"),
                   args=("--jobs", "2"), plant=plant, expect=("named error", "recorded failure"), needle=name,
                   slow=True) for name in ("RaisesInRound",)]
    brows = [("nan_rate", "uplink_bps"), ("negative_mac", "mac_rate"), ("loss_above_one", "loss"),
             ("fails_on_second_call", "fails_on_second_call"),
             ("returns_none", "returns_none"), ("exits", "exits")]
    cases += [Case(f"plugin builder {name}", tiny(network=f'kind = "w31_builders_W31UID:{name}"', epochs=1), plant=plant,
                   needle=needle) for name, needle in brows]
    cases += [Case("fednet describe a plugin whose Config raises", argv=lambda w, o: ["describe",
                                                                                       "w31_plugins_W31UID:RaisesInConfig"],
                   plant=plant, expect=("named error", "correct")),
              Case("fednet topology on a builder returning NaN rates",
                   tiny(network='kind = "w31_builders_W31UID:nan_rate"', epochs=1),
                   argv=lambda w, o: ["topology", str(w / "s.toml")], plant=plant, needle="uplink_bps")]
    return cases


def all_cases() -> list[Case]:
    return (protocol_cases() + network_cases() + secret_cases() + saved_cases() + data_cases() + signal_cases()
            + dask_cases() + tamper_cases() + plugin_cases())


def table(counts: Counter, n: int) -> str:
    return ("| tried | " + " | ".join(OUTCOMES) + " |\n" + "|" + "---|" * (len(OUTCOMES) + 1) + "\n"
            + f"| {n} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")


def main_campaign(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="run only cases whose name holds one of these")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    cases = [c for c in all_cases() if not args.only or any(o in c.name for o in args.only)]
    if args.list:
        print("\n".join(c.name for c in cases))
        print(len(cases))
        return 0
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="fednet-campaign31-"))
    counts: Counter = Counter()
    unexpected = 0
    t0 = time.monotonic()
    for i, case in enumerate(cases):
        t = time.monotonic()
        verdict, detail = run_case(case, root)
        counts[verdict] += 1
        flag = "" if verdict in case.expect else ("  <-- unexpected" if verdict in GOOD else "  <--")
        unexpected += verdict not in case.expect
        print(f"{i + 1:3d} {verdict:16s} {time.monotonic() - t:5.1f}s {case.name[:66]:66s} {detail[:150]}{flag}",
              flush=True)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\n{len(cases)} cases in {time.monotonic() - t0:.0f} s; {unexpected} not as expected\n")
    print(table(counts, len(cases)))
    return 0 if not any(counts[o] for o in OUTCOMES[3:]) and not unexpected else 1


if __name__ == "__main__":
    sys.exit(main_campaign())
