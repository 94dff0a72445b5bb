"""Nothing a client sends gets a 500, a key it should not get, or unbounded memory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from keydispenser_ops.embedded import free_port
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.conftest import small_types
from tests.integration.fixtures import (
    Servers,
    both_servers,
    dispenser_in_process,
    dispenser_over_http,
    make_settings,
)

LEDGER_KEYS = [f"L{i:06d}" for i in range(50)]


@pytest.fixture
def settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return make_settings(servers, database, id_types=types, dispenser={"max_body_bytes": 4_096})


@pytest.fixture
async def http(settings: Settings, hot: HotStore, server: str) -> AsyncIterator[httpx.AsyncClient]:
    await hot.push("farmer", [f"{i:010d}" for i in range(100)], uuid.uuid4().hex)
    await hot.push("shortlink", LEDGER_KEYS, uuid.uuid4().hex)
    async with dispenser_over_http(settings, server) as client:
        yield client


async def refused_exchange(client: httpx.AsyncClient, head: bytes, body: bytes = b"") -> bytes:
    """Send a request the server refuses before reading all of it, reading its answer
    while still sending: a server that closes with bytes unread makes the kernel reset
    the connection, and a client still blocked writing would never read the answer."""
    url = urlsplit(str(client.base_url))
    reader, writer = await asyncio.open_connection(url.hostname, url.port)

    async def sending() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(head + body)
            await writer.drain()

    sender = asyncio.create_task(sending())
    try:
        return await asyncio.wait_for(reader.read(65_536), 5)
    finally:
        sender.cancel()
        writer.close()


async def raw_exchange(client: httpx.AsyncClient, request: bytes) -> bytes:
    """Send raw bytes to the server and read what it answers until it closes (or timeout)."""
    url = urlsplit(str(client.base_url))
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65_536), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "count", ["٣", "²", "9" * 5_000, "+1", " 1", "1 ", "0", "-1", "1e3", "0x10", "\uff11"]
)
async def test_count_is_ascii_digits_of_sane_length(
    http: httpx.AsyncClient, hot: HotStore, count: str
) -> None:
    reply = await http.post("/v1/keys/farmer", params={"count": count})
    assert reply.status_code == 422
    assert reply.json()["errors"][0]["errorCode"] == "IDG-004"
    assert await hot.depth("farmer") == 100


NEWLINE_PATHS = [
    "/v1/idgenerator/farmer%0A/id",
    "/v1/idgenerator/farmer/id%0A",
    "/v1/keys/farmer%0A",
    "/v1/idgenerator/farmer%0A/id/3029384756/used",
]


@pytest.mark.parametrize("path", NEWLINE_PATHS)
async def test_a_type_name_with_a_trailing_newline_dispenses_nothing(
    http: httpx.AsyncClient, hot: HotStore, path: str
) -> None:
    reply = await raw_exchange(http, f"POST {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status = int(reply.split(b" ", 2)[1])
    assert status in (404, 405, 422), reply
    assert await hot.depth("farmer") == 100


@both_servers
async def test_each_server_decodes_a_trailing_newline_into_no_route(
    http: httpx.AsyncClient, hot: HotStore
) -> None:
    """The path a server decodes (%0A to a newline) reaches no route on either server."""
    for path in NEWLINE_PATHS:
        reply = await raw_exchange(http, f"POST {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert int(reply.split(b" ", 2)[1]) in (404, 405, 422), (path, reply)
    assert await hot.depth("farmer") == 100


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"keys": ' + b"[" * 3_000 + b"]" * 3_000 + b"}",
        b"\xff\xfe",
        b'{"keys": ["L000001"',
        b"",
        b"null",
    ],
)
async def test_malformed_or_deep_json_is_422(http: httpx.AsyncClient, body: bytes) -> None:
    # The body cap is raised for the deep case: nesting, not size, is what is tested.
    reply = await http.post("/v1/keys/shortlink/used", content=body[:4_000])
    assert reply.status_code == 422, reply.text
    assert reply.json()["errors"][0]["errorCode"] == "IDG-004"


async def test_deep_json_under_a_large_cap_is_422_not_500(
    servers: Servers, database: str, redis_client: aioredis.Redis
) -> None:
    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = make_settings(
        servers, database, id_types=types, dispenser={"max_body_bytes": 1_000_000}
    )
    async with dispenser_over_http(settings) as client:
        reply = await client.post(
            "/v1/keys/shortlink/used", content=b"[" * 100_000 + b"]" * 100_000
        )
    assert reply.status_code == 422


@both_servers
async def test_a_body_over_the_cap_is_refused_before_it_is_read(
    http: httpx.AsyncClient,
) -> None:
    declared = await raw_exchange(
        http,
        b"POST /v1/keys/shortlink/used HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 60000000\r\n\r\n{",
    )
    assert declared.startswith(b"HTTP/1.1 413"), declared
    assert b"IDG-012" in declared

    chunk = b"3e8\r\n" + b" " * 1_000 + b"\r\n"
    streamed = await refused_exchange(
        http,
        b"POST /v1/keys/shortlink/used HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        chunk * 100,
    )
    assert streamed.startswith(b"HTTP/1.1 413"), streamed[:80]


async def test_a_client_vanishing_mid_body_logs_one_line(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = urlsplit(str(http.base_url))
    _, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        b"POST /v1/keys/shortlink/used HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
    )
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    deadline = asyncio.get_running_loop().time() + 5
    while not any(r.message == "client_disconnected" for r in caplog.records):
        assert asyncio.get_running_loop().time() < deadline, "no client_disconnected line"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert [r.message for r in caplog.records if r.message == "client_disconnected"] == [
        "client_disconnected"
    ]
    assert not any(r.exc_info for r in caplog.records)


@both_servers
async def test_an_oversized_request_head_is_refused(http: httpx.AsyncClient, server: str) -> None:
    big = b"a" * (2 * 1024 * 1024)
    answer = await refused_exchange(
        http, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n"
    )
    refused = {"uvicorn": b"HTTP/1.1 400", "granian": b"HTTP/1.1 431"}[server]
    assert answer.startswith(refused), answer[:80]
    ok = await http.get("/healthz", headers={"X-Small": "a" * 1_000})
    assert ok.status_code == 200


async def test_store_failures_tell_clients_what_and_logs_where(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis and PostgreSQL unreachable: no host, port, DSN or driver text in answers."""
    dead = free_port()
    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = make_settings(
        servers,
        database,
        id_types=types,
        redis_url=f"redis://127.0.0.1:{dead}/0",
        postgres_dsn=f"postgresql://kd:hunter2@127.0.0.1:{dead}/nowhere",
    )
    async with dispenser_over_http(settings) as client:
        replies = [
            await client.post("/v1/idgenerator/farmer/id"),
            await client.post("/v1/keys/farmer", params={"count": "2"}),
            await client.get("/v1/idgenerator/health"),
            await client.get("/v1/keys/shortlink/L000001"),
            await client.get("/readyz"),
        ]
    for reply in replies:
        assert reply.status_code == 503
        for secret in (str(dead), "127.0.0.1", "hunter2", "nowhere", "Error", "onnect"):
            assert secret not in reply.text, (reply.request.url, reply.text)
        request_id = reply.headers["X-Request-Id"]
        assert request_id in reply.text
    logged = [
        r for r in caplog.records if r.message in ("request_failed", "not_ready", "health_down")
    ]
    assert len(logged) == len(replies)
    assert all(str(dead) in str(r.__dict__["error"]) for r in logged)
    assert {r.__dict__["request_id"] for r in logged} == {
        r.headers["X-Request-Id"] for r in replies
    }


