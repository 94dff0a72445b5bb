"""A keyed bijection of ``[0, n)``: a balanced Feistel network with cycle-walking.

The network permutes ``[0, 2**(2h))`` with ``2**(2h) >= n``; values that land
outside ``[0, n)`` are encrypted again until they fall inside (cycle-walking),
which keeps the map a bijection of ``[0, n)``. Since ``2**(2h) < 4n``, fewer
than four passes are needed on average. Round keys come from HMAC-SHA256 of the
configured secret, so the order of issued keys cannot be guessed without it.
The round function is the murmur3 64-bit finaliser over the keyed half, which
vectorises in numpy; this is an obfuscating permutation, not a block cipher
(use FF1 where a cryptographic PRP is required).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import numpy.typing as npt

ROUNDS = 8
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)

U64Array = npt.NDArray[np.uint64]


def derive_key(secret: bytes, id_type: str) -> bytes:
    """Per-type permutation key: two types with one secret get unrelated orders."""
    return hmac.new(secret, b"keydispenser/permutation/v1/" + id_type.encode(), "sha256").digest()


def key_digest(key: bytes) -> str:
    """Fingerprint of a permutation key, safe to store (one-way)."""
    return hashlib.sha256(b"keydispenser/key-digest/v1/" + key).hexdigest()[:32]


class FeistelPermutation:
    def __init__(self, key: bytes, domain: int) -> None:
        if domain < 1:
            raise ValueError("domain must be at least 1")
        self.domain = domain
        bits = max(2, (domain - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        self._shift = np.uint64(self._half)
        stream = hmac.new(key, b"round-keys", "sha512").digest()
        self._round_keys = [
            np.uint64(int.from_bytes(stream[8 * i : 8 * i + 8], "big")) for i in range(ROUNDS)
        ]

    def _round(self, right: U64Array, round_key: np.uint64) -> U64Array:
        x = right ^ round_key
        x = x ^ (x >> _S33)
        x = x * _M1
        x = x ^ (x >> _S33)
        x = x * _M2
        x = x ^ (x >> _S33)
        return x & self._mask

    def _encrypt(self, values: U64Array) -> U64Array:
        left = values >> self._shift
        right = values & self._mask
        for round_key in self._round_keys:
            left, right = right, left ^ self._round(right, round_key)
        out: U64Array = (left << self._shift) | right
        return out

    def permute(self, counters: U64Array) -> U64Array:
        """Map every counter in ``[0, domain)`` to its image in ``[0, domain)``."""
        out = self._encrypt(counters.astype(np.uint64, copy=False))
        limit = np.uint64(self.domain)
        outside = np.flatnonzero(out >= limit)
        while outside.size:
            out[outside] = self._encrypt(out[outside])
            outside = outside[out[outside] >= limit]
        return out

    def permute_one(self, counter: int) -> int:
        return int(self.permute(np.array([counter], dtype=np.uint64))[0])
