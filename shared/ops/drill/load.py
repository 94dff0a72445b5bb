"""Bounded HTTP load that records every key received and every failure, with times."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp


@dataclass
class RecordingLoad:
    urls: list[str]
    name: str  # of the ID type taken
    clients: int = 8
    max_requests: int = 2_000_000
    keys: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, bool]] = field(default_factory=list)  # (time, dispensed)
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def dispensed(self) -> int:
        return sum(self.keys.values())

    @property
    def duplicates(self) -> int:
        return self.dispensed - len(self.keys)

    def stop(self) -> None:
        self._stop.set()

    async def run(self, deadline: float) -> None:
        timeout = aiohttp.ClientTimeout(total=3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._client(session, n, deadline) for n in range(self.clients)))

    async def _client(self, session: aiohttp.ClientSession, n: int, deadline: float) -> None:
        i = n
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.requests >= self.max_requests:
                return
            self.requests += 1
            i += 1
            base = self.urls[i % len(self.urls)]
            batch = i % 2 == 0
            url = (
                f"{base}/v1/keys/{self.name}?count=20"
                if batch
                else f"{base}/v1/idgenerator/{self.name}/id"
            )
            got = await self._request(session, url, batch)
            self.events.append((time.monotonic(), bool(got)))
            self.keys.update(got)
            if not got:
                await asyncio.sleep(0.02)

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
        length, start = max((b - a, a) for a, b in itertools.pairwise([fault_at, *served]))
        return (start - fault_at) * 1000, length * 1000
