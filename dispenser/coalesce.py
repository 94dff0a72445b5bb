"""Coalescing and prefetch: single-key requests of one type share Redis calls.

A request joins its type's queue; while a pop is in flight, later requests wait and
the next pop takes them all with one ``LPOP count=n``. One pop per type is in flight
at a time, so under load each Redis round trip serves many requests, and with no
load a request waits for nothing but its own pop.

A type may also keep a **stock** of up to ``ahead`` keys popped ahead of requests
(``prefetch``): a request then takes a key from the stock without waiting for
Redis at all, and a pop refills the stock once it is down to half. A pop takes for the
stock only while the hot list held at least ``PLENTY`` times the stock after the type's
previous pop (so not on the first): processes sharing a nearly empty list pop exactly
what their requests ask for, rather than one holding keys the others go without. The keys of the
stock were popped from the hot list like any other (a key is never in the stock and
in Redis at once), so a stock adds no way for a key to be handed out twice; what it
adds is loss: keys still in a process's stock when it ends are never handed out
(counted at a clean stop, bounded by ``ahead`` per type on a crash). A type whose
keys are recorded in the ledger at the pop, to the client that asked, has none.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from shared.domain.apikeys import ANONYMOUS
from shared.domain.tiers import Popped

PopMany = Callable[[str, int, list[str]], Awaitable[Popped]]
Lost = Callable[[str, int], None]  # (type name, keys popped that will never be handed out)

log = logging.getLogger(__name__)
Answer = tuple[str | None, Popped]
# A stock is refilled only while the hot list holds this many times its size.
PLENTY = 4
# The pop result a waiter answered from the stock gets (read only when no key came).
STOCKED = Popped([], remaining=0, exhausted=False)
Waiter = tuple[str, "asyncio.Future[Answer]"]  # (client, where its answer goes)


class Coalescer:
    def __init__(
        self,
        pop_many: PopMany,
        max_batch: int,
        lost: Lost | None = None,
        ahead: Mapping[str, int] | None = None,
    ) -> None:
        """``pop_many(name, count, clients)`` pops ``count`` keys; ``clients`` names
        each key's API client, or holds one client name that stands for all. ``lost``
        is told of keys popped that will never be handed out (their waiter was gone,
        or the stock they were in was dropped). ``ahead``: each type's stock size (a
        type not in it keeps none)."""
        self._pop_many = pop_many
        self._lost = lost
        self._max_batch = max_batch
        self._ahead = {name: min(size, max_batch) for name, size in (ahead or {}).items() if size}
        self._half = {name: size // 2 for name, size in self._ahead.items()}
        self._stock: dict[str, deque[str]] = {name: deque() for name in self._ahead}
        # Keys ever put in each stock, and dropped from it: what left it otherwise was
        # handed out (counted so, not one by one on every request).
        self._stocked = dict.fromkeys(self._ahead, 0)
        self._dropped = dict.fromkeys(self._ahead, 0)
        self._seen: dict[str, int] = {}  # each type's hot list length after its last pop
        self._queues: dict[str, list[Waiter]] = {}
        self._draining: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def ready(self, name: str) -> str | None:
        """A key of the type's stock, handed out now; None when there is none (then
        ``take`` waits for one). Starts a refill once the stock is down to half."""
        stock = self._stock.get(name)
        if not stock:
            return None
        key = stock.popleft()
        if len(stock) <= self._half[name] and name not in self._draining:
            self._start(name)
        return key

    def stocked(self) -> dict[str, int]:
        """Keys held in each type's stock."""
        return {name: len(stock) for name, stock in self._stock.items()}

    def handed_out(self) -> dict[str, int]:
        """Keys handed out of each type's stock so far (by ``ready`` or to a waiter)."""
        return {
            name: self._stocked[name] - len(stock) - self._dropped[name]
            for name, stock in self._stock.items()
        }

    def take(self, name: str, client: str) -> asyncio.Future[Answer]:
        """Await it for one key (None when the pool had none left for this request) and
        the pop result. A future, not a coroutine: one frame less per request."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = []
        queue.append((client, future))
        if name not in self._draining:
            self._start(name)
        return future

    def drop_stock(self) -> None:
        """Give up every stocked key (at shutdown): counted as lost, never handed out."""
        for name, stock in self._stock.items():
            if stock and self._lost is not None:
                self._lost(name, len(stock))
            self._dropped[name] += len(stock)
            stock.clear()

    def _start(self, name: str) -> None:
        self._draining.add(name)
        task = asyncio.get_running_loop().create_task(self._drain(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, name: str) -> None:
        """Pop for the waiters (and for the stock with them), until none waits; started
        by ``ready`` with none waiting, pop for the stock alone while it is down to
        half (until a pop comes back short: the list is low, and the next request pops
        for itself)."""
        ahead = self._ahead.get(name, 0)
        stock = self._stock.get(name)
        served = False  # a pop for waiters took for the stock too: no pop for it alone
        try:
            while True:
                queue = self._queues.pop(name, None) or []
                if stock:  # refilled since these requests found it empty
                    queue = self._from_stock(stock, queue)
                batch = queue[: self._max_batch]
                if len(queue) > self._max_batch:
                    self._queues[name] = queue[self._max_batch :]
                short = 0 if stock is None else max(0, ahead - len(stock))
                # Only while the hot list held plenty at the type's last pop: near empty,
                # each request pops for itself (a stock would hold keys other
                # processes' requests then go without).
                plenty = self._seen.get(name, 0) >= PLENTY * ahead
                extra = min(short, self._max_batch - len(batch)) if plenty else 0
                if not batch and (served or short * 2 < ahead or not extra):
                    return
                served = served or bool(batch)
                if not await self._serve(name, batch, extra) and not self._queues.get(name):
                    return
        finally:
            self._draining.discard(name)

    @staticmethod
    def _from_stock(stock: deque[str], queue: list[Waiter]) -> list[Waiter]:
        """Answer waiters from the stock while it lasts; the others still wait."""
        for index, (_, future) in enumerate(queue):
            if not stock:
                return queue[index:]
            if not future.done():
                future.set_result((stock.popleft(), STOCKED))
        return []

    async def _serve(self, name: str, batch: list[Waiter], extra: int) -> bool:
        """One pop for ``batch`` and ``extra`` keys for the stock; whether it got all."""
        if name in self._ahead:
            clients = [ANONYMOUS]  # a type with a stock records no client at the pop
        else:
            clients = [client for client, _ in batch]
            if len(set(clients)) == 1:
                clients = clients[:1]  # one client name stands for all in the ledger
        count = len(batch) + extra
        try:
            popped = await self._pop_many(name, count, clients)
        except BaseException as exc:  # every waiter gets the failure, then it propagates
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not batch and isinstance(exc, Exception):  # a refill: the next request says
                log.info("prefetch_failed", extra={"id_type": name, "error": str(exc)})
            if not isinstance(exc, Exception):
                raise
            return False
        keys = popped.keys
        self._seen[name] = popped.remaining
        spare: list[str] = []
        for index, (_, future) in enumerate(batch):
            # A waiter whose client went away: its key goes to the stock, or is lost
            # (never reissued) where there is none.
            if not future.done():
                future.set_result((keys[index] if index < len(keys) else None, popped))
            elif index < len(keys):
                spare.append(keys[index])
        spare.extend(keys[len(batch) :])
        stock = self._stock.get(name)
        if stock is not None:
            stock.extend(spare)
            self._stocked[name] += len(spare)
        elif spare and self._lost is not None:
            self._lost(name, len(spare))
        return len(keys) == count
