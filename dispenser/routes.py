"""The dispenser's HTTP routes: OpenG2P-compatible routes plus native batch routes,
MOSIP's, the probes and the metrics; the guard middleware and the error handlers.

The two allocation routes are the hot path: one coalesced Redis call serves many
concurrent requests, and their bodies are written as bytes (keys are drawn from
URL-safe alphabets, so they never need JSON escaping). "One ID" is answered by
``dispenser.single``, carried before the route table by ``dispenser.fastpath`` (the
route here carries the same answer for a request the fast path leaves). The app that
serves these routes is wired in ``dispenser.app``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispenser import codes, envelope, mosip, openg2p, single
from dispenser.auth import Gate
from dispenser.codes import BodyTooLarge, ClientGone
from dispenser.service import Dispenser
from dispenser.single import SingleId
from shared.domain.errors import ConfigError, InvalidInput, KeydispenserError, StoreUnavailable
from shared.domain.idtypes import IdType
from shared.domain.snowflake import SnowflakeType
from shared.domain.tiers import Popped, not_issued

log = logging.getLogger(__name__)


def _dispenser(request: Request) -> Dispenser:
    found: Dispenser = request.app.state.dispenser
    return found


def _gate(request: Request) -> Gate:
    """The API-key gate: the routes', built with the app (``dispenser.app``)."""
    found: Gate = request.app.state.gate
    return found


async def allocate_one(request: Request) -> Response:
    """ "One ID" for a request the fast path left to the router (``dispenser.fastpath``)."""
    segment = request.path_params["id_type"]
    answered: SingleId = request.app.state.single
    return envelope.response(await answered.answer(segment, request.headers))


