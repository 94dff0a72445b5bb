"""The Lua scripts and how they are called: one function per script builds its key list.

Every script is declared once, in ``SCRIPTS``: its key list, and what runs before it.
A script that reads or writes hot lists, the sync clock's record or leases is fenced:
``fence.lua`` (with the ledger's and the record's helpers) is prepended, and the
fence's four slots (``fence_slots``) come first in its key list; the lease scripts also
get the helpers in ``lease.lua``. Each ``.lua`` file names its own KEYS/ARGV slots as
locals at the top; the functions here fill them in that order.

Scripts never build key names: every name comes from ``redis_keys`` through these
functions, which take the namespace as their first argument (``RedisPort.namespace``),
so a script touches only its own namespace's keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from shared.domain import redis_keys
from shared.domain.errors import StoreUnavailable
from shared.stores.redis.endpoint import RedisEndpoint, describe, means_primary_moved
from shared.stores.redis.script_line import LineScript, ScriptLine

# The packages whose ``lua/`` folder holds scripts, one per mechanism: the fence (with its
# record), the ledger, the hot lists, the machine-ID leases. A script is named by its file.
LUA_HOMES = ("shared.stores.fence", "shared.stores.ledger", "shared.stores.hot", "shared.leases")


def load_script(script: str) -> str:
    """The text of ``<script>.lua``, from the mechanism's package that holds it."""
    for home in LUA_HOMES:
        try:
            found = resources.files(home).joinpath("lua", f"{script}.lua")
        except ModuleNotFoundError:
            continue  # a distribution without that mechanism (the lease library)
        if found.is_file():
            return found.read_text()
    raise FileNotFoundError(f"no Lua script {script!r} in {', '.join(LUA_HOMES)}")


# The fence's prologue: what every fenced script starts with (helpers, no KEYS of their own
# beyond the fence's slots).
PROLOGUE = ("fence", "ledger", "sync_record")


def fenced_script(script: str, helpers: tuple[str, ...] = ()) -> str:
    """The fence prologue and the helpers, followed by the script's own body."""
    return "\n".join(load_script(part) for part in (*PROLOGUE, *helpers, script))


def fence_slots(ns: str) -> list[str]:
    """KEYS[1..4] of every fenced script: fence, registry, discard counts, sync record."""
    return [
        redis_keys.fence_key(ns),
        redis_keys.hot_registry_key(ns),
        redis_keys.discarded_key(ns),
        redis_keys.sync_record_key(ns),
    ]


def depth_keys(ns: str, name: str) -> list[str]:
    return [*fence_slots(ns), redis_keys.hot_list_key(ns, name)]


def push_keys(ns: str, name: str, batch_id: str) -> list[str]:
    return [*fence_slots(ns), redis_keys.hot_list_key(ns, name), redis_keys.batch_key(ns, batch_id)]


def record_keys(ns: str) -> list[str]:
    """read_record, record_lease, reset_record, vouch_record, bind_record, halt_record:
    the fence's slots only."""
    return fence_slots(ns)


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


def _lease_slots(ns: str, pool: str) -> list[str]:
    """KEYS[5..7] of the lease scripts: the pool's leases, its last timestamps, the
    longest TTL granted."""
    return [
        *fence_slots(ns),
        redis_keys.machine_leases_key(ns, pool),
        redis_keys.machine_last_key(ns, pool),
        redis_keys.lease_ttl_key(ns),
    ]


def lease_acquire_keys(ns: str, pool: str) -> list[str]:
    return _lease_slots(ns, pool)


def lease_renew_keys(ns: str, pool: str) -> list[str]:
    return _lease_slots(ns, pool)


def lease_release_keys(ns: str, pool: str) -> list[str]:
    return _lease_slots(ns, pool)


def lease_holders_keys(ns: str, pool: str) -> list[str]:
    return _lease_slots(ns, pool)


def forget_consumer_keys(ns: str, consumer: str) -> list[str]:
    return [redis_keys.ledger_stream_key(ns), redis_keys.ledger_consumer_key(ns, consumer)]


def ledger_ack_keys(ns: str) -> list[str]:
    return [redis_keys.ledger_stream_key(ns), redis_keys.ledger_retained_key(ns)]


def nudge_keys(ns: str) -> list[str]:
    return [redis_keys.keysync_wake_key(ns)]


@dataclass(frozen=True)
class Script:
    """A Lua script, named by its file: how its key list is built from the namespace (and
    the call's own names), whether the fence's prologue runs first, and the helpers
    prepended after it."""

    keys: Callable[..., list[str]]
    fenced: bool = True
    helpers: tuple[str, ...] = ()

    def body(self, name: str) -> str:
        if not self.fenced:
            return load_script(name)
        return fenced_script(name, self.helpers)


