"""A Crockford base32 type (``kind: crockford32``) through the whole pipeline, over real
HTTP, PostgreSQL and Redis: keygen generates its keys, keysync moves them, the
dispenser hands them out; a client may then write one as the encoding reads it (either
case, I and L for 1, O for 0, hyphens anywhere) when it validates it, looks it up in the
ledger, marks it used or changes its status through MOSIP's PUT, and the ledger holds
it as it was generated."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import httpx

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.ledger import LedgerDrain
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.formats.crockford32 import check_symbol, decoded
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

PREFIX = "TK-"
TICKET = {
    "kind": "crockford32",
    "length": 9,  # eight symbols of counter and the check symbol
    "prefix": PREFIX,
    "ledger": True,
    "range_size": 1_000,
    "hot": {"low": 20, "high": 100},
    "cold": {"low": 250, "high": 400},
    "sync_batch": 50,
}
DRAIN_DEADLINE_S = 10.0


def ticket_settings(servers: Servers, database: str) -> Settings:
    types = small_types() | {"ticket": TICKET}
    return make_settings(servers, database, id_types=types, dispenser={"mosip": {"uin": "ticket"}})


def as_typed(key: str) -> str:
    """``key`` as a person might type it: lower case, in groups of three, the look-alike
    letters for 1 and 0."""
    core = key.removeprefix(PREFIX).lower().replace("1", "l").replace("0", "O")
    return PREFIX + "-".join(core[i : i + 3] for i in range(0, len(core), 3))


@contextlib.asynccontextmanager
async def pipeline(
    servers: Servers, database: str, sync: SyncRecord, hot: HotStore
) -> AsyncIterator[tuple[httpx.AsyncClient, Settings]]:
    """keygen's keys moved to the hot list by keysync, the ledger drained as keysync
    drains it, and a dispenser over HTTP."""
    settings = ticket_settings(servers, database)
    await run_migrate(settings)
    types = build_id_types(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
    while await keygen.step():
        pass
    await Keysync(settings, GuardedCold(cold, sync, types), hot).refill(types["ticket"])
    drain = LedgerDrain(LedgerStream(hot.endpoint, hot.namespace), cold, types, "t", 1_000)
    stop = asyncio.Event()

    async def draining() -> None:
        while not stop.is_set():
            await drain.drain_once(block_ms=20)

    task = asyncio.create_task(draining())
    try:
        async with dispenser_over_http(settings) as http:
            yield http, settings
    finally:
        stop.set()
        await task
        await cold.close()


async def ledger_row(settings: Settings, key: str) -> asyncpg.Record | None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        query = sql.for_type("SELECT * FROM {ledger} WHERE key = $1", "ticket")
        row: asyncpg.Record | None = await conn.fetchrow(query, key)
        return row
    finally:
        await conn.close()


async def issued(http: httpx.AsyncClient, key: str) -> dict[str, object]:
    """The ledger's answer for ``key``, once keysync has applied its issue."""
    deadline = asyncio.get_running_loop().time() + DRAIN_DEADLINE_S
    while True:
        reply = await http.get(f"/v1/keys/ticket/{key}")
        assert reply.status_code == 200, reply.text
        entry: dict[str, object] = reply.json()
        if entry["issued"] or asyncio.get_running_loop().time() > deadline:
            return entry
        await asyncio.sleep(0.05)


def well_formed(key: str) -> bool:
    core = key.removeprefix(PREFIX)
    return key.startswith(PREFIX) and core[-1] == check_symbol(decoded(core[:-1]))


async def test_keygen_generates_the_dispenser_hands_out_and_any_spelling_validates(
    servers: Servers, database: str, sync: SyncRecord, hot: HotStore
) -> None:
    async with pipeline(servers, database, sync, hot) as (http, _):
        one = await http.post("/v1/idgenerator/ticket/id")
        assert one.status_code == 200, one.text
        batch = await http.post("/v1/keys/ticket", params={"count": "20"})
        keys = [one.json()["response"]["id"], *batch.json()["keys"]]
        assert len(set(keys)) == 21 and all(well_formed(key) for key in keys)
        for key in keys[:5]:
            for written in (key, key.lower().replace("tk-", PREFIX), as_typed(key)):
                reply = await http.get(f"/v1/idgenerator/ticket/id/validate/{written}")
                assert reply.json()["response"] == {"id": written, "valid": True}
        core = keys[0].removeprefix(PREFIX)
        wrong = PREFIX + core[:-1] + ("0" if core[-1] != "0" else "1")  # check symbol off
        reply = await http.get(f"/v1/idgenerator/ticket/id/validate/{wrong}")
        assert reply.json()["response"]["valid"] is False
        refused = await http.get(f"/v1/idgenerator/ticket/id/validate/{PREFIX}{core[:-1]}_")
        assert refused.status_code == 422  # no character the encoding reads


async def test_the_ledger_and_mosip_read_a_key_as_typed_and_hold_it_as_generated(
    servers: Servers, database: str, sync: SyncRecord, hot: HotStore
) -> None:
    async with pipeline(servers, database, sync, hot) as (http, settings):
        first = (await http.post("/v1/idgenerator/ticket/id")).json()["response"]["id"]
        entry = await issued(http, as_typed(first))
        assert entry["issued"] is True and entry["key"] == first
        # Marked used as typed: recorded under the key as generated.
        used = await http.post(f"/v1/idgenerator/ticket/id/{as_typed(first)}/used")
        assert used.status_code == 202 and used.json()["response"]["id"] == first
        deadline = asyncio.get_running_loop().time() + DRAIN_DEADLINE_S
        while not (await issued(http, first))["used"]:
            assert asyncio.get_running_loop().time() < deadline, "the mark of use never applied"
            await asyncio.sleep(0.05)
        # MOSIP's PUT, the UIN typed: answered and recorded as generated.
        second = (await http.get("/v1/idgenerator/uin")).json()["response"]["uin"]
        await issued(http, second)
        request = {"id": "mosip.kernel.uinservice", "version": "1.0", "metadata": {}}
        change = {"uin": as_typed(second), "status": "UNASSIGNED"}
        reply = await http.put("/v1/idgenerator/uin", json=request | {"request": change})
        assert reply.json()["response"] == {"uin": second, "status": "UNASSIGNED"}
        row = await ledger_row(settings, second)
        assert row is not None and row["released_at"] is not None
        assert await ledger_row(settings, as_typed(second)) is None
        # Any other spelling names the same key in the ledger.
        again = await http.get(f"/v1/keys/ticket/{second.lower().replace('tk-', PREFIX)}")
        assert again.json()["released"] is True and again.json()["key"] == second
