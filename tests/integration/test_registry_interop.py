"""A registry's functional IDs over real HTTP, PostgreSQL and Redis: its own type codes
as aliases, and sequential (guessable, FAR-00001 style) numbers through the unchanged
pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

MARKS = {
    "range_size": 100,
    "hot": {"low": 20, "high": 100},
    "cold": {"low": 250, "high": 300},
    "sync_batch": 50,
}


def registry_types() -> dict[str, Any]:
    types = small_types()
    types["farmer"]["aliases"] = ["FRM"]
    types["farmer_no"] = {
        "kind": "numeric",
        "length": 5,
        "order": "sequential",
        "check_digit": "none",
        "prefix": "FAR-",
        "aliases": ["FAR-", "far"],
        "ledger": True,
        **MARKS,
    }
    return types


@asynccontextmanager
async def filled(
    settings: Settings, sync: SyncRecord, hot: HotStore
) -> AsyncIterator[tuple[Keygen, Keysync]]:
    """Migrated, the cold tables filled by keygen, the hot lists by keysync."""
    await run_migrate(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        keysync = Keysync(settings, GuardedCold(cold, sync, build_id_types(settings)), hot)
        await keysync.refill_all()
        yield keygen, keysync
    finally:
        await cold.close()


async def take_one(client: httpx.AsyncClient, segment: str) -> str:
    reply = await client.post(f"/v1/idgenerator/{segment}/id")
    assert reply.status_code == 200, reply.text
    key: str = reply.json()["response"]["id"]
    return key


async def test_sequential_ids_come_out_in_order_through_aliases_over_http(
    servers: Servers, database: str, sync: SyncRecord, hot: HotStore
) -> None:
    settings = make_settings(servers, database, id_types=registry_types())
    types = build_id_types(settings, generating=False)
    async with (
        filled(settings, sync, hot) as (keygen, keysync),
        dispenser_over_http(settings) as client,
    ):
        singles = [await take_one(client, "FAR-") for _ in range(30)]
        singles += [await take_one(client, segment) for segment in ("far", "farmer_no")]
        batch = await client.post("/v1/keys/FAR-", params={"count": "68"})
        assert batch.status_code == 200
        issued = singles + batch.json()["keys"]
        # The cold table's freed space is reused: a new range lands before older keys.
        await vacuum(settings, "farmer_no")
        while await keygen.step():
            pass
        await keysync.refill(types["farmer_no"])  # the next batches continue the sequence
        issued += [await take_one(client, "FAR-") for _ in range(60)]
    assert issued == [f"FAR-{n:05d}" for n in range(160)]


async def vacuum(settings: Settings, name: str) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(f"VACUUM {sql.cold_table(name)}")
    finally:
        await conn.close()


async def test_aliases_resolve_on_every_route_and_answers_name_the_type(
    servers: Servers, database: str, sync: SyncRecord, hot: HotStore
) -> None:
    settings = make_settings(servers, database, id_types=registry_types())
    async with filled(settings, sync, hot), dispenser_over_http(settings) as client:
        farmer = await take_one(client, "FRM")  # the fast path
        assert types_of(settings)["farmer"].validate(farmer)
        idem = await client.post("/v1/idgenerator/FRM/id", headers={"Idempotency-Key": "r1"})
        again = await client.post("/v1/idgenerator/farmer/id", headers={"Idempotency-Key": "r1"})
        assert again.json()["response"] == idem.json()["response"]  # one type, one record
        assert again.headers["Idempotent-Replayed"] == "true"
        valid = await client.get("/v1/idgenerator/FAR-/id/validate/FAR-00017")
        assert valid.json()["response"] == {"id": "FAR-00017", "valid": True}
        used = await client.post("/v1/idgenerator/FAR-/id/FAR-00001/used")
        assert used.status_code == 202
        assert (await client.post("/v1/keys/FAR-/used", json={"keys": ["FAR-00002"]})).json() == {
            "accepted": 1
        }
        lookup = await client.get("/v1/keys/FAR-/FAR-00003")
        assert lookup.status_code == 200 and lookup.json()["id_type"] == "farmer_no"
        no_ledger = await client.get(f"/v1/keys/FRM/{farmer}")
        assert no_ledger.status_code == 409 and "'farmer'" in no_ledger.text
        unknown = await client.post("/v1/idgenerator/FAR/id")  # not a configured alias
        assert unknown.status_code == 422
        config = (await client.get("/v1/idgenerator/config")).json()["response"]["id_types"]
        openapi = (await client.get("/openapi.json")).json()
    assert set(config) == {"farmer", "shortlink", "farmer_no"}
    assert config["farmer_no"]["aliases"] == ["FAR-", "far"]
    assert config["farmer_no"]["order"] == "sequential"
    assert config["farmer_no"]["check_digit"] == "none"
    assert config["farmer"]["aliases"] == ["FRM"] and config["shortlink"]["aliases"] == []
    allocate = openapi["paths"]["/v1/idgenerator/{id_type}/id"]["post"]["parameters"][0]
    assert {"FAR-", "far", "FRM", "farmer"} <= set(allocate["schema"]["enum"])


def types_of(settings: Settings) -> dict[str, Any]:
    return build_id_types(settings, generating=False)
