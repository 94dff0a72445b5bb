from __future__ import annotations

import asyncpg
import pytest

from shared.domain.errors import KeyspaceChanged, SchemaError
from shared.domain.idtypes import build_id_types
from shared.domain.settings import Settings
from shared.ops.databases import drop_database, scratch_database
from shared.stores.cold_store import ColdStore
from shared.stores.schema import check, latest_version, migrate, migration_files
from shared.stores.sync_record import UNGUARDED
from tests.conftest import Servers, make_settings, small_types


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


async def test_migrations_in_order_give_the_current_schema(
    servers: Servers, template_db: str
) -> None:
    """A database built file by file equals the template the suite uses."""
    dsn = await scratch_database(servers.postgres_admin_dsn, "kd_schema_probe")
    try:
        conn = await asyncpg.connect(dsn)
        try:
            for _, text in migration_files():
                await conn.execute(text)
            probe_columns = await _columns(conn)
        finally:
            await conn.close()
    finally:
        await drop_database(servers.postgres_admin_dsn, "kd_schema_probe")
    template = await asyncpg.connect(servers.dsn_for(template_db))
    try:
        assert probe_columns == await _columns(template)
    finally:
        await template.close()


async def _columns(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name IN "
        "('kd_schema_version', 'kd_id_types', 'kd_ranges', 'kd_sync_clock', 'kd_fence_events', "
        "'kd_retired_types') "
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
        with pytest.raises(KeyspaceChanged, match="permutation_key_digest"):
            await check(conn, build_id_types(rekeyed))
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
