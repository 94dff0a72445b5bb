"""Imports: another generator's tables read without changing them, and what they issued
recorded here (excluded for good; the issued ones in the ledger), set-based.

The source is read through a connection whose every transaction is read-only
(``default_transaction_read_only``), in one repeatable-read transaction (one snapshot of
all its tables), through a server-side cursor a chunk at a time. The rows go into a
staging table of the import's transaction (COPY), and a few statements do the rest.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg

from shared.domain.errors import ConfigError, KeydispenserError
from shared.domain.idtypes import IdType
from shared.domain.imports import SourceRow, Staged
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import DRIVER_ERRORS, one_row
from shared.stores.postgres.connect import where

# A source table's name: a table, or schema.table, of plain lower-case identifiers.
SOURCE_TABLE: Final = re.compile(r"^(?:[a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$")

# The rows of each source's tables: the ID, its status and its times, as text and UTC.
OPENG2P_ROWS: Final = (
    "SELECT id_value::text, status::text, created_at::timestamptz, issued_at::timestamptz "
    "FROM {table}"
)
MOSIP_UIN_ROWS: Final = (
    "SELECT uin::text, uin_status::text, cr_dtimes::timestamptz, upd_dtimes::timestamptz "
    "FROM {table}"
)
MOSIP_VID_ROWS: Final = (
    "SELECT vid::text, vid_status::text, cr_dtimes::timestamptz, upd_dtimes::timestamptz "
    "FROM {table}"
)
# $1: table name. Whether the source holds it.
SOURCE_TABLE_EXISTS: Final = "SELECT to_regclass($1) IS NOT NULL"

# What connecting to a source can fail with (unreachable, refused, a malformed DSN).
SOURCE_ERRORS: Final[tuple[type[BaseException], ...]] = (*DRIVER_ERRORS, ValueError)

# Every transaction of a source connection is read-only; its times are read as UTC.
SOURCE_SETTINGS: Final = {
    "default_transaction_read_only": "on",
    "TimeZone": "UTC",
    "application_name": "keydispenser-import",
}


def source_table(name: str) -> str:
    """``name`` (table or schema.table) quoted; ConfigError for anything else."""
    if not SOURCE_TABLE.fullmatch(name):
        raise ConfigError(f"--table: {name!r} is not a table name (schema.table or table)")
    return ".".join(f'"{part}"' for part in name.split("."))


class Source:
    """Another generator's database, read-only."""

    def __init__(self, conn: asyncpg.Connection, dsn: str) -> None:
        self._conn = conn
        self.where = where(dsn)

    @classmethod
    async def connect(cls, dsn: str, timeout_s: float = 10.0) -> Source:
        """ConfigError naming the source when it cannot be reached or logged into."""
        try:
            conn = await asyncpg.connect(dsn, timeout=timeout_s, server_settings=SOURCE_SETTINGS)
        except SOURCE_ERRORS as exc:
            raise ConfigError(f"--from {where(dsn)}: cannot connect: {exc}") from exc
        return cls(conn, dsn)

    async def close(self) -> None:
        await self._conn.close()

    async def present(self, tables: Sequence[str]) -> list[str]:
        """Those of ``tables`` the source holds."""
        return [t for t in tables if await self._conn.fetchval(SOURCE_TABLE_EXISTS, t)]

    async def rows(
        self, statement: str, tables: Sequence[str], chunk: int
    ) -> AsyncIterator[list[SourceRow]]:
        """Every row of ``tables`` (``statement`` each, one snapshot), ``chunk`` at a time."""
        query = " UNION ALL ".join(statement.format(table=source_table(t)) for t in tables)
        try:
            async with self._conn.transaction(isolation="repeatable_read", readonly=True):
                cursor = await self._conn.cursor(query)
                while records := await cursor.fetch(chunk):
                    yield [SourceRow(r[0], r[1], r[2], r[3]) for r in records]
        except asyncpg.PostgresError as exc:
            raise KeydispenserError(
                f"--from {self.where}: reading {', '.join(tables)}: {exc}"
            ) from exc

    async def count(self, tables: Sequence[str]) -> int:
        """Rows of ``tables`` (for progress)."""
        total = 0
        for table in tables:
            total += int(await self._conn.fetchval(f"SELECT count(*) FROM {source_table(table)}"))
        return total


