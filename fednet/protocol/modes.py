"""Execution modes: one code path per protocol, the mode decides whether a step's math runs.

A protocol's round is written once. Every piece of math goes through the protocol's mode object
(``self.mode``):

``mode.run(kernel, *args)``
    A charged step (called inside ``compute_each`` / ``gather`` / ``server_compute`` /
    ``tree_aggregate``, whose meter picks up the charge).  A kernel declares its MAC count and output
    shapes once (:func:`fednet.algebra.meter.kernel`).  :class:`Full` executes it (its metered kernels
    charge the MACs) and checks the metered count and the outputs' shapes against the declaration on
    every call (:class:`~fednet.algebra.meter.DeclaredCostError`, naming the kernel and, through the
    primitive, the protocol step).  :class:`Timing` does not execute it: it charges the declared count
    and returns the declared :class:`Shape` stand-ins, whose ``value`` is the host's plain computation
    (the declaration's ``value`` hook or the call's ``stand_in=``), run unmetered so it is never billed.
    An undeclared ``fn`` is measured once per shape signature by running it on zero operands (or by
    a ``macs=`` closed form or cheaper measuring closure, both checked on every full-mode call).
``mode.offline(fn, *args, like=...)``
    Uncharged host work (offline phases, not timed): Full runs it, Timing returns ``like``.
``mode.observe(fn, *args)``
    The observer's checks (decoding error against the plain computation): Full only.
``mode.update(protocol, G, m)`` / ``mode.evaluate(protocol)``
    The model update and its test accuracy. A protocol whose decoded update equals the plain
    full-batch gradient (``exact_trajectory = True``: CodedPaddedFL, CodedSecAgg, Prop. 3) follows
    the task's cached full-batch trajectory in timing mode; otherwise the timing mode updates with
    the stand-in value the step carried (``stand_in=``, e.g. LightSecAgg's sum of the survivors'
    quantised gradients, computed by the host without the masks).
``mode.follows(protocol)``
    Whether this round's model is taken from a trajectory another run already computed
    (:class:`SharedTrajectory`, timing mode only): the protocol may then skip its stand-in value.

Full and timing modes give identical simulated times, MACs, traffic and accuracies: a test runs
both on the same seed (``tests/test_pinned_traces.py`` pins both against the traces of the code
before this module existed).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fednet.algebra.meter import DeclaredCostError, MacMeter, call_unmetered, charge, declared_cost, macs_of
from fednet.algebra.shape import Repeated, Shape

__all__ = ["Mode", "Full", "Timing", "Shape", "Opaque", "SharedTrajectory", "make_mode", "MODES"]


class Opaque:
    """Stand-in for a non-array object a step produced in timing mode (e.g. a prepared matrix).

    It keeps the step that made it, so that it can be rebuilt from zero operands when a later
    step at a new shape signature has to be metered.
    """

    __slots__ = ("kind", "producer", "path", "size")

    def __init__(self, kind: str, producer: tuple, path: tuple, size: int | None) -> None:
        self.kind, self.producer, self.path, self.size = kind, producer, path, size

    def materialize(self) -> Any:
        """The object computed from zero operands."""
        fn, args, kwargs = self.producer
        out = fn(*_materialize(args), **_materialize(kwargs))
        for i in self.path:
            out = out[i]
        return out

    def __repr__(self) -> str:
        return f"Opaque({self.kind}, size={self.size})"


def _signature(x: Any) -> Any:
    """Hashable description of an argument: shapes and dtypes for arrays, values for scalars."""
    if isinstance(x, (Shape, np.ndarray)):
        return ("S", tuple(x.shape), np.dtype(x.dtype).str)
    if isinstance(x, Opaque):
        return ("O", x.kind, _signature(x.producer[1]), _signature(x.producer[2]), x.path,
                getattr(x.producer[0], "__qualname__", id(x.producer[0])))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_signature(v) for v in x)
    if isinstance(x, dict):
        return ("d",) + tuple((k, _signature(v)) for k, v in sorted(x.items()))
    if isinstance(x, np.random.Generator):
        return ("rng",)
    if x is None or isinstance(x, (bool, int, float, str, np.number, range)):
        return ("v", type(x).__name__, x)
    try:
        hash(x)
        return ("h", type(x).__name__, x)
    except TypeError:
        return ("id", type(x).__name__, id(x))


def _materialize(x: Any) -> Any:
    if isinstance(x, Shape):
        return x.zeros()
    if isinstance(x, Opaque):
        return x.materialize()
    if isinstance(x, list):
        return [_materialize(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_materialize(v) for v in x)
    if isinstance(x, dict):
        return {k: _materialize(v) for k, v in x.items()}
    return x


def _stub(out: Any, producer: tuple, path: tuple = ()) -> Any:
    """Stand-ins of a step's outputs (arrays -> Shape, other objects -> Opaque, scalars kept)."""
    if isinstance(out, np.ndarray):
        return Shape.like(out)
    if isinstance(out, (tuple, list)):
        return type(out)(_stub(v, producer, path + (i,)) for i, v in enumerate(out))
    if out is None or isinstance(out, (bool, int, float, str, np.number)):
        return out
    size = getattr(out, "size", None)
    return Opaque(type(out).__name__, producer, path, None if size is None else int(size))


