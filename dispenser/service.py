"""The dispenser's service: pops keys from the hot tier, counts them, nudges keysync.

Routes (``dispenser.app``) and the single-ID fast path (``dispenser.fastpath``) call it;
it knows nothing of HTTP beyond the API-key gate it holds for them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from dispenser.auth import Gate
from dispenser.coalesce import Coalescer
from dispenser.metrics import DispenserMetrics
from shared.domain.errors import (
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    LedgerDisabled,
    PoolEmpty,
    UnknownIdType,
)
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.settings import ID_TYPE_NAME, Settings
from shared.stores.hot_store import HotStore, Popped
from shared.stores.ledger import LedgerReader
from shared.stores.ledger_stream import LedgerStream
from shared.stores.wake import WakeChannel

log = logging.getLogger(__name__)
# A refill rate keysync reported longer ago than this is not trusted for Retry-After.
REFILL_FRESH_S = 30.0


class Dispenser:
    """Pops keys from the hot tier; PostgreSQL is read only for ledger lookups."""

    def __init__(self, settings: Settings, hot: HotStore, metrics: DispenserMetrics) -> None:
        self.settings = settings
        self.hot = hot
        # The wake channel and the ledger stream share the hot store's connections.
        self.wake = WakeChannel(hot.endpoint)
        self.ledger_stream = LedgerStream(hot.endpoint)
        self.metrics = metrics
        self.gate = Gate(settings.dispenser.auth)
        self.id_types = build_id_types(settings, generating=False)
        self.coalescer = Coalescer(self._pop_many, settings.dispenser.max_batch)
        self.ledger = LedgerReader(settings.postgres_dsn)
        self._last_nudge: dict[str, float] = {}
        self._nudges: set[asyncio.Task[None]] = set()

    def id_type(self, name: str) -> IdType:
        if not ID_TYPE_NAME.match(name):
            raise InvalidInput(f"id_type must match {ID_TYPE_NAME.pattern}")
        found = self.id_types.get(name)
        if found is None:
            raise UnknownIdType(name)
        return found

    def ledger_type(self, name: str) -> IdType:
        """The named type, refused when it keeps no ledger to record in or read."""
        id_type = self.id_type(name)
        if not id_type.config.ledger:
            raise LedgerDisabled(name)
        return id_type

    async def take_one(self, name: str, client: str) -> str:
        """One key; concurrent callers of a type share one Redis call."""
        id_type = self.id_types.get(name) or self.id_type(name)
        key, popped = await self.coalescer.take(name, client)
        if key is None:
            raise self._none_left(id_type, popped)
        return key

    async def take(
        self, name: str, count: int, client: str, idempotency_key: str | None = None
    ) -> Popped:
        id_type = self.id_type(name)
        if idempotency_key is None:
            popped = await self.hot.pop(name, count, (client,), id_type.config.ledger)
        else:
            popped = await self.hot.pop_once(
                name,
                count,
                idempotency_key,
                self.settings.dispenser.idempotency_ttl_s,
                client,
                id_type.config.ledger,
            )
        self._after_pop(id_type, popped)
        if not popped.keys:
            raise self._none_left(id_type, popped)
        return popped

    async def _pop_many(self, name: str, count: int, clients: list[str]) -> Popped:
        id_type = self.id_types[name]
        popped = await self.hot.pop(name, count, clients, id_type.config.ledger)
        self.metrics.pop_requests.observe(count)
        self._after_pop(id_type, popped)
        return popped

    def _after_pop(self, id_type: IdType, popped: Popped) -> None:
        """Metrics, and a nudge to keysync below the low watermark. Never raises."""
        name, metrics = id_type.name, self.metrics
        metrics.hot_depth.labels(name).set(popped.remaining)
        if popped.replayed:
            metrics.replays.labels(name).inc()
        elif popped.keys:
            metrics.issued.labels(name).inc(len(popped.keys))
        if popped.discarded:
            metrics.discarded.inc(popped.discarded)
        if popped.remaining < id_type.config.hot.low and not popped.exhausted:
            self._nudge(name)

    def _none_left(self, id_type: IdType, popped: Popped) -> KeydispenserError:
        if popped.exhausted:
            return KeyspaceExhausted(id_type.name)
        return PoolEmpty(id_type.name, self.retry_after(id_type, popped))

    def retry_after(self, id_type: IdType, popped: Popped) -> int:
        """Seconds until keysync's next batch lands, at the refill rate it last observed."""
        config = self.settings.dispenser
        refill = popped.refill
        if refill is None or refill.rate <= 0 or time.time() - refill.at > REFILL_FRESH_S:
            return config.retry_after_s
        seconds = math.ceil(min(id_type.config.sync_batch, id_type.config.hot.high) / refill.rate)
        return min(config.retry_after_max_s, max(1, seconds))

    def _nudge(self, name: str) -> None:
        """Wake keysync, at most once per nudge interval per type, off the request path."""
        now = time.monotonic()
        if now - self._last_nudge.get(name, -math.inf) < self.settings.dispenser.nudge_interval_s:
            return
        self._last_nudge[name] = now
        self.metrics.nudges.labels(name).inc()
        task = asyncio.get_running_loop().create_task(self._send_nudge(name))
        self._nudges.add(task)
        task.add_done_callback(self._nudges.discard)

    async def _send_nudge(self, name: str) -> None:
        try:
            await self.wake.nudge(name)
        except KeydispenserError as exc:  # keysync still polls; nothing is lost
            log.warning("nudge_failed", extra={"id_type": name, "error": str(exc)})

    async def close(self) -> None:
        await asyncio.gather(*self._nudges, return_exceptions=True)
        await self.ledger.close()
