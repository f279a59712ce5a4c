"""Timing mode's stand-in for an array: its shape and dtype (and optionally the host's stand-in value).

It lives with the MAC meter, below the engine and the protocols, because both read it: the engine sizes a message
carrying one (:func:`fednet.sim.engine.results.payload_size`), the modes (:mod:`fednet.protocol.modes`) make it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Shape", "Repeated"]


@dataclass(frozen=True, eq=False)
class Shape:
    """Stand-in for an array in timing mode: its shape and dtype, and optionally a stand-in value.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype
    value : Any
        The host's stand-in value (``stand_in=`` of :meth:`Mode.run`), or None.
    """

    shape: tuple
    dtype: Any
    value: Any = None

    @property
    def size(self) -> int:
        """Number of elements (what a message carrying it costs): the exact product of the shape (1 for ``()``)."""
        return int(math.prod(self.shape))

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)

    @classmethod
    def like(cls, a: Any, value: Any = None) -> "Shape":
        """The stand-in of array ``a``."""
        a = np.asarray(a)
        return cls(tuple(a.shape), a.dtype, value)

    def __getitem__(self, i: int) -> "Shape":
        """The stand-in of ``a[i]`` for an integer ``i`` (the first axis dropped)."""
        if not isinstance(i, (int, np.integer)) or not self.shape or not -self.shape[0] <= i < self.shape[0]:
            raise IndexError(f"a Shape{self.shape} stand-in supports an integer index on its first axis, got {i!r}")
        return _row_stub(self.shape[1:], np.dtype(self.dtype))

    def zeros(self) -> np.ndarray:
        """Zero operand of this shape and dtype (to meter a kernel)."""
        return np.zeros(self.shape, dtype=self.dtype)


@functools.lru_cache(maxsize=256)
def _row_stub(shape: tuple, dtype: np.dtype) -> Shape:
    """One shared stand-in per row shape (rows of stand-ins are looked up N^2 times a round)."""
    return Shape(shape, dtype)


class Repeated(Sequence):
    """``head``'s items, then ``n`` references to one ``value``: a read-only sequence of ``len(head) + n`` items that
    holds ``[*head] + [value] * n`` in ``O(len(head))`` memory -- timing mode's stand-in for a list of equal
    stand-ins (a device's ``n'`` Shamir shares, :func:`fednet.codes.secagg.share_device_secrets`; the shares a
    receiver of an alike exchange holds, :class:`fednet.sim.engine.mailbox.AlikeDelivered`).

    Parameters
    ----------
    value : Any
    n : int
        ``>= 0``.
    head : tuple, optional
    """

    __slots__ = ("value", "n", "head")

    def __init__(self, value: Any, n: int, head: tuple = ()) -> None:
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.value, self.n, self.head = value, int(n), tuple(head)

    def __len__(self) -> int:
        return len(self.head) + self.n

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = int(k)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"index {k} out of range for {len(self)} items")
        return self.head[k] if k < len(self.head) else self.value

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain(self.head, itertools.repeat(self.value, self.n))

    def __repr__(self) -> str:
        return f"Repeated({self.value!r}, {self.n}, head={self.head!r})"
