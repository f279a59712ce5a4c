"""NumPy's ``SeedSequence``, ``PCG64`` and ``Generator.choice`` for many keys at once, bit for bit.

:meth:`fednet.sim.rng.Streams.generator` gives every public (node, purpose, round) key its own
``numpy.random.Generator(PCG64(SeedSequence(seed, spawn_key=key)))``; a round of conventional FL at
D = 1000 builds 1000 of them to draw the minibatches (``Generator.choice(n, b, replace=False)``),
~15 microseconds of NumPy each (issue 12). This module runs the same three algorithms on vectors of keys
with NumPy array arithmetic, so the draws are the same numbers:

* ``SeedSequence`` (O'Neill's seed_seq hash, NumPy's ``bit_generator.pyx``): the entropy words of
  each key are mixed into a 4-word pool with ``hashmix`` / ``mix``, and ``generate_state(4, uint64)``
  expands the pool;
* ``PCG64`` (O'Neill, "PCG: A family of simple fast space-efficient statistically good algorithms for
  random number generation", 2014; XSL-RR output on a 128-bit LCG): seeded from the four words with
  ``pcg_setseq_128_srandom_r``, its 32-bit draws buffered in halves as NumPy's ``pcg64_next32``;
* ``Generator.choice(n, size, replace=False)`` for ``n <= 10000``: Floyd's algorithm with Lemire's
  bounded integers (``random_bounded_uint64``), then a Fisher-Yates shuffle of the sample with the
  same bounded integers.

128-bit products are formed from 32-bit limbs in uint64 arrays (wrapping arithmetic).
``tests/test_batched.py`` compares every function with the installed NumPy's on many keys (verified with NumPy 2.4,
the range pyproject.toml pins); the callers use it only where it applies (:func:`supported`) and fall back to
NumPy's objects otherwise.
"""

from __future__ import annotations

import numpy as np

__all__ = ["seed_states", "PCG64Batch", "choice_without_replacement", "supported", "key_words", "COMPILED"]

_M32 = np.uint64(0xFFFFFFFF)
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = np.uint32(0xCA01F9DD)
_MIX_MULT_R = np.uint32(0x4973F715)
_POOL = 4
#: PCG64's default multiplier 2549297995355413924 * 2^64 + 4865540595714422341, as (high, low).
_MUL_HI = np.uint64(2549297995355413924)
_MUL_LO = np.uint64(4865540595714422341)


def _words(value: int) -> list[int]:
    """NumPy's ``_int_to_uint32_array``: little-endian 32-bit words of a non-negative int (0 -> [0])."""
    if value < 0:
        raise ValueError(f"entropy must be non-negative, got {value}")
    if value == 0:
        return [0]
    out = []
    while value:
        out.append(value & 0xFFFFFFFF)
        value >>= 32
    return out


def key_words(seed: int, spawn_key: tuple[int, ...]) -> list[int]:
    """The assembled entropy of ``SeedSequence(seed, spawn_key=spawn_key)`` (NumPy's ``get_assembled_entropy``)."""
    run = _words(int(seed))
    spawn = [w for part in spawn_key for w in _words(int(part))]
    if spawn and len(run) < _POOL:
        run = run + [0] * (_POOL - len(run))
    return run + spawn


