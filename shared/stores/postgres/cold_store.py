"""The cold tier: durable key inventory in PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from shared.domain.config.postgres import PostgresSettings
from shared.domain.errors import (
    ConfigError,
    KeydispenserError,
    KeyspaceExhausted,
    PostgresBehind,
    RangeFenced,
    SchemaError,
    StoreUnavailable,
)
from shared.domain.idtypes import IdType
from shared.domain.tiers import LeasedRange, SequenceState, Stamp
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.sync_record import Record
from shared.stores.postgres import sql
from shared.stores.postgres.connect import (
    CONNECT_TIMEOUT_S,
    check_files,
    connect_each_host,
    driver_options,
    pooled_per_transaction_error,
    refuse_unsaid_pooling,
    user_of,
    where,
)

log = logging.getLogger(__name__)

# Driver errors that mean "the database is not reachable right now".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.InterfaceError,
    # A connection broken mid-operation by a failover ("cannot switch to state 15").
    asyncpg.InternalClientError,
    TimeoutError,
)
# SQLSTATE classes that describe this deployment, not the server's state: a wrong
# password, a missing database, a missing table or privilege. They end a process with
# their message; every other error a server sends (too many connections, a cancelled
# statement, an admin shutdown, a read-only transaction after a failover, a full disk,
# serialization failures, a unique violation from a split brain...) is an outage that
# passes, ridden out with back-off (docs/reliability.md, "Outages").
DRIVER_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)
CONFIGURATION_SQLSTATE_CLASSES = frozenset({"28", "3D", "3F", "42"})
UNDEFINED_TABLE = "42P01"
UNDEFINED_DATABASE = "3D000"
# A named prepared statement the server connection does not have: a pooler lent this
# transaction another server than the one the statement was prepared on.
UNKNOWN_STATEMENT = "26000"
# What a pooler answers a startup parameter it does not know (PgBouncer:
# "unsupported startup parameter: plan_cache_mode", SQLSTATE 08P01).
REFUSED_STARTUP_PARAMETER = "unsupported startup parameter"
# PgBouncer refuses a login with SQLSTATE 08P01 (a protocol violation, in the class of
# connection failures), whatever the reason, the server's own SQLSTATE lost: told apart
# by its text, a setup to fix is not taken for an outage and retried forever.
POOLER_LOGIN_REFUSAL = "08P01"
POOLER_NO_DATABASE = re.compile(r'^database ".*" does not exist$')
POOLER_SETUP_REFUSALS = ("no such user", "no such database", "password authentication failed")
POOLER_SAYS = " (the pooler's answer)"
NO_DATABASE = "run `keydispenser migrate` (it creates the database)"


def store_error(operation: str, exc: BaseException) -> KeydispenserError:
    """The domain error a driver error means (see CONFIGURATION_SQLSTATE_CLASSES)."""
    if isinstance(exc, asyncpg.ClientConfigurationError):  # e.g. sslmode=bogus
        return ConfigError(f"postgres_dsn: {exc}")
    if isinstance(exc, ssl.SSLCertVerificationError):  # a setup to fix, not an outage
        return ConfigError(
            f"postgres_dsn: the server's certificate was refused ({operation}): "
            f"{exc.verify_message or exc}: sslrootcert must hold the CA that signed it, "
            "and with sslmode=verify-full it must name the host the DSN connects to"
        )
    state = str(getattr(exc, "sqlstate", "") or "")
    if state == UNDEFINED_TABLE:
        return SchemaError(f"postgres: {exc}: run `keydispenser migrate`")
    if state == UNDEFINED_DATABASE:
        return SchemaError(f"postgres: {exc}: {NO_DATABASE}")
    if state == POOLER_LOGIN_REFUSAL and POOLER_NO_DATABASE.match(_message(exc)):
        return SchemaError(f"postgres: {_message(exc)}: {NO_DATABASE}")
    if state == POOLER_LOGIN_REFUSAL and _message(exc).startswith(POOLER_SETUP_REFUSALS):
        return ConfigError(f"postgres: {operation}: {_message(exc)}{POOLER_SAYS}")
    if state == UNKNOWN_STATEMENT:
        return pooled_per_transaction_error("", f"{operation}: {_message(exc)}")
    if REFUSED_STARTUP_PARAMETER in str(exc):
        return ConfigError(
            f"postgres_pooler: {operation}: {_message(exc)}: a pooler (PgBouncer) stands "
            "before PostgreSQL: set postgres_pooler: session or transaction, as its "
            'pool_mode is (docs/operations.md, "PgBouncer")'
        )
    if state[:2] in CONFIGURATION_SQLSTATE_CLASSES:
        return ConfigError(f"postgres: {operation}: {exc} (SQLSTATE {state})")
    detail = f"{operation} failed: {exc}" + (f" (SQLSTATE {state})" if state else "")
    return StoreUnavailable("postgres", detail)


def _message(exc: BaseException) -> str:
    """A server error's own message, without the hint asyncpg appends to some."""
    return str(getattr(exc, "message", None) or exc)


