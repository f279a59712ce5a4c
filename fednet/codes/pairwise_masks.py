"""The math of pairwise-mask secure aggregation (SecAgg, SecAgg+): pure functions, metered kernels inside.

Sources: Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Sec. 4 and Fig. 4 (the honest-but-curious
protocol, rounds 0-3: AdvertiseKeys, ShareKeys, MaskedInputCollection, Unmasking); Bell, Bonawitz, Gascon,
Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020 (SecAgg+:
the same rounds on a sparse k-regular communication graph, a user's neighbours ``N(u)`` instead of all users).
``protocols/secagg.py`` moves these values around.

Notation (Bonawitz et al.): user ``u`` holds two X25519 key pairs ``(c_u^SK, c_u^PK)`` (encryption of
shares) and ``(s_u^SK, s_u^PK)`` (pairwise masks) and a self-mask seed ``b_u`` (32 bytes).  ``U1 ⊇ U2 ⊇
U3 ⊇ U4`` are the users alive after rounds 0-3.  In round 1, ``u`` Shamir-shares ``b_u || s_u^SK`` (as
field elements, :func:`encode_secret`) with threshold ``t`` at the points ``v + 1`` of its neighbours ``v
∈ N(u) ∩ U1`` and sends each share AEAD-encrypted under ``c_uv = KA(c_u^SK, c_v^PK)``.  In round 2,

    y_u = x_u + PRG(b_u) + sum_{v ∈ N(u) ∩ U2} gamma_uv PRG(s_uv),   s_uv = KA(s_u^SK, s_v^PK),

``gamma_uv = +1`` for ``u < v`` and ``-1`` for ``u > v`` (Bonawitz's sign convention mirrored; any
antisymmetric choice cancels), all in GF(p).  In round 3, each ``u ∈ U4`` sends, for each ``v ∈ N(u) ∩
U2``, its share of ``b_v`` if ``v ∈ U3`` and of ``s_v^SK`` otherwise; from ``t`` shares each the server
rebuilds the seeds and removes the masks:

    sum_{u ∈ U3} x_u = sum_{u ∈ U3} y_u - sum_{u ∈ U3} PRG(b_u)
                       - sum_{v ∈ U2 \\ U3} sum_{u ∈ N(v) ∩ U3} gamma_uv PRG(s_uv).

Shares and the secrets live in the aggregation field GF(p) (``p > N`` for distinct points): a 32-byte
secret is ``ceil(32 / w)`` elements of ``w = floor((bitlen(p) - 1) / 8)`` bytes each.

Costs (checked against the kernels in every full-mode step; ``m`` elements of input, ``K`` =
:func:`secret_elements` per secret, ``e`` = :func:`element_bytes`, ``n`` the number of neighbours involved):

========================= ======================================= ===================================
step                      crypto operations                       MACs
========================= ======================================= ===================================
:func:`advertise`          2 key generations                       0
:func:`share_keys`         n KA, n AEAD messages of                n t 2K (Shamir encoding)
                           ``8 + 2 K e`` bytes
:func:`masked_input`       n KA, ``8 m (n + 1)`` PRG bytes          ``m (n + 1)`` (+ the gradient's)
:func:`unmask_response`    n AEAD messages of ``8 + 2 K e`` bytes  0 (a selection)
:func:`unmask`             P KA, ``8 m (|U3| + P)`` PRG bytes       ``(|U3| - 1) m + |U2| t K + (|U3| + P) m``
========================= ======================================= ===================================

with ``P = sum_{v ∈ U2 \\ U3} |N(v) ∩ U3|`` (pairwise masks of dropped users the server recomputes).

The rounds on the wire (``protocols/secagg.py``; ``K`` = :func:`secret_elements`, ``e`` = :func:`element_bytes`)
    0. **AdvertiseKeys.** Every available user uploads its two 32-byte public keys (2 elements of 256 bits); the
       server sends each user of ``U1`` (those whose keys arrived) its neighbours' keys (``2 |N(u) ∩ U1|``
       elements of 256 bits).
    1. **ShareKeys.** The bundle of ciphertexts goes up once and the server forwards to each user the ciphertexts
       addressed to it (:func:`share_plain_bytes` ``= 8 + 2 K e`` bytes and a 16-byte tag each).  ``U2``: users
       whose ciphertexts the server received.
    2. **MaskedInputCollection.** The server sends the model (float32, as conventional FL); user ``u`` computes
       its minibatch gradient (eq. 3 of Schlegel et al.), quantises it into GF(p) (``round(G 2^quant_bits)``,
       negatives to ``p + v``) and uploads ``y_u`` (``d c`` elements of :func:`field_bits` bits;
       :func:`masked_gradient`).  ``U3``: users whose ``y_u`` arrived.
    3. **Unmasking.** The server sends ``U3`` (``|U3|`` numbers of 32 bits) to its members; each responding user
       (``U4``) uploads, for each sender ``v``, its share of ``b_v`` (``v ∈ U3``) or of ``s_v^SK`` (``v``
       dropped), ``K`` elements each; the server rebuilds the seeds from ``t`` shares each, removes every mask
       and dequantises the sum of ``U3``'s gradients (:func:`unmask_gradients`).

    A user that drops in round 3 has sent ``y_u``: its input is in the sum (its self-mask is removed with the
    survivors' shares).  The aggregation fails when fewer than ``t`` users are left in rounds 1-3 (Bonawitz et
    al., Fig. 4), when a user of ``U1`` has fewer than ``t`` neighbours to share with, or when some secret the
    server needs has fewer than ``t`` shares among ``U4`` (:func:`share_holders`).

Parameters (:func:`check_parameters`)
    The field ``p`` (default :data:`P32`, the LightSecAgg baseline's) must hold the sum of ``N`` quantised
    gradients (a ``CapacityError`` naming ``p`` before training, and again on the data by
    :func:`fednet.algebra.quantize.quantize`).  Threshold ``t``: default :func:`default_threshold` ``= floor(n /
    2) + 1`` of the ``n`` share holders of a user (``n = N - 1`` in SecAgg, ``k`` in SecAgg+): an honest majority
    of the holders, so that at most ``n - t`` of a user's neighbours may drop and fewer than ``t`` colluders learn
    nothing (Bonawitz et al., Sec. 4/6 take ``t > n / 2``, needed against an active server; Bell et al., Sec.
    3-4, take the threshold a constant fraction of the degree).  SecAgg+ degree: default
    :func:`default_degree` ``= min(N - 1, 2 ceil(log2 N))`` (``O(log N)`` as Bell et al. require; their
    Theorem's constant depends on the tolerated dropout and corruption rates, left to the user: set ``k`` and
    ``t``).  The graph is ``networkx.hkn_harary_graph(k, N)`` relabelled by a uniformly random permutation drawn
    each epoch from the public stream (the server's choice in Bell et al.; :func:`harary_neighbours`).

Per user and epoch (no dropouts; ``n`` neighbours, ``m = d c``)
    2 key generations, ``2 n`` key agreements (``n`` for ``c_uv`` in round 1, reused in round 3; ``n`` for
    ``s_uv``), ``8 m (n + 1)`` PRG bytes, ``2 n`` AEAD messages (``n`` encryptions, ``n`` decryptions) of ``8 + 2
    K e`` bytes; MACs ``2 n t K`` (Shamir) ``+ 2 b_i d c`` (gradient) ``+ m (n + 1)`` (masking).  Server: with
    ``D`` users dropped after round 1 and before round 2, ``P`` key agreements and ``8 m (|U3| + P)`` PRG bytes;
    MACs ``(|U3| - 1) m + |U2| t K + (|U3| + P) m``.  The crypto time is charged as MAC-equivalents
    (:mod:`fednet.algebra.crypto_meter`).

What each party sees
    The server receives public keys, ciphertexts (stored and forwarded: ``relayed``), the masked inputs ``y_u``
    (uniform given their sum: ``tests/test_secagg.py``'s audit) and, per user, ``t`` shares of either its
    self-mask seed or its secret key, never both (Bonawitz et al., Thm. 6.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import networkx as nx
import numpy as np

from fednet.algebra.crypto import (KEY_BYTES, TAG_BYTES, aead_decrypt, aead_encrypt, aead_nonce, prg_bytes_for,
                                   prg_field, x25519_agree, x25519_keypair)
from fednet.algebra.crypto_meter import CryptoCounts
from fednet.algebra.fields import check_field_capacity, check_prime
from fednet.algebra.modp import add_mod, sub_mod, sum_mod
from fednet.algebra.quantize import dequantize, quantize
from fednet.codes.lightsecagg import quantised_gradient, sum_in_order
from fednet.codes.shamir import shamir_reconstruct, shamir_share
from fednet.errors import ConfigError
from fednet.learning.models import minibatch_gradient

__all__ = ["element_bytes", "chunk_bytes", "secret_elements", "encode_secret", "decode_secret", "share_plain_bytes",
           "advertise", "share_keys", "masked_input", "unmask_response", "unmask", "advertise_counts",
           "share_keys_counts", "share_keys_macs", "masked_input_counts", "unmask_response_counts",
           "unmask_counts", "unmask_macs", "check_secret_field", "expected_pairs", "field_bits", "P32",
           "check_mask_prime", "check_parameters", "default_threshold", "default_degree", "harary_degree",
           "complete_neighbours", "harary_neighbours", "masked_gradient", "masked_gradient_macs", "share_holders",
           "unmask_gradients", "restrict", "quantised_gradient_sum",
           "public_keys"]

#: Largest prime below 2**32 (the LightSecAgg baseline's field), the default ``p``.
P32 = 2**32 - 5


def check_secret_field(p: int, n_users: int) -> None:
    """The field must hold byte chunks of secrets (``p > 256``) and ``N`` distinct nonzero points (``p > N``).

    Raises
    ------
    ValueError
        Naming ``p``.
    """
    if int(p) <= max(256, n_users):
        raise ValueError(f"p = {p} too small: secrets are shared in byte chunks and {n_users} users need distinct "
                         f"points (p > max(256, N))")


def element_bytes(p: int) -> int:
    """Bytes of one GF(p) element in a plaintext share (``ceil(bitlen(p) / 8)``)."""
    return (int(p).bit_length() + 7) // 8


def chunk_bytes(p: int) -> int:
    """Bytes of a secret per field element: ``floor((bitlen(p) - 1) / 8)`` (each chunk below ``p``)."""
    return (int(p).bit_length() - 1) // 8


def secret_elements(p: int) -> int:
    """Field elements of a 32-byte secret, ``K = ceil(32 / chunk_bytes(p))``."""
    return -(-KEY_BYTES // chunk_bytes(p))


def encode_secret(secret: bytes, p: int) -> np.ndarray:
    """A 32-byte secret as ``K`` elements of GF(p), ``(K,)`` int64 (little-endian chunks)."""
    w, K = chunk_bytes(p), secret_elements(p)
    data = bytes(secret).ljust(w * K, b"\0")
    return np.array([int.from_bytes(data[i * w:(i + 1) * w], "little") for i in range(K)], dtype=np.int64)


def decode_secret(v: np.ndarray, p: int) -> bytes:
    """Inverse of :func:`encode_secret`.

    Raises
    ------
    ValueError
        If an element does not fit a chunk (a wrong reconstruction).
    """
    w = chunk_bytes(p)
    try:
        return b"".join(int(x).to_bytes(w, "little") for x in np.asarray(v))[:KEY_BYTES]
    except OverflowError:
        raise ValueError("reconstructed secret has an element beyond its chunk: too few or wrong shares") from None


def share_plain_bytes(p: int) -> int:
    """Plaintext bytes of one encrypted share: ``u``, ``v`` (4 bytes each) and ``2 K`` elements."""
    return 8 + 2 * secret_elements(p) * element_bytes(p)


def _field_bytes(v: np.ndarray, p: int) -> bytes:
    e = element_bytes(p)
    return b"".join(int(x).to_bytes(e, "little") for x in np.asarray(v))


def _bytes_field(b: bytes, p: int) -> np.ndarray:
    e = element_bytes(p)
    return np.array([int.from_bytes(b[i:i + e], "little") for i in range(0, len(b), e)], dtype=np.int64)


# -- round 0: AdvertiseKeys ---------------------------------------------------------------------------------------
def advertise_counts() -> CryptoCounts:
    """Round 0 of one user: two key generations."""
    return CryptoCounts(key_generations=2)


def advertise(c_secret: bytes, s_secret: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """Round 0: ``(c_u^SK, c_u^PK, s_u^SK, s_u^PK)`` from 32 secret bytes each (2 key generations)."""
    c_sk, c_pk = x25519_keypair(c_secret)
    s_sk, s_pk = x25519_keypair(s_secret)
    return c_sk, c_pk, s_sk, s_pk


# -- round 1: ShareKeys ---------------------------------------------------------------------------------------------
def share_keys_counts(n: int, p: int) -> CryptoCounts:
    """Round 1 of a user with ``n`` neighbours in U1: ``n`` key agreements, ``n`` AEAD messages."""
    return CryptoCounts(key_agreements=n, aead_messages=n, aead_bytes=n * share_plain_bytes(p))


def share_keys_macs(n: int, t: int, p: int) -> int:
    """MACs of :func:`share_keys`: the Shamir encoding of ``2 K`` elements into ``n`` shares, ``n t 2K``."""
    return n * t * 2 * secret_elements(p)


def share_keys(u: int, b_seed: bytes, s_sk: bytes, c_sk: bytes, neighbours: Sequence[int],
               c_pks: Mapping[int, bytes], t: int, p: int, rng: np.random.Generator,
               epoch: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Round 1 of user ``u``: Shamir shares of ``b_u || s_u^SK``, each encrypted to its neighbour.

    Parameters
    ----------
    u : int
        The user (its share points are its neighbours' ``v + 1``).
    b_seed, s_sk, c_sk : bytes
        Its self-mask seed and secret keys (32 bytes each).
    neighbours : sequence of int
        ``N(u) ∩ U1`` (ascending), ``len >= t``.
    c_pks : mapping int -> bytes
        The neighbours' ``c_v^PK``.
    t : int
        Shamir threshold.
    p : int
        The field.
    rng : numpy.random.Generator
        Secret stream of the Shamir coefficients.
    epoch : int
        The round (nonces).

    Returns
    -------
    ciphertexts : dict int -> bytes
        ``e_uv`` for each neighbour (``share_plain_bytes(p) + 16`` bytes).
    keys : dict int -> bytes
        ``c_uv`` per neighbour (kept to decrypt in round 3).
    """
    neighbours = list(neighbours)
    secret = np.concatenate([encode_secret(b_seed, p), encode_secret(s_sk, p)])
    shares = shamir_share(secret, len(neighbours), t, p, rng, points=[v + 1 for v in neighbours])
    cts, keys = {}, {}
    for j, v in enumerate(neighbours):
        keys[v] = x25519_agree(c_sk, c_pks[v])
        plain = int(u).to_bytes(4, "little") + int(v).to_bytes(4, "little") + _field_bytes(shares[j], p)
        cts[v] = aead_encrypt(keys[v], aead_nonce(u, v, epoch), plain)
    return cts, keys


