"""The hot tier: per-type Redis lists, touched only through fenced Lua scripts.

The ledger stream (``shared.stores.ledger.stream``) and keysync's wake channel (``wake.py``) live
on the same server but have their own small classes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain import redis_keys
from shared.domain.apikeys import ANONYMOUS
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, IdempotencyMismatch, StoreUnavailable
from shared.domain.tiers import NO_STAMP, Depth, Popped, Pushed, Refill, Stamp
from shared.stores.fence.sync_record import LEASED
from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import RedisPort, Script, fence_slots

log = logging.getLogger(__name__)
BATCH_MARKER_TTL_S = 3_600  # how long a pushed batch's marker lives at least
# The only maxmemory-policy under which Redis never drops a key keydispenser relies on.
SAFE_MEMORY_POLICY = "noeviction"


def pop_keys(ns: str, name: str) -> list[str]:
    return [
        *fence_slots(ns),
        redis_keys.hot_list_key(ns, name),
        redis_keys.exhausted_key(ns, name),
        redis_keys.ledger_stream_key(ns),
        redis_keys.refill_key(ns, name),
    ]


def pop_idempotent_keys(ns: str, name: str, client: str, idempotency_key: str) -> list[str]:
    return [*pop_keys(ns, name), redis_keys.idempotency_key(ns, client, idempotency_key)]


def push_keys(ns: str, name: str, batch_id: str) -> list[str]:
    return [
        *fence_slots(ns),
        redis_keys.hot_list_key(ns, name),
        redis_keys.batch_key(ns, batch_id),
        redis_keys.import_epoch_key(ns, name),
    ]


def exclude_keys(ns: str, name: str) -> list[str]:
    return [
        *fence_slots(ns),
        redis_keys.hot_list_key(ns, name),
        redis_keys.import_epoch_key(ns, name),
    ]


def depth_keys(ns: str, name: str) -> list[str]:
    return [*fence_slots(ns), redis_keys.hot_list_key(ns, name)]


# The scripts of the hot lists, each behind the fence.
POP = Script("pop", pop_keys, fenced=True)
POP_IDEMPOTENT = Script("pop_idempotent", pop_idempotent_keys, fenced=True)
PUSH = Script("push", push_keys, fenced=True)
DEPTH = Script("depth", depth_keys, fenced=True)
EXCLUDE = Script("exclude", exclude_keys, fenced=True)
# How long an import waits for the replicas to acknowledge its writes.
REPLICATED_WAIT_MS = 5_000


@dataclass(frozen=True)
class StockBumped:
    """An import's last step on a hot list: whether a dispenser held a stock lately, and
    how many replicas hold the import's writes, of how many."""

    held: bool
    replicas: int
    acknowledged: int


# Keys read at a time from a hot list an import sweeps.
SWEEP_CHUNK = 10_000


def _refill(raw: Sequence[Any]) -> Refill | None:
    if len(raw) != 2 or raw[0] is None or raw[1] is None:
        return None
    return Refill(float(raw[0]), float(raw[1]))


def pack_keys(keys: Sequence[str]) -> str:
    """A batch as one newline-joined argument of push.lua.

    Thousands of separate arguments cost the Redis client more than the rest of a
    keysync batch (it encodes each in Python); one string costs one. Keys are drawn
    from URL-safe alphabets, so never hold a newline: refused if one does.
    """
    packed = "\n".join(keys)
    if keys and (packed.count("\n") != len(keys) - 1 or not all(keys)):
        raise ValueError("keys must be non-empty and hold no newline")
    return packed


def request_fingerprint(client: str, name: str, count: int) -> str:
    """What an idempotency record was made for: the client, the type and the count."""
    return f"{client}:{name}:{count}"


