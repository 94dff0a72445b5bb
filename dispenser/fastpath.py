"""The hot path: ``POST /v1/idgenerator/{id_type}/id`` answered before Starlette's stack.

The route OpenG2P clients call once per ID is the one that must run at the HTTP
ceiling, so ``FastPath`` wraps the Starlette app and answers it without the middleware
stack, the router or Request/Response objects. What it does not serve itself (an
unknown or malformed type, an Idempotency-Key, another method, a request before
start-up has built the service) goes on to the Starlette app, whose route and error
handlers answer through the same functions: ``one_id``, ``refusal`` and ``crashed``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Final

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from dispenser import envelope
from dispenser.auth import Gate
from dispenser.metrics import DispenserMetrics
from dispenser.rsgi import HTTPProtocol, Lifespan, asgi_headers, asgi_scope, serve_asgi
from dispenser.rsgi import Scope as RsgiScope
from dispenser.service import Dispenser
from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import KeydispenserError
from shared.domain.settings import ALIAS

log = logging.getLogger(__name__)
ALLOCATE_ONE: Final = "/v1/idgenerator/{id_type}/id"
_JSON_HEADERS: Final = (b"content-type", b"application/json")
_RSGI_JSON_HEADERS: Final = [("content-type", "application/json")]


def path_pattern(template: str, name: re.Pattern[str]) -> re.Pattern[str]:
    """The paths ``template`` stands for, its ``{id_type}`` a group ``name`` matches.

    Anchored with \\A and \\Z: a $ would also let a path through with a newline after it.
    """
    placeholder = re.escape("{id_type}")
    escaped = re.escape(template)
    if escaped.count(placeholder) != 1:
        raise ValueError(f"route template {template!r} must hold {{id_type}} once")
    group = f"(?P<name>{_unanchored(name)})"
    return re.compile(r"\A" + escaped.replace(placeholder, group) + r"\Z")


def _unanchored(pattern: re.Pattern[str]) -> str:
    """The body of a ^...$ pattern (ID_TYPE_NAME is anchored: it is also an OpenAPI pattern)."""
    text = pattern.pattern
    if not (text.startswith("^") and text.endswith("$")):
        raise ValueError(f"expected a pattern anchored with ^ and $, got {text!r}")
    return text[1:-1]


# ALIAS admits every type name too; only configured names and aliases are served here.
ALLOCATE_ONE_PATH: Final = path_pattern(ALLOCATE_ONE, ALIAS)


async def one_id(dispenser: Dispenser, name: str, client: str) -> bytes:
    """The body answering a request for one ID, on the fast path and the route alike."""
    return envelope.ok_id(await dispenser.take_one(name, client))


def refusal(exc: KeydispenserError, scope: Scope, metrics: DispenserMetrics) -> JSONResponse:
    """A domain error's envelope with a request id, counted by errorCode; server-side
    failures are logged with their full detail and the same request id."""
    status, code = envelope.classify(exc)
    request = envelope.request_id(scope["headers"])
    if status >= 500 and code != "IDG-001":
        log.warning(
            "request_failed",
            extra={"path": scope["path"], "error": str(exc), "request_id": request},
        )
    metrics.errors.labels(code).inc()
    return envelope.from_domain(exc, request)


def crashed(scope: Scope) -> JSONResponse:
    """The answer to an unexpected exception, logged once with its traceback and the
    request id the answer carries: call it in ``except``."""
    request = envelope.request_id(scope["headers"])
    log.exception("request_crashed", extra={"path": scope["path"], "request_id": request})
    return envelope.error(
        500,
        envelope.INTERNAL_ERROR,
        envelope.PUBLIC_MESSAGES[envelope.INTERNAL_ERROR],
        None,
        request,
    )


class FastPath:
    """Serves ALLOCATE_ONE itself and hands everything else to ``app``: an ASGI app
    (uvicorn) and an RSGI app (granian) at once."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self._lifespan = Lifespan(app)
        self._dispenser: Dispenser | None = None
        # Paths answered here, each with its service and type name: a path's route is
        # worked out once. Only configured types' paths get in, so it stays small.
        self._routes: dict[str, tuple[Dispenser, str]] = {}

    def serve(self, dispenser: Dispenser | None) -> None:
        """Answer with ``dispenser`` from now on (None: hand every request to the app,
        whose routes answer while no service is up)."""
        self._dispenser = dispenser
        self._routes = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        served = self._served(scope)
        if served is None:
            await self.app(scope, receive, send)
        else:
            await _allocate_one(*served, scope, receive, send)

    async def __rsgi__(self, scope: RsgiScope, protocol: HTTPProtocol) -> None:
        served = None
        if scope.method == "POST" and "idempotency-key" not in scope.headers:
            served = self._route(scope.path)
        if served is None:
            await serve_asgi(self.app, scope, protocol, self._lifespan.state)
        else:
            await _allocate_one_rsgi(*served, scope, protocol, self._lifespan.state)

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lifespan.startup(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lifespan.shutdown(loop)

    def _served(self, scope: Scope) -> tuple[Dispenser, str] | None:
        """The service and the type name when this request is one to answer here."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        if any(header == b"idempotency-key" for header, _ in scope["headers"]):
            return None  # the route validates the key and marks replays
        return self._route(scope["path"])

    def _route(self, path: str) -> tuple[Dispenser, str] | None:
        served = self._routes.get(path)
        if served is not None:
            return served
        dispenser = self._dispenser
        match = ALLOCATE_ONE_PATH.fullmatch(path)
        if match is None or dispenser is None:
            return None
        name = dispenser.segments.get(match["name"])
        if name is None:
            return None  # the route gives the envelope for a malformed or unknown type
        served = self._routes[path] = (dispenser, name)
        return served


async def _allocate_one(
    dispenser: Dispenser, name: str, scope: Scope, receive: Receive, send: Send
) -> None:
    started = time.perf_counter()
    try:
        body = await one_id(dispenser, name, _client(dispenser.gate, scope, name))
    except KeydispenserError as exc:
        await refusal(exc, scope, dispenser.metrics)(scope, receive, send)
    except Exception:
        await crashed(scope)(scope, receive, send)
    else:
        await _send_json(send, body)
    dispenser.metrics.observe_latency(ALLOCATE_ONE, started)


async def _allocate_one_rsgi(
    dispenser: Dispenser,
    name: str,
    scope: RsgiScope,
    protocol: HTTPProtocol,
    state: dict[str, object],
) -> None:
    started = time.perf_counter()
    try:
        client = ANONYMOUS
        if dispenser.gate.enabled:
            client = dispenser.gate.admit(Headers(raw=asgi_headers(scope)), name)
        body = await one_id(dispenser, name, client)
    except KeydispenserError as exc:
        _respond(protocol, refusal(exc, asgi_scope(scope, state), dispenser.metrics))
    except Exception:
        _respond(protocol, crashed(asgi_scope(scope, state)))
    else:
        protocol.response_bytes(200, _RSGI_JSON_HEADERS, body)
    dispenser.metrics.observe_latency(ALLOCATE_ONE, started)


def _respond(protocol: HTTPProtocol, response: Response) -> None:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
    protocol.response_bytes(response.status_code, headers, bytes(response.body))


def _client(gate: Gate, scope: Scope, name: str) -> str:
    # Headers are parsed only when there are API keys to check.
    return gate.admit(Headers(scope=scope), name) if gate.enabled else ANONYMOUS


async def _send_json(send: Send, body: bytes) -> None:
    headers = [_JSON_HEADERS, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