# -- round 2: MaskedInputCollection ----------------------------------------------------------------------------------
def masked_input_counts(n: int, m: int) -> CryptoCounts:
    """Round 2 of a user with ``n`` neighbours in U2 and ``m`` inputs: ``n`` KA, ``n + 1`` PRG expansions."""
    return CryptoCounts(key_agreements=n, prg_bytes=(n + 1) * prg_bytes_for(m))


def masked_input(x: np.ndarray, u: int, b_seed: bytes, s_sk: bytes, peers: Sequence[int],
                 s_pks: Mapping[int, bytes], p: int) -> np.ndarray:
    """Round 2: ``y_u = x_u + PRG(b_u) + sum_v gamma_uv PRG(s_uv)`` over GF(p), ``(m,)``; ``m (n + 1)`` MACs.

    ``x`` is the quantised input ``(m,)`` over GF(p), ``peers`` = ``N(u) ∩ U2``.
    """
    m = x.size
    y = add_mod(x, prg_field(b_seed, m, p), p)
    for v in sorted(peers):
        pv = prg_field(x25519_agree(s_sk, s_pks[v]), m, p)
        y = add_mod(y, pv, p) if u < v else sub_mod(y, pv, p)
    return y


# -- round 3: Unmasking ------------------------------------------------------------------------------------------------
def unmask_response_counts(n: int, p: int) -> CryptoCounts:
    """Round 3 of a user holding ``n`` ciphertexts (senders in U2): ``n`` AEAD decryptions."""
    return CryptoCounts(aead_messages=n, aead_bytes=n * share_plain_bytes(p))


