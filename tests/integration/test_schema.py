from __future__ import annotations

import hashlib

import asyncpg
import pytest

from shared.domain.config import Settings
from shared.domain.errors import KeyspaceChanged, SchemaError
from shared.domain.idtypes import build_id_types
from shared.stores.fence.sync_record import UNGUARDED
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, scratch_database
from shared.stores.postgres.schema import check, latest_version, migrate, migration_files
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings


async def test_migrate_is_idempotent_and_check_passes(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        types = build_id_types(settings)
        assert await migrate(conn, types) == latest_version()
        assert await migrate(conn, types) == latest_version()
        await check(conn, types)
        versions = await conn.fetch("SELECT version FROM kd_schema_version ORDER BY version")
        assert [r["version"] for r in versions] == [v for v, _ in migration_files()]
    finally:
        await conn.close()


# Released migrations are never edited: a database already past one would never see
# the edit. A change to the schema is a new file (and a new line here).
RELEASED_MIGRATIONS = {
    1: "85f181cc0b882e261dde6cbf95c3590cc03e2a32a8ab7d169472e6fa38fc3408",
    2: "8ca54f387e4a467f86c20757ec7c3a729a3f00f44398c3e11b73957411757c8f",
    3: "dc02b44048a275913e416b48efe07f1a79397d563ac36e9328762b7296e33b28",
    4: "5b1de8973869ae3a3bc290150d99f4c9ae7ad492eb055009dd56855ebf57185b",
    5: "9558528337898856dd94f51610e6f80e1271556cf0fd4daf8397e3d703f770f7",
}
UNRELEASED: set[int] = {6, 7, 8, 9, 10, 11}  # may still change: never part of a landed release


def test_released_migrations_are_never_edited() -> None:
    files = {v: hashlib.sha256(text.encode()).hexdigest() for v, text in migration_files()}
    assert {v: files.get(v) for v in RELEASED_MIGRATIONS} == RELEASED_MIGRATIONS
    assert set(files) - set(RELEASED_MIGRATIONS) <= UNRELEASED
    assert sorted(files) == list(range(1, len(files) + 1))  # no gap, no duplicate number


async def test_a_database_upgraded_from_the_first_release_equals_a_fresh_one(
    servers: Servers, template_db: str
) -> None:
    """A database left at version 1, with data, then migrated: the same schema as the
    template (migrated from nothing), and its rows kept."""
    dsn = await scratch_database(servers.postgres_admin_dsn, "kd_schema_probe")
    try:
        conn = await asyncpg.connect(dsn)
        try:
            (first, text), *later = migration_files()
            assert first == 1 and later, "an upgrade needs at least two migrations"
            await conn.execute(text)
            await conn.execute("INSERT INTO kd_schema_version (version) VALUES (1)")
            await conn.execute(
                "INSERT INTO kd_id_types (name, fingerprint) VALUES ('old', '{}');"
                "INSERT INTO kd_ranges (id_type, range_start, range_end, leased_by)"
                " VALUES ('old', 0, 10, 'keygen-1')"
            )
            settings = make_settings(servers, "kd_schema_probe")
            assert await migrate(conn, build_id_types(settings)) == latest_version()
            upgraded = await _schema(conn)
            kept = await conn.fetchval("SELECT count(*) FROM kd_ranges WHERE id_type = 'old'")
        finally:
            await conn.close()
    finally:
        await drop_database(servers.postgres_admin_dsn, "kd_schema_probe")
    template = await asyncpg.connect(servers.dsn_for(template_db))
    try:
        assert upgraded == await _schema(template)
    finally:
        await template.close()
    assert kept == 1


async def _schema(conn: asyncpg.Connection) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The shared tables' columns and every index on a kd_ table."""
    indexes = await conn.fetch(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexdef"
    )
    return await _columns(conn), [r[0] for r in indexes]


async def _columns(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name IN "
        "('kd_schema_version', 'kd_id_types', 'kd_ranges', 'kd_sync_clock', 'kd_fence_events', "
        "'kd_retired_types', 'kd_binding', 'kd_ledger_early_marks') "
        "ORDER BY 1, 2"
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def test_keyspace_change_is_refused_once_keys_exist(
    settings: Settings, servers: Servers, database: str
) -> None:
    types = build_id_types(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        await cold.lease_range(types["farmer"], "test", UNGUARDED)
    finally:
        await cold.close()
    changed = small_types()
    changed["farmer"]["length"] = 12
    other = make_settings(servers, database, id_types=changed)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        with pytest.raises(KeyspaceChanged, match=r"id_types\.farmer\.length"):
            await migrate(conn, build_id_types(other))
        with pytest.raises(KeyspaceChanged, match="length"):
            await check(conn, build_id_types(other))
        rekeyed = make_settings(servers, database, permutation_key="another-secret")
        with pytest.raises(KeyspaceChanged, match="permutation_key: differs") as refused:
            await check(conn, build_id_types(rekeyed))
        # A mistyped secret: the advice is to restore the original, not a new type first.
        assert "the original, from your backup" in str(refused.value)
    finally:
        await conn.close()


async def test_filters_and_watermarks_may_change(
    settings: Settings, servers: Servers, database: str
) -> None:
    types = small_types()
    types["farmer"]["filters"] = {"sequence": 4, "restricted_numbers": ["786"]}
    types["farmer"]["hot"] = {"low": 1, "high": 5}
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        await cold.lease_range(build_id_types(settings)["farmer"], "test", UNGUARDED)  # keys exist
    finally:
        await cold.close()
    changed = build_id_types(make_settings(servers, database, id_types=types))
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        before = await conn.fetchval(
            "SELECT fingerprint::text FROM kd_id_types WHERE name = 'farmer'"
        )
        await check(conn, changed)  # no KeyspaceChanged
        assert await migrate(conn, changed) == latest_version()
        after = await conn.fetchval(
            "SELECT fingerprint::text FROM kd_id_types WHERE name = 'farmer'"
        )
        assert after == before
        assert changed["farmer"].rules.sequence == 4
    finally:
        await conn.close()


async def test_unused_keyspace_may_be_redefined(
    settings: Settings, servers: Servers, database: str
) -> None:
    changed = small_types()
    changed["farmer"]["length"] = 12
    other = make_settings(servers, database, id_types=changed)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await migrate(conn, build_id_types(other))
        await check(conn, build_id_types(other))
        maxvalue = await conn.fetchval(
            "SELECT max_value FROM pg_sequences WHERE sequencename = 'kd_seq_farmer'"
        )
        assert maxvalue == 10**11 - 1
    finally:
        await conn.close()


async def test_check_refuses_an_unmigrated_database(servers: Servers) -> None:
    await scratch_database(servers.postgres_admin_dsn, "kd_empty_probe")
    try:
        settings = make_settings(servers, "kd_empty_probe")
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            with pytest.raises(SchemaError, match="keydispenser migrate"):
                await check(conn, build_id_types(settings))
        finally:
            await conn.close()
    finally:
        await drop_database(servers.postgres_admin_dsn, "kd_empty_probe")
