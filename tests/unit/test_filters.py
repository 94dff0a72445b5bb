from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import filters as f
from shared.settings import FilterLimits
from shared.vfilters import openg2p_reject

LIMITS = FilterLimits()


@pytest.mark.parametrize("value", ["3029384756", "2013023805"])
def test_design_examples_pass(value: str) -> None:
    assert f.rejected_by(value, 10, LIMITS) == []


def test_design_example_rejected_by_conjugative_even_only() -> None:
    assert f.rejected_by("2013564809", 10, LIMITS) == ["conjugative_even"]


def test_not_start_with_looks_at_first_character_only() -> None:
    assert f.rejects_not_start_with("0123", ("0", "1"))
    assert f.rejects_not_start_with("1357", ("0", "1"))
    assert not f.rejects_not_start_with("2357", ("0", "1"))
    # openg2p compares the first character: a longer entry never matches.
    assert not f.rejects_not_start_with("2357", ("23",))


@pytest.mark.parametrize(
    ("value", "rejects"),
    [("5123", True), ("5321", True), ("890", False), ("098", False), ("1357", False)],
)
def test_sequence_without_wrap(value: str, rejects: bool) -> None:
    assert f.rejects_sequence(value, 3) is rejects


def test_repeating_digit_distance_below_limit() -> None:
    assert f.rejects_repeating_digit("5115", 2)
    assert not f.rejects_repeating_digit("121", 2)
    assert f.rejects_repeating_digit("121", 3)


def test_repeating_block_non_overlapping() -> None:
    assert f.rejects_repeating_block("473947", 2)
    assert not f.rejects_repeating_block("4743", 2)  # '47' then '74', '43'
    assert not f.rejects_repeating_block("555", 2)  # overlapping '55' does not count


def test_conjugative_even_includes_zero() -> None:
    assert f.rejects_conjugative_even("5208", 3)
    assert not f.rejects_conjugative_even("52183", 3)


def test_first_equals_last_and_reverse_need_length() -> None:
    assert f.rejects_first_equals_last("1234512345", 5)
    assert not f.rejects_first_equals_last("123451234", 5)
    assert f.rejects_first_equals_reverse("1234554321", 5)
    assert not f.rejects_first_equals_reverse("123454321", 5)


def test_restricted_and_cyclic() -> None:
    assert f.rejects_restricted("5786123", ("786",))
    assert not f.rejects_restricted("5786123", ("",))
    assert f.rejects_cyclic("91428573")
    assert not f.rejects_cyclic("9142853")


def _scalar(rows: list[str], limits: FilterLimits) -> list[bool]:
    return [bool(f.rejected_by(row, len(row), limits)) for row in rows]


def _vector(rows: list[str], limits: FilterLimits) -> list[bool]:
    digits = np.array([[int(c) for c in row] for row in rows], dtype=np.uint8)
    return [bool(x) for x in openg2p_reject(digits, len(rows[0]), limits)]


# Digits drawn from a small alphabet so runs, repeats and sequences are common.
digit_rows = st.integers(4, 16).flatmap(
    lambda n: st.lists(
        st.text(alphabet=st.sampled_from("0123456789"), min_size=n, max_size=n),
        min_size=1,
        max_size=40,
    )
)
limit_sets = st.builds(
    FilterLimits,
    sequence=st.integers(2, 5),
    repeating_digit=st.integers(2, 4),
    repeating_block=st.integers(1, 4),
    conjugative_even=st.integers(1, 5),
    first_equals_last=st.integers(1, 6),
    first_equals_reverse=st.integers(1, 6),
    restricted_numbers=st.lists(st.text("0123456789", max_size=3), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(digit_rows, limit_sets)
def test_vectorised_filters_agree_with_reference(rows: list[str], limits: FilterLimits) -> None:
    assert _vector(rows, limits) == _scalar(rows, limits)


def test_vectorised_rejects_wrong_length_rows() -> None:
    digits = np.zeros((3, 9), dtype=np.uint8)
    assert openg2p_reject(digits, 10, LIMITS).all()
