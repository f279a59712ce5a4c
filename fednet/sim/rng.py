"""Random streams: one root seed, independent streams per node and purpose, keyed timing draws.

Three kinds of randomness live here (DESIGN.md, "Randomness"):

* **Keyed timing draws** decide stragglers and losses. The ``index``-th draw of node ``node``
  for purpose ``purpose`` in round ``round`` is a fixed function of ``(seed, n_nodes, node,
  purpose, round, index)``: whatever other nodes, purposes or rounds draw, it does not move.
  Protocols therefore turn the *same* uniforms into their compute and link times, and two
  protocols run with one seed face the same stragglers and losses in every round (a paired
  comparison), even when they make different numbers of draws. A compute time uses a standard
  exponential (``-log1p(-U)``) scaled by the step's mean; a message's retransmissions invert the
  negative-binomial CDF at one uniform.
* **Sequential streams** (:meth:`Streams.generator`) for public randomness (data sampling,
  code matrices, topologies), one independent ``numpy.random.Generator`` per (node, purpose, ...)
  key, spawned from the root ``SeedSequence``.
* **Secret streams** (:meth:`Streams.secret`) for protocol secrets: one-time pads, masks, mask
  noise, Shamir / polynomial coefficients.  They never derive from the public seed: their root is
  128 bits of OS entropy (:func:`secrets.randbits`), or a ``secret_seed`` that the experimenter
  keeps apart from the study file (reproducible experiments), and the generator is Philox
  (a keyed counter-based generator, Salmon et al., SC 2011) rather than PCG64.  Anyone holding the
  study file regenerates every public draw but no secret.  Because masks and Shamir coefficients
  cancel exactly, the secret draws do not change a trace; CodedPaddedFL's full mode rounds each
  padded value within one unit of ``2^-f`` depending on its pad (README, "Threat model").

Implementation: for each ``(purpose, round)`` a block of uniforms of shape
``(n_nodes, width)`` is drawn from its own ``SeedSequence(seed, spawn_key=(0, purpose_id,
round, block))``; node ``i``'s ``j``-th draw is ``block[j // width][i, j % width]``. That costs
one generator per (purpose, round) rather than per draw; the price is that draws depend on the
number of nodes, so comparisons must use one network size (they always do).
"""

from __future__ import annotations

import bisect
import math
import os
import secrets
import zlib
from collections.abc import Mapping
from collections import OrderedDict

import numpy as np
from scipy import special

from fednet.errors import ConfigError

from . import pcg

__all__ = ["Streams", "purpose_id", "negative_binomial_from_uniform", "secret_seed_from_env", "SECRET_SEED_ENV"]

#: Environment variable holding a study's ``secret_seed`` (kept out of the public study file).
SECRET_SEED_ENV = "FEDNET_SECRET_SEED"

_KEYED = 0
_SEQUENTIAL = 1
_SECRET = 2


def purpose_id(purpose: str) -> int:
    """Stable non-negative integer for a purpose name (CRC-32; Python's ``hash`` is salted)."""
    if not isinstance(purpose, str) or not purpose:
        raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
    return zlib.crc32(purpose.encode("utf-8"))


def _key_part(part: object) -> int:
    if isinstance(part, str):
        return purpose_id(part)
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part >= 0:
        return int(part)
    raise ValueError(f"stream key parts must be strings or non-negative ints, got {part!r}")


