"""A campaign of bad inputs and faults for issue 33 (not part of the fast suite; about 3-6 min on 2 cores).

Run from the repository root::

    FEDNET_DATA=/work/shared/data .venv/bin/python tests/campaign/issue33_campaign.py [--list] [SUBSTRING ...]

Every case runs in this process through ``fednet.cli.main`` (or the Python API), under a 120 s alarm,
in a fresh temporary folder, and is classified by an oracle that does not trust fednet's own verdict:

``named error``
    exit status 2, one ``fednet: ...`` message, no traceback, nothing written at ``--out``;
``recorded failure``
    exit 0 and the summary lists the (run, seed) under ``failed`` with a round and a reason;
``correct``
    exit 0, and every credited target lies before any non-finite row, or the case's own check holds;
``traceback``
    an exception escaped ``main`` (or exit status other than 0 and 2, or "Traceback" on stderr);
``silently wrong``
    exit 0 where the case needs a refusal or a recorded failure, or a target credited at or after a
    row with a non-finite loss or accuracy;
``hang``
    the alarm fired;
``lost``
    a file planted by the case (a user's file) changed or vanished, or a pickle ran code.

The table printed at the end is the one the issue's closing note asks for.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import io
import json
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

import fednet.protocols  # noqa: E402,F401
from fednet.cli import main  # noqa: E402

OUTCOMES = ["named error", "recorded failure", "correct", "traceback", "silently wrong", "hang", "lost"]


class Hang(BaseException):
    """The case's alarm fired."""


def _alarm(signum, frame):
    raise Hang()


def tiny(*, top: str = "", data: str = "", network: str = "", training: str = "", protocol: str = "conventional",
         params: str = "{}", epochs: int = 4, targets: str = "[0.05, 0.3]", n_devices: int = 6) -> str:
    return (f'name = "c"\nseeds = [0]\ntargets = {targets}\nepochs = {epochs}\nrun_to_end = true\n{top}\n'
            f'[data]\ndataset = "digits"\nn_components = 40\n{data}\n'
            f'[network]\nn_devices = {n_devices}\ncompute = "deterministic"\nloss = 0.0\n{network}\n'
            f'[training]\n{training}\n[[runs]]\nprotocol = "{protocol}"\nparams = {params}\n')


def vertical(protocol: str, params: str = "{}", *, top: str = "", epochs: int = 3) -> str:
    return (f'name = "v"\nseeds = [0]\ntargets = [0.05, 0.3]\nepochs = {epochs}\nrun_to_end = true\n{top}\n'
            f'[data]\nsplit = "vertical"\ndataset = "mnist"\nmax_train = 600\nmax_test = 200\n'
            f'[network]\nn_devices = 4\ncompute = "deterministic"\nloss = 0.0\n'
            f'[[runs]]\nprotocol = "{protocol}"\nparams = {params}\n')


@dataclass
class Case:
    """One campaign case: a study text (or a Python callable), what it may end as, planted files."""

    name: str
    text: str | None = None
    expect: tuple[str, ...] = ("named error",)
    args: tuple[str, ...] = ()
    plant: Callable[[Path, Path], dict[Path, bytes | None]] | None = None
    api: Callable[[Path], str] | None = None
    patch: Callable[[], Callable[[], None]] | None = None
    prepare: Callable[[Path, Path], None] | None = None


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
            return "silently wrong"                   # a non-finite row nobody recorded as a failure
        for t in run["per_target"].values():
            for seed, rnd in t["round"].items():
                if rnd is not None and first_bad is not None and rnd >= first_bad:
                    return "silently wrong"           # credited at or after the divergence
    return "recorded failure" if failed else "correct"


