"""How keygen and keysync start and stop, written once: signals, the metrics port,
PostgreSQL (retried until it answers), the schema check, the process's own check of
Redis, the binding of namespace and database (retried), then the process's loops.

A setup the process cannot serve is refused before any of its loops runs (a busy
metrics port first, before any store is reached); a store that is away is waited for.
The dispenser starts under its HTTP server instead (``dispenser/main.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from shared.domain.config import KeygenConfig, KeysyncConfig, Settings
from shared.domain.idtypes import IdType
from shared.metrics import Heartbeat
from shared.metrics import serve as serve_metrics
from shared.runtime import connect_with_retry, stop_on_signals
from shared.stores.fence.binding import bind
from shared.stores.groups import Groups, SyncRecords
from shared.stores.postgres.cold_store import ColdStore, checked_pooling
from shared.stores.postgres.schema import check


@dataclass(frozen=True)
class ProcessStart:
    """What keygen or keysync brings to the start-up they share."""

    name: str  # "keygen" or "keysync": its settings' section, its events' prefix
    config: KeygenConfig | KeysyncConfig  # where its metrics are served
    log: logging.Logger  # the process's own: its start and stop are its events
    registry: CollectorRegistry
    heartbeat: Heartbeat
    types: dict[str, IdType]
    keyspace: bool  # the schema check covers the keyspace (keygen: it holds the key)
    groups: Groups  # the key groups whose fence records it opens (``postgres_fence``)
    check_redis: Callable[[], Awaitable[None]]  # refuses a Redis that may evict


@dataclass(frozen=True)
class Started:
    """What the start-up hands the process's loops."""

    stop: asyncio.Event  # set by SIGTERM or SIGINT
    cold: ColdStore
    sync: SyncRecords | None  # the fence's records (None: postgres_fence off)


async def serve_process(
    settings: Settings, start: ProcessStart, loops: Callable[[Started], Awaitable[None]]
) -> None:
    """Start, run ``loops`` until stopped, close the stores. Logs ``<name>_started``
    (``keygen_started``, ``keysync_started``) before the loops and ``<name>_stopped``
    after them; returns without either when stopped while the stores were away."""
    stop = stop_on_signals()
    host, port = start.config.metrics_host, start.config.metrics_port
    setting = f"{start.name}.metrics_port"
    serve_metrics(start.registry, host, port, start.heartbeat, setting)
    cold = await _connected(settings, stop)
    if cold is None:
        return
    sync = SyncRecords.open(start.groups) if settings.postgres_fence else None
    try:
        async with cold.connection() as conn:
            await check(conn, start.types, keyspace=start.keyspace)
        await start.check_redis()
        bound = await connect_with_retry(
            lambda: bind(cold, sync, settings.redis_namespace), "binding", stop
        )
        if bound is None:
            return  # stopped while the stores were away
        start.log.info(f"{start.name}_started", extra={"id_types": sorted(start.types)})
        await loops(Started(stop, cold, sync))
    finally:
        await cold.close()
        if sync is not None:
            await sync.close()
    start.log.info(f"{start.name}_stopped")


async def _connected(settings: Settings, stop: asyncio.Event) -> ColdStore | None:
    """The cold store, once PostgreSQL answers (None: stopped before it did); refused
    when its connections are pooled otherwise than ``postgres_pooler`` says."""

    async def connect() -> ColdStore:
        cold = await ColdStore.for_settings(settings)
        try:
            await checked_pooling(settings)
        except BaseException:
            await cold.close()
            raise
        return cold

    return await connect_with_retry(connect, "postgres", stop)