def secret_seed_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The ``secret_seed`` of reproducible experiments, from ``$FEDNET_SECRET_SEED`` (None if unset).

    The secret seed lives outside the study file on purpose: the study file (and its public
    ``seeds``) may be published; whoever knows the secret seed can regenerate every pad and mask.

    Raises
    ------
    fednet.errors.ConfigError
        If the variable is set but is not an integer in [0, 2**63 - 1].
    """
    env = os.environ if environ is None else environ
    raw = env.get(SECRET_SEED_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise ConfigError(f"{SECRET_SEED_ENV} must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{SECRET_SEED_ENV} must be a non-negative integer, got {raw!r}")
    if value > 2**63 - 1:
        raise ConfigError(f"{SECRET_SEED_ENV} must be in [0, 2**63 - 1] (63 bits, as the public seeds), got {raw!r}")
    return value


#: ``(n, p) -> [nbdtr(0, n, 1 - p), nbdtr(1, n, 1 - p), ...]``: the negative-binomial CDFs that
#: :func:`negative_binomial_from_uniform` has evaluated, each as far as a uniform needed it (at most
#: :data:`_NB_TABLES` of them, least recently used first out).
_NB_CDF: OrderedDict[tuple[int, float], list[float]] = OrderedDict()
_NB_TABLES = 256
#: Longest stored CDF: beyond it (a quantile far in the tail of a message of many packets) the walk decides.
_NB_LENGTH = 4096


def _nb_cdf(n: int, p: float, u: float) -> list[float] | None:
    """The CDF ``[nbdtr(k, n, 1 - p) for k = 0 .. K]`` of (n, p), extended until its last value reaches ``u``;
    None where it is not non-decreasing or would exceed :data:`_NB_LENGTH` values (then the caller walks).

    ``nbdtr`` is a fixed function of ``(k, n, q)``, so a stored value is the one the walk of
    :func:`_nb_quantile_walk` would compute; on a non-decreasing table the walk ends at the one ``k`` with
    ``cdf[k] >= u`` and ``k = 0`` or ``cdf[k - 1] < u``, i.e. ``bisect_left(cdf, u)``: the same count, bit for bit.
    """
    key = (n, p)
    cdf = _NB_CDF.get(key)
    if cdf is None:
        cdf = _NB_CDF[key] = []
        if len(_NB_CDF) > _NB_TABLES:
            _NB_CDF.popitem(last=False)
    else:
        _NB_CDF.move_to_end(key)
    if cdf and cdf[-1] >= u:
        return cdf
    if cdf and cdf[-1] != cdf[-1]:             # a nan stopped it before
        return None
    q = 1.0 - p
    while not cdf or cdf[-1] < u:
        if len(cdf) >= _NB_LENGTH:
            return None
        v = float(special.nbdtr(len(cdf), n, q))
        if cdf and not v >= cdf[-1]:           # not non-decreasing (or nan): leave it to the walk
            cdf.append(float("nan"))
            return None
        cdf.append(v)
    return cdf


def negative_binomial_from_uniform(u: float, n: int, p: float) -> int:
    """Failures before ``n`` successes with success probability ``1 - p``, by CDF inversion at ``u``.

    The number of extra transmissions of a message of ``n`` packets, each retransmitted until
    it gets through (per-packet loss probability ``p``), is ``X ~ NegBin(n, 1 - p)``: the sum of
    ``n`` geometric tries minus ``n`` (DESIGN.md, "Links"). Returns the smallest ``k`` with
    ``P(X <= k) >= u``, so one uniform decides the whole message.

    Parameters
    ----------
    u : float
        Uniform in [0, 1).
    n : int
        Number of packets (>= 1).
    p : float
        Per-packet loss probability in [0, 1).

    Returns
    -------
    int
        Number of retransmitted packets.
    """
    if p == 0.0 or u <= 0.0:
        return 0
    cdf = _nb_cdf(n, p, u)
    if cdf is not None:                        # the smallest k with P(X <= k) >= u, from the stored CDF
        return bisect.bisect_left(cdf, u)
    return _nb_quantile_walk(u, n, p)


def _nb_quantile_walk(u: float, n: int, p: float) -> int:
    """:func:`negative_binomial_from_uniform` for ``p > 0``, ``u > 0`` without a stored CDF: the continuous
    inverse as the first guess, then steps to the exact discrete quantile."""
    q = 1.0 - p
    guess = special.nbdtrik(u, n, q)
    k = max(0, int(math.ceil(guess)) if np.isfinite(guess) else 0)
    while k > 0 and special.nbdtr(k - 1, n, q) >= u:
        k -= 1
    while special.nbdtr(k, n, q) < u:
        k += 1
    return k


class Streams:
    """All randomness of one simulation, derived from one root seed.

    Parameters
    ----------
    seed : int
        Root seed (non-negative).
    n_nodes : int
        Number of nodes (devices and server) that draw keyed timing randomness.
    width : int, optional
        Draws per node in one block of a (purpose, round); more draws open further blocks.
    cache_rounds : int, optional
        How many (purpose, round) entries are kept (a few per round); an evicted round cannot be drawn
        again (an error, never a silent repeat of draws).
    secret_seed : int, optional
        Root of the secret streams (:meth:`secret`) for reproducible experiments; must differ from
        ``seed``.  Default: 128 bits of OS entropy drawn once per ``Streams`` (secrets differ from
        run to run, traces do not).

    Raises
    ------
    ValueError
        For a negative seed or a non-positive ``n_nodes``.
    fednet.errors.ConfigError
        For a negative ``secret_seed`` or one equal to ``seed``.
    """

    def __init__(self, seed: int, n_nodes: int, *, width: int = 8, cache_rounds: int = 256,
                 secret_seed: int | None = None) -> None:
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if secret_seed is not None:
            if isinstance(secret_seed, bool) or not isinstance(secret_seed, (int, np.integer)) or secret_seed < 0:
                raise ConfigError(f"secret_seed must be a non-negative integer, got {secret_seed!r}")
            if int(secret_seed) == int(seed):
                raise ConfigError(f"secret_seed must differ from the public seed {seed}: secrets derived "
                                  "from the public seed can be regenerated by anyone holding the study file")
        self.secret_seed = None if secret_seed is None else int(secret_seed)
        # the public seed is mixed in so that one secret_seed serves a whole study of several seeds
        self._secret_entropy = secrets.randbits(128) if secret_seed is None else [int(secret_seed), int(seed)]
        if n_nodes < 1:
            raise ValueError(f"n_nodes must be positive, got {n_nodes}")
        self.seed = int(seed)
        self.n_nodes = int(n_nodes)
        self.width = int(width)
        self._cache_rounds = int(cache_rounds)
        # (purpose_id, round) -> [blocks list, per-node draw counters]
        self._entries: OrderedDict[tuple[int, int], tuple[list[np.ndarray], np.ndarray]] = OrderedDict()
        self._evicted: set[tuple[int, int]] = set()

    # -- keyed draws --------------------------------------------------------------------
    def _entry(self, pid: int, round: int) -> tuple[list[np.ndarray], np.ndarray]:
        key = (pid, round)
        entry = self._entries.get(key)
        if entry is None:
            if key in self._evicted:
                raise RuntimeError(
                    f"keyed draws of round {round} were evicted (more than {self._cache_rounds} "
                    "rounds in flight); raise cache_rounds"
                )
            entry = ([], np.zeros(self.n_nodes, dtype=np.int64))
            self._entries[key] = entry
            if len(self._entries) > self._cache_rounds:
                old, _ = self._entries.popitem(last=False)
                self._evicted.add(old)
        return entry

    def _block(self, pid: int, round: int, blocks: list[np.ndarray], b: int) -> np.ndarray:
        while len(blocks) <= b:
            ss = np.random.SeedSequence(self.seed, spawn_key=(_KEYED, pid, round, len(blocks)))
            blocks.append(np.random.Generator(np.random.PCG64(ss)).random((self.n_nodes, self.width)))
        return blocks[b]

    def uniform(self, node: int, purpose: str, round: int) -> float:
        """The next keyed standard uniform of ``node`` for ``purpose`` in ``round``.

        Parameters
        ----------
        node : int
            Node index in ``[0, n_nodes)``.
        purpose : str
            What the draw decides, e.g. ``"compute"``, ``"uplink"``, ``"downlink"``, ``"dropout"``.
        round : int
            Round number (0 for a protocol's setup phase).

        Returns
        -------
        float
            A draw in [0, 1).
        """
        if not 0 <= node < self.n_nodes:
            raise ValueError(f"node must be in [0, {self.n_nodes}), got {node}")
        if round < 0:
            raise ValueError(f"round must be non-negative, got {round}")
        pid = purpose_id(purpose)
        blocks, counts = self._entry(pid, round)
        j = int(counts[node])
        counts[node] = j + 1
        return float(self._block(pid, round, blocks, j // self.width)[node, j % self.width])

    def uniforms(self, nodes: np.ndarray, purpose: str, round: int, *, advance: bool = True,
                 ahead: int = 0) -> np.ndarray:
        """The next keyed uniforms of several distinct nodes at once: ``uniform(i, purpose, round)`` for each.

        Parameters
        ----------
        nodes : ndarray of int, (n,)
            Distinct node indices in ``[0, n_nodes)``.
        purpose : str
        round : int
        advance : bool
            False: only look at the draws (each node's stream stays where it is; a later
            :meth:`advance` of some of the nodes consumes them), for a step that decides afterwards
            which nodes really draw.
        ahead : int
            With ``advance=False``: look ``ahead`` draws past the next one (the ``ahead + 1``-th draw each
            node would take from now on).

        Returns
        -------
        ndarray of float64, (n,)
            Element ``t`` equals what ``uniform(nodes[t], purpose, round)`` would have returned (and
            each node's stream advances by one, as it would).

        Raises
        ------
        ValueError
            For a node out of range, repeated nodes, or a negative round.
        """
        nodes = np.asarray(nodes, dtype=np.intp)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.n_nodes):
            raise ValueError(f"nodes must be in [0, {self.n_nodes}), got {nodes.min()}..{nodes.max()}")
        if round < 0:
            raise ValueError(f"round must be non-negative, got {round}")
        if nodes.size > 1 and not (nodes[1:] > nodes[:-1]).all() and np.unique(nodes).size != nodes.size:
            raise ValueError("nodes must be distinct (one draw per node)")    # ascending: distinct without a sort
        if ahead and (advance or int(ahead) != ahead or ahead < 0):
            raise ValueError(f"ahead must be a non-negative integer with advance=False, got {ahead!r}")
        pid = purpose_id(purpose)
        if advance or (pid, round) in self._entries or (pid, round) in self._evicted:
            blocks, counts = self._entry(pid, round)
        else:                                   # a look that leaves no entry behind (as if never asked)
            blocks, counts = [], np.zeros(self.n_nodes, dtype=np.int64)
        j = counts[nodes] + int(ahead)
        if advance:
            counts[nodes] = j + 1
        b, col = np.divmod(j, self.width)
        if nodes.size and b.min() == b.max():             # one block (the common case): no selection
            return self._block(pid, round, blocks, int(b[0]))[nodes, col]
        out = np.empty(nodes.size)
        for bb in np.unique(b):
            sel = b == bb
            out[sel] = self._block(pid, round, blocks, int(bb))[nodes[sel], col[sel]]
        return out

    def uniforms_in_turn(self, nodes: np.ndarray, purpose: str, round: int) -> np.ndarray:
        """``[uniform(i, purpose, round) for i in nodes]`` at once: the draws taken in the order of ``nodes``.

        Unlike :meth:`uniforms`, a node may repeat: its ``c``-th occurrence takes its ``c``-th next draw
        (a link serving several messages in turn).

        Parameters
        ----------
        nodes : ndarray of int, (n,)
            Node indices in ``[0, n_nodes)``, in the order the draws are taken.
        purpose : str
        round : int

        Returns
        -------
        ndarray of float64, (n,)
            Element ``t`` equals what the ``t``-th call of ``uniform(nodes[t], purpose, round)`` in that
            loop would return; each node's stream advances by its number of occurrences.

        Raises
        ------
        ValueError
            For a node out of range or a negative round.
        """
        nodes = np.asarray(nodes, dtype=np.intp).reshape(-1)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.n_nodes):
            raise ValueError(f"nodes must be in [0, {self.n_nodes}), got {nodes.min()}..{nodes.max()}")
        if round < 0:
            raise ValueError(f"round must be non-negative, got {round}")
        pid = purpose_id(purpose)
        blocks, counts = self._entry(pid, round)
        if not nodes.size:
            return np.empty(0)
        order = np.argsort(nodes, kind="stable")
        ranked = nodes[order]
        starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
        lengths = np.diff(np.r_[starts, nodes.size])
        occurrence = np.empty(nodes.size, dtype=np.int64)
        occurrence[order] = np.arange(nodes.size) - np.repeat(starts, lengths)
        j = counts[nodes] + occurrence
        counts[ranked[starts]] += lengths
        b, col = np.divmod(j, self.width)
        lo, hi = int(b.min()), int(b.max())
        held = np.stack([self._block(pid, round, blocks, bb) for bb in range(lo, hi + 1)])
        return held[b - lo, nodes, col]

    def uniforms_repeated(self, nodes: np.ndarray, times: int, purpose: str, round: int) -> np.ndarray:
        """``uniforms_in_turn(np.tile(nodes, times), purpose, round).reshape(times, -1)`` without the sort: ``times``
        draws of each of the distinct ``nodes``, taken in turn (a link serving one message in each of ``times`` steps).

        Parameters
        ----------
        nodes : ndarray of int, (n,)
            Distinct node indices in ``[0, n_nodes)``.
        times : int
            Draws per node (``>= 0``).
        purpose : str
        round : int

        Returns
        -------
        ndarray of float64, (times, n)
            Row ``t``, column ``k``: node ``nodes[k]``'s ``t``-th next draw; each node's stream advances by ``times``.

        Raises
        ------
        ValueError
            For a node out of range, repeated nodes, a negative ``times`` or a negative round.
        """
        nodes = np.asarray(nodes, dtype=np.intp).reshape(-1)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.n_nodes):
            raise ValueError(f"nodes must be in [0, {self.n_nodes}), got {nodes.min()}..{nodes.max()}")
        if round < 0:
            raise ValueError(f"round must be non-negative, got {round}")
        if times < 0:
            raise ValueError(f"times must be non-negative, got {times}")
        if nodes.size > 1 and not (nodes[1:] > nodes[:-1]).all() and np.unique(nodes).size != nodes.size:
            raise ValueError("nodes must be distinct")                      # ascending: distinct without a sort
        pid = purpose_id(purpose)
        blocks, counts = self._entry(pid, round)
        if not nodes.size or not times:
            return np.empty((int(times), nodes.size))
        first = counts[nodes]
        counts[nodes] += times
        if first.min() == first.max():                  # every node at one draw: columns of each block, transposed
            j0, w = int(first[0]), self.width
            span = int(nodes[0]) + nodes.size == int(nodes[-1]) + 1 and bool((np.diff(nodes) == 1).all())
            rows = slice(int(nodes[0]), int(nodes[-1]) + 1) if span else nodes
            out = np.empty((times, nodes.size))
            for bb in range(j0 // w, (j0 + times - 1) // w + 1):
                c0, c1 = max(j0, bb * w), min(j0 + times, (bb + 1) * w)
                out[c0 - j0:c1 - j0] = self._block(pid, round, blocks, bb)[rows, c0 - bb * w:c1 - bb * w].T
            return out
        j = first[None, :] + np.arange(times)[:, None]
        b, col = np.divmod(j, self.width)
        lo, hi = int(b.min()), int(b.max())
        held = np.stack([self._block(pid, round, blocks, bb) for bb in range(lo, hi + 1)])
        return held[b - lo, nodes[None, :], col]

    def advance(self, nodes: np.ndarray, purpose: str, round: int, by: np.ndarray | int = 1) -> None:
        """Consume ``by`` keyed draws (default one) of each of ``nodes`` (distinct) for ``purpose`` in ``round``, as if drawn.

        Used after :meth:`uniforms` with ``advance=False`` for the nodes that really drew; ``by`` (an int, or
        one non-negative int per node) for nodes that drew several times.
        """
        nodes = np.asarray(nodes, dtype=np.intp)
        if not nodes.size:
            return
        _, counts = self._entry(purpose_id(purpose), round)
        counts[nodes] += by

    def standard_exponential(self, node: int, purpose: str, round: int) -> float:
        """The next keyed Exp(1) draw, ``-log1p(-U)`` of :meth:`uniform`."""
        return -math.log1p(-self.uniform(node, purpose, round))

    # -- sequential streams ---------------------------------------------------------------
    def generator(self, *key: str | int) -> np.random.Generator:
        """An independent generator for a key such as ``(node, "pads")`` or ``("topology",)``.

        The same key always gives the same stream; different keys give independent streams.
        """
        if not key:
            raise ValueError("generator() needs a key, e.g. (node, 'pads')")
        spawn_key = (_SEQUENTIAL,) + tuple(_key_part(p) for p in key)
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=spawn_key)))

    def choices(self, nodes: np.ndarray, purpose: str, more: tuple, n: int, size: int) -> np.ndarray:
        """``generator(node, purpose, *more).choice(n, size, replace=False)`` for each of ``nodes``, at once.

        The same numbers as NumPy's objects (:mod:`fednet.sim.pcg` runs ``SeedSequence``, ``PCG64`` and
        ``choice`` on vectors of keys); where that module does not apply
        (:func:`fednet.sim.pcg.supported`, or a key part of 2^32 or more) each node's generator is used.

        Parameters
        ----------
        nodes : ndarray of int, (K,)
        purpose : str
        more : tuple of str or int
            Further key parts (e.g. the round); the last may be an ndarray of ints, (K,): a part per node
            (e.g. each client's own iteration).
        n, size : int
            Population and sample size.

        Returns
        -------
        ndarray of int64, (K, size)
        """
        at = np.asarray(nodes).ravel()
        per_node = None
        if more and isinstance(more[-1], np.ndarray):
            per_node, more = np.asarray(more[-1]).ravel(), more[:-1]
            if per_node.shape != at.shape:
                raise ValueError(f"the per-node key part has shape {per_node.shape}, the nodes {at.shape}")
        parts = [_key_part(purpose)] + [_key_part(p) for p in more]
        if (pcg.supported(n, size) and at.size and at.dtype.kind in "iu" and max(parts) < 2 ** 32
                and 0 <= at.min() and at.max() < 2 ** 32 and (per_node is None or (
                    per_node.dtype.kind in "iu" and 0 <= per_node.min() and per_node.max() < 2 ** 32))):
            last = [] if per_node is None else [0]
            words = pcg.key_words(self.seed, (_SEQUENTIAL, 0, *parts, *last))   # node 0's key; one word a part
            entropy = np.tile(np.asarray(words, dtype=np.uint32), (at.size, 1))
            entropy[:, len(words) - len(parts) - len(last) - 1] = at
            if per_node is not None:
                entropy[:, -1] = per_node
            return pcg.choice_without_replacement(pcg.seed_states(entropy), n, size)
        nodes = [int(i) for i in at]
        lasts = [()] * len(nodes) if per_node is None else [(int(e),) for e in per_node]
        out = np.empty((len(nodes), size), dtype=np.int64)
        for k, i in enumerate(nodes):
            out[k] = self.generator(i, purpose, *more, *lasts[k]).choice(n, size=size, replace=False)
        return out

    # -- secret streams ---------------------------------------------------------------------
    def secret(self, *key: str | int) -> np.random.Generator:
        """An independent secret generator for a key such as ``(node, "pads")`` or ``(node, "masks", round)``.

        Seeded from the secret root (OS entropy, or ``secret_seed``), never from the public seed;
        the bit generator is Philox.  The same key gives the same stream within one ``Streams``
        (and across runs only with a fixed ``secret_seed``).

        Parameters
        ----------
        *key : str or non-negative int
            Node index, purpose, round, ... (at least one part).

        Returns
        -------
        numpy.random.Generator
        """
        if not key:
            raise ValueError("secret() needs a key, e.g. (node, 'pads')")
        spawn_key = (_SECRET,) + tuple(_key_part(p) for p in key)
        ss = np.random.SeedSequence(self._secret_entropy, spawn_key=spawn_key)
        return np.random.Generator(np.random.Philox(ss))