@dataclass
class Recorded:
    """What an import's transaction did (or, rolled back, would have done)."""

    staged: int = 0
    duplicate_keys: int = 0
    duplicate_rows: int = 0
    duplicate_examples: list[str] = field(default_factory=list)
    excluded_added: int = 0
    excluded_changed: int = 0
    cold_removed: int = 0
    ledger_added: int = 0
    issued_here: int = 0
    issued_here_examples: list[str] = field(default_factory=list)
    epoch: int = 0


class ImportTarget:
    """keydispenser's side of one import: a transaction with its staging table."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._created = False
        self.recorded = Recorded()

    async def stage(self, rows: Sequence[Staged]) -> None:
        """COPY ``rows`` into the staging table (created by the first call)."""
        await self._create()
        if rows:
            await self._conn.copy_records_to_table(
                sql.IMPORT_STAGING, records=rows, columns=sql.IMPORT_STAGING_COLUMNS
            )
        self.recorded.staged += len(rows)

    async def _create(self) -> None:
        if not self._created:
            await self._conn.execute(sql.CREATE_IMPORT_STAGING)
            self._created = True

    async def record(self, id_type: IdType, source: str, client: str) -> Recorded:
        """Exclude every staged ID, remove them from the cold table under the import lock,
        record the issued ones in the ledger (a type with one), move the import epoch on
        when an ID was excluded for the first time."""
        await self._create()
        conn, name, done = self._conn, id_type.name, self.recorded
        row = one_row(await conn.fetchrow(sql.SUMMARIZE_STAGED_DUPLICATES), "duplicates")
        done.duplicate_keys, done.duplicate_rows = int(row["keys"]), int(row["extra"])
        done.duplicate_examples = list(row["examples"] or [])
        await conn.execute(sql.LOCK_IMPORT, name)
        done.excluded_changed = _rows(await conn.execute(sql.UPDATE_CHANGED_EXCLUDED, name, source))
        done.excluded_added = _rows(await conn.execute(sql.INSERT_NEW_EXCLUDED, name, source))
        done.cold_removed = int(await conn.fetchval(sql.for_type(sql.DELETE_STAGED_COLD, name)))
        if id_type.config.ledger:
            await self._record_issues(name, source, client)
        advance = sql.ADVANCE_IMPORT_EPOCH if done.excluded_added else sql.SELECT_IMPORT_EPOCH
        done.epoch = int(await conn.fetchval(advance, name))
        return done

    async def _record_issues(self, name: str, source: str, client: str) -> None:
        entry = import_entry(source)
        conn, done = self._conn, self.recorded
        row = await conn.fetchrow(sql.for_type(sql.SUMMARIZE_ISSUED_HERE, name), entry)
        row = one_row(row, "issued here")
        done.issued_here, done.issued_here_examples = int(row["keys"]), list(row["examples"] or [])
        statement = sql.for_type(sql.INSERT_IMPORTED_ISSUES, name)
        done.ledger_added = int(await conn.fetchval(statement, client, entry))


def _rows(tag: str) -> int:
    """The rows a statement's status tag says it wrote (``INSERT 0 5``, ``UPDATE 5``)."""
    return int(tag.rsplit(" ", 1)[-1])


def import_entry(source: str) -> str:
    """The entry id of the ledger issues an import of ``source`` records (no stream entry
    recorded them: this names where they came from)."""
    return f"import:{source}"


async def excluded_among(conn: Any, name: str, keys: Sequence[str]) -> list[str]:
    """Those of ``keys`` an import excluded."""
    rows = await conn.fetch(sql.SELECT_EXCLUDED_AMONG, name, list(keys))
    return [row["key"] for row in rows]
