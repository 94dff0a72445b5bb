"""The base62 format: fixed-length keys over 0-9A-Za-z, no check digit, no filters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shared.domain.formats.interface import Format
from shared.domain.formats.text import radix_columns

if TYPE_CHECKING:
    from shared.domain.arrays import U64, Cols
    from shared.domain.config import IdTypeConfig

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}
_BYTES = np.frombuffer(ALPHABET.encode(), dtype=np.uint8)


class Base62(Format):
    kind = "base62"
    alphabet = key_characters = read_characters = ALPHABET
    check_schemes = ("none",)
    length_limits = (1, 10)  # 62**10 counters fit a PostgreSQL bigint sequence
    filtered = False

    @classmethod
    def domain_size(cls, config: IdTypeConfig) -> int:
        return int(62**config.length)

    def columns(self, values: U64) -> Cols:
        out: Cols = _BYTES[radix_columns(values, self.config.length, 62)]
        return out

    def valid(self, core: str) -> bool:
        return True

    def value_of(self, core: str) -> int | None:
        value = 0
        for c in core:
            value = value * 62 + _INDEX[c]
        return value