@both_servers
async def test_a_proxy_request_id_is_kept_and_a_bad_one_replaced(
    http: httpx.AsyncClient,
) -> None:
    kept = await http.post("/v1/idgenerator/nope/id", headers={"X-Request-Id": "edge-42"})
    assert kept.status_code == 404 and kept.headers["X-Request-Id"] == "edge-42"
    assert "edge-42" in kept.json()["errors"][0]["message"]
    replaced = await http.post("/v1/idgenerator/nope/id", headers={"X-Request-Id": "a b"})
    assert replaced.headers["X-Request-Id"] != "a b"


# The raw fast path, fuzzed: any method, path and headers; never a 500, never a key
# for a request that does not name a type exactly.
_PATH_PARTS = st.sampled_from(
    ["farmer", "shortlink", "farmer\n", "Farmer", "", "v1", "idgenerator", "id", "..", "%0A"]
)
_HEADER_NAMES = st.sampled_from(
    [b"idempotency-key", b"x-api-key", b"authorization", b"content-length", b"x-request-id"]
)


@st.composite
def raw_requests(draw: st.DrawFn) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    method = draw(st.sampled_from(["POST", "GET", "PUT", "HEAD", "OPTIONS"]))
    parts = draw(st.lists(st.one_of(_PATH_PARTS, st.text(max_size=12)), max_size=6))
    path = draw(st.sampled_from(["/v1/idgenerator/{}/id", "/{}", "/v1/keys/{}"])).format(
        "/".join(parts)
    )
    headers = draw(st.lists(st.tuples(_HEADER_NAMES, st.binary(max_size=300)), max_size=4))
    return method, path, headers


