"""Where a type's keys come from: its pool (popped from the hot tier) or its minter
(snowflake IDs, minted in this process). The routes ask a type's source; the source
asks the stores' ports. A request flows one way: route, source, store.

A pool **coalesces**: a request joins the type's queue; while a pop is in flight, later
requests wait and the next pop takes them all with one ``LPOP count=n``. One pop per
type is in flight at a time, so under load each Redis round trip serves many requests,
and with no load a request waits for nothing but its own pop.

A pool may also keep a **stock** of up to ``ahead`` keys popped ahead of requests
(``prefetch``): a request then takes a key from the stock without waiting for Redis at
all, and a pop refills the stock once it is down to half. A pop takes for the stock
only while the hot list held at least ``PLENTY`` times the stock after the type's
previous pop (so not on the first): processes sharing a nearly empty list pop exactly
what their requests ask for, rather than one holding keys the others go without. The
keys of the stock were popped from the hot list like any other (a key is never in the
stock and in Redis at once), so a stock adds no way for a key to be handed out twice;
what it adds is loss: keys still in a process's stock when it ends are never handed out
(counted at a clean stop, bounded by ``ahead`` on a crash). A type whose keys are
recorded in the ledger at the pop, to the client that asked, has none.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import NoReturn, Protocol

from dispenser.metrics import DispenserMetrics
from shared.domain.apikeys import ANONYMOUS
from shared.domain.config.dispenser import DispenserConfig
from shared.domain.errors import (
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    LedgerBacklogFull,
    PoolEmpty,
    StoreUnavailable,
    UnknownIdType,
)
from shared.domain.idtypes import IdType
from shared.domain.imports import STOCK_FRESH_S
from shared.domain.names import ID_TYPE_NAME
from shared.domain.ports import HotPool, LedgerWrites, Nudges
from shared.domain.snowflake import Minter
from shared.domain.tiers import Popped

log = logging.getLogger(__name__)

# A stock is refilled only while the hot list holds this many times its size.
PLENTY = 4
# The pop result a waiter answered from the stock gets (read only when no key came).
STOCKED = Popped([], remaining=0, exhausted=False)
# A refill rate keysync reported longer ago than this is not trusted for Retry-After.
REFILL_FRESH_S = 30.0
# How often the ledger stream's length is read (for dispenser.ledger_max_backlog).
LEDGER_BACKLOG_READ_S = 1.0

Answer = tuple[str | None, Popped]  # a waiter's key (None: none left for it), and the pop
Waiter = tuple[str, "asyncio.Future[Answer]"]  # (client, where its answer goes)


def count_lost(metrics: DispenserMetrics, name: str, count: int) -> None:
    """Keys taken that will never be handed out (their client was gone, or they were
    still prefetched when this process stopped): counted, never reissued."""
    metrics.keys_lost.labels(name).inc(count)
    log.warning("keys_not_handed_out", extra={"id_type": name, "keys": count})


class Source(Protocol):
    """A type's keys, as the routes take them."""

    name: str
    at_hand: bool  # whether ``ready`` can ever answer (a pool without a stock: never)

    def ready(self) -> str | None:
        """One key at hand now (stocked, or minted), without waiting; else None."""

    async def one(self, client: str) -> str:
        """One key for ``client``: from ``ready`` or waited for. Raises the refusal."""

    async def take(self, count: int, client: str, once: str | None) -> Popped:
        """``count`` keys at once (``once``: an Idempotency-Key, its retry answered with
        the same keys)."""


class Unknown:
    """What a name that is no served type resolves to: refused where it is used (after
    the API-key check: a caller without a key is not told which names exist)."""

    at_hand = False

    def __init__(self, name: str, configured: tuple[str, ...]) -> None:
        self.name = name
        self._configured = configured

    def ready(self) -> str | None:
        return None

    async def one(self, client: str) -> str:
        self.refuse()

    async def take(self, count: int, client: str, once: str | None) -> Popped:
        self.refuse()

    def refuse(self) -> NoReturn:
        if not ID_TYPE_NAME.fullmatch(self.name):
            raise InvalidInput(f"id_type must match {ID_TYPE_NAME.pattern}")
        raise UnknownIdType(self.name, self._configured)


