"""Coalescing: concurrent single-key requests of one type share one Redis call.

A request joins its type's queue; while a pop is in flight, later requests wait and
the next pop takes them all with one ``LPOP count=n``. One pop per type is in flight
at a time, so under load each Redis round trip serves many requests, and with no
load a request waits for nothing but its own pop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shared.stores.hot_store import Popped

PopMany = Callable[[str, int, list[str]], Awaitable[Popped]]
Lost = Callable[[str, int], None]  # (type name, keys popped for waiters gone meanwhile)


Answer = tuple[str | None, Popped]
Waiter = tuple[str, "asyncio.Future[Answer]"]  # (client, where its answer goes)


class Coalescer:
    def __init__(self, pop_many: PopMany, max_batch: int, lost: Lost | None = None) -> None:
        """``pop_many(name, count, clients)`` pops ``count`` keys; ``clients`` names
        each key's API client, or holds one client name that stands for all. ``lost``
        is told of keys popped for waiters that were gone by the time they came."""
        self._pop_many = pop_many
        self._lost = lost
        self._max_batch = max_batch
        self._queues: dict[str, list[Waiter]] = {}
        self._draining: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.pops = 0  # Redis calls made
        self.served = 0  # requests answered through them

    def take(self, name: str, client: str) -> asyncio.Future[Answer]:
        """Await it for one key (None when the pool had none left for this request) and
        the pop result. A future, not a coroutine: one frame less per request."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = []
        queue.append((client, future))
        if name not in self._draining:
            self._draining.add(name)
            task = loop.create_task(self._drain(name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return future

    async def _drain(self, name: str) -> None:
        try:
            while queue := self._queues.pop(name, None):
                batch = queue[: self._max_batch]
                if len(queue) > self._max_batch:
                    self._queues[name] = queue[self._max_batch :]
                await self._serve(name, batch)
        finally:
            self._draining.discard(name)

    async def _serve(self, name: str, batch: list[Waiter]) -> None:
        clients = [client for client, _ in batch]
        if len(set(clients)) == 1:
            clients = clients[:1]  # one client name stands for all in the ledger
        try:
            popped = await self._pop_many(name, len(batch), clients)
        except BaseException as exc:  # every waiter gets the failure, then it propagates
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.pops += 1
        self.served += len(batch)
        keys = popped.keys
        gone = 0
        for index, (_, future) in enumerate(batch):
            # A waiter whose client went away loses its key: it is never reissued.
            if not future.done():
                future.set_result((keys[index] if index < len(keys) else None, popped))
            elif index < len(keys):
                gone += 1
        if gone and self._lost is not None:
            self._lost(name, gone)
