"""The installed SimPy and NumPy are the ones fednet's copies of their internals were written against.

fednet copies ``simpy.core.Environment.step`` (:class:`fednet.sim.simulation.Environment`) and writes SimPy's event
queue and event fields directly (:mod:`fednet.sim.engine`); the one list of those internals is
:data:`fednet.sim.simulation.SIMPY_CODE` (functions copied or reproduced, with a digest of their source) and
:data:`~fednet.sim.simulation.SIMPY_ATTRIBUTES` (fields and constants, with what fednet assumes of them). Here:

* every function of ``SIMPY_CODE`` in the installed SimPy has the recorded digest (a SimPy release that changes
  one fails here, naming it and printing its new digest);
* every name of ``SIMPY_ATTRIBUTES`` has a check below (and the other way round), and each holds on live objects:
  the heap layout ``(time, priority, id, event)``, ``URGENT``/``NORMAL``, the id counter, the event fields, the
  resources' queues;
* fednet's ``Environment`` processes a mixed scenario (timeouts, interrupts, resources, a defused failure, an
  ``until``) in the same order as SimPy's own, and records each event's heap key in ``current``;
* the installed versions are inside the pins of ``pyproject.toml``.

NumPy: :mod:`fednet.sim.pcg` mirrors NumPy's ``SeedSequence``, ``PCG64`` and ``Generator.choice``; the tests that
compare it with the installed NumPy bit for bit are ``tests/test_batched.py`` (``test_pcg_choice_equals_numpy``,
``test_pcg_seed_states_equal_numpy``, ``test_lemire_rejections_equal_numpy``); the NumPy pin is checked here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import itertools
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import simpy
import simpy.core
import simpy.events
from packaging.requirements import Requirement
from simpy.resources.base import BaseResource
from simpy.resources.resource import Release

from fednet.sim.simulation import SIMPY_ATTRIBUTES, SIMPY_CODE, SIMPY_VERIFIED, Environment

ROOT = Path(__file__).resolve().parents[1]


def _resolve(qualname: str) -> Callable:
    """The function a dotted name points at in the installed SimPy (a property: its getter)."""
    parts = qualname.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = inspect.getattr_static(obj, part)
        return obj.fget if isinstance(obj, property) else obj
    raise ImportError(qualname)


def _strip_strings(node: ast.AST) -> None:
    """Drop every statement that is a bare string (docstrings, attribute docstrings), recursively."""
    for name in ("body", "orelse", "finalbody"):
        body = getattr(node, name, None)
        if isinstance(body, list):
            kept = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                            and isinstance(n.value.value, str))]
            setattr(node, name, kept or ([ast.Pass()] if body and name == "body" else kept))
    for child in ast.iter_child_nodes(node):
        _strip_strings(child)


def _normal_form(src: str) -> str:
    """``ast.unparse`` of the source without its bare strings: comments, docstrings and layout gone."""
    tree = ast.parse(textwrap.dedent(src))
    _strip_strings(tree)
    return ast.unparse(tree)


def code_digest(qualname: str) -> str:
    """SHA-256 (16 hex digits) of the normal form of a function's source in the installed SimPy."""
    return hashlib.sha256(_normal_form(inspect.getsource(_resolve(qualname))).encode()).hexdigest()[:16]


@pytest.mark.parametrize("qualname", sorted(SIMPY_CODE))
def test_simpy_code_fednet_copies_is_unchanged(qualname: str) -> None:
    got = code_digest(qualname)
    assert got == SIMPY_CODE[qualname], (
        f"the installed SimPy {importlib.metadata.version('simpy')} changed {qualname} (digest {got}; fednet's copy "
        f"follows SimPy {SIMPY_VERIFIED}): compare it with fednet's use (fednet/sim/simulation.py: SIMPY_CODE)")


def test_the_digest_ignores_comments_and_docstrings_only() -> None:
    """Formatting, comments and docstrings do not move the normal form the digest hashes; a changed statement does."""
    a = '''
        def step(self):
            """Doc."""
            try:
                self._now, _, _, event = heappop(self._queue)   # pop
            except IndexError:
                raise EmptySchedule from None
            '''
    b = '''
        def step(self):
            try:
                self._now, _, _, event = heappop(
                    self._queue)
            except IndexError:
                "an attribute docstring"
                raise EmptySchedule from None
            '''
    assert _normal_form(a) == _normal_form(b)
    assert _normal_form(a) != _normal_form(a.replace("from None", ""))


