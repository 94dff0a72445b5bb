"""The pipeline bench's offered-load schedule: due times fixed up front, never drifting."""

from __future__ import annotations

import pytest

from keydispenser_ops.bench.pipeline import BATCH, Schedule


def test_requests_are_due_at_fixed_intervals_from_the_start() -> None:
    schedule = Schedule.at_rate(start=100.0, seconds=1.0, rate=200_000)
    due = []
    while (at := schedule.claim()) is not None:
        due.append(at)
    interval = BATCH / 200_000
    assert due == pytest.approx([100.0 + k * interval for k in range(40)])
    assert schedule.offered == 40  # 200,000 keys/s x 1 s in batches of 5,000


def test_a_late_client_does_not_shift_the_later_requests() -> None:
    schedule = Schedule.at_rate(start=0.0, seconds=1.0, rate=100_000)
    first, second = schedule.claim(), schedule.claim()
    schedule.sent_late(0.3)  # the second went out late: the third stays where it was
    assert (first, second, schedule.claim()) == pytest.approx((0.0, 0.05, 0.1))
    assert schedule.max_lag == pytest.approx(0.3)


def test_full_speed_claims_until_the_deadline_only() -> None:
    schedule = Schedule.at_rate(start=0.0, seconds=0.0, rate=0)
    assert schedule.interval == 0
    assert schedule.claim() is None and schedule.offered == 0
