from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.checkdigit import verhoeff_columns, verhoeff_digit, verhoeff_valid

bodies = st.text(alphabet="0123456789", min_size=1, max_size=25)


def test_design_example() -> None:
    assert verhoeff_digit("1234567890") == "2"
    assert verhoeff_valid("12345678902")


def test_known_vector() -> None:
    # The classic example: 236 -> check digit 3.
    assert verhoeff_digit("236") == "3"
    assert verhoeff_valid("2363")
    assert not verhoeff_valid("2364")


@given(bodies)
def test_appended_digit_validates(body: str) -> None:
    assert verhoeff_valid(body + verhoeff_digit(body))


@given(bodies, st.data())
def test_detects_every_single_digit_error(body: str, data: st.DataObject) -> None:
    full = body + verhoeff_digit(body)
    i = data.draw(st.integers(0, len(full) - 1))
    wrong = data.draw(st.sampled_from([d for d in "0123456789" if d != full[i]]))
    assert not verhoeff_valid(full[:i] + wrong + full[i + 1 :])


@given(bodies.filter(lambda b: len(b) >= 1), st.data())
def test_detects_adjacent_transpositions(body: str, data: st.DataObject) -> None:
    full = body + verhoeff_digit(body)
    i = data.draw(st.integers(0, len(full) - 2))
    if full[i] != full[i + 1]:
        swapped = full[:i] + full[i + 1] + full[i] + full[i + 2 :]
        assert not verhoeff_valid(swapped)


@given(st.lists(st.text(alphabet="0123456789", min_size=9, max_size=9), min_size=1, max_size=50))
def test_vectorised_matches_scalar(rows: list[str]) -> None:
    cols = np.array([[int(c) for c in r] for r in rows], dtype=np.uint8).T.copy()
    assert [str(d) for d in verhoeff_columns(cols)] == [verhoeff_digit(r) for r in rows]


def test_rejects_non_digits() -> None:
    assert not verhoeff_valid("")
    assert not verhoeff_valid("12a4")
    assert not verhoeff_valid("\uff11\uff12\uff13")  # full-width digits
