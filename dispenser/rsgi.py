"""The dispenser on granian's native interface (RSGI), its ASGI app underneath.

granian calls an RSGI app with a scope object and a protocol object, without building
ASGI's message dicts or awaiting a ``send`` per message: on the hot path that work is
most of a request's cost (a bare route answers about 3x faster over RSGI than over
ASGI on the same server). ``FastPath`` answers ``POST /v1/idgenerator/{type}/id``
over RSGI directly; every other request goes to the Starlette app through
``serve_asgi``, which speaks ASGI to it over the RSGI protocol:

- the request body arrives as ``http.request`` messages, one per chunk the server
  received (never buffered whole); after the last one, ``receive`` waits for the
  client to hang up (RSGI's ``client_disconnect``) and reports ``http.disconnect``;
- a response sent in one body message goes out whole (``response_bytes``), one sent
  in several is streamed (``response_stream``);
- an app that fails before it answered gets an empty 500, as uvicorn gives.

``Lifespan`` runs the Starlette app's lifespan in each worker, from the
``__rsgi_init__``/``__rsgi_del__`` hooks, so start-up and shutdown are the same on
both servers. Only granian's public ``granian.rsgi`` module is imported.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from granian.rsgi import Scope
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message

__all__ = ["HTTPProtocol", "Lifespan", "Scope", "asgi_headers", "asgi_scope", "serve_asgi"]
log = logging.getLogger(__name__)


class StreamTransport(Protocol):
    async def send_bytes(self, data: bytes) -> None: ...


class HTTPProtocol(Protocol):
    """What this app uses of granian's RSGI HTTP protocol object (``RSGIHTTPProtocol``,
    which granian.rsgi exports untyped); tests/unit/test_rsgi.py checks granian's has it."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...
    async def client_disconnect(self) -> None: ...
    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None: ...
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...
    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> StreamTransport: ...


ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}
_BODY_DONE: Message = {"type": "http.request", "body": b"", "more_body": False}


class Lifespan:
    """A Starlette app's lifespan, run on the loop granian hands the RSGI hooks."""

    def __init__(self, app: Starlette) -> None:
        self._app = app
        self._context: AbstractAsyncContextManager[Any] | None = None
        # What an ASGI server would pass its requests as scope["state"]: the app's
        # lifespan keeps its state on app.state and yields none.
        self.state: dict[str, Any] = {}

    def startup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Runs the app's start-up; a failed start-up ends the worker, as on ASGI."""
        self._context = self._app.router.lifespan_context(self._app)
        try:
            loop.run_until_complete(self._context.__aenter__())
        except Exception:
            self._context = None
            log.exception("lifespan_startup_failed")
            sys.exit(1)

    def shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            loop.run_until_complete(context.__aexit__(None, None, None))


def _latin1(text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # the server decoded bytes outside latin-1 as UTF-8
        return text.encode()


def _address(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def asgi_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """ASGI's header list (lower-case names, repeats kept) of an RSGI scope."""
    return [(_latin1(name), _latin1(value)) for name, value in scope.headers.items()]


def asgi_scope(scope: Scope, state: dict[str, Any]) -> dict[str, Any]:
    """The ASGI HTTP scope of an RSGI one (``path`` is percent-decoded in both)."""
    return {
        "type": "http",
        "asgi": ASGI_VERSION,
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        "query_string": _latin1(scope.query_string),
        "root_path": "",
        "headers": asgi_headers(scope),
        "client": _address(scope.client),
        "server": _address(scope.server),
        "state": state.copy(),
    }


class _Exchange:
    """One request's ASGI ``receive`` and ``send`` over its RSGI protocol."""

    def __init__(self, protocol: HTTPProtocol) -> None:
        self._protocol = protocol
        self._chunks = protocol.__aiter__()
        self._body_done = False
        self._status = 0
        self._headers: list[tuple[str, str]] = []
        self._stream: Any = None
        self.answered = False

    async def receive(self) -> Message:
        if self._body_done:
            await self._protocol.client_disconnect()
            return {"type": "http.disconnect"}
        try:
            chunk: bytes = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._body_done = True
            return _BODY_DONE
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._status = message["status"]
            self._headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", ())
            ]
        elif kind == "http.response.body":
            await self._body(message.get("body", b""), message.get("more_body", False))

    async def _body(self, body: bytes, more: bool) -> None:
        if self._stream is None and not more:
            self._protocol.response_bytes(self._status, self._headers, body)
            self.answered = True
            return
        if self._stream is None:
            self._stream = self._protocol.response_stream(self._status, self._headers)
            self.answered = True
        if body:
            await self._stream.send_bytes(body)


async def serve_asgi(
    app: ASGIApp, scope: Scope, protocol: HTTPProtocol, state: dict[str, Any]
) -> None:
    """Serves one RSGI HTTP request with an ASGI app."""
    exchange = _Exchange(protocol)
    try:
        await app(asgi_scope(scope, state), exchange.receive, exchange.send)
    except Exception:
        log.exception("request_crashed", extra={"path": scope.path})
        if not exchange.answered:
            protocol.response_empty(500, [])
        return
    if not exchange.answered:
        log.error("request_unanswered", extra={"path": scope.path})
        protocol.response_empty(500, [])
