"""The dispenser's HTTP API: OpenG2P-compatible routes plus native batch routes.

The two allocation routes are the hot path: one coalesced Redis call serves many
concurrent requests, and their bodies are written as bytes (keys are drawn from
URL-safe alphabets, so they never need JSON escaping). ``create_app`` wraps the
Starlette app in ``dispenser.fastpath.FastPath``, which answers most single-ID
requests before the route table is reached.
"""

from __future__ import annotations

import gc
import json
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

from dispenser import envelope
from dispenser.fastpath import ALLOCATE_ONE, FastPath, crashed, one_id, refusal
from dispenser.metrics import DispenserMetrics, Timing
from dispenser.openapi import document
from dispenser.service import Dispenser
from shared.domain.errors import InvalidInput, KeydispenserError
from shared.domain.idtypes import IdType
from shared.domain.settings import Settings
from shared.stores.hot_store import HotStore, Popped


def _dispenser(request: Request) -> Dispenser:
    found: Dispenser = request.app.state.dispenser
    return found


async def allocate_one(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    client = dispenser.gate.admit(request.headers, name)
    idempotency_key = _idempotency_key(request)
    if idempotency_key is None:
        body = await one_id(dispenser, name, client)
        return Response(body, media_type="application/json")
    popped = await dispenser.take(name, 1, client, idempotency_key)
    return _replay_marked(envelope.ok({"id": popped.keys[0]}), popped)


async def allocate_batch(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    client = dispenser.gate.admit(request.headers, name)
    count = _count(request.query_params.get("count", "1"), dispenser.settings.dispenser.max_batch)
    popped = await dispenser.take(name, count, client, _idempotency_key(request))
    return _replay_marked(
        Response(envelope.keys_body(popped.keys), media_type="application/json"), popped
    )


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
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    dispenser.gate.admit(request.headers, name)
    id_type = dispenser.id_type(name)
    value = request.path_params["id_value"]
    return envelope.ok({"id": value, "valid": id_type.validate(value)})


def _well_formed(id_type: IdType, value: str) -> str:
    if not id_type.validate(value):
        raise InvalidInput(f"'{value}' is not a valid {id_type.name} key")
    return value


async def mark_used(request: Request) -> Response:
    """Record that an issued ID was used; applied to the ledger asynchronously (202)."""
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    client = dispenser.gate.admit(request.headers, name)
    id_type = dispenser.ledger_type(name)
    value = _well_formed(id_type, request.path_params["id_value"])
    await dispenser.ledger_stream.record_used(name, [value], client)
    return envelope.ok({"id": value, "status": "ACCEPTED"}, status=202)


async def mark_used_batch(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    client = dispenser.gate.admit(request.headers, name)
    id_type = dispenser.ledger_type(name)
    keys = _keys_body(await request.body(), dispenser.settings.dispenser.max_batch)
    for key in keys:
        _well_formed(id_type, key)
    await dispenser.ledger_stream.record_used(name, keys, client)
    return JSONResponse({"accepted": len(keys)}, status_code=202)


def _keys_body(raw: bytes, maximum: int) -> list[str]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput('body must be JSON: {"keys": [...]}') from exc
    keys = body.get("keys") if isinstance(body, dict) else None
    if (
        not isinstance(keys, list)
        or not 1 <= len(keys) <= maximum
        or not all(isinstance(k, str) for k in keys)
    ):
        raise InvalidInput(f'body must be {{"keys": [...]}} with 1 to {maximum} strings')
    return keys


async def lookup(request: Request) -> Response:
    """What the ledger knows of one key: issued? when? to whom? used?"""
    dispenser = _dispenser(request)
    name = request.path_params["id_type"]
    dispenser.gate.admit(request.headers, name)
    id_type = dispenser.ledger_type(name)
    key = request.path_params["key"]
    id_type.core(key)  # refuses values that cannot be keys of any type
    return JSONResponse(await dispenser.ledger.lookup(name, key))


async def health(request: Request) -> Response:
    _observability(request)
    await _dispenser(request).hot.ping()
    return envelope.ok({"status": "UP"})


async def version(request: Request) -> Response:
    _dispenser(request).gate.admit(request.headers)
    return envelope.ok({"version": metadata.version("keydispenser")})


async def config(request: Request) -> Response:
    dispenser = _dispenser(request)
    dispenser.gate.admit(request.headers)
    types = {
        name: {
            "kind": id_type.config.kind,
            "length": id_type.config.length,
            "filter_profile": id_type.config.filter_profile,
            "filters": id_type.config.filters.model_dump(),
            "ledger": id_type.config.ledger,
        }
        for name, id_type in dispenser.id_types.items()
    }
    return envelope.ok({"id_types": types})


def _observability(request: Request) -> None:
    gate = _dispenser(request).gate
    if gate.protect_observability:
        gate.admit(request.headers)


async def metrics(request: Request) -> Response:
    _observability(request)
    registry = _dispenser(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    _observability(request)
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready only when Redis answers and every type has hot inventory."""
    _observability(request)
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


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def on_domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, KeydispenserError)
    return refusal(exc, request.url.path, _dispenser(request).metrics)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: envelope.ROUTE_NOT_FOUND, 405: envelope.METHOD_NOT_ALLOWED}.get(
        exc.status_code, f"IDG-{exc.status_code}"
    )
    return envelope.error(exc.status_code, code, str(exc.detail), exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    return crashed(request.url.path)


ROUTES = [
    Route("/v1/idgenerator/health", health, methods=["GET"]),
    Route("/v1/idgenerator/version", version, methods=["GET"]),
    Route("/v1/idgenerator/config", config, methods=["GET"]),
    Route(ALLOCATE_ONE, allocate_one, methods=["POST"]),
    Route("/v1/idgenerator/{id_type}/id/validate/{id_value}", validate, methods=["GET"]),
    Route("/v1/idgenerator/{id_type}/id/{id_value}/used", mark_used, methods=["POST"]),
    Route("/v1/keys/{id_type}", allocate_batch, methods=["POST"]),
    Route("/v1/keys/{id_type}/used", mark_used_batch, methods=["POST"]),
    Route("/v1/keys/{id_type}/{key}", lookup, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]


def create_app(settings: Settings, hot: HotStore | None = None) -> FastPath:
    metrics = DispenserMetrics(CollectorRegistry())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = hot or HotStore.from_settings(settings)
        app.state.dispenser = dispenser = Dispenser(settings, store, metrics)
        app.state.openapi = document(settings, metadata.version("keydispenser"))
        gc.freeze()  # start-up objects never become garbage: keep them out of collections
        try:
            yield
        finally:
            await dispenser.close()
            await store.close()

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        middleware=[Middleware(Timing, metrics=metrics)],
        exception_handlers={
            KeydispenserError: on_domain_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    return FastPath(app)