def _measure_key(fn: Any, args: tuple, kwargs: dict, key: Any) -> tuple:
    """The cache key of an undeclared step's measured count: its name and ``key``, or its shape signature."""
    return ("fednet.protocol.modes", getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn)),
            (_signature(args), _signature(kwargs)) if key is None else ("key", key))


def _no_cost_keywords(cost: Any, macs: Any, like: Any, key: Any) -> None:
    """Refuse cost keywords for a kernel that declares its costs (the declaration is the one source)."""
    given = [name for name, v in (("macs", macs), ("like", like), ("key", key)) if v is not None]
    if given:
        raise TypeError(f"kernel {cost.name} declares its costs (fednet.algebra.meter.kernel); "
                        f"mode.run takes no {', '.join(given)} for it")


def _check_outputs(cost: Any, out: Any, declared: Any, path: str = "") -> None:
    """Full mode: ``out`` has the declared stand-ins' shapes (and dtypes, for arrays); ``None`` declares an
    output timing mode does not carry, a non-Shape declaration is not compared."""
    if isinstance(declared, Shape):
        shape = getattr(out, "shape", None)
        if shape is None:
            return
        if tuple(shape) != tuple(declared.shape) or (isinstance(out, np.ndarray)
                                                     and out.dtype != np.dtype(declared.dtype)):
            raise DeclaredCostError(
                f"kernel {cost.name} returned output{path or ''} of shape {tuple(shape)}, dtype "
                f"{getattr(out, 'dtype', None)} but declares Shape{tuple(declared.shape)}, {np.dtype(declared.dtype)} "
                f"(what timing mode returns)", cost.name)
    elif isinstance(declared, (tuple, list, Repeated)):
        if not isinstance(out, (tuple, list)) or len(out) != len(declared):
            raise DeclaredCostError(f"kernel {cost.name} returned {type(out).__name__} output{path} but declares "
                                    f"{len(declared)} outputs", cost.name)
        for i, (o, d) in enumerate(zip(out, declared)):
            _check_outputs(cost, o, d, f"{path}[{i}]")


_MISSES = itertools.count()

#: Shape signature -> stand-ins of the outputs (the MACs are in fednet.algebra.meter's cache).
_OUTPUTS: dict[tuple, Any] = {}


@dataclass(eq=False)
class SharedTrajectory:
    """The models and test evaluations of one learning trajectory, by epoch, shared by timing-mode runs.

    Runs whose model does not depend on their timing (:meth:`fednet.protocol.base.Protocol.trajectory_group`:
    LightSecAgg with ``U = D``, whose server sums every user's quantised gradient, exactly, each round) follow
    one trajectory at a seed. The first run on a task computes it and keeps each epoch's model here (read-only
    arrays); the others take the model of each epoch instead of computing their stand-in gradients, and the test
    evaluation of that very model. Simulated times, traffic and MACs are still each run's own.

    Memory: one model per epoch, kept as long as the task (``d c`` floats an epoch: ~100 MB for 650 epochs at
    d = 2000, c = 10), whether or not another run follows.

    Attributes
    ----------
    thetas : dict of int to model
        The model after each epoch's update (the object the protocol's ``theta`` is set to).
    evaluations : dict of int to (float, float)
        ``(accuracy, loss)`` of ``thetas[epoch]``.
    """

    thetas: dict[int, Any] = field(default_factory=dict)
    evaluations: dict[int, tuple[float, float]] = field(default_factory=dict)