@hypothesis_settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(request=raw_requests())
async def test_the_fast_path_never_answers_500(
    settings: Settings,
    hot: HotStore,
    request: tuple[str, str, list[tuple[bytes, bytes]]],
) -> None:
    method, path, headers = request
    async with dispenser_in_process(settings) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8", "surrogateescape"),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        await asyncio.wait_for(app(scope, receive, send), 10)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1
    status = starts[0]["status"]
    assert isinstance(status, int) and (status < 500 or status == 503), (path, headers, sent)
    if status == 200 and method == "POST":
        assert path.split("/")[3] in ("farmer", "shortlink")


async def test_an_unexpected_error_is_one_500_and_one_traceback(
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom at 10.1.2.3:6379")

    monkeypatch.setattr("dispenser.service.Dispenser.take", broken)
    reply = await http.post("/v1/keys/farmer", params={"count": "2"})
    assert reply.status_code == 500
    assert reply.json()["errors"][0]["errorCode"] == "IDG-500"
    assert "10.1.2.3" not in reply.text and reply.headers["X-Request-Id"] in reply.text
    await asyncio.sleep(0.1)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.message for r in tracebacks] == ["request_crashed"]
    assert tracebacks[0].__dict__["request_id"] == reply.headers["X-Request-Id"]


@both_servers
async def test_concurrency_and_idle_connections_are_bounded(
    servers: Servers, database: str, redis_client: aioredis.Redis, server: str
) -> None:
    """dispenser.limit_concurrency and timeout_keep_alive_s reach the server."""
    settings = make_settings(
        servers, database, dispenser={"limit_concurrency": 2, "timeout_keep_alive_s": 1}
    )
    async with dispenser_over_http(settings, server) as client:
        url = urlsplit(str(client.base_url))
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            first = await asyncio.wait_for(reader.read(65_536), 5)
            assert first.startswith(b"HTTP/1.1 200")
            if server == "uvicorn":
                await _uvicorn_refuses_past_the_limit(client)
                # Idle past timeout_keep_alive_s: the kept-alive connection is closed.
                assert await asyncio.wait_for(reader.read(65_536), 5) == b""
            else:
                await _granian_queues_past_the_limit(client, reader)
        finally:
            writer.close()


async def _uvicorn_refuses_past_the_limit(client: httpx.AsyncClient) -> None:
    # uvicorn counts the connection asking too: with one kept alive, a second reaches
    # the limit of 2 and is answered 503.
    over = await raw_exchange(client, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert over.startswith(b"HTTP/1.1 503"), over[:60]


async def _granian_queues_past_the_limit(
    client: httpx.AsyncClient, held: asyncio.StreamReader
) -> None:
    # granian serves 2 connections; a third waits unanswered until one of them is
    # closed (here by the keep-alive timeout), then it is served.
    url = urlsplit(str(client.base_url))
    _, second = await asyncio.open_connection(url.hostname, url.port)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        queued = asyncio.ensure_future(reader.read(65_536))
        done, _ = await asyncio.wait({queued}, timeout=0.3)
        assert not done, "answered past the limit"
        assert await asyncio.wait_for(held.read(65_536), 5) == b""  # idle: closed
        answer = await asyncio.wait_for(queued, 5)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
    finally:
        second.close()
        writer.close()


async def test_granian_cuts_off_a_slow_request_head(
    servers: Servers, database: str, redis_client: aioredis.Redis
) -> None:
    """granian closes a connection whose request head is not complete within
    timeout_keep_alive_s (uvicorn has no such timeout: docs/security.md, the proxy's)."""
    settings = make_settings(servers, database, dispenser={"timeout_keep_alive_s": 1})
    async with dispenser_over_http(settings, "granian") as client:
        url = urlsplit(str(client.base_url))
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the end
            await writer.drain()
            assert await asyncio.wait_for(reader.read(65_536), 5) == b""
        finally:
            writer.close()


async def test_keys_popped_for_a_client_that_hung_up_are_counted(
    http: httpx.AsyncClient, hot: HotStore
) -> None:
    # uvicorn only: granian reports a hang-up from its own threads, usually but not
    # always before a pop returns, so there the count is best effort (docs/security.md).
    url = urlsplit(str(http.base_url))
    _, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(b"POST /v1/keys/farmer?count=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    writer.close()  # gone before the answer
    expected = 'kd_keys_taken_not_handed_out_total{id_type="farmer"} 3.0'
    deadline = asyncio.get_running_loop().time() + 5
    while expected not in (await http.get("/metrics")).text:
        assert asyncio.get_running_loop().time() < deadline, "lost keys not counted"
        await asyncio.sleep(0.05)
    assert await hot.depth("farmer") == 97  # taken, counted, never reissued
