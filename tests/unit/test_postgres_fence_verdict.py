"""The fence's verdict: the same rule as the SQL guard, on the locked clock row."""

from __future__ import annotations

import pytest

from shared.stores.fence.sync_record import Record
from shared.stores.fence.verdict import ClockRow, verdict

DB = "7712819248751995008/kd"


def row(timeline: int, fork: int, clock: int, here: int, database: str = DB) -> ClockRow:
    return ClockRow(timeline, fork, clock, here, database)


def trusted(timeline: int, fork: int, clock: int) -> Record:
    return Record(timeline=timeline, fork=fork, clock=clock, database=DB)


@pytest.mark.parametrize(
    ("clock_row", "record", "expected"),
    [
        (row(0, 0, 0, 1), Record(), "vouch"),  # a new database, no record yet
        (row(1, 0, 50, 1), trusted(1, 0, 50), "ok"),
        (row(1, 0, 40, 1), trusted(1, 0, 50), "behind"),  # restored snapshot
        # promoted replica: first write on timeline 2 forks from its clock
        (row(1, 0, 50, 2), trusted(1, 0, 50), "ok"),
        (row(1, 0, 45, 2), trusted(1, 0, 50), "behind"),
        # already wrote on timeline 2: its fork point is what counts
        (row(2, 45, 90, 2), trusted(1, 0, 50), "behind"),
        (row(2, 50, 90, 2), trusted(1, 0, 50), "ok"),
        # an older timeline than the record's: an old primary still taking writes
        # (a split brain) never fences, and so never takes the record back
        (row(1, 0, 50, 1), trusted(2, 10, 12), "superseded"),
        (row(1, 0, 500, 1), trusted(2, 10, 12), "superseded"),
        # the record's timeline, another history: a second server promoted to the same
        # timeline number, or this one from before a fence the record holds
        (row(2, 51, 90, 2), trusted(2, 50, 60), "behind"),
        # Redis lost state: PostgreSQL must not have forked since its last write
        (row(1, 0, 5, 1), Record(timeline=1, clock=3, untrusted=True), "vouch"),
        (row(1, 0, 50, 2), Record(timeline=1, clock=10, untrusted=True), "halt"),
        (row(0, 0, 0, 2), Record(untrusted=True), "vouch"),
        (row(0, 0, 0, 2), Record(), "vouch"),  # Redis restarted empty, first write
        (row(1, 0, 50, 2), Record(), "halt"),  # restarted empty after a promotion
        # what Redis still has bounds the truth from below
        (row(1, 0, 40, 1), Record(timeline=1, clock=50, untrusted=True), "halt"),
        (row(1, 0, 90, 1), Record(timeline=2, clock=10, untrusted=True), "superseded"),
        (row(1, 0, 90, 1), Record(timeline=1, clock=10, untrusted=True, fence_needed=True), "halt"),
        # a fence's claim Redis lost: the new history started after all it recorded
        (row(1, 60, 70, 1), Record(timeline=1, fork=0, clock=50, untrusted=True), "vouch"),
        # another database brought to a bound namespace
        (row(1, 0, 50, 1, "1/other"), trusted(1, 0, 50), "foreign"),
        (row(1, 0, 50, 1, "1/other"), Record(untrusted=True, database=DB), "foreign"),
    ],
)
def test_verdict(clock_row: ClockRow, record: Record, expected: str) -> None:
    assert verdict(clock_row, record) == expected


def test_record_parses_the_redis_hash() -> None:
    record = Record.parse(
        {
            "timeline": "2",
            "fork": "7",
            "clock": "9",
            "untrusted": "1",
            "leased:farmer": "40",
            "database": DB,
        }
    )
    assert (record.timeline, record.fork, record.clock) == (2, 7, 9)
    assert record.untrusted and not record.halted and not record.fence_needed
    assert record.leased == {"farmer": 40}
    assert record.database == DB
    assert record.guard_args() == [2, 9, 7, 1]
