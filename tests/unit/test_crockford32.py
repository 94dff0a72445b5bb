"""Crockford's base32 with its mod-37 check symbol (``kind: crockford32``): the vectorised
encoder against a scalar one written from the specification, the known answers, every
spelling the encoding reads, and the errors the check symbol catches."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.config import IdTypeConfig
from shared.domain.errors import InvalidInput
from shared.domain.formats.crockford32 import ALPHABET, CHECK_SYMBOLS
from shared.domain.idtypes import IdType

SECRET = b"unit-secret"
SYMBOLS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the specification's, written out here
CHECKS = SYMBOLS + "*~$=U"  # 32..36
# Every way a client may write a symbol: either case, I and L for 1, O for 0.
SPELLINGS = {c: {c, c.lower()} for c in CHECKS} | {
    "1": {"1", "I", "i", "L", "l"},
    "0": {"0", "O", "o"},
}


def encoded(n: int, width: int) -> str:
    """``n`` in ``width`` symbols, most significant first (the specification)."""
    out = []
    for _ in range(width):
        n, digit = divmod(n, 32)
        out.append(SYMBOLS[digit])
    assert n == 0
    return "".join(reversed(out))


def checked(n: int, width: int) -> str:
    return encoded(n, width) + CHECKS[n % 37]


def crockford(length: int = 9, **settings: Any) -> IdType:
    config = IdTypeConfig.model_validate({"kind": "crockford32", "length": length, **settings})
    return IdType("ticket", config, SECRET)


SEQUENTIAL = crockford(9, order="sequential")
PERMUTED = crockford(9)


def test_the_symbols_are_the_specifications() -> None:
    assert (ALPHABET, CHECK_SYMBOLS) == (SYMBOLS, CHECKS)


def test_known_answers() -> None:
    """1234 is "16J", "16JD" with its check symbol (Perl's Encode::Base32::Crockford);
    "IO" reads as 32."""
    four = crockford(4, order="sequential")
    assert four.generate(1234, 1235)[0] == ["16JD"]
    assert four.validate("16JD") and four.validate("16jd") and not four.validate("16JE")
    assert crockford(2, order="sequential", check_digit="none").normalise("IO") == "10"
    five = crockford(5, order="sequential")
    assert five.generate(32, 38)[0] == ["0010*", "0011~", "0012$", "0013=", "0014U", "00150"]


@given(st.integers(0, 32**8 - 1))
def test_a_counter_is_written_as_the_specification_writes_it(n: int) -> None:
    assert SEQUENTIAL.generate(n, n + 1)[0] == [checked(n, 8)]


@given(st.integers(0, 32**8 - 2_000))
def test_a_block_is_encoded_as_each_counter_alone(start: int) -> None:
    keys, candidates = SEQUENTIAL.generate(start, start + 2_000)
    assert candidates == 2_000
    assert keys == [checked(n, 8) for n in range(start, start + 2_000)]


@given(st.integers(0, 10**6))
def test_every_generated_key_validates_and_is_written_as_the_stores_hold_it(start: int) -> None:
    keys, _ = PERMUTED.generate(start, start + 50)
    assert len(keys) == 50
    for key in keys:
        assert set(key[:-1]) <= set(SYMBOLS) and key[-1] in CHECKS
        assert PERMUTED.validate(key) and PERMUTED.normalise(key) == key


@st.composite
def spelled(draw: st.DrawFn) -> tuple[str, str]:
    """A key, and the key as a client may write it (case, look-alikes, hyphens)."""
    key = draw(st.sampled_from(PERMUTED.generate(0, 500)[0]))
    written = "".join(draw(st.sampled_from(sorted(SPELLINGS[c]))) for c in key)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(written)))
        written = written[:at] + "-" + written[at:]
    return key, written


@given(spelled())
def test_every_spelling_the_encoding_reads_names_the_key(pair: tuple[str, str]) -> None:
    key, written = pair
    assert PERMUTED.validate(written)
    assert PERMUTED.normalise(written) == key


@given(st.sampled_from(PERMUTED.generate(0, 500)[0]), st.data())
def test_the_check_symbol_catches_every_wrong_symbol(key: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(key) - 1))
    choices = CHECKS if at == len(key) - 1 else SYMBOLS
    wrong = data.draw(st.sampled_from([c for c in choices if c != key[at]]))
    assert not PERMUTED.validate(key[:at] + wrong + key[at + 1 :])


@given(st.sampled_from(PERMUTED.generate(0, 500)[0]), st.data())
def test_the_check_symbol_catches_two_symbols_swapped(key: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(key) - 3))  # two of the counter's symbols
    swapped = key[:at] + key[at + 1] + key[at] + key[at + 2 :]
    assert swapped == key or not PERMUTED.validate(swapped)


def test_a_check_symbol_is_no_counter_symbol() -> None:
    key = SEQUENTIAL.generate(0, 1)[0][0]  # "00000000" + "0"
    assert not SEQUENTIAL.validate("U" + key[1:])  # U only ever checks
    assert not SEQUENTIAL.validate(key[:-1])  # too short
    assert not SEQUENTIAL.validate(key + "0")  # too long


@pytest.mark.parametrize("value", ["0000-0000!", "00000000 0", "ÖOOOOOOO0", "00000000_"])
def test_a_character_the_encoding_does_not_read_is_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match="the crockford32 alphabet"):
        SEQUENTIAL.validate(value)


def test_without_a_check_symbol_every_key_is_its_counter() -> None:
    plain = crockford(12, order="sequential", check_digit="none")
    assert plain.domain_size == 32**12
    assert plain.generate(32**12 - 1, 32**12)[0] == ["Z" * 12]
    assert plain.validate("zzzz-zzzz-zzzz") and not plain.validate("ZZZZZZZZZZZU")


def test_the_lengths_a_type_may_have() -> None:
    """Twelve symbols of counter at most (2**60 counters fit a PostgreSQL sequence)."""
    assert crockford(13).domain_size == 32**12
    assert crockford(2).domain_size == 32
    with pytest.raises(ValueError, match="length 14 out of range for kind crockford32"):
        crockford(14)
    with pytest.raises(ValueError, match="length 13 out of range for kind crockford32"):
        crockford(13, order="sequential", check_digit="none")
    with pytest.raises(ValueError, match="'verhoeff' is not a check scheme of kind crockford32"):
        crockford(9, check_digit="verhoeff")


def test_an_affix_is_kept_as_written() -> None:
    """The format reads the core; a prefix or suffix is matched as configured."""
    typed = crockford(9, prefix="TK-")
    key = typed.generate(0, 1)[0][0]
    assert typed.validate("TK-" + key[3:].lower())
    assert typed.normalise("TK-" + key[3:].lower()) == key
    assert not typed.validate("tk-" + key[3:])  # the prefix is not the format's
