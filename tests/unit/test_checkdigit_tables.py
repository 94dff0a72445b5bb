"""Verhoeff's tables against the published ones, entry by entry, and known check digits.

Generation and validation share the tables, so a wrong entry would still validate
here and fail in every other Verhoeff implementation (OpenG2P, MOSIP). The tables are
checked twice: against the published D5 tables (Verhoeff 1969, as printed in Gallian
1991 and every reference implementation) and against their definitions.
"""

from __future__ import annotations

import pytest

from shared.domain import checkdigit
from shared.domain.checkdigit import verhoeff_digit, verhoeff_valid

PUBLISHED_D = (
    "0123456789",
    "1234067895",
    "2340178956",
    "3401289567",
    "4012395678",
    "5987604321",
    "6598710432",
    "7659821043",
    "8765932104",
    "9876543210",
)
PUBLISHED_P = (
    "0123456789",
    "1576283094",
    "5803796142",
    "8916043527",
    "9453126870",
    "4286573901",
    "2793806415",
    "7046913258",
)
PUBLISHED_INV = "0432156789"


@pytest.mark.parametrize("row", range(10))
def test_multiplication_table_is_the_published_one(row: int) -> None:
    assert checkdigit._D[row] == tuple(int(c) for c in PUBLISHED_D[row])


@pytest.mark.parametrize("row", range(8))
def test_permutation_table_is_the_published_one(row: int) -> None:
    assert checkdigit._P[row] == tuple(int(c) for c in PUBLISHED_P[row])
    assert checkdigit._P_NP[row].tolist() == [int(c) for c in PUBLISHED_P[row]]


def test_inverse_table_is_the_published_one() -> None:
    assert tuple(int(c) for c in PUBLISHED_INV) == checkdigit._INV
    assert checkdigit._INV_NP.tolist() == [int(c) for c in PUBLISHED_INV]


def d5(j: int, k: int) -> int:
    """D5 by definition: 0-4 are the rotations r^i, 5-9 the reflections s r^i."""
    if j < 5:
        return (j + k) % 5 if k < 5 else 5 + (j + k) % 5
    return 5 + (j - k) % 5 if k < 5 else (j - k) % 5


def test_tables_match_their_definitions() -> None:
    sigma = checkdigit._P[1]  # p(i) is the permutation (1 5 8 9 4 2 7 0)(3 6) applied i times
    for j in range(10):
        for k in range(10):
            assert checkdigit._D[j][k] == d5(j, k)
        assert checkdigit._D[j][checkdigit._INV[j]] == 0
        for i in range(1, 8):
            assert checkdigit._P[i][j] == sigma[checkdigit._P[i - 1][j]]
    cycle = [1, 5, 8, 9, 4, 2, 7, 0]
    for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert sigma[a] == b
    assert (sigma[3], sigma[6]) == (6, 3)


def reference_digit(body: str) -> str:
    """An independent implementation, from the definitions alone."""
    sigma = (1, 5, 7, 6, 2, 8, 3, 0, 9, 4)
    c = 0
    for i, ch in enumerate(reversed(body)):
        digit = int(ch)
        for _ in range((i + 1) % 8):
            digit = sigma[digit]
        c = d5(c, digit)
    inverse = next(k for k in range(10) if d5(c, k) == 0)
    return str(inverse)


KNOWN = {
    "236": "3",  # Verhoeff's worked example, as in every reference
    "12345": "1",
    "142857": "0",
    "123456789012": "0",
}


@pytest.mark.parametrize(("body", "digit"), sorted(KNOWN.items()))
def test_known_check_digits(body: str, digit: str) -> None:
    assert reference_digit(body) == digit
    assert verhoeff_digit(body) == digit
    assert verhoeff_valid(body + digit)


def test_every_entry_of_every_permutation_row_reaches_the_digit() -> None:
    """Bodies that route each digit through each row p(1..7): any wrong entry shows."""
    for position in range(8):
        for digit in "0123456789":
            for filler in "0123456789":
                body = digit + filler * position  # ``digit`` sits at reversed index position
                assert verhoeff_digit(body) == reference_digit(body), body