def seed_states(entropy: np.ndarray, *, compiled: bool | None = None) -> np.ndarray:
    """``SeedSequence(...).generate_state(4, np.uint64)`` of many keys whose assembled entropy is ``entropy``.

    Parameters
    ----------
    entropy : ndarray of uint32, (K, L)
        Row ``k``: the assembled entropy words of key ``k`` (:func:`key_words`); all keys of one call
        have the same number ``L`` of words.
    compiled : bool, optional
        Use the compiled loop (default :data:`COMPILED`; the same words) or NumPy arrays.

    Returns
    -------
    ndarray of uint64, (K, 4)
        The four state words NumPy's ``PCG64`` is seeded with.
    """
    ent = np.asarray(entropy, dtype=np.uint32).astype(np.uint64)     # 32-bit values held in uint64
    K, L = ent.shape
    if COMPILED if compiled is None else compiled:
        out = np.empty((K, 4), dtype=np.uint64)
        _nb_seed_states(ent, out)
        return out
    same = ~(ent != ent[:1]).any(axis=0)
    # a column equal for every key is mixed once (a (1,) array): NumPy broadcasts it where keys differ
    cols = [ent[:1, i] if same[i] else ent[:, i] for i in range(L)]
    hc = _INIT_A
    s16 = np.uint64(16)

    def hashmix(value: np.ndarray) -> np.ndarray:
        """NumPy's ``SeedSequence`` ``hashmix`` on a column of uint32 words (advances the shared ``hc``)."""
        nonlocal hc
        value = value ^ np.uint64(hc)
        hc = (hc * _MULT_A) & 0xFFFFFFFF
        value = (value * np.uint64(hc)) & _M32
        return value ^ (value >> s16)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """NumPy's ``SeedSequence`` ``mix`` of two columns of uint32 words."""
        r = (x * np.uint64(_MIX_MULT_L) - y * np.uint64(_MIX_MULT_R)) & _M32
        return r ^ (r >> s16)

    pool = [hashmix(cols[i]) if i < L else hashmix(np.zeros(1, dtype=np.uint64)) for i in range(_POOL)]
    for i_src in range(_POOL):
        for i_dst in range(_POOL):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
    for i_src in range(_POOL, L):
        for i_dst in range(_POOL):
            pool[i_dst] = mix(pool[i_dst], hashmix(cols[i_src]))
    hb = _INIT_B
    state = []
    for i_dst in range(8):
        v = pool[i_dst % _POOL] ^ np.uint64(hb)
        hb = (hb * _MULT_B) & 0xFFFFFFFF
        v = (v * np.uint64(hb)) & _M32
        state.append(v ^ (v >> s16))
    out = np.empty((K, 4), dtype=np.uint64)
    for w in range(4):                                      # little-endian pairs of 32-bit words
        out[:, w] = state[2 * w] | (state[2 * w + 1] << np.uint64(32))
    return out