class HotStore(RedisPort):
    """The hot lists: keysync pushes batches, dispensers pop keys; both behind the fence."""

    def __init__(self, endpoint: RedisEndpoint, namespace: str) -> None:
        super().__init__(endpoint, namespace)
        self.discarded = 0  # keys discarded by fences, seen by this process
        self._pop_keys: dict[str, list[str]] = {}  # per type: built once, popped often

    async def forget(self, name: str) -> int:
        """Remove every trace of a retired type: its hot list (the keys in it are
        wasted, never reissued), its exhausted marker and refill rate, its entries in the
        fence's registry and discard counts and in the sync record. Returns the hot keys
        dropped. Idempotency records expire on their own; the type's ledger stream
        entries are skipped by keysync (the type is no longer configured)."""
        ns, hot = self.namespace, redis_keys.hot_list_key(self.namespace, name)
        await self._close_line(name)
        self._pop_keys.pop(name, None)
        async with self._guard("forget"):
            client = await self._endpoint.client()
            async with client.pipeline(transaction=True) as pipe:
                pipe.llen(hot)
                pipe.delete(
                    hot, redis_keys.exhausted_key(ns, name), redis_keys.refill_key(ns, name)
                )
                pipe.srem(redis_keys.hot_registry_key(ns), hot)
                pipe.hdel(redis_keys.discarded_key(ns), hot)
                pipe.hdel(redis_keys.sync_record_key(ns), LEASED + name)
                dropped, *_ = await pipe.execute()
        return int(dropped)

    @classmethod
    def from_settings(cls, settings: Settings) -> HotStore:
        return cls(RedisEndpoint.from_settings(settings), settings.redis_key_namespace)

    def _discarded(self, count: int, operation: str) -> int:
        if count:
            self.discarded += count
            log.warning("hot_lists_discarded", extra={"keys": count, "operation": operation})
        return count

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = NO_STAMP,
        not_after_ms: int = 0,
        marker_ttl_s: float = BATCH_MARKER_TTL_S,
        epoch: int = 0,
    ) -> Pushed:
        """Append a batch once (``batch_id``), only on the server ``pin`` names if set,
        and not after ``not_after_ms`` of that server's clock (0: no deadline),
        recording its PostgreSQL ``stamp`` (refused: not pushed), unless an import set
        an epoch later than the batch's ``epoch`` (taken before it: 'superseded')."""
        args = [
            pin,
            round(marker_ttl_s * 1000),
            not_after_ms,
            *stamp.args(self.namespace),
            pack_keys(keys),
            epoch,
        ]
        async with self._guard("push"):
            length, discarded, token, status = await self._run(
                PUSH, PUSH.keys(self.namespace, name, batch_id), args
            )
        return Pushed(int(length), str(token), str(status), self._discarded(int(discarded), "push"))

    async def exclude(self, name: str, epoch: int, keys: Sequence[str] = ()) -> int:
        """An import's step (exclude.lua): the type's import epoch raised to ``epoch``,
        then ``keys`` removed from its hot list; how many were removed."""
        async with self._guard("exclude"):
            removed, discarded = await self._run(
                EXCLUDE, EXCLUDE.keys(self.namespace, name), [epoch, pack_keys(keys)]
            )
        self._discarded(int(discarded), "exclude")
        return int(removed)

    async def stock_epoch(self, name: str, hold_ms: int) -> int:
        """The type's stock epoch, marking a stock held for ``hold_ms``."""
        ns = self.namespace
        async with self._guard("stock_epoch"):
            client = await self._endpoint.client()
            async with client.pipeline(transaction=False) as pipe:
                pipe.get(redis_keys.stock_epoch_key(ns, name))
                pipe.set(redis_keys.stock_held_key(ns, name), "1", px=hold_ms)
                epoch, _ = await pipe.execute()
        return int(epoch or 0)

    async def bump_stock(self, name: str, wait_ms: int = REPLICATED_WAIT_MS) -> StockBumped:
        """Move the type's stock epoch on, then wait (``wait_ms`` at most) until every
        replica holds it, and with it every write the primary applied before (an
        import's epoch and sweep): a replica promoted later does not take them back."""
        ns = self.namespace
        async with self._guard("bump_stock"):
            client = await self._endpoint.client()
            replicas = int((await client.info("replication")).get("connected_slaves", 0))
            async with client.pipeline(transaction=False) as pipe:
                pipe.incr(redis_keys.stock_epoch_key(ns, name))
                pipe.exists(redis_keys.stock_held_key(ns, name))
                pipe.wait(replicas, wait_ms)
                _, held, acked = await pipe.execute()
        return StockBumped(bool(held), replicas, int(acked))

    async def listed(self, name: str) -> AsyncIterator[list[str]]:
        """The keys of a type's hot list, a chunk at a time, from its tail: pops at the
        head shift no key still to be read, and keys pushed meanwhile at the tail are
        read twice or not at all (callers read after raising the import epoch, when no
        key they look for can be pushed)."""
        hot = redis_keys.hot_list_key(self.namespace, name)
        start = 0
        while True:
            async with self._guard("listed"):
                client = await self._endpoint.client()
                chunk = await client.lrange(hot, -(start + SWEEP_CHUNK), -(start + 1))
            if not chunk:
                return
            yield [k.decode() if isinstance(k, bytes) else str(k) for k in chunk]
            start += len(chunk)

    async def server_time_ms(self) -> int:
        """The Redis server's clock (TIME), in milliseconds."""
        async with self._guard("time"):
            seconds, micros = await (await self._endpoint.client()).time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def pop(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """Take up to ``count`` keys from the type's hot list. Never retried.

        With ``ledger``, the same script records the issue in the ledger stream, with
        ``clients`` naming the API client of each key (or one name for all).
        """
        return await self._pop(name, count, clients, ledger, on_line=False)

    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """``pop`` over the type's own connection (``ScriptLine``): its caller has one
        pop of the type in flight at a time (a pool's coalesced pop); others' pops would
        queue there, so they go through the client's pool."""
        return await self._pop(name, count, clients, ledger, on_line=True)

    async def _pop(
        self, name: str, count: int, clients: Sequence[str], ledger: bool, *, on_line: bool
    ) -> Popped:
        args = [count, name if ledger else "", *(clients or (ANONYMOUS,))]
        keys = self._pop_keys.get(name)
        if keys is None:
            keys = self._pop_keys[name] = POP.keys(self.namespace, name)
        async with self._guard("pop"):
            if on_line:
                reply = await self._run_on_line(name, POP, keys, args)
            else:
                reply = await self._run(POP, keys, args)
        taken, remaining, exhausted, discarded, refill = reply
        return Popped(
            list(taken),
            int(remaining),
            bool(exhausted),
            self._discarded(int(discarded), "pop"),
            refill=_refill(refill),
        )

    async def pop_once(
        self,
        name: str,
        count: int,
        idempotency_key: str,
        ttl_s: int,
        client: str = ANONYMOUS,
        ledger: bool = False,
    ) -> Popped:
        """Like ``pop``, but a repeated ``idempotency_key`` gets the first answer's keys
        (of a ``ledger`` type, only while the server that answered first owns the fence).

        The record belongs to ``client``: its Redis key and the request fingerprint
        stored in it both hold the client's name. Raises IdempotencyMismatch when the
        key was used for another type or count.
        """
        keys = POP_IDEMPOTENT.keys(self.namespace, name, client, idempotency_key)
        request = request_fingerprint(client, name, count)
        owned_only = "1" if ledger else "0"
        args = [count, name if ledger else "", client, ttl_s, request, idempotency_key, owned_only]
        async with self._guard("pop"):
            status, taken, remaining, exhausted, discarded, refill = await self._run(
                POP_IDEMPOTENT, keys, args
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

    async def observe(self, name: str) -> Depth:
        async with self._guard("depth"):
            length, discarded, token = await self._run(DEPTH, DEPTH.keys(self.namespace, name), [])
        return Depth(int(length), str(token), self._discarded(int(discarded), "depth"))

    async def depth(self, name: str) -> int:
        return (await self.observe(name)).length

    async def memory_policy(self) -> str:
        """The server's maxmemory-policy (from INFO: CONFIG may be disabled)."""
        async with self._guard("memory_policy"):
            info = await (await self._endpoint.client()).info("memory")
        return str(info.get("maxmemory_policy", SAFE_MEMORY_POLICY))

    async def refuse_eviction(self) -> None:
        """Raise ConfigError unless the server can never evict keys.

        An evicted hot list loses keys, an evicted batch marker lets a retried push add
        a batch twice, an evicted idempotency record hands a retry new keys.
        """
        policy = await self.memory_policy()
        if policy != SAFE_MEMORY_POLICY:
            raise ConfigError(
                f"redis maxmemory-policy is '{policy}': the hot-tier Redis must not evict "
                f"keys; set maxmemory-policy {SAFE_MEMORY_POLICY} (redis.conf or CONFIG SET)"
            )

    async def warn_if_reloadable(self) -> bool:
        """Log a warning when the server allows DEBUG RELOAD (``enable-debug-command``):
        a reload of an older file in place keeps the server's identity, where the fence
        cannot see it (docs/operations.md forbids it). True when it warned; unknown
        (CONFIG refused, as managed services do) counts as not allowed."""
        try:
            async with self._guard("config_get"):
                found = await (await self._endpoint.client()).config_get("enable-debug-command")
        except StoreUnavailable:
            return False
        value = str(found.get("enable-debug-command", "no"))
        if value == "no":
            return False
        log.warning(
            "redis_debug_command_enabled",
            extra={
                "enable_debug_command": value,
                "hint": "DEBUG RELOAD would reload older data unseen by the fence: set "
                "enable-debug-command no",
            },
        )
        return True

    async def exhausted(self, name: str) -> bool:
        """Whether keysync marked the type's keyspace used up."""
        async with self._guard("exhausted"):
            return bool(
                await (await self._endpoint.client()).exists(
                    redis_keys.exhausted_key(self.namespace, name)
                )
            )

    async def mark_exhausted(self, name: str) -> None:
        async with self._guard("mark_exhausted"):
            await (await self._endpoint.client()).set(
                redis_keys.exhausted_key(self.namespace, name), "1"
            )

    async def record_refill(self, name: str, rate: float, at: float) -> None:
        """keysync's observed refill rate of a hot list (for dispensers' Retry-After)."""
        async with self._guard("record_refill"):
            await (await self._endpoint.client()).hset(
                redis_keys.refill_key(self.namespace, name),
                mapping={"rate": f"{rate:.3f}", "at": f"{at:.3f}"},
            )

    async def ping(self) -> bool:
        async with self._guard("ping"):
            return bool(await (await self._endpoint.client()).ping())

    async def discarded_counts(self) -> dict[str, int]:
        async with self._guard("discarded_counts"):
            raw = await (await self._endpoint.client()).hgetall(
                redis_keys.discarded_key(self.namespace)
            )
        return {str(k): int(v) for k, v in raw.items()}