def run_case(case: Case, root: Path) -> tuple[str, str]:
    work = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    out = work / "o"
    planted: dict[Path, bytes | None] = {}
    cwd = os.getcwd()
    os.chdir(work)
    undo = None
    err, stdout = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        if case.prepare is not None:
            case.prepare(work, out)
        if case.plant is not None:
            planted = case.plant(work, out)
        if case.patch is not None:
            undo = case.patch()
        if case.api is not None:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
                verdict = case.api(work)
            detail = verdict
        else:
            (work / "s.toml").write_text(case.text or "")
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
                code = main(["run", str(work / "s.toml"), "--out", str(out), "--quiet", *case.args])
            e = err.getvalue()
            if "Traceback" in e or code not in (0, 2):
                verdict, detail = "traceback", f"exit {code}: {e.strip()[-300:]}"
            elif code == 2:
                ok = "fednet: " in e and not (out / "summary.json").exists()
                verdict, detail = ("named error" if ok else "traceback"), e.strip().splitlines()[-1][:200]
            else:
                verdict = judge_output(out)
                detail = "exit 0"
                if verdict == "correct" and "correct" not in case.expect:
                    verdict = "silently wrong"
    except Hang:
        verdict, detail = "hang", "no answer within 120 s"
    except BaseException as exc:  # noqa: BLE001 - a traceback is a verdict here
        verdict, detail = "traceback", "".join(traceback.format_exception_only(type(exc), exc)).strip()[-300:]
    finally:
        signal.alarm(0)
        if undo is not None:
            undo()
        os.chdir(cwd)
    for path, content in planted.items():
        now = path.read_bytes() if path.exists() and not path.is_symlink() or (path.is_symlink() and content is None) \
            else None
        if content is not None and (not path.exists() or path.read_bytes() != content):
            verdict, detail = "lost", f"{path.name} changed or vanished"
    if (work / "PWNED").exists():
        verdict, detail = "lost", "a planted pickle ran code"
    shutil.rmtree(work, ignore_errors=True)
    return verdict, detail


# -- the cases -------------------------------------------------------------------------------------
def divergence_cases() -> list[Case]:
    out = []
    lr_runs = [
        ("conventional", "{}", "learning_rate = 1e6"),
        ("conventional", "{}", "learning_rate = 3e4"),
        ("codedpaddedfl", "{ alpha = 2 }", "learning_rate = 1e6"),
        ("cfl", "{ redundancy = 0.2 }", "learning_rate = 1e6"),
        ("lightsecagg", "{ z = 1 }", "learning_rate = 1e5"),
        ("approx_gc", "{ k = 5, d = 2 }", "learning_rate = 1e6"),
    ]
    for proto, params, training in lr_runs:
        for strict in (False, True):
            out.append(Case(f"diverge {proto} {training} strict={strict}",
                            tiny(protocol=proto, params=params, training=training, epochs=12,
                                 top="strict = true" if strict else "",
                                 n_devices=10 if proto == "approx_gc" else 6),
                            expect=("named error", "recorded failure", "correct")))
    neural = [
        ("fedavg", '{ hidden = [8], activation = "tanh", learning_rate = 1e6 }'),
        ("fedavg", '{ hidden = [8], activation = "sigmoid", learning_rate = 1e8, loss = "mse" }'),
        ("fedavg_is", '{ hidden = [8], learning_rate = 1e6, importance = "normalized" }'),
        ("scaffold", '{ hidden = [8], activation = "tanh", learning_rate = 1e6 }'),
        ("scaffold", '{ hidden = [8], learning_rate = 1e9, loss = "mse" }'),
        ("centralized", '{ hidden = [8], activation = "tanh", learning_rate = 1e7 }'),
        ("fedavg", '{ hidden = [8], activation = "quadratic", learning_rate = 10.0, eval_every = 100 }'),
        ("fedavg_lightsecagg", '{ hidden = [8], activation = "quadratic", learning_rate = 10.0, U = 4 }'),
    ]
    for proto, params in neural:
        for strict in (False, True):
            top = "strict = true" if strict else ""
            if proto == "fedavg_is":
                top += '\n[network.availability]\n' if False else ""
            out.append(Case(f"diverge {proto} {params[:40]} strict={strict}",
                            tiny(protocol=proto, params=params, epochs=10, top=top),
                            expect=("named error", "recorded failure", "correct")))
    for proto, params in [("fedvs_wait", "{ lr_client = 1e6, lr_server = 1e6 }"),
                          ("fedvs_ignore", "{ lr_client = 1e6, lr_server = 1e6 }"),
                          ("fedvs_vafl", "{ lr_client = 1e6, lr_server = 1e6 }"),
                          ("fedvs_wait_dp", "{ epsilon = 1e-12 }"),
                          ("fedvs_wait_dp", "{ epsilon = 1e-300, dp_clip = 1e300 }"),
                          ("fedvs", '{ lr_client = 1e6, lr_server = 1e6, mode = "timing" }')]:
        for strict in (False, True):
            out.append(Case(f"diverge {proto} {params[:40]} strict={strict}",
                            vertical(proto, params, top="strict = true" if strict else ""),
                            expect=("named error", "recorded failure", "correct")))
    return out


