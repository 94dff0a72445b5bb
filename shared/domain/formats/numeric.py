"""The numeric format: decimal keys, a Verhoeff check digit, the digit filters.

Permuted counter values become digit columns of the survivors. Values are cut into
chunks of at most five decimal digits. The cheapest and most selective rules (first
digit, adjacent repeated digits) are answered per chunk by lookup tables, so only the
~1/3 of candidates that survive them are expanded into digit columns for the remaining
rules. numpy's cost profile drives the shape: scalar ``//`` is fast, ``%`` is not, and
1-D table gathers are cheap.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shared.domain.arrays import U64, Cols, Mask
from shared.domain.checkdigit import verhoeff_columns, verhoeff_valid
from shared.domain.filters import Rules, rejected_by
from shared.domain.formats.interface import Format
from shared.domain.formats.text import radix_columns
from shared.domain.vfilters import prefilter, reject

if TYPE_CHECKING:
    from shared.domain.config import IdTypeConfig

DIGITS = "0123456789"
# Types longer than this many counter digits take a keyed "head" on top of an 18-digit
# permuted tail: at most 10**18 keys each, unique by construction (and the counter
# domain fits PostgreSQL bigint sequences and uint64 arithmetic).
MAX_COUNTER_DIGITS = 18
_ASCII_ZERO = np.uint8(48)
_HEAD_MIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33))

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


def body_digits(config: IdTypeConfig) -> int:
    """Decimal digits before the check digit."""
    return config.length - (1 if config.check_digit == "verhoeff" else 0)


def counter_digits(config: IdTypeConfig) -> int:
    """Decimal digits drawn from the counter."""
    return min(body_digits(config), MAX_COUNTER_DIGITS)


class Numeric(Format):
    kind = "numeric"
    alphabet = key_characters = read_characters = DIGITS
    check_schemes = ("verhoeff", "none")
    length_limits = (2, 32)
    filtered = True

    @classmethod
    def check(cls, config: IdTypeConfig) -> None:
        if config.check_digit == "none" and config.order != "sequential":
            raise ValueError("check_digit: none is only supported with order: sequential")

    @classmethod
    def domain_size(cls, config: IdTypeConfig) -> int:
        """The last digit is the check digit: 10**counter_digits counters."""
        return int(10 ** counter_digits(config))

    def __init__(self, config: IdTypeConfig, rules: Rules, key: bytes | None) -> None:
        super().__init__(config, rules, key)
        self.body_digits = body_digits(config)
        self.counter_digits = counter_digits(config)
        self._sequential = config.order == "sequential"
        self._verhoeff = config.check_digit == "verhoeff"
        self._chunk_filter = ChunkFilter(rules, self.counter_digits)
        self._head_key = np.uint64(0 if key is None else int.from_bytes(key[-8:], "big"))

    def columns(self, values: U64) -> Cols:
        digits = self._in_order(values) if self._sequential else self._permuted(values)
        return digits + _ASCII_ZERO

    def valid(self, core: str) -> bool:
        """The check digit, then the filters."""
        if self._verhoeff and not verhoeff_valid(core):
            return False
        return not rejected_by(core, self.rules)

    def value_of(self, core: str) -> int | None:
        """The counter digits of ``core``: after the padding of a sequential type (none
        when the padding is not zeros), after the keyed head of a long type (none when
        the head is not the one its tail makes)."""
        lead = self.body_digits - self.counter_digits
        value = int(core[lead : lead + self.counter_digits])
        if not lead:
            return value
        if self._sequential:
            return value if core[:lead] == "0" * lead else None
        head = self._head(np.array([value], dtype=np.uint64), lead)[:, 0]
        return value if "".join(map(str, head)) == core[:lead] else None

    def _permuted(self, values: U64) -> Cols:
        """Body digits, cheap prefilters, check digit for survivors, full filters."""
        head_width = self.config.length - 1 - self.counter_digits
        if head_width:
            body = radix_columns(values, self.counter_digits, 10)
            body = np.concatenate([self._head(values, head_width), body])
            body = body[:, ~prefilter(body, self.rules, 1)]
        else:
            chunks = split_chunks(values, self.counter_digits)
            alive = self._chunk_filter.survivors(chunks)
            body = self._chunk_filter.expand([chunk[alive] for chunk in chunks])
        body = body[:, ~prefilter(body, self.rules, 2)]
        full = np.concatenate([body, verhoeff_columns(body)[None, :]])
        kept: Cols = full[:, ~reject(full, self.rules)]
        return kept

    def _in_order(self, values: U64) -> Cols:
        """Zero-padded counters, the check digit if any, the filters if any."""
        body = radix_columns(values, self.counter_digits, 10)
        padding = self.body_digits - self.counter_digits
        if padding:
            body = np.concatenate([np.zeros((padding, values.size), dtype=np.uint8), body])
        if self._verhoeff:
            body = np.concatenate([body, verhoeff_columns(body)[None, :]])
        kept: Cols = body[:, ~reject(body, self.rules)]
        return kept

    def _head(self, values: U64, width: int) -> Cols:
        """Leading digits of a long type: a keyed hash of the (unique) tail value."""
        m1, m2, s = _HEAD_MIX
        x = values ^ self._head_key
        x = (x ^ (x >> s)) * m1
        x = (x ^ (x >> s)) * m2
        x = x ^ (x >> s)
        return radix_columns(x % np.uint64(10**width), width, 10)
