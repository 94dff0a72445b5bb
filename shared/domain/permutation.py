"""A keyed bijection of ``[0, n)``: a balanced Feistel network with cycle-walking.

The network permutes ``[0, 2**(2h))`` with ``2**(2h) >= n`` (h <= 32, so each
half is a uint32); values that land outside ``[0, n)`` are encrypted again
until they fall inside (cycle-walking), which keeps the map a bijection of
``[0, n)``. Since ``2**(2h) < 4n``, fewer than four passes are needed on
average. The round function is the murmur3 32-bit finaliser over the half
XOR a round key; round keys come from HMAC-SHA512 of the per-type key, so the
order of issued keys cannot be guessed without the secret. This is an
obfuscating permutation tuned for vectorised speed, not a block cipher (use
FF1 where a cryptographic PRP is required).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from shared.domain.arrays import U32, U64

ROUNDS = 8
ALGORITHM = "feistel-fmix32-8r-v1"  # part of the keyspace fingerprint
MAX_DOMAIN = 1 << 64
_C1 = np.uint32(0x85EBCA6B)
_C2 = np.uint32(0xC2B2AE35)
_S13 = np.uint32(13)
_S16 = np.uint32(16)


def derive_key(secret: bytes, name: str) -> bytes:
    """Per-type permutation key: two types with one secret get unrelated orders."""
    return hmac.new(secret, b"keydispenser/permutation/v1/" + name.encode(), "sha256").digest()


def key_digest(key: bytes) -> str:
    """Fingerprint of a permutation key, safe to store (one-way)."""
    return hashlib.sha256(b"keydispenser/key-digest/v1/" + key).hexdigest()[:32]


def fmix32(x: U32) -> U32:
    x = x ^ (x >> _S16)
    x = x * _C1
    x = x ^ (x >> _S13)
    x = x * _C2
    out: U32 = x ^ (x >> _S16)
    return out


class FeistelPermutation:
    def __init__(self, key: bytes, domain: int) -> None:
        if not 1 <= domain <= MAX_DOMAIN:
            raise ValueError(f"domain must be 1..2**64, got {domain}")
        self.domain = domain
        bits = max(2, (domain - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask32 = np.uint32((1 << self._half) - 1)
        self._mask64 = np.uint64((1 << self._half) - 1)
        self._shift = np.uint64(self._half)
        stream = hmac.new(key, b"round-keys", "sha512").digest()
        self._round_keys = [
            np.uint32(int.from_bytes(stream[4 * i : 4 * i + 4], "big")) for i in range(ROUNDS)
        ]

    def _encrypt(self, values: U64) -> U64:
        left = (values >> self._shift).astype(np.uint32)
        right = (values & self._mask64).astype(np.uint32)
        for round_key in self._round_keys:
            left, right = right, left ^ (fmix32(right ^ round_key) & self._mask32)
        out: U64 = (left.astype(np.uint64) << self._shift) | right
        return out

    def _decrypt(self, values: U64) -> U64:
        left = (values >> self._shift).astype(np.uint32)
        right = (values & self._mask64).astype(np.uint32)
        for round_key in reversed(self._round_keys):
            left, right = right ^ (fmix32(left ^ round_key) & self._mask32), left
        out: U64 = (left.astype(np.uint64) << self._shift) | right
        return out

    def permute(self, counters: U64) -> U64:
        """Map every counter in ``[0, domain)`` to its image in ``[0, domain)``."""
        out = self._encrypt(counters.astype(np.uint64, copy=False))
        if self.domain == MAX_DOMAIN:
            return out
        limit = np.uint64(self.domain)
        outside = np.flatnonzero(out >= limit)
        while outside.size:
            out[outside] = self._encrypt(out[outside])
            outside = outside[out[outside] >= limit]
        return out

    def invert(self, values: U64) -> U64:
        """The counters whose images are ``values`` (each in ``[0, domain)``): the
        rounds in reverse, cycle-walking back out of the values outside the domain."""
        out = self._decrypt(values.astype(np.uint64, copy=True))
        if self.domain == MAX_DOMAIN:
            return out
        limit = np.uint64(self.domain)
        outside = np.flatnonzero(out >= limit)
        while outside.size:
            out[outside] = self._decrypt(out[outside])
            outside = outside[out[outside] >= limit]
        return out

    def permute_one(self, counter: int) -> int:
        return int(self.permute(np.array([counter], dtype=np.uint64))[0])
