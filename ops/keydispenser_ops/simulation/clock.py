"""The simulation's time and chance: an event loop whose clock is virtual, and the
process-wide sources of time, identifiers and randomness made to follow one seed.

The loop never sleeps: when nothing is ready to run it moves its clock to the next
timer. Every interleaving of the actors comes from the delays the seed draws (each
round trip's, each fault's), so a seed reproduces its run exactly, and an hour of the
service passes in milliseconds.

While a run lasts, ``time.time``, ``time.monotonic``, ``uuid.uuid4`` and ``random`` (all
the real code and fakeredis read) follow the run: call ``patched(...)`` around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import selectors
import time
import uuid
from collections.abc import Iterator
from typing import Any

# The virtual clock starts at a date in 2027 (stream IDs, row times look like real ones).
EPOCH_S = 1_800_000_000.0


class _Selector(selectors.BaseSelector):
    """A selector with nothing to wait for: ``select`` moves the loop's clock instead."""

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise Deadlock("every task waits, and no timer is set")
        self.loop.advance(max(timeout, 0.0))
        return []

    def get_map(self) -> Any:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class Deadlock(RuntimeError):
    """Nothing can run any more: every task waits on something no timer ends."""


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = EPOCH_S
        # Timers due within a microsecond run now: a float near EPOCH_S resolves about
        # 0.24 us, and asyncio's default (the clock's own, 1 ns) would never reach one.
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


class Chance:
    """Every draw of a run, from its seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    def hex40(self) -> str:
        return f"{self.rng.getrandbits(160):040x}"


@contextlib.contextmanager
def patched(loop: VirtualLoop, chance: Chance) -> Iterator[None]:
    """time, uuid4 and the random module follow the run while it lasts."""
    saved = (time.time, time.monotonic, uuid.uuid4, random.getstate())
    time.time = loop.time
    time.monotonic = loop.time
    uuid.uuid4 = chance.uuid
    random.seed(chance.rng.getrandbits(64))
    try:
        yield
    finally:
        time.time, time.monotonic, uuid.uuid4 = saved[0], saved[1], saved[2]
        random.setstate(saved[3])
