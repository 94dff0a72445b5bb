"""The app the servers run: "one ID" answered before Starlette's stack, the rest by it.

The route OpenG2P clients call once per ID is the one that must run at the HTTP
ceiling, so ``FastPath`` wraps the Starlette app and carries ``dispenser.single``'s
answer for ``POST /v1/idgenerator/{id_type}/id`` itself, without the middleware
stack, the router or Request/Response objects: over RSGI (granian) and over ASGI
(uvicorn), a few lines each. Every other request, and every request before start-up
has built the service, goes on to the Starlette app.
"""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from dispenser.rsgi import HTTPProtocol, Lifespan, serve_asgi
from dispenser.rsgi import Scope as RsgiScope
from dispenser.single import ALLOCATE_ONE_PATH, AtHand, SingleId

# Paths remembered with their type segment; more well-formed paths than this (a client
# trying names) are matched each time instead, so the table stays small.
MAX_REMEMBERED: Final = 1_024


class Serving:
    """What answers "one ID" now: the service's ``SingleId`` once start-up has built it
    (None before and after), and each path's answer at hand under it. The app's lifespan
    sets it and the fast path reads it, so it is built before either."""

    def __init__(self) -> None:
        self.single: SingleId | None = None
        # path -> its answer at hand (SingleId), None where none ever is
        self.at_hand: dict[str, AtHand | None] = {}

    def serve(self, single: SingleId | None) -> None:
        """Answer with ``single`` from now on (None: hand every request to the app,
        whose routes answer while no service is up); no answer outlives its service."""
        self.single = single
        self.at_hand.clear()


class FastPath:
    """Serves "one ID" itself and hands everything else to ``app``: an ASGI app
    (uvicorn) and an RSGI app (granian) at once."""

    def __init__(self, app: Starlette, serving: Serving | None = None) -> None:
        self.app = app
        self.serving = Serving() if serving is None else serving
        self._lifespan = Lifespan(app)
        self._segments: dict[str, str] = {}  # path -> its type segment
        self._at_hand = self.serving.at_hand  # the same dict: read first on every request

    def serve(self, single: SingleId | None) -> None:
        """Answer with ``single`` from now on (``Serving.serve``)."""
        self.serving.serve(single)

    async def __rsgi__(self, scope: RsgiScope, protocol: HTTPProtocol) -> None:
        # A key at hand: answered in the fewest steps (every step here is paid on each
        # request, with the GIL held).
        at_hand = self._at_hand.get(scope.path)
        if at_hand is not None and scope.method == "POST":
            answer = at_hand(scope.headers)
            if answer is not None:
                protocol.response_bytes(*answer)
                return
        single, path = self.serving.single, scope.path
        segment = self._segment(scope.method, path)
        if single is None or segment is None:
            await serve_asgi(self.app, scope, protocol, self._lifespan.state)
            return
        if path not in self._at_hand and len(self._at_hand) < MAX_REMEMBERED:
            self._at_hand[path] = single.at_hand_of(segment)  # None: never at hand
        status, headers, body = await single.answer(segment, scope.headers)
        protocol.response_bytes(status, headers, body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        single = self.serving.single
        segment = self._segment(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if single is None or segment is None:
            await self.app(scope, receive, send)
            return
        status, headers, body = await single.answer(segment, Headers(scope=scope))
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        raw.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lifespan.startup(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lifespan.shutdown(loop)

    def _segment(self, method: str, path: str) -> str | None:
        """The type segment when this is a request for one ID."""
        if method != "POST":
            return None
        segment = self._segments.get(path)
        if segment is None:
            match = ALLOCATE_ONE_PATH.fullmatch(path)
            if match is None:
                return None  # the router answers it (404, or another route)
            segment = match["name"]
            if len(self._segments) < MAX_REMEMBERED:
                self._segments[path] = segment
        return segment
