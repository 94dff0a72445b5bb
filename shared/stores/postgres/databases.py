"""Creating, migrating and dropping whole databases (migrate, up, benchmarks, drills)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from shared.domain.config import Settings
from shared.domain.errors import KeydispenserError
from shared.domain.idtypes import build_id_types
from shared.stores.postgres.connect import check_files, driver_options, refuse_unsaid_pooling
from shared.stores.postgres.schema import migrate

# The database every PostgreSQL server has: scratch databases are created through it.
MAINTENANCE_DATABASE = "postgres"


def dsn_with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database (keeps credentials and query options)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def database_of(dsn: str) -> str:
    return unquote(urlsplit(dsn).path.lstrip("/"))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def ensure_database(dsn: str, pooler: str = "none") -> None:
    """Create the DSN's database when it does not exist yet (``pooler``: what stands
    before PostgreSQL, ``postgres_pooler``)."""
    options = driver_options(pooler)
    try:
        conn = await asyncpg.connect(dsn, **options)
    except asyncpg.InvalidCatalogNameError:
        admin = await asyncpg.connect(dsn_with_database(dsn, MAINTENANCE_DATABASE), **options)
        try:
            await admin.execute(f"CREATE DATABASE {_quoted(database_of(dsn))}")
        except asyncpg.DuplicateDatabaseError:
            pass
        finally:
            await admin.close()
    else:
        await conn.close()


async def scratch_database(server_dsn: str, name: str) -> str:
    """A new, empty database ``name`` on the server of ``server_dsn`` (dropped first if
    left over); returns its DSN. Created through the server's maintenance database, so
    the database ``server_dsn`` names need not exist."""
    admin = await asyncpg.connect(dsn_with_database(server_dsn, MAINTENANCE_DATABASE))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {_quoted(name)}")
    finally:
        await admin.close()
    return dsn_with_database(server_dsn, name)


async def drop_database(server_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(dsn_with_database(server_dsn, MAINTENANCE_DATABASE))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
    finally:
        await admin.close()


async def run_migrate(settings: Settings) -> int:
    """Create the configured database if needed and bring its schema up to date."""
    id_types = build_id_types(settings)
    check_files(settings.postgres_dsn)
    pooler = settings.postgres_pooler
    try:
        await ensure_database(settings.postgres_dsn, pooler)
        await refuse_unsaid_pooling(settings.postgres_dsn, pooler)
        conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(pooler))
    except (OSError, asyncpg.PostgresError) as exc:
        raise KeydispenserError(f"postgres_dsn: cannot connect: {exc}") from exc
    try:
        return await migrate(conn, id_types, settings.postgres_role_prefix)
    finally:
        await conn.close()