def _mul64(a: np.ndarray, b: np.ndarray | np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """The 128-bit product of uint64 arrays as (high, low) words."""
    a_lo, a_hi = a & _M32, a >> np.uint64(32)
    b_lo, b_hi = b & _M32, b >> np.uint64(32)
    ll = a_lo * b_lo
    lh = a_lo * b_hi
    hl = a_hi * b_lo
    hh = a_hi * b_hi
    mid = (ll >> np.uint64(32)) + (lh & _M32) + (hl & _M32)
    low = (ll & _M32) | (mid << np.uint64(32))
    high = hh + (lh >> np.uint64(32)) + (hl >> np.uint64(32)) + (mid >> np.uint64(32))
    return high, low


class PCG64Batch:
    """``K`` independent NumPy ``PCG64`` generators stepped together (module docstring).

    Parameters
    ----------
    words : ndarray of uint64, (K, 4)
        Each generator's seed words (:func:`seed_states`): state ``words[0] * 2^64 + words[1]``,
        increment ``words[2] * 2^64 + words[3]``, as NumPy's ``pcg64_set_seed``.
    """

    def __init__(self, words: np.ndarray) -> None:
        words = np.asarray(words, dtype=np.uint64)
        self.inc_hi = (words[:, 2] << np.uint64(1)) | (words[:, 3] >> np.uint64(63))
        self.inc_lo = (words[:, 3] << np.uint64(1)) | np.uint64(1)
        self.hi = np.zeros(len(words), dtype=np.uint64)
        self.lo = np.zeros(len(words), dtype=np.uint64)
        all_ = np.arange(len(words))
        self._step(all_)
        lo = self.lo + words[:, 1]
        self.hi = self.hi + words[:, 0] + (lo < self.lo).astype(np.uint64)
        self.lo = lo
        self._step(all_)
        self.has32 = np.zeros(len(words), dtype=bool)
        self.buf32 = np.zeros(len(words), dtype=np.uint64)

    def _step(self, sel: np.ndarray) -> None:
        """``state = state * MULT + inc (mod 2^128)`` for generators ``sel``."""
        hi, lo = self.hi[sel], self.lo[sel]
        p_hi, p_lo = _mul64(lo, _MUL_LO)
        p_hi = p_hi + lo * _MUL_HI + hi * _MUL_LO
        new_lo = p_lo + self.inc_lo[sel]
        self.hi[sel] = p_hi + self.inc_hi[sel] + (new_lo < p_lo).astype(np.uint64)
        self.lo[sel] = new_lo

    def next64(self, sel: np.ndarray) -> np.ndarray:
        """The next 64-bit output (XSL-RR) of generators ``sel`` (``pcg64_random_r``)."""
        self._step(sel)
        hi, lo = self.hi[sel], self.lo[sel]
        x = hi ^ lo
        rot = hi >> np.uint64(58)
        return (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))

    def _next64_all(self) -> np.ndarray:
        """:meth:`next64` of every generator (whole arrays, no indexing)."""
        hi, lo = self.hi, self.lo
        p_hi, p_lo = _mul64(lo, _MUL_LO)
        p_hi += lo * _MUL_HI
        p_hi += hi * _MUL_LO
        new_lo = p_lo + self.inc_lo
        p_hi += self.inc_hi
        p_hi += (new_lo < p_lo)
        self.hi, self.lo = p_hi, new_lo
        x = p_hi ^ new_lo
        rot = p_hi >> np.uint64(58)
        return (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))

    def next32_all(self) -> np.ndarray:
        """:meth:`next32` of every generator, without indexing while their buffers agree."""
        has = self.has32
        if not has.any():
            v = self._next64_all()
            self.buf32 = v >> np.uint64(32)
            self.has32 = np.ones(len(v), dtype=bool)
            return v & _M32
        if has.all():
            self.has32 = np.zeros(len(has), dtype=bool)
            return self.buf32
        return self.next32(np.arange(len(has)))

    def next32(self, sel: np.ndarray) -> np.ndarray:
        """The next 32-bit draw of generators ``sel`` (``pcg64_next32``: halves of a 64-bit output), as uint64."""
        out = np.empty(len(sel), dtype=np.uint64)
        has = self.has32[sel]
        if has.any():
            s = sel[has]
            out[has] = self.buf32[s]
            self.has32[s] = False
        if not has.all():
            s = sel[~has]
            v = self.next64(s)
            out[~has] = v & _M32
            self.buf32[s] = v >> np.uint64(32)
            self.has32[s] = True
        return out


def _bounded_lemire(gen: PCG64Batch, sel: np.ndarray | None, rng: int) -> np.ndarray:
    """``random_bounded_uint64(0, rng)`` for ``rng < 2^32 - 1`` (Lemire's method on 32-bit draws), for
    generators ``sel`` (None: all)."""
    if rng == 0:
        return np.zeros(len(gen.hi) if sel is None else len(sel), dtype=np.uint64)
    excl = np.uint64(rng + 1)
    if sel is None:
        m = gen.next32_all() * excl
        sel = np.arange(len(m))
    else:
        m = gen.next32(sel) * excl
    left = m & _M32
    threshold = np.uint64((0xFFFFFFFF - rng) % (rng + 1))
    bad = left < threshold                          # (left < excl is implied whenever left < threshold)
    while bad.any():
        pos = np.flatnonzero(bad)
        m2 = gen.next32(sel[pos]) * excl
        m[pos] = m2
        bad[pos] = (m2 & _M32) < threshold
    return m >> np.uint64(32)


try:  # a compiled loop (numba ships with galois); the NumPy arrays below compute the same values
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

