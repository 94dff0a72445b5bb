"""The fence's verdict: the same rule as the SQL guard, on the locked clock row."""

from __future__ import annotations

import pytest

from shared.stores.postgres_fence import ClockRow, verdict
from shared.stores.sync_record import Record


def row(timeline: int, fork: int, clock: int, here: int) -> ClockRow:
    return ClockRow(timeline, fork, clock, here)


@pytest.mark.parametrize(
    ("clock_row", "record", "expected"),
    [
        (row(0, 0, 0, 1), Record(), "ok"),  # a new database, no record yet
        (row(1, 0, 50, 1), Record(timeline=1, clock=50), "ok"),
        (row(1, 0, 40, 1), Record(timeline=1, clock=50), "behind"),  # restored snapshot
        # promoted replica: first write on timeline 2 forks from its clock
        (row(1, 0, 50, 2), Record(timeline=1, clock=50), "ok"),
        (row(1, 0, 45, 2), Record(timeline=1, clock=50), "behind"),
        # already wrote on timeline 2: its fork point is what counts
        (row(2, 45, 90, 2), Record(timeline=1, clock=50), "behind"),
        (row(2, 50, 90, 2), Record(timeline=1, clock=50), "ok"),
        (row(1, 0, 50, 1), Record(timeline=2, clock=10), "behind"),  # older timeline
        # Redis lost state: PostgreSQL must not have forked since its last write
        (row(1, 0, 5, 1), Record(timeline=1, clock=50, untrusted=True), "ok"),
        (row(1, 0, 50, 2), Record(timeline=1, clock=10, untrusted=True), "halt"),
        (row(0, 0, 0, 2), Record(untrusted=True), "ok"),
    ],
)
def test_verdict(clock_row: ClockRow, record: Record, expected: str) -> None:
    assert verdict(clock_row, record) == expected


def test_record_parses_the_redis_hash() -> None:
    record = Record.parse(
        {"timeline": "2", "fork": "7", "clock": "9", "untrusted": "1", "leased:farmer": "40"}
    )
    assert (record.timeline, record.fork, record.clock) == (2, 7, 9)
    assert record.untrusted and not record.halted and not record.fence_needed
    assert record.leased == {"farmer": 40}
    assert record.guard_args() == [2, 9, True]
