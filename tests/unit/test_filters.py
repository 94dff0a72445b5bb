from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain import filters as f
from shared.domain.config import FilterLimits
from shared.domain.filters import Rules
from shared.domain.vfilters import prefilter, reject

OPENG2P = Rules.resolve("openg2p", 10, FilterLimits())
MOSIP = Rules.resolve("mosip", 10, FilterLimits())


def rules(profile: f.Profile, length: int, **limits: object) -> Rules:
    return Rules.resolve(profile, length, FilterLimits(**limits))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["3029384756", "2013023805"])
def test_design_examples_pass(value: str) -> None:
    assert f.rejected_by(value, OPENG2P) == []


def test_design_example_rejected_by_conjugative_even_only() -> None:
    assert f.rejected_by("2013564809", OPENG2P) == ["conjugative_even"]


def test_openg2p_not_start_with_looks_at_the_first_character_only() -> None:
    r = rules("openg2p", 4, not_start_with=("0", "1", "23"))
    assert f.rejected_by("0357", r) == ["not_start_with"]
    assert "not_start_with" not in f.rejected_by("2357", r)


def test_mosip_not_start_with_matches_whole_prefixes() -> None:
    r = rules(
        "mosip", 4, not_start_with=("0", "1", "23"), first_equals_last=2, first_equals_reverse=2
    )
    assert "not_start_with" in f.rejected_by("2357", r)


@pytest.mark.parametrize("profile", ["openg2p", "mosip"])
def test_banned_first_digits_are_the_single_digit_prefixes(profile: f.Profile) -> None:
    r = rules(profile, 4, not_start_with=("0", "1", "23", "x"))
    assert r.banned_first_digits == (0, 1)


def test_profile_none_bans_no_first_digit() -> None:
    assert rules("none", 4, not_start_with=("0", "1")).banned_first_digits == ()


@pytest.mark.parametrize(
    ("value", "openg2p", "mosip"),
    [
        ("5123", True, True),
        ("5321", True, True),
        ("5890", False, True),  # wraps 9 -> 0 only for mosip
        ("5098", False, True),  # wraps 0 -> 9 only for mosip
        ("5137", False, False),
    ],
)
def test_sequence(value: str, openg2p: bool, mosip: bool) -> None:
    assert f.openg2p_sequence(value, 3) is openg2p
    assert f.mosip_sequence(value, 3) is mosip


def test_mosip_long_sequences_need_a_fitting_first_digit() -> None:
    # 12 ascending digits fit "01234567890123456789" only from first digit <= 8.
    assert f.mosip_sequence("890123456789", 12)
    assert not f.mosip_sequence("901234567890", 12)


def test_repeating_digit_distance() -> None:
    assert "repeating_digit" in f.rejected_by("5115", rules("openg2p", 4))
    # 121: a repeat at distance 2 is allowed by openg2p (limit 2), not by mosip.
    assert "repeating_digit" not in f.rejected_by("3121", rules("openg2p", 4))
    mosip = rules("mosip", 4, first_equals_last=2, first_equals_reverse=2)
    assert "repeating_digit" in f.rejected_by("3121", mosip)


def test_repeating_block_non_overlapping() -> None:
    assert f.repeating_block("473947", 2)
    assert not f.repeating_block("4743", 2)
    assert not f.repeating_block("555", 2)


def test_even_digits_zero_counts_only_for_openg2p() -> None:
    assert "conjugative_even" in f.rejected_by("3208", rules("openg2p", 4))
    mosip = rules("mosip", 4, first_equals_last=2, first_equals_reverse=2)
    assert "conjugative_even" not in f.rejected_by("3208", mosip)
    assert "conjugative_even" in f.rejected_by("3248", mosip)


def test_first_equals_last_any_length_only_for_mosip() -> None:
    # Length 8 with limit 5: windows overlap; openg2p needs length >= 10.
    o = rules("openg2p", 8)
    m = rules("mosip", 8)
    assert "first_equals_last" not in f.rejected_by("35792579", o)
    assert "first_equals_last" not in f.rejected_by("35793579", o)
    assert f.rejected_by("35735735", m).count("first_equals_last") == 1
    assert "first_equals_reverse" in f.rejected_by("35799753", m)  # 8-digit palindrome
    assert "first_equals_reverse" not in f.rejected_by("35799753", o)


def test_first_equals_last_and_reverse_at_full_length() -> None:
    assert "first_equals_last" in f.rejected_by("3579135791", OPENG2P)
    assert "first_equals_reverse" in f.rejected_by("3579119753", OPENG2P)


def test_restricted_defaults_differ_by_profile() -> None:
    assert OPENG2P.restricted == ()
    assert MOSIP.restricted == ("786", "666")
    assert "restricted_numbers" in f.rejected_by("3578639402", MOSIP)
    assert "restricted_numbers" not in f.rejected_by("3578639402", OPENG2P)
    assert rules("openg2p", 4, restricted_numbers=("", "357")).restricted == ("357",)


def test_cyclic_numbers() -> None:
    assert "cyclic_numbers" in f.rejected_by("9142857395", OPENG2P)
    assert "cyclic_numbers" in f.rejected_by("9142857395", MOSIP)


def test_profile_none_checks_length_only() -> None:
    none = rules("none", 4)
    assert f.rejected_by("1111", none) == []
    assert f.rejected_by("11111", none) == ["length"]


def columns(rows: list[str]) -> np.ndarray:
    return np.array([[int(c) for c in row] for row in rows], dtype=np.uint8).T.copy()


def scalar(rows: list[str], r: Rules) -> list[bool]:
    return [bool(f.rejected_by(row, r)) for row in rows]


# Digits from a small alphabet so runs, repeats and sequences are common.
digit_rows = st.integers(4, 24).flatmap(
    lambda n: st.lists(
        st.text(alphabet=st.sampled_from("0123456789"), min_size=n, max_size=n),
        min_size=1,
        max_size=40,
    )
)
limits = st.builds(
    FilterLimits,
    not_start_with=st.lists(st.text("0123456789", min_size=1, max_size=2), max_size=3).map(tuple),
    sequence=st.integers(2, 14),
    repeating_digit=st.integers(2, 4),
    repeating_block=st.integers(1, 5),
    conjugative_even=st.integers(1, 5),
    first_equals_last=st.integers(1, 4),
    first_equals_reverse=st.integers(1, 4),
    restricted_numbers=st.none()
    | st.lists(st.text("0123456789", max_size=3), max_size=3).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(digit_rows, limits, st.sampled_from(["openg2p", "mosip", "none"]))
def test_vectorised_filters_agree_with_reference(
    rows: list[str], lim: FilterLimits, profile: f.Profile
) -> None:
    r = Rules.resolve(profile, len(rows[0]), lim)
    assert [bool(x) for x in reject(columns(rows), r)] == scalar(rows, r)


@settings(max_examples=200, deadline=None)
@given(digit_rows, limits, st.sampled_from(["openg2p", "mosip"]), st.sampled_from([1, 2]))
def test_prefilter_never_rejects_a_valid_id(
    rows: list[str], lim: FilterLimits, profile: f.Profile, stage: int
) -> None:
    r = Rules.resolve(profile, len(rows[0]) + 1, lim)
    bodies = columns(rows)
    pre = prefilter(bodies, r, stage)
    for row, rejected in zip(rows, pre, strict=True):
        if rejected:  # whatever the check digit, the whole ID fails
            assert all(f.rejected_by(row + d, r) for d in "0123456789")


def test_wrong_length_is_rejected() -> None:
    assert reject(np.zeros((9, 3), dtype=np.uint8), OPENG2P).all()
