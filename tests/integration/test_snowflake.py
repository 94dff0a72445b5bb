"""Snowflake types over real HTTP, with machine-ID leases in real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.fill import fill
from shared.cli import main as cli
from shared.cli.status import collect_status, format_status
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import ConfigError
from shared.domain.snowflake import SnowflakeType, build_snowflake_types, wall_clock_ms
from shared.stores.postgres import sql
from shared.stores.postgres.databases import run_migrate
from tests.conftest import NS, small_types
from tests.integration.fixtures import (
    Servers,
    both_servers,
    dispenser_over_http,
    end_lease_settling,
    make_settings,
)

EVENTS = "events"
# A short TTL keeps the test of a lost lease short (renewals every 0.5 s).
EVENTS_CONFIG: dict[str, Any] = {
    "kind": "snowflake",
    "lease_ttl_s": 2.0,
    "lease_renew_s": 0.5,
    "machine_ids": {"min": 0, "max": 63},
    "aliases": ["evt"],
}
DEADLINE_S = 10.0


@pytest.fixture
async def snowflake_settings(
    servers: Servers, database: str, redis_client: aioredis.Redis
) -> Settings:
    """The test types plus a snowflake type; the settle period the fence's first use
    starts (no machine ID granted for one TTL) is ended by hand."""
    await end_lease_settling(servers.redis_url, redis_client)
    return make_settings(servers, database, id_types={**small_types(), EVENTS: EVENTS_CONFIG})


@pytest.fixture
async def client(snowflake_settings: Settings, server: str) -> AsyncIterator[httpx.AsyncClient]:
    async with dispenser_over_http(snowflake_settings, server) as http:
        yield http


def events(settings: Settings) -> SnowflakeType:
    return build_snowflake_types(settings)[EVENTS]


async def answered(client: httpx.AsyncClient, path: str, **params: int) -> httpx.Response:
    """POST ``path`` as a client would: a 503 (no lease yet, or one lost to a renewal
    late on a loaded machine) is asked again after its Retry-After, up to DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while (reply := await client.post(path, params=params)).status_code == 503:
        assert time.monotonic() < deadline, reply.text
        await asyncio.sleep(min(float(reply.headers.get("Retry-After", "1")), 0.2))
    assert reply.status_code == 200, reply.text
    return reply


async def one(client: httpx.AsyncClient) -> str:
    key: str = (await answered(client, f"/v1/idgenerator/{EVENTS}/id")).json()["response"]["id"]
    return key


async def batch(client: httpx.AsyncClient, count: int) -> list[str]:
    keys: list[str] = (await answered(client, f"/v1/keys/{EVENTS}", count=count)).json()["keys"]
    return keys


async def leased(client: httpx.AsyncClient) -> int:
    """Wait (up to DEADLINE_S) until the dispenser holds a machine ID for EVENTS."""
    deadline = time.monotonic() + DEADLINE_S
    while (
        machine := (await client.get("/readyz")).json()["types"][EVENTS].get("machine_id")
    ) is None:
        assert time.monotonic() < deadline, "no machine ID leased"
        await asyncio.sleep(0.05)
    return int(machine)


def error_code(reply: httpx.Response) -> str:
    code: str = reply.json()["errors"][0]["errorCode"]
    return code


@both_servers  # minting in each worker process, behind either server
async def test_single_batch_validate_and_decode(
    client: httpx.AsyncClient, snowflake_settings: Settings
) -> None:
    before = wall_clock_ms()
    first = await one(client)
    keys = await batch(client, 500)
    values = [int(first), *map(int, keys)]
    assert values == sorted(set(values)) and len(keys) == 500
    ready = (await client.get("/readyz")).json()["types"][EVENTS]
    assert ready["state"] == "serving"
    decoded = (await client.get(f"/v1/idgenerator/{EVENTS}/id/{first}/decode")).json()
    assert decoded["response"]["machine"] == ready["machine_id"]
    assert before <= decoded["response"]["time_ms"] <= wall_clock_ms()
    assert decoded["response"]["time"].endswith("Z")
    by_alias = await client.get(f"/v1/idgenerator/evt/id/{first}/decode")
    assert by_alias.status_code == 200 and by_alias.json()["response"] == decoded["response"]
    valid = await client.get(f"/v1/idgenerator/{EVENTS}/id/validate/{keys[-1]}")
    assert valid.json()["response"] == {"id": keys[-1], "valid": True}
    leading_zero = await client.get(f"/v1/idgenerator/{EVENTS}/id/validate/0{keys[-1]}")
    assert leading_zero.json()["response"]["valid"] is False
    malformed = await client.get(f"/v1/idgenerator/{EVENTS}/id/abc/decode")
    assert malformed.status_code == 422 and error_code(malformed) == "IDG-004"
    not_snowflake = await client.get("/v1/idgenerator/farmer/id/3029384756/decode")
    assert not_snowflake.status_code == 422
    replayable = await client.post(f"/v1/keys/{EVENTS}", headers={"Idempotency-Key": "k1"})
    assert replayable.status_code == 422 and "Idempotency-Key" in replayable.text
    no_ledger = await client.get(f"/v1/keys/{EVENTS}/{first}")
    assert no_ledger.status_code == 409 and error_code(no_ledger) == "IDG-011"
    config = (await client.get("/v1/idgenerator/config")).json()["response"]["id_types"]
    assert config[EVENTS]["kind"] == "snowflake" and config[EVENTS]["id_length"] == 19


