"""Scratch state for the benchmarks that run the whole pipeline's stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import ConfigError

UNLINK_CHUNK = 1_000  # keys per UNLINK when a bench tidies up


@asynccontextmanager
async def as_found(settings: Settings) -> AsyncIterator[None]:
    """Leave the Redis database at ``redis_url`` as the bench found it: every key under
    the namespace that the bench (or the processes it ran) created is removed at the
    end, whether the bench finished or failed. Keys that were there before stay; the
    benches that write the fence's or the sync record's keys refuse a database that
    already holds them (``refuse_unless_scratch``). Nothing to do without ``redis_url``
    (the benches that need one say so)."""
    if settings.discovered is not None:  # Sentinel or a cluster: no redis_url here
        yield
        return
    client = aioredis.Redis.from_url(settings.redis_url)
    pattern = redis_keys.namespace_pattern(settings.redis_namespace)
    try:
        found = {key async for key in client.scan_iter(match=pattern, count=1_000)}
        yield
        made = [key async for key in client.scan_iter(match=pattern, count=1_000)]
        left = [key for key in made if key not in found]
        for start in range(0, len(left), UNLINK_CHUNK):
            await client.unlink(*left[start : start + UNLINK_CHUNK])
    finally:
        await client.aclose()


async def refuse_unless_scratch(client: aioredis.Redis, ns: str, bench: str) -> None:
    """The PostgreSQL fence's record and the hot lists live in the Redis database at
    ``redis_url`` (under namespace ``ns``): a bench writes both, so it refuses a database
    that holds either."""
    if await client.exists(redis_keys.sync_record_key(ns), redis_keys.hot_registry_key(ns)):
        raise ConfigError(
            f"bench {bench}: the Redis database at redis_url holds keydispenser state "
            "(a sync record or hot lists); point redis_url at a scratch database"
        )


async def clear(client: aioredis.Redis, ns: str, *names: str) -> None:
    """Remove what a bench left in its scratch Redis database (batch markers expire)."""
    await client.delete(
        *(redis_keys.hot_list_key(ns, name) for name in names),
        *(redis_keys.refill_key(ns, name) for name in names),
        *(redis_keys.exhausted_key(ns, name) for name in names),
        redis_keys.sync_record_key(ns),
        redis_keys.hot_registry_key(ns),
        redis_keys.keysync_wake_key(ns),
    )
