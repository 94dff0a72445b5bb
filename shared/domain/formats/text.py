"""Counter values to text, a block at a time: digit columns in any radix up to 62, and
columns of ASCII codes to strings (used by every format and by snowflake's base62 text)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.domain.arrays import U64, Cols

# _DECIMAL4[:, v] are the 4 digits of v.
_DECIMAL4 = np.array([[int(c) for c in f"{v:04d}"] for v in range(10_000)], dtype=np.uint8).T
MAX_RADIX = 62


@cache
def digit_pairs(radix: int) -> Cols:
    """digit_pairs(r)[:, v]: the 2 digits of v in radix ``r`` (v < r**2)."""
    if not 2 <= radix <= MAX_RADIX:
        raise ValueError(f"radix must be 2..{MAX_RADIX}, got {radix}")
    values = np.arange(radix * radix)
    return np.array([values // radix, values % radix], dtype=np.uint8)


def radix_columns(values: U64, width: int, radix: int) -> Cols:
    """Zero-padded digits of ``values``, most significant first, one column per digit."""
    out = np.empty((width, values.size), dtype=np.uint8)
    if radix == 10:
        # uint64 division is slow: cut into 8-digit uint32 pieces first.
        rest, end = values, width
        while end > 0:
            take = min(8, end)
            if end > take:
                quotient = rest // np.uint64(10**take)
                piece = rest - quotient * np.uint64(10**take)
                rest = quotient
            else:
                piece = rest
            _fill_columns(out[end - take : end], piece.astype(np.uint32), 10)
            end -= take
    else:
        _fill_columns(out, values, radix)
    return out


def _fill_columns(out: Cols, values: npt.NDArray[Any], radix: int) -> None:
    """Digits of ``values`` (each fits ``out``) via 4-digit/2-digit lookup tables.

    Written for numpy's speed profile: ``//`` by a scalar is fast, ``%`` is not,
    and gathering one table row at a time beats a 2-D gather.
    """
    table, chunk = (_DECIMAL4, 4) if radix == 10 else (digit_pairs(radix), 2)
    rest = values
    end = out.shape[0]
    while end > 0:
        take = min(chunk, end)
        if end > take:
            base = rest.dtype.type(radix**take)
            quotient = rest // base
            part = (rest - quotient * base).astype(np.intp)
            rest = quotient
        else:
            part = rest.astype(np.intp)
        for j in range(take):
            out[end - take + j] = table[chunk - take + j][part]
        end -= take


def to_strings(cols: Cols, prefix: str = "", suffix: str = "") -> list[str]:
    """One string per column-stacked ID (``cols`` holds ASCII codes)."""
    m, n = cols.shape
    if n == 0:
        return []
    p, width = len(prefix), len(prefix) + m + len(suffix)
    rows = np.empty((n, width), dtype=np.uint8)
    rows[:, :p] = np.frombuffer(prefix.encode(), dtype=np.uint8)
    rows[:, p : p + m] = cols.T
    rows[:, p + m :] = np.frombuffer(suffix.encode(), dtype=np.uint8)
    text = rows.tobytes().decode("ascii")
    return [text[i : i + width] for i in range(0, len(text), width)]