def misfit_cases() -> list[Case]:
    d = "hidden = [4], batch_size = 8"
    rows = [
        ("dresfl", f"{{ p = 65537, {d} }}"), ("dresfl", f"{{ p = 1000000, {d} }}"),
        ("dresfl", f"{{ p = 4294967291, {d} }}"), ("dresfl", f'{{ p = "2^4000-1", {d} }}'),
        ("dresfl", f'{{ p = "2^127-1", {d}, weight_bits = 20 }}'),
        ("dresfl", f"{{ weight_bits = -3, {d} }}"), ("dresfl", f"{{ weight_bits = 0, {d} }}"),
        ("dresfl", f"{{ data_bits = -2, {d} }}"), ("dresfl", f"{{ data_bits = -6, {d} }}"),
        ("dresfl", "{ hidden = [4], batch_size = 100000 }"), ("dresfl", "{ hidden = [4], batch_size = 1348 }"),
        ("dresfl", f"{{ {d}, element_bits = 8 }}"), ("dresfl", f"{{ {d}, element_bits = 199 }}"),
        ("dresfl", f"{{ {d}, weight_bits = 60 }}"), ("dresfl", f"{{ {d}, data_shift = 1e12 }}"),
        ("dresfl", f"{{ {d}, K = 7 }}"), ("dresfl", f"{{ {d}, init_scale = 1e-9 }}"),
        ("codedsecagg", "{ z = 1, groups = 2, element_bits = 4 }"),
        ("codedsecagg", "{ z = 1, groups = 2, share_element_bits = 16 }"),
        ("codedpaddedfl", "{ alpha = 2, element_bits = 1 }"),
        ("codedpaddedfl", "{ alpha = 2, share_element_bits = 20 }"),
        ("codedpaddedfl", "{ alpha = 2, f = 0 }"), ("codedsecagg", "{ z = 1, groups = 2, f = -1 }"),
        ("lightsecagg", "{ z = 1, quant_bits = -1 }"),
    ]
    valid = {f'{{ p = "2^127-1", {d}, weight_bits = 20 }}', f"{{ {d}, init_scale = 1e-9 }}"}
    out = [Case(f"misfit {p} {q}", tiny(protocol=p, params=q, epochs=2),
                expect=("named error", "recorded failure", "correct") if q in valid else ("named error",))
           for p, q in rows]
    vrows = [
        ("fedvs", "{ p = 1000001 }"), ("fedvs", "{ p = 7 }"), ("fedvs", "{ p = 65537 }"),
        ("fedvs", "{ p = 618970019642690137449562111 }"), ("fedvs", "{ p = 4 }"),
        ("fedvs", "{ l_w = 0 }"), ("fedvs", "{ l_x = 0, l_w = 1 }"), ("fedvs", "{ batch_size = 100000 }"),
        ("fedvs", "{ batch_size = 601 }"), ("fedvs_wait", "{ batch_size = 700 }"),
        ("fedvs_ignore", '{ dataset = "fashion-mnist" }'), ("fedvs_vafl", '{ dataset = "mnist", max_train = 50 }'),
        ("fedvs", "{ K = 9 }"),
    ]
    out += [Case(f"misfit {p} {q}", vertical(p, q)) for p, q in vrows]
    return out


def _plant_file(path: Path, content: bytes) -> dict[Path, bytes | None]:
    path.write_bytes(content)
    return {path: content}


def _lock(out: Path) -> Path:
    return out.parent / f".{out.name}.fednet-lock"


def _ck(out: Path) -> Path:
    return out.parent / f".{out.name}.fednet-checkpoint"


