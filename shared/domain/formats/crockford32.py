"""Crockford's base32: keys for people to read aloud and type, with a mod-37 check symbol.

Douglas Crockford's encoding (https://www.crockford.com/base32.html) writes a number in
32 symbols, the digits and 22 capital letters: no I or L (read as 1), no O (read as 0)
and no U. Its check symbol is the number modulo 37, written with those 32 symbols and
five more, ``*~$=U`` for 32 to 36, so that a wrong symbol or two symbols swapped is
caught. Here the number is a type's permuted counter: its symbols, most significant
first, then (``check_digit: mod37``, the default) the check symbol.

A client may write a key as the encoding reads it: in either case, I, i, L and l for
1, O and o for 0, and with hyphens anywhere in it, which are ignored (``AB-CD`` is
``ABCD``: "hyphens can be inserted into symbol strings ... ignored during decoding").
The stores hold keys as generated: capitals, no hyphen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shared.domain.formats.interface import Format
from shared.domain.formats.text import radix_columns

if TYPE_CHECKING:
    from shared.domain.arrays import U64, Cols
    from shared.domain.config import IdTypeConfig
    from shared.domain.filters import Rules

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CHECK_SYMBOLS = ALPHABET + "*~$=U"  # the check symbol of a number n: CHECK_SYMBOLS[n % 37]
MOD = len(CHECK_SYMBOLS)  # 37, the least prime above 32
# What a client may write, read as the encoding reads it: lower case as upper case,
# I and L as 1, O as 0; hyphens dropped.
_LETTERS = "".join(c for c in CHECK_SYMBOLS if c.isalpha())
_READ = str.maketrans(
    _LETTERS.lower() + "IiLlOo",
    _LETTERS + "111100",
    "-",
)
# The symbols as Python's base-32 digits (int(text, 32) reads them).
_AS_INT_DIGITS = str.maketrans(ALPHABET, "0123456789abcdefghijklmnopqrstuv")
_BYTES = np.frombuffer(CHECK_SYMBOLS.encode(), dtype=np.uint8)  # a symbol's value -> ASCII
MAX_SYMBOLS = 12  # 32**12 = 2**60 counters fit a PostgreSQL bigint sequence


def check_symbol(value: int) -> str:
    """The check symbol of ``value``."""
    return CHECK_SYMBOLS[value % MOD]


def decoded(symbols: str) -> int:
    """The number ``symbols`` (normalised, all of ALPHABET) writes."""
    return int(symbols.translate(_AS_INT_DIGITS), 32)


class Crockford32(Format):
    kind = "crockford32"
    alphabet = ALPHABET
    key_characters = CHECK_SYMBOLS
    read_characters = "".join(sorted(set(CHECK_SYMBOLS + _LETTERS.lower() + "IiLlOo-")))
    check_schemes = ("mod37", "none")
    length_limits = (2, MAX_SYMBOLS + 1)  # the check symbol included
    filtered = False

    @classmethod
    def check(cls, config: IdTypeConfig) -> None:
        if symbols(config) > MAX_SYMBOLS:
            raise ValueError(
                f"length {config.length} out of range for kind crockford32 with check_digit: "
                f"none (2..{MAX_SYMBOLS}): {MAX_SYMBOLS} symbols of counter at most"
            )

    @classmethod
    def domain_size(cls, config: IdTypeConfig) -> int:
        return int(32 ** symbols(config))

    def __init__(self, config: IdTypeConfig, rules: Rules, key: bytes | None) -> None:
        super().__init__(config, rules, key)
        self._symbols = symbols(config)
        self._checked = config.check_digit == "mod37"
        self._alphabet = frozenset(ALPHABET)

    def columns(self, values: U64) -> Cols:
        """The counter's symbols, then its check symbol (the counter modulo 37)."""
        digits = radix_columns(values, self._symbols, 32)
        if self._checked:
            check = (values % np.uint64(MOD)).astype(np.uint8)
            digits = np.concatenate([digits, check[None, :]])
        out: Cols = _BYTES[digits]
        return out

    def normalise(self, core: str) -> str:
        """Returns ``core`` in capitals, with I and L read as 1, O as 0 and no hyphen.

        Raises InvalidInput for a character the encoding does not read.
        """
        return super().normalise(core).translate(_READ)

    def valid(self, core: str) -> bool:
        """True when every symbol is one of the 32 and the check symbol is the number's."""
        body = core[: self._symbols]
        if not self._alphabet.issuperset(body):
            return False  # a check-only symbol (*~$=U) where a digit belongs
        return not self._checked or core[-1] == check_symbol(decoded(body))

    def value_of(self, core: str) -> int | None:
        return decoded(core[: self._symbols])


def symbols(config: IdTypeConfig) -> int:
    """Symbols of a key written from its counter (the check symbol is not one)."""
    return config.length - (1 if config.check_digit == "mod37" else 0)
