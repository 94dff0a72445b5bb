"""Where the Redis primary is: a plain URL, or resolved through Sentinel.

redis-py's SentinelConnectionPool keeps retrying the old master's address
(redis-py issue #3874) and does not re-resolve on READONLY/NOREPLICAS. So the
address is resolved here with ``Sentinel.discover_master`` and a plain client
is kept for it; any failure that may mean "the primary moved" marks the
endpoint stale, and the next use resolves again (single-flight, rate-limited).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import BusyLoadingError, ReadOnlyError, RedisError, TimeoutError
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.errors import StoreUnavailable
from shared.settings import SentinelConfig, Settings

log = logging.getLogger(__name__)
_RESOLVE_EVERY_S = 0.1  # at most this often while the primary cannot be found
_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 5.0}


class RedisEndpoint:
    def __init__(self, url: str | None = None, sentinel: SentinelConfig | None = None) -> None:
        self._url = url
        self._sentinel_config = sentinel
        self._sentinel: Sentinel | None = None
        self._client: aioredis.Redis | None = None
        self._address: tuple[str, int] | None = None
        self._stale = True
        self._last_resolve = 0.0
        self._lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisEndpoint:
        return cls(settings.redis_url, settings.redis_sentinel)

    @property
    def address(self) -> tuple[str, int] | None:
        return self._address

    async def client(self) -> aioredis.Redis:
        """The client for the current primary, resolving it first when stale."""
        if self._client is not None and not self._stale:
            return self._client
        async with self._lock:
            if self._client is None or self._stale:
                await self._resolve()
        assert self._client is not None
        return self._client

    def invalidate(self) -> None:
        """The primary may have moved: resolve again before the next command."""
        if self._sentinel_config is not None:
            self._stale = True

    async def _resolve(self) -> None:
        if self._sentinel_config is None:
            self._client = self._client or aioredis.Redis.from_url(
                self._url or "redis://127.0.0.1:6379/0", decode_responses=True, **_TIMEOUTS
            )
            self._stale = False
            return
        wait = self._last_resolve + _RESOLVE_EVERY_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._last_resolve = time.monotonic()
        try:
            address = await self._sentinel_client().discover_master(
                self._sentinel_config.master_name
            )
        except (RedisError, OSError) as exc:
            raise StoreUnavailable("redis", f"no primary from sentinel: {exc}") from exc
        await self._use((str(address[0]), int(address[1])))

    def _sentinel_client(self) -> Sentinel:
        config = self._sentinel_config
        assert config is not None
        if self._sentinel is None:
            secret = config.sentinel_password
            self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
                config.addresses(),
                sentinel_kwargs={
                    "password": secret.get_secret_value() if secret else None,
                    **_TIMEOUTS,
                },
                socket_connect_timeout=1.0,
            )
        return self._sentinel

    async def _use(self, address: tuple[str, int]) -> None:
        config = self._sentinel_config
        assert config is not None
        if address != self._address or self._client is None:
            old = self._client
            self._client = aioredis.Redis(
                host=address[0],
                port=address[1],
                db=config.db,
                username=config.username,
                password=config.password.get_secret_value() if config.password else None,
                ssl=config.tls,
                decode_responses=True,
                **_TIMEOUTS,
            )
            if old is not None:
                await old.aclose()
            log.info("redis_primary", extra={"host": address[0], "port": address[1]})
            self._address = address
        self._stale = False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._sentinel is not None:
            for each in self._sentinel.sentinels:
                await each.aclose()


# Errors after which the primary may have moved (or the command did not run there).
MOVED_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, TimeoutError, OSError)


_MOVED_TEXT = ("READONLY", "read only replica", "NOREPLICAS", "MASTERDOWN", "LOADING")


def means_primary_moved(exc: BaseException) -> bool:
    """redis-py strips the READONLY prefix into ReadOnlyError; script errors wrap the text."""
    if isinstance(exc, (*MOVED_ERRORS, ReadOnlyError, BusyLoadingError)):
        return True
    text = str(exc)
    return any(marker in text for marker in _MOVED_TEXT)
