"""Wire widths: the bits one number of a message costs, from an explicit declaration or from the payload.

Every primitive that sends (:mod:`fednet.protocol.primitives`), the reference semantics and every backend ask
:func:`width` (or :func:`widths`, once per step) for a message's bits per number, so they bill alike:

1. an explicit width wins: an ``int`` number of bits, or a typed declaration -- :func:`field` (``ceil(log2 p)``
   bits per element of GF(p)), :func:`fixed` (``k`` bits per ``Q<k,f>`` number) or :func:`bits`;
2. otherwise the payload tells: a float16/32/64 array (or a timing-mode :class:`~fednet.algebra.shape.Shape` of
   that dtype) costs 16/32/64 bits, a ``uint8``/``int8`` array, ``bytes`` or ``bytearray`` 8, a galois
   ``FieldArray`` ``ceil(log2 order)``, a Python ``float`` 64; a tuple, list or dict costs what all its parts agree on;
3. otherwise -- an ``int64`` array (a field element? a fixed-point number? an index?), ``None``, parts of different
   widths -- :class:`WireWidthError` names the message kind and the argument that declares the width.

There is no protocol-wide default: a width nobody declared is an error, not 32 bits.

:func:`observing` lets :func:`fednet.testing.check_protocol` see every message a run sends through
:meth:`fednet.protocol.primitives.Net.send` (the reference semantics send every message so) with its declaration and
billed width, and check that the values fit (:func:`misfit`); it costs one global read per message otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Width", "field", "fixed", "bits", "WireWidthError", "width", "resolve", "widths", "declared",
           "payload_bits", "observing", "misfit", "message_bits"]


@dataclass(frozen=True)
class Width:
    """A declared wire width: ``bits`` per number, and what the numbers are (for :func:`misfit`).

    Attributes
    ----------
    bits : int
        Bits per number on the wire.
    kind : {"field", "fixed", "bits"}
        Elements of GF(``modulus``) stored in ``[0, modulus)``; ``Q<bits,frac>`` numbers stored signed in
        ``[-2^(bits-1), 2^(bits-1))``; or plain numbers (unsigned or signed ``bits``-bit integers).
    modulus : int or None
        The field's order (``kind == "field"``).
    frac : int or None
        Fractional bits (``kind == "fixed"``).
    """

    bits: int
    kind: str = "bits"
    modulus: int | None = None
    frac: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, (int, np.integer)) or self.bits <= 0:
            raise ValueError(f"a wire width needs a positive integer number of bits, got {self.bits!r}")

    def __str__(self) -> str:
        if self.kind == "field":
            return f"field({self.modulus}) = {self.bits} bits"
        if self.kind == "fixed":
            return f"fixed({self.bits}, {self.frac}) = {self.bits} bits"
        return f"{self.bits} bits"


def field(p: int) -> Width:
    """The width of an element of GF(``p``) (or of Z_p): ``ceil(log2 p)`` bits, values in ``[0, p)``.

    Raises
    ------
    ValueError
        For ``p < 2``.
    """
    p = int(p)
    if p < 2:
        raise ValueError(f"field(p) needs p >= 2, got p = {p}")
    return Width((p - 1).bit_length(), "field", modulus=p)


def fixed(k: int, f: int = 0) -> Width:
    """The width of a fixed-point number ``Q<k,f>``: ``k`` bits, values in ``[-2^(k-1), 2^(k-1))``.

    Raises
    ------
    ValueError
        For ``k < 1`` or ``f`` outside ``[0, k)``.
    """
    if int(k) < 1 or not 0 <= int(f) < max(int(k), 1):
        raise ValueError(f"fixed(k, f) needs k >= 1 and 0 <= f < k, got k = {k}, f = {f}")
    return Width(int(k), "fixed", frac=int(f))


def bits(n: int) -> Width:
    """An explicit ``n`` bits per number (the same as passing ``n``)."""
    return Width(int(n)) if isinstance(n, (int, np.integer)) and not isinstance(n, bool) else Width(n)


class WireWidthError(TypeError):
    """A message's width per number is neither declared nor known from its payload (or is declared wrongly)."""



