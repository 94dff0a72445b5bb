"""The drill's clock hook: off by default, a step back per signal when set."""

from __future__ import annotations

from dispenser.clock_hook import CLOCK_STEP_ENV, SteppedClock, clock_from_environment
from shared.domain.snowflake import wall_clock_ms


def test_unset_the_minters_read_the_wall_clock_itself() -> None:
    assert clock_from_environment({}) is wall_clock_ms
    assert clock_from_environment({CLOCK_STEP_ENV: ""}) is wall_clock_ms


def test_each_step_moves_the_clock_back_and_it_stays_back() -> None:
    clock = clock_from_environment({CLOCK_STEP_ENV: "1500"})
    assert isinstance(clock, SteppedClock)
    clock.step_back()
    clock.step_back()
    assert clock.behind_ms == 3_000
    assert 2_990 <= wall_clock_ms() - clock() <= 3_010