#: Whether :func:`choice_without_replacement` may use the compiled kernel (tests compare both).
COMPILED = _numba is not None

if _numba is not None:
    @_numba.njit(cache=True)
    def _nb_mul64(a, b):  # pragma: no cover - compiled
        m32 = np.uint64(0xFFFFFFFF)
        s32 = np.uint64(32)
        a_lo, a_hi = a & m32, a >> s32
        b_lo, b_hi = b & m32, b >> s32
        ll = a_lo * b_lo
        lh = a_lo * b_hi
        hl = a_hi * b_lo
        mid = (ll >> s32) + (lh & m32) + (hl & m32)
        return a_hi * b_hi + (lh >> s32) + (hl >> s32) + (mid >> s32), (ll & m32) | (mid << s32)

    @_numba.njit(cache=True)
    def _nb_seed_states(ent, out):  # pragma: no cover - compiled
        # seed_states key by key: NumPy's SeedSequence mix_entropy and generate_state(4, uint64), uint32 words
        # held in uint64 (every product and difference reduced mod 2^32; constants typed uint64 throughout)
        m32 = np.uint64(0xFFFFFFFF)
        s16 = np.uint64(16)
        s32 = np.uint64(32)
        mult_a = np.uint64(0x931E8875)
        mult_b = np.uint64(0x58F38DED)
        mix_l = np.uint64(0xCA01F9DD)
        mix_r = np.uint64(0x4973F715)
        n_keys, n_words = ent.shape
        pool = np.empty(4, dtype=np.uint64)
        state = np.empty(8, dtype=np.uint64)
        for k in range(n_keys):
            hc = np.uint64(0x43B0D7E5)
            for i in range(4):                         # hashmix of the first words (0 past the entropy)
                v = ent[k, i] if i < n_words else np.uint64(0)
                v = v ^ hc
                hc = (hc * mult_a) & m32
                v = (v * hc) & m32
                pool[i] = v ^ (v >> s16)
            for i_src in range(4):
                for i_dst in range(4):
                    if i_src != i_dst:
                        v = pool[i_src] ^ hc
                        hc = (hc * mult_a) & m32
                        v = (v * hc) & m32
                        v = v ^ (v >> s16)
                        r = (pool[i_dst] * mix_l - v * mix_r) & m32
                        pool[i_dst] = r ^ (r >> s16)
            for i_src in range(4, n_words):
                for i_dst in range(4):
                    v = ent[k, i_src] ^ hc
                    hc = (hc * mult_a) & m32
                    v = (v * hc) & m32
                    v = v ^ (v >> s16)
                    r = (pool[i_dst] * mix_l - v * mix_r) & m32
                    pool[i_dst] = r ^ (r >> s16)
            hb = np.uint64(0x8B51F9DD)
            for i_dst in range(8):
                v = pool[i_dst % 4] ^ hb
                hb = (hb * mult_b) & m32
                v = (v * hb) & m32
                state[i_dst] = v ^ (v >> s16)
            for w in range(4):                         # little-endian pairs of 32-bit words
                out[k, w] = state[2 * w] | (state[2 * w + 1] << s32)

    @_numba.njit(cache=True)
    def _nb_choice(words, n, size, out):  # pragma: no cover - compiled
        m32 = np.uint64(0xFFFFFFFF)
        one = np.uint64(1)
        mul_hi = np.uint64(2549297995355413924)
        mul_lo = np.uint64(4865540595714422341)
        taken = np.zeros(n, dtype=np.int64)            # stamp k + 1: value held by generator k
        for k in range(words.shape[0]):
            inc_hi = (words[k, 2] << one) | (words[k, 3] >> np.uint64(63))
            inc_lo = (words[k, 3] << one) | one
            hi = inc_hi                                # step from state 0: state = inc
            lo = inc_lo
            nlo = lo + words[k, 1]
            hi = hi + words[k, 0] + (one if nlo < lo else np.uint64(0))
            lo = nlo
            p_hi, p_lo = _nb_mul64(lo, mul_lo)
            p_hi = p_hi + lo * mul_hi + hi * mul_lo
            lo = p_lo + inc_lo
            hi = p_hi + inc_hi + (one if lo < p_lo else np.uint64(0))
            has = False
            buf = np.uint64(0)
            draws = 2 * size - 1
            t = 0
            while t < draws:
                if t < size:
                    j = n - size + t
                else:
                    j = draws - t                      # shuffle: i = size - 1 .. 1
                rng = np.uint64(j)
                if j == 0:
                    val = np.uint64(0)
                else:
                    excl = rng + one
                    threshold = (m32 - rng) % excl
                    while True:
                        if has:
                            u = buf
                            has = False
                        else:
                            p_hi, p_lo = _nb_mul64(lo, mul_lo)
                            p_hi = p_hi + lo * mul_hi + hi * mul_lo
                            lo = p_lo + inc_lo
                            hi = p_hi + inc_hi + (one if lo < p_lo else np.uint64(0))
                            x = hi ^ lo
                            rot = hi >> np.uint64(58)
                            v = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
                            u = v & m32
                            buf = v >> np.uint64(32)
                            has = True
                        m = u * excl
                        if (m & m32) >= threshold:
                            break
                    val = m >> np.uint64(32)
                if t < size:                           # Floyd
                    iv = np.int64(val)
                    if taken[iv] == k + 1:
                        iv = j
                    taken[iv] = k + 1
                    out[k, t] = iv
                else:                                  # swap out[k, i] with out[k, val]
                    i = j
                    a = out[k, np.int64(val)]
                    out[k, np.int64(val)] = out[k, i]
                    out[k, i] = a
                t += 1


