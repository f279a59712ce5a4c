"""The MAC meter: kernels count the multiply-accumulates they execute.

The model of time charges a computation ``rho / tau`` seconds (plus a random setup time),
with ``rho`` the number of multiply-and-accumulate operations (MACs) the computation *really
executes*. So the cost never comes from a separate hand-written formula: every kernel that
protocols call reports its own count through :func:`charge`, and the engine reads the total
from a :class:`MacMeter` opened around the computation.

The meter lives in the lowest layer (``fednet.algebra``) rather than in ``fednet.sim``, as
DESIGN.md first placed it, because the kernels that count are algebra kernels and a layer
may only import the layers below it.

Counting convention: a product of an (m, k) by a (k, n) matrix counts ``m * k * n`` MACs,
whatever the number system (float64, fixed point ``Q<k,f>``, GF(q)); limb splitting or
residue number systems used to make a product exact are an implementation detail of the host
and are *not* counted, because a device would execute the product in its own arithmetic.
Element-wise scaled additions (``y += a * x``) count one MAC per element.

Meters nest: a charge is added to every meter open in the current context (so a study can
meter a whole run while the engine meters each step). Counts are Python ``int`` (exact).
:func:`unmetered` hides them (host work that no device executes: an observer's check, timing
mode's stand-in values).

Declared costs: a kernel a protocol charges declares its MAC count and the shapes of its
outputs once, with :func:`kernel`; ``mode.run(kernel, *args)`` (:mod:`fednet.protocol.modes`)
then checks the declaration against the metered count on every call in full mode (raising
:class:`DeclaredCostError`), and charges it without running the kernel in timing mode.

Examples
--------
>>> import numpy as np
>>> from fednet.algebra.meter import MacMeter, matmul
>>> with MacMeter() as m:
...     _ = matmul(np.ones((3, 4)), np.ones((4, 5)))
>>> m.macs
60
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

__all__ = ["MacMeter", "ScopedMeter", "charge", "recharged", "matmul", "bmatmul", "axpy", "active_meters", "macs_of",
           "charged_alike", "unmetered", "call_unmetered", "kernel", "KernelCost", "declared_cost", "DeclaredCostError"]

_ACTIVE: contextvars.ContextVar[tuple["MacMeter", ...]] = contextvars.ContextVar(
    "fednet_active_meters", default=()
)


class ScopedMeter:
    """A meter open within a ``with`` block: while open it is on its class's context stack (``_stack``, a
    :class:`contextvars.ContextVar` of the meters open in the current context, outermost first), which the metered
    operations charge.  Subclasses set ``_stack`` and a ``_token`` slot; :meth:`_outer` gives the meters it nests in.

    Raises
    ------
    RuntimeError
        On entering a meter that is already open.
    """

    __slots__ = ()
    _stack: ClassVar[contextvars.ContextVar]

    def _outer(self) -> tuple:
        """The meters this one nests in (all open ones)."""
        return type(self)._stack.get()

    def __enter__(self):
        if self._token is not None:
            raise RuntimeError(f"a {type(self).__name__} cannot be entered twice at the same time")
        self._token = type(self)._stack.set(self._outer() + (self,))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        type(self)._stack.reset(self._token)
        self._token = None


class MacMeter(ScopedMeter):
    """Context manager that accumulates the MACs charged while it is open.

    Attributes
    ----------
    macs : int
        Number of multiply-accumulate operations charged so far (exact Python int).
    """

    __slots__ = ("macs", "_token")
    _stack = _ACTIVE

    def __init__(self) -> None:
        self.macs: int = 0
        self._token: contextvars.Token | None = None

    def __enter__(self) -> MacMeter:
        # ScopedMeter.__enter__ inlined: entered once a step or more per device and round, the extra call of
        # _outer measured 4 % of a CodedPaddedFL epoch at D = 120 (timing mode)
        if self._token is not None:
            raise RuntimeError("a MacMeter cannot be entered twice at the same time")
        self._token = _ACTIVE.set(_ACTIVE.get() + (self,))
        return self

    def __repr__(self) -> str:
        return f"MacMeter(macs={self.macs})"


def active_meters() -> tuple[MacMeter, ...]:
    """The meters open in the current context, outermost first."""
    return _ACTIVE.get()


def charge(macs: int) -> None:
    """Charge ``macs`` multiply-accumulates to every open meter.

    Parameters
    ----------
    macs : int
        Non-negative number of MACs executed by the calling kernel.

    Raises
    ------
    ValueError
        If ``macs`` is negative.
    """
    macs = int(macs)
    if macs < 0:
        raise ValueError(f"macs must be non-negative, got {macs}")
    for meter in _ACTIVE.get():
        meter.macs += macs


@contextlib.contextmanager
def recharged(rule: Callable[[int], int]) -> Iterator[MacMeter]:
    """Charge ``rule(metered)`` to the open meters in place of the ``metered`` MACs of the block.

    For accounting conventions that count a step differently from its kernels, e.g. a paper's
    complexity count (Schlegel et al., Sec. V-D: ``alpha - 1`` MACs per element for an encoding
    the kernel executes with ``alpha``; Remark 3: integer work in ``Z_<k+f>`` costs ``(k + f)/k``
    times the ``k``-bit work).  The block runs with only an inner meter open (meters opened
    inside it nest as usual); when it ends, ``rule`` of its count is charged to the meters that
    were open around it.

    Parameters
    ----------
    rule : callable(int) -> int
        Maps the block's metered MACs to the MACs charged; must return a non-negative int.

    Yields
    ------
    MacMeter
        The inner meter (its ``macs`` is the block's own count).

    Raises
    ------
    ValueError
        If ``rule`` returns a negative count.
    """
    inner = MacMeter()
    token = _ACTIVE.set((inner,))
    inner._token = token
    try:
        yield inner
    finally:
        _ACTIVE.reset(token)
        inner._token = None
    charge(rule(inner.macs))


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Metered real (float) matrix product ``a @ b``.

    Parameters
    ----------
    a : ndarray, shape (m, k) or (k,)
    b : ndarray, shape (k, n) or (k,)

    Returns
    -------
    ndarray
        ``a @ b``; charges ``m * k * n`` MACs (a vector counts as a dimension of 1).
    """
    a = np.asarray(a)
    b = np.asarray(b)
    m = a.shape[0] if a.ndim == 2 else 1
    k = a.shape[-1]
    n = b.shape[1] if b.ndim == 2 else 1
    if b.shape[0] != k:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
    charge(m * k * n)
    return a @ b


def bmatmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Metered stack of real matrix products: ``a[i] @ b[i]`` (or ``a[i] @ b`` for a 2-D ``b``).

    The products are those of :func:`matmul` slice by slice (NumPy's ``matmul`` calls the same BLAS
    routine on each slice, so each slice equals ``matmul(a[i], b[i])`` bit for bit;
    ``tests/test_batched.py``).

    Parameters
    ----------
    a : ndarray, shape (B, m, k)
    b : ndarray, shape (B, k, n) or (k, n)

    Returns
    -------
    ndarray, shape (B, m, n)
        Charges ``B * m * k * n`` MACs.

    Raises
    ------
    ValueError
        If the shapes do not align.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 3 or b.ndim not in (2, 3) or b.shape[-2] != a.shape[2] or (b.ndim == 3 and b.shape[0] != a.shape[0]):
        raise ValueError(f"bmatmul: shapes {a.shape} and {b.shape} do not align")
    charge(a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1])
    return a @ b


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Metered ``alpha * x + y`` (a new array); charges one MAC per element."""
    x = np.asarray(x)
    charge(x.size)
    return alpha * x + y


_MEASURED: dict[tuple, int] = {}


def macs_of(key: tuple, fn) -> int:
    """MACs that ``fn()`` charges, measured once per ``key`` and cached.

    Timing-only modes charge a step the MACs its real kernels meter at the real shapes: the
    key names the step and its shapes, ``fn`` runs the real kernels once (on any data of those
    shapes), and later calls return the cached count without running anything. The charge is
    not passed on to meters open around the call.

    Parameters
    ----------
    key : tuple
        Hashable description of the step and every shape it depends on.
    fn : callable
        Runs the step's kernels.
    """
    if key not in _MEASURED:
        token = _ACTIVE.set(())
        try:
            with MacMeter() as m:
                fn()
        finally:
            _ACTIVE.reset(token)
        _MEASURED[key] = m.macs
    return _MEASURED[key]


def charged_alike(n: int, fn: Callable[..., object], *args: object) -> tuple[list, list[int]]:
    """``n`` alike calls of ``fn`` from one: ``([v] * n, [m] * n)`` for ``v = fn(*args)`` metering ``m`` MACs.

    The batch twin of a step whose value and count are the same for each of ``n`` operands (timing mode's
    stand-ins of one shape, :mod:`fednet.protocol.modes`): ``fn`` runs once, charging its ``m`` MACs as usual,
    and the other ``n - 1`` calls are charged ``(n - 1) m`` MACs without running.

    Parameters
    ----------
    n : int
        Number of calls the one stands for (at least 1).
    fn : callable
        The step, built from metered kernels.
    *args
        Its operands (those of any of the ``n`` calls).

    Returns
    -------
    values : list
        ``n`` references to the one value.
    macs : list of int
        The MACs of each call, ``m`` each (their sum is what was charged).
    """
    with MacMeter() as meter:
        value = fn(*args)
    charge((n - 1) * meter.macs)
    return [value] * n, [meter.macs] * n


@contextlib.contextmanager
def unmetered() -> Iterator[None]:
    """Run metered kernels without charging the meters open around the block.

    For host work no simulated node executes: an observer's check, timing mode's stand-in values
    (:meth:`fednet.protocol.modes.Mode.run` runs them inside this block), a model evaluation.
    Meters opened inside the block count as usual; it hides the open meters exactly as
    :func:`macs_of` does.

    Examples
    --------
    >>> with MacMeter() as m:
    ...     with unmetered():
    ...         _ = matmul(np.ones((2, 2)), np.ones((2, 2)))
    >>> m.macs
    0
    """
    token = _ACTIVE.set(())
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class DeclaredCostError(AssertionError):
    """A kernel metered another MAC count (or produced other shapes) than it declares (:func:`kernel`).

    Raised by full mode (:class:`fednet.protocol.modes.Full`) on the call that differs; timing mode
    would charge the declaration, so full and timing mode would disagree.  A subclass of
    ``AssertionError``, as the other failed checks of closed forms.

    Attributes
    ----------
    kernel : str
        The kernel's qualified name.
    step : str or None
        The protocol and step that ran it (``"<label>: step '<name>'"``), where the engine knows it (added by
        the primitive that ran the step, :mod:`fednet.protocol.primitives`).
    """

    def __init__(self, message: str, kernel: str = "", step: str | None = None) -> None:
        super().__init__(message, kernel, step)          # args rebuild it (SimPy re-raises type(e)(*e.args))
        self.kernel, self.step, self.detail = kernel, step, message

    def __str__(self) -> str:
        return self.detail if self.step is None else f"{self.step}: {self.detail}"

    def in_step(self, step: str) -> "DeclaredCostError":
        """The same error naming the protocol step ``step`` (the innermost step named is kept)."""
        return self if self.step is not None else DeclaredCostError(self.detail, self.kernel, step)


class KernelCost:
    """The declared costs of one kernel (:func:`kernel`): MACs, output stand-ins, the host's value.

    Attributes
    ----------
    fn : callable
        The kernel.
    macs : int or callable(*args, **kwargs) -> int
        Its MAC count, a constant or a closed form of its arguments (in timing mode array arguments
        are :class:`~fednet.algebra.shape.Shape` stand-ins: read only ``.shape``, ``.dtype``,
        ``len()`` and scalar arguments).
    out : object or callable(*args, **kwargs) -> object
        Its outputs' stand-ins (a :class:`~fednet.algebra.shape.Shape`, a tuple or list of them,
        ``None`` for an output timing mode does not carry), or a callable giving them.
    value : callable(*args, **kwargs) -> object, optional
        Timing mode's host value of a single array output (``Shape.value``), computed unmetered.
    """

    __slots__ = ("fn", "macs", "out", "value", "name", "_macs_fn", "_out_fn")

    def __init__(self, fn: Callable[..., Any], macs: Any, out: Any, value: Callable[..., Any] | None) -> None:
        self.fn, self.macs, self.out, self.value = fn, macs, out, value
        self.name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        self._macs_fn = macs if callable(macs) else None
        self._out_fn = out if callable(out) else None

    def count(self, args: tuple, kwargs: dict) -> int:
        """The declared MACs of a call with ``args``, ``kwargs``.

        Raises
        ------
        TypeError
            If the declaration gives something other than a non-negative int.
        """
        n = self.macs if self._macs_fn is None else self._macs_fn(*args, **kwargs)
        if type(n) is int and n >= 0:                      # the usual case, checked first (timing mode's hot path)
            return n
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise TypeError(f"kernel {self.name}: declared macs must be a non-negative int, got {n!r}")
        return int(n)

    def outputs(self, args: tuple, kwargs: dict) -> Any:
        """The declared output stand-ins of a call with ``args``, ``kwargs``."""
        return self.out if self._out_fn is None else self._out_fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"KernelCost({self.name})"


def kernel(*, macs: int | Callable[..., int], out: Any = None, value: Callable[..., Any] | None = None
           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a kernel's MAC count and output shapes, once, where the kernel is defined.

    The function itself is returned unchanged (a direct call costs nothing more); the declaration
    is kept on it (:func:`declared_cost`).  ``mode.run(fn, *args)`` in full mode runs ``fn`` under a
    :class:`MacMeter` and raises :class:`DeclaredCostError` unless the metered count equals the
    declared one (and the outputs have the declared shapes), on every call; timing mode charges the
    declared count and returns the declared stand-ins without running ``fn``.

    Parameters
    ----------
    macs : int or callable(*args, **kwargs) -> int
        The closed form of the MACs the kernel meters (same arguments as the kernel).  It must hold
        for stand-in arguments too (timing mode): read shapes, lengths and scalars only.
    out : object or callable(*args, **kwargs) -> object, optional
        The outputs' stand-ins (:class:`~fednet.algebra.shape.Shape`, or tuples/lists of them;
        ``None`` for an output timing mode does not carry).  Default ``None``.
    value : callable(*args, **kwargs) -> object, optional
        Timing mode's host value of a single array output (carried as ``Shape.value``), computed
        under :func:`unmetered`, so it can never be billed.  A call's ``stand_in=`` overrides it.

    Returns
    -------
    callable
        The decorator.

    Examples
    --------
    >>> from fednet.algebra.shape import Shape
    >>> @kernel(macs=lambda a, b: a.shape[0] * a.shape[1] * b.shape[1],
    ...         out=lambda a, b: Shape((a.shape[0], b.shape[1]), np.float64))
    ... def product(a, b):
    ...     return matmul(a, b)
    >>> declared_cost(product).count((np.ones((2, 3)), np.ones((3, 4))), {})
    24
    """
    if not (callable(macs) or (isinstance(macs, int) and not isinstance(macs, bool) and macs >= 0)):
        raise TypeError(f"kernel: macs must be a non-negative int or a callable, got {macs!r}")
    if value is not None and not callable(value):
        raise TypeError(f"kernel: value must be a callable or None, got {value!r}")

    def declare(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__kernel_cost__ = KernelCost(fn, macs, out, value)
        return fn
    return declare


def call_unmetered(fn: Callable[[], Any]) -> Any:
    """``fn()`` under :func:`unmetered` (the same, without a context manager's cost: timing mode's hot path)."""
    token = _ACTIVE.set(())
    try:
        return fn()
    finally:
        _ACTIVE.reset(token)


def declared_cost(fn: Any) -> KernelCost | None:
    """The declaration of ``fn`` (:func:`kernel`), or None for an undeclared function."""
    return getattr(fn, "__kernel_cost__", None)