def unmask_response(u: int, received: Mapping[int, bytes], keys: Mapping[int, bytes], survivors: set[int], p: int,
                    epoch: int) -> tuple[list[int], np.ndarray]:
    """Round 3 of user ``u``: decrypt each ``e_vu`` and return its share of ``b_v`` (``v ∈ U3``) or ``s_v^SK``.

    Parameters
    ----------
    received : mapping int -> bytes
        ``{v: e_vu}`` for ``v ∈ N(u) ∩ U2``.
    keys : mapping int -> bytes
        ``c_uv`` (from round 1).
    survivors : set of int
        U3.

    Returns
    -------
    senders : list of int
        The ``v`` in ascending order.
    shares : ndarray, (len(senders), K) over GF(p)

    Raises
    ------
    ValueError
        If a plaintext names other users than ``(v, u)`` (Bonawitz et al., Fig. 4, round 3).
    """
    K = secret_elements(p)
    senders = sorted(received)
    out = np.zeros((len(senders), K), dtype=np.int64)
    for j, v in enumerate(senders):
        plain = aead_decrypt(keys[v], aead_nonce(v, u, epoch), received[v])
        if int.from_bytes(plain[:4], "little") != v or int.from_bytes(plain[4:8], "little") != u:
            raise ValueError(f"user {u}: the share from {v} names other users")
        share = _bytes_field(plain[8:], p)
        out[j] = share[:K] if v in survivors else share[K:]
    return senders, out


