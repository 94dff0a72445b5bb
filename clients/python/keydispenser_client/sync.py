"""The thread-safe client: background threads fetch batches; ``take`` pops a local buffer.

A key is handed to exactly one caller: the buffer is a ``collections.deque`` and
``popleft`` is atomic. Keys still buffered when the process exits are lost, never
reissued (the dispenser already counts them as issued).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
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
JOIN_DEADLINE_S = 5.0
IDLE_CHECK_S = 1.0  # how often an idle fetcher looks at the stop flag (close also wakes it)


class KeyClient:
    """Keys of one ID type from a keydispenser, buffered locally.

    ``api_key`` or ``auth`` (an OIDC token: ``BearerToken``, ``ClientCredentials``)
    authenticate when the dispenser asks for it. ``sleep`` replaces the waits between
    retries (tests); by default they end early when the client is closed.
    ``transport`` is passed to ``httpx.Client``.
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
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.id_type = id_type
        self._buffering = buffering or Buffering()
        self._low, self._high = self._buffering.mark_low, self._buffering.mark_high
        self._idempotent = idempotent
        self._buffer: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._filling = True  # prefetch at once
        self._failure: ClientError | None = None
        self._cause = ""  # the last transient failure, for KeysUnavailable
        self._sleep = sleep or self._stop.wait
        self._http = httpx.Client(
            transport=transport, **http.options(base_url, api_key, auth, timeout_s, self._buffering)
        )
        self._fetch_url = http.fetch_url(self._http, id_type, self._buffering)
        self._threads = [
            threading.Thread(target=self._run, name=f"keyclient-{id_type}-{i}", daemon=True)
            for i in range(self._buffering.fetchers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        """Keys buffered locally right now."""
        return len(self._buffer)

    def take(self, timeout_s: float = DEFAULT_TAKE_TIMEOUT_S) -> str:
        """One key, to this caller only. Raises KeyspaceExhausted once the type is used
        up and the buffer drained, RequestRefused on an answer retrying cannot change,
        KeysUnavailable when no key arrived within ``timeout_s``."""
        try:
            key = self._buffer.popleft()
        except IndexError:
            return self._take_waiting(timeout_s)
        if not self._filling and len(self._buffer) < self._low:
            self._want()
        return key

    def take_many(self, count: int, timeout_s: float = DEFAULT_TAKE_TIMEOUT_S) -> list[str]:
        return [self.take(timeout_s) for _ in range(count)]

    def mark_used(self, keys: Iterable[str], timeout_s: float = DEFAULT_TAKE_TIMEOUT_S) -> int:
        """Report keys as used, in batches (``POST /v1/keys/{type}/used``); returns how
        many were accepted. A type without a ledger answers RequestRefused (409)."""
        accepted = 0
        deadline = time.monotonic() + timeout_s
        for chunk in protocol.chunks(list(keys), self._buffering.batch):
            self._mark_chunk(chunk, deadline)
            accepted += len(chunk)
        return accepted

    def close(self) -> None:
        """Stop fetching; buffered keys are dropped (lost, never reissued)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(JOIN_DEADLINE_S)
        self._http.close()

    def __enter__(self) -> KeyClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _want(self) -> None:
        with self._cond:
            self._filling = True
            self._cond.notify_all()

    def _take_waiting(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._buffer:
                    key = self._buffer.popleft()
                    if len(self._buffer) < self._low:
                        self._filling = True
                        self._cond.notify_all()
                    return key
                self._raise_if_done()
                self._filling = True
                self._cond.notify_all()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KeysUnavailable(f"no {self.id_type} key within {timeout_s}s", self._cause)
                self._cond.wait(left)

    def _raise_if_done(self) -> None:
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        if self._stop.is_set():
            raise ClientError("the client is closed")

    def _run(self) -> None:
        try:
            self._fetch_while_wanted()
        except Exception as exc:  # a bug must not leave takers waiting for nothing
            self._fail(ClientError(f"the fetcher stopped: {type(exc).__name__}: {exc}"))

    def _fetch_while_wanted(self) -> None:
        while self._await_demand():
            keys = self._fetch_batch()
            if keys is None:
                return
            self._buffer.extend(keys)
            with self._cond:
                if len(self._buffer) >= self._high:
                    self._filling = False
                self._cond.notify_all()

    def _await_demand(self) -> bool:
        with self._cond:
            while not self._stop.is_set() and not self._filling:
                self._cond.wait(IDLE_CHECK_S)
        return not self._stop.is_set()

    def _shrink(self, limit: int) -> None:
        """Lower the batch to ``limit`` keys (the API key's burst), with a warning; a
        no-op once it is there (another fetcher was told first)."""
        with self._cond:  # fetcher threads may all be told at once
            self._lower_batch(limit)

    def _lower_batch(self, limit: int) -> None:
        smaller = protocol.shrunk(self._buffering, limit)
        if smaller is None:
            return
        log.warning(protocol.shrink_message(self.id_type, self._buffering.batch, limit))
        self._buffering = smaller
        self._low, self._high = smaller.mark_low, smaller.mark_high
        self._fetch_url = http.fetch_url(self._http, self.id_type, smaller)

    def _fetch_batch(self) -> list[str] | None:
        """One batch; retried with the same Idempotency-Key until it is answered."""
        request_headers = {"Idempotency-Key": protocol.new_idempotency_key()}
        if not self._idempotent:
            request_headers = {}
        # A retry repeats its request: the same count, whatever another fetcher changed.
        url, asked = self._fetch_url, self._buffering.batch
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                reply = self._http.post(url, headers=request_headers)
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
                self._fail(_refused(outcome))
                return None
            self._cause = outcome.reason
            self._sleep(outcome.seconds)
        return None

    def _fail(self, error: ClientError) -> None:
        with self._cond:
            self._failure = error
            self._cond.notify_all()

    def _mark_chunk(self, chunk: list[str], deadline: float) -> None:
        backoff = Backoff()
        body = protocol.used_body(chunk)
        path = protocol.used_path(self.id_type)
        json_type = {"Content-Type": "application/json"}
        while True:
            try:
                reply = self._http.post(path, content=body, headers=json_type)
                outcome = protocol.marked(reply.status_code, reply.headers, reply.content, backoff)
            except httpx.TransportError as exc:
                outcome = protocol.unreachable(exc, backoff)
            if isinstance(outcome, Keys):
                return
            if isinstance(outcome, Stop):
                raise outcome.error
            if time.monotonic() + outcome.seconds > deadline:
                raise KeysUnavailable("mark-used was not accepted in time", outcome.reason)
            self._sleep(outcome.seconds)
