"""The hot tier: per-type Redis lists, touched only through fenced Lua scripts."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from shared import redis_keys
from shared.errors import IdempotencyMismatch, StoreUnavailable
from shared.redis_endpoint import RedisEndpoint, means_primary_moved
from shared.settings import Settings

log = logging.getLogger(__name__)
_WAKE_LIST_MAX = 64
BATCH_MARKER_TTL_S = 3_600


def load_script(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text()


def fenced_script(name: str) -> str:
    """The fence prologue followed by the script's own body."""
    return load_script("fence") + "\n" + load_script(name)


@dataclass(frozen=True)
class Popped:
    keys: list[str]
    remaining: int
    exhausted: bool  # only ever True when ``keys`` is empty
    discarded: int = 0  # inherited keys a fence discarded during this call
    replayed: bool = False  # the keys a previous request with the same idempotency key got


@dataclass(frozen=True)
class Pushed:
    length: int
    token: str  # identity of the server that answered: run_id:master_replid
    status: str  # pushed | duplicate | refused
    discarded: int = 0


@dataclass(frozen=True)
class Depth:
    length: int
    token: str
    discarded: int = 0


def _fence_keys(hot_list: str) -> list[str]:
    return [
        redis_keys.fence_key(),
        redis_keys.hot_registry_key(),
        redis_keys.discarded_key(),
        hot_list,
    ]


class HotStore:
    def __init__(self, endpoint: RedisEndpoint) -> None:
        self._endpoint = endpoint
        self._scripts: dict[str, AsyncScript] = {}
        self.discarded = 0  # keys discarded by fences, seen by this process

    @classmethod
    def from_settings(cls, settings: Settings) -> HotStore:
        return cls(RedisEndpoint.from_settings(settings))

    @property
    def endpoint(self) -> RedisEndpoint:
        return self._endpoint

    async def close(self) -> None:
        await self._endpoint.close()

    @asynccontextmanager
    async def _guard(self, operation: str) -> AsyncIterator[None]:
        """Driver errors -> StoreUnavailable; re-resolve the primary when it may have moved."""
        try:
            yield
        except (RedisError, OSError) as exc:
            if means_primary_moved(exc):
                self._endpoint.invalidate()
            raise StoreUnavailable("redis", f"{operation} failed: {exc}") from exc

    async def _run(self, name: str, keys: list[str], args: Sequence[Any]) -> Any:
        client = await self._endpoint.client()
        script = self._scripts.get(name)
        if script is None:
            body = load_script(name) if name == "nudge" else fenced_script(name)
            script = self._scripts[name] = client.register_script(body)
        # EVALSHA, loading the script once on NOSCRIPT (a new primary has none).
        return await script(keys=keys, args=list(args), client=client)

    def _discarded(self, count: int, operation: str) -> int:
        if count:
            self.discarded += count
            log.warning("hot_lists_discarded", extra={"keys": count, "operation": operation})
        return count

    async def push(self, id_type: str, keys: Sequence[str], batch_id: str, pin: str = "") -> Pushed:
        """Append a batch once (``batch_id``), only on the server ``pin`` names if set."""
        names = [*_fence_keys(redis_keys.hot_list_key(id_type)), redis_keys.batch_key(batch_id)]
        async with self._guard("push"):
            length, discarded, token, status = await self._run(
                "push", names, [pin, BATCH_MARKER_TTL_S, *keys]
            )
        return Pushed(int(length), str(token), str(status), self._discarded(int(discarded), "push"))

    async def pop(self, id_type: str, count: int) -> Popped:
        """Take up to ``count`` keys from the type's hot list. Never retried."""
        names = [*_fence_keys(redis_keys.hot_list_key(id_type)), redis_keys.exhausted_key(id_type)]
        async with self._guard("pop"):
            taken, remaining, exhausted, discarded = await self._run("pop", names, [count])
        return Popped(
            list(taken), int(remaining), bool(exhausted), self._discarded(int(discarded), "pop")
        )

    async def pop_once(self, id_type: str, count: int, idempotency_key: str, ttl_s: int) -> Popped:
        """Like ``pop``, but a repeated ``idempotency_key`` gets the first answer's keys.

        Raises IdempotencyMismatch when the key was used for another type or count.
        """
        names = [
            *_fence_keys(redis_keys.hot_list_key(id_type)),
            redis_keys.exhausted_key(id_type),
            redis_keys.idempotency_key(idempotency_key),
        ]
        request = f"{id_type}:{count}"
        async with self._guard("pop"):
            status, taken, remaining, exhausted, discarded = await self._run(
                "pop_idempotent", names, [count, ttl_s, request]
            )
        if status == "mismatch":
            raise IdempotencyMismatch(idempotency_key)
        return Popped(
            list(taken),
            int(remaining),
            bool(exhausted),
            self._discarded(int(discarded), "pop"),
            replayed=status == "replayed",
        )

    async def observe(self, id_type: str) -> Depth:
        async with self._guard("depth"):
            length, discarded, token = await self._run(
                "depth", _fence_keys(redis_keys.hot_list_key(id_type)), []
            )
        return Depth(int(length), str(token), self._discarded(int(discarded), "depth"))

    async def depth(self, id_type: str) -> int:
        return (await self.observe(id_type)).length

    async def mark_exhausted(self, id_type: str) -> None:
        async with self._guard("mark_exhausted"):
            await (await self._endpoint.client()).set(redis_keys.exhausted_key(id_type), "1")

    async def nudge(self, id_type: str) -> None:
        """Wake a keysync for ``id_type`` now rather than at its next poll."""
        async with self._guard("nudge"):
            await self._run("nudge", [redis_keys.keysync_wake_key()], [id_type, _WAKE_LIST_MAX])

    async def wait_for_nudge(self, timeout_s: float) -> str | None:
        """Block until a nudge arrives (its id type) or the timeout passes (None)."""
        async with self._guard("wait_for_nudge"):
            client = await self._endpoint.client()
            got = await client.blpop([redis_keys.keysync_wake_key()], timeout=timeout_s)
        return None if got is None else str(got[1])

    async def ping(self) -> bool:
        async with self._guard("ping"):
            return bool(await (await self._endpoint.client()).ping())

    async def discarded_counts(self) -> dict[str, int]:
        async with self._guard("discarded_counts"):
            raw = await (await self._endpoint.client()).hgetall(redis_keys.discarded_key())
        return {str(k): int(v) for k, v in raw.items()}