def unmask_counts(m: int, n_survivors: int, pairs: int) -> CryptoCounts:
    """The server's round 3: ``P`` = ``pairs`` KA and ``|U3| + P`` PRG expansions of ``m`` elements."""
    return CryptoCounts(key_agreements=pairs, prg_bytes=(n_survivors + pairs) * prg_bytes_for(m))


def unmask_macs(m: int, n_survivors: int, n_shared: int, pairs: int, t: int, p: int) -> int:
    """MACs of :func:`unmask`: ``(|U3| - 1) m + |U2| t K + (|U3| + P) m``."""
    return (n_survivors - 1) * m + n_shared * t * secret_elements(p) + (n_survivors + pairs) * m


def unmask(masked: Mapping[int, np.ndarray], shares: Mapping[int, tuple[list[int], np.ndarray]],
           neighbours: Mapping[int, Sequence[int]], s_pks: Mapping[int, bytes], t: int, p: int) -> np.ndarray:
    """The server's round 3: rebuild the seeds from ``t`` shares each and remove the masks.

    Parameters
    ----------
    masked : mapping int -> ndarray (m,)
        ``y_u`` of the users of U3.
    shares : mapping int -> (holders, ndarray (r, K))
        For each ``v ∈ U2``: the users (indices) who sent a share of ``v``'s secret and the shares, ``r >= t``
        (of ``b_v`` for ``v ∈ U3``, of ``s_v^SK`` otherwise).
    neighbours : mapping int -> sequence of int
        ``N(v) ∩ U2`` for each ``v ∈ U2`` (the pairs ``v`` masked with).
    s_pks : mapping int -> bytes
        ``s_u^PK`` of the users of U3.
    t, p : int

    Returns
    -------
    ndarray, (m,) over GF(p)
        ``sum_{u ∈ U3} x_u``.

    Raises
    ------
    ValueError
        If some secret has fewer than ``t`` shares.
    """
    U3 = sorted(masked)
    alive = set(U3)
    m = masked[U3[0]].size
    total = sum_mod([masked[u] for u in U3], p)
    for v in sorted(shares):
        holders, sh = shares[v]
        secret = decode_secret(shamir_reconstruct(sh, [h + 1 for h in holders], t, p), p)
        if v in alive:
            total = sub_mod(total, prg_field(secret, m, p), p)
            continue
        for u in sorted(w for w in neighbours[v] if w in alive):       # u's y_u holds gamma_uv PRG(s_uv)
            pv = prg_field(x25519_agree(secret, s_pks[u]), m, p)
            total = sub_mod(total, pv, p) if u < v else add_mod(total, pv, p)
    return total


