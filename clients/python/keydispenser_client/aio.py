"""The asyncio client: background tasks fetch batches; ``take`` pops a local buffer.

A key is handed to exactly one task: between the check of the buffer and its
``popleft`` there is no ``await``. Keys still buffered when the process exits are lost,
never reissued (the dispenser already counts them as issued).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType

import httpx

from keydispenser_client import http, protocol
from keydispenser_client.protocol import (
    Backoff,
    Buffering,
    ClientError,
    Keys,
    KeysUnavailable,
    Shrink,
    Stop,
)
from keydispenser_client.protocol import refused as _refused

log = logging.getLogger("keydispenser_client")

DEFAULT_TAKE_TIMEOUT_S = 30.0


class AsyncKeyClient:
    """Keys of one ID type from a keydispenser, buffered locally; use ``async with``.

    ``api_key`` or ``auth`` authenticate, as for ``KeyClient``. ``sleep`` replaces the
    waits between retries (tests). ``transport`` is passed to ``httpx.AsyncClient``.
    """

    def __init__(
        self,
        base_url: str,
        id_type: str,
        *,
        api_key: str | None = None,
        auth: httpx.Auth | None = None,
        buffering: Buffering | None = None,
        timeout_s: float = 10.0,
        idempotent: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.id_type = id_type
        self._buffering = buffering or Buffering()
        self._low, self._high = self._buffering.mark_low, self._buffering.mark_high
        self._idempotent = idempotent
        self._buffer: collections.deque[str] = collections.deque()
        self._filling = True  # prefetch at once
        self._wanted = asyncio.Event()
        self._wanted.set()
        self._arrived = asyncio.Event()  # replaced after each arrival: a broadcast
        self._failure: ClientError | None = None
        self._closed = False
        self._cause = ""
        self._sleep = sleep or asyncio.sleep
        self._http = httpx.AsyncClient(
            transport=transport, **http.options(base_url, api_key, auth, timeout_s, self._buffering)
        )
        self._fetch_url = http.fetch_url(self._http, id_type, self._buffering)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> AsyncKeyClient:
        self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the background fetchers (``async with`` does it)."""
        if not self._tasks:
            self._tasks = [
                asyncio.get_running_loop().create_task(self._run())
                for _ in range(self._buffering.fetchers)
            ]

    @property
    def depth(self) -> int:
        """Keys buffered locally right now."""
        return len(self._buffer)

    async def take(self, timeout_s: float = DEFAULT_TAKE_TIMEOUT_S) -> str:
        """One key, to this task only; errors as ``KeyClient.take``."""
        if self._buffer:
            key = self._buffer.popleft()
            if not self._filling and len(self._buffer) < self._low:
                self._want()
            return key
        return await self._take_waiting(timeout_s)

    def take_nowait(self) -> str | None:
        """One buffered key, to this task only, without awaiting; None when none is
        buffered right now (the take that emptied the buffer asked for a refill).
        ``client.take_nowait() or await client.take()`` pays for a coroutine only when
        the buffer is empty; ``take`` waits for a key and raises the errors."""
        buffer = self._buffer
        if buffer:
            key = buffer.popleft()
            if not self._filling and len(buffer) < self._low:
                self._want()
            return key
        return None

    async def take_many(self, count: int, timeout_s: float = DEFAULT_TAKE_TIMEOUT_S) -> list[str]:
        return [await self.take(timeout_s) for _ in range(count)]

    async def mark_used(
        self, keys: Iterable[str], timeout_s: float = DEFAULT_TAKE_TIMEOUT_S
    ) -> int:
        """Report keys as used, in batches; returns how many were accepted."""
        accepted = 0
        deadline = time.monotonic() + timeout_s
        for chunk in protocol.chunks(list(keys), self._buffering.batch):
            await self._mark_chunk(chunk, deadline)
            accepted += len(chunk)
        return accepted

    async def aclose(self) -> None:
        """Stop fetching; buffered keys are dropped (lost, never reissued)."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        try:
            if self._tasks:  # asyncio.wait passes on a cancellation of the caller
                await asyncio.wait(self._tasks)
        finally:
            self._broadcast()
            await self._http.aclose()

    def _want(self) -> None:
        self._filling = True
        self._wanted.set()

    def _broadcast(self) -> None:
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    async def _take_waiting(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._buffer:
                key = self._buffer.popleft()
                if len(self._buffer) < self._low:
                    self._want()
                return key
            if self._failure is not None:
                raise self._failure.with_traceback(None)
            if self._closed:
                raise ClientError("the client is closed")
            if not self._tasks:
                raise ClientError("the client is not started: use `async with` or start()")
            self._want()
            left = deadline - time.monotonic()
            if left <= 0:
                raise KeysUnavailable(f"no {self.id_type} key within {timeout_s}s", self._cause)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def _run(self) -> None:
        try:
            await self._fetch_while_wanted()
        except Exception as exc:  # a bug must not leave takers waiting for nothing
            self._failure = ClientError(f"the fetcher stopped: {type(exc).__name__}: {exc}")
            self._broadcast()

    async def _fetch_while_wanted(self) -> None:
        while True:
            await self._wanted.wait()
            keys = await self._fetch_batch()
            if keys is None:
                return
            self._buffer.extend(keys)
            if len(self._buffer) >= self._high:
                self._filling = False
                self._wanted.clear()
            self._broadcast()

    def _shrink(self, limit: int) -> None:
        """Lower the batch to ``limit`` keys (the API key's burst), with a warning; a
        no-op once it is there (another fetcher was told first)."""
        smaller = protocol.shrunk(self._buffering, limit)
        if smaller is None:
            return
        log.warning(protocol.shrink_message(self.id_type, self._buffering.batch, limit))
        self._buffering = smaller
        self._low, self._high = smaller.mark_low, smaller.mark_high
        self._fetch_url = http.fetch_url(self._http, self.id_type, smaller)

    async def _fetch_batch(self) -> list[str] | None:
        """One batch; retried with the same Idempotency-Key until it is answered."""
        request_headers = {"Idempotency-Key": protocol.new_idempotency_key()}
        if not self._idempotent:
            request_headers = {}
        # A retry repeats its request: the same count, whatever another fetcher changed.
        url, asked = self._fetch_url, self._buffering.batch
        backoff = Backoff()
        while True:
            try:
                reply = await self._http.post(url, headers=request_headers)
                outcome = protocol.fetched(reply.status_code, reply.headers, reply.content, backoff)
            except httpx.TransportError as exc:
                outcome = protocol.unreachable(exc, backoff)
            if isinstance(outcome, Keys):
                return outcome.keys
            if isinstance(outcome, Shrink) and asked > outcome.limit:
                self._shrink(outcome.limit)
                request_headers = protocol.fresh(request_headers)  # a new request: new count
                url, asked = self._fetch_url, self._buffering.batch
                continue
            if isinstance(outcome, Stop | Shrink):
                self._failure = _refused(outcome)
                self._broadcast()
                return None
            self._cause = outcome.reason
            await self._sleep(outcome.seconds)

    async def _mark_chunk(self, chunk: list[str], deadline: float) -> None:
        backoff = Backoff()
        body = protocol.used_body(chunk)
        path = protocol.used_path(self.id_type)
        json_type = {"Content-Type": "application/json"}
        while True:
            try:
                reply = await self._http.post(path, content=body, headers=json_type)
                outcome = protocol.marked(reply.status_code, reply.headers, reply.content, backoff)
            except httpx.TransportError as exc:
                outcome = protocol.unreachable(exc, backoff)
            if isinstance(outcome, Keys):
                return
            if isinstance(outcome, Stop):
                raise outcome.error
            if time.monotonic() + outcome.seconds > deadline:
                raise KeysUnavailable("mark-used was not accepted in time", outcome.reason)
            await self._sleep(outcome.seconds)
