"""Every dispenser endpoint and error envelope, over real HTTP with real Redis.

The API contract (``both_servers``) runs on uvicorn and on granian."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from dispenser.app import create_app
from keydispenser_ops.embedded import free_port
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.conftest import NS
from tests.integration.fixtures import both_servers, dispenser_in_process, dispenser_over_http

RESPONSE_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
async def client(settings: Settings, server: str) -> AsyncIterator[httpx.AsyncClient]:
    async with dispenser_over_http(settings, server) as http:
        yield http


async def fill(hot: HotStore, name: str, keys: list[str]) -> None:
    await hot.push(name, keys, uuid.uuid4().hex)


def assert_envelope(body: dict[str, Any]) -> None:
    assert set(body) == {"id", "version", "responsetime", "response", "errors"}
    assert body["id"] == "openg2p.idgenerator"
    assert body["version"] == "1.0"
    assert RESPONSE_TIME.match(body["responsetime"])


def assert_error(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status
    body = reply.json()
    assert_envelope(body)
    assert body["response"] is None
    assert body["errors"][0]["errorCode"] == code
    assert body["errors"][0]["message"]


@both_servers
async def test_allocate_returns_keys_in_order_in_the_envelope(
    client: httpx.AsyncClient, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    await fill(hot, "farmer", ["3029384756", "2013023805"])
    first = await client.post("/v1/idgenerator/farmer/id")
    second = await client.post("/v1/idgenerator/farmer/id")
    assert first.status_code == 200
    assert_envelope(first.json())
    assert first.json()["response"] == {"id": "3029384756"}
    assert first.json()["errors"] == []
    assert second.json()["response"] == {"id": "2013023805"}


@both_servers
async def test_empty_pool_is_idg001_with_retry_after_and_nudges_keysync(
    client: httpx.AsyncClient, redis_client: aioredis.Redis
) -> None:
    reply = await client.post("/v1/idgenerator/farmer/id")
    assert_error(reply, 503, "IDG-001")
    assert int(reply.headers["Retry-After"]) >= 1
    # The nudge is sent beside the answer, not before it: wait for it (with a deadline).
    deadline = asyncio.get_running_loop().time() + 5
    while not await redis_client.lrange(redis_keys.keysync_wake_key(NS), 0, -1):
        assert asyncio.get_running_loop().time() < deadline, "keysync was not nudged"
        await asyncio.sleep(0.02)
    assert await redis_client.lrange(redis_keys.keysync_wake_key(NS), 0, -1) == ["farmer"]


@both_servers
async def test_unknown_type_is_idg003(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/idgenerator/nosuchtype/id"), 404, "IDG-003")
    assert_error(await client.post("/v1/keys/nosuchtype"), 404, "IDG-003")
    assert_error(await client.get("/v1/idgenerator/nosuchtype/id/validate/123"), 404, "IDG-003")


@both_servers
async def test_malformed_path_values_are_422(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/idgenerator/Bad-Type!/id"), 422, "IDG-004")
    assert_error(await client.get("/v1/idgenerator/farmer/id/validate/12ab45"), 422, "IDG-004")
    long_value = "1" * 300
    assert_error(
        await client.get(f"/v1/idgenerator/farmer/id/validate/{long_value}"), 422, "IDG-004"
    )


async def test_validate(client: httpx.AsyncClient) -> None:
    good = await client.get("/v1/idgenerator/farmer/id/validate/3029384756")
    assert good.status_code == 200
    assert_envelope(good.json())
    assert good.json()["response"] == {"id": "3029384756", "valid": True}
    for bad in ("3029384757", "302938475", "2013564809"):
        reply = await client.get(f"/v1/idgenerator/farmer/id/validate/{bad}")
        assert reply.status_code == 200
        assert reply.json()["response"] == {"id": bad, "valid": False}
    short = await client.get("/v1/idgenerator/shortlink/id/validate/aZ09xYq")
    assert short.json()["response"]["valid"] is True


@both_servers
async def test_batch_endpoint(
    client: httpx.AsyncClient, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    await fill(hot, "shortlink", [f"k{i:06d}" for i in range(50)])
    reply = await client.post("/v1/keys/shortlink", params={"count": 20})
    assert reply.status_code == 200
    assert reply.json() == {"keys": [f"k{i:06d}" for i in range(20)]}
    partial = await client.post("/v1/keys/shortlink", params={"count": 1000})
    assert len(partial.json()["keys"]) == 30  # what is left, never more
    assert_error(await client.post("/v1/keys/shortlink", params={"count": 1}), 503, "IDG-001")


@pytest.mark.parametrize("count", ["0", "-1", "abc", "1001", "1.5"])
async def test_batch_count_out_of_range_is_422(client: httpx.AsyncClient, count: str) -> None:
    assert_error(await client.post("/v1/keys/farmer", params={"count": count}), 422, "IDG-004")


async def test_health_version_config(client: httpx.AsyncClient) -> None:
    health = await client.get("/v1/idgenerator/health")
    assert health.status_code == 200 and health.json()["response"] == {"status": "UP"}
    version = await client.get("/v1/idgenerator/version")
    assert version.json()["response"]["version"]
    config = (await client.get("/v1/idgenerator/config")).json()["response"]
    assert config["id_types"]["farmer"]["length"] == 10
    assert config["id_types"]["shortlink"]["kind"] == "base62"
    assert "permutation" not in str(config)


async def test_liveness_and_readiness(
    client: httpx.AsyncClient, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """Ready means this process can serve: empty or used-up types stay in the body."""
    assert (await client.get("/healthz")).status_code == 200
    await hot.mark_exhausted("shortlink")
    empty = await client.get("/readyz")
    assert empty.status_code == 200 and empty.json()["ready"] is True
    assert empty.json()["types"] == {
        "farmer": {"hot_depth": 0, "state": "empty"},
        "shortlink": {"hot_depth": 0, "state": "exhausted"},
    }
    await fill(hot, "farmer", ["3029384756"])
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["types"]["farmer"] == {"hot_depth": 1, "state": "serving"}
    metrics = (await client.get("/metrics")).text
    assert 'kd_type_serving{id_type="farmer"} 1.0' in metrics
    assert 'kd_type_serving{id_type="shortlink"} 0.0' in metrics
    assert "kd_redis_up 1.0" in metrics


@both_servers
async def test_unknown_routes_and_methods(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/nowhere"), 404, "IDG-006")
    assert_error(await client.get("/v1/idgenerator/farmer/id"), 405, "IDG-007")


async def test_redis_down_is_503_in_the_envelope(settings: Settings) -> None:
    dead = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    async with dispenser_in_process(dead) as http:
        reply = await http.post("/v1/idgenerator/farmer/id")
    assert_error(reply, 503, "IDG-005")
    assert reply.headers["Retry-After"] == "1"


async def test_the_fast_path_answers_while_the_service_is_up(
    settings: Settings, hot: HotStore
) -> None:
    """The app's lifespan hands the fast path its answer once the service is built, and
    takes it back when it stops: no request is answered by a service that has closed."""
    await fill(hot, "farmer", ["3029384756"])
    app = create_app(settings)
    assert app.serving.single is None  # before start-up: the routes answer
    starlette = app.app
    async with starlette.router.lifespan_context(starlette):
        assert app.serving.single is not None
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://d") as http:
            reply = await http.post("/v1/idgenerator/farmer/id")
        assert reply.json()["response"] == {"id": "3029384756"}
    assert app.serving.single is None


@both_servers
async def test_metrics_count_what_happened(client: httpx.AsyncClient, hot: HotStore) -> None:
    await fill(hot, "farmer", ["3029384756", "2013023805", "3794627158"])
    await client.post("/v1/idgenerator/farmer/id")
    await client.post("/v1/keys/farmer", params={"count": 2})
    await client.post("/v1/idgenerator/farmer/id")  # empty now: IDG-001
    await client.post("/v1/idgenerator/nosuch/id")  # IDG-003
    reply = await client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    assert 'kd_keys_issued_total{id_type="farmer"} 3.0' in text
    assert 'kd_request_errors_total{code="IDG-001"} 1.0' in text
    assert 'kd_request_errors_total{code="IDG-003"} 1.0' in text
    assert 'kd_hot_depth{id_type="farmer"} 0.0' in text
    assert 'kd_hot_low_watermark{id_type="farmer"} 200.0' in text
    assert 'kd_keysync_nudges_total{id_type="farmer"}' in text
    assert 'kd_request_seconds_count{route="/v1/idgenerator/{id_type}/id"} 3.0' in text