# Every script a store runs. A new one is its .lua file, its entry here (a key list
# function above when its slots are new), and the adapter's method that calls it.
SCRIPTS: dict[str, Script] = {
    # the hot lists (shared.stores.hot)
    "pop": Script(pop_keys),
    "pop_idempotent": Script(pop_idempotent_keys),
    "push": Script(push_keys),
    "depth": Script(depth_keys),
    "nudge": Script(nudge_keys, fenced=False),  # keysync's wake list
    # the PostgreSQL fence's record (shared.stores.fence)
    **{
        name: Script(record_keys)
        for name in (
            "read_record",
            "record_lease",
            "reset_record",
            "vouch_record",
            "bind_record",
            "confirm_record",
            "halt_record",
        )
    },
    # the ledger stream (shared.stores.ledger): its own keys, no fence
    "ledger_ack": Script(ledger_ack_keys, fenced=False),
    "forget_consumer": Script(forget_consumer_keys, fenced=False),
    # machine-ID leases (shared.leases)
    "lease_acquire": Script(lease_acquire_keys, helpers=("lease",)),
    "lease_renew": Script(lease_renew_keys, helpers=("lease",)),
    "lease_release": Script(lease_release_keys, helpers=("lease",)),
    "lease_holders": Script(lease_holders_keys, helpers=("lease",)),
}


def _body(script: str) -> str:
    return SCRIPTS[script].body(script)


class RedisPort:
    """A connection to the Redis primary: runs scripts by SHA, translates driver errors.

    ``namespace`` (``settings.redis_key_namespace``) prefixes every key it names; ports that
    share an endpoint share its namespace too (``RedisPort(other.endpoint,
    other.namespace)``).
    """

    def __init__(self, endpoint: RedisEndpoint, namespace: str) -> None:
        self._endpoint = endpoint
        self.namespace = namespace
        self._scripts: dict[str, AsyncScript] = {}
        self._lines: dict[str, ScriptLine] = {}
        self._line_scripts: dict[str, LineScript] = {}

    @property
    def endpoint(self) -> RedisEndpoint:
        return self._endpoint

    async def close(self) -> None:
        lines = list(self._lines.values())
        self._lines.clear()
        for line in lines:
            await line.close()
        await self._endpoint.close()

    @asynccontextmanager
    async def _guard(self, operation: str) -> AsyncIterator[None]:
        """Driver errors -> StoreUnavailable; re-resolve the primary when it may have moved."""
        try:
            yield
        except (RedisError, OSError) as exc:
            if means_primary_moved(exc):
                self._endpoint.invalidate()
            raise StoreUnavailable("redis", f"{operation} failed: {describe(exc)}") from exc

    async def _run(self, script: str, keys: list[str], args: Sequence[Any]) -> Any:
        client = await self._endpoint.client()
        registered = self._registered(script, client)
        # EVALSHA, loading the script once on NOSCRIPT (a new primary has none).
        return await registered(keys=keys, args=list(args), client=client)

    async def _run_acked(
        self, script: str, keys: list[str], args: Sequence[Any], replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """``_run``, then WAIT on the same connection: the script's reply and how many
        replicas acknowledged its writes within ``timeout_ms`` (``replicas`` wanted)."""
        client = await self._endpoint.client()
        registered = self._registered(script, client)
        async with client.pipeline(transaction=False) as pipe:
            await registered(keys=keys, args=list(args), client=pipe)
            pipe.wait(replicas, timeout_ms)
            reply, acked = await pipe.execute()
        return reply, int(acked)

    async def _run_on_line(
        self, line: str, script: str, keys: list[str], args: Sequence[Any]
    ) -> Any:
        """``_run`` on a connection of this port's own (``ScriptLine``), one per ``line``
        name: for the script called per batch of requests, where the pooled call's
        overhead shows. Calls on one line wait for each other; lines do not."""
        each = self._lines.get(line)
        if each is None:
            each = self._lines[line] = ScriptLine()
        return await each.run(self._endpoint.client, self._line_script(script), keys, args)

    async def _close_line(self, line: str) -> None:
        each = self._lines.pop(line, None)
        if each is not None:
            await each.close()

    def _registered(self, script: str, client: aioredis.Redis) -> AsyncScript:
        registered = self._scripts.get(script)
        if registered is None:
            registered = self._scripts[script] = client.register_script(_body(script))
        return registered

    def _line_script(self, script: str) -> LineScript:
        found = self._line_scripts.get(script)
        if found is None:
            found = self._line_scripts[script] = LineScript(_body(script))
        return found
