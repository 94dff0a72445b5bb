"""A script called thousands of times a second, on a connection of its own.

The dispenser's pop is one ``EVALSHA`` per batch of waiting requests. Measured on
its own, redis-py's per-command layers cost more CPU than the round trip: checking a
connection out of the pool and back in (a lock and observability hooks each way), the
retry wrapper, and packing every argument, the key names included, on every call.
``ScriptLine`` calls the script on a connection of its own instead, with redis-py's
``Connection`` (its timeouts, parser and error replies unchanged), and packs the fixed
part of a command (the SHA, the key count and the key names) once per key list: only
the arguments are packed per call. See docs/benchmarks.md for the figures.

A line is for a caller that has one call in flight at a time (a dispenser pool's coalesced pop
pops a type once at a time); a lock keeps it so for any other. What the pooled call
guaranteed still holds:
- one command at a time on the connection, and a command whose reply was
  not read whole (cancelled, timed out, the connection lost) leaves the connection
  closed, so no later call can read a reply that was not its own;
- the line follows the endpoint: when ``RedisEndpoint.client()`` hands out a new
  client (a new primary), the old connection is closed and the next command goes to
  the new one;
- a server that lost its scripts (``NOSCRIPT``: a restart, a promoted replica) gets
  the script loaded and the command sent once more; ``NOSCRIPT`` means it did not run.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Key lists whose packed head is kept (one per type and script in practice).
MAX_HEADS: Final = 1_024


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


@dataclass(frozen=True)
class LineScript:
    """A script's text and its SHA1 (what ``EVALSHA`` names it by)."""

    body: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.body.encode()).hexdigest())


class ScriptLine:
    def __init__(self) -> None:
        self._client: aioredis.Redis | None = None
        self._connection: AbstractConnection | None = None
        self._timeout: float | None = None  # the client's socket_timeout, for a whole call
        self._lock = asyncio.Lock()
        self._closed = False
        self._heads: dict[tuple[str, tuple[str, ...]], bytes] = {}

    async def run(
        self,
        client_of: Callable[[], Awaitable[aioredis.Redis]],
        script: LineScript,
        keys: Sequence[str],
        args: Sequence[Any],
    ) -> Any:
        """``EVALSHA`` of ``script`` on the server the client ``client_of()`` gives
        points at, asked once this call has the line (an earlier call may have waited
        there while the endpoint moved to another primary)."""
        async with self._lock:
            if self._closed:
                raise RedisConnectionError("this script line is closed")
            client = await client_of()
            connection = await self._follow(client)
            command = self.command(connection, script.sha, keys, args)
            try:
                return await _call(connection, command, self._timeout)
            except NoScriptError:
                await client.script_load(script.body)
                return await _call(connection, command, self._timeout)

    def command(
        self, connection: AbstractConnection, sha: str, keys: Sequence[str], args: Sequence[Any]
    ) -> bytes:
        """The packed ``EVALSHA sha len(keys) *keys *args``, its head packed once."""
        index = (sha, tuple(keys))
        head = self._heads.get(index)
        if head is None:
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            # The library packs the head: its encoding rules, done once.
            whole = b"".join(connection.pack_command("EVALSHA", sha, len(keys), *keys))
            head = self._heads[index] = whole[whole.index(b"\r\n") + 2 :]
        encode = connection.encoder.encode
        tail = [bulk(encode(arg)) for arg in args]  # type: ignore[no-untyped-call]
        return b"".join((b"*%d\r\n" % (3 + len(keys) + len(args)), head, *tail))

    async def close(self) -> None:
        """Closes the connection; a call waiting for the line, or any later, fails."""
        self._closed = True
        async with self._lock:
            await self._drop()

    async def _follow(self, client: aioredis.Redis) -> AbstractConnection:
        """This line's connection to ``client``'s server, a new one if the client changed."""
        if client is not self._client or self._connection is None:
            await self._drop()
            # The client's own settings (address, database, credentials, TLS); the
            # connection is never in the client's pool. Its socket timeout bounds the
            # whole call here instead: redis-py would run each send in a task of its own.
            pool = client.connection_pool
            options = pool.connection_kwargs
            self._timeout = options.get("socket_timeout")
            self._connection = pool.connection_class(**{**options, "socket_timeout": None})
            self._client = client
        return self._connection

    async def _drop(self) -> None:
        connection, self._connection, self._client = self._connection, None, None
        if connection is not None:
            await connection.disconnect(nowait=True)


async def _call(connection: AbstractConnection, command: bytes, limit_s: float | None) -> Any:
    try:
        async with asyncio.timeout(limit_s):
            # Connects first when not connected (redis-py's handshake: auth, database).
            await connection.send_packed_command(command, check_health=False)
            return await connection.read_response()
    except ResponseError:
        raise  # an error reply, read whole: the connection is still in step
    except BaseException as exc:
        # redis-py closes it too on every such error; this line does not rely on that.
        await connection.disconnect(nowait=True)
        if isinstance(exc, TimeoutError):
            raise RedisTimeoutError(f"no reply from Redis within {limit_s} s") from None
        raise
