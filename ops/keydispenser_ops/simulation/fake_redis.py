"""Redis for the simulation: fakeredis (with lupa, so the real Lua scripts run), behind
redis-py's asyncio interface as the stores use it, with the faults of a real primary.

- Every command is one round trip: the request in flight, the command run at once on
  the server that is primary when it arrives, the reply in flight. A failover or
  restart meanwhile breaks the reply (``ConnectionError``: the caller cannot tell
  whether it ran, as with a real connection).
- The server's identity is what ``fence.lua`` reads with ``INFO`` (``run_id``,
  ``master_replid``), which fakeredis lacks: it is added here.
- After every write what it changed is copied (a replica's view, one write at a
  time): a failover promotes a copy that lacked the newest writes, a restart brings back
  an older one, or none at all.
- Blocking reads (``XREADGROUP BLOCK``) wait on the simulation's clock.

``tests/integration/test_simulation_conformance.py`` runs the ledger's histories on
this and on a real Redis and compares what each holds.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Callable
from typing import Any, cast

import fakeredis
from fakeredis._commands import SUPPORTED_COMMANDS, Signature
from fakeredis._socket._fakesocket import FakeSocket
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import Script


def _info(self: FakeSocket, *sections: bytes) -> bytes:
    """INFO, as fence.lua reads it: this server's run_id, role and replication id."""
    server = self._server
    return (
        "# Server\r\n"
        f"run_id:{getattr(server, 'kd_run_id', '0' * 40)}\r\n"
        "# Replication\r\n"
        "role:master\r\n"
        f"master_replid:{getattr(server, 'kd_replid', '0' * 40)}\r\n"
    ).encode()


def install_info() -> None:
    """Teach fakeredis INFO (once per process)."""
    if "info" not in SUPPORTED_COMMANDS:
        FakeSocket.info = _info  # type: ignore[attr-defined]
        SUPPORTED_COMMANDS["info"] = Signature("info", "info", (), (bytes,))  # type: ignore[arg-type]


class SimRedis:
    """The Redis primary across failovers and restarts, and its replicas' copies."""

    # How many writes back a replica or a snapshot may be.
    HISTORY = 400

    def __init__(self, latency: Callable[[], float], ids: Callable[[], str]) -> None:
        install_info()
        self._latency = latency
        self._ids = ids
        self.epoch = 0
        # The data as it was after each of the last HISTORY writes: a full copy (``base``)
        # and, for each write after it, the keys it changed (None: deleted).
        self._base: dict[bytes, Any] = {}
        self._deltas: list[dict[bytes, Any]] = []
        self._touched: set[bytes] = set()
        self.server = self._new_server({})
        self.sync = fakeredis.FakeRedis(server=self.server, decode_responses=True)
        # Told of every command as it runs on the server (before its reply travels).
        self.listeners: list[Callable[[str, tuple[Any, ...], Any], None]] = []
        self.names = script_names()

    def _new_server(self, data: dict[bytes, Any]) -> fakeredis.FakeServer:
        server = fakeredis.FakeServer(version=(7, 2))
        server.kd_run_id = self._ids()  # type: ignore[attr-defined]
        server.kd_replid = self._ids()  # type: ignore[attr-defined]
        db = server.dbs[0]
        db._dict.update(copy.deepcopy(data))
        notify = db.notify_watch

        def touched(key: bytes) -> None:
            self._touched.add(key)
            notify(key)

        db.notify_watch = touched  # type: ignore[method-assign]
        return server

    def data_back(self, writes: int) -> dict[bytes, Any]:
        """The data as it was ``writes`` writes ago (as far back as the history goes)."""
        upto = max(0, len(self._deltas) - writes)
        data = dict(self._base)
        for delta in self._deltas[:upto]:
            for key, item in delta.items():
                if item is None:
                    data.pop(key, None)
                else:
                    data[key] = item
        return data

    def _copied(self) -> None:
        """After a write: what it changed, kept for the replicas."""
        if not self._touched:
            return
        live = self.server.dbs[0]._dict
        self._deltas.append(
            {key: copy.deepcopy(live[key]) if key in live else None for key in self._touched}
        )
        self._touched = set()
        if len(self._deltas) > self.HISTORY:
            for key, item in self._deltas.pop(0).items():
                if item is None:
                    self._base.pop(key, None)
                else:
                    self._base[key] = item

    # --- faults -------------------------------------------------------------------

    def fail_over(self, behind: int) -> None:
        """A replica that lacked the last ``behind`` writes becomes the primary (a new
        replication id: fence.lua sees a new identity)."""
        self._replace(self.data_back(behind))

    def restart(self, back: int | None) -> None:
        """The primary restarts: empty (``back`` None), or from the data ``back`` writes
        ago (an older snapshot)."""
        self._replace({} if back is None else self.data_back(back))

    def _replace(self, data: dict[bytes, Any]) -> None:
        self.server = self._new_server(data)
        self.sync = fakeredis.FakeRedis(server=self.server, decode_responses=True)
        self._base, self._deltas, self._touched = copy.deepcopy(data), [], set()
        self.epoch += 1

    # --- commands -----------------------------------------------------------------

    async def call(
        self, name: str, run: Callable[[fakeredis.FakeRedis], Any], args: tuple[Any, ...]
    ) -> Any:
        await asyncio.sleep(self._latency())
        epoch = self.epoch
        self._touched = set()
        try:
            result = run(self.sync)
        finally:
            self._copied()
        for listener in self.listeners:
            listener(name, args, result)
        await asyncio.sleep(self._latency())
        if self.epoch != epoch:
            raise RedisConnectionError("Connection closed by server.")
        return result

    def client(self) -> SimRedisClient:
        return SimRedisClient(self)


