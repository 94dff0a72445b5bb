"""Idempotency-Key: a retried request gets the same key(s) and consumes nothing more."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.integration.fixtures import dispenser_over_http


@pytest.fixture
async def client(settings: Settings, hot: HotStore) -> AsyncIterator[httpx.AsyncClient]:
    await hot.push("farmer", [f"f{i:03d}" for i in range(100)], uuid.uuid4().hex)
    await hot.push("shortlink", [f"s{i:03d}" for i in range(100)], uuid.uuid4().hex)
    async with dispenser_over_http(settings) as http:
        yield http


def key_header(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


async def test_a_retry_gets_the_same_id_and_consumes_nothing(
    client: httpx.AsyncClient, hot: HotStore
) -> None:
    first = await client.post("/v1/idgenerator/farmer/id", headers=key_header("req-1"))
    again = await client.post("/v1/idgenerator/farmer/id", headers=key_header("req-1"))
    assert first.status_code == again.status_code == 200
    assert first.json()["response"] == again.json()["response"] == {"id": "f000"}
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await hot.depth("farmer") == 99
    other = await client.post("/v1/idgenerator/farmer/id", headers=key_header("req-2"))
    assert other.json()["response"] == {"id": "f001"}


async def test_batches_replay_too(client: httpx.AsyncClient, hot: HotStore) -> None:
    params = {"count": 5}
    first = await client.post("/v1/keys/shortlink", params=params, headers=key_header("b-1"))
    again = await client.post("/v1/keys/shortlink", params=params, headers=key_header("b-1"))
    assert first.json() == again.json() == {"keys": [f"s{i:03d}" for i in range(5)]}
    assert await hot.depth("shortlink") == 95


async def test_concurrent_requests_with_one_key_get_one_answer(
    client: httpx.AsyncClient, hot: HotStore
) -> None:
    replies = await asyncio.gather(
        *(
            client.post("/v1/keys/farmer", params={"count": 3}, headers=key_header("same"))
            for _ in range(20)
        )
    )
    bodies = {tuple(r.json()["keys"]) for r in replies}
    assert len(bodies) == 1
    assert await hot.depth("farmer") == 97


@pytest.mark.parametrize(
    ("path", "params"),
    [("/v1/keys/shortlink", {"count": 1}), ("/v1/keys/farmer", {"count": 2})],
)
async def test_the_same_key_for_another_request_is_422(
    client: httpx.AsyncClient, path: str, params: dict[str, int]
) -> None:
    await client.post("/v1/keys/farmer", params={"count": 1}, headers=key_header("k"))
    reply = await client.post(path, params=params, headers=key_header("k"))
    assert reply.status_code == 422
    assert reply.json()["errors"][0]["errorCode"] == "IDG-004"
    assert "Idempotency-Key" in reply.json()["errors"][0]["message"]


@pytest.mark.parametrize("bad", ["", "x" * 256, "has space", "tab\there"])
async def test_malformed_idempotency_keys_are_422(client: httpx.AsyncClient, bad: str) -> None:
    reply = await client.post("/v1/idgenerator/farmer/id", headers=key_header(bad))
    assert reply.status_code == 422


async def test_an_empty_pool_is_not_remembered(settings: Settings, hot: HotStore) -> None:
    async with dispenser_over_http(settings) as client:
        empty = await client.post("/v1/idgenerator/farmer/id", headers=key_header("late"))
        assert empty.status_code == 503
        await hot.push("farmer", ["f-late"], uuid.uuid4().hex)
        served = await client.post("/v1/idgenerator/farmer/id", headers=key_header("late"))
        assert served.json()["response"] == {"id": "f-late"}
