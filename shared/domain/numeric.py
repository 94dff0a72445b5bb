"""Fast numeric-key encoding: permuted counter values -> digit columns of survivors.

Values are cut into chunks of at most five decimal digits. The cheapest and most
selective rules (first digit, adjacent repeated digits) are answered per chunk by
lookup tables, so only the ~1/3 of candidates that survive them are expanded
into digit columns for the remaining rules. numpy's cost profile drives the
shape: scalar ``//`` is fast, ``%`` is not, and 1-D table gathers are cheap.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.domain.arrays import Cols, Mask
from shared.domain.filters import Rules

CHUNK = 5


@cache
def digit_table(width: int) -> Cols:
    """digit_table(w)[k, v]: digit k of v written with w digits."""
    values = np.arange(10**width)
    rows = [(values // 10 ** (width - 1 - k)) % 10 for k in range(width)]
    return np.ascontiguousarray(np.array(rows, dtype=np.uint8))


@cache
def adjacent_repeat_table(width: int) -> Mask:
    """True where the w-digit chunk has two equal adjacent digits."""
    digits = digit_table(width)
    out = np.zeros(10**width, dtype=np.bool_)
    for k in range(width - 1):
        out |= digits[k] == digits[k + 1]
    return out


def chunk_widths(width: int) -> list[int]:
    """Chunk widths, most significant first; only the first may be short."""
    first = width % CHUNK or CHUNK
    return [first] + [CHUNK] * ((width - first) // CHUNK)


def split_chunks(values: npt.NDArray[np.uint64], width: int) -> list[npt.NDArray[Any]]:
    """The chunk values of each ``width``-digit value, most significant first."""
    rest: npt.NDArray[Any] = values.astype(np.uint32) if width <= 9 else values
    chunks: list[npt.NDArray[Any]] = []
    widths = chunk_widths(width)
    for w in reversed(widths[1:]):
        base = rest.dtype.type(10**w)
        quotient = rest // base
        chunks.append((rest - quotient * base).astype(np.intp))
        rest = quotient
    chunks.append(rest.astype(np.intp))
    return chunks[::-1]


class ChunkFilter:
    """Stage-1 rules answered per chunk: first digit and adjacent repeats."""

    def __init__(self, rules: Rules, width: int) -> None:
        # Both filter profiles reject adjacent repeats (repeating_digit >= 2).
        self.active = rules.profile != "none"
        self.width = width
        self.widths = chunk_widths(width)
        first = self.widths[0]
        self.first_bad = adjacent_repeat_table(first).copy()
        if rules.banned_first_digits:
            self.first_bad |= np.isin(digit_table(first)[0], rules.banned_first_digits)
        self.inner_bad = adjacent_repeat_table(CHUNK)
        self.leading = digit_table(CHUNK)[0]

    def survivors(self, chunks: list[npt.NDArray[np.intp]]) -> npt.NDArray[np.intp]:
        """Indices of values that pass stage 1."""
        if not self.active:
            return np.arange(chunks[0].size)
        bad = self.first_bad[chunks[0]]
        for left, right in itertools.pairwise(chunks):
            bad |= self.inner_bad[right]
            bad |= (left - (left // 10) * 10) == self.leading[right]
        return np.flatnonzero(~bad)

    def expand(self, chunks: list[npt.NDArray[np.intp]]) -> Cols:
        """Digit columns (width, n) of the given chunk values."""
        out = np.empty((self.width, chunks[0].size), dtype=np.uint8)
        row = 0
        for w, chunk in zip(self.widths, chunks, strict=True):
            table = digit_table(w)
            for k in range(w):
                out[row + k] = table[k][chunk]
            row += w
        return out
