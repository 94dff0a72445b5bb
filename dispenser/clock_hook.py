"""A test hook for the drill: step one process's snowflake clock back, on a signal.

With ``KD_TEST_CLOCK_STEP_MS=N`` in the environment, every SIGUSR1 moves this process's
minting clock N ms back, and it stays back (as a stepped system clock would). The system
clock is never touched. Unset (the default) the minters read the wall clock directly:
the hook costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping

from shared.domain.snowflake import Clock, wall_clock_ms

log = logging.getLogger(__name__)
CLOCK_STEP_ENV = "KD_TEST_CLOCK_STEP_MS"


class SteppedClock:
    """The wall clock minus the steps taken so far."""

    def __init__(self, step_ms: int) -> None:
        self.step_ms = step_ms
        self.behind_ms = 0

    def __call__(self) -> int:
        return wall_clock_ms() - self.behind_ms

    def step_back(self) -> None:
        self.behind_ms += self.step_ms
        log.warning(
            "clock_stepped_back", extra={"step_ms": self.step_ms, "behind_ms": self.behind_ms}
        )

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Step back on every SIGUSR1 delivered to this process."""
        loop.add_signal_handler(signal.SIGUSR1, self.step_back)


def clock_from_environment(environ: Mapping[str, str]) -> Clock:
    """The minters' clock: the wall clock, or a SteppedClock when the hook is set."""
    step = environ.get(CLOCK_STEP_ENV, "")
    return SteppedClock(int(step)) if step else wall_clock_ms


def arm(clock: Clock) -> None:
    """Install the signal handler when ``clock`` is the test hook (in the running loop)."""
    if isinstance(clock, SteppedClock):
        clock.arm(asyncio.get_running_loop())