# -- the attributes -----------------------------------------------------------------------------------------------

def _env_with_events() -> tuple[simpy.Environment, list]:
    env = simpy.Environment()
    a = env.timeout(2.5)
    b = env.event().succeed("x")
    return env, [a, b]


def _queue() -> None:
    env, (a, b) = _env_with_events()
    assert isinstance(env._queue, list) and len(env._queue) == 2
    assert all(type(e) is tuple and len(e) == 4 for e in env._queue)
    assert env._queue[0] == (0, simpy.events.NORMAL, 1, b)           # the heap's first entry is the next event
    assert sorted(env._queue) == [(0, simpy.events.NORMAL, 1, b), (2.5, simpy.events.NORMAL, 0, a)]


def _now() -> None:
    env, _ = _env_with_events()
    assert env._now == 0 and env.now == 0
    env.step()
    env.step()
    assert env._now == 2.5 and env.now == 2.5


def _eid() -> None:
    env, _ = _env_with_events()
    assert isinstance(env._eid, itertools.count) and next(env._eid) == 2
    env._eid = itertools.count(10)                                     # skipping ids, as Mailbox.put_many does
    ev = env.event().succeed()
    assert env._queue[-1][2] == 10 and env._queue[-1][3] is ev


def _event_priority() -> None:
    assert simpy.core.EventPriority(-1) == -1 and simpy.core.EventPriority(-1) < simpy.events.URGENT


def _empty_schedule() -> None:
    with pytest.raises(simpy.core.EmptySchedule):
        simpy.Environment().step()


def _stop_simulation() -> None:
    env = simpy.Environment()
    stop = env.timeout(1, value="v")
    assert issubclass(simpy.core.StopSimulation, Exception) and env.run(until=stop) == "v"


def _urgent() -> None:
    assert simpy.events.URGENT == 0 and simpy.events.URGENT < simpy.events.NORMAL

    def proc(env):
        yield env.timeout(5)
    env = simpy.Environment()
    p = env.process(proc(env))
    assert env._queue[0][1] == simpy.events.URGENT                     # a process's start
    env.step()
    p.interrupt()
    assert [e[1] for e in env._queue if e[3] is not p._target] == [simpy.events.URGENT]   # an interrupt


def _normal() -> None:
    assert simpy.events.NORMAL == 1
    env, _ = _env_with_events()
    assert {e[1] for e in env._queue} == {simpy.events.NORMAL}


def _ok() -> None:
    env = simpy.Environment()
    good, bad = env.event().succeed(), env.event().fail(ValueError("x"))
    assert good._ok is True and bad._ok is False


def _value() -> None:
    env = simpy.Environment()
    ev = env.event()
    assert ev._value is simpy.events.PENDING and not ev.triggered
    ev._ok, ev._value = True, None                                      # what fednet writes before queueing one
    assert ev.triggered and ev.ok and ev.value is None


def _callbacks() -> None:
    env = simpy.Environment()
    ev = env.event()
    seen = []
    assert ev.callbacks == []
    ev.callbacks.append(seen.append)
    ev.succeed()
    env.step()
    assert seen == [ev] and ev.callbacks is None and ev.processed


def _defused() -> None:
    env = simpy.Environment()
    ev = env.event()
    assert not hasattr(ev, "_defused")
    ev.defused = True
    assert hasattr(ev, "_defused") and ev.defused


def _env() -> None:
    env = simpy.Environment()
    assert simpy.Resource(env)._env is env and issubclass(simpy.Resource, BaseResource)


def _put_queue() -> None:
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    first, second = res.request(), res.request()
    assert list(res.put_queue) == [second] and res.users == [first]


def _users() -> None:
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    req = res.request()
    assert isinstance(res.users, list) and res.users == [req]
    res.release(req)
    assert res.users == []


def _queue_of_resource() -> None:
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    res.request()
    second = res.request()
    assert res.queue is res.put_queue and list(res.queue) == [second]


