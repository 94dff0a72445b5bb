"""PostgreSQL for the simulation: a tree of commits, served through asyncpg's interface.

The real stores run unchanged on it (``ColdStore`` over ``SimPool``): every statement
they send is one of the constants of the runtime's SQL modules, and is answered here by
the handler of that constant's name (as procrastinate's in-memory connector answers by
query name). ``tests/integration/test_simulation_conformance.py`` runs the same
ledger histories on this and on a real server and compares every table.

What it keeps of PostgreSQL, and what it does not:
- A commit is a node of a tree; a promotion makes the primary's latest commit an
  ancestor of the old one's (a replica that had replayed up to it: the rest is lost) on
  a new timeline; connections to the old primary break.
- Transactions that write are serial: one at a time per server (the first statement of
  each waits for the one before to end). The real code serialises its decisions with the
  clock row's lock and an advisory lock, so a serial history is one PostgreSQL can give;
  what it gives besides (statements of two transactions interleaved) is not explored.
  Read-only transactions (the ledger's lookups) read the commit they began on.
- ``idle_in_transaction_session_timeout`` and ``lock_timeout`` (set per transaction by
  the fence and the take) are kept: a paused process's transaction is ended by the
  server, a fence waits for the lock only that long.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg

from shared.stores.fence import sql as fence_sql
from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql as postgres_sql
from shared.stores.postgres.cold_store import ColdStore

Row = dict[str, Any]
SQL_MODULES = (fence_sql, ledger_sql, postgres_sql)


def _now() -> datetime:
    import time

    return datetime.fromtimestamp(time.time(), UTC)


@dataclass
class Tables:
    """One committed state of the database (the tables the processes reach)."""

    clock: dict[str, Any] = field(
        default_factory=lambda: {
            "timeline": 0,
            "fork": 0,
            "clock": 0,
            "fences": 0,
            "ledger_heads": {},
            "ledger_prev": None,
            "ledger_restore": {},
        }
    )
    ledger: dict[str, dict[str, Row]] = field(default_factory=dict)
    released: dict[tuple[str, str, str], Row] = field(default_factory=dict)
    early: dict[tuple[str, str, str], Row] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], Row] = field(default_factory=dict)
    links: dict[str, Row] = field(default_factory=dict)
    cold: dict[str, dict[str, None]] = field(default_factory=dict)
    sequences: dict[str, Row] = field(default_factory=dict)
    ranges: list[Row] = field(default_factory=list)
    fence_events: list[Row] = field(default_factory=list)
    quarantined: set[tuple[str, str]] = field(default_factory=set)  # (type, key)

    def copy(self) -> Tables:
        """A copy a transaction may change: every table and row its own (rows hold
        values only; the clock's nested dicts are replaced, never changed in place)."""
        return Tables(
            clock=dict(self.clock),
            ledger={t: {k: dict(r) for k, r in rows.items()} for t, rows in self.ledger.items()},
            released={k: dict(r) for k, r in self.released.items()},
            early={k: dict(r) for k, r in self.early.items()},
            outcomes={k: dict(r) for k, r in self.outcomes.items()},
            links=dict(self.links),
            cold={t: dict(keys) for t, keys in self.cold.items()},
            sequences={t: dict(seq) for t, seq in self.sequences.items()},
            ranges=[dict(r) for r in self.ranges],
            fence_events=list(self.fence_events),
            quarantined=set(self.quarantined),
        )


@dataclass
class Commit:
    """A node of the commit tree: the state after a transaction committed."""

    number: int
    parent: Commit | None
    tables: Tables
    timeline: int  # the server's timeline when it committed
    statements: tuple[str, ...] = ()  # the names of what the transaction ran

    def ancestors(self) -> list[Commit]:
        """This commit and every one before it, newest first."""
        found: list[Commit] = []
        node: Commit | None = self
        while node is not None:
            found.append(node)
            node = node.parent
        return found


class Broken(asyncpg.exceptions.ConnectionDoesNotExistError):
    """The connection's server was promoted away, or ended its transaction."""


class LockTimeout(asyncpg.exceptions.LockNotAvailableError):
    """lock_timeout passed while waiting for the server's write lock."""


CommitListener = Callable[["Commit", "SimConnection"], None]


class SimPostgres:
    """The database across its servers: the commit tree, the primary's latest commit
    and timeline, and the write lock of the server that is primary now."""

    def __init__(self, types: dict[str, int], latency: Callable[[], float]) -> None:
        """``types``: each pooled type and its range size (its sequence's increment)."""
        tables = Tables()
        for name, size in types.items():
            tables.ledger[name] = {}
            tables.cold[name] = {}
            tables.sequences[name] = {
                "last_value": 0,
                "is_called": False,
                "increment_by": size,
                "min_value": 0,
                "max_value": 2**62,
            }
        self.root = Commit(0, None, tables, 1)
        self.head = self.root  # the primary's latest commit
        self.timeline = 1
        self.epoch = 0  # the primary's incarnation: a promotion starts a new one
        self.identity = "7000000000000000001/kd_sim"
        self.commits = [self.root]
        self._latency = latency
        self._owner: SimConnection | None = None  # the transaction holding the lock
        self._waiters: list[asyncio.Future[None]] = []
        self.listeners: list[CommitListener] = []
        # Told of each ledger transaction the guard refused, and of each transaction
        # begun (with whether it reads only).
        self.refusal_listeners: list[Callable[[SimConnection], None]] = []
        self.begin_listeners: list[Callable[[SimConnection, bool], None]] = []
        self._dispatch = _dispatch_table(list(types))

    # --- faults -------------------------------------------------------------------

    def promote(self, to: Commit) -> None:
        """``to`` (the primary's latest commit or an ancestor) becomes the primary's
        latest commit, on a new timeline; every connection to the old primary breaks."""
        assert to in self.head.ancestors(), "a replica replays the primary's history only"
        self.head = to
        self.timeline += 1
        self.epoch += 1
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.broken = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(Broken("the server went away"))
        self._waiters.clear()

    # --- the write lock ---------------------------------------------------------------

    async def lock(self, conn: SimConnection) -> None:
        while self._owner is not None and self._owner is not conn:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                if conn.lock_timeout_s:
                    await asyncio.wait_for(asyncio.shield(waiter), conn.lock_timeout_s)
                else:
                    await waiter
            except TimeoutError as exc:
                raise LockTimeout("canceling statement due to lock timeout") from exc
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            conn.check()
        self._owner = conn

    def unlock(self, conn: SimConnection) -> None:
        if self._owner is conn:
            self._owner = None
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
                    break

    # --- commits ------------------------------------------------------------------

    def commit(self, conn: SimConnection, tables: Tables, statements: tuple[str, ...]) -> None:
        node = Commit(len(self.commits), self.head, tables, self.timeline, statements)
        self.commits.append(node)
        self.head = node
        for listener in self.listeners:
            listener(node, conn)

    # --- statements -----------------------------------------------------------------

    def run(self, tables: Tables, conn: SimConnection, sql: str, args: tuple[Any, ...]) -> Any:
        try:
            name, type_name = self._dispatch[sql]
        except KeyError:
            raise NotImplementedError(
                f"the simulation does not know this statement: {sql[:80]}"
            ) from None
        conn.ran.append(name)
        return HANDLERS[name](Context(self, tables, conn, type_name), *args)

    async def io(self) -> None:
        """A statement, or its reply, in flight."""
        await asyncio.sleep(self._latency())


def _dispatch_table(types: list[str]) -> dict[str, tuple[str, str]]:
    """Each statement's text, for each type, -> (its constant's name, the type)."""
    found: dict[str, tuple[str, str]] = {}
    for module in SQL_MODULES:
        for name, value in vars(module).items():
            if not name.isupper() or not isinstance(value, str) or name not in HANDLERS:
                continue
            if "{" not in value:
                found[value] = (name, "")
                continue
            for type_name in types:
                found[postgres_sql.for_type(value, type_name)] = (name, type_name)
    return found


@dataclass
class Context:
    server: SimPostgres
    tables: Tables
    conn: SimConnection
    type_name: str

    @property
    def now(self) -> datetime:
        return self.conn.transaction_start or _now()

    @property
    def ledger(self) -> dict[str, Row]:
        return self.tables.ledger[self.type_name]

    @property
    def cold(self) -> dict[str, None]:
        return self.tables.cold[self.type_name]


# --- the connection, the pool -------------------------------------------------------


class SimTransaction:
    def __init__(self, conn: SimConnection, readonly: bool) -> None:
        self._conn = conn
        self._readonly = readonly

    async def start(self) -> None:
        await self._conn.begin(self._readonly)

    async def commit(self) -> None:
        await self._conn.end(commit=True)

    async def rollback(self) -> None:
        await self._conn.end(commit=False)

    async def __aenter__(self) -> SimTransaction:
        await self.start()
        return self

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self._conn.in_transaction:
            await self.end(commit=kind is None)

    async def end(self, commit: bool) -> None:
        await self._conn.end(commit=commit)


class SimConnection:
    """One session, to the primary of the epoch it was opened in."""

    def __init__(self, server: SimPostgres, actor: str) -> None:
        self.server = server
        self.actor = actor
        self.epoch = server.epoch
        self.broken = False
        self.in_transaction = False
        self.readonly = False
        self.tables: Tables | None = None
        self.snapshot: Commit | None = None  # what a read-only transaction reads
        self.transaction_start: datetime | None = None
        self.ran: list[str] = []
        self.restored = ""  # the target of the restore its ledger transaction is
        self.idle_limit_s = 0.0
        self.lock_timeout_s = 0.0
        self._idle: asyncio.TimerHandle | None = None

    def check(self) -> None:
        if self.broken or self.epoch != self.server.epoch:
            self.broken = True
            raise Broken("connection was closed in the middle of operation")

    def transaction(self, isolation: str | None = None, readonly: bool = False) -> SimTransaction:
        return SimTransaction(self, readonly)

    async def begin(self, readonly: bool) -> None:
        await self.server.io()
        self.check()
        self.in_transaction, self.readonly = True, readonly
        self.transaction_start = _now()
        self.ran = []
        if readonly:
            self.snapshot = self.server.head
            self.tables = self.server.head.tables
        for listener in self.server.begin_listeners:
            listener(self, readonly)
        await self.server.io()

    async def end(self, commit: bool) -> None:
        self._stop_idle()
        await self.server.io()
        try:
            if not self.in_transaction:
                return
            if commit:
                self.check()
            if commit and not self.readonly and self.tables is not None and self._wrote():
                self.server.commit(self, self.tables, tuple(self.ran))
        finally:
            self._close_transaction()
        await self.server.io()
        self.check() if commit else None

    def _wrote(self) -> bool:
        return any(name not in READ_ONLY for name in self.ran)

    def _close_transaction(self) -> None:
        if not self.readonly:
            self.server.unlock(self)
        self.in_transaction, self.readonly, self.tables, self.snapshot = False, False, None, None
        self.transaction_start = None
        self.idle_limit_s = self.lock_timeout_s = 0.0

    async def _statement(self, sql: str, args: tuple[Any, ...]) -> Any:
        self._stop_idle()
        await self.server.io()
        self.check()
        if not self.in_transaction:
            return await self._autocommit(sql, args)
        if not self.readonly and self.tables is None:
            await self.server.lock(self)
            self.check()
            self.tables = self.server.head.tables.copy()
        assert self.tables is not None
        result = self.server.run(self.tables, self, sql, args)
        await self.server.io()
        self.check()
        self._start_idle()
        return result

    async def _autocommit(self, sql: str, args: tuple[Any, ...]) -> Any:
        await self.server.lock(self)
        try:
            self.check()
            self.ran = []
            tables = self.server.head.tables.copy()
            result = self.server.run(tables, self, sql, args)
            if self._wrote():
                self.server.commit(self, tables, tuple(self.ran))
        finally:
            self.server.unlock(self)
        await self.server.io()
        self.check()
        return result

    def _start_idle(self) -> None:
        if self.idle_limit_s:
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self.idle_limit_s, self._idle_timeout)

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_timeout(self) -> None:
        """idle_in_transaction_session_timeout: the server ends the session."""
        self.broken = True
        self._close_transaction()

    async def execute(self, sql: str, *args: Any) -> str:
        await self._statement(sql, args)
        return "OK"

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        found = await self._statement(sql, args)
        return list(found or [])

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        found = await self._statement(sql, args)
        return found[0] if found else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        found = await self._statement(sql, args)
        if not found:
            return None
        return next(iter(found[0].values()))

    def is_closed(self) -> bool:
        return self.broken

    def terminate(self) -> None:
        """Close at once (asyncpg's): the server ends what it was doing."""
        self.broken = True
        if self.in_transaction:
            self._close_transaction()