@asynccontextmanager
async def translated(operation: str) -> AsyncIterator[None]:
    """Driver errors -> StoreUnavailable (an outage), or ConfigError/SchemaError."""
    try:
        yield
    except asyncpg.SequenceGeneratorLimitExceededError:
        raise  # a used-up keyspace: the caller says which (KeyspaceExhausted)
    except DRIVER_ERRORS as exc:
        raise store_error(operation, exc) from exc


async def checked_pooling(settings: PostgresSettings) -> None:
    """ConfigError naming ``postgres_pooler`` when the connections are pooled per
    transaction and the setting does not say so (connect.refuse_unsaid_pooling);
    StoreUnavailable when PostgreSQL cannot be asked."""
    async with translated("pooling check"):
        await refuse_unsaid_pooling(
            settings.postgres_dsn, settings.postgres_pooler, settings.postgres_connect_timeout_s
        )


def one_row(row: asyncpg.Record | None, operation: str) -> asyncpg.Record:
    """The row of a statement that always returns exactly one."""
    if row is None:
        raise KeydispenserError(f"postgres: {operation} returned no row")
    return row


def unpack_keys(packed: str | None, count: int) -> list[str]:
    """The keys of a batch as TAKE_BATCH returns them (newline-joined, NULL for none)."""
    keys = packed.split("\n") if packed else []
    if len(keys) != count:
        raise KeydispenserError(f"postgres: a batch of {count} keys came back as {len(keys)}")
    return keys


# What leaves a connection unfit to be given back to the pool: the operation it was in
# was interrupted (a deadline of ours or the driver's, a cancelled task), or the
# connection is in a state it cannot leave (asyncpg's "cannot switch to state 15;
# another operation (2) is in progress": the server ended the session, its last message
# unread). Given back, the pool first waits for the server to acknowledge the
# interrupted statement's cancellation (forever, across a cut link or on a frozen
# server: the process hangs) or resets it through a protocol that cannot (and the next
# process to acquire it fails). Such a connection is discarded (``_release``).
INTERRUPTIONS: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    TimeoutError,
    asyncpg.InternalClientError,
    asyncpg.InterfaceError,
    OSError,
)


def interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, is one of ``INTERRUPTIONS``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, INTERRUPTIONS):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


async def _end(pool: asyncpg.Pool, conn: Any, finish: Callable[[], Awaitable[None]]) -> None:
    """Finish a take's transaction and give its connection back, whatever happens.

    Only ``finish`` decides the outcome. Giving the connection back resets it, and a
    reset can fail when the server went away just after the commit: the pool then
    closes that connection (and opens another when needed), and the commit stands. Were
    that failure raised, a committed batch would be taken for lost, or an error of no
    kind the callers ride out would end the process.
    """
    failed: BaseException | None = None
    try:
        async with translated("take_batch"):
            await finish()
    except BaseException as exc:
        failed = exc
        raise
    finally:
        await _release(pool, conn, failed)


async def _release(pool: asyncpg.Pool, conn: Any, failed: BaseException | None = None) -> None:
    """Give a connection back after its work ended (``failed``: with that error); a
    failed reset is logged, not raised: the pool has closed that connection, and the
    transaction's end stands. A connection whose work was interrupted is discarded
    first (``INTERRUPTIONS``): the server rolls back what it left open."""
    if interrupted(failed):
        # (a connection already lost is already back in the pool: nothing to end)
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.terminate()
    try:
        await pool.release(conn)
    except Exception as exc:
        log.warning("connection_release_failed", extra={"error": str(exc)})