def plant_cases() -> list[Case]:
    from fednet.study.output import MARKER

    def lock_link(work, out):
        victim = work / "victim.txt"
        planted = _plant_file(victim, b"user data\n")
        _lock(out).symlink_to(victim)
        return planted

    def lock_dangling(work, out):
        _lock(out).symlink_to(work / "created-by-fednet")
        return {work / "created-by-fednet": None}

    def lock_hard(work, out):
        victim = work / "victim.txt"
        planted = _plant_file(victim, b"4242\n")
        os.link(victim, _lock(out))
        return planted

    def lock_user(work, out):
        return _plant_file(_lock(out), b"my notes\n")

    def lock_dir(work, out):
        _lock(out).mkdir()
        return _plant_file(_lock(out) / "inside.txt", b"x")

    def marker_link(work, out):
        real = work / "marker.json"
        real.write_text(json.dumps({"fednet": "output", "files": ["mine.txt"]}))
        out.mkdir()
        planted = _plant_file(out / "mine.txt", b"user data")
        (out / MARKER).symlink_to(real)
        return planted

    def out_link(work, out):
        target = work / "target"
        target.mkdir()
        planted = _plant_file(target / "mine.txt", b"user data")
        out.symlink_to(target)
        return planted

    def ck_link(work, out):
        target = work / "elsewhere"
        target.mkdir(mode=0o700)
        (target / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n")
        return _plant_file(target / "study.json", b"{}")

    def ck_link2(work, out):
        planted = ck_link(work, out)
        _ck(out).symlink_to(work / "elsewhere")
        return planted

    def ck_foreign(work, out):
        _ck(out).mkdir(mode=0o700)
        (_ck(out) / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n")
        return _plant_file(_ck(out) / "thesis.tex", b"user data")

    def ck_open(work, out):
        _ck(out).mkdir(mode=0o700)
        os.chmod(_ck(out), 0o777)
        (_ck(out) / MARKER).write_text(json.dumps({"fednet": "checkpoint"}) + "\n")
        return _plant_file(_ck(out) / "study.json", b"{}")

    def ck_file(work, out):
        return _plant_file(_ck(out), b"a file where the checkpoint goes")

    def staging_user(work, out):
        folder = out.parent / f".{out.name}.partial-999999-abcd"
        folder.mkdir()
        return _plant_file(folder / "mine.txt", b"user data")

    def staging_link(work, out):
        target = work / "target"
        target.mkdir()
        planted = _plant_file(target / "mine.txt", b"user data")
        (out.parent / f".{out.name}.partial-999999-abcd").symlink_to(target)
        return planted

    text = tiny(epochs=2)
    cases = [Case("plant lock symlink to a user file", text, plant=lock_link),
             Case("plant lock dangling symlink", text, plant=lock_dangling),
             Case("plant lock hard link", text, plant=lock_hard),
             Case("plant lock user file", text, plant=lock_user),
             Case("plant lock folder", text, plant=lock_dir),
             Case("plant out marker symlink", text, plant=marker_link),
             Case("plant out symlink", text, plant=out_link),
             Case("plant checkpoint symlink", text, plant=ck_link2),
             Case("plant checkpoint symlink --resume", text, plant=ck_link2, args=("--resume",)),
             Case("plant checkpoint with foreign file", text, plant=ck_foreign),
             Case("plant checkpoint open to others --resume", text, plant=ck_open, args=("--resume",)),
             Case("plant checkpoint as a file", text, plant=ck_file),
             Case("plant staging-named user folder", text, plant=staging_user, expect=("correct",)),
             Case("plant staging-named symlink", text, plant=staging_link, expect=("correct",))]
    return cases


class _Boom:
    def __reduce__(self):
        return (open, ("PWNED", "w"))


def tamper_cases() -> list[Case]:
    """Checkpoints of an interrupted two-pair study, tampered, then ``--resume``."""
    text = tiny(epochs=2).replace("seeds = [0]", "seeds = [0, 1]")

    def interrupted(work: Path, out: Path) -> None:
        import fednet.study.runner as runner

        original = runner._run_one
        calls = []

        def run_one(*a, **k):
            if len(calls) == 1:
                raise KeyboardInterrupt
            calls.append(1)
            return original(*a, **k)

        runner._run_one = run_one
        try:
            (work / "s.toml").write_text(text)
            with contextlib.redirect_stderr(io.StringIO()):
                main(["run", str(work / "s.toml"), "--out", str(out), "--quiet"])
        finally:
            runner._run_one = original

    def tamper(kind: str) -> Callable[[Path, Path], None]:
        def go(work: Path, out: Path) -> None:
            interrupted(work, out)
            ck = _ck(out)
            rec = ck / "run0-seed0.json"
            if kind == "pickle":
                (ck / "run0-seed1.pkl").write_bytes(pickle.dumps(_Boom()))
            elif kind == "forged accuracy":
                doc = json.loads(rec.read_text())
                doc["record"]["rows"][-1]["accuracy"] = 0.999
                rec.write_text(json.dumps(doc))
            elif kind == "forged digest":
                doc = json.loads(rec.read_text())
                doc["record"]["wall_s"] = 1.0
                doc["digest"] = "0" * 64
                rec.write_text(json.dumps(doc))
            elif kind == "swapped seed":
                rec.rename(ck / "run0-seed1.json")
            elif kind == "truncated":
                rec.write_bytes(rec.read_bytes()[:50])
            elif kind == "empty":
                rec.write_bytes(b"")
            elif kind == "binary":
                rec.write_bytes(os.urandom(300))
            elif kind == "symlink":
                (work / "r.json").write_bytes(rec.read_bytes())
                rec.unlink()
                rec.symlink_to(work / "r.json")
            elif kind == "key removed":
                (ck / "key").unlink()
            elif kind == "key replaced":
                (ck / "key").write_bytes(os.urandom(32))
            elif kind == "study changed":
                (ck / "study.json").write_text((ck / "study.json").read_text().replace('"c"', '"d"'))
            elif kind == "extra pair":
                (ck / "run5-seed0.json").write_bytes(rec.read_bytes())
            elif kind == "object dtype":
                doc = json.loads(rec.read_text())
                doc["record"]["rows"][0]["round"] = {"$np": "|O", "b64": ""}
                rec.write_text(json.dumps(doc))
            elif kind == "marker removed":
                (ck / ".fednet-output").unlink()
        return go

    kinds = ["pickle", "forged accuracy", "forged digest", "swapped seed", "truncated", "empty", "binary", "symlink",
             "key removed", "key replaced", "study changed", "extra pair", "object dtype", "marker removed"]
    cases = [Case(f"tampered checkpoint: {k}", text, args=("--resume",), prepare=tamper(k)) for k in kinds]
    cases.append(Case("untampered checkpoint --resume", text, args=("--resume",), prepare=tamper("none"),
                      expect=("correct",)))
    return cases


def env_cases() -> list[Case]:
    import fednet.study.output as output_mod
    import fednet.study.parallel as parallel
    import fednet.study.runner as runner
    from fednet.protocol import registry

    def setattr_undo(obj, name, value):
        def apply():
            old = getattr(obj, name)
            setattr(obj, name, value)
            return lambda: setattr(obj, name, old)
        return apply

    def oserror(code):
        def fail(*a, **k):
            raise OSError(code, os.strerror(code), "summary.json")
        return fail

    def commit_fail(code):
        def fail(self):
            raise OSError(code, os.strerror(code), str(self.out))
        return fail

    text = tiny(epochs=1)
    cases = [
        Case("scheduler with nothing listening", text, args=("--scheduler", "tcp://127.0.0.1:9"),
             patch=setattr_undo(parallel, "SCHEDULER_TIMEOUT_S", 2.0)),
        Case("scheduler address malformed", text, args=("--scheduler", "nonsense://"),
             patch=setattr_undo(parallel, "SCHEDULER_TIMEOUT_S", 2.0)),
        Case("disk full writing results", text, patch=setattr_undo(runner, "write_results", oserror(errno.ENOSPC))),
        Case("read-only writing results", text, patch=setattr_undo(runner, "write_results", oserror(errno.EROFS))),
        Case("quota writing results", text, patch=setattr_undo(runner, "write_results", oserror(errno.EDQUOT))),
        Case("read-only at the rename", text, patch=setattr_undo(output_mod.StagedOutput, "commit",
                                                                  commit_fail(errno.EROFS))),
        Case("permission at the rename", text, patch=setattr_undo(output_mod.StagedOutput, "commit",
                                                                   commit_fail(errno.EACCES))),
    ]

    def ck_full():
        import fednet.study.checkpoint as ck
        return setattr_undo(ck, "write_own", oserror(errno.ENOSPC))()

    cases.append(Case("disk full writing the checkpoint", text, patch=ck_full, expect=("correct",)))

    for code in ("0", "1", "'bye'"):
        def plug(work, out, code=code):
            (work / f"exit_plugin_{abs(hash(code))}.py").write_text(f"import sys\nsys.exit({code})\n")
            return {}
        cases.append(Case(f"plugin calls sys.exit({code}) at import",
                          text.replace('"conventional"', f'"exit_plugin_{abs(hash(code))}:P"'), plant=plug))

    def plug_raise(work, out):
        (work / "raising_plugin.py").write_text("raise RuntimeError('plugin bug')\n")
        return {}

    def plug_notproto(work, out):
        (work / "notproto_plugin.py").write_text("class P:\n    pass\n")
        return {}

    cases += [Case("plugin raises at import", text.replace('"conventional"', '"raising_plugin:P"'), plant=plug_raise),
              Case("plugin object not a Protocol", text.replace('"conventional"', '"notproto_plugin:P"'),
                   plant=plug_notproto)]

    class BrokenEP:
        name, value, dist = "broken_plugin", "broken_pkg.mod:P", None

        def load(self):
            raise RuntimeError("the plugin's own bug")

    class ExitEP(BrokenEP):
        name = "exit_plugin"

        def load(self):
            raise SystemExit(0)

    def with_eps(*eps):
        def apply():
            old = registry.entry_points
            base = dict(old())
            registry.entry_points = lambda: {**base, **{e.name: [e] for e in eps}}
            return lambda: setattr(registry, "entry_points", old)
        return apply

    def list_api(work: Path) -> str:
        code = main(["list"])
        return "correct" if code == 0 else "traceback"

    cases += [Case("fednet list with a broken entry point", api=list_api, patch=with_eps(BrokenEP()),
                   expect=("correct",)),
              Case("fednet list with an entry point that exits", api=list_api, patch=with_eps(ExitEP()),
                   expect=("correct",)),
              Case("run a broken entry point", text.replace('"conventional"', '"broken_plugin"'),
                   patch=with_eps(BrokenEP())),
              Case("run an entry point that exits", text.replace('"conventional"', '"exit_plugin"'),
                   patch=with_eps(ExitEP()))]
    return cases


def data_cases() -> list[Case]:
    from fednet.errors import FednetError
    from fednet.learning.task import LearningTask

    def task_api(mutate: Callable[[dict], None]) -> Callable[[Path], str]:
        def go(work: Path) -> str:
            rng = np.random.default_rng(0)
            kw = dict(X=[rng.uniform(size=(6, 3)) for _ in range(2)], Y=[np.eye(3)[rng.integers(0, 3, 6)]] * 2,
                      x_test=rng.uniform(size=(4, 3)), y_test=np.array([0, 1, 2, 1]))
            mutate(kw)
            try:
                LearningTask(**kw)
            except FednetError:
                return "named error"
            return "silently wrong"
        return go

    def setx(k, i, v):
        def m(kw):
            a = kw[k] if k not in ("X", "Y") else kw[k][0]
            a = a.copy()
            a.flat[i] = v
            if k in ("X", "Y"):
                kw[k] = [a] + list(kw[k][1:])
            else:
                kw[k] = a
        return m

    rows = [("X nan", setx("X", 0, np.nan)), ("X inf", setx("X", 3, np.inf)), ("X -inf", setx("X", 5, -np.inf)),
            ("Y nan", setx("Y", 1, np.nan)), ("x_test nan", setx("x_test", 2, np.nan)),
            ("x_test huge then inf", setx("x_test", 0, np.inf)),
            ("y_test 3 of 3 classes", lambda kw: kw.update(y_test=np.array([0, 1, 3, 1]))),
            ("y_test -1", lambda kw: kw.update(y_test=np.array([0, -1, 2, 1]))),
            ("y_test floats", lambda kw: kw.update(y_test=np.array([0.5, 1, 2, 1]))),
            ("y_test 10**9", lambda kw: kw.update(y_test=np.array([0, 1, 10**9, 1])))]
    return [Case(f"data: {name}", api=task_api(m)) for name, m in rows]


def all_cases() -> list[Case]:
    return divergence_cases() + misfit_cases() + plant_cases() + tamper_cases() + env_cases() + data_cases()


def main_campaign(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="run only cases whose name holds one of these")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    cases = [c for c in all_cases() if not args.only or any(o in c.name for o in args.only)]
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="fednet-campaign-"))
    counts: Counter = Counter()
    t0 = time.monotonic()
    for i, case in enumerate(cases):
        verdict, detail = run_case(case, root)
        counts[verdict] += 1
        flag = "" if verdict in ("named error", "recorded failure", "correct") else "  <-- "
        print(f"{i + 1:3d} {verdict:16s} {case.name[:70]:70s} {detail[:110]}{flag}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\n{len(cases)} cases in {time.monotonic() - t0:.0f} s\n")
    print("| tried | " + " | ".join(OUTCOMES) + " |")
    print("|" + "---|" * (len(OUTCOMES) + 1))
    print(f"| {len(cases)} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    return 0 if not any(counts[o] for o in OUTCOMES[3:]) else 1


if __name__ == "__main__":
    sys.exit(main_campaign())
