"""Coalescing, API keys, Retry-After and metrics, over real HTTP with real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, both_servers, dispenser_over_http, make_settings


async def fill(hot: HotStore, name: str, count: int, prefix: str = "k") -> list[str]:
    keys = [f"{prefix}{i:06d}" for i in range(count)]
    await hot.push(name, keys, uuid.uuid4().hex)
    return keys


async def test_concurrent_single_requests_never_share_keys_and_some_share_a_pop(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    # Client and server share one event loop here: on a loaded machine a kept-alive
    # connection can sit idle past the default 5 s between two of its 600 requests, and
    # a close racing the next request is a transport error, not what this test is about.
    settings = make_settings(servers, database, dispenser={"timeout_keep_alive_s": 120})
    keys = await fill(hot, "farmer", 900)
    async with dispenser_over_http(settings) as client:
        limits = httpx.Limits(max_connections=64)
        # A generous deadline: 600 requests on a loaded 2-core machine may queue.
        async with httpx.AsyncClient(base_url=client.base_url, limits=limits, timeout=60) as many:
            replies = await asyncio.gather(
                *(many.post("/v1/idgenerator/farmer/id") for _ in range(600))
            )
        metrics = (await client.get("/metrics")).text
    got = [r.json()["response"]["id"] for r in replies]
    assert all(r.status_code == 200 for r in replies)
    assert len(set(got)) == 600
    assert set(got) <= set(keys)
    # Every key popped is handed out or still held in the process's prefetch stock.
    held = _metric(metrics, 'kd_prefetched_keys{id_type="farmer"}')
    assert await hot.depth("farmer") + held == 300
    assert 'kd_keys_issued_total{id_type="farmer"} 600.0' in metrics
    pops = _metric(metrics, "kd_pop_requests_count")
    assert pops < 600  # at least one Redis pop served several requests (no more is promised)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


async def test_an_empty_pool_answers_retry_after_from_the_refill_rate(
    settings: Settings, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    import time

    # keysync reported 100 keys/s; a batch is 500 keys: the next lands in ~5 s.
    await redis_client.hset(
        redis_keys.refill_key(NS, "farmer"), mapping={"rate": "100", "at": str(time.time())}
    )
    async with dispenser_over_http(settings) as client:
        one = await client.post("/v1/idgenerator/farmer/id")
        batch = await client.post("/v1/keys/farmer", params={"count": 10})
    for reply in (one, batch):
        assert reply.status_code == 503
        assert reply.json()["errors"][0]["errorCode"] == "IDG-001"
        assert reply.headers["Retry-After"] == "5"


@pytest.fixture
def keys() -> dict[str, str]:
    return {name: new_api_key()[0] for name in ("registry", "limited", "links")}


def auth_settings(
    servers: Servers, database: str, keys: dict[str, str], **auth: object
) -> Settings:
    from shared.domain.apikeys import digest

    clients = [
        {"name": "registry", "sha256": digest(keys["registry"])},
        {"name": "limited", "sha256": digest(keys["limited"]), "rate_per_s": 0.01, "burst": 2},
        {"name": "links", "sha256": digest(keys["links"]), "id_types": ["shortlink"]},
    ]
    return make_settings(servers, database, dispenser={"auth": {"api_keys": clients, **auth}})


@pytest.fixture
async def secured(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    hot: HotStore,
    keys: dict[str, str],
    server: str,
) -> AsyncIterator[httpx.AsyncClient]:
    await fill(hot, "farmer", 50)
    await fill(hot, "shortlink", 50, prefix="s")
    async with dispenser_over_http(auth_settings(servers, database, keys), server) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/idgenerator/farmer/id"),
        ("POST", "/v1/keys/farmer"),
        ("GET", "/v1/idgenerator/farmer/id/validate/3029384756"),
        ("GET", "/v1/idgenerator/config"),
    ],
)
@both_servers  # the single route is answered before Starlette: on each server its own way
async def test_without_a_key_the_api_answers_401(
    secured: httpx.AsyncClient, method: str, path: str
) -> None:
    reply = await secured.request(method, path)
    assert reply.status_code == 401
    assert reply.json()["errors"][0]["errorCode"] == "IDG-008"
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await secured.request(method, path, headers={"X-API-Key": "kd_not-a-key"})
    assert wrong.status_code == 401


@both_servers
async def test_a_valid_key_allocates_and_health_and_metrics_stay_open(
    secured: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    bearer = {"Authorization": f"Bearer {keys['registry']}"}
    assert (await secured.post("/v1/idgenerator/farmer/id", headers=bearer)).status_code == 200
    assert (await secured.post("/v1/keys/shortlink", headers=bearer)).status_code == 200
    for path in ("/metrics", "/healthz", "/readyz", "/v1/idgenerator/health", "/openapi.json"):
        assert (await secured.get(path)).status_code == 200, path


async def test_a_key_limited_to_some_types_gets_403_for_the_others(
    secured: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    headers = {"X-API-Key": keys["links"]}
    assert (await secured.post("/v1/keys/shortlink", headers=headers)).status_code == 200
    for path in ("/v1/idgenerator/farmer/id", "/v1/keys/farmer"):
        reply = await secured.post(path, headers=headers)
        assert reply.status_code == 403
        assert reply.json()["errors"][0]["errorCode"] == "IDG-009"


@both_servers
async def test_a_key_scoped_by_a_types_alias_uses_it_under_either_name(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis, server: str
) -> None:
    from shared.domain.apikeys import digest

    key, _ = new_api_key()
    types = small_types()
    types["farmer"]["aliases"] = ["beneficiary"]
    client = {"name": "welfare", "sha256": digest(key), "id_types": ["beneficiary"]}
    settings = make_settings(
        servers, database, id_types=types, dispenser={"auth": {"api_keys": [client]}}
    )
    await fill(hot, "farmer", 10)
    await fill(hot, "shortlink", 10, prefix="s")
    headers = {"X-API-Key": key}
    async with dispenser_over_http(settings, server) as http:
        for path in ("/v1/idgenerator/beneficiary/id", "/v1/idgenerator/farmer/id"):
            assert (await http.post(path, headers=headers)).status_code == 200, path
        assert (await http.post("/v1/keys/beneficiary", headers=headers)).status_code == 200
        refused = await http.post("/v1/keys/shortlink", headers=headers)
        assert refused.status_code == 403
        assert refused.json()["errors"][0]["errorCode"] == "IDG-009"


@both_servers
async def test_over_its_rate_a_client_gets_429_with_retry_after_and_loses_nothing(
    secured: httpx.AsyncClient, keys: dict[str, str], hot: HotStore
) -> None:
    headers = {"X-API-Key": keys["limited"]}
    ok = [await secured.post("/v1/idgenerator/farmer/id", headers=headers) for _ in range(2)]
    assert [r.status_code for r in ok] == [200, 200]
    refused = await secured.post("/v1/idgenerator/farmer/id", headers=headers)
    assert refused.status_code == 429
    assert refused.json()["errors"][0]["errorCode"] == "IDG-010"
    assert int(refused.headers["Retry-After"]) >= 1
    metrics = (await secured.get("/metrics")).text
    held = _metric(metrics, 'kd_prefetched_keys{id_type="farmer"}')
    assert await hot.depth("farmer") + held == 48  # the refused request took no key
    other = await secured.post("/v1/idgenerator/farmer/id", headers={"X-API-Key": keys["registry"]})
    assert other.status_code == 200  # limits are per client


async def test_observability_can_be_protected_too(
    servers: Servers, database: str, redis_client: aioredis.Redis, keys: dict[str, str]
) -> None:
    settings = auth_settings(servers, database, keys, protect_observability=True)
    async with dispenser_over_http(settings) as client:
        assert (await client.get("/metrics")).status_code == 401
        # Probes carry no API key: protecting them would restart pods in a loop.
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/healthz")).status_code == 200
        good = await client.get("/metrics", headers={"X-API-Key": keys["registry"]})
        assert good.status_code == 200


@both_servers
async def test_a_request_body_on_the_single_route_is_ignored_and_the_connection_reused(
    settings: Settings, hot: HotStore, server: str
) -> None:
    """uvicorn keeps the connection; granian closes a connection whose request body was
    left unread once it has answered (docs/operations.md), so there each request takes
    a connection of its own."""
    await fill(hot, "farmer", 10)
    limits = httpx.Limits(max_keepalive_connections=1 if server == "uvicorn" else 0)
    async with (
        dispenser_over_http(settings, server) as served,
        httpx.AsyncClient(base_url=served.base_url, limits=limits) as client,
    ):
        with_body = await client.post("/v1/idgenerator/farmer/id", json={"anything": 1})
        after = await client.post("/v1/idgenerator/farmer/id", content=b"x" * 70_000)
        last = await client.post("/v1/idgenerator/farmer/id")
    assert [r.status_code for r in (with_body, after, last)] == [200, 200, 200]
    assert [r.json()["response"]["id"] for r in (with_body, after, last)] == [
        "k000000",
        "k000001",
        "k000002",
    ]


async def test_a_ledger_lookup_without_its_table_is_a_clear_503(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncpg

    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = make_settings(servers, database, id_types=types)
    conn = await asyncpg.connect(settings.postgres_dsn)
    await conn.execute(f"DROP TABLE {sql.ledger_table('shortlink')}")
    await conn.close()
    async with dispenser_over_http(settings) as client:
        reply = await client.get("/v1/keys/shortlink/Abc1234")
    assert reply.status_code == 503
    assert reply.json()["errors"][0]["errorCode"] == "IDG-005"
    message = reply.json()["errors"][0]["message"]
    # The operator's detail goes to the log under the request id the answer carries.
    assert "migrate" not in message and reply.headers["X-Request-Id"] in message
    logged = [r for r in caplog.records if r.message == "request_failed"]
    assert "keydispenser migrate" in str(logged[-1].__dict__["error"])
    assert logged[-1].__dict__["request_id"] == reply.headers["X-Request-Id"]