class Mode:
    """How a protocol's steps execute (module docstring). Use :func:`make_mode` or a subclass."""

    name: ClassVar[str] = ""
    #: Whether steps execute their exact math.
    exact: ClassVar[bool] = True

    def run(self, fn: Callable[..., Any], *args: Any, macs: int | Callable[[], Any] | None = None,
            like: Any = None, stand_in: Callable[[], Any] | None = None, key: Any = None, **kwargs: Any) -> Any:
        """Evaluate a charged step ``fn(*args, **kwargs)`` (see :class:`Full`, :class:`Timing`).

        A kernel that declares its costs (:func:`fednet.algebra.meter.kernel`) is called without cost
        keywords: ``mode.run(kernel, *args)``.  Full mode checks the declaration against the metered
        count (and the outputs against the declared shapes) on every call; timing mode charges the
        declaration and returns the declared stand-ins.  An undeclared ``fn`` is measured as below.

        Parameters
        ----------
        fn : callable
            A pure function built from metered kernels, declared (:func:`~fednet.algebra.meter.kernel`)
            or not.
        macs : int or callable, optional
            Undeclared ``fn`` only: how timing mode learns the count without running ``fn`` on
            operands of the real shapes (when that is too slow on the host, e.g. Python-int fields):
            an int (a closed form), or a closure running the same kernels at the same shapes more
            cheaply (e.g. in a smaller field), measured once per ``key``.  Full mode checks either
            against the metered count on every call.  Default: run ``fn`` on zero operands once per
            shape signature.
        like : Any, optional
            Timing mode's outputs when ``macs`` is given (stand-ins of the right shapes).
        stand_in : callable() -> Any, optional
            Timing mode: the host's value of a single array output, carried as ``Shape.value``
            (overrides a declared ``value`` hook).  It runs under
            :func:`~fednet.algebra.meter.unmetered`: a stand-in is never billed.
        key : hashable, optional
            With a ``macs`` closure: what its count depends on (default: the shape signature of the
            arguments, which holds the values of scalar and list arguments).

        Raises
        ------
        fednet.algebra.meter.DeclaredCostError
            Full mode: the metered MACs differ from the declared or given closed form (an
            ``AssertionError`` naming the kernel, both counts, and the protocol step where known).
        TypeError
            Cost keywords given with a declared kernel, or ``stand_in`` for an output that is not a
            single array.
        """
        raise NotImplementedError

    def offline(self, fn: Callable[..., Any], *args: Any, like: Any = None, **kwargs: Any) -> Any:
        """Uncharged host work (an offline phase): Full runs it, Timing returns ``like``."""
        raise NotImplementedError

    def observe(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """An observer's check (not charged): run in full mode only."""

    def value(self, x: Any) -> Any:
        """The value of a step's output: itself in full mode, its stand-in value in timing mode."""
        return x

    def follows(self, protocol: Any) -> bool:
        """Whether ``protocol``'s update this epoch comes from a :class:`SharedTrajectory` (never in full mode)."""
        return False

    def update(self, protocol: Any, G: Any, m_used: int) -> None:
        """Apply the update of eqs. (4)-(5) with gradient sum ``G`` over ``m_used`` points."""
        protocol.step(self.value(G), m_used)

    def evaluate(self, protocol: Any) -> tuple[float, float]:
        """Test accuracy and loss of the protocol's current model."""
        return protocol.task.evaluate(protocol.theta)


class Full(Mode):
    """Every step executes its exact math with the metered kernels."""

    name = "full"
    exact = True

    def run(self, fn, *args, macs=None, like=None, stand_in=None, key=None, **kwargs):
        """``fn(*args, **kwargs)`` under a :class:`MacMeter`, checked against its declared or given count.

        Raises
        ------
        fednet.algebra.meter.DeclaredCostError
            If the metered count differs from the declaration (:func:`~fednet.algebra.meter.kernel`), an
            int ``macs`` or a ``macs`` closure's measured count (what timing mode charges), or the outputs
            differ from the declared shapes.
        """
        cost = declared_cost(fn)
        if cost is not None:
            _no_cost_keywords(cost, macs, like, key)
            with MacMeter() as meter:
                out = fn(*args, **kwargs)
            declared = cost.count(args, kwargs)
            if meter.macs != declared:
                raise DeclaredCostError(f"kernel {cost.name} metered {meter.macs} MACs but declares {declared} "
                                        f"(what timing mode charges)", cost.name)
            _check_outputs(cost, out, cost.outputs(args, kwargs))
            return out
        if macs is None:
            return fn(*args, **kwargs)
        with MacMeter() as meter:
            out = fn(*args, **kwargs)
        if callable(macs):
            expected, what = macs_of(_measure_key(fn, args, kwargs, key), macs), "measuring closure"
        else:
            expected, what = macs, "closed form"
        if meter.macs != expected:
            name = getattr(fn, "__qualname__", repr(fn))
            raise DeclaredCostError(f"{name} metered {meter.macs} MACs but its {what} (charged in timing mode) "
                                    f"says {expected}", name)
        return out

    def offline(self, fn, *args, like=None, **kwargs):
        """``fn(*args, **kwargs)`` (uncharged unless a meter is open)."""
        return fn(*args, **kwargs)

    def observe(self, fn, *args, **kwargs) -> None:
        """Runs the check."""
        fn(*args, **kwargs)


class Timing(Mode):
    """Steps charge the MACs their kernels meter at the real shapes; values are stand-ins."""

    name = "timing"
    exact = False

    def run(self, fn, *args, macs=None, like=None, stand_in=None, key=None, **kwargs):
        """Charge ``fn``'s declared (or metered) MACs at these shapes; return stand-ins (with the host's value).

        A declared kernel is not run: its declared count is charged and its declared stand-ins returned.
        The host's value (``stand_in()``, else the declaration's ``value`` hook) is computed unmetered.
        """
        cost = getattr(fn, "__kernel_cost__", None)         # declared_cost(fn), inlined (the hot path)
        if cost is not None:
            if macs is not None or like is not None or key is not None:
                _no_cost_keywords(cost, macs, like, key)
            charge(cost.count(args, kwargs))
            out = cost.outputs(args, kwargs)
            if stand_in is None and cost.value is not None:
                stand_in = lambda: cost.value(*args, **kwargs)   # noqa: E731
        elif isinstance(macs, int) and not isinstance(macs, bool):   # a closed form: no key needed
            charge(macs)
            out = like
        elif macs is not None:
            charge(macs_of(_measure_key(fn, args, kwargs, key), macs))
            out = like
        else:
            key = _measure_key(fn, args, kwargs, None)
            if key not in _OUTPUTS:
                operands: list = []                   # built outside the measurement (and charged to nobody)
                macs_of(("fednet.protocol.modes.operands", next(_MISSES)),
                        lambda: operands.append((_materialize(args), _materialize(kwargs))))
                result: list = []
                macs_of(key, lambda: result.append(fn(*operands[0][0], **operands[0][1])))
                _OUTPUTS[key] = _stub(result[0], (fn, args, kwargs)) if result else None
            charge(macs_of(key, lambda: None))
            out = _OUTPUTS[key]
        if stand_in is not None:
            if not isinstance(out, Shape):
                raise TypeError(f"stand_in needs a single array output of {getattr(fn, '__qualname__', fn)}; "
                                f"pass like=Shape(...) or declare out=Shape(...)")
            out = Shape(out.shape, out.dtype, call_unmetered(stand_in))     # the host's value: never billed
        return out

    def offline(self, fn, *args, like=None, **kwargs):
        """``like`` (the work is not done)."""
        return like

    def value(self, x: Any) -> Any:
        """The stand-in value a step's output carries."""
        if isinstance(x, Shape):
            if x.value is None:
                raise ValueError("this timing-mode output carries no stand-in value (pass stand_in= to mode.run)")
            return x.value
        return x

    def follows(self, protocol: Any) -> bool:
        """Whether the protocol's shared trajectory (``protocol.trajectory``) already holds this epoch's model."""
        shared = getattr(protocol, "trajectory", None)
        return shared is not None and protocol.epoch in shared.thetas

    def update(self, protocol: Any, G: Any, m_used: int) -> None:
        """Exact-trajectory protocols: nothing (the model follows the cached full-batch trajectory); a run on a
        :class:`SharedTrajectory`: the epoch's model from it if some run computed it, else the update with the
        stand-in value, kept there (read-only); others: the update with the stand-in value."""
        if getattr(protocol, "exact_trajectory", False):
            return
        shared = getattr(protocol, "trajectory", None)
        if self.follows(protocol):
            protocol.theta = shared.thetas[protocol.epoch]
            return
        protocol.step(self.value(G), m_used)
        if shared is not None:
            theta = protocol.theta
            for array in (theta.values() if isinstance(theta, dict) else (theta,)):
                array.flags.writeable = False           # shared from now on: a write in place would be a bug
            shared.thetas[protocol.epoch] = theta

    def evaluate(self, protocol: Any) -> tuple[float, float]:
        """Exact-trajectory protocols: the cached full-batch trajectory's accuracy at this epoch; the model of a
        :class:`SharedTrajectory`: its evaluation, computed once (only while ``theta`` is that very object)."""
        if getattr(protocol, "exact_trajectory", False):
            return protocol.task.full_batch_trajectory(protocol.epoch)[protocol.epoch]
        shared = getattr(protocol, "trajectory", None)
        if shared is not None and protocol.theta is shared.thetas.get(protocol.epoch):
            evaluation = shared.evaluations.get(protocol.epoch)
            if evaluation is None:
                evaluation = shared.evaluations[protocol.epoch] = super().evaluate(protocol)
            return evaluation
        return super().evaluate(protocol)


#: The modes by name.
MODES: dict[str, type[Mode]] = {"full": Full, "timing": Timing}


def make_mode(name: str) -> Mode:
    """The mode object named ``name`` (``"full"`` or ``"timing"``).

    Raises
    ------
    ValueError
        For an unknown name.
    """
    try:
        return MODES[name]()
    except KeyError:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {name!r}") from None
