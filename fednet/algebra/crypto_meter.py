"""The crypto meter: counts of cryptographic operations, their rates, and how they become simulated time.

Secure aggregation with pairwise masks (Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS 2017, Sec. 4 / Fig. 4; Bell et al., "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead", CCS 2020) spends most of its computation on operations
that are not multiply-accumulates: key generation and key agreement (X25519), the expansion of seeds
into masks by a pseudorandom generator (PRG), and authenticated encryption (AEAD) of the Shamir shares
exchanged through the server.  The real kernels (:mod:`fednet.algebra.crypto`) charge their counts
here, as the algebra kernels charge MACs to :class:`~fednet.algebra.meter.MacMeter`:

``key_generations``  X25519 key pairs generated (one scalar multiplication each)
``key_agreements``   X25519 key agreements (one scalar multiplication and a SHA-256 of 32 bytes each)
``prg_bytes``        bytes of PRG output (ChaCha20 keystream)
``aead_messages``    AEAD encryptions or decryptions (ChaCha20-Poly1305), the per-message cost
``aead_bytes``       plaintext bytes encrypted or decrypted

Rates.  :data:`HOST_CRYPTO_RATES` holds each operation's rate on the development host, measured with
the ``cryptography`` package by::

    OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell .venv/bin/python benchmarks/bench_crypto.py

(cryptography 50.0.2, one core of this 2-core host: 1.367e4 key generations/s, 1.399e4 key
agreements/s, 2.876e9 ChaCha20 bytes/s, 3.656e5 AEAD messages/s, 9.848e8 AEAD bytes/s; a float64
(2000, 2000) @ (2000, 10) product ran at 4.797e9 MAC/s on one thread: :data:`REFERENCE_MAC_RATE`).

Device classes.  A node's crypto rates are the host's scaled by its MAC rate, as MAC rates tell
device classes apart: ``rate(node) = host rate * node.mac_rate / REFERENCE_MAC_RATE`` (a device with
the host's single-thread MAC rate has the host's crypto rates; one 100 times slower at MACs is 100
times slower at key agreement).  The choice keeps one number per device class, as the papers do;
real devices with crypto extensions (AES-NI, ARMv8 crypto) are relatively faster at AES than at MACs,
which a node-specific :class:`CryptoRates` would model.

Simulated time.  With that scaling, ``seconds(node) = sum_kind count_kind / (host_rate_kind *
mac_rate / REFERENCE_MAC_RATE) = E / mac_rate`` where ``E = REFERENCE_MAC_RATE * sum_kind
count_kind / host_rate_kind`` does not depend on the node: the operations cost ``E``
*MAC-equivalents*.  :func:`run_crypto` charges ``round(E)`` to the open MAC meters with the step's
other MACs, so every compute model, the engine's reference processes and its vector backends add
the crypto time to the step's time without a change (``rho / tau + Lambda`` with ``rho`` the
MACs plus ``E``; the random part scales with both).  Consequently the trace's ``device_macs`` /
``server_macs`` include the MAC-equivalents; the counts themselves are kept apart (a protocol puts
them in its trace columns, e.g. ``protocols/secagg.py``).  A run that charges no crypto is unchanged.

Meters nest like MAC meters: a charge counts on every :class:`CryptoMeter` open in the context.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from fednet.algebra.meter import ScopedMeter, charge

__all__ = ["CryptoCounts", "CryptoRates", "CryptoMeter", "HOST_CRYPTO_RATES", "REFERENCE_MAC_RATE", "KINDS",
           "charge_crypto", "run_crypto", "active_crypto_meters", "CryptoTally"]


@dataclass(frozen=True)
class CryptoCounts:
    """Counts of cryptographic operations (exact ints; module docstring for the kinds).

    Counts add (``a + b``) and compare (``==``).
    """

    key_generations: int = 0
    key_agreements: int = 0
    prg_bytes: int = 0
    aead_messages: int = 0
    aead_bytes: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if int(v) != v or v < 0:
                raise ValueError(f"{f.name} must be a non-negative integer, got {v!r}")
            object.__setattr__(self, f.name, int(v))

    def __add__(self, other: "CryptoCounts") -> "CryptoCounts":
        return CryptoCounts(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def __bool__(self) -> bool:
        return any(getattr(self, k) for k in KINDS)

    def as_dict(self) -> dict[str, int]:
        """``{kind: count}`` in the order of :data:`KINDS`."""
        return {k: getattr(self, k) for k in KINDS}


#: The kinds of operations, in order.
KINDS: tuple[str, ...] = tuple(f.name for f in fields(CryptoCounts))

#: The host's float64 MAC rate on one thread (MAC/s): a device of this MAC rate has :data:`HOST_CRYPTO_RATES`.
REFERENCE_MAC_RATE = 4.797e9


@dataclass(frozen=True)
class CryptoRates:
    """Rates of the cryptographic operations on one node (operations/s or bytes/s).

    Attributes
    ----------
    key_generations, key_agreements : float
        X25519 key pairs / agreements per second.
    prg_bytes : float
        PRG output, bytes/s.
    aead_messages : float
        AEAD calls per second (per-message cost, measured on empty messages).
    aead_bytes : float
        AEAD plaintext bytes/s (measured on 1 MiB messages).
    reference_mac_rate : float
        The MAC rate (MAC/s) of the node these rates were measured on (:data:`REFERENCE_MAC_RATE`).
    """

    key_generations: float
    key_agreements: float
    prg_bytes: float
    aead_messages: float
    aead_bytes: float
    reference_mac_rate: float = REFERENCE_MAC_RATE

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and v > 0 and v < float("inf")):
                raise ValueError(f"{f.name} must be a positive finite rate, got {v!r}")

    def seconds(self, counts: CryptoCounts) -> float:
        """Seconds the operations take at these rates."""
        return sum(getattr(counts, k) / getattr(self, k) for k in KINDS)

    def for_mac_rate(self, mac_rate: float) -> "CryptoRates":
        """The rates of a node of ``mac_rate`` MAC/s: these times ``mac_rate / reference_mac_rate`` (module docstring)."""
        s = float(mac_rate) / self.reference_mac_rate
        return CryptoRates(*(getattr(self, k) * s for k in KINDS), reference_mac_rate=float(mac_rate))

    def mac_equivalents(self, counts: CryptoCounts) -> int:
        """``round(reference_mac_rate * seconds(counts))``: the MACs that take as long on any node (module docstring)."""
        return int(round(self.reference_mac_rate * self.seconds(counts)))


#: The development host's rates (module docstring: measured by ``benchmarks/bench_crypto.py``).
HOST_CRYPTO_RATES = CryptoRates(key_generations=1.367e4, key_agreements=1.399e4, prg_bytes=2.876e9,
                                aead_messages=3.656e5, aead_bytes=9.848e8)

_ACTIVE: contextvars.ContextVar[tuple["CryptoMeter", ...]] = contextvars.ContextVar("fednet_crypto_meters",
                                                                                    default=())


class CryptoMeter(ScopedMeter):
    """Context manager accumulating the cryptographic operations charged while it is open.

    Attributes
    ----------
    counts : CryptoCounts
        What was charged so far.
    """

    __slots__ = ("_counts", "_token", "_isolated")
    _stack = _ACTIVE

    def __init__(self, *, isolated: bool = False) -> None:
        self._counts = {k: 0 for k in KINDS}
        self._token: contextvars.Token | None = None
        self._isolated = isolated

    @property
    def counts(self) -> CryptoCounts:
        """The counts so far."""
        return CryptoCounts(**self._counts)

    def add(self, counts: CryptoCounts) -> None:
        """Add ``counts`` to this meter only."""
        for k in KINDS:
            self._counts[k] += getattr(counts, k)

    def _outer(self) -> tuple:
        """The meters this one nests in: none when isolated."""
        return () if self._isolated else _ACTIVE.get()

    def __repr__(self) -> str:
        return f"CryptoMeter({self.counts})"


def active_crypto_meters() -> tuple[CryptoMeter, ...]:
    """The crypto meters open in the current context, outermost first."""
    return _ACTIVE.get()


def charge_crypto(counts: CryptoCounts | None = None, **kinds: int) -> None:
    """Count operations on every open :class:`CryptoMeter` (``counts`` and/or keywords of :data:`KINDS`).

    Only counts: the time is charged by :func:`run_crypto` (as MAC-equivalents) once per step.

    Raises
    ------
    ValueError
        For an unknown kind or a negative count.
    """
    c = CryptoCounts(**kinds) if kinds else CryptoCounts()
    if counts is not None:
        c = c + counts
    for meter in _ACTIVE.get():
        meter.add(c)


def run_crypto(mode: Any, fn: Callable[..., Any], *args: Any, crypto: CryptoCounts, macs: int = 0, like: Any = None,
               rates: CryptoRates = HOST_CRYPTO_RATES, stand_in: Callable[[], Any] | None = None,
               tally: Callable[[CryptoCounts], None] | None = None, **kwargs: Any) -> Any:
    """A charged step that executes cryptographic operations: ``mode.run`` with the crypto time as MAC-equivalents.

    ``crypto`` and ``macs`` are the step's closed forms (counts of operations; MACs of its algebra kernels).  Full
    mode (:class:`fednet.protocol.modes.Full`) executes ``fn`` with the real operations under an isolated
    :class:`CryptoMeter` and checks both closed forms against what the kernels charged (an ``AssertionError``
    naming the step if either differs); timing mode charges the same without executing.  In both modes the step
    charges ``macs + rates.mac_equivalents(crypto)`` MACs, and ``crypto`` is counted once on the crypto meters open
    around the call and passed to ``tally`` (a protocol's per-round record).

    Parameters
    ----------
    mode : fednet.protocol.modes.Mode
        The protocol's mode (``self.mode``).
    fn : callable
        The step (real crypto kernels of :mod:`fednet.algebra.crypto`, metered algebra kernels).
    crypto : CryptoCounts
        Its operations (closed form).
    macs : int
        Its MACs (closed form).
    like, stand_in : optional
        Timing mode's outputs (:meth:`fednet.protocol.modes.Mode.run`).
    rates : CryptoRates
        Rates the MAC-equivalents are computed at (default :data:`HOST_CRYPTO_RATES`).
    tally : callable(CryptoCounts), optional
        Called with ``crypto`` after the step.

    Returns
    -------
    ``fn``'s result (full) or ``like`` (timing).
    """
    equivalent = rates.mac_equivalents(crypto)
    name = getattr(fn, "__qualname__", repr(fn))

    def step(*a: Any, **k: Any) -> Any:
        """``fn`` under an isolated meter, its counts and MACs checked against the closed forms (full mode)."""
        with CryptoMeter(isolated=True) as inner:
            out = fn(*a, **k)
        if inner.counts != crypto:
            raise AssertionError(f"{name} executed {inner.counts} but its closed form (charged in timing mode) "
                                 f"says {crypto}")
        charge(equivalent)
        return out

    step.__qualname__ = name
    out = mode.run(step, *args, macs=int(macs) + equivalent, like=like, stand_in=stand_in, **kwargs)
    charge_crypto(crypto)
    if tally is not None:
        tally(crypto)
    return out



class CryptoTally:
    """A protocol's per-round record of crypto operations by role (its trace columns ``<role>_<kind>``).

    Parameters
    ----------
    roles : sequence of str
        The roles counted apart, in column order (default ``("device", "server")``).
    """

    def __init__(self, roles: tuple[str, ...] = ("device", "server")) -> None:
        self.counts = {role: CryptoCounts() for role in roles}

    def adder(self, role: str) -> Callable[[CryptoCounts], None]:
        """A ``tally`` for :func:`run_crypto` that adds a step's counts to ``role``'s."""
        def add(c: CryptoCounts) -> None:
            """Add ``c`` to ``role``'s counts."""
            self.counts[role] = self.counts[role] + c
        return add

    def columns(self) -> dict[str, int]:
        """``{f"{role}_{kind}": count}``, roles in order, kinds in the order of :data:`KINDS`."""
        return {f"{role}_{k}": getattr(c, k) for role, c in self.counts.items() for k in KINDS}
