"""Schema: versioned migration files plus per-type objects from the configuration."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from importlib import resources

import asyncpg

from shared.domain.errors import KeyspaceChanged, SchemaError
from shared.domain.idtypes import IdType
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import one_row
from shared.stores.postgres.grants import apply_grants

log = logging.getLogger(__name__)
_MIGRATION_LOCK = 0x6B64_6D69  # "kdmi"


def migration_files() -> list[tuple[int, str]]:
    """(version, SQL) for every file in shared/stores/postgres/migrations, in order."""
    folder = resources.files("shared.stores.postgres").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


def latest_version() -> int:
    return migration_files()[-1][0]


async def migrate(
    conn: asyncpg.Connection, id_types: dict[str, IdType], role_prefix: str = "kd"
) -> int:
    """Apply pending migrations, ensure every type's objects and grant each process's
    role exactly its privileges on them (``grants.py``: roles ``<role_prefix>_keygen``
    ..., those that exist); idempotent."""
    async with conn.transaction():
        await conn.execute(sql.LOCK_MIGRATIONS, _MIGRATION_LOCK)
        version = await _current_version(conn)
        for number, text in migration_files():
            if number > version:
                await conn.execute(text)
                await conn.execute(sql.INSERT_SCHEMA_VERSION, number)
                log.info("migration_applied", extra={"version": number})
        for id_type in id_types.values():
            await _ensure_type(conn, id_type)
        granted = await apply_grants(conn, role_prefix)
        if granted:
            log.info("roles_granted", extra={"roles": granted})
    return latest_version()


async def check(
    conn: asyncpg.Connection, id_types: dict[str, IdType], *, keyspace: bool = True
) -> None:
    """Refuse to start on a missing/old schema or (``keyspace``) a changed keyspace.

    Processes without the permutation key (keysync) check presence only.
    """
    version = await _current_version(conn)
    if version < latest_version():
        raise SchemaError(
            f"database schema is at version {version}, code needs {latest_version()}: "
            "run `keydispenser migrate`"
        )
    for id_type in id_types.values():
        stored = await _stored_fingerprint(conn, id_type.name)
        if stored is None:
            raise SchemaError(
                f"id_types.{id_type.name}: not in the database yet: run `keydispenser migrate`"
            )
        if keyspace:
            _compare(id_type, stored)
        ledger = sql.ledger_table(id_type.name)
        if id_type.config.ledger and not await conn.fetchval(sql.SELECT_TABLE_EXISTS, ledger):
            raise SchemaError(
                f"id_types.{id_type.name}: ledger table missing: run `keydispenser migrate`"
            )


async def _current_version(conn: asyncpg.Connection) -> int:
    if not await conn.fetchval(sql.SELECT_TABLE_EXISTS, "kd_schema_version"):
        return 0
    return int(await conn.fetchval(sql.SELECT_SCHEMA_VERSION))


async def _stored_fingerprint(conn: asyncpg.Connection, name: str) -> dict[str, object] | None:
    raw = await conn.fetchval(sql.SELECT_FINGERPRINT, name)
    return None if raw is None else dict(json.loads(raw))


def _compare(id_type: IdType, stored: dict[str, object]) -> None:
    """Every field either side has (a field only one side has, e.g. ``site``, is a
    change too: a site dropped would lease the other sites' counters)."""
    current = id_type.fingerprint.as_dict()
    for field in [*current, *(f for f in stored if f not in current)]:
        if stored.get(field) != current.get(field):
            raise KeyspaceChanged(id_type.name, field, stored.get(field), current.get(field))


async def _ensure_type(conn: asyncpg.Connection, id_type: IdType) -> None:
    if id_type.name in sql.LEDGER_PREFIX_TABLES:
        raise SchemaError(
            f"id_types.{id_type.name}: the name is taken by the table "
            f"kd_ledger_{id_type.name}; choose another"
        )
    await _refuse_retired(conn, id_type.name)
    config = id_type.config
    numbers = {
        "increment": config.range_size,
        "minvalue": config.counter_start,
        "maxvalue": config.counter_stop - 1,
    }
    await conn.execute(sql.for_type(sql.CREATE_SEQUENCE, id_type.name, **numbers))
    cold = sql.CREATE_COLD_TABLE_IN_ORDER if id_type.sequential else sql.CREATE_COLD_TABLE
    await conn.execute(sql.for_type(cold, id_type.name))
    await conn.execute(sql.for_type(sql.CREATE_LEDGER_TABLE, id_type.name))
    await conn.execute(sql.for_type(sql.ADD_LEDGER_USED_BY, id_type.name))
    await conn.execute(sql.for_type(sql.ADD_LEDGER_RELEASED, id_type.name))
    stored = await _stored_fingerprint(conn, id_type.name)
    fingerprint = json.dumps(id_type.fingerprint.as_dict(), sort_keys=True)
    if stored is None:
        await conn.execute(sql.UPSERT_FINGERPRINT, id_type.name, fingerprint)
        return
    try:
        _compare(id_type, stored)
    except KeyspaceChanged:
        if await _has_leased(conn, id_type.name):
            raise
        # No key was ever generated: the keyspace may still be redefined.
        await conn.execute(sql.for_type(sql.ALTER_SEQUENCE, id_type.name, **numbers))
        await conn.execute(sql.UPSERT_FINGERPRINT, id_type.name, fingerprint)
        log.warning("keyspace_redefined", extra={"id_type": id_type.name})


async def _refuse_retired(conn: asyncpg.Connection, name: str) -> None:
    retired_at = await conn.fetchval(sql.SELECT_RETIRED, name)
    if retired_at is not None:
        raise SchemaError(
            f"id_types.{name}: retired on {retired_at:%Y-%m-%d} (`keydispenser retire`); a "
            "retired name is never used again (it would generate the same keys): choose "
            "another name"
        )


@dataclass(frozen=True)
class Retired:
    """What ``retire`` did to one type in PostgreSQL."""

    name: str
    found: bool  # the type had objects in the database (now gone) or a tombstone
    already_retired: bool
    cold_keys_dropped: int = 0
    ranges_leased: int = 0
    highest_counter: int = 0
    ledger_dropped: bool = False


async def retire(conn: asyncpg.Connection, name: str, *, drop_ledger: bool = False) -> Retired:
    """Drop a type's cold table and sequence, forget its ranges and fingerprint, and keep
    a tombstone so the name is never used again; its ledger table (history) only with
    ``drop_ledger``. One transaction; idempotent (a retired type is left as it is)."""
    async with conn.transaction():
        await conn.execute(sql.LOCK_MIGRATIONS, _MIGRATION_LOCK)
        version = await _current_version(conn)
        if version < latest_version():
            raise SchemaError(
                f"database schema is at version {version}: run `keydispenser migrate`"
            )
        ledger_dropped = drop_ledger and await _exists(conn, sql.ledger_table(name))
        if ledger_dropped:
            await conn.execute(sql.for_type(sql.DROP_LEDGER_TABLE, name))
            await conn.execute(sql.DELETE_RELEASED_ISSUES, name)
        if await conn.fetchval(sql.SELECT_RETIRED, name) is not None:
            return Retired(name, True, True, ledger_dropped=ledger_dropped)
        has_cold = await _exists(conn, sql.cold_table(name))
        cold_keys = int(await conn.fetchval(sql.for_type(sql.COUNT_COLD, name))) if has_cold else 0
        has_sequence = await _exists(conn, sql.sequence(name))
        ranges = one_row(await conn.fetchrow(sql.SUMMARIZE_RANGES, name), "ranges")
        await conn.execute(sql.for_type(sql.DROP_COLD_TABLE, name))
        await conn.execute(sql.for_type(sql.DROP_SEQUENCE, name))
        await conn.execute(sql.DELETE_RANGES, name)
        fingerprint = await conn.fetchval(sql.DELETE_FINGERPRINT, name)
        if fingerprint is None and not has_sequence and not has_cold:
            return Retired(name, found=False, already_retired=False)
        leased, highest = int(ranges["leased"]), int(ranges["highest"])
        await conn.execute(sql.INSERT_RETIRED, name, fingerprint, leased, highest, cold_keys)
    log.info("id_type_retired", extra={"id_type": name, "cold_keys_dropped": cold_keys})
    return Retired(name, True, False, cold_keys, leased, highest, ledger_dropped)


async def _exists(conn: asyncpg.Connection, quoted: str) -> bool:
    return bool(await conn.fetchval(sql.SELECT_TABLE_EXISTS, quoted))


async def _has_leased(conn: asyncpg.Connection, name: str) -> bool:
    row = one_row(await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, name)), "state")
    return bool(row["is_called"])
