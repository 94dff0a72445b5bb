"""The ID filters over columns of digits: ``cols[i]`` holds digit ``i`` of every ID.

Twin of ``shared.domain.filters``. Columns are contiguous, so every step is a plain
vector operation over uint8 arrays. ``prefilter`` applies the cheapest, most
selective rules to the ID body (check digit not yet known) so the full rule set
and the check digit run only on the survivors.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.domain.arrays import Cols, Mask
from shared.domain.filters import CYCLIC_NUMBERS, Rules


def _none(n: int) -> Mask:
    return np.zeros(n, dtype=np.bool_)


def _any_run(flags: Sequence[Mask], width: int, n: int) -> Mask:
    """IDs with ``width`` consecutive True flags."""
    out = _none(n)
    for start in range(len(flags) - width + 1):
        out |= reduce(np.logical_and, flags[start : start + width])
    return out


def _contains(cols: Cols, pattern: str) -> Mask:
    m, n = cols.shape
    if not pattern or len(pattern) > m or not pattern.isdigit():
        return _none(n)
    out = _none(n)
    digits = [np.uint8(int(c)) for c in pattern]
    for start in range(m - len(pattern) + 1):
        out |= reduce(np.logical_and, (cols[start + k] == d for k, d in enumerate(digits)))
    return out


def _starts_with(cols: Cols, prefixes: Sequence[str]) -> Mask:
    out = _none(cols.shape[1])
    for prefix in prefixes:
        if prefix.isdigit() and len(prefix) <= cols.shape[0]:
            out |= reduce(np.logical_and, (cols[k] == int(c) for k, c in enumerate(prefix)))
    return out


def _repeats_within(cols: Cols, max_distance: int) -> Mask:
    out = _none(cols.shape[1])
    m = cols.shape[0]
    for d in range(1, min(max_distance, m - 1) + 1):
        for i in range(m - d):
            out |= cols[i] == cols[i + d]
    return out


def _block_values(cols: Cols, width: int) -> list[npt.NDArray[Any]]:
    """Every ``width``-digit window as one integer, in the narrowest dtype that fits."""
    dtype: type[np.unsignedinteger[Any]] = np.uint64
    for limit, narrow in ((2, np.uint8), (4, np.uint16), (9, np.uint32)):
        if width <= limit:
            dtype = narrow
            break
    ten = dtype(10)
    acc = [cols[i].astype(dtype) for i in range(cols.shape[0] - width + 1)]
    for k in range(1, width):
        acc = [a * ten + cols[i + k] for i, a in enumerate(acc)]
    return acc


def _repeating_block(cols: Cols, width: int) -> Mask:
    m, n = cols.shape
    out = _none(n)
    if width > m // 2:
        return out
    blocks = _block_values(cols, width)
    for i in range(m - width):
        for j in range(i + width, m - width + 1):
            out |= blocks[i] == blocks[j]
    return out


def _sequence(cols: Cols, limit: int, wrap: bool) -> Mask:
    n = cols.shape[1]
    steps = [cols[i + 1] - cols[i] for i in range(cols.shape[0] - 1)]  # uint8: -1 is 255
    if not wrap:
        up = [s == 1 for s in steps]
        down = [s == 255 for s in steps]
        return _any_run(up, limit - 1, n) | _any_run(down, limit - 1, n)
    # MOSIP: windows of 0123456789012... (+1 mod 10; 9->0 is 247) or 9876543210987...
    up = [(s == 1) | (s == 247) for s in steps]
    down = [(s == 255) | (s == 9) for s in steps]
    out = _none(n)
    for start in range(cols.shape[0] - limit + 1):
        window = range(start, start + limit - 1)
        rising = reduce(np.logical_and, (up[i] for i in window), np.ones(n, dtype=np.bool_))
        falling = reduce(np.logical_and, (down[i] for i in window), np.ones(n, dtype=np.bool_))
        # Past 11 digits a window fits the 20-digit strings only from some first digits.
        if limit <= 20:
            out |= rising & (cols[start] <= 20 - limit)
            out |= falling & (cols[start] >= max(limit - 11, 0))
    return out


def _even_runs(cols: Cols, limit: int, zero_is_even: bool) -> Mask:
    flags = [(c & 1) == 0 for c in cols]
    if not zero_is_even:
        flags = [f & (c != 0) for f, c in zip(flags, cols, strict=True)]
    return _any_run(flags, limit, cols.shape[1])


def _ends_match(cols: Cols, width: int, reverse: bool) -> Mask:
    m = cols.shape[0]
    tail = list(range(m - width, m))
    if reverse:
        tail.reverse()
    pairs = zip(range(width), tail, strict=True)
    return reduce(np.logical_and, (cols[a] == cols[b] for a, b in pairs))


def reject(cols: Cols, rules: Rules) -> Mask:
    """IDs rejected by any filter of the profile (``cols`` includes the check digit)."""
    m, n = cols.shape
    if m != rules.length:
        return np.ones(n, dtype=np.bool_)
    if rules.profile == "none":
        return _none(n)
    mosip = rules.profile == "mosip"
    if mosip:
        out = _starts_with(cols, rules.not_start_with)
    else:
        out = np.isin(cols[0], rules.banned_first_digits)
    out |= _sequence(cols, rules.sequence, wrap=mosip)
    out |= _repeats_within(cols, rules.repeating_digit if mosip else rules.repeating_digit - 1)
    out |= _repeating_block(cols, rules.repeating_block)
    out |= _even_runs(cols, rules.conjugative_even, zero_is_even=not mosip)
    for width, reverse in ((rules.first_equals_last, False), (rules.first_equals_reverse, True)):
        if mosip or m >= 2 * width:
            out |= _ends_match(cols, width, reverse)
    for entry in (*rules.restricted, *CYCLIC_NUMBERS):
        out |= _contains(cols, entry)
    return out


def prefilter(body: Cols, rules: Rules, stage: int) -> Mask:
    """IDs whose body alone already fails; run stage 1 (cheapest, most selective),
    drop what it rejects, then stage 2.

    Sound because every rule used here looks at a window inside the body, and a
    violation inside the body is a violation of the whole ID.
    """
    n = body.shape[1]
    if rules.profile == "none":
        return _none(n)
    mosip = rules.profile == "mosip"
    distance = rules.repeating_digit if mosip else rules.repeating_digit - 1
    if stage == 1:
        if mosip:
            prefixes = [p for p in rules.not_start_with if len(p) < rules.length]
            out = _starts_with(body, prefixes)
        else:
            out = np.isin(body[0], rules.banned_first_digits)
        return out | _repeats_within(body, min(distance, 1))
    out = _sequence(body, rules.sequence, wrap=mosip)
    out |= _repeats_within(body, distance)
    out |= _repeating_block(body, rules.repeating_block)
    out |= _even_runs(body, rules.conjugative_even, zero_is_even=not mosip)
    for entry in (*rules.restricted, *CYCLIC_NUMBERS):
        out |= _contains(body, entry)
    return out
