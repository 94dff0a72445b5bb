"""Outage: one log line when a store goes down, one when it is back, back-off between."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared import runtime
from shared.domain.errors import StoreUnavailable
from shared.runtime import Outage, connect_with_retry

DOWN = StoreUnavailable("postgres", "connection refused")


def events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == runtime.__name__]


def test_back_off_doubles_up_to_the_cap_and_resets_on_success() -> None:
    outage = Outage("postgres", first_delay_s=0.2, max_delay_s=1.0)
    assert [outage.failed(DOWN) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    outage.succeeded()
    assert outage.failed(DOWN) == 0.2


def test_each_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=runtime.__name__)
    outage = Outage("postgres")
    outage.succeeded()  # nothing was down: nothing to say
    for _ in range(2):  # two outages of many failures each
        for _ in range(10):
            outage.failed(DOWN)
        outage.succeeded()
        outage.succeeded()
    assert events(caplog) == ["store_unavailable", "store_recovered"] * 2
    down = next(r for r in caplog.records if r.getMessage() == "store_unavailable")
    assert down.__dict__["store"] == "postgres" and "connection refused" in down.__dict__["error"]


async def test_connect_with_retry_rides_an_outage_out(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=runtime.__name__)
    waits: list[float] = []

    async def no_sleep(stop: asyncio.Event, seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(runtime, "sleep_or_stop", no_sleep)
    attempts = 0

    async def connect() -> str:
        nonlocal attempts
        attempts += 1
        if attempts <= 4:
            raise DOWN
        return "connected"

    assert await connect_with_retry(connect, "postgres", asyncio.Event()) == "connected"
    assert waits == [0.2, 0.4, 0.8, 1.6]
    assert events(caplog) == ["store_unavailable", "store_recovered"]


async def test_connect_with_retry_gives_up_when_asked_to_stop() -> None:
    stop = asyncio.Event()

    async def never() -> str:
        stop.set()  # e.g. SIGTERM while PostgreSQL is still down
        raise DOWN

    assert await asyncio.wait_for(connect_with_retry(never, "postgres", stop), 5) is None
