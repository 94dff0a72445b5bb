"""Imports: another generator's tables read without changing them, and what they issued
recorded here (excluded for good; the issued ones in the ledger), set-based.

The source is read through a connection whose every transaction is read-only
(``default_transaction_read_only``), in one repeatable-read transaction (one snapshot of
all its tables), through a server-side cursor a chunk at a time. The rows go into a
staging table of the import's transaction (COPY), and a few statements do the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True)
class SourceRows:
    """The rows of a source's tables: the ID, its status and its times, as text and UTC,
    in the order of the ID column (``key``), from after a given ID when a run resumes."""

    key: str
    columns: str

    def statement(self, table: str, *, after: bool) -> str:
        """The query of ``table`` (quoted here); ``after``: $1 is the last ID read."""
        where = f" WHERE {self.key} > $1" if after else ""
        return f"SELECT {self.columns} FROM {source_table(table)}{where} ORDER BY {self.key}"


OPENG2P_ROWS: Final = SourceRows(
    "id_value", "id_value::text, status::text, created_at::timestamptz, issued_at::timestamptz"
)
MOSIP_UIN_ROWS: Final = SourceRows(
    "uin", "uin::text, uin_status::text, cr_dtimes::timestamptz, upd_dtimes::timestamptz"
)
MOSIP_VID_ROWS: Final = SourceRows(
    "vid", "vid::text, vid_status::text, cr_dtimes::timestamptz, upd_dtimes::timestamptz"
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
        self, spec: SourceRows, tables: Sequence[str], chunk: int, cursor: Any = None
    ) -> AsyncIterator[tuple[list[SourceRow], dict[str, Any]]]:
        """Every row of ``tables`` (one snapshot), one table after the other in the order
        of their IDs, ``chunk`` at a time, each with the cursor just past it (the table's
        index, its last ID); from just past ``cursor`` when given."""
        first, after = (int(cursor["table"]), cursor["after"]) if cursor else (0, None)
        try:
            async with self._conn.transaction(isolation="repeatable_read", readonly=True):
                for index in range(first, len(tables)):
                    args = [after] if index == first and after is not None else []
                    statement = spec.statement(tables[index], after=bool(args))
                    rows = await self._conn.cursor(statement, *args)
                    while records := await rows.fetch(chunk):
                        found = [SourceRow(r[0], r[1], r[2], r[3]) for r in records]
                        yield found, {"table": index, "after": records[-1][0]}
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


@dataclass(frozen=True)
class Run:
    """Where an import of a type from a source stands: the cursor its next chunk starts
    from (None: the start), the tally of the rows read so far, what recording them did
    once they are recorded (only the sweep is left), and whether an earlier run, killed,
    had gone that far (``resumed``)."""

    cursor: Any
    tally: dict[str, Any]
    recorded: Recorded | None
    resumed: bool


class ImportTarget:
    """keydispenser's side of one import of ``name`` from ``source``: its run (a row of
    kd_import_runs) and its staging table, each chunk copied and the cursor moved past it
    in one transaction, so that a killed run is resumed by the next."""

    def __init__(self, conn: asyncpg.Connection, name: str, source: str) -> None:
        self._conn, self._name, self._source = conn, name, source
        self._cursor: Any = None
        self.recorded = Recorded()

    def _sql(self, statement: str) -> str:
        return sql.for_import(statement, self._name, self._source)

    async def resume(self, origin: str | None, tally: dict[str, Any]) -> Run:
        """The run an earlier import of the same ``origin`` left, or a new one from the
        start with ``tally`` (any other run's rows dropped). None for ``origin``: never
        resumed (standard input cannot be read again from where it stopped)."""
        async with self._conn.transaction():
            row = await self._conn.fetchrow(sql.SELECT_IMPORT_RUN, self._name, self._source)
            if row is not None and origin is not None and row["origin"] == origin:
                return self._resumed(row)
            await self._conn.execute(self._sql(sql.DROP_IMPORT_STAGING))
            await self._conn.execute(self._sql(sql.CREATE_IMPORT_STAGING))
            await self._conn.execute(
                sql.START_IMPORT_RUN, self._name, self._source, origin, json.dumps(tally)
            )
        return Run(None, tally, None, resumed=False)

    def _resumed(self, row: asyncpg.Record) -> Run:
        tally: dict[str, Any] = json.loads(row["tally"])
        self._cursor = None if row["cursor"] is None else json.loads(row["cursor"])
        self.recorded.staged = int(tally.get("staged", 0))
        done = None if row["recorded"] is None else Recorded(**json.loads(row["recorded"]))
        return Run(self._cursor, tally, done, resumed=True)

    async def stage(self, rows: Sequence[Staged], cursor: Any, tally: dict[str, Any]) -> None:
        """COPY ``rows`` into the staging table and move the run's cursor past them, in
        one transaction. KeydispenserError when another import of the type and source
        moved the run meanwhile."""
        self.recorded.staged += len(rows)
        counts = json.dumps({**tally, "staged": self.recorded.staged})
        async with self._conn.transaction():
            if rows:
                await self._conn.copy_records_to_table(
                    sql.staging_table_name(self._name, self._source),
                    records=rows,
                    columns=sql.IMPORT_STAGING_COLUMNS,
                )
            moved = await self._conn.execute(
                sql.ADVANCE_IMPORT_RUN,
                self._name,
                self._source,
                None if self._cursor is None else json.dumps(self._cursor),
                json.dumps(cursor),
                counts,
            )
            if _rows(moved) != 1:
                raise KeydispenserError(self._taken_over())
        self._cursor = cursor

    def _taken_over(self) -> str:
        return (
            f"another import of {self._source} into '{self._name}' moved this one's run"
            " (two imports of the same type and source at once): run it again, once"
        )

    async def record(self, id_type: IdType, client: str) -> Recorded:
        """Exclude every staged ID, remove them from the cold table under the import lock,
        record the issued ones in the ledger (a type with one), move the import epoch on
        when an ID was excluded for the first time; drop the staging table and mark the
        run recorded, all in one transaction."""
        conn, name, source, done = self._conn, id_type.name, self._source, self.recorded
        async with conn.transaction():
            await self._still_ours()
            statement = self._sql(sql.SUMMARIZE_STAGED_DUPLICATES)
            row = one_row(await conn.fetchrow(statement), "duplicates")
            done.duplicate_keys, done.duplicate_rows = int(row["keys"]), int(row["extra"])
            done.duplicate_examples = list(row["examples"] or [])
            await conn.execute(sql.LOCK_IMPORT, name)
            changed = await conn.execute(self._sql(sql.UPDATE_CHANGED_EXCLUDED), name, source)
            done.excluded_changed = _rows(changed)
            added = await conn.execute(self._sql(sql.INSERT_NEW_EXCLUDED), name, source)
            done.excluded_added = _rows(added)
            done.cold_removed = int(await conn.fetchval(self._sql(sql.DELETE_STAGED_COLD)))
            if id_type.config.ledger:
                await self._record_issues(client)
            advance = sql.ADVANCE_IMPORT_EPOCH if done.excluded_added else sql.SELECT_IMPORT_EPOCH
            done.epoch = int(await conn.fetchval(advance, name))
            await conn.execute(self._sql(sql.DROP_IMPORT_STAGING))
            await conn.execute(sql.MARK_IMPORT_RECORDED, name, source, json.dumps(asdict(done)))
        return done

    async def _still_ours(self) -> None:
        """The run is where this import left it (locked until the transaction ends)."""
        row = await self._conn.fetchrow(sql.SELECT_IMPORT_RUN, self._name, self._source)
        cursor = None if row is None or row["cursor"] is None else json.loads(row["cursor"])
        if row is None or row["recorded"] is not None or cursor != self._cursor:
            raise KeydispenserError(self._taken_over())

    async def _record_issues(self, client: str) -> None:
        entry = import_entry(self._source)
        conn, done = self._conn, self.recorded
        row = one_row(await conn.fetchrow(self._sql(sql.SUMMARIZE_ISSUED_HERE), entry), "issued")
        done.issued_here, done.issued_here_examples = int(row["keys"]), list(row["examples"] or [])
        statement = self._sql(sql.INSERT_IMPORTED_ISSUES)
        done.ledger_added = int(await conn.fetchval(statement, client, entry))

    async def end(self) -> None:
        """The run is over (swept, refused): its row and staging table go."""
        async with self._conn.transaction():
            await self._conn.execute(self._sql(sql.DROP_IMPORT_STAGING))
            await self._conn.execute(sql.DELETE_IMPORT_RUN, self._name, self._source)


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