def expected_pairs(U2: Sequence[int], U3: Sequence[int], neighbours: Mapping[int, Sequence[int]]) -> int:
    """``P = sum_{v ∈ U2 \\ U3} |N(v) ∩ U3|``."""
    alive = set(U3)
    return sum(sum(1 for w in neighbours[v] if w in alive) for v in U2 if v not in alive)


def field_bits(p: int) -> int:
    """Wire width of a GF(p) element, ``ceil(log2 p)``."""
    return math.ceil(math.log2(int(p)))


# -- parameters and the communication graph -------------------------------------------------------------------------
def check_mask_prime(p: int) -> None:
    """The field of the masked sum: a prime below ``2**62`` (the int64 kernels).

    Raises
    ------
    ValueError
        Naming ``p``.
    """
    try:
        check_prime(p)
    except ValueError as e:
        raise ValueError(f"p = {p} is not usable as the field of SecAgg: {e}") from None
    if p >= 2**62:
        raise ValueError(f"p must be below 2**62 (int64 kernels), got {p}")


def default_threshold(n: int) -> int:
    """Shamir threshold of a user with ``n`` share holders: an honest majority, ``floor(n / 2) + 1``."""
    return n // 2 + 1


def default_degree(N: int) -> int:
    """SecAgg+'s degree for ``N`` users: ``min(N - 1, 2 ceil(log2 N))`` (``O(log N)``, Bell et al.)."""
    return min(N - 1, 2 * math.ceil(math.log2(N)))