def script_names() -> dict[str, str]:
    """Each of the stores' scripts, by its text's SHA1 (what a listener is told)."""
    from shared.stores.fence import sync_record
    from shared.stores.hot import hot_store, wake
    from shared.stores.ledger import stream

    found = {}
    for module in (sync_record, hot_store, wake, stream):
        for value in vars(module).values():
            if isinstance(value, Script):
                found[hashlib.sha1(value.body().encode()).hexdigest()] = value.name
    return found


class SimScript:
    """A registered script (redis-py's ``AsyncScript``): run by its text."""

    def __init__(self, body: str) -> None:
        self.script = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()

    async def __call__(
        self, keys: list[str] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        assert client is not None
        return await client.run_script(self, list(keys or []), list(args or []))


class SimRedisClient:
    """redis-py's asyncio client, as far as the stores use it."""

    def __init__(self, redis: SimRedis) -> None:
        self._redis = redis

    def register_script(self, body: str) -> SimScript:
        return SimScript(body)

    async def run_script(self, script: SimScript, keys: list[str], args: list[Any]) -> Any:
        def run(sync: fakeredis.FakeRedis) -> Any:
            try:
                return sync.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                sync.script_load(script.script)
                return sync.evalsha(script.sha, len(keys), *keys, *args)

        name = self._redis.names.get(script.sha, script.sha)
        return await self._redis.call(f"script:{name}", run, (keys, args))

    def pipeline(self, transaction: bool = True) -> SimPipeline:
        return SimPipeline(self._redis, transaction)

    async def xreadgroup(self, *args: Any, block: int | None = None, **kwargs: Any) -> Any:
        return await self._blocking("xreadgroup", block, args, kwargs)

    async def xread(self, *args: Any, block: int | None = None, **kwargs: Any) -> Any:
        return await self._blocking("xread", block, args, kwargs)

    async def _blocking(
        self, name: str, block: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A stream read with BLOCK: read; if nothing, read again once the block's time
        passed (on the virtual clock; an entry added meanwhile is found then, a little
        later than a real server would deliver it)."""
        found = await self._redis.call(
            name, lambda sync: getattr(sync, name)(*args, **kwargs), args
        )
        if found or not block:
            return found
        await asyncio.sleep(block / 1000)
        return await self._redis.call(name, lambda sync: getattr(sync, name)(*args, **kwargs), args)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def command(*args: Any, **kwargs: Any) -> Any:
            return await self._redis.call(
                name, lambda sync: getattr(sync, name)(*args, **kwargs), args
            )

        return command

    async def aclose(self) -> None:
        return None

    async def close(self) -> None:
        return None


class SimPipeline:
    """A pipeline: its commands queued, sent in one round trip (MULTI/EXEC when
    ``transaction``)."""

    def __init__(self, redis: SimRedis, transaction: bool) -> None:
        self._redis = redis
        self._transaction = transaction
        self._queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    async def __aenter__(self) -> SimPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._queued.clear()

    def __getattr__(self, name: str) -> Callable[..., SimPipeline]:
        def queue(*args: Any, **kwargs: Any) -> SimPipeline:
            self._queued.append((name, args, kwargs))
            return self

        return queue

    async def execute(self) -> list[Any]:
        queued = list(self._queued)

        def run(sync: fakeredis.FakeRedis) -> list[Any]:
            pipe = sync.pipeline(transaction=self._transaction)
            for name, args, kwargs in queued:
                getattr(pipe, name)(*args, **kwargs)
            return list(pipe.execute())

        self._queued.clear()
        done: list[Any] = await self._redis.call("pipeline", run, tuple(queued))
        return done


class SimRedisEndpoint:
    """``RedisEndpoint`` for the stores: the client of whichever server is primary."""

    def __init__(self, redis: SimRedis) -> None:
        self._redis = redis
        self._client = redis.client()
        self.named = False

    async def client(self) -> SimRedisClient:
        return self._client

    def invalidate(self) -> None:
        return None

    async def close(self) -> None:
        return None


def endpoint(redis: SimRedis) -> RedisEndpoint:
    """The runtime's Redis endpoint on this Redis (``SimRedisEndpoint`` offers what the
    stores use of it)."""
    return cast(RedisEndpoint, SimRedisEndpoint(redis))
