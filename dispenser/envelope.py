"""The OpenG2P response envelope and the one table mapping domain errors to HTTP."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from shared.errors import (
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    PoolEmpty,
    StoreUnavailable,
    UnknownIdType,
)

SERVICE_ID = "openg2p.idgenerator"
API_VERSION = "1.0"

# Domain error -> (HTTP status, error code). Codes IDG-001..003 match OpenG2P.
ERROR_TABLE: dict[type[KeydispenserError], tuple[int, str]] = {
    PoolEmpty: (503, "IDG-001"),
    KeyspaceExhausted: (410, "IDG-002"),
    UnknownIdType: (404, "IDG-003"),
    InvalidInput: (422, "IDG-004"),
    StoreUnavailable: (503, "IDG-005"),
}
ROUTE_NOT_FOUND = "IDG-006"
METHOD_NOT_ALLOWED = "IDG-007"
INTERNAL_ERROR = "IDG-500"


def response_time() -> str:
    """ISO-8601 UTC with milliseconds and a Z, as OpenG2P writes it."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def envelope(response: Any, errors: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "id": SERVICE_ID,
        "version": API_VERSION,
        "responsetime": response_time(),
        "response": response,
        "errors": errors or [],
    }


def ok(response: Any) -> JSONResponse:
    return JSONResponse(envelope(response))


def error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = envelope(None, [{"errorCode": code, "message": message}])
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def classify(exc: KeydispenserError) -> tuple[int, str]:
    """(HTTP status, errorCode) of a domain error, from the one table."""
    return next(
        (mapping for kind, mapping in ERROR_TABLE.items() if isinstance(exc, kind)),
        (500, INTERNAL_ERROR),
    )


def from_domain(exc: KeydispenserError) -> JSONResponse:
    status, code = classify(exc)
    headers = None
    if isinstance(exc, PoolEmpty):
        headers = {"Retry-After": str(exc.retry_after_s)}
    elif isinstance(exc, StoreUnavailable):
        headers = {"Retry-After": "1"}
    return error(status, code, str(exc), headers)
