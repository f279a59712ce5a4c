"""``import fednet`` changes nothing outside fednet; :func:`fednet.configure_host` and the ``fednet`` command do.

Checked in fresh interpreters whose environment lacks the portable-kernel variables (the Makefile exports them, and
this test process has run :func:`fednet.configure_host` in ``conftest.py``): importing fednet, its protocol engine,
its study package and a protocol, then running a few rounds of conventional FL, leaves ``os.environ`` as it was,
never calls glibc's ``mallopt`` and leaves the garbage collector enabled and unfrozen, also during the rounds.
After :func:`fednet.configure_host` the kernels are set, ``mallopt`` is called (glibc) and the rounds run with the
collector paused; the ``fednet`` command's :func:`fednet.cli.main` does the same before anything loads NumPy.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import fednet

ROOT = Path(__file__).resolve().parents[1]
GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
X86 = platform.machine().lower() in ("x86_64", "amd64")

#: Records every ``mallopt`` looked up through ctypes, imports fednet's packages, runs three rounds of conventional FL
#: (noting the collector's state in each round) and prints what changed: by the imports, and by the end.
#: ``{configure}`` runs after ``import fednet``, before the imports that load NumPy.
PROBE = """
import ctypes, dataclasses, gc, json, os, sys
mallopt = []
class _Spy(ctypes.CDLL):
    def __getattr__(self, name):
        if name == "mallopt":
            mallopt.append(name)
        return super().__getattr__(name)
ctypes.CDLL = _Spy
before = dict(os.environ)
import fednet
{configure}
import fednet.protocol, fednet.study, fednet.protocols.conventional
import fednet.runtime
imported = dict(os.environ)
sys.path.insert(0, {tests!r})
from test_pinned_traces import digits_task, lossy_sim
from fednet.protocols.conventional import ConventionalFL
rounds = []
proto = ConventionalFL(lossy_sim(4, 0), digits_task(4, 8, "iid"), {{}})
proto.run(3, on_round=lambda row: rounds.append([row["round"], gc.isenabled(), gc.get_freeze_count()]))
after = dict(os.environ)
diff = lambda a, b: {{k: b.get(k) for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in {third_party!r}}}
print(json.dumps({{"imports": diff(before, imported), "changed": diff(before, after), "rounds": rounds,
                  "end": [gc.isenabled(), gc.get_freeze_count()], "mallopt": len(mallopt),
                  "config": dataclasses.asdict(fednet.runtime.host_config())}}))