async def test_two_dispensers_lease_distinct_ids_and_never_mint_the_same(
    snowflake_settings: Settings,
) -> None:
    async with (
        dispenser_over_http(snowflake_settings) as a,
        dispenser_over_http(snowflake_settings) as b,
    ):
        rounds = await asyncio.gather(*(batch(c, 1_000) for c in (a, b) for _ in range(5)))
        singles = await asyncio.gather(*(one(c) for c in (a, b) for _ in range(50)))
        machines = {(await c.get("/readyz")).json()["types"][EVENTS]["machine_id"] for c in (a, b)}
    minted = [k for keys in rounds for k in keys] + singles
    assert len(minted) == len(set(minted)) == 10_100
    assert len(machines) == 2
    snowflake = events(snowflake_settings)
    assert {snowflake.decode(k).machine for k in minted} == machines


async def test_a_lost_lease_answers_503_then_recovers(
    client: httpx.AsyncClient, redis_client: aioredis.Redis
) -> None:
    """A new Redis identity (as after a failover: simulated by overwriting the fence's
    owner token) loses the lease at the next renewal; no ID is granted for one TTL."""
    before = int(await one(client))
    await redis_client.set(redis_keys.fence_key(NS), "another-server:another-replid")
    deadline = time.monotonic() + DEADLINE_S
    refused = None
    while refused is None:
        assert time.monotonic() < deadline, "the lost lease was never noticed"
        reply = await client.post(f"/v1/idgenerator/{EVENTS}/id")
        if reply.status_code == 503:
            refused = reply
        else:
            before = max(before, int(reply.json()["response"]["id"]))
            await asyncio.sleep(0.02)
    assert error_code(refused) in ("IDG-016", "IDG-015")
    assert refused.headers["Retry-After"]
    while (reply := await client.post(f"/v1/idgenerator/{EVENTS}/id")).status_code != 200:
        assert time.monotonic() < deadline, f"no recovery: {reply.text}"
        await asyncio.sleep(0.05)
    assert int(reply.json()["response"]["id"]) > before
    lost = (await client.get("/metrics")).text
    assert f'kd_snowflake_leases_lost_total{{id_type="{EVENTS}"}} 1.0' in lost


async def test_the_last_time_issued_outlives_the_process(
    servers: Servers, database: str, snowflake_settings: Settings
) -> None:
    """Released with the last time issued: the next holder of the ID refuses (503
    IDG-015) while its clock is behind that time, and mints above it."""
    one_id = {**EVENTS_CONFIG, "machine_ids": {"min": 5, "max": 5}}
    settings = make_settings(servers, database, id_types={EVENTS: one_id})
    async with dispenser_over_http(settings) as first:
        minted = await batch(first, 100)
    async with dispenser_over_http(settings, clock=lambda: wall_clock_ms() - 2_000) as behind:
        await leased(behind)  # refused for its clock, not for want of a lease
        reply = await behind.post(f"/v1/idgenerator/{EVENTS}/id")
    assert reply.status_code == 503 and error_code(reply) == "IDG-015", reply.text
    async with dispenser_over_http(settings) as later:
        after = await one(later)
    assert int(after) > int(minted[-1])
    assert events(settings).decode(after).machine == 5


async def test_decode_command(
    snowflake_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"id_types": {EVENTS: EVENTS_CONFIG}}))
    snowflake = events(snowflake_settings)
    value = snowflake.layout.encode(snowflake.layout.compose(1_700_000_000_123, 9, 4))
    cli.main(["--config", str(config), "decode", "--type", EVENTS, value])
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "id": value,
        "time": "2023-11-14T22:13:20.123Z",
        "time_ms": 1_700_000_000_123,
        "machine": 9,
        "sequence": 4,
    }


async def test_migrate_status_and_fill_handle_snowflake_types(
    snowflake_settings: Settings,
) -> None:
    assert await run_migrate(snowflake_settings) >= 1
    conn = await asyncpg.connect(snowflake_settings.postgres_dsn)
    try:
        assert not await conn.fetchval(sql.SELECT_TABLE_EXISTS, sql.cold_table_name(EVENTS))
        assert await conn.fetchval(sql.SELECT_FINGERPRINT, EVENTS) is None
    finally:
        await conn.close()
    report = await collect_status(snowflake_settings)
    assert set(report["id_types"]) == {"farmer", "shortlink"}
    assert report["snowflake_types"][EVENTS]["machine_ids"] == [0, 63]
    assert "snowflake (decimal): no inventory" in format_status(report)
    with pytest.raises(ConfigError, match="minted, not filled"):
        await fill(snowflake_settings, EVENTS, 10)