async def _roll_back(
    pool: asyncpg.Pool, conn: Any, transaction: Any, failed: BaseException | None = None
) -> None:
    """Errors are swallowed: a connection that broke rolls its transaction back too (one
    interrupted, ``failed``, is discarded at once: its server rolls back)."""
    if interrupted(failed):
        await _release(pool, conn, failed)
        return
    with contextlib.suppress(StoreUnavailable):
        await _end(pool, conn, transaction.rollback)


async def _without_excluded(
    conn: Any, name: str, keys: Sequence[str], counters: tuple[int, int] | LeasedRange
) -> Sequence[str]:
    """``keys`` but those an import excluded, found by their counters (in the caller's
    transaction, under the import lock)."""
    await conn.execute(sql.LOCK_IMPORT_SHARED, name)
    start, stop = (counters.start, counters.stop) if isinstance(counters, LeasedRange) else counters
    rows = await conn.fetch(sql.SELECT_EXCLUDED_IN_RANGE, name, start, stop)
    if not rows:
        return keys
    excluded = {row["key"] for row in rows}
    return [key for key in keys if key not in excluded]


@dataclass
class OpenTake:
    """Keys deleted in a transaction still open: taken only once ``commit`` returns.

    Until then the transaction holds the sync clock's row lock (sql.py, GUARD_TAKE):
    other takes, leases and the fence wait for it. Finish it with ``commit`` or
    ``rollback`` (a rollback after either does nothing). A ``commit`` that fails may or
    may not have committed: the keys must then be treated as lost, never pushed.
    """

    keys: list[str]
    stamp: Stamp
    _pool: Any = field(repr=False)
    _conn: Any = field(repr=False)
    _transaction: Any = field(repr=False)
    _finished: bool = field(default=False, repr=False)
    epoch: int = 0  # the type's import epoch the keys were taken under

    async def commit(self) -> None:
        if self._finished:
            raise KeydispenserError("take_batch: this batch's transaction already ended")
        self._finished = True
        await _end(self._pool, self._conn, self._transaction.commit)

    async def rollback(self) -> None:
        """Give the keys back."""
        if not self._finished:
            self._finished = True
            await _roll_back(self._pool, self._conn, self._transaction)


# How long a take's open transaction may sit idle (sql.LIMIT_IDLE_TAKE): well past
# keysync's NEXT_BATCH_HOLD_S (0.25 s), the longest a healthy keysync leaves it open.
OPEN_TAKE_IDLE_LIMIT_S = 10.0

# Every statement's deadline. A server that dies mid-COPY can leave the client waiting
# to write forever; the deadline turns that into an outage the caller rides out.
COMMAND_TIMEOUT_S = 30.0


class ColdStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        timeout_s: float = COMMAND_TIMEOUT_S,
        dsn: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self.dsn = dsn  # what it connects to (the fence asks every host of it)
        self.connect_timeout_s = connect_timeout_s
        # How long a take's transaction may stay open and idle (0: no limit).
        self.open_take_idle_limit_s = OPEN_TAKE_IDLE_LIMIT_S
        # type -> (import epoch, first counter not leased, excluded counters from it to
        # the share's end) as last counted (``sequence_state``).
        self._excluded_ahead: dict[str, tuple[int, int, int]] = {}

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        pooler: str = "none",
    ) -> ColdStore:
        """A pool on ``dsn``; each host of a multi-host DSN gets ``connect_timeout_s``
        (connect.py): a frozen host listed first costs one connect timeout. ``pooler``:
        what stands before PostgreSQL (``postgres_pooler``, connect.driver_options)."""

        async def connect(*args: Any, **options: Any) -> asyncpg.Connection:
            return await connect_each_host(*args, host_timeout_s=connect_timeout_s, **options)

        check_files(dsn)
        try:
            async with translated("connect"):
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=min_size,
                    max_size=max_size,
                    command_timeout=command_timeout_s,
                    connect=connect,
                    **driver_options(pooler),
                )
        except SchemaError as exc:
            raise SchemaError(f"postgres {where(dsn)}: {exc.__cause__}: {NO_DATABASE}") from exc
        except ConfigError as exc:
            if str(exc).endswith(POOLER_SAYS):  # it does not say whom it refused
                raise ConfigError(f"{exc}, logging in as {user_of(dsn)!r}") from exc
            raise
        return cls(pool, command_timeout_s, dsn, connect_timeout_s)

    @classmethod
    async def for_settings(
        cls, settings: PostgresSettings, *, min_size: int = 1, max_size: int = 4
    ) -> ColdStore:
        """``connect`` to ``postgres_dsn`` as the settings say (connect timeout, pooler)."""
        return await cls.connect(
            settings.postgres_dsn,
            min_size=min_size,
            max_size=max_size,
            connect_timeout_s=settings.postgres_connect_timeout_s,
            pooler=settings.postgres_pooler,
        )

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection of the pool for a block of statements: given back after it, or
        discarded when the block was interrupted (``INTERRUPTIONS``)."""
        async with translated("acquire"):
            conn = await self._pool.acquire()
        failed: BaseException | None = None
        try:
            yield conn
        except BaseException as exc:
            failed = exc
            raise
        finally:
            await _release(self._pool, conn, failed)

    async def lease_range(
        self, id_type: IdType, lessee: str, record: Record
    ) -> tuple[LeasedRange, Stamp]:
        """Lease the next ``range_size`` counters behind the guard (sql.py).

        KeyspaceExhausted at MAXVALUE; PostgresBehind when this server's history does
        not cover ``record`` (nothing was leased).
        """
        statement = sql.for_type(sql.LEASE_RANGE, id_type.name)
        size = id_type.config.range_size
        try:
            async with self.connection() as conn, translated("lease_range"):
                args = (*record.guard_args(), id_type.name, size, lessee)
                row = await conn.fetchrow(statement, *args)
        except asyncpg.SequenceGeneratorLimitExceededError as exc:
            raise KeyspaceExhausted(id_type.name) from exc
        if row is None:
            raise PostgresBehind(f"lease of '{id_type.name}' refused by the guard")
        stamp = Stamp.of(row)
        return LeasedRange(int(row["range_start"]), int(row["range_end"]), stamp.fences), stamp

    async def insert_keys(
        self,
        id_type: IdType,
        leased: LeasedRange,
        keys: Sequence[str],
        candidates: int,
        *,
        final: bool,
        before_commit: Callable[[], object] = lambda: None,
        counters: tuple[int, int] | None = None,
    ) -> None:
        """Bulk-load keys of a range (COPY) and account for them, atomically.

        ``keys`` come from the ``counters`` of the range (default: all of it); those an
        import excluded are left out, read with one range query on their counters under
        the import lock (sql.LOCK_IMPORT_SHARED): an import running meanwhile removes
        what this commits, or this sees what it excluded.
        ``final`` marks the range filled: every key of it is now in the cold table.
        ``before_commit`` runs after the COPY, before the accounting and the commit
        (keygen's ``keygen.copied`` fault point). RangeFenced when a PostgreSQL fence ran
        since the range was leased (nothing is copied: the range is abandoned).
        """
        async with translated("insert_keys"):
            conn = await self._pool.acquire()
        failed: BaseException | None = None
        try:
            async with translated("insert_keys"), conn.transaction():
                await conn.execute(sql.LIMIT_COPY, str(round(self._timeout_s * 1000)))
                if int(await conn.fetchval(sql.LOCK_FENCES)) != leased.fences:
                    raise RangeFenced(id_type.name, leased.start)
                keys = await _without_excluded(conn, id_type.name, keys, counters or leased)
                copy = conn.copy_records_to_table(
                    sql.cold_table_name(id_type.name),
                    records=[(k,) for k in keys],
                    columns=["key"],
                )
                # The driver's own timeout does not cover a COPY whose server died: a
                # deadline of ours does (the connection is then discarded).
                await asyncio.wait_for(copy, self._timeout_s)
                before_commit()
                await conn.execute(
                    sql.ACCOUNT_RANGE, id_type.name, leased.start, candidates, len(keys), final
                )
        except BaseException as exc:
            failed = exc
            raise
        finally:
            # The transaction alone decides the outcome, as for a take (``_end``): a
            # committed slice reported as an outage would make keygen abandon its range.
            await _release(self._pool, conn, failed)

    async def begin_take(
        self, name: str, size: int, record: Record, *, in_order: bool = False
    ) -> OpenTake:
        """Remove up to ``size`` keys behind the guard (``in_order``: the lowest, sorted),
        leaving the transaction open: nothing is taken until ``OpenTake.commit``.
        PostgresBehind when this server's history does not cover ``record``."""
        statement = sql.for_type(sql.TAKE_BATCH_IN_ORDER if in_order else sql.TAKE_BATCH, name)
        async with translated("take_batch"):
            conn = await self._pool.acquire()
        transaction = conn.transaction()
        try:
            async with translated("take_batch"):
                await transaction.start()
                idle_limit_ms = round(self.open_take_idle_limit_s * 1000)
                await conn.execute(sql.LIMIT_IDLE_TAKE, str(idle_limit_ms))
                guard = await conn.fetchrow(fence_sql.GUARD_TAKE, *record.guard_args())
                if guard is None:
                    raise PostgresBehind(f"batch of '{name}' refused by the guard")
                row = one_row(await conn.fetchrow(statement, size, name), "take_batch")
            keys = unpack_keys(row["keys"], int(row["taken"]))
        except BaseException as exc:
            await _roll_back(self._pool, conn, transaction, exc)
            raise
        stamp = Stamp.of(guard)
        return OpenTake(keys, stamp, self._pool, conn, transaction, epoch=int(row["epoch"]))

    async def take_batch(
        self, name: str, size: int, record: Record, *, in_order: bool = False
    ) -> tuple[list[str], Stamp]:
        """``begin_take`` and commit: the keys are taken when this returns."""
        taken = await self.begin_take(name, size, record, in_order=in_order)
        await taken.commit()
        return taken.keys, taken.stamp

    async def depth(self, name: str, cap: int) -> int:
        """Cold keys of a type, counted up to ``cap``."""
        async with self.connection() as conn, translated("depth"):
            value = await conn.fetchval(sql.COUNT_COLD_UP_TO, name, cap)
        return int(value)

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        """The counters of the share leased, and the excluded ones still ahead (an
        import's: headroom does not count them)."""
        config = id_type.config
        async with self.connection() as conn, translated("sequence_state"):
            row = await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, id_type.name))
            row = one_row(row, "sequence_state")
            end = int(row["last_value"]) + config.range_size if row["is_called"] else None
            leased = 0 if end is None else min(end, config.counter_stop) - config.counter_start
            first = config.counter_start + leased
            ahead = await self._count_excluded_ahead(conn, id_type, first)
        return SequenceState(leased, config.counter_share, ahead)

    async def _count_excluded_ahead(self, conn: Any, id_type: IdType, first: int) -> int:
        """The excluded counters from ``first`` to the share's end. Counted whole once
        per import epoch (a scan of every one: 10^7 after a large import, which took
        keygen's rate down by 62% when counted after every range), then by what the
        leases since passed over. The epoch is read before the count: an import
        committed in between is seen by the next call, which counts whole again."""
        name, stop = id_type.name, id_type.config.counter_stop
        epoch = int(await conn.fetchval(sql.SELECT_IMPORT_EPOCH, name))
        cached = self._excluded_ahead.get(name)
        if cached is not None and cached[0] == epoch and cached[1] <= first:
            passed = await conn.fetchval(sql.COUNT_EXCLUDED_BETWEEN, name, cached[1], first)
            ahead = cached[2] - int(passed)
        else:
            ahead = int(await conn.fetchval(sql.COUNT_EXCLUDED_BETWEEN, name, first, stop))
        self._excluded_ahead[name] = (epoch, first, ahead)
        return ahead

    async def range_stats(self, name: str) -> dict[str, int]:
        async with self.connection() as conn, translated("range_stats"):
            row = await conn.fetchrow(sql.SELECT_RANGE_STATS, name)
        row = one_row(row, "range_stats")
        return {key: int(row[key]) for key in ("leased", "filled", "candidates", "accepted")}

    async def import_epoch(self, name: str) -> int:
        """The type's import epoch now (0: never imported into)."""
        async with self.connection() as conn, translated("import_epoch"):
            return int(await conn.fetchval(sql.SELECT_IMPORT_EPOCH, name))

    async def wake_keygen(self, name: str) -> None:
        async with self.connection() as conn, translated("wake_keygen"):
            await conn.execute(sql.NOTIFY, sql.KEYGEN_CHANNEL, name)