class SimPool:
    """asyncpg's pool, as ``ColdStore`` uses it: a fresh session per acquire, to whichever
    server is primary then (a multi-host DSN with target_session_attrs=read-write)."""

    def __init__(self, server: SimPostgres, actor: Callable[[], str]) -> None:
        self._server = server
        self._actor = actor

    def acquire(self) -> _Acquire:
        return _Acquire(self)

    async def _open(self) -> SimConnection:
        await self._server.io()
        return SimConnection(self._server, self._actor())

    async def release(self, conn: SimConnection) -> None:
        if conn.in_transaction:
            conn._close_transaction()

    async def close(self) -> None:
        return None

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        async with self.acquire() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        async with self.acquire() as conn:
            return await conn.fetch(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        async with self.acquire() as conn:
            return await conn.execute(sql, *args)


class _Acquire:
    def __init__(self, pool: SimPool) -> None:
        self._pool = pool
        self._conn: SimConnection | None = None

    def __await__(self) -> Any:
        return self._pool._open().__await__()

    async def __aenter__(self) -> SimConnection:
        self._conn = await self._pool._open()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._pool.release(self._conn)


@asynccontextmanager
async def no_op() -> AsyncIterator[None]:
    yield


# --- the handlers, by statement name --------------------------------------------------

READ_ONLY = frozenset(
    {
        "SELECT_LEDGER_STATE",
        "LOCK_SYNC_CLOCK",
        "SELECT_FENCED_TYPES",
        "SELECT_LEASED_HIGHS",
        "LIMIT_FENCE",
        "LIMIT_IDLE_TAKE",
        "SELECT_SEQUENCE_STATE",
        "NOTIFY",
        "SELECT_NOT_INSERTED",
        "SELECT_ISSUED_TWICE",
        "HAS_EARLY_MARKS",
        "SELECT_LEDGER_ENTRIES",
        "SELECT_RELEASED_KEYS",
        "LOCK_LEDGER",
        "LOCK_LEDGER_SHARED",
        "SELECT_LEDGER_KEY",
        "SELECT_RELEASED_ISSUE",
        "SELECT_OUTCOMES",
        "HOLDS_LINK",
        "SELECT_HELD_LINKS",
        "SELECT_DATABASE_IDENTITY",
    }
)


def _heads_text(clock: dict[str, Any]) -> str:
    return json.dumps(clock["ledger_heads"], separators=(", ", ": "))


def _stamp(ctx: Context, **extra: Any) -> Row:
    clock = ctx.tables.clock
    return {
        "timeline": clock["timeline"],
        "fork": clock["fork"],
        "clock": clock["clock"],
        "fences": clock["fences"],
        "heads": _heads_text(clock),
        "database": ctx.server.identity,
        **extra,
    }


def _state(ctx: Context) -> list[Row]:
    clock = ctx.tables.clock
    return [
        {
            **_stamp(ctx),
            "restore_to": json.dumps(clock["ledger_restore"]),
            "here": ctx.server.timeline,
        }
    ]


def _history_start(clock: dict[str, Any], here: int) -> int:
    return int(clock["clock"]) if clock["timeline"] != here else int(clock["fork"])


def _guard_passes(ctx: Context, timeline: int, clock_at: int, fork: int, flags: int) -> bool:
    """fence_sql._GUARD_WHERE."""
    clock, here = ctx.tables.clock, ctx.server.timeline
    if flags & 1:
        return False
    if flags & 2 and clock["timeline"] != here:
        return False
    if flags & 4 and here != timeline:
        return False
    start = _history_start(clock, here)
    if here == timeline:
        return int(clock["clock"]) >= clock_at and start == fork
    if here > timeline:
        return start >= clock_at
    return False


def _advance(ctx: Context) -> None:
    """The guard's SET: the clock moves on, a new timeline starts a new fork."""
    clock, here = ctx.tables.clock, ctx.server.timeline
    if clock["timeline"] != here:
        clock["fork"] = clock["clock"]
    clock["timeline"] = here
    clock["clock"] += 1


def GUARD_TAKE(ctx: Context, timeline: int, clock: int, fork: int, flags: int) -> list[Row]:
    if not _guard_passes(ctx, timeline, clock, fork, flags):
        return []
    _advance(ctx)
    return [_stamp(ctx)]


def GUARD_LEDGER(
    ctx: Context,
    timeline: int,
    clock_at: int,
    fork: int,
    flags: int,
    lane: str,
    link: str,
    restored: str,
) -> list[Row]:
    clock = ctx.tables.clock
    ctx.conn.restored = restored
    if clock["ledger_restore"].get(lane, "") not in ("", restored) or not _guard_passes(
        ctx, timeline, clock_at, fork, flags
    ):
        for listener in ctx.server.refusal_listeners:
            listener(ctx.conn)
        return []
    prev = clock["ledger_heads"].get(lane)
    _advance(ctx)
    clock["ledger_prev"] = prev
    clock["ledger_heads"] = {**clock["ledger_heads"], lane: link}
    if restored:
        clock["ledger_restore"] = {k: v for k, v in clock["ledger_restore"].items() if k != lane}
    return [_stamp(ctx, prev=prev)]


def SELECT_LEDGER_STATE(ctx: Context) -> list[Row]:
    return _state(ctx)


def LOCK_SYNC_CLOCK(ctx: Context) -> list[Row]:
    return _state(ctx)


def VOUCH(ctx: Context) -> list[Row]:
    _advance(ctx)
    return [{**_stamp(ctx), "restore_to": json.dumps(ctx.tables.clock["ledger_restore"])}]


def SELECT_FENCED_TYPES(ctx: Context) -> list[Row]:
    rows = []
    for name in sorted(ctx.tables.sequences):
        seq = ctx.tables.sequences[name]
        rows.append(
            {
                "name": name,
                "increment_by": seq["increment_by"],
                "min_value": seq["min_value"],
                "max_value": seq["max_value"],
                "last_value": seq["last_value"] if seq["is_called"] else None,
                "has_cold": name in ctx.tables.cold,
            }
        )
    return rows


def LIMIT_FENCE(ctx: Context, ms: str) -> list[Row]:
    ctx.conn.idle_limit_s = ctx.conn.lock_timeout_s = int(ms) / 1000
    return [{"set_config": ms}]


def LIMIT_IDLE_TAKE(ctx: Context, ms: str) -> list[Row]:
    ctx.conn.idle_limit_s = int(ms) / 1000
    return [{"set_config": ms}]


def SELECT_LEASED_HIGHS(ctx: Context) -> list[Row]:
    highs: dict[str, int] = {}
    for lease in ctx.tables.ranges:
        highs[lease["id_type"]] = max(highs.get(lease["id_type"], 0), lease["range_end"])
    return [{"id_type": name, "highest": high} for name, high in highs.items()]


def DISCARD_COLD(ctx: Context) -> list[Row]:
    gone = len(ctx.cold)
    ctx.cold.clear()
    return [{"count": gone}]


def SET_SEQUENCE(ctx: Context, value: int) -> list[Row]:
    seq = ctx.tables.sequences[ctx.type_name]
    seq["last_value"], seq["is_called"] = int(value), True
    return [{"setval": value}]


def RESET_SYNC_CLOCK(ctx: Context, timeline: int, floor: int) -> list[Row]:
    clock = ctx.tables.clock
    top = max(int(clock["clock"]), int(floor))
    clock.update(timeline=timeline, fork=top, clock=top + 1, fences=clock["fences"] + 1)
    return [_stamp(ctx)]


def INSERT_FENCE_EVENT(ctx: Context, reason: str, discarded: int, detail: str) -> list[Row]:
    ctx.tables.fence_events.append({"reason": reason, "keys_discarded": discarded})
    return []


def SELECT_DATABASE_IDENTITY(ctx: Context) -> list[Row]:
    return [{"?column?": ctx.server.identity}]


def SELECT_SEQUENCE_STATE(ctx: Context) -> list[Row]:
    seq = ctx.tables.sequences[ctx.type_name]
    return [{"last_value": seq["last_value"], "is_called": seq["is_called"]}]


def NOTIFY(ctx: Context, channel: str, payload: str) -> list[Row]:
    return [{"pg_notify": None}]


def TAKE_BATCH(ctx: Context, size: int, type_name: str) -> list[Row]:
    keys = list(ctx.cold)[: int(size)]
    for key in keys:
        del ctx.cold[key]
    return [{"taken": len(keys), "keys": "\n".join(keys) if keys else None, "epoch": 0}]


def TAKE_BATCH_IN_ORDER(ctx: Context, size: int, type_name: str) -> list[Row]:
    keys = sorted(ctx.cold)[: int(size)]
    for key in keys:
        del ctx.cold[key]
    return [{"taken": len(keys), "keys": "\n".join(keys) if keys else None, "epoch": 0}]


# Imports (keydispenser import) are not part of the simulation's world: no ID is
# excluded, no import epoch is ever set; the import lock is free.


def SELECT_IMPORT_EPOCH(ctx: Context, type_name: str) -> list[Row]:
    return [{"epoch": 0}]


def LOCK_IMPORT_SHARED(ctx: Context, type_name: str) -> None:
    return None


def COUNT_EXCLUDED_BETWEEN(ctx: Context, type_name: str, first: int, end: int) -> list[Row]:
    return [{"count": 0}]


def SELECT_EXCLUDED_IN_RANGE(ctx: Context, type_name: str, first: int, end: int) -> list[Row]:
    return []


# --- the ledger ----------------------------------------------------------------------


def _issue_batch(
    keys: list[str], times: list[datetime], clients: list[str], idem: list[Any], entries: list[str]
) -> list[Row]:
    """ledger_sql._ISSUE_BATCH: one row per key of each issue entry."""
    rows = []
    for each, at, names, key_of, entry in zip(keys, times, clients, idem, entries, strict=True):
        split_keys, split_clients = each.split(" "), names.split(" ")
        first = names.split(" ")[0]
        for index, key in enumerate(split_keys):
            client = split_clients[index] if index < len(split_clients) else None
            rows.append(
                {
                    "key": key,
                    "issued_at": at,
                    "client": client if client is not None else first,
                    "idempotency_key": key_of,
                    "entry_id": entry,
                }
            )
    return rows


def _released_by_entry(ctx: Context, type_name: str, key: str, entry: str) -> bool:
    return (type_name, key, entry) in ctx.tables.released


def INSERT_LEDGER_ISSUED(ctx: Context, *args: Any) -> list[Row]:
    *batch, type_name = args
    inserted = 0
    for row in _issue_batch(*batch):
        if _released_by_entry(ctx, type_name, row["key"], row["entry_id"]):
            continue
        if row["key"] in ctx.ledger:
            continue
        ctx.ledger[row["key"]] = {
            **row,
            "used_at": None,
            "used_by": None,
            "released_at": None,
            "released_by": None,
        }
        inserted += 1
    return [{"count": inserted}]


def SELECT_ISSUED_TWICE(ctx: Context, *args: Any) -> list[Row]:
    *batch, type_name = args
    found = []
    for row in _issue_batch(*batch):
        held = ctx.ledger.get(row["key"])
        if held is None or held["entry_id"] == row["entry_id"]:
            continue
        if not _released_by_entry(ctx, type_name, row["key"], row["entry_id"]):
            found.append({"key": row["key"]})
    return found


def SELECT_NOT_INSERTED(ctx: Context, *args: Any) -> list[Row]:
    found = []
    for row in _issue_batch(*args):
        held = ctx.ledger.get(row["key"])
        if held is None or held["entry_id"] != row["entry_id"]:
            found.append({"issue": f"{row['entry_id']} {row['key']}"})
    return found


def HAS_EARLY_MARKS(ctx: Context, type_name: str) -> list[Row]:
    return [{"exists": any(k[0] == type_name for k in ctx.tables.early)}]


def SELECT_LEDGER_ENTRIES(ctx: Context, keys: list[str]) -> list[Row]:
    return [
        {k: ctx.ledger[key][k] for k in ("key", "entry_id", "client", "used_at")}
        for key in keys
        if key in ctx.ledger
    ]


def _markable(row: Row, at: datetime, client: str, admin: bool) -> bool:
    return (
        row["used_at"] is None
        and row["released_at"] is None
        and at >= row["issued_at"]
        and (admin or row["client"] == client)
    )


def UPDATE_LEDGER_USED(
    ctx: Context, keys: list[str], times: list[datetime], clients: list[str], admin: list[bool]
) -> list[Row]:
    done = []
    for key, at, client, may in zip(keys, times, clients, admin, strict=True):
        row = ctx.ledger.get(key)
        if row is None or not _markable(row, at, client, may):
            continue
        row.update(used_at=at, used_by=client)
        done.append({"key": key, "used_at": at, "used_by": client})
    return done


def RELEASE_LEDGER(
    ctx: Context,
    keys: list[str],
    times: list[datetime],
    clients: list[str],
    admin: list[bool],
    type_name: str,
) -> list[Row]:
    done = []
    for key, at, client, may in zip(keys, times, clients, admin, strict=True):
        row = ctx.ledger.get(key)
        if row is None or not _markable(row, at, client, may):
            continue
        if (type_name, key) in ctx.tables.quarantined:
            continue
        row.update(released_at=at, released_by=client)
        done.append({"key": key, "released_at": at, "released_by": client})
    return done


def RELEASE_TO_HISTORY(
    ctx: Context,
    type_name: str,
    keys: list[str],
    times: list[datetime],
    clients: list[str],
    admin: list[bool],
    entries: list[str],
) -> list[Row]:
    done = []
    for key, at, client, may, entry in zip(keys, times, clients, admin, entries, strict=True):
        row = ctx.ledger.get(key)
        if row is None or not _markable(row, at, client, may):
            continue
        if (type_name, key) in ctx.tables.quarantined:
            continue
        if any(
            k[0] == type_name and k[1] == key and r["release_entry"] == entry
            for k, r in ctx.tables.released.items()
        ):
            continue
        del ctx.ledger[key]
        place = (type_name, key, row["entry_id"])
        if place in ctx.tables.released:
            continue
        ctx.tables.released[place] = _history_row(row, at, client, entry, ctx.now)
        done.append(
            {"key": key, "released_at": at, "released_by": client, "release_entry": entry}
            | {"recorded_at": ctx.now}
        )
    return done


def _history_row(row: Row, at: datetime, by: str, entry: str, recorded: datetime) -> Row:
    return {
        "issued_at": row["issued_at"],
        "client": row["client"],
        "idempotency_key": row["idempotency_key"],
        "released_at": at,
        "released_by": by,
        "release_entry": entry,
        "recorded_at": recorded,
        "requeued_at": None,
        "requeue_discarded": False,
    }


def REQUEUE_RELEASED(ctx: Context, type_name: str, seconds: float) -> list[Row]:
    due = ctx.now - timedelta(seconds=float(seconds))
    rows = []
    for (kind, key, entry), row in sorted(ctx.tables.released.items()):
        if kind != type_name or row["requeued_at"] is not None or row["recorded_at"] > due:
            continue
        discarded = key in ctx.tables.ledger[type_name]
        discarded = discarded or (type_name, key) in ctx.tables.quarantined
        row.update(requeued_at=ctx.now, requeue_discarded=discarded)
        back = False
        if not discarded and key not in ctx.tables.cold[type_name]:
            ctx.tables.cold[type_name][key] = None
            back = True
        rows.append(
            {
                "key": key,
                "entry_id": entry,
                "requeue_discarded": discarded,
                "requeued_at": ctx.now,
                "back": back,
            }
        )
    return rows


def SETTLE_RELEASES(ctx: Context) -> list[Row]:
    counts: dict[str, int] = {}
    for (kind, _, _), row in ctx.tables.released.items():
        if row["requeued_at"] is None:
            row.update(requeued_at=ctx.now, requeue_discarded=True)
            counts[kind] = counts.get(kind, 0) + 1
    return [{"id_type": kind, "releases": n} for kind, n in counts.items()]


def IS_QUARANTINED(ctx: Context, key: str, type_name: str) -> list[Row]:
    return [{"exists": (type_name, key) in ctx.tables.quarantined}]


def SELECT_RELEASED_KEYS(ctx: Context, type_name: str, keys: list[str]) -> list[Row]:
    held = {k[1] for k in ctx.tables.released if k[0] == type_name}
    return [{"key": key} for key in sorted(set(keys) & held)]


def LOCK_LEDGER(ctx: Context, lock: int) -> list[Row]:
    return [{"pg_advisory_xact_lock": None}]


def LOCK_LEDGER_SHARED(ctx: Context, lock: int) -> list[Row]:
    return [{"pg_advisory_xact_lock_shared": None}]


def INSERT_EARLY_MARKS(
    ctx: Context,
    type_name: str,
    keys: list[str],
    times: list[datetime],
    clients: list[str],
    admin: list[bool],
) -> list[Row]:
    for key, at, client, may in zip(keys, times, clients, admin, strict=True):
        ctx.tables.early.setdefault(
            (type_name, key, client), {"used_at": at, "admin": may, "received_at": ctx.now}
        )
    return []


def APPLY_EARLY_MARKS(ctx: Context, type_name: str, keys: list[str]) -> list[Row]:
    early = [
        (k[1], k[2], row)
        for k, row in sorted(ctx.tables.early.items())
        if k[0] == type_name and k[1] in keys
    ]
    for key, by, _ in early:
        del ctx.tables.early[(type_name, key, by)]
    chosen: dict[str, tuple[datetime, str]] = {}
    for key, by, row in early:
        live = ctx.ledger.get(key)
        if live is None or not (row["admin"] or live["client"] == by):
            continue
        if row["used_at"] < live["issued_at"]:
            continue
        if key not in chosen or (row["used_at"], by) < chosen[key]:
            chosen[key] = (row["used_at"], by)
    applied = []
    for key, (at, by) in sorted(chosen.items()):
        live = ctx.ledger[key]
        if live["used_at"] is None:
            live.update(used_at=at, used_by=by)
            applied.append((key, at, by))
    return [
        {
            "found": len(early),
            "applied": len(applied),
            "keys": [a[0] for a in applied],
            "times": [a[1] for a in applied],
            "clients": [a[2] for a in applied],
        }
    ]


def PRUNE_EARLY_MARKS(ctx: Context, seconds: float) -> list[Row]:
    due = ctx.now - timedelta(seconds=float(seconds))
    counts: dict[str, int] = {}
    for place in [k for k, row in ctx.tables.early.items() if row["received_at"] < due]:
        del ctx.tables.early[place]
        counts[place[0]] = counts.get(place[0], 0) + 1
    return [{"id_type": kind, "marks": n} for kind, n in counts.items()]


def SELECT_LEDGER_KEY(ctx: Context, key: str) -> list[Row]:
    row = ctx.ledger.get(key)
    if row is None:
        return []
    names = ("issued_at", "client", "idempotency_key", "used_at", "used_by", "released_at")
    return [{**{n: row[n] for n in names}, "released_by": row["released_by"]}]


def SELECT_RELEASED_ISSUE(ctx: Context, type_name: str, key: str) -> list[Row]:
    past = [r for k, r in ctx.tables.released.items() if k[0] == type_name and k[1] == key]
    if not past:
        return []
    last = max(past, key=lambda r: r["released_at"])
    return [{n: last[n] for n in ("issued_at", "client", "released_at", "released_by")}]


def FORCE_ISSUED(ctx: Context, *args: Any) -> list[Row]:
    *batch, skip = args
    for row in _issue_batch(*batch):
        issue = f"{row['entry_id']} {row['key']}"
        if issue in skip or row["key"] in skip or row["key"] in ctx.ledger:
            continue
        ctx.ledger[row["key"]] = {
            **row,
            "used_at": None,
            "used_by": None,
            "released_at": None,
            "released_by": None,
        }
    return []


def FORCE_EARLY_MARKS_APPLIED(
    ctx: Context,
    type_name: str,
    inserted: list[str],
    keys: list[str],
    times: list[datetime],
    clients: list[str],
) -> list[Row]:
    for place in [k for k in ctx.tables.early if k[0] == type_name and k[1] in inserted]:
        del ctx.tables.early[place]
    for key, at, by in zip(keys, times, clients, strict=True):
        if key in ctx.ledger:
            ctx.ledger[key].update(used_at=at, used_by=by)
    return []


def FORCE_USED(ctx: Context, keys: list[str], times: list[datetime], by: list[str]) -> list[Row]:
    for key, at, client in zip(keys, times, by, strict=True):
        if key in ctx.ledger:
            ctx.ledger[key].update(used_at=at, used_by=client)
    return []


def FORCE_RELEASED(
    ctx: Context, keys: list[str], times: list[datetime], by: list[str]
) -> list[Row]:
    for key, at, client in zip(keys, times, by, strict=True):
        if key in ctx.ledger:
            ctx.ledger[key].update(released_at=at, released_by=client)
    return []


def FORCE_RELEASED_TO_HISTORY(
    ctx: Context,
    type_name: str,
    keys: list[str],
    times: list[datetime],
    by: list[str],
    entries: list[str],
    recorded: list[datetime],
) -> list[Row]:
    for key, at, client, entry, when in zip(keys, times, by, entries, recorded, strict=True):
        row = ctx.ledger.pop(key, None)
        if row is None:
            continue
        place = (type_name, key, row["entry_id"])
        if place not in ctx.tables.released:
            ctx.tables.released[place] = _history_row(row, at, client, entry, when)
    return []


def FORCE_REQUEUED(
    ctx: Context,
    type_name: str,
    keys: list[str],
    entries: list[str],
    discarded: list[bool],
    times: list[datetime],
) -> list[Row]:
    for key, entry, gone, when in zip(keys, entries, discarded, times, strict=True):
        row = ctx.tables.released.get((type_name, key, entry))
        if row is not None:
            row.update(requeued_at=when, requeue_discarded=gone)
    return []


def INSERT_OUTCOMES(
    ctx: Context, type_name: str, entries: list[str], outcomes: list[str]
) -> list[Row]:
    for entry, outcome in zip(entries, outcomes, strict=True):
        ctx.tables.outcomes.setdefault(
            (type_name, entry), {"outcome": outcome, "decided_at": ctx.now}
        )
    return []


def FORCE_OUTCOMES(
    ctx: Context, type_name: str, entries: list[str], outcomes: list[str]
) -> list[Row]:
    for entry, outcome in zip(entries, outcomes, strict=True):
        found = ctx.tables.outcomes.get((type_name, entry))
        if found is None:
            ctx.tables.outcomes[(type_name, entry)] = {"outcome": outcome, "decided_at": ctx.now}
        else:
            found["outcome"] = outcome
    return []


def SELECT_OUTCOMES(ctx: Context, type_name: str, entries: list[str]) -> list[Row]:
    return [
        {"entry_id": entry, "outcome": ctx.tables.outcomes[(type_name, entry)]["outcome"]}
        for entry in entries
        if (type_name, entry) in ctx.tables.outcomes
    ]


def INSERT_LINK(ctx: Context, link: str, lane: str, prev: str | None) -> list[Row]:
    ctx.tables.links.setdefault(str(link), {"lane": lane, "prev": prev, "applied_at": ctx.now})
    return []


def INSERT_LINKS(ctx: Context, ids: list[str], lane: str, prevs: list[str | None]) -> list[Row]:
    for link, prev in zip(ids, prevs, strict=True):
        ctx.tables.links.setdefault(str(link), {"lane": lane, "prev": prev, "applied_at": ctx.now})
    return []


def HOLDS_LINK(ctx: Context, link: str) -> list[Row]:
    return [{"exists": str(link) in ctx.tables.links}]


def SELECT_HELD_LINKS(ctx: Context, ids: list[str]) -> list[Row]:
    return [{"id": str(link)} for link in ids if str(link) in ctx.tables.links]


def MARK_RESTORE(ctx: Context, lane: str, link: str) -> list[Row]:
    clock = ctx.tables.clock
    clock["ledger_restore"] = {**clock["ledger_restore"], lane: link}
    return []


def CLEAR_RESTORE(ctx: Context, lane: str) -> list[Row]:
    clock = ctx.tables.clock
    clock["ledger_restore"] = {k: v for k, v in clock["ledger_restore"].items() if k != lane}
    return []


def PRUNE_LINKS(ctx: Context, seconds: float) -> list[Row]:
    due = ctx.now - timedelta(seconds=float(seconds))
    heads = set(ctx.tables.clock["ledger_heads"].values())
    for link in [k for k, r in ctx.tables.links.items() if r["applied_at"] < due]:
        if link not in heads:
            del ctx.tables.links[link]
    return []


def PRUNE_OUTCOMES(ctx: Context, seconds: float) -> list[Row]:
    due = ctx.now - timedelta(seconds=float(seconds))
    for place in [k for k, r in ctx.tables.outcomes.items() if r["decided_at"] < due]:
        del ctx.tables.outcomes[place]
    return []


HANDLERS: dict[str, Callable[..., list[Row]]] = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper() and callable(value) and not name.startswith("_")
}
_NAME = re.compile(r"^[A-Z][A-Z_]+$")
assert all(_NAME.match(name) for name in HANDLERS)


def cold_store(server: SimPostgres, actor: Callable[[], str]) -> ColdStore:
    """The runtime's cold store on this PostgreSQL (``SimPool`` stands for asyncpg's
    pool: it offers what ``ColdStore`` uses of it)."""
    return ColdStore(cast("asyncpg.Pool[Any]", SimPool(server, actor)))
