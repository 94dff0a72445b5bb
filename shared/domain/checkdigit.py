"""Verhoeff check digit (dihedral group D5), scalar and vectorised."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_D = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
    (1, 2, 3, 4, 0, 6, 7, 8, 9, 5),
    (2, 3, 4, 0, 1, 7, 8, 9, 5, 6),
    (3, 4, 0, 1, 2, 8, 9, 5, 6, 7),
    (4, 0, 1, 2, 3, 9, 5, 6, 7, 8),
    (5, 9, 8, 7, 6, 0, 4, 3, 2, 1),
    (6, 5, 9, 8, 7, 1, 0, 4, 3, 2),
    (7, 6, 5, 9, 8, 2, 1, 0, 4, 3),
    (8, 7, 6, 5, 9, 3, 2, 1, 0, 4),
    (9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
)
_P = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
    (1, 5, 7, 6, 2, 8, 3, 0, 9, 4),
    (5, 8, 0, 3, 7, 9, 6, 1, 4, 2),
    (8, 9, 1, 6, 0, 4, 3, 5, 2, 7),
    (9, 4, 5, 3, 1, 2, 6, 8, 7, 0),
    (4, 2, 8, 6, 5, 7, 3, 9, 0, 1),
    (2, 7, 9, 3, 8, 0, 6, 4, 1, 5),
    (7, 0, 4, 6, 9, 1, 3, 2, 5, 8),
)
_INV = (0, 4, 3, 2, 1, 5, 6, 7, 8, 9)

_P_NP = np.array(_P, dtype=np.uint8)
_INV_NP = np.array(_INV, dtype=np.uint8)


def verhoeff_digit(digits: str) -> str:
    """The check digit to append to ``digits``."""
    c = 0
    for i, ch in enumerate(reversed(digits)):
        c = _D[c][_P[(i + 1) % 8][int(ch)]]
    return str(_INV[c])


def verhoeff_valid(number: str) -> bool:
    """True when the last digit of ``number`` is its correct Verhoeff check digit."""
    if not number or not number.isascii() or not number.isdigit():
        return False
    c = 0
    for i, ch in enumerate(reversed(number)):
        c = _D[c][_P[i % 8][int(ch)]]
    return c == 0


_D_FLAT = np.array(_D, dtype=np.uint8).ravel()


def verhoeff_columns(cols: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Check digit for every ID of a (digits, ids) column matrix."""
    c = np.zeros(cols.shape[1], dtype=np.uint8)
    m = cols.shape[0]
    for i in range(m):
        permuted = _P_NP[(i + 1) % 8][cols[m - 1 - i]]
        c = _D_FLAT[c * np.uint8(10) + permuted]
    out: npt.NDArray[np.uint8] = _INV_NP[c]
    return out