def _dtype_bits(dtype: Any) -> int | None:
    """Bits per number of an array dtype, or None where the dtype does not say (integers wider than a byte)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return dt.itemsize * 8
    if dt.kind in "ui" and dt.itemsize == 1:
        return 8
    return None


def payload_bits(payload: Any) -> int | None:
    """Bits per number that ``payload`` itself tells (module docstring, rule 2), or None where it does not.

    Raises
    ------
    WireWidthError
        For a tuple, list or dict whose parts tell different widths.
    """
    if isinstance(payload, np.ndarray):
        order = getattr(type(payload), "order", None)            # a galois FieldArray: its class knows the field
        if isinstance(order, (int, np.integer)) and order >= 2:
            return (int(order) - 1).bit_length()
        return _dtype_bits(payload.dtype)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return 8
    if isinstance(payload, float):
        return 64
    if isinstance(payload, np.generic):
        return _dtype_bits(payload.dtype)
    if isinstance(payload, (tuple, list, dict)):
        parts = list(payload.values()) if isinstance(payload, dict) else payload
        found = {payload_bits(part) for part in parts}
        if len(found) > 1:
            raise WireWidthError(f"its parts have different widths {sorted(found, key=str)}")
        return found.pop() if found else None
    dtype = getattr(payload, "dtype", None)                       # a Shape stand-in (or another array type)
    if dtype is not None:
        try:
            return _dtype_bits(dtype)
        except TypeError:
            return None
    return None


def _describe(payload: Any) -> str:
    """A short description of a payload for an error."""
    dtype = getattr(payload, "dtype", None)
    shape = getattr(payload, "shape", None)
    if dtype is not None:
        return f"{type(payload).__name__} of dtype {dtype}" + (f" and shape {tuple(shape)}" if shape is not None
                                                                else "")
    return f"{type(payload).__name__}"


@lru_cache(maxsize=256)
def _plain(n: int) -> Width:
    """``Width(n)``, made once per ``n`` (the reference asks per message)."""
    return Width(n)


def declared(explicit: int | Width | None, *, kind: str = "", arg: str = "element_bits",
             where: str = "") -> Width | None:
    """The :class:`Width` an explicit ``element_bits``-style argument declares (None for None).

    Raises
    ------
    WireWidthError
        For anything but None, a positive int or a :class:`Width`.
    """
    if explicit is None or isinstance(explicit, Width):
        return explicit
    if isinstance(explicit, (int, np.integer)) and not isinstance(explicit, bool) and explicit > 0:
        return _plain(int(explicit))
    raise WireWidthError(f"{where}message kind {kind!r}: {arg} must be a positive int number of bits or a "
                         f"fednet.sim.engine.wire width (field(p), fixed(k, f), bits(n)), got {explicit!r}")


def width(payload: Any, explicit: int | Width | None, kind: str, *, arg: str = "element_bits",
          where: str = "") -> int:
    """Bits per number of a message of kind ``kind`` carrying ``payload`` (module docstring).

    Parameters
    ----------
    payload : Any
        What the message carries.
    explicit : int, Width or None
        The width the caller declared (``element_bits=``, ``upload_bits=``, ``download_bits=``).
    kind : str
        The message's kind (errors name it).
    arg : str
        The argument that declares the width (errors name it).
    where : str
        A prefix for errors (the run's label).

    Raises
    ------
    WireWidthError
        Where neither the declaration nor the payload gives the width.
    """
    if explicit is not None:
        if type(explicit) is int and explicit > 0:              # the common cases, first
            return explicit
        if type(explicit) is Width:
            return explicit.bits
        return declared(explicit, kind=kind, arg=arg, where=where).bits
    try:
        found = payload_bits(payload)
    except WireWidthError as e:
        raise WireWidthError(f"{where}message kind {kind!r}: cannot tell its width per number from its payload "
                             f"({e}); pass {arg}=") from None
    if found is None:
        raise WireWidthError(
            f"{where}message kind {kind!r}: cannot tell its width per number from a payload of "
            f"{_describe(payload)}; declare it with {arg}= (an int number of bits, or fednet.sim.engine.wire's "
            f"field(p) for elements of GF(p), fixed(k, f) for Q<k,f> numbers; an integer array may be either)")
    return found


def resolve(payload: Any, explicit: int | Width | None, kind: str, *, arg: str = "element_bits",
            where: str = "") -> Width:
    """The :class:`Width` a message is billed at: the declaration, else ``Width(bits)`` from the payload (:func:`width`;
    errors name ``arg``)."""
    if explicit is not None:
        return declared(explicit, kind=kind, arg=arg, where=where)
    return Width(width(payload, None, kind, arg=arg, where=where))


def widths(explicit: int | Width | None, kind: str, *, arg: str = "element_bits",
           where: str = "") -> Callable[[Any], int]:
    """:func:`width` for many messages of one step: a function of the payload, checked and resolved once when the
    width is declared (its ``constant`` attribute is then the bits, else None)."""
    if explicit is not None:
        n = declared(explicit, kind=kind, arg=arg, where=where).bits

        def const(payload: Any) -> int:
            """The declared width."""
            return n
        const.constant = n
        return const

    def of(payload: Any) -> int:
        """The payload's width."""
        return width(payload, None, kind, arg=arg, where=where)
    of.constant = None
    return of


# -- observing the messages of a run (check_protocol) -----------------------------------------------------------
_OBSERVER: list[Callable[..., None]] = []


@contextmanager
def observing(observer: Callable[[Any, Width | None, int, str], None]) -> Iterator[None]:
    """Call ``observer(payload, declaration, bits, kind)`` for every message :func:`message_bits` bills meanwhile."""
    _OBSERVER.append(observer)
    try:
        yield
    finally:
        _OBSERVER.remove(observer)


def message_bits(payload: Any, explicit: int | Width | None, kind: str, *, arg: str = "element_bits",
                 where: str = "") -> int:
    """:func:`width` for one message sent by :meth:`fednet.protocol.primitives.Net.send`, shown to the observers of
    :func:`observing`."""
    n = width(payload, explicit, kind, arg=arg, where=where)
    if _OBSERVER:
        decl = declared(explicit, kind=kind, arg=arg, where=where)
        for observer in _OBSERVER:
            observer(payload, decl, n, kind)
    return n


def _integer_parts(payload: Any) -> Iterator[np.ndarray]:
    """The integer arrays (and scalars) a payload holds."""
    if isinstance(payload, (tuple, list)):
        for part in payload:
            yield from _integer_parts(part)
    elif isinstance(payload, dict):
        for part in payload.values():
            yield from _integer_parts(part)
    elif isinstance(payload, (bool, np.bool_)):
        return
    elif isinstance(payload, (int, np.integer)):
        yield np.asarray(payload)
    elif isinstance(payload, np.ndarray) and payload.size and (payload.dtype.kind in "ui" or (
            payload.dtype == object and isinstance(payload.flat[0], (int, np.integer)))):
        yield payload


def misfit(payload: Any, decl: Width | None, n_bits: int) -> str | None:
    """Why the integers of ``payload`` do not fit ``n_bits`` bits per number as ``decl`` declares them, or None.

    A :func:`field` declaration needs values in ``[0, p)``; :func:`fixed` in ``[-2^(k-1), 2^(k-1))``; a plain
    width (or none: a width from the payload) either ``[0, 2^bits)`` or ``[-2^(bits-1), 2^(bits-1))``.  Float
    payloads are not checked (a width below the dtype's is a declared quantisation), nor timing-mode stand-ins.
    """
    for part in _integer_parts(payload):
        lo, hi = int(part.min()), int(part.max())
        if decl is not None and decl.kind == "field":
            if lo < 0 or hi >= decl.modulus:
                return f"values in [{lo}, {hi}] are not elements of [0, {decl.modulus}) ({decl})"
        elif decl is not None and decl.kind == "fixed":
            half = 1 << (decl.bits - 1)
            if lo < -half or hi >= half:
                return f"values in [{lo}, {hi}] do not fit the signed {decl.bits} bits of Q<{decl.bits},{decl.frac}>"
        else:
            half = 1 << (n_bits - 1)
            if not ((lo >= 0 and hi < 2 * half) or (lo >= -half and hi < half)):
                need = max(hi.bit_length() + (lo < 0), (-lo - 1).bit_length() + 1 if lo < 0 else 0)
                return (f"values in [{lo}, {hi}] need {need} bits (e.g. {hi if hi >= 2 * half else lo}) but are "
                        f"billed at {n_bits}")
    return None
