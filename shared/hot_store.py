"""The hot tier: per-type Redis lists, touched only through Lua scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from shared import redis_keys
from shared.errors import StoreUnavailable

# Driver errors that mean "Redis is not reachable/usable right now".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,
    OSError,
)
_WAKE_LIST_MAX = 64


def load_script(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text()


@asynccontextmanager
async def translated(operation: str) -> AsyncIterator[None]:
    try:
        yield
    except CONNECTION_ERRORS as exc:
        raise StoreUnavailable("redis", f"{operation} failed: {exc}") from exc


def connect(url: str, **options: Any) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, decode_responses=True, **options)


@dataclass(frozen=True)
class Popped:
    keys: list[str]
    remaining: int
    exhausted: bool  # only ever True when ``keys`` is empty


class HotStore:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        # register_script calls EVALSHA and loads the script once on NOSCRIPT.
        self._push = client.register_script(load_script("push"))
        self._pop = client.register_script(load_script("pop"))
        self._nudge = client.register_script(load_script("nudge"))

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    async def close(self) -> None:
        await self._client.aclose()

    async def push(self, id_type: str, keys: Sequence[str]) -> int:
        """Append keys to the type's hot list; returns its new length."""
        if not keys:
            return await self.depth(id_type)
        async with translated("push"):
            length = await self._push(keys=[redis_keys.hot_list_key(id_type)], args=list(keys))
        return int(length)

    async def pop(self, id_type: str, count: int) -> Popped:
        """Take up to ``count`` keys from the type's hot list."""
        keys = [redis_keys.hot_list_key(id_type), redis_keys.exhausted_key(id_type)]
        async with translated("pop"):
            taken, remaining, exhausted = await self._pop(keys=keys, args=[count])
        return Popped(list(taken), int(remaining), bool(exhausted))

    async def mark_exhausted(self, id_type: str) -> None:
        async with translated("mark_exhausted"):
            await self._client.set(redis_keys.exhausted_key(id_type), "1")

    async def depth(self, id_type: str) -> int:
        async with translated("depth"):
            return int(await self._client.llen(redis_keys.hot_list_key(id_type)))

    async def nudge(self, id_type: str) -> None:
        """Wake a keysync for ``id_type`` now rather than at its next poll."""
        async with translated("nudge"):
            await self._nudge(keys=[redis_keys.keysync_wake_key()], args=[id_type, _WAKE_LIST_MAX])

    async def wait_for_nudge(self, timeout_s: float) -> str | None:
        """Block until a nudge arrives (its id type) or the timeout passes (None)."""
        async with translated("wait_for_nudge"):
            got = await self._client.blpop([redis_keys.keysync_wake_key()], timeout=timeout_s)
        return None if got is None else str(got[1])

    async def ping(self) -> bool:
        async with translated("ping"):
            return bool(await self._client.ping())
