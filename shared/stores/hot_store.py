"""The hot tier: per-type Redis lists, touched only through fenced Lua scripts."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError, ResponseError

from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import IdempotencyMismatch, StoreUnavailable
from shared.domain.settings import Settings
from shared.stores import redis_keys
from shared.stores.redis_endpoint import RedisEndpoint, means_primary_moved

log = logging.getLogger(__name__)
_WAKE_LIST_MAX = 64
LEDGER_GROUP = "kd-ledger"  # the consumer group keysync drains the ledger stream with
LedgerEntry = tuple[str, dict[str, str]]
BATCH_MARKER_TTL_S = 3_600


def load_script(name: str) -> str:
    return resources.files("shared.stores").joinpath("lua", f"{name}.lua").read_text()


def fenced_script(name: str) -> str:
    """The fence prologue (and the ledger helper) followed by the script's own body."""
    return "\n".join((load_script("fence"), load_script("ledger"), load_script(name)))


@dataclass(frozen=True)
class Refill:
    """What keysync last observed of a hot list's refill (only read when it is empty)."""

    rate: float  # keys/s
    at: float  # unix time of the observation


@dataclass(frozen=True)
class Popped:
    keys: list[str]
    remaining: int
    exhausted: bool  # only ever True when ``keys`` is empty
    discarded: int = 0  # inherited keys a fence discarded during this call
    replayed: bool = False  # the keys a previous request with the same idempotency key got
    refill: Refill | None = None  # set only when no key was available


def _refill(raw: Sequence[Any]) -> Refill | None:
    if len(raw) != 2 or raw[0] is None or raw[1] is None:
        return None
    return Refill(float(raw[0]), float(raw[1]))


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


def pop_keys(id_type: str) -> list[str]:
    return [
        *_fence_keys(redis_keys.hot_list_key(id_type)),
        redis_keys.exhausted_key(id_type),
        redis_keys.ledger_stream_key(),
        redis_keys.refill_key(id_type),
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

    async def pop(
        self, id_type: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """Take up to ``count`` keys from the type's hot list. Never retried.

        With ``ledger``, the same script records the issue in the ledger stream, with
        ``clients`` naming the API client of each key (or one name for all).
        """
        names = pop_keys(id_type)
        args = [count, id_type if ledger else "", *(clients or (ANONYMOUS,))]
        async with self._guard("pop"):
            taken, remaining, exhausted, discarded, refill = await self._run("pop", names, args)
        return Popped(
            list(taken),
            int(remaining),
            bool(exhausted),
            self._discarded(int(discarded), "pop"),
            refill=_refill(refill),
        )

    async def pop_once(
        self,
        id_type: str,
        count: int,
        idempotency_key: str,
        ttl_s: int,
        client: str = ANONYMOUS,
        ledger: bool = False,
    ) -> Popped:
        """Like ``pop``, but a repeated ``idempotency_key`` gets the first answer's keys.

        Raises IdempotencyMismatch when the key was used for another type or count.
        """
        names = [*pop_keys(id_type), redis_keys.idempotency_key(idempotency_key)]
        request = f"{id_type}:{count}"
        args = [count, id_type if ledger else "", client, ttl_s, request, idempotency_key]
        async with self._guard("pop"):
            status, taken, remaining, exhausted, discarded, refill = await self._run(
                "pop_idempotent", names, args
            )
        if status == "mismatch":
            raise IdempotencyMismatch(idempotency_key)
        return Popped(
            list(taken),
            int(remaining),
            bool(exhausted),
            self._discarded(int(discarded), "pop"),
            replayed=status == "replayed",
            refill=_refill(refill),
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

    async def record_used(self, id_type: str, keys: Sequence[str], client: str) -> None:
        """Append a "used" event to the ledger stream (applied by keysync's drain)."""
        async with self._guard("record_used"):
            await (await self._endpoint.client()).xadd(
                redis_keys.ledger_stream_key(),
                {"op": "used", "type": id_type, "keys": " ".join(keys), "clients": client},
            )

    async def ledger_read(
        self, consumer: str, count: int, block_ms: int, claim_idle_ms: int
    ) -> list[LedgerEntry]:
        """Ledger entries for ``consumer``: first any that another consumer has held
        unacknowledged for ``claim_idle_ms`` (it died), then new ones."""
        stream = redis_keys.ledger_stream_key()
        async with self._guard("ledger_read"):
            client = await self._endpoint.client()
            try:
                _, claimed, *_ = await client.xautoclaim(
                    stream, LEDGER_GROUP, consumer, claim_idle_ms, "0-0", count=count
                )
                if claimed:
                    return [(str(i), dict(f)) for i, f in claimed if f is not None]
                answer: Any = await client.xreadgroup(
                    LEDGER_GROUP, consumer, {stream: ">"}, count=count, block=block_ms
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # A new stream (or a new primary): create the group from the start.
                try:
                    await client.xgroup_create(stream, LEDGER_GROUP, id="0", mkstream=True)
                except ResponseError as race:
                    if "BUSYGROUP" not in str(race):  # another keysync just created it
                        raise
                return []
        return [(str(i), dict(f)) for _, entries in answer for i, f in entries]

    async def ledger_ack(self, entry_ids: Sequence[str]) -> None:
        """Acknowledge and delete applied entries, so the stream only holds the backlog."""
        stream = redis_keys.ledger_stream_key()
        async with self._guard("ledger_ack"):
            client = await self._endpoint.client()
            async with client.pipeline(transaction=True) as pipe:
                pipe.xack(stream, LEDGER_GROUP, *entry_ids)
                pipe.xdel(stream, *entry_ids)
                await pipe.execute()

    async def ledger_backlog(self) -> int:
        async with self._guard("ledger_backlog"):
            return int(await (await self._endpoint.client()).xlen(redis_keys.ledger_stream_key()))

    async def record_refill(self, id_type: str, rate: float, at: float) -> None:
        """keysync's observed refill rate of a hot list (for dispensers' Retry-After)."""
        async with self._guard("record_refill"):
            await (await self._endpoint.client()).hset(
                redis_keys.refill_key(id_type), mapping={"rate": f"{rate:.3f}", "at": f"{at:.3f}"}
            )

    async def ping(self) -> bool:
        async with self._guard("ping"):
            return bool(await (await self._endpoint.client()).ping())

    async def discarded_counts(self) -> dict[str, int]:
        async with self._guard("discarded_counts"):
            raw = await (await self._endpoint.client()).hgetall(redis_keys.discarded_key())
        return {str(k): int(v) for k, v in raw.items()}