def _release() -> None:
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    req = res.request()
    rel = res.release(req)
    assert type(rel) is Release and rel.resource is res and rel.request is req
    assert any(e[3] is rel for e in env._queue)


#: One check per name of SIMPY_ATTRIBUTES.
CHECKS = {
    "simpy.core.Environment._queue": _queue,
    "simpy.core.Environment._now": _now,
    "simpy.core.Environment._eid": _eid,
    "simpy.core.EventPriority": _event_priority,
    "simpy.core.EmptySchedule": _empty_schedule,
    "simpy.core.StopSimulation": _stop_simulation,
    "simpy.events.URGENT": _urgent,
    "simpy.events.NORMAL": _normal,
    "simpy.events.Event._ok": _ok,
    "simpy.events.Event._value": _value,
    "simpy.events.Event.callbacks": _callbacks,
    "simpy.events.Event._defused": _defused,
    "simpy.resources.base.BaseResource._env": _env,
    "simpy.resources.base.BaseResource.put_queue": _put_queue,
    "simpy.resources.resource.Resource.users": _users,
    "simpy.resources.resource.Resource.queue": _queue_of_resource,
    "simpy.resources.resource.Release": _release,
}


def test_every_relied_on_attribute_has_a_check() -> None:
    assert set(CHECKS) == set(SIMPY_ATTRIBUTES)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_simpy_attribute_is_as_fednet_assumes(name: str) -> None:
    CHECKS[name]()


# -- fednet's step against SimPy's ------------------------------------------------------------------------------

def _scenario(env: simpy.Environment, log: list) -> None:
    """Processes with timeouts at tied times, a resource queue, an interrupt and a defused failure."""
    res = simpy.Resource(env, capacity=1)

    def user(i: int, hold: float):
        with res.request() as req:
            yield req
            log.append((env.now, "got", i))
            try:
                yield env.timeout(hold)
            except simpy.Interrupt as e:
                log.append((env.now, "interrupted", i, e.cause))
        log.append((env.now, "released", i))

    def failing():
        yield env.timeout(1.0)
        ev = env.event()
        ev.callbacks.append(lambda e: setattr(e, "defused", True))
        ev.fail(RuntimeError("defused"))
        log.append((env.now, "failed"))

    users = [env.process(user(i, hold)) for i, hold in enumerate([1.0, 0.5, 1.0, 2.0])]
    env.process(failing())

    def interrupter():
        yield env.timeout(1.25)
        users[1].interrupt("cut")
    env.process(interrupter())


def _run(env_type: type) -> tuple[list, list]:
    env = env_type()
    log: list = []
    keys: list = []
    if env_type is Environment:
        real = env.step

        def step() -> None:
            if not env._queue:
                return real()                                    # raises EmptySchedule
            key = env._queue[0][:3]                              # the heap's first entry: what step pops
            real()
            keys.append((key, env.current))
        env.step = step
    _scenario(env, log)
    env.run(until=3.0)
    env.run()
    return log, keys


def test_fednets_step_processes_events_as_simpys() -> None:
    simpy_log, _ = _run(simpy.Environment)
    fednet_log, keys = _run(Environment)
    assert fednet_log == simpy_log and len(simpy_log) > 8
    assert keys and all(popped == current for popped, current in keys)


def test_step_reraises_an_undefused_failure_as_simpy() -> None:
    for env_type in (simpy.Environment, Environment):
        env = env_type()
        env.event().fail(KeyError("k"))
        with pytest.raises(KeyError) as info:
            env.run()
        assert isinstance(info.value.__cause__, KeyError)


# -- the pins ---------------------------------------------------------------------------------------------------

def _pins() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {(r := Requirement(d)).name: r for d in deps}


@pytest.mark.parametrize("name", ["simpy", "numpy"])
def test_installed_version_is_inside_the_pin(name: str) -> None:
    pin = _pins()[name]
    assert str(pin.specifier), f"{name} is unpinned in pyproject.toml"
    assert pin.specifier.contains(importlib.metadata.version(name)), (name, str(pin.specifier))


def test_simpy_pin_is_the_verified_release() -> None:
    assert _pins()["simpy"].specifier.contains(SIMPY_VERIFIED)
    assert importlib.metadata.version("simpy") == SIMPY_VERIFIED