class Mint:
    """A snowflake type's source: IDs minted in this process from its machine-ID lease."""

    at_hand = True

    def __init__(self, minter: Minter, metrics: DispenserMetrics) -> None:
        self.name = minter.name
        self._minter = minter
        self._issued = metrics.issued

    def ready(self) -> str | None:
        got = self._minter.mint_some(1)
        if not isinstance(got, range):
            return None  # this millisecond's IDs are spent: ``one`` waits for the next
        self._issued.inc(self.name)
        return self._minter.layout.encode(got.start)

    async def one(self, client: str) -> str:
        minter = self._minter
        got = minter.mint_some(1)
        value = got.start if isinstance(got, range) else (await minter.amint(1))[0].start
        self._issued.inc(self.name)
        return minter.layout.encode(value)

    async def take(self, count: int, client: str, once: str | None) -> Popped:
        if once is not None:
            raise InvalidInput(
                f"Idempotency-Key is not accepted for snowflake type '{self.name}': its IDs "
                "are minted, not taken from a pool; send the request without it"
            )
        spans = await self._minter.amint(count)
        self._issued.inc(self.name, count)
        return Popped(self._minter.layout.encode_ranges(spans), remaining=0, exhausted=False)


class LedgerBacklog:
    """The ledger streams' lengths against ``dispenser.ledger_max_backlog``: a ledger
    type's pops are refused (LedgerBacklogFull) while the stream that holds its entries
    is over it (a stream on a shard that is down refuses only its own types:
    StoreUnavailable).

    Each length is read at most once per LEDGER_BACKLOG_READ_S, so the bound may be
    passed by what a process hands out in that time.
    """

    def __init__(
        self, stream: LedgerWrites, metrics: DispenserMetrics, config: DispenserConfig
    ) -> None:
        self._stream = stream
        self._metrics = metrics
        self._maximum = config.ledger_max_backlog
        self._retry_after_s = config.retry_after_max_s
        # Each type's stream length as last read, and when (with types spread over a
        # cluster's shards each type has a stream of its own).
        self._lengths: dict[str, int] = {}
        self._read_at: dict[str, float] = {}

    async def open(self, name: str) -> None:
        now = time.monotonic()
        if now - self._read_at.get(name, -math.inf) >= LEDGER_BACKLOG_READ_S:
            self._read_at[name] = now
            self._lengths[name] = await self._stream.backlog(name)
            self._metrics.ledger_backlog.set(max(self._lengths.values()))
        if self._lengths.get(name, 0) >= self._maximum:
            self._metrics.ledger_refusals.labels(name).inc()
            raise LedgerBacklogFull(name, self._retry_after_s)