"""

#: Set by scikit-learn and joblib when they load (``os.environ.setdefault``), which the digits task of the probe's
#: run does (``fednet.learning.features``): not fednet's, and not looked at.
THIRD_PARTY = ("KMP_INIT_AT_FORK",)

#: The variables a clean environment lacks (and the opt-outs, so that the defaults are what is tested).
REMOVED = (*fednet.PORTABLE_KERNELS, "FEDNET_NATIVE_KERNELS", "FEDNET_DEFAULT_MALLOC")


def _probe(configure: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in REMOVED}
    code = PROBE.format(configure=configure, tests=str(ROOT / "tests"), third_party=THIRD_PARTY)
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_changes_nothing_outside_fednet() -> None:
    """No environment variable, no ``mallopt``, the collector untouched during a run; ``fednet`` loads no NumPy."""
    got = _probe()
    assert got["imports"] == {} and got["changed"] == {}
    assert got["mallopt"] == 0
    assert got["rounds"] == [[0, True, 0], [1, True, 0], [2, True, 0], [3, True, 0]]
    assert got["end"] == [True, 0]
    assert got["config"] == {"kernels": {}, "kernels_late": [], "kernels_checked": False, "malloc": False,
                             "gc_policy": False}


def test_configure_host_sets_kernels_malloc_and_gc_policy() -> None:
    """After :func:`fednet.configure_host` (a second call changes nothing) the kernels are set where unset, glibc's
    ``mallopt`` is called and the rounds after the set-up run with the collector paused and the set-up frozen; the
    collector is restored when the run ends."""
    got = _probe("first = fednet.configure_host(); assert fednet.configure_host() == first")
    expected = fednet.PORTABLE_KERNELS if X86 else {}
    assert got["imports"] == expected and got["changed"] == expected
    assert got["config"]["kernels"] == expected and got["config"]["kernels_checked"]
    assert got["config"]["kernels_late"] == []            # import fednet loads no NumPy
    assert got["config"]["malloc"] is GLIBC and got["config"]["gc_policy"] is True
    assert got["mallopt"] == (1 if GLIBC else 0)
    assert got["rounds"][0][1] is True
    assert all(not enabled and frozen > 0 for _, enabled, frozen in got["rounds"][1:])
    assert got["end"] == [True, 0]


def test_configure_host_after_numpy_warns_and_records() -> None:
    """Setting the kernel variables after NumPy loaded is recorded and warned about (NumPy keeps its kernels)."""
    if not X86:
        pytest.skip("the kernels are pinned on x86-64 hosts only")
    code = ("import json, warnings, numpy, fednet\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    c = fednet.configure_host(malloc=False, gc_policy=False)\n"
            "print(json.dumps({'late': list(c.kernels_late), 'warned': [str(x.message) for x in w], 'gc': c.gc_policy,"
            " 'malloc': c.malloc}))")
    env = {k: v for k, v in os.environ.items() if k not in REMOVED}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["late"] == ["numpy"] and got["gc"] is False and got["malloc"] is False
    assert len(got["warned"]) == 1 and "after numpy was imported" in got["warned"][0]


def test_the_cli_configures_the_host_before_numpy() -> None:
    """:func:`fednet.cli.main` applies the host configuration first: nothing had loaded NumPy by then."""
    code = ("import json, sys, fednet.cli, fednet.runtime\n"
            "before = 'numpy' in sys.modules\n"
            "fednet.cli.main(['list'])\n"
            "import dataclasses\n"
            "print(json.dumps({'numpy_before': before, 'config': dataclasses.asdict(fednet.runtime.host_config())}))")
    env = {k: v for k, v in os.environ.items() if k not in REMOVED}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["numpy_before"] is False
    config = got["config"]
    assert config["kernels"] == (fednet.PORTABLE_KERNELS if X86 else {}) and config["kernels_late"] == []
    assert config["malloc"] is GLIBC and config["gc_policy"] is True


def _config_after(code: str) -> dict:
    """:func:`fednet.runtime.host_config` after ``code`` ran in a fresh interpreter with a clean environment."""
    code += "\nimport dataclasses, json, fednet.runtime\nprint(json.dumps(dataclasses.asdict(fednet.runtime.host_config())))"
    env = {k: v for k, v in os.environ.items() if k not in REMOVED}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_study_runner_configures_the_host() -> None:
    """``run_study`` applies the host configuration (loading a study loads NumPy first: the kernels are late)."""
    code = ("import warnings; warnings.simplefilter('ignore', RuntimeWarning)\n"
            "from fednet.cli import bundled_studies\n"
            "from fednet.study import load_study, run_study\n"
            "study = load_study(bundled_studies()['quickstart'], seeds=[0], only_runs=['Conventional FL'], "
            "max_epochs=1, sets=['data.n_components=20'])\n"
            "run_study(study, None, progress=False, plot=False)")
    config = _config_after(code)
    assert config["malloc"] is GLIBC and config["gc_policy"] is True and config["kernels_checked"] is True


def test_the_dask_worker_plugin_configures_the_host() -> None:
    """The workers' :class:`~fednet.study.parallel.BlasLimits` plugin applies it in its set-up."""
    pytest.importorskip("distributed")
    config = _config_after("from fednet.study.parallel import BlasLimits\nBlasLimits(1).setup(None)")
    assert config["malloc"] is GLIBC and config["gc_policy"] is True and config["kernels_checked"] is True
