"""The dispenser's HTTP API: OpenG2P-compatible routes plus native batch routes."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from dispenser import envelope
from shared.errors import (
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    PoolEmpty,
    UnknownIdType,
)
from shared.hot_store import HotStore, Popped
from shared.idtypes import IdType, build_id_types
from shared.metrics import DispenserMetrics
from shared.settings import ID_TYPE_NAME, Settings

log = logging.getLogger(__name__)


class Dispenser:
    """Pops keys from the hot tier; never touches PostgreSQL."""

    def __init__(self, settings: Settings, hot: HotStore, metrics: DispenserMetrics) -> None:
        self.settings = settings
        self.hot = hot
        self.metrics = metrics
        self.id_types = build_id_types(settings, generating=False)
        self._last_nudge: dict[str, float] = {}

    def id_type(self, name: str) -> IdType:
        if not ID_TYPE_NAME.match(name):
            raise InvalidInput(f"id_type must match {ID_TYPE_NAME.pattern}")
        found = self.id_types.get(name)
        if found is None:
            raise UnknownIdType(name)
        return found

    async def take(self, name: str, count: int, idempotency_key: str | None = None) -> Popped:
        id_type = self.id_type(name)
        if idempotency_key is None:
            popped = await self.hot.pop(name, count)
        else:
            ttl = self.settings.dispenser.idempotency_ttl_s
            popped = await self.hot.pop_once(name, count, idempotency_key, ttl)
        self._observe(name, popped)
        if popped.exhausted:
            raise KeyspaceExhausted(name)
        if popped.remaining < id_type.config.hot.low:
            await self._nudge(name)
        if not popped.keys:
            raise PoolEmpty(name, self.settings.dispenser.retry_after_s)
        return popped

    def _observe(self, name: str, popped: Popped) -> None:
        metrics = self.metrics
        metrics.hot_depth.labels(name).set(popped.remaining)
        if popped.replayed:
            metrics.replays.labels(name).inc()
        elif popped.keys:
            metrics.issued.labels(name).inc(len(popped.keys))
        if popped.discarded:
            metrics.discarded.inc(popped.discarded)

    async def _nudge(self, name: str) -> None:
        """Wake keysync, at most once per nudge interval per type."""
        now = time.monotonic()
        if now - self._last_nudge.get(name, 0.0) < self.settings.dispenser.nudge_interval_s:
            return
        self._last_nudge[name] = now
        self.metrics.nudges.labels(name).inc()
        await self.hot.nudge(name)


def _dispenser(request: Request) -> Dispenser:
    found: Dispenser = request.app.state.dispenser
    return found


async def allocate_one(request: Request) -> Response:
    dispenser = _dispenser(request)
    popped = await dispenser.take(request.path_params["id_type"], 1, _idempotency_key(request))
    return _replay_marked(envelope.ok({"id": popped.keys[0]}), popped)


async def allocate_batch(request: Request) -> Response:
    dispenser = _dispenser(request)
    count = _count(request.query_params.get("count", "1"), dispenser.settings.dispenser.max_batch)
    popped = await dispenser.take(request.path_params["id_type"], count, _idempotency_key(request))
    return _replay_marked(JSONResponse({"keys": popped.keys}), popped)


def _idempotency_key(request: Request) -> str | None:
    """The Idempotency-Key header: 1..255 visible ASCII characters, or absent."""
    raw = request.headers.get("idempotency-key")
    if raw is None:
        return None
    if not 1 <= len(raw) <= 255 or not all(33 <= ord(c) <= 126 for c in raw):
        raise InvalidInput("Idempotency-Key must be 1..255 visible ASCII characters")
    return raw


def _replay_marked(response: Response, popped: Popped) -> Response:
    if popped.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def _count(raw: str, maximum: int) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise InvalidInput(f"count must be an integer from 1 to {maximum}")
    return int(raw)


async def validate(request: Request) -> Response:
    id_type = _dispenser(request).id_type(request.path_params["id_type"])
    value = request.path_params["id_value"]
    return envelope.ok({"id": value, "valid": id_type.validate(value)})


async def health(request: Request) -> Response:
    await _dispenser(request).hot.ping()
    return envelope.ok({"status": "UP"})


async def version(request: Request) -> Response:
    return envelope.ok({"version": metadata.version("keydispenser")})


async def config(request: Request) -> Response:
    types = {
        name: {
            "kind": t.config.kind,
            "length": t.config.length,
            "filter_profile": t.config.filter_profile,
            "filters": t.config.filters.model_dump(),
        }
        for name, t in _dispenser(request).id_types.items()
    }
    return envelope.ok({"id_types": types})


async def metrics(request: Request) -> Response:
    registry = _dispenser(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready only when Redis answers and every type has hot inventory."""
    dispenser = _dispenser(request)
    depths: dict[str, Any] = {}
    try:
        await dispenser.hot.ping()
        for name in dispenser.id_types:
            depths[name] = await dispenser.hot.depth(name)
    except KeydispenserError as exc:
        return JSONResponse({"ready": False, "error": str(exc)}, status_code=503)
    ready = all(depth > 0 for depth in depths.values())
    return JSONResponse({"ready": ready, "hot_depth": depths}, status_code=200 if ready else 503)


async def on_domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, KeydispenserError)
    if not isinstance(exc, PoolEmpty | InvalidInput | UnknownIdType | KeyspaceExhausted):
        log.warning("request_failed", extra={"path": request.url.path, "error": str(exc)})
    _dispenser(request).metrics.errors.labels(envelope.classify(exc)[1]).inc()
    return envelope.from_domain(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: envelope.ROUTE_NOT_FOUND, 405: envelope.METHOD_NOT_ALLOWED}.get(
        exc.status_code, f"IDG-{exc.status_code}"
    )
    return envelope.error(exc.status_code, code, str(exc.detail), exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("request_crashed", extra={"path": request.url.path})
    return envelope.error(500, envelope.INTERNAL_ERROR, "internal error")


ROUTES = [
    Route("/v1/idgenerator/health", health, methods=["GET"]),
    Route("/v1/idgenerator/version", version, methods=["GET"]),
    Route("/v1/idgenerator/config", config, methods=["GET"]),
    Route("/v1/idgenerator/{id_type}/id", allocate_one, methods=["POST"]),
    Route("/v1/idgenerator/{id_type}/id/validate/{id_value}", validate, methods=["GET"]),
    Route("/v1/keys/{id_type}", allocate_batch, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]


class Timing:
    """Pure ASGI middleware: request latency per route template into a histogram."""

    def __init__(self, app: ASGIApp, metrics: DispenserMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self._app(scope, receive, send)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")
            self._metrics.latency.labels(label).observe(time.perf_counter() - started)


def create_app(settings: Settings, hot: HotStore | None = None) -> Starlette:
    metrics = DispenserMetrics(CollectorRegistry())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = hot or HotStore.from_settings(settings)
        app.state.dispenser = Dispenser(settings, store, metrics)
        try:
            yield
        finally:
            await store.close()

    return Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        middleware=[Middleware(Timing, metrics=metrics)],
        exception_handlers={
            KeydispenserError: on_domain_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
