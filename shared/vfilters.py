"""The ten OpenG2P filters over a matrix of digits, one ID per row.

Twin of ``shared.filters``; returns a boolean mask of rows to REJECT.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from shared.filters import CYCLIC_NUMBERS
from shared.settings import FilterLimits

Digits = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]


def _rows(flags: Mask) -> Mask:
    """Rows with any True value."""
    return cast(Mask, flags.any(axis=1))


def _has_run(flags: Mask, width: int) -> Mask:
    """Rows with ``width`` consecutive True values."""
    n, m = flags.shape
    if width > m:
        return np.zeros(n, dtype=np.bool_)
    span = m - width + 1
    acc = flags[:, :span].copy()
    for k in range(1, width):
        acc &= flags[:, k : k + span]
    return _rows(acc)


def _contains(digits: Digits, pattern: str) -> Mask:
    """Rows whose digit string contains ``pattern`` (a string of digits)."""
    n, m = digits.shape
    w = len(pattern)
    if w == 0 or w > m or not pattern.isdigit():
        return np.zeros(n, dtype=np.bool_)
    span = m - w + 1
    acc = np.ones((n, span), dtype=np.bool_)
    for k, ch in enumerate(pattern):
        acc &= digits[:, k : k + span] == int(ch)
    return _rows(acc)


def _sequence(digits: Digits, limit: int) -> Mask:
    steps = digits[:, 1:].astype(np.int8) - digits[:, :-1].astype(np.int8)
    return _has_run(steps == 1, limit - 1) | _has_run(steps == -1, limit - 1)


def _repeating_digit(digits: Digits, limit: int) -> Mask:
    out = np.zeros(digits.shape[0], dtype=np.bool_)
    for d in range(1, min(limit, digits.shape[1])):
        out |= (digits[:, d:] == digits[:, :-d]).any(axis=1)
    return out


def _blocks(digits: Digits, width: int) -> npt.NDArray[np.int64]:
    """Value of every length-``width`` window, as an integer per (row, start)."""
    span = digits.shape[1] - width + 1
    acc = np.zeros((digits.shape[0], span), dtype=np.int64)
    for k in range(width):
        acc = acc * 10 + digits[:, k : k + span]
    return acc


def _repeating_block(digits: Digits, limit: int) -> Mask:
    m = digits.shape[1]
    out = np.zeros(digits.shape[0], dtype=np.bool_)
    if limit > m:
        return out
    blocks = _blocks(digits, limit)
    for i in range(m - limit):
        for j in range(i + limit, m - limit + 1):
            out |= blocks[:, i] == blocks[:, j]
    return out


def _first_equals_last(digits: Digits, limit: int, reverse: bool) -> Mask:
    m = digits.shape[1]
    if m < 2 * limit:
        return np.zeros(digits.shape[0], dtype=np.bool_)
    tail = digits[:, m - limit :]
    if reverse:
        tail = tail[:, ::-1]
    result: Mask = (digits[:, :limit] == tail).all(axis=1)
    return result


def openg2p_reject(digits: Digits, length: int, limits: FilterLimits) -> Mask:
    """Rows rejected by any of the ten filters (profile ``openg2p``)."""
    if digits.shape[1] != length:
        return np.ones(digits.shape[0], dtype=np.bool_)
    starts = [int(p) for p in limits.not_start_with if len(p) == 1 and p.isdigit()]
    out = np.isin(digits[:, 0], starts)
    out |= _sequence(digits, limits.sequence)
    out |= _repeating_digit(digits, limits.repeating_digit)
    out |= _repeating_block(digits, limits.repeating_block)
    out |= _has_run(digits % 2 == 0, limits.conjugative_even)
    out |= _first_equals_last(digits, limits.first_equals_last, reverse=False)
    out |= _first_equals_last(digits, limits.first_equals_reverse, reverse=True)
    for entry in (*limits.restricted_numbers, *CYCLIC_NUMBERS):
        out |= _contains(digits, entry)
    return out