def harary_degree(k: int | None, N: int) -> int:
    """SecAgg+'s degree: the configured ``k`` or, if None, :func:`default_degree`.

    Raises
    ------
    fednet.errors.ConfigError
        If ``k`` exceeds ``N - 1`` (names ``k``).
    """
    if k is None:
        return default_degree(N)
    if k > N - 1:
        raise ConfigError(f"k must be at most N - 1 = {N - 1}, got {k}")
    return k


def check_parameters(who: str, N: int, n: int, t: int, p: int, quant_bits: int) -> None:
    """Refuse ``N < 2`` users, a threshold outside ``1 <= t <= n`` and a field that cannot hold the sum.

    Parameters
    ----------
    who : str
        The protocol's name (in the message for ``N``).
    N, n, t : int
        Users, share holders of a user, threshold.
    p, quant_bits : int
        The field and the quantisation's fractional bits.

    Raises
    ------
    fednet.errors.ConfigError
        Naming ``t`` or ``p``.
    fednet.errors.CapacityError
        If GF(p) cannot hold the sum of ``N`` quantised units ``2**quant_bits`` (names ``p``).
    """
    if N < 2:
        raise ConfigError(f"{who} needs at least 2 users, got {N}")
    if not 1 <= t <= n:
        raise ConfigError(f"t must satisfy 1 <= t <= {n} (the share holders of a user), got {t}")
    try:
        check_secret_field(p, N)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_field_capacity(p, N << quant_bits, what=f"the sum of N = {N} quantised units 2^quant_bits = 2^{quant_bits}",
                         param="p")


def complete_neighbours(N: int) -> dict[int, list[int]]:
    """SecAgg's graph: ``N(u)`` = every other user (ascending)."""
    return {u: [v for v in range(N) if v != u] for u in range(N)}


def restrict(neighbours: Mapping[int, Sequence[int]], users: Sequence[int]) -> dict[int, list[int]]:
    """The graph among ``users``: ``N(u) ∩ users`` for each ``u ∈ users`` (in the order of ``neighbours[u]``)."""
    alive = set(users)
    return {u: [v for v in neighbours[u] if v in alive] for u in users}


def public_keys(pks: Mapping[int, tuple | None], users: Sequence[int], which: int | None = None) -> dict | None:
    """The public keys of ``users`` from ``pks`` (``{v: (c_v^PK, s_v^PK)}``, what round 0 uploads): both, or the
    ``which``-th of each; None if any is a timing-mode stand-in (None)."""
    if any(pks[v] is None for v in users):
        return None
    return {v: pks[v] if which is None else pks[v][which] for v in users}


def harary_neighbours(k: int, N: int, perm: Sequence[int]) -> dict[int, list[int]]:
    """SecAgg+'s graph: ``N(u)`` in the Harary graph ``H_{k,N}`` relabelled ``i -> perm[i]`` (ascending)."""
    g = nx.relabel_nodes(nx.hkn_harary_graph(k, N), {i: int(perm[i]) for i in range(N)})
    return {u: sorted(g.neighbors(u)) for u in range(N)}