class Pool:
    """A pooled type's source: its stock, its coalesced pops, the ledger's durability
    wait, and what each pop tells (metrics, a nudge to keysync below the low mark)."""

    def __init__(
        self,
        id_type: IdType,
        hot: HotPool,
        wake: Nudges,
        stream: LedgerWrites,
        backlog: LedgerBacklog,
        metrics: DispenserMetrics,
        config: DispenserConfig,
    ) -> None:
        self.id_type = id_type
        self.name = name = id_type.name
        self._config = id_type.config
        self._ledger = id_type.config.ledger
        self._hot = hot
        self._wake = wake
        self._stream = stream
        self._backlog = backlog
        self._metrics = metrics
        self._settings = config
        self._max_batch = config.max_batch
        self.ahead = min(id_type.config.stock, config.max_batch)
        self.at_hand = self.ahead > 0
        self._closed = False  # stopping: keys a pop brings now are counted lost
        self._half = self.ahead // 2
        self._stock: deque[str] | None = deque() if self.ahead else None
        # Keys ever put in the stock, and dropped from it: what left it otherwise was
        # handed out (counted so, not one by one on every request).
        self._stocked = 0
        self._dropped = 0
        self._seen = 0  # the hot list's length after this type's last pop
        self._queue: list[Waiter] = []
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()  # pops for the waiters and the stock
        self._nudges: set[asyncio.Task[None]] = set()
        self._last_nudge = -math.inf
        # The stock's freshness (``STOCK_FRESH_S``): when the last read of the stock
        # epoch that succeeded was issued, the epoch it read, and since when keys popped
        # are stale (popped before an import's sweep: never stocked).
        self.clock: Callable[[], float] = time.monotonic  # (a unit test moves it on)
        self._checked = -math.inf
        self._epoch: int | None = None
        self._stale_before = -math.inf
        metrics.hot_low.labels(name).set(id_type.config.hot.low)  # KdHotDepthLow's mark

    # --- what the routes take ----------------------------------------------------

    def ready(self) -> str | None:
        """A key of the stock, handed out now; None when there is none (then ``one``
        waits for one). Starts a refill once the stock is down to half."""
        stock = self._stock
        if not stock or not self._fresh():
            return None  # (a stale stock is read again by the next pop, then used)
        key = stock.popleft()
        if len(stock) <= self._half and not self._draining:
            self._start()
        return key

    async def one(self, client: str) -> str:
        """One key; concurrent callers share one Redis call."""
        if self._ledger:
            await self._backlog.open(self.name)
        key = self.ready()
        if key is not None:
            return key
        taken, popped = await self.join(client)
        if taken is None:
            raise self._none_left(popped)
        if popped is not STOCKED:  # a key of the stock is counted by handed_out
            self._metrics.issued.inc(self.name)
        return taken

    async def take(self, count: int, client: str, once: str | None) -> Popped:
        """``count`` keys in one pop of their own (not coalesced)."""
        if self._ledger:
            await self._backlog.open(self.name)
        if once is None:
            popped = await self._hot.pop(self.name, count, (client,), self._ledger)
        else:
            ttl_s = self._config.idempotency_ttl_s(self._settings.idempotency_ttl_s)
            popped = await self._hot.pop_once(self.name, count, once, ttl_s, client, self._ledger)
        self._after_pop(popped)
        if not popped.keys:
            raise self._none_left(popped)
        await self._durable(popped)
        return popped

    def join(self, client: str) -> asyncio.Future[Answer]:
        """Await it for one key (None when the pool had none left for this request) and
        the pop result. A future, not a coroutine: one frame less per request."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append((client, future))
        if not self._draining:
            self._start()
        return future

    def lost(self, count: int) -> None:
        count_lost(self._metrics, self.name, count)

    # --- what the metrics read ---------------------------------------------------

    def stocked(self) -> int:
        """Keys held in the stock."""
        return len(self._stock) if self._stock is not None else 0

    def handed_out(self) -> int:
        """Keys handed out of the stock so far (by ``ready`` or to a waiter)."""
        return self._stocked - self.stocked() - self._dropped

    # --- the pops ----------------------------------------------------------------

    def _start(self) -> None:
        self._draining = True
        task = asyncio.get_running_loop().create_task(self._drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Pop for the waiters (and for the stock with them), until none waits; started
        by ``ready`` with none waiting, pop for the stock alone while it is down to
        half (until a pop comes back short: the list is low, and the next request pops
        for itself)."""
        ahead, stock = self.ahead, self._stock
        served = False  # a pop for waiters took for the stock too: no pop for it alone
        try:
            while True:
                if stock is not None and not self._fresh():
                    await self._check_stock()
                queue, self._queue = self._queue, []
                if stock and self._fresh():  # refilled since these requests found it empty
                    queue = self._from_stock(stock, queue)
                batch = queue[: self._max_batch]
                if len(queue) > self._max_batch:
                    self._queue = queue[self._max_batch :] + self._queue
                short = 0 if stock is None else max(0, ahead - len(stock))
                # Only while the hot list held plenty at the last pop: near empty, each
                # request pops for itself (a stock would hold keys other processes'
                # requests then go without).
                plenty = self._seen >= PLENTY * ahead and not self._closed and self._fresh()
                extra = min(short, self._max_batch - len(batch)) if plenty else 0
                if not batch and (served or short * 2 < ahead or not extra):
                    return
                served = served or bool(batch)
                if not await self._serve(batch, extra) and not self._queue:
                    return
        finally:
            self._draining = False

    @staticmethod
    def _from_stock(stock: deque[str], queue: list[Waiter]) -> list[Waiter]:
        """Answer waiters from the stock while it lasts; the others still wait."""
        for index, (_, future) in enumerate(queue):
            if not stock:
                return queue[index:]
            if not future.done():
                future.set_result((stock.popleft(), STOCKED))
        return []

    async def _serve(self, batch: list[Waiter], extra: int) -> bool:
        """One pop for ``batch`` and ``extra`` keys for the stock; whether it got all."""
        if self._stock is not None:
            clients = [ANONYMOUS]  # a type with a stock records no client at the pop
        else:
            clients = [client for client, _ in batch]
            if len(set(clients)) == 1:
                clients = clients[:1]  # one client name stands for all in the ledger
        count = len(batch) + extra
        issued = self.clock()
        try:
            popped = await self._pop(count, clients)
        except BaseException as exc:  # every waiter gets the failure, then it propagates
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not batch and isinstance(exc, Exception):  # a refill: the next request says
                log.info("prefetch_failed", extra={"id_type": self.name, "error": str(exc)})
            if not isinstance(exc, Exception):
                raise
            return False
        keys = popped.keys
        self._seen = popped.remaining
        spare: list[str] = []
        for index, (_, future) in enumerate(batch):
            # A waiter whose client went away: its key goes to the stock, or is lost
            # (never reissued) where there is none.
            if not future.done():
                future.set_result((keys[index] if index < len(keys) else None, popped))
            elif index < len(keys):
                spare.append(keys[index])
        spare.extend(keys[len(batch) :])
        if self._stock is not None and not self._closed and issued >= self._stale_before:
            self._stock.extend(spare)
            self._stocked += len(spare)
        elif spare:
            self.lost(len(spare))
        return len(keys) == count

    async def _pop(self, count: int, clients: list[str]) -> Popped:
        """The type's coalesced pop (one in flight at a time), as durable as its ledger
        asks before any of its keys is handed out."""
        popped = await self._hot.pop_coalesced(self.name, count, clients, self._ledger)
        self._metrics.pop_requests.observe(count)
        self._after_pop(popped, issued=False)  # counted as each is handed out
        await self._durable(popped)
        return popped

    # --- the stock's freshness (imports) ----------------------------------------

    def _fresh(self) -> bool:
        return self.clock() - self._checked < STOCK_FRESH_S

    async def _check_stock(self) -> None:
        """Read the stock epoch: moved on by an import, the stock is dropped (counted
        lost) and keys of pops issued before this read are never stocked. A failed read
        leaves the stock stale: not handed out until a read succeeds."""
        issued = self.clock()
        try:
            epoch = await self._hot.stock_epoch(self.name, round(STOCK_FRESH_S * 1000))
        except KeydispenserError as exc:
            log.info("stock_check_failed", extra={"id_type": self.name, "error": str(exc)})
            return
        if self._epoch is not None and epoch != self._epoch:
            self._stale_before = issued
            self.drop_stock()
            log.info("stock_dropped_after_import", extra={"id_type": self.name})
        self._epoch, self._checked = epoch, issued

    def drop_stock(self) -> None:
        """Give up every stocked key (at shutdown): counted as lost, never handed out."""
        stock = self._stock
        if stock:
            self.lost(len(stock))
            self._dropped += len(stock)
            stock.clear()

    async def close(self) -> None:
        """Stop: the stock is dropped (counted lost), and so are the spare keys of a pop
        still in flight when it lands."""
        self._closed = True
        self.drop_stock()
        await asyncio.gather(*self._nudges, return_exceptions=True)

    # --- after a pop -------------------------------------------------------------

    async def _durable(self, popped: Popped) -> None:
        """Return once the ledger type's issue entry of ``popped`` is as durable as its
        ``ledger_durability`` asks; else its keys are never handed out (counted), and
        StoreUnavailable says why (503)."""
        config = self._config
        if config.ledger_durability == "async" or not popped.keys:
            return
        try:
            durable = await self._stream.wait_durable(
                self.name,
                config.ledger_durability,
                config.ledger_replicas,
                config.ledger_wait_ms,
            )
        except StoreUnavailable:
            durable = False
        if durable:
            return
        self._metrics.ledger_unconfirmed.labels(self.name).inc(len(popped.keys))
        log.warning(
            "ledger_entry_unconfirmed", extra={"id_type": self.name, "count": len(popped.keys)}
        )
        raise StoreUnavailable(
            "redis",
            f"the ledger record of '{self.name}' was not {config.ledger_durability} on "
            f"{config.ledger_replicas} replica(s) within {config.ledger_wait_ms} ms",
        )

    def _after_pop(self, popped: Popped, *, issued: bool = True) -> None:
        """Metrics (``issued``: the keys popped are handed out now), and a nudge to
        keysync below the low watermark. Never raises."""
        name, metrics = self.name, self._metrics
        metrics.hot_depth.labels(name).set(popped.remaining)
        if popped.replayed:
            metrics.replays.labels(name).inc()
        elif popped.keys and issued:
            metrics.issued.inc(name, len(popped.keys))
        if popped.discarded:
            metrics.discarded.inc(popped.discarded)
        if popped.remaining < self._config.hot.low and not popped.exhausted:
            self._nudge()

    def _none_left(self, popped: Popped) -> KeydispenserError:
        if popped.exhausted:
            return KeyspaceExhausted(self.name)
        return PoolEmpty(self.name, self.retry_after(popped))

    def retry_after(self, popped: Popped) -> int:
        """Seconds until keysync's next batch lands, at the refill rate it last observed."""
        config = self._settings
        refill = popped.refill
        if refill is None or refill.rate <= 0 or time.time() - refill.at > REFILL_FRESH_S:
            return config.retry_after_s
        seconds = math.ceil(min(self._config.sync_batch, self._config.hot.high) / refill.rate)
        return min(config.retry_after_max_s, max(1, seconds))

    def _nudge(self) -> None:
        """Wake keysync, at most once per nudge interval, off the request path."""
        now = time.monotonic()
        if now - self._last_nudge < self._settings.nudge_interval_s:
            return
        self._last_nudge = now
        self._metrics.nudges.labels(self.name).inc()
        task = asyncio.get_running_loop().create_task(self._send_nudge())
        self._nudges.add(task)
        task.add_done_callback(self._nudges.discard)

    async def _send_nudge(self) -> None:
        try:
            await self._wake.nudge(self.name)
        except KeydispenserError as exc:  # keysync still polls; nothing is lost
            log.warning("nudge_failed", extra={"id_type": self.name, "error": str(exc)})
