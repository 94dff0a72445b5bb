"""A dispenser's snowflake holders on a fake lease source: re-acquire, refuse, release."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from prometheus_client import CollectorRegistry

from dispenser.metrics import DispenserMetrics
from dispenser.snowflake import Snowflakes
from shared.domain.config import SnowflakeConfig
from shared.domain.errors import NoMachineIdFree
from shared.domain.snowflake import SnowflakeType
from tests.unit.test_snowflake import FakeLease

DEADLINE_S = 5.0


class Source:
    """Grants FakeLeases (machine IDs 0, 1, ...); refuses the first ``refusals`` calls."""

    def __init__(self, refusals: int = 0, settling: bool = False) -> None:
        self.refusals, self.settling = refusals, settling
        self.granted: list[FakeLease] = []
        self.released: list[FakeLease] = []

    @asynccontextmanager
    async def __call__(self, id_type: SnowflakeType) -> AsyncIterator[FakeLease]:
        if self.refusals:
            self.refusals -= 1
            if self.settling:  # the fence took over: grants resume in a while
                raise NoMachineIdFree(id_type.pool, 0, 3, "settling", settling_s=0.1)
            raise NoMachineIdFree(id_type.pool, 0, 3, "every ID is held")
        lease = FakeLease(machine_id=len(self.granted), floor_ms=1)
        self.granted.append(lease)
        try:
            yield lease
        finally:
            self.released.append(lease)


def snowflakes(source: Source) -> Snowflakes:
    types = {"events": SnowflakeType("events", SnowflakeConfig(kind="snowflake"))}
    return Snowflakes(types, source, DispenserMetrics(CollectorRegistry()))


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_lost_lease_is_replaced_and_every_lease_released() -> None:
    source = Source()
    held = snowflakes(source)
    await held.start(DEADLINE_S)
    minter = held.minters["events"]
    first = minter.mint(3)
    assert held.states()["events"] == {"state": "serving", "machine_id": 0}
    source.granted[0].lost.set()
    assert held.states()["events"] == {"state": "no_machine_id"}
    await until(lambda: len(source.granted) == 2 and minter.lease is source.granted[1])
    ids = minter.mint(3)
    assert ids[0].start > first[-1].stop
    await held.close()
    assert source.released == source.granted
    assert minter.lease is None


async def test_refused_acquisitions_are_retried() -> None:
    source = Source(refusals=1)
    held = snowflakes(source)
    await held.start(0.05)
    assert held.states()["events"] == {"state": "no_machine_id"}
    await until(lambda: held.states()["events"]["state"] == "serving")
    await held.close()
    assert source.released == source.granted


@pytest.mark.parametrize("settling", [True, False])
async def test_the_wait_after_a_takeover_is_one_line_of_info_other_refusals_warn(
    caplog: pytest.LogCaptureFixture, settling: bool
) -> None:
    """A first start (or failover) waits one lease TTL: expected, said once. Control:
    every ID held is a warning at each attempt."""
    caplog.set_level(logging.INFO, logger="dispenser.snowflake")
    source = Source(refusals=3, settling=settling)
    held = snowflakes(source)
    await held.start(0.0)
    await until(lambda: held.states()["events"]["state"] == "serving")
    await held.close()
    events = [(r.levelname, r.getMessage()) for r in caplog.records]
    if settling:
        assert events.count(("INFO", "machine_id_settling")) == 1
        assert not [e for e in events if e[0] == "WARNING"]
    else:
        assert events.count(("WARNING", "machine_id_lease_failed")) == 3
