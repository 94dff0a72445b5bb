"""A keyspace is issued completely, exactly once, then answers IDG-002; warnings come first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import (
    Servers,
    dispenser_in_process,
    dispenser_over_http,
    make_settings,
)

TINY = {
    "kind": "numeric",
    "length": 4,
    "filter_profile": "none",
    "range_size": 128,
    "hot": {"low": 100, "high": 400},
    "cold": {"low": 2_000, "high": 4_000},
    "sync_batch": 150,
    "headroom_warnings": [0.5, 0.1],
}


@pytest.fixture
async def tiny_settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    settings = make_settings(servers, database, id_types={"tiny": TINY, **small_types()})
    await run_migrate(settings)
    return settings


@pytest.fixture
async def http(tiny_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with dispenser_over_http(tiny_settings) as client:
        yield client


async def test_tiny_keyspace_is_issued_completely_then_410(
    tiny_settings: Settings,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    sync: SyncRecord,
) -> None:
    cold = await ColdStore.connect(tiny_settings.postgres_dsn)
    hot = HotStore.from_settings(tiny_settings)
    generator = Generator(2)
    try:
        keygen = Keygen.on_postgres(tiny_settings, cold, sync, asyncio.Event(), generator)
        keysync = Keysync(
            tiny_settings, GuardedCold(cold, sync, build_id_types(tiny_settings)), hot
        )
        tiny = build_id_types(tiny_settings)["tiny"]
        with caplog.at_level(logging.WARNING):
            while await keygen.lease_and_generate(tiny):
                pass
        warned = [r for r in caplog.records if r.getMessage() == "keyspace_headroom_low"]
        assert [r.__dict__["threshold"] for r in warned] == [0.5, 0.1]
        assert keygen.exhausted("tiny")

        taken: list[str] = []
        for _ in range(20):
            await keysync.refill(build_id_types(tiny_settings)["tiny"])
            reply = await http.post("/v1/keys/tiny", params={"count": 1000})
            if reply.status_code != 200:
                break
            taken.extend(reply.json()["keys"])
        assert reply.status_code == 410
        assert reply.json()["errors"][0]["errorCode"] == "IDG-002"
        assert sorted(k[:3] for k in taken) == [f"{n:03d}" for n in range(1000)]
        assert all(tiny.validate(k) for k in taken)

        single = await http.post("/v1/idgenerator/tiny/id")
        assert single.status_code == 410
        assert single.json()["errors"][0]["errorCode"] == "IDG-002"
        other = await http.post("/v1/idgenerator/farmer/id")  # other types unaffected
        assert other.json()["errors"][0]["errorCode"] == "IDG-001"
    finally:
        generator.close()
        await cold.close()
        await hot.close()


async def test_headroom_is_exported_as_metrics(tiny_settings: Settings, sync: SyncRecord) -> None:
    cold = await ColdStore.connect(tiny_settings.postgres_dsn)
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(tiny_settings, cold, sync, asyncio.Event(), generator)
        tiny = build_id_types(tiny_settings)["tiny"]
        await keygen.lease_and_generate(tiny)
        seen = await keygen.watch_headroom(tiny)
        assert seen.counters_left == 1000 - 128
        assert seen.estimated_keys_left == 1000 - 128  # profile none accepts everything
        registry = keygen.metrics.registry
        value = registry.get_sample_value("kd_keyspace_counters_headroom", {"id_type": "tiny"})
        assert value == 1000 - 128
    finally:
        generator.close()
        await cold.close()


async def test_validate_endpoint_knows_affixes_and_profiles(
    servers: Servers, database: str, redis_client: aioredis.Redis
) -> None:
    types = {
        "member": {"kind": "numeric", "length": 10, "prefix": "FAR-"},
        "uin": {"kind": "numeric", "length": 10, "filter_profile": "mosip"},
    }
    settings = make_settings(servers, database, id_types=types)
    async with dispenser_in_process(settings) as client:

        async def valid(name: str, value: str) -> bool:
            reply = await client.get(f"/v1/idgenerator/{name}/id/validate/{value}")
            assert reply.status_code == 200, reply.text
            return bool(reply.json()["response"]["valid"])

        assert await valid("member", "FAR-3029384756")
        assert not await valid("member", "3029384756")  # prefix missing
        # 5890... wraps 8-9-0: a sequence for mosip only; check digit is right.
        from shared.domain.checkdigit import verhoeff_digit

        wrapped = "358903742" + verhoeff_digit("358903742")
        assert await valid("uin", "3029384756")
        assert not await valid("uin", wrapped)
        member_types = build_id_types(settings, generating=False)
        assert member_types["member"].validate("FAR-3029384756")
