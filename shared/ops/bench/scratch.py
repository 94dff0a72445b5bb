"""Scratch state for the benchmarks that run the whole pipeline's stores."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.domain.errors import ConfigError
from shared.stores import redis_keys


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