def supported(n: int, size: int) -> bool:
    """Whether :func:`choice_without_replacement` reproduces ``choice(n, size, replace=False)`` (Floyd's branch)."""
    return 0 < size <= n <= 10000


def choice_without_replacement(words: np.ndarray, n: int, size: int, *, compiled: bool | None = None) -> np.ndarray:
    """``Generator.choice(n, size, replace=False)`` of fresh ``PCG64`` generators (NumPy's Floyd branch).

    Parameters
    ----------
    words : ndarray of uint64, (K, 4)
        The generators' seed words (:func:`seed_states`).
    n, size : int
    compiled : bool, optional
        Use the compiled kernel (default :data:`COMPILED`) or the NumPy arrays of :class:`PCG64Batch`.

    Returns
    -------
    ndarray of int64, (K, size)

    Raises
    ------
    ValueError
        Outside :func:`supported`.
    """
    if not supported(n, size):
        raise ValueError(f"choice_without_replacement reproduces NumPy only for 0 < size <= n <= 10000, "
                         f"got n = {n}, size = {size}")
    words = np.ascontiguousarray(words, dtype=np.uint64)
    K = len(words)
    if COMPILED if compiled is None else compiled:
        out = np.empty((K, size), dtype=np.int64)
        _nb_choice(words, n, size, out)
        return out
    gen = PCG64Batch(words)
    idx = np.empty((K, size), dtype=np.int64)
    taken = np.zeros(K * n, dtype=bool)                 # row k: the values generator k holds so far
    base = np.arange(K, dtype=np.int64) * n
    for t, j in enumerate(range(n - size, n)):          # Floyd: value in [0, j], or j if already taken
        val = _bounded_lemire(gen, None, j).astype(np.int64)
        val[taken[base + val]] = j
        taken[base + val] = True
        idx[:, t] = val
    flat = idx.reshape(-1)
    base = np.arange(K, dtype=np.int64) * size
    for i in range(size - 1, 0, -1):                    # shuffle: Fisher-Yates from the end
        at = base + _bounded_lemire(gen, None, i).astype(np.int64)
        a = flat[at]
        flat[at] = idx[:, i]
        idx[:, i] = a
    return idx
