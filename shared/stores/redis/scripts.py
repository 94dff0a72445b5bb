"""The Lua scripts and how they are called.

Each script is declared once, as a ``Script`` beside the adapter method that calls it
(``hot_store.POP``, ``sync_record.READ_RECORD``, ...): its key list, and what runs
before it. A script that reads or writes hot lists, the sync clock's record or leases
is fenced: ``fence.lua`` (with the ledger's and the record's helpers) is prepended, and
the fence's four slots (``fence_slots``) come first in its key list; the lease scripts
also get the helpers in ``lease.lua``. Each ``.lua`` file names its own KEYS/ARGV
slots as locals at the top; its declaration's key function fills them in that order.

Scripts never build key names: every name comes from ``redis_keys`` through those
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
from shared.stores.redis.endpoint import (
    RedisEndpoint,
    certificate_refused,
    describe,
    means_primary_moved,
)
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


@dataclass(frozen=True)
class Script:
    """A Lua script, declared once beside the adapter that calls it: its name (its file in
    the mechanism's ``lua/`` folder), how its key list is built from the namespace (and
    the call's own names), whether the fence's prologue runs first (every declaration
    says so: none is fenced, or not, by default), and the helpers prepended after it.
    """

    name: str
    keys: Callable[..., list[str]]
    fenced: bool
    helpers: tuple[str, ...] = ()

    def body(self) -> str:
        if not self.fenced:
            return load_script(self.name)
        return fenced_script(self.name, self.helpers)


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
            refused = certificate_refused(exc)
            if refused is not None:
                raise self._endpoint.certificate_error(refused) from exc
            if means_primary_moved(exc):
                self._endpoint.invalidate()
            raise StoreUnavailable("redis", f"{operation} failed: {describe(exc)}") from exc

    async def _run(self, script: Script, keys: list[str], args: Sequence[Any]) -> Any:
        client = await self._endpoint.client()
        registered = self._registered(script, client)
        # EVALSHA, loading the script once on NOSCRIPT (a new primary has none).
        return await registered(keys=keys, args=list(args), client=client)

    async def _run_acked(
        self, script: Script, keys: list[str], args: Sequence[Any], replicas: int, timeout_ms: int
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
        self, line: str, script: Script, keys: list[str], args: Sequence[Any]
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

    def _registered(self, script: Script, client: aioredis.Redis) -> AsyncScript:
        registered = self._scripts.get(script.name)
        if registered is None:
            registered = self._scripts[script.name] = client.register_script(script.body())
        return registered

    def _line_script(self, script: Script) -> LineScript:
        found = self._line_scripts.get(script.name)
        if found is None:
            found = self._line_scripts[script.name] = LineScript(script.body())
        return found
