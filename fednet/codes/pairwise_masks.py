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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from fednet.algebra.crypto import (KEY_BYTES, TAG_BYTES, aead_decrypt, aead_encrypt, aead_nonce, prg_bytes_for,
                                   prg_field, x25519_agree, x25519_keypair)
from fednet.algebra.crypto_meter import CryptoCounts
from fednet.algebra.modp import add_mod, sub_mod, sum_mod
from fednet.codes.shamir import shamir_reconstruct, shamir_share

__all__ = ["element_bytes", "chunk_bytes", "secret_elements", "encode_secret", "decode_secret", "share_plain_bytes",
           "advertise", "share_keys", "masked_input", "unmask_response", "unmask", "advertise_counts",
           "share_keys_counts", "share_keys_macs", "masked_input_counts", "unmask_response_counts",
           "unmask_counts", "unmask_macs", "check_secret_field", "expected_pairs", "field_bits"]


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


# -- round 3: Unmasking -------------------------------------------------------------------------------------------------
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