async def allocate_batch(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    raw = request.query_params.get("count", "1")
    maximum = dispenser.settings.dispenser.max_batch
    # Rate limits are charged per key asked for; a malformed count is refused after auth.
    client = _gate(request).admit(request.headers, name, cost=_parsed_count(raw, maximum) or 1)
    count = _count(raw, maximum)
    idempotency_key = single.idempotency_key(request.headers)
    if idempotency_key is not None:  # a retry with the key gets the keys back
        popped = await dispenser.take(name, count, client, idempotency_key)
    else:
        popped = await _take_counting_loss(request, dispenser, name, count, client)
    return _replay_marked(
        Response(envelope.keys_body(popped.keys), media_type="application/json"), popped
    )


async def disconnected(receive: Receive) -> None:
    """Returns once the server reports the client gone; request body chunks (ignored by
    the routes that watch) are skipped. uvicorn reports a disconnect at once, granian
    only after the unread body has been handed over: so the watch starts before the pop.
    After the body's last chunk only a disconnect may come; anything else (a server
    that would answer at once forever) ends the watch without a busy loop."""
    message = await receive()
    while message["type"] == "http.request" and message.get("more_body", False):
        message = await receive()
    if message["type"] != "http.disconnect":
        message = await receive()
    if message["type"] != "http.disconnect":
        await asyncio.get_running_loop().create_future()  # nothing more to learn: wait


async def _take_counting_loss(
    request: Request, dispenser: Dispenser, name: str, count: int, client: str
) -> Popped:
    """``take`` a batch, counting its keys as lost when the client is gone by the end."""
    watch = asyncio.ensure_future(disconnected(request.receive))
    try:
        popped = await dispenser.take(name, count, client, None)
        await asyncio.sleep(0)  # a disconnect reported during the pop reaches the watch
        if watch.done() and not watch.cancelled() and watch.exception() is None:
            dispenser.lost(name, len(popped.keys))
        return popped
    finally:
        watch.cancel()


def _replay_marked(response: Response, popped: Popped) -> Response:
    if popped.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def _parsed_count(raw: str, maximum: int) -> int | None:
    """``raw`` as a count when it is 1..maximum in ASCII digits (no sign, no space)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(maximum)):
        return None
    value = int(raw)
    return value if 1 <= value <= maximum else None


def _count(raw: str, maximum: int) -> int:
    count = _parsed_count(raw, maximum)
    if count is None:
        raise InvalidInput(f"count must be an integer from 1 to {maximum} in ASCII digits")
    return count


async def validate(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    _gate(request).admit(request.headers, name)
    id_type = dispenser.any_type(name)
    value = request.path_params["id_value"]
    return envelope.ok({"id": value, "valid": id_type.validate(value)})


async def decode(request: Request) -> Response:
    """Time, machine ID and sequence of a snowflake ID (any well-formed one)."""
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    _gate(request).admit(request.headers, name)
    id_type = dispenser.any_type(name)
    if not isinstance(id_type, SnowflakeType):
        raise InvalidInput(
            f"id_type '{name}' is a {id_type.config.kind} type: only snowflake IDs decode"
        )
    value = request.path_params["id_value"]
    return envelope.ok({"id": value, **id_type.decode(value).as_dict()})


def _well_formed(id_type: IdType | SnowflakeType, value: str) -> str:
    """The key ``value`` names, as the type writes it (``IdType.normalise``); InvalidInput
    when it is none of the type's keys."""
    if not id_type.validate(value):
        raise InvalidInput(f"'{value}' is not a valid {id_type.name} key")
    return id_type.normalise(value) if isinstance(id_type, IdType) else value


async def mark_used(request: Request) -> Response:
    """Record that an issued ID was used; applied to the ledger asynchronously (202).

    On a type without a ledger it is accepted and counted, not recorded (a registry's
    updation worker would otherwise retry a 409 forever)."""
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    client, admin = _gate(request).admit_with_rights(request.headers, name)
    id_type = dispenser.any_type(name)
    value = _well_formed(id_type, request.path_params["id_value"])
    if not isinstance(id_type, IdType) or not id_type.config.ledger:
        dispenser.metrics.used_unrecorded.labels(name).inc()
        return envelope.ok({"id": value, "status": "ACCEPTED"}, status=202)
    await dispenser.ledger_open(id_type)
    await dispenser.ledger_stream.record_used(name, [value], client, admin)
    return envelope.ok({"id": value, "status": "ACCEPTED"}, status=202)


async def mark_used_batch(request: Request) -> Response:
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    client, admin = _gate(request).admit_with_rights(request.headers, name)
    id_type = dispenser.ledger_type(name)
    raw = await bounded_body(request, dispenser.settings.dispenser.max_body_bytes)
    given = _keys_body(raw, dispenser.settings.dispenser.max_batch)
    keys = [_well_formed(id_type, key) for key in given]
    await dispenser.ledger_open(id_type)
    await dispenser.ledger_stream.record_used(name, keys, client, admin)
    return JSONResponse({"accepted": len(keys)}, status_code=202)


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed ``limit`` bytes:
    from Content-Length before reading, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 18:
            raise InvalidInput("Content-Length must be a number of bytes")
        if int(declared) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise ClientGone("client disconnected while sending its body") from exc
    return b"".join(chunks)


def _keys_body(raw: bytes, maximum: int) -> list[str]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
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
    """What the ledger knows of one key: issued? when? to whom? used?

    A client sees only the keys issued to it (unless it has ledger permission): another
    client's key answers exactly as a key never issued, so the answer reveals nothing.
    """
    dispenser = _dispenser(request)
    name = dispenser.canonical(request.path_params["id_type"])
    client, admin = _gate(request).admit_with_rights(request.headers, name)
    id_type = dispenser.ledger_type(name)
    # As the ledger holds it; refuses values that cannot be keys of the type at all.
    key = id_type.normalise(request.path_params["key"])
    entry = await dispenser.ledger.lookup(name, key)
    if entry["issued"] and entry["client"] != client and not admin:
        entry = not_issued(name, key)
    return JSONResponse(entry)


def _mosip_type(request: Request, path: str) -> str:
    """The ID type a MOSIP path serves; 404 when ``dispenser.mosip`` does not name one."""
    configured = _dispenser(request).settings.dispenser.mosip
    name = getattr(configured, path, None) if configured is not None else None
    if name is None:
        raise HTTPException(404, f"MOSIP's /v1/idgenerator/{path} is not configured")
    return str(name)


async def mosip_uin(request: Request) -> Response:
    """MOSIP's ``GET`` (one UIN) and ``PUT`` (a UIN's status) on one path."""
    dispenser, gate, name = _dispenser(request), _gate(request), _mosip_type(request, "uin")
    if request.method == "GET":
        return envelope.response(await mosip.get_uin(dispenser, gate, name, request.headers))
    if request.method != "PUT":
        return envelope.response(mosip.method_not_allowed("GET, PUT"))
    try:
        raw = await bounded_body(request, dispenser.settings.dispenser.max_body_bytes)
    except BodyTooLarge as exc:
        return envelope.response(mosip.body_refused(exc))
    return envelope.response(await mosip.put_uin(dispenser, gate, name, request.headers, raw))


async def mosip_vid(request: Request) -> Response:
    dispenser, gate, name = _dispenser(request), _gate(request), _mosip_type(request, "vid")
    if request.method != "GET":
        return envelope.response(mosip.method_not_allowed("GET"))
    expiry = request.query_params.get(mosip.VID_EXPIRY_PARAM)
    return envelope.response(await mosip.get_vid(dispenser, gate, name, request.headers, expiry))


async def health(request: Request) -> Response:
    """OpenG2P's health route (behind protect_observability; probes use /healthz, /readyz):
    503 IDG-005 until start-up is complete, 503 IDG-006 when the store check fails."""
    _observability(request)
    dispenser = _dispenser(request)
    try:
        await dispenser.type_states()
    except KeydispenserError as exc:
        started = dispenser.started
        code = codes.HEALTH_STORE_FAILED if started else codes.HEALTH_STARTING
        why = "store check failed" if started else "start-up is not complete"
        request_id = envelope.request_id(request.headers)
        log.warning(
            "health_down", extra={"error": str(exc), "code": code, "request_id": request_id}
        )
        return envelope.error(503, code, why, {"Retry-After": "1"}, request_id)
    return envelope.ok({"status": "UP"})


async def version(request: Request) -> Response:
    _gate(request).admit(request.headers)
    build: dict[str, str] = request.app.state.build
    return envelope.ok({"version": build["service_version"], **build})


async def config(request: Request) -> Response:
    dispenser = _dispenser(request)
    _gate(request).admit(request.headers)
    types = {name: openg2p.type_config(id_type) for name, id_type in dispenser.id_types.items()}
    types |= {n: openg2p.snowflake_config(t) for n, t in dispenser.snowflakes.types.items()}
    described = openg2p.global_rules_type(dispenser.id_types)
    rules = {} if described is None else openg2p.rules(described)
    return envelope.ok(
        {
            "id_types": types,
            "filter_rules": rules,
            "filter_rules_id_type": described.name if described else None,
        }
    )


def _observability(request: Request) -> None:
    gate = _gate(request)
    if gate.protect_observability:
        gate.admit(request.headers)


async def metrics(request: Request) -> Response:
    _observability(request)
    dispenser = _dispenser(request)
    workers = request.app.state.worker_metrics
    body = workers.exposition() if workers else generate_latest(dispenser.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    """Liveness. Never behind protect_observability: a probe has no API key."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness of this process: started and the Redis primary reachable.

    Never behind protect_observability (a probe has no API key). An empty or used-up
    type does not make the process unready (its other types still serve): each type's
    depth and state are in the body and in the metrics.
    """
    dispenser = _dispenser(request)
    try:
        types = await dispenser.type_states()
    except KeydispenserError as exc:
        dispenser.metrics.redis_up.set(0 if isinstance(exc, StoreUnavailable) else 1)
        request_id = envelope.request_id(request.headers)
        log.warning("not_ready", extra={"error": str(exc), "request_id": request_id})
        why = "redis may evict keys" if isinstance(exc, ConfigError) else "redis unreachable"
        return JSONResponse(
            {"ready": False, "error": why, "request_id": request_id},
            status_code=503,
            headers={"X-Request-Id": request_id},
        )
    dispenser.metrics.redis_up.set(1)
    body: dict[str, Any] = {"ready": True, "types": types}
    if dispenser.keeps_ledgers:
        # Lookups need PostgreSQL; issuing does not, so it does not make the process
        # unready: it is said here (and in kd_postgres_up), lookups answer 503 IDG-005.
        problem = await dispenser.ledger.probe()
        dispenser.metrics.postgres_up.set(0 if problem else 1)
        body["postgres"] = {"ok": problem is None, **({"error": problem} if problem else {})}
        if problem:
            log.warning("postgres_unusable", extra={"error": dispenser.ledger.problem})
    return JSONResponse(body)


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def on_domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, KeydispenserError)
    if isinstance(exc, ClientGone):
        log.info("client_disconnected", extra={"path": request.url.path})
    answer = envelope.refusal(exc, request.headers, _dispenser(request).metrics, request.url.path)
    return envelope.response(answer)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    known = {c.status: c.code for c in (codes.ROUTE_NOT_FOUND, codes.METHOD_NOT_ALLOWED)}
    code = known.get(exc.status_code, f"IDG-{exc.status_code}")
    request_id = envelope.request_id(request.headers)
    return envelope.error(exc.status_code, code, str(exc.detail), exc.headers, request_id)


class Guard:
    """Pure ASGI, inside Starlette's error middleware: an unexpected exception is
    answered 500 and logged once, with a request id (Starlette's own handler would log
    it and then raise it again for the server to log a second time); a client that
    disconnected mid-request costs one log line."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, tracking)
        except ClientDisconnect:
            log.info("client_disconnected", extra={"path": scope.get("path")})
        except Exception:
            if scope["type"] != "http" or started:
                log.exception("request_crashed_after_answer", extra={"path": scope.get("path")})
                return
            answer = envelope.crashed(Headers(scope=scope), scope["path"])
            await envelope.response(answer)(scope, receive, send)


class WholeRoute(Route):
    """A Route whose path pattern must match the whole path.

    Starlette anchors route patterns with ``$``, which also matches before a final
    newline: ``/v1/idgenerator/farmer/id%0A`` would be served as the route.
    """

    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        pattern = self.path_regex.pattern
        if not pattern.endswith("$"):
            raise ValueError(f"unexpected route pattern {pattern!r}")
        self.path_regex = re.compile(pattern[:-1] + r"\Z")


EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ROUTES = [
    WholeRoute("/v1/idgenerator/health", health, methods=["GET"]),
    WholeRoute("/v1/idgenerator/version", version, methods=["GET"]),
    WholeRoute("/v1/idgenerator/config", config, methods=["GET"]),
    # Every method: a wrong one is answered in MOSIP's wrapper.
    WholeRoute(mosip.UIN_PATH, mosip_uin, methods=EVERY_METHOD),
    WholeRoute(mosip.VID_PATH, mosip_vid, methods=EVERY_METHOD),
    WholeRoute(single.ALLOCATE_ONE, allocate_one, methods=["POST"]),
    WholeRoute("/v1/idgenerator/{id_type}/id/validate/{id_value}", validate, methods=["GET"]),
    WholeRoute("/v1/idgenerator/{id_type}/id/{id_value}/used", mark_used, methods=["POST"]),
    WholeRoute("/v1/idgenerator/{id_type}/id/{id_value}/decode", decode, methods=["GET"]),
    WholeRoute("/v1/keys/{id_type}", allocate_batch, methods=["POST"]),
    WholeRoute("/v1/keys/{id_type}/used", mark_used_batch, methods=["POST"]),
    WholeRoute("/v1/keys/{id_type}/{key}", lookup, methods=["GET"]),
    WholeRoute("/metrics", metrics, methods=["GET"]),
    WholeRoute("/healthz", healthz, methods=["GET"]),
    WholeRoute("/readyz", readyz, methods=["GET"]),
    WholeRoute("/openapi.json", openapi, methods=["GET"]),
]
