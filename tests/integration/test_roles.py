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
from shared.stores.postgres.databases import (
    drop_database,
    dsn_with_database,
    run_migrate,
    scratch_database,
)
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, make_settings

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


@pytest.fixture
async def migrated_with_roles(servers: Servers, database_with_roles: str) -> str:
    """A database set up by roles.sql and migrated as the owner (a ledger type)."""
    await run_migrate(role_settings(servers, database_with_roles, "kd_owner"))
    return database_with_roles


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
        # And as keygen's.
        assert await keygen.lease_and_generate(types["shortlink"]) > 0
        await redis_client.hset(redis_keys.sync_record_key(NS), "fence_needed", "1")
        report = await settle(keygen_cold, sync)
        assert report is not None and report.keys_discarded["shortlink"] > 0

        reader = LedgerReader(role_settings(servers, dsn, "kd_dispenser").postgres_dsn)
        try:
            found = await reader.lookup("shortlink", popped.keys[0])
        finally:
            await reader.close()
        assert found["issued"] is True

        status = await collect_status(role_settings(servers, dsn, "kd_status"))
        assert status["id_types"]["shortlink"]["ranges_leased"] == 2
    finally:
        generator.close()
        await keygen_cold.close()
        await keysync_cold.close()
        await sync.close()
        await hot.close()


# What each process's role must not do: (role, statement). Every one is refused with
# "permission denied" (docs/security.md, "PostgreSQL roles").
_EVERY_PROCESS = ("kd_keygen", "kd_keysync", "kd_dispenser", "kd_status")
_NOT_THE_OWNER = [
    (role, statement)
    for role in _EVERY_PROCESS
    for statement in (
        "CREATE TABLE kd_mine (x int)",
        "CREATE TEMPORARY TABLE kd_mine (x int)",
        "TRUNCATE {ledger}",
        "TRUNCATE {cold}",
        "DROP TABLE {ledger}",
        "DROP TABLE kd_ranges",
        "ALTER TABLE {ledger} ADD COLUMN x int",
        "CREATE INDEX ON {ledger} (client)",
        "UPDATE kd_id_types SET fingerprint = '{{}}'",
        "DELETE FROM kd_retired_types",
        "INSERT INTO kd_retired_types VALUES ('x', now(), NULL, 0, 0, 0)",
        "DELETE FROM kd_schema_version",
        "UPDATE kd_binding SET redis_namespace = 'elsewhere'",
        "DELETE FROM kd_binding",
        "CREATE SCHEMA kd_mine",
    )
]
FORBIDDEN = [
    *_NOT_THE_OWNER,
    # The dispenser and status never read a key still to be handed out, nor a range.
    ("kd_dispenser", "SELECT key FROM {cold} LIMIT 1"),
    ("kd_dispenser", "SELECT * FROM kd_ranges"),
    ("kd_dispenser", "SELECT last_value FROM {seq}"),
    ("kd_dispenser", "INSERT INTO {ledger} VALUES ('k', now(), 'c', NULL, 'e')"),
    ("kd_dispenser", "UPDATE kd_sync_clock SET clock = clock + 1"),
    ("kd_status", "SELECT key FROM {cold} LIMIT 1"),
    ("kd_status", "UPDATE kd_sync_clock SET clock = clock + 1"),
    ("kd_status", "DELETE FROM {ledger}"),
    # keygen writes keys it never reads back, and never touches the ledger.
    ("kd_keygen", "SELECT key FROM {cold} LIMIT 1"),
    ("kd_keygen", "DELETE FROM {cold} WHERE key = 'x' RETURNING key"),
    ("kd_keygen", "SELECT * FROM {ledger}"),
    ("kd_keygen", "DELETE FROM {ledger}"),
    ("kd_keygen", "UPDATE {ledger} SET client = 'forged'"),
    ("kd_keygen", "INSERT INTO {ledger} VALUES ('k', now(), 'c', NULL, 'e')"),
    ("kd_keygen", "DELETE FROM kd_released_issues"),
    ("kd_keygen", "DELETE FROM kd_outcomes"),
    ("kd_keygen", "DELETE FROM kd_chain_links"),
    ("kd_keygen", "DELETE FROM kd_fence_events"),
    ("kd_keygen", "DELETE FROM kd_ranges"),
    # keysync takes batches and writes the ledger; never leases, never forges history.
    (
        "kd_keysync",
        "INSERT INTO kd_ranges (id_type, range_start, range_end, leased_by) "
        "VALUES ('shortlink', 0, 1, 'x')",
    ),
    ("kd_keysync", "DELETE FROM kd_ranges"),
    ("kd_keysync", "DELETE FROM kd_fence_events"),
    ("kd_keysync", "UPDATE kd_fence_events SET reason = 'x'"),
]


@pytest.mark.parametrize(("role", "statement"), FORBIDDEN)
async def test_a_role_is_refused_what_its_process_must_not_do(
    servers: Servers, migrated_with_roles: str, role: str, statement: str
) -> None:
    conn = await asyncpg.connect(as_role(migrated_with_roles, role))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(sql.for_type(statement, "shortlink"))
    finally:
        await conn.close()


async def test_status_and_keygen_count_keys_they_cannot_read(migrated_with_roles: str) -> None:
    """kd_cold_depth counts a cold tier for a role that may not read it, and nothing else:
    PUBLIC may not call it, nor may the dispenser."""
    owner = await asyncpg.connect(as_role(migrated_with_roles, "kd_owner"))
    try:
        await owner.execute(
            sql.for_type(
                "INSERT INTO {cold} SELECT 'k' || g FROM generate_series(1, 7) g", "shortlink"
            )
        )
    finally:
        await owner.close()
    for role in ("kd_status", "kd_keygen"):
        conn = await asyncpg.connect(as_role(migrated_with_roles, role))
        try:
            assert await conn.fetchval(sql.COUNT_COLD_UP_TO, "shortlink", 5) == 5
            assert await conn.fetchval(sql.COUNT_COLD_UP_TO, "shortlink", 100) == 7
            with pytest.raises(asyncpg.RaiseError):
                await conn.fetchval(sql.COUNT_COLD_UP_TO, "x; DROP TABLE kd_ranges", 1)
        finally:
            await conn.close()
    conn = await asyncpg.connect(as_role(migrated_with_roles, "kd_dispenser"))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval(sql.COUNT_COLD_UP_TO, "shortlink", 5)
    finally:
        await conn.close()


async def test_migrate_takes_back_what_an_earlier_release_granted(
    servers: Servers, migrated_with_roles: str
) -> None:
    """A database set up by an earlier release's roles.sql (every table to every process
    role): the next migrate leaves each role its own privileges only."""
    admin = await asyncpg.connect(migrated_with_roles)
    try:
        await admin.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO kd_keygen, kd_dispenser")
    finally:
        await admin.close()
    dsn = migrated_with_roles
    await run_migrate(role_settings(servers, dsn, "kd_owner"))
    for role, statement in (
        ("kd_keygen", "DELETE FROM {ledger}"),
        ("kd_dispenser", "SELECT key FROM {cold} LIMIT 1"),
    ):
        conn = await asyncpg.connect(as_role(dsn, role))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql.for_type(statement, "shortlink"))
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
