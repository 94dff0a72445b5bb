"""The PostgreSQL roles of deploy/postgres/roles.sql are enough for each process, and
no more: every process runs its real work as its own role on a database set up by the
script, and a reading role cannot write."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.ledger import LedgerDrain
from keysync.main import Keysync
from shared.cli.databases import drop_database, dsn_with_database, run_migrate, scratch_database
from shared.cli.status import collect_status
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.reader import LedgerReader
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS, Servers, make_settings, small_types

ROLES = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "roles.sql"


def as_role(dsn: str, role: str) -> str:
    """``dsn`` logging in as ``role`` (trust authentication on the test servers)."""
    scheme, rest = dsn.split("://", 1)
    return f"{scheme}://{role}@{rest.rpartition('@')[2]}"


@pytest.fixture
async def database_with_roles(servers: Servers) -> AsyncIterator[str]:
    name = f"kd_roles_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = await scratch_database(servers.postgres_admin_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(ROLES.read_text())
        await conn.execute(ROLES.read_text())  # idempotent
    finally:
        await conn.close()
    try:
        yield dsn
    finally:
        await drop_database(servers.postgres_admin_dsn, name)


def role_settings(servers: Servers, dsn: str, role: str) -> Settings:
    types: dict[str, Any] = small_types()
    types["shortlink"]["ledger"] = True
    database = dsn.rsplit("/", 1)[1]
    return make_settings(
        servers,
        database,
        postgres_dsn=as_role(dsn_with_database(dsn, database), role),
        id_types=types,
    )


async def test_each_process_works_as_its_own_role(
    servers: Servers, database_with_roles: str, redis_client: aioredis.Redis
) -> None:
    dsn = database_with_roles
    await run_migrate(role_settings(servers, dsn, "kd_owner"))
    keygen_settings = role_settings(servers, dsn, "kd_keygen")
    keysync_settings = role_settings(servers, dsn, "kd_keysync")
    types = build_id_types(keygen_settings)
    sync = SyncRecord.from_settings(keygen_settings)
    hot = HotStore.from_settings(keygen_settings)
    keygen_cold = await ColdStore.connect(keygen_settings.postgres_dsn)
    keysync_cold = await ColdStore.connect(keysync_settings.postgres_dsn)
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(keygen_settings, keygen_cold, sync, asyncio.Event(), generator)
        assert await keygen.lease_and_generate(types["shortlink"]) > 0
        guarded = GuardedCold(keysync_cold, sync, types)
        assert await Keysync(keysync_settings, guarded, hot).refill(types["shortlink"]) > 0
        popped = await hot.pop("shortlink", 3, ledger=True)
        drain = LedgerDrain(
            LedgerStream(hot.endpoint, NS), keysync_cold, types, "keysync-as-role", 100
        )
        await drain.drain_once(block_ms=10)
        while (await drain.drain_once(block_ms=10)) is not None:
            pass
        # A fence, as keysync's role: discard, move sequences, record the event.
        await redis_client.hset(redis_keys.sync_record_key(NS), "fence_needed", "1")
        report = await settle(keysync_cold, sync)
        assert report is not None and report.keys_discarded["shortlink"] > 0

        reader = LedgerReader(role_settings(servers, dsn, "kd_dispenser").postgres_dsn)
        try:
            found = await reader.lookup("shortlink", popped.keys[0])
        finally:
            await reader.close()
        assert found["issued"] is True

        status = await collect_status(role_settings(servers, dsn, "kd_status"))
        assert status["id_types"]["shortlink"]["ranges_leased"] == 1
    finally:
        generator.close()
        await keygen_cold.close()
        await keysync_cold.close()
        await sync.close()
        await hot.close()


async def test_a_reading_role_cannot_write(
    servers: Servers, database_with_roles: str, redis_client: aioredis.Redis
) -> None:
    dsn = database_with_roles
    await run_migrate(role_settings(servers, dsn, "kd_owner"))
    conn = await asyncpg.connect(as_role(dsn, "kd_dispenser"))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(sql.for_type("INSERT INTO {cold} VALUES ('x')", "farmer"))
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE kd_sync_clock SET clock = clock + 1")
    finally:
        await conn.close()


async def test_each_role_plans_for_the_tables_as_they_are_behind_any_pooler(
    database_with_roles: str,
) -> None:
    """roles.sql sets plan_cache_mode on each role in the database: a client that does
    not ask for it at connect time (a pooler drops the startup parameter) has it too."""
    for role in ("kd_owner", "kd_keygen", "kd_keysync", "kd_dispenser", "kd_status"):
        conn = await asyncpg.connect(as_role(database_with_roles, role))
        try:
            assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan", role
        finally:
            await conn.close()
