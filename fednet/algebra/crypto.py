"""Real cryptographic kernels of pairwise-mask secure aggregation (metered by :mod:`fednet.algebra.crypto_meter`).

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Sec. 3
(primitives) and Fig. 4: key agreement ``KA`` (here X25519, with SHA-256 of the shared secret as the key),
a pseudorandom generator ``PRG`` expanding a 32-byte seed into field elements (here the ChaCha20 keystream),
and authenticated encryption ``AE`` of the shares (here ChaCha20-Poly1305), all from the ``cryptography``
package.  Each kernel executes the real operation and charges its count (:func:`~fednet.algebra.crypto_meter.charge_crypto`).

PRG to field: ``n`` elements of GF(p) are ``n`` little-endian uint64 words of keystream reduced mod ``p``
(``8 n`` PRG bytes); the statistical distance from uniform is at most ``n p / 2**64`` (``2**-32 n`` for a
32-bit prime), and the count of bytes is a closed form (no rejection sampling).
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from fednet.algebra.crypto_meter import charge_crypto

__all__ = ["KEY_BYTES", "TAG_BYTES", "x25519_keypair", "x25519_agree", "prg_field", "prg_bytes_for",
           "aead_encrypt", "aead_decrypt", "aead_nonce"]

#: Bytes of an X25519 key (private or public) and of a PRG seed.
KEY_BYTES = 32
#: Bytes of a Poly1305 tag (an AEAD ciphertext is the plaintext plus the tag).
TAG_BYTES = 16


def x25519_keypair(secret: bytes) -> tuple[bytes, bytes]:
    """An X25519 key pair from 32 secret bytes: ``(private, public)``, 32 bytes each; one key generation."""
    if len(secret) != KEY_BYTES:
        raise ValueError(f"secret must be {KEY_BYTES} bytes, got {len(secret)}")
    sk = X25519PrivateKey.from_private_bytes(bytes(secret))
    charge_crypto(key_generations=1)
    return bytes(secret), sk.public_key().public_bytes_raw()


def x25519_agree(private: bytes, public: bytes) -> bytes:
    """``KA.agree``: SHA-256 of the X25519 shared secret of ``private`` and ``public`` (32 bytes); one key agreement."""
    shared = X25519PrivateKey.from_private_bytes(bytes(private)).exchange(X25519PublicKey.from_public_bytes(bytes(public)))
    charge_crypto(key_agreements=1)
    return hashlib.sha256(shared).digest()


def prg_bytes_for(n: int) -> int:
    """PRG bytes :func:`prg_field` draws for ``n`` elements (``8 n``)."""
    return 8 * int(n)


def prg_field(seed: bytes, n: int, p: int) -> np.ndarray:
    """``PRG(seed)``: ``n`` elements of GF(p), ``(n,)`` int64 (module docstring); charges ``8 n`` PRG bytes.

    Raises
    ------
    ValueError
        For a seed that is not 32 bytes or ``p`` outside ``[2, 2**62)``.
    """
    if len(seed) != KEY_BYTES:
        raise ValueError(f"seed must be {KEY_BYTES} bytes, got {len(seed)}")
    if not 2 <= int(p) < 2**62:
        raise ValueError(f"p must be in [2, 2**62), got {p}")
    stream = Cipher(algorithms.ChaCha20(bytes(seed), bytes(16)), None).encryptor().update(bytes(prg_bytes_for(n)))
    charge_crypto(prg_bytes=prg_bytes_for(n))
    return (np.frombuffer(stream, dtype="<u8") % np.uint64(p)).astype(np.int64)


def aead_nonce(src: int, dst: int, epoch: int) -> bytes:
    """A 12-byte nonce unique per (sender, receiver, round): a key ``c_uv`` encrypts ``u -> v`` and ``v -> u``."""
    return int(src).to_bytes(4, "little") + int(dst).to_bytes(4, "little") + int(epoch).to_bytes(4, "little")


def aead_encrypt(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes = b"") -> bytes:
    """``AE.enc``: ChaCha20-Poly1305 of ``plaintext`` (``len + 16`` bytes); one AEAD message, ``len`` AEAD bytes."""
    out = ChaCha20Poly1305(bytes(key)).encrypt(nonce, bytes(plaintext), aad or None)
    charge_crypto(aead_messages=1, aead_bytes=len(plaintext))
    return out


def aead_decrypt(key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes = b"") -> bytes:
    """``AE.dec``: the plaintext (raises ``cryptography.exceptions.InvalidTag`` if forged); one AEAD message, its bytes."""
    out = ChaCha20Poly1305(bytes(key)).decrypt(nonce, bytes(ciphertext), aad or None)
    charge_crypto(aead_messages=1, aead_bytes=len(out))
    return out
