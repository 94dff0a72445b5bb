"""The OpenG2P response envelope, the one table mapping domain errors to HTTP, and
every error answer: a refusal (a domain error) and a crash (anything else).

Errors tell clients what, logs tell operators where: a 5xx answer's message is a fixed
text per errorCode (never a host, port, DSN or driver message), and every error answer
carries a request id (``X-Request-Id`` and the message) that the log line has too.

Answers are ``Answer`` values (status, headers, body), whatever server carries them:
``response`` makes one a Starlette response, the RSGI and ASGI adapters write them
directly (``dispenser.single``).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any, Final

from starlette.responses import Response

from dispenser import codes
from dispenser.auth import CountAboveBurst, HeaderLookup, Unauthenticated
from dispenser.metrics import DispenserMetrics
from shared.domain.errors import (
    KeydispenserError,
)

log = logging.getLogger(__name__)
SERVICE_ID = "openg2p.idgenerator"
API_VERSION = "1.0"
JSON: Final = ("content-type", "application/json")


# One HTTP answer, whatever server carries it: (status, headers, body). Header names
# are lower case; the list may be shared between answers and is never changed. A plain
# tuple: it is made on every request, and a named one costs ten times as much.
Answer = tuple[int, list[tuple[str, str]], bytes]


def response(answer: Answer) -> Response:
    """``answer`` as a Starlette response."""
    status, headers, body = answer
    return Response(body, status, dict(headers))


# On a 422 for a count above the client's burst: the largest count that can pass.
MAX_COUNT_HEADER: Final = "KD-Max-Count"
# An X-Request-Id a proxy sent is kept when it looks like one; else one is made here.
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_ID_PREFIX: Final = secrets.token_hex(4)  # per process: ids of replicas never collide
_ID_COUNTER = itertools.count(1)


def request_id(headers: HeaderLookup) -> str:
    """The request's id: its ``X-Request-Id`` when well formed, else a new one."""
    text = headers.get("x-request-id")
    if text is not None and _REQUEST_ID.fullmatch(text):
        return str(text)
    return f"{_ID_PREFIX}-{next(_ID_COUNTER):x}"


_second: list[Any] = [-1, ""]  # the formatted second last used: [unix second, text]


def response_time() -> str:
    """ISO-8601 UTC with milliseconds and a Z, as OpenG2P writes it."""
    return _response_time_at(int(time.time() * 1000))


def _response_time_at(ms: int) -> str:
    second, millis = divmod(ms, 1000)
    if _second[0] != second:
        _second[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_second[1]}.{millis:03d}Z"


_ID_HEAD = b'{"id":"' + SERVICE_ID.encode() + b'","version":"' + API_VERSION.encode()
_OK_ID_TAIL = b'"},"errors":[]}'


# The envelope of one ID up to the ID itself, for the millisecond last used: under load
# many answers share a millisecond, and then only the ID is written per answer.
class _Head:
    ms = -1
    bytes = b""


_ok_id_head = _Head()


def ok_id(key: str) -> bytes:
    """The envelope of one allocated ID, as bytes; ``key`` never needs JSON escaping."""
    ms = time.time_ns() // 1_000_000
    head = _ok_id_head
    if head.ms != ms:
        stamp = _response_time_at(ms).encode()
        head.bytes = b"".join((_ID_HEAD, b'","responsetime":"', stamp, b'","response":{"id":"'))
        head.ms = ms
    return b"%b%b%b" % (head.bytes, key.encode(), _OK_ID_TAIL)


def keys_body(keys: list[str]) -> bytes:
    """``{"keys": [...]}`` as bytes; keys never need JSON escaping."""
    if not keys:
        return b'{"keys":[]}'
    return b'{"keys":["' + '","'.join(keys).encode() + b'"]}'


def envelope(response: Any, errors: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "id": SERVICE_ID,
        "version": API_VERSION,
        "responsetime": response_time(),
        "response": response,
        "errors": errors or [],
    }


def json_answer(
    content: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Answer:
    """``content`` as compact JSON (as Starlette's JSONResponse writes it)."""
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    extra = [(name.lower(), value) for name, value in (headers or {}).items()]
    return status, [JSON, *extra], body.encode()


def ok(content: Any, status: int = 200) -> Response:
    return response(json_answer(envelope(content), status))


def error_answer(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    request: str | None = None,
) -> Answer:
    """An error envelope; with ``request`` (its id), in the message and X-Request-Id too."""
    extra = dict(headers or {})
    if request is not None:
        message = f"{message} (request id {request})"
        extra["X-Request-Id"] = request
    body = envelope(None, [{"errorCode": code, "message": message}])
    return json_answer(body, status, extra)


def error(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    request: str | None = None,
) -> Response:
    return response(error_answer(status, code, message, headers, request))


def classify(exc: KeydispenserError) -> tuple[int, str]:
    """(HTTP status, errorCode) of a domain error, from the one table (``codes``)."""
    entry = codes.code_of(exc)
    return entry.status, entry.code


def public_message(exc: KeydispenserError, code: str) -> str:
    """What the client is told: the error's own text, or a fixed one for server faults."""
    return codes.PUBLIC_MESSAGES.get(code, str(exc))


def from_domain(exc: KeydispenserError, request: str | None = None) -> Answer:
    """A domain error's envelope, with the headers its code calls for."""
    entry = codes.code_of(exc)
    headers = None
    if entry.retry_after:  # the error's own delay, else a second
        headers = {"Retry-After": str(getattr(exc, "retry_after_s", 1))}
    elif isinstance(exc, Unauthenticated):
        headers = {"WWW-Authenticate": 'Bearer realm="keydispenser"'}
    elif isinstance(exc, CountAboveBurst):
        headers = {MAX_COUNT_HEADER: str(exc.burst)}
    return error_answer(entry.status, entry.code, public_message(exc, entry.code), headers, request)


def refusal(
    exc: KeydispenserError, headers: HeaderLookup, metrics: DispenserMetrics, where: str
) -> Answer:
    """A domain error's envelope with a request id, counted by errorCode; a server-side
    failure is logged with its full detail, ``where`` (the path) and the same id."""
    status, code = classify(exc)
    request = request_id(headers)
    if status >= 500 and code != codes.POOL_EMPTY.code:
        log.warning(
            "request_failed", extra={"path": where, "error": str(exc), "request_id": request}
        )
    metrics.errors.labels(code).inc()
    return from_domain(exc, request)


def crashed(headers: HeaderLookup, where: str) -> Answer:
    """The answer to an unexpected exception, logged once with its traceback and the
    request id the answer carries: call it in ``except``."""
    request = request_id(headers)
    log.exception("request_crashed", extra={"path": where, "request_id": request})
    internal = codes.INTERNAL_ERROR
    message = codes.PUBLIC_MESSAGES[internal.code]
    return error_answer(internal.status, internal.code, message, None, request)