# -- the user's round 2 and the server's round 3 on gradients ----------------------------------------------------------
def masked_gradient_macs(batch: int, m: int, n: int) -> int:
    """MACs of :func:`masked_gradient`: ``2 b_i m`` (the gradient) ``+ m (n + 1)`` (the masks)."""
    return 2 * batch * m + m * (n + 1)


def masked_gradient(X: np.ndarray, Y: np.ndarray, theta: np.ndarray, rows: np.ndarray, b: int, p: int,
                    n_summands: int, u: int, b_seed: bytes, s_sk: bytes, peers: list[int],
                    s_pks: dict[int, bytes]) -> np.ndarray:
    """Round 2 of user ``u`` on its data: ``y_u`` of its quantised minibatch gradient, ``(d c,)`` over GF(p).

    The gradient at ``theta`` on ``rows`` (eq. 3 of Schlegel et al., ``2 b_i d c`` MACs), quantised into GF(p)
    for ``n_summands`` summands (``round(G 2**b)``), masked by :func:`masked_input` (``d c (|peers| + 1)`` MACs).
    """
    G = minibatch_gradient(X, Y, theta.astype(np.float64), rows)
    return masked_input(quantize(G.reshape(-1), b, p, n_summands=n_summands), u, b_seed, s_sk, peers, s_pks, p)


def share_holders(responders: Sequence[int], U2: Sequence[int],
                  neighbours: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
    """For each ``v ∈ U2``: the responders of round 3 (ascending) holding a share of ``v``'s secret.

    ``neighbours`` is ``N(u) ∩ U2`` for each ``u ∈ U2``; the server needs ``t`` holders of every ``v``.
    """
    return {v: [u for u in sorted(responders) if u in neighbours and v in neighbours[u]] for v in U2}


def unmask_gradients(masked: Mapping[int, np.ndarray], responses: Mapping[int, tuple[list[int], np.ndarray]],
                     holders: Mapping[int, Sequence[int]], neighbours: Mapping[int, Sequence[int]],
                     s_pks: Mapping[int, bytes], t: int, p: int, quant_bits: int, shape: tuple[int, int]) -> np.ndarray:
    """The server's round 3 on gradients: the dequantised sum of ``U3``'s inputs, ``shape`` float64.

    Parameters
    ----------
    masked : mapping int -> ndarray (m,)
        ``y_u`` of the users of ``U3``.
    responses : mapping int -> (senders, ndarray (len(senders), K))
        :func:`unmask_response` of each responder.
    holders : mapping int -> sequence of int
        :func:`share_holders` for each ``v ∈ U2`` (at least ``t`` each; the first ``t`` are used).
    neighbours, s_pks, t, p
        As :func:`unmask`.
    quant_bits : int
        Fractional bits of the quantisation.
    shape : (d, c)

    Returns
    -------
    ndarray, shape
        ``sum_{u ∈ U3} Q(G_u) / 2**quant_bits`` (:func:`unmask`, ``(|U3| - 1) m + |U2| t K + (|U3| + P) m`` MACs).
    """
    shares = {}
    for v, hs in holders.items():
        hs = list(hs)[:t]
        shares[v] = (hs, np.stack([responses[h][1][responses[h][0].index(v)] for h in hs]))
    z = unmask({u: masked[u] for u in sorted(masked)}, shares, neighbours, s_pks, t, p)
    return dequantize(z, quant_bits, p).reshape(shape)


def quantised_gradient_sum(X: Sequence[np.ndarray], Y: Sequence[np.ndarray], theta: np.ndarray,
                           rows: Sequence[np.ndarray], users: Sequence[int], b: int, p: int,
                           n_summands: int) -> np.ndarray:
    """Timing mode's stand-in of :func:`unmask_gradients` (host work, not metered): ``sum_u Q(G_u) / 2**b``.

    Each user's :func:`fednet.codes.lightsecagg.quantised_gradient` (the same floats as its masked input) at the
    model as the users download it (``theta`` sent as float32, widened) on its minibatch ``rows[u]``, summed in
    the order of ``users`` (:func:`fednet.codes.lightsecagg.sum_in_order`): what full mode unmasks and dequantises.
    """
    theta = np.asarray(theta).astype(np.float32).astype(np.float64)
    return sum_in_order([quantised_gradient(X[u], Y[u], theta, rows[u], b, p, n_summands) for u in users])
