"""The comparison servers of ``keydispenser bench dispense``.

The bare apps answer every request with a constant JSON body, each the ceiling of one
way of serving HTTP on this machine: ``bare`` a Starlette endpoint (uvicorn +
Starlette), ``bare_asgi`` a pure ASGI app (the server alone: uvicorn's ceiling, which
the dispenser on uvicorn is compared with) and ``bare_rsgi`` a pure RSGI app (granian's
ceiling, which the dispenser on granian is compared with). ``pg_baseline``: IDs issued
from PostgreSQL per request with ``SELECT ... FOR UPDATE SKIP LOCKED`` + ``UPDATE``, the
way the reference OpenG2P ID Generator issues them (on asyncpg, a faster driver than the
reference's). uvicorn runs ``bare``, ``bare_asgi`` and ``pg_baseline``; granian runs
``bare`` (over ASGI) and ``bare_rsgi``, with the options the dispenser uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from dispenser import codes

BASELINE_TABLE = "kd_bench_pg_ids"
BASELINE_DSN_ENV = "KD_BENCH_BASELINE_DSN"
# $1: how many IDs. A table like the reference's: ID, status, and an index on status.
CREATE_BASELINE = f"""
DROP TABLE IF EXISTS {BASELINE_TABLE};
CREATE TABLE {BASELINE_TABLE} (
    id_value text PRIMARY KEY,
    status text NOT NULL DEFAULT 'AVAILABLE',
    assigned_at timestamptz
);
"""
FILL_BASELINE = f"""
INSERT INTO {BASELINE_TABLE} (id_value)
SELECT lpad(g::text, 10, '0') FROM generate_series(1, $1::int) AS g
"""
INDEX_BASELINE = f"CREATE INDEX ON {BASELINE_TABLE} (status); ANALYZE {BASELINE_TABLE}"
SELECT_AVAILABLE = (
    f"SELECT id_value FROM {BASELINE_TABLE} WHERE status = 'AVAILABLE' "
    "LIMIT 1 FOR UPDATE SKIP LOCKED"
)
MARK_ASSIGNED = (
    f"UPDATE {BASELINE_TABLE} SET status = 'ASSIGNED', assigned_at = now() WHERE id_value = $1"
)
# Shaped like the dispenser's answer to "one ID" (the same fields and length), so a bare
# app and the dispenser write the same bytes per request.
BODY = {
    "id": "openg2p.idgenerator",
    "version": "1.0",
    "responsetime": "2026-01-01T00:00:00.000Z",
    "response": {"id": "0000000000"},
    "errors": [],
}


async def constant(request: Request) -> Response:
    return JSONResponse(BODY)


def bare() -> Starlette:
    return Starlette(routes=[Route("/v1/idgenerator/{id_type}/id", constant, methods=["POST"])])


BODY_BYTES = json.dumps(BODY, separators=(",", ":")).encode()
_ASGI_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY_BYTES)).encode()),
]
_RSGI_HEADERS = [("content-type", "application/json")]


async def _bare_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rpartition(".")[2]  # startup or shutdown
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": _ASGI_HEADERS})
    await send({"type": "http.response.body", "body": BODY_BYTES})


def bare_asgi() -> ASGIApp:
    return _bare_asgi


class _BareRsgi:
    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        protocol.response_bytes(200, _RSGI_HEADERS, BODY_BYTES)


def bare_rsgi() -> _BareRsgi:
    return _BareRsgi()


async def issue_from_postgres(request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn, conn.transaction():
        value = await conn.fetchval(SELECT_AVAILABLE)
        if value is None:
            empty = codes.POOL_EMPTY
            return JSONResponse({"errors": [{"errorCode": empty.code}]}, status_code=empty.status)
        await conn.execute(MARK_ASSIGNED, value)
    return JSONResponse({**BODY, "response": {"id": value}})


def pg_baseline() -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.pool = await asyncpg.create_pool(
            os.environ[BASELINE_DSN_ENV], min_size=8, max_size=32
        )
        try:
            yield
        finally:
            await app.state.pool.close()

    return Starlette(
        routes=[Route("/v1/idgenerator/{id_type}/id", issue_from_postgres, methods=["POST"])],
        lifespan=lifespan,
    )
