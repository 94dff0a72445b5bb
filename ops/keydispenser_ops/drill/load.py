"""Bounded HTTP load that records every key received and every failure, with times."""

from __future__ import annotations

import asyncio
import itertools
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from shared.domain.config import SnowflakeConfig
from shared.domain.snowflake import SnowflakeType


def _opened(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


@dataclass
class RecordingLoad:
    """Clients taking keys (single and batch) from every dispenser, recording every key
    received, when, and every failure; one key in ``mark_every`` received alone is
    marked used (``marked``: the ones the dispenser accepted, 202; ``mark_every`` 0:
    none)."""

    urls: list[str]
    name: str  # of the ID type taken
    clients: int = 8
    max_requests: int = 2_000_000
    mark_every: int = 10
    headers: dict[str, str] = field(default_factory=dict)  # every request's (an API key)
    keys: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, bool]] = field(default_factory=list)  # (time, dispensed)
    received_at: dict[str, float] = field(default_factory=dict)  # key -> monotonic time
    requested_at: dict[str, float] = field(default_factory=dict)  # key -> its request sent
    marked: dict[str, float] = field(default_factory=dict)  # key -> when its mark was accepted
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    quiet: list[tuple[float, float]] = field(default_factory=list)  # paused: (from, to)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _open: asyncio.Event = field(default_factory=lambda: _opened(asyncio.Event()))
    _paused_at: float | None = None

    @property
    def dispensed(self) -> int:
        return sum(self.keys.values())

    def pause(self) -> None:
        """Hold every request until ``resume`` (a quiet spell: not an outage)."""
        self._open.clear()
        self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            self.quiet.append((self._paused_at, time.monotonic()))
            self._paused_at = None
        self._open.set()

    @property
    def duplicates(self) -> int:
        return self.dispensed - len(self.keys)

    def stop(self) -> None:
        self._stop.set()
        self._open.set()

    async def run(self, deadline: float) -> None:
        timeout = aiohttp.ClientTimeout(total=3)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session:
            await asyncio.gather(*(self._client(session, n, deadline) for n in range(self.clients)))

    async def _client(self, session: aiohttp.ClientSession, n: int, deadline: float) -> None:
        i = n
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.requests >= self.max_requests:
                return
            await self._open.wait()
            self.requests += 1
            i += 1
            base = self.urls[i % len(self.urls)]
            batch = i % 2 == 0
            url = (
                f"{base}/v1/keys/{self.name}?count=20"
                if batch
                else f"{base}/v1/idgenerator/{self.name}/id"
            )
            sent = time.monotonic()
            got = await self._request(session, url, batch)
            now = time.monotonic()
            self.events.append((now, bool(got)))
            self.keys.update(got)
            for key in got:
                self.received_at.setdefault(key, now)
                self.requested_at.setdefault(key, sent)
            if not got:
                await asyncio.sleep(0.02)
            elif self.mark_every and not batch and i % self.mark_every == 1:
                await self._mark(session, base, got[0])

    async def _request(self, session: aiohttp.ClientSession, url: str, batch: bool) -> list[str]:
        try:
            async with session.post(url) as reply:
                body = await reply.json(content_type=None)
                if reply.status == 200:
                    return list(body["keys"]) if batch else [body["response"]["id"]]
                self.errors[str(body["errors"][0]["errorCode"])] += 1
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.errors[type(exc).__name__] += 1
        return []

    async def _mark(self, session: aiohttp.ClientSession, base: str, key: str) -> None:
        try:
            async with session.post(f"{base}/v1/keys/{self.name}/used", json={"keys": [key]}) as r:
                if r.status == 202:
                    self.marked[key] = time.monotonic()
                else:
                    self.errors[f"mark_{r.status}"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.errors[f"mark_{type(exc).__name__}"] += 1

    def served_between(self, start: float, until: float) -> int:
        """Requests answered with keys in [start, until)."""
        return sum(1 for t, ok in self.events if ok and start <= t < until)

    def disruption(self, fault_at: float, until: float) -> tuple[float, float]:
        """The longest stretch without a key dispensed after the fault, before ``until``:
        (ms from the fault to the stretch's start, its length in ms).

        A stretch starts at the fault or at a key dispensed after it, and ends at the
        next key dispensed: for a SIGKILLed primary it is the time from the fault to
        the first key after it. A Sentinel failover leaves the old primary serving for
        seconds, so there the stretch starts when that primary is demoted.
        Returns (0, -1) when no key was dispensed at all after the fault.
        """
        served = [t for t, ok in self.events if ok and fault_at <= t < until]
        if not served:
            return 0.0, -1.0
        # A quiet spell (the load paused on purpose) is no outage: its time is left out.
        length, start = max(
            (b - a - self._quiet_within(a, b), a)
            for a, b in itertools.pairwise([fault_at, *served])
        )
        return (start - fault_at) * 1000, length * 1000

    def _quiet_within(self, a: float, b: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, begin)) for begin, end in self.quiet)


@dataclass
class SnowflakeLoad:
    """Batches of snowflake IDs from every dispenser, on fresh connections so that
    every worker behind a port answers some."""

    urls: list[str]
    name: str
    config: dict[str, Any]  # the type's configuration, to decode its IDs
    clients: int = 2
    count: int = 50
    max_requests: int = 1_000_000
    headers: dict[str, str] = field(default_factory=dict)  # every request's (an API key)
    ids: array[int] = field(default_factory=lambda: array("q"))
    batches: list[tuple[float, int]] = field(default_factory=list)  # (wall ms, machine)
    errors: Counter[str] = field(default_factory=Counter)
    error_events: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, code)
    requests: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        config = SnowflakeConfig.model_validate(self.config)
        self.layout = SnowflakeType(self.name, config).layout

    def stop(self) -> None:
        self._stop.set()

    async def run(self, deadline: float) -> None:
        timeout = aiohttp.ClientTimeout(total=3)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=connector, headers=self.headers
        ) as session:
            await asyncio.gather(*(self._client(session, n, deadline) for n in range(self.clients)))

    async def _client(self, session: aiohttp.ClientSession, n: int, deadline: float) -> None:
        i = n
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.requests >= self.max_requests:
                return
            self.requests += 1
            i += 1
            url = f"{self.urls[i % len(self.urls)]}/v1/keys/{self.name}?count={self.count}"
            if not await self._request(session, url):
                await asyncio.sleep(0.02)

    async def _request(self, session: aiohttp.ClientSession, url: str) -> bool:
        code = ""
        try:
            async with session.post(url) as reply:
                body = await reply.json(content_type=None)
                if reply.status == 200:
                    self._record([int(k) for k in body["keys"]])
                    return True
                code = str(body["errors"][0]["errorCode"])
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            code = type(exc).__name__
        self.errors[code] += 1
        self.error_events.append((time.monotonic(), code))
        return False

    def _record(self, values: list[int]) -> None:
        if values:
            self.ids.extend(values)
            machine = self.layout.decompose(values[0]).machine
            self.batches.append((time.time() * 1000, machine))

    def errors_since(self, since: float, code: str) -> int:
        return sum(1 for at, c in self.error_events if at >= since and c == code)

    def duplicates(self) -> int:
        values = np.frombuffer(self.ids, dtype=np.int64)
        return int(values.size - np.unique(values).size)
