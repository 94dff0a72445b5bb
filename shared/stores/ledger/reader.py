"""The dispenser's reads of the ledger (``GET /v1/keys/{type}/{key}``; MOSIP's PUT with a
status it does not know): what the ledger says of one key, and only when what it says
will hold.

A read is answered from a PostgreSQL whose history is the one the record in Redis
follows (the fence's verdict, ``shared.stores.fence.verdict``), with no ledger restore
pending and nothing committed there that the record does not cover yet: a read never
shows a promoted server's history before its lost links are restored, nor a decision
that a promotion could still take back (docs/reliability.md, "The ledger's one
history"). Otherwise it answers 503 ``IDG-005`` (``StoreUnavailable``), after waiting a
moment for a commit in flight to be recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg

from shared.domain.errors import (
    ConfigError,
    FenceHalted,
    KeydispenserError,
    LedgerHalted,
    SchemaError,
    StoreUnavailable,
)
from shared.domain.tiers import KeyStatus, not_issued
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.sync_record import Record
from shared.stores.fence.verdict import ClockRow, verdict
from shared.stores.groups import SyncRecords
from shared.stores.ledger import sql as ledger_sql
from shared.stores.ledger.decide import key_status
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore, translated

T = TypeVar("T")
# How long a read waits for the record to cover what it read (a commit whose stamp is
# being recorded: milliseconds), and how often it looks again.
CONFIRM_WAIT_S = 1.0
CONFIRM_POLL_S = 0.01
# How long /readyz waits for PostgreSQL to answer.
PROBE_TIMEOUT_S = 1.0


class LedgerReader:
    """Lookups for the dispenser: a small pool, opened on first use. ``records``: the
    fence's records of every key group (None: the guard is switched off, a drill's
    control; reads are then not judged)."""

    def __init__(self, dsn: str, records: SyncRecords | None = None, pooler: str = "none") -> None:
        self._dsn = dsn
        self._records = records
        self._pooler = pooler  # what stands before PostgreSQL (postgres_pooler)
        self._store: ColdStore | None = None
        self.problem: str | None = None  # why the last read or probe failed, if it did

    async def lookup(self, name: str, key: str) -> dict[str, Any]:
        row = await self._judged(name, "ledger_lookup", lambda conn: _key_row(conn, name, key))
        if row is None:
            return not_issued(name, key)
        return {
            "id_type": name,
            "key": key,
            "issued": True,
            "issued_at": _iso(row["issued_at"]),
            "client": row["client"],
            "idempotency_key": row["idempotency_key"],
            "used": row["used_at"] is not None,
            "used_at": _iso(row["used_at"]),
            "used_by": row["used_by"],
            "released": row["released_at"] is not None,
            "released_at": _iso(row["released_at"]),
            "released_by": row["released_by"],
        }

    async def halted(self, name: str) -> str:
        """Why the ledger that holds type ``name`` is halted ("": it is not), as the
        fence's record says: a request refused for it is refused at once. FenceHalted
        when the fence halted leases and syncs (both tiers lost state): the ledger's
        history cannot be judged until an operator fences."""
        sync = self._records.of(name) if self._records is not None else None
        if sync is None:
            return ""
        record = await sync.read()
        if record.halted:
            raise FenceHalted(record.halt_reason or "halted")
        return record.ledger_halt

    async def status(self, name: str, key: str) -> KeyStatus:
        """The key's state now: its current issue row, else its last issue that was
        released back to the cold tier, else never issued."""
        return await self._judged(name, "ledger_status", lambda conn: key_status(conn, name, key))

    async def _judged(self, name: str, operation: str, read: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``read`` (through ``_read``) and return what it found, remembering what
        went wrong for ``probe``. A PostgreSQL this process cannot use (a wrong
        password, a missing privilege or database, a bad DSN) is unavailable to the
        caller (503), never a fault of the request: the operator's to fix, named in the
        detail."""
        try:
            found = await self._read(name, operation, read)
        except (ConfigError, SchemaError) as exc:
            self.problem = str(exc)
            raise StoreUnavailable("postgres", f"cannot use PostgreSQL: {exc}") from exc
        except StoreUnavailable as exc:
            if exc.store == "postgres":
                self.problem = str(exc)
            raise
        self.problem = None
        return found

    async def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
        """None when this process can read the ledger (connect, log in, the clock row
        readable), else why not in a few words an unauthenticated probe may see
        (``/readyz``); the detail is in ``problem`` (logged)."""
        try:
            async with asyncio.timeout(timeout_s):
                store = await self._opened()
                async with store.connection() as conn, translated("probe"):
                    await conn.fetchrow(fence_sql.SELECT_LEDGER_STATE)
        except TimeoutError:
            self.problem = f"postgres: no answer in {timeout_s:g} s"
            return "unreachable"
        except (ConfigError, SchemaError) as exc:
            self.problem = str(exc)
            return "unusable as configured: check postgres_dsn (the log says why)"
        except KeydispenserError as exc:
            self.problem = str(exc)
            return "unreachable"
        self.problem = None
        return None

    async def _read(self, name: str, operation: str, read: Callable[[Any], Awaitable[T]]) -> T:
        """``read`` in one snapshot with the server's clock row, answered only once the
        record covers that snapshot (module docstring).

        The snapshot is taken once: what it read is answered as soon as the record
        covers the commit it saw (the stamp of a commit in flight is recorded within
        milliseconds), rechecked against the record as it is then. Taking a new snapshot
        instead would chase the clock of a ledger that keysync keeps writing (a lookup
        under a steady load of status changes would wait for a quiet moment)."""
        store = await self._opened()
        sync = self._records.of(name) if self._records is not None else None
        record = await sync.read() if sync is not None else None
        if record is not None:
            if record.halted:  # both tiers lost state: an operator fences first
                raise FenceHalted(record.halt_reason or "halted")
            _refuse_halted(record.ledger_halt, record.restore_to)
        async with (
            store.connection() as conn,
            translated(operation),
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            try:
                found = await read(conn)
            except asyncpg.UndefinedTableError as exc:
                raise StoreUnavailable(
                    "postgres", f"no ledger table for '{name}': run `keydispenser migrate`"
                ) from exc
            if sync is None or record is None:
                return found
            state = ClockRow.of(await conn.fetchrow(fence_sql.SELECT_LEDGER_STATE))
        _refuse_halted("", state.restore_to.get(sync.namespace, ""))
        if verdict(state, record) != "ok" and not _never_guarded(state, record):
            raise StoreUnavailable(
                "postgres", "the ledger is being restored after a PostgreSQL failover; retry"
            )
        history = (record.timeline, record.fork, record.database)
        deadline = time.monotonic() + CONFIRM_WAIT_S
        while record.clock < state.clock:
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    "postgres", "the ledger's last change is not recorded yet; retry"
                )
            await asyncio.sleep(CONFIRM_POLL_S)
            found_record = await sync.read()
            if found_record is None:
                raise StoreUnavailable("redis", "the sync record is gone; retry")
            record = found_record
            _refuse_halted(record.ledger_halt, record.restore_to)
            if (record.timeline, record.fork, record.database) != history:  # a fence since
                raise StoreUnavailable(
                    "postgres", "the ledger is being restored after a PostgreSQL failover; retry"
                )
        return found

    async def _opened(self) -> ColdStore:
        if self._store is None:
            self._store = await ColdStore.connect(
                self._dsn, min_size=0, max_size=2, pooler=self._pooler
            )
        return self._store

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()


def _refuse_halted(halt: str, restoring: str) -> None:
    if halt:
        raise LedgerHalted(halt)
    if restoring:
        raise StoreUnavailable(
            "postgres", "the ledger is being restored after a PostgreSQL failover; retry"
        )


def _never_guarded(state: ClockRow, record: Record) -> bool:
    """Neither side has seen a guarded write yet (a database no keysync or keygen has
    written through the fence, a record that never recorded a stamp): nothing can have
    been lost."""
    return state.timeline == 0 and record.clock == 0


async def _key_row(conn: Any, name: str, key: str) -> Any:
    return await conn.fetchrow(sql.for_type(ledger_sql.SELECT_LEDGER_KEY, name), key)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
