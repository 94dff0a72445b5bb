"""The PostgreSQL fence: a promoted asynchronous replica may lack the last commits, and
an old primary may stay up and reachable by some processes after another was promoted.

Every range lease and keysync batch runs behind a guard (``fence_sql.GUARD``) that advances
a sync clock in the same statement and refuses to run on a server whose history does
not cover the clock's record in Redis (``sync_record.py``). When the guard refuses, a
stamp proved lost commits, or Redis lost the record, ``settle`` runs under the clock
row's lock (every other fencer and guarded statement on that server waits), reads the
record under that lock, and does what the verdict says:

- ``vouch``: Redis lost the record, and this server has not forked since its last
  guarded write: the record is rebuilt from it (its stamp, the highest counter its
  history leased per type);
- ``behind``/``stamp``: this server lost commits: discard the cold inventory of every
  type (counted, never reissued), settle every released key not yet requeued (never
  requeued: the lost history may have requeued and issued it), move every sequence
  past the highest counter ever leased, and claim the record for this server (a new
  history) before committing; the claim is refused when a lease was recorded since
  the record was read (read again);
- ``superseded``: the record follows a newer timeline: this server must not write
  (``PostgresSuperseded``: fail closed, never fence back);
- ``foreign``: the namespace is bound to another database (``NamespaceBound``);
- ``halt``: Redis lost the record and this server forked since its last guarded write:
  nothing can prove what was lost; an operator fences (``fence-postgres``).

Keys already in Redis are not touched. docs/reliability.md explains the design.

With several key groups (a Redis Cluster with ``slot_per: type``) each group has its
own record, and a type's statements are judged against its group's. PostgreSQL is one
history, so ``settle`` judges this server against every record and does what the worst
verdict says: a fence claims every record (one that is not claimed would take the new
history for another and fence again), and a fence needed while a record must be
vouched for halts (that group's lost leases may be above anything it can name).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from shared.domain.errors import (
    FenceHalted,
    NamespaceBound,
    PostgresBehind,
    PostgresSuperseded,
    StoreUnavailable,
)
from shared.domain.idtypes import IdType
from shared.domain.tiers import NO_STAMP, LeasedRange, SequenceState, Stamp
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.sync_record import UNGUARDED, Record, SyncRecord
from shared.stores.groups import SyncRecords, records_of
from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import (
    DRIVER_ERRORS,
    ColdStore,
    OpenTake,
    one_row,
    translated,
)
from shared.stores.postgres.connect import any_server, dsn_hosts

log = logging.getLogger(__name__)
T = TypeVar("T")
# How often a fence reads the record again when its claim found a lease recorded since.
CLAIM_ATTEMPTS = 5
HALT_REASON = "redis and postgres both lost state; postgres forked since its last guarded write"
SPLIT_HALT_REASON = (
    "redis lost state while two postgres primaries take writes (a split brain): no record "
    "can be rebuilt from either; demote the old one, then fence"
)


@dataclass(frozen=True)
class ClockRow:
    """The sync clock row as locked by the fence, and the server's current timeline."""

    timeline: int
    fork: int
    clock: int
    here: int
    database: str = ""
    fences: int = 0

    def history_start(self) -> int:
        """The clock value this server's history covers on its current timeline."""
        return self.clock if self.timeline != self.here else self.fork


def verdict(row: ClockRow, record: Record) -> str:
    """What ``settle`` does on this server: 'ok', 'vouch', 'behind', 'superseded',
    'foreign' or 'halt' (module docstring).

    The same rule as the SQL guard, with the record read under the row lock. A record
    Redis lost (untrusted: what a replica had; or none) only bounds the truth from
    below: it can prove a server behind or superseded, never prove it current.
    """
    if record.database and row.database and record.database != row.database:
        return "foreign"
    if not record.needs_vouch:
        return _judge(row, record, lower_bound=False)
    found = _judge(row, record, lower_bound=True) if record.timeline else "ok"
    if found == "superseded":
        return found
    # Behind what Redis still knows, or proven behind by a stamp, or forked since its
    # last guarded write: the leases Redis lost may be above anything it can name.
    if found == "behind" or record.fence_needed or row.timeline not in (0, row.here):
        return "halt"
    return "vouch"


def _judge(row: ClockRow, record: Record, *, lower_bound: bool) -> str:
    if row.here == record.timeline:
        if row.history_start() == record.fork:
            return "ok" if row.clock >= record.clock else "behind"
        # Another history on the same timeline number: a second server promoted to it,
        # or this one from before a fence whose claim the record holds. A lower bound
        # only says this history must have started after everything it recorded.
        if lower_bound and row.history_start() >= record.clock:
            return "ok"
        return "behind"
    if row.here > record.timeline:
        return "ok" if row.history_start() >= record.clock else "behind"
    return "superseded"


@dataclass(frozen=True)
class FenceReport:
    reason: str
    keys_discarded: dict[str, int]
    next_starts: dict[str, int]  # type -> where its next lease starts
    stamp: Stamp
    # type -> releases settled instead of requeued (their keys never go back)
    releases_settled: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def total_discarded(self) -> int:
        return sum(self.keys_discarded.values())


class _Moved(Exception):
    """The fence's claim found a lease recorded since it read the record: roll back."""


async def settle(
    cold: ColdStore,
    sync: SyncRecord | SyncRecords,
    id_types: dict[str, IdType] | None = None,
    *,
    skip_ranges: int | None = None,
    take_over: bool = False,
) -> FenceReport | None:
    """Bring the record and this server into agreement (module docstring); the
    report of the fence when one ran (None otherwise).

    ``skip_ranges`` is the operator's command after a halt: fence unconditionally and
    move every sequence that many extra ranges on; with ``take_over`` the operator also
    asserts that this database is the one from now on, whatever timeline or database
    the record follows (a restore onto an older timeline, a dump moved to a new
    cluster). The fence covers every type the database holds (``id_types`` is kept for
    callers; the database says which types there are).
    """
    records = records_of(sync)
    for _ in range(CLAIM_ATTEMPTS):
        try:
            return await _settle_once(cold, records, skip_ranges, take_over)
        except _Moved:
            log.info("postgres_fence_reread", extra={"reason": "the record changed meanwhile"})
    raise PostgresBehind(f"the record kept moving during {CLAIM_ATTEMPTS} fence attempts")


# How long a fence's transaction may wait for the clock row's lock, or sit idle holding
# it (fence_sql.LIMIT_FENCE): every lease and take on the server waits for it.
FENCE_LIMIT_MS = 10_000


async def _settle_once(
    cold: ColdStore, records: SyncRecords, skip_ranges: int | None, take_over: bool
) -> FenceReport | None:
    operator = skip_ranges is not None
    report, vouched, halt, claimed = None, None, "", None
    async with cold.connection() as conn, translated("postgres_fence"), conn.transaction():
        await conn.execute(fence_sql.LIMIT_FENCE, str(FENCE_LIMIT_MS))
        row = _clock_row(one_row(await conn.fetchrow(fence_sql.LOCK_SYNC_CLOCK), "lock_sync_clock"))
        # Every record that judges a type the database holds (with a record per type,
        # also those of types this process is not configured with).
        held = [str(r["name"]) for r in await conn.fetch(fence_sql.SELECT_FENCED_TYPES)]
        judged = records.covering(held)
        # Under the lock it fences under; every shard asked at once (the lock holds
        # every type's takes and leases meanwhile).
        read = dict(zip(judged, await asyncio.gather(*(s.read() for s in judged)), strict=True))
        for record in read.values():
            if record.halted and not operator:
                raise FenceHalted(record.halt_reason or "halted")
        found = {sync: _verdict_of(row, record, operator) for sync, record in read.items()}
        for sync, each in found.items():
            _refuse(each, row, read[sync])
        worst = combined(list(found.values()), list(read.values()))
        if worst == "ok" and records.several and row.timeline not in (0, row.here):
            worst = "adopt"  # a new timeline that covers every record: taken up here
        if worst == "vouch" and await _another_primary(conn, cold.dsn, cold.connect_timeout_s):
            halt = SPLIT_HALT_REASON
        elif worst == "vouch":
            vouched = await _vouch_stamp(conn)
        elif worst == "halt":
            halt = HALT_REASON
        elif worst == "adopt":
            claimed = await _adopt(conn, read, row)
        elif worst != "ok":
            mode = "take_over" if take_over else ("operator" if operator else "automatic")
            pending = records.several
            report = await _fence(conn, read, row, worst, skip_ranges or 0, mode, pending)
            claimed = report.stamp if pending else None
    if vouched is not None:  # committed first: PostgreSQL ahead of the record is harmless
        for sync, each in found.items():
            if each == "vouch":
                await _record_vouch(sync, row, *vouched)
    if halt:
        await _halt(judged, halt)
    # Committed: the claims this settle made, or found made by a fence that committed,
    # are no longer pending (a record left pending is confirmed by the next settle).
    for sync, record in read.items():
        expected = claimed.fences if claimed is not None else record.claim_fences
        if (claimed is not None or found[sync] == "confirm") and expected:
            with contextlib.suppress(StoreUnavailable):
                await sync.confirm(expected)
    if report is not None:
        log.warning("postgres_fenced", extra=_fields(report))
    return report


def _verdict_of(row: ClockRow, record: Record, operator: bool) -> str:
    if operator:
        return "operator"
    if record.claim_fences and not record.needs_vouch:
        # Claimed by a fence (or a new timeline's take-up) of several records: it holds
        # only if that transaction committed, i.e. this server is on the claimed history
        # with at least the fence count the claim expected; else as lost commits.
        on_claim = row.timeline == record.timeline == row.here and row.fork == record.fork
        return "confirm" if on_claim and row.fences >= record.claim_fences else "behind"
    found = verdict(row, record)
    return "stamp" if found == "ok" and record.fence_needed else found  # a stamp proved a
    # commit this server lacks


def combined(verdicts: list[str], records: list[Record]) -> str:
    """What ``settle`` does over every group's record, given each one's verdict
    ('foreign' and 'superseded' were refused already): 'halt' if any halts; a fence
    ('operator', 'behind', 'stamp') if any needs one, unless another record must be
    vouched for ('halt': the leases that group lost may be above anything it can
    name; an operator's fence claims them all regardless); else 'vouch' if any must
    be; else 'ok'. With one record this is that record's verdict."""
    verdicts = ["ok" if v == "confirm" else v for v in verdicts]
    if "halt" in verdicts:
        return "halt"
    fence = next((v for v in ("operator", "behind", "stamp") if v in verdicts), None)
    if fence is not None:
        if fence != "operator" and any(record.needs_vouch for record in records):
            return "halt"
        return fence
    return "vouch" if "vouch" in verdicts else "ok"


def _refuse(found: str, row: ClockRow, record: Record) -> None:
    """Raise what a verdict (or a claim's answer) of 'foreign' or 'superseded' means."""
    if found == "foreign":
        raise NamespaceBound(
            f"redis_namespace: bound to database {record.database}; this PostgreSQL is "
            f"{row.database} (one namespace, one database: point postgres_dsn at the bound "
            "database, or use another redis_namespace; after moving the data to a new "
            "cluster: keydispenser fence-postgres --skip-ranges N --take-over)"
        )
    if found == "superseded":
        log.critical(
            "postgres_superseded",
            extra={"server_timeline": row.here, "record_timeline": record.timeline},
        )
        raise PostgresSuperseded(
            f"this server is on timeline {row.here}, the record follows a newer one"
        )


async def _another_primary(conn: Any, dsn: str | None, timeout_s: float) -> bool:
    """Whether another host of a multi-host DSN is a writable primary too (a split
    brain): then no record can be rebuilt from this one, which may be the old one."""
    hosts = dsn_hosts(dsn or "")
    if len(hosts) < 2 or dsn is None:
        return False
    here = await conn.fetchval(fence_sql.SELECT_SERVER_STARTED)
    for host, port in hosts:
        with contextlib.suppress(*DRIVER_ERRORS):
            other = await asyncpg.connect(any_server(dsn), host=host, port=port, timeout=timeout_s)
            try:
                found = await other.fetchrow(fence_sql.SELECT_IS_PRIMARY)
            finally:
                await other.close()
            if found is not None and found["primary"] and found["started"] != here:
                log.critical("postgres_two_primaries", extra={"host": host, "port": port})
                return True
    return False


async def _vouch_stamp(conn: Any) -> tuple[Stamp, dict[str, int]]:
    """Under the lock: this server's stamp, and the highest counter its history leased
    per type; recorded in Redis once the transaction committed."""
    stamp = Stamp.of(one_row(await conn.fetchrow(fence_sql.VOUCH), "vouch"))
    highs = {
        r["id_type"]: int(r["highest"]) for r in await conn.fetch(fence_sql.SELECT_LEASED_HIGHS)
    }
    return stamp, highs


async def _record_vouch(
    sync: SyncRecord, row: ClockRow, stamp: Stamp, highs: dict[str, int]
) -> None:
    """Rebuild the record from this server (lua/vouch_record.lua)."""
    status = await sync.vouch(stamp, highs)
    if status in ("ok", "trusted"):
        log.info("postgres_vouched", extra={"status": status, "clock": stamp.clock})
        return
    _refuse(status, row, await sync.read())
    raise FenceHalted(HALT_REASON)  # 'halted': another process found it so meanwhile


async def _adopt(conn: Any, read: dict[SyncRecord, Record], row: ClockRow) -> Stamp:
    """Take up this server's new timeline (every record is covered by its history):
    a guarded write of its own starts the new history, and every record is claimed for
    it, pending until the commit (with a record per type, the guard lets no statement
    do this: it would be judged against one record only)."""
    stamp = Stamp.of(one_row(await conn.fetchrow(fence_sql.VOUCH), "adopt_timeline"))
    for sync, record in read.items():
        status = await sync.reset(stamp, record.leased, "automatic", pending=True)
        if status == "moved":
            raise _Moved()
        _refuse(status, row, await sync.read())
    log.info("postgres_timeline_adopted", extra={"timeline": stamp.timeline, "fork": stamp.fork})
    return stamp


async def _halt(records: list[SyncRecord], reason: str) -> None:
    """Halt every record that can be reached (one on a shard that is down stays as
    it is: nothing of its types runs meanwhile), then refuse."""
    for sync in records:
        with contextlib.suppress(StoreUnavailable):
            await sync.halt(reason)
    log.critical("postgres_fence_halted", extra={"reason": reason})
    raise FenceHalted(reason)


def _fields(report: FenceReport) -> dict[str, object]:
    return {
        "reason": report.reason,
        "keys_discarded": report.total_discarded,
        "releases_settled": report.releases_settled,
        "next_starts": report.next_starts,
        "clock": report.stamp.clock,
    }


def _clock_row(row: Any) -> ClockRow:
    return ClockRow(
        int(row["timeline"]),
        int(row["fork"]),
        int(row["clock"]),
        int(row["here"]),
        str(row["database"]),
        int(row["fences"]),
    )


async def _fence(
    conn: Any,
    read: dict[SyncRecord, Record],
    row: ClockRow,
    reason: str,
    skip_ranges: int,
    mode: str,
    pending: bool = False,
) -> FenceReport:
    """Discard, move the sequences of every type the database holds past the highest
    counter any record holds, reset the clock past every record's, then claim every
    record (still under the lock: the claims land before the commit, or the fence rolls
    back; a record claimed for a fence that rolled back names a history this server
    does not have, and the next statement judged against it fences again)."""
    floors: dict[str, int] = {}
    for record in read.values():
        for name, leased in record.leased.items():
            floors[name] = max(floors.get(name, 0), leased)
    record_clock = max(record.clock for record in read.values())
    discarded: dict[str, int] = {}
    starts: dict[str, int] = {}
    for held in await conn.fetch(fence_sql.SELECT_FENCED_TYPES):
        name = str(held["name"])
        if held["has_cold"]:
            discarded[name] = await _discard_cold(conn, name)
        starts[name] = await _advance_sequence(conn, held, floors.get(name, 0), skip_ranges)
    settled = await _settle_releases(conn)
    stamp_row = one_row(
        await conn.fetchrow(fence_sql.RESET_SYNC_CLOCK, row.here, max(row.clock, record_clock)),
        "reset_sync_clock",
    )
    stamp = Stamp.of(stamp_row)
    detail = {"next_starts": starts, "record_clock": record_clock, "server_clock": row.clock}
    await conn.execute(
        fence_sql.INSERT_FENCE_EVENT, reason, sum(discarded.values()), json.dumps(detail)
    )
    for sync, record in read.items():
        claimed = await sync.reset(stamp, record.leased, mode, pending)
        if claimed == "moved":
            raise _Moved()
        _refuse(claimed, row, await sync.read())
    return FenceReport(reason, discarded, starts, stamp, settled)


async def _settle_releases(conn: Any) -> dict[str, int]:
    """Every released key not requeued yet, per type: the history this server lost may
    have requeued and issued it already, so it never goes back (counted)."""
    rows = await conn.fetch(ledger_sql.SETTLE_RELEASES)
    return {str(r["id_type"]): int(r["releases"]) for r in rows}


async def _discard_cold(conn: Any, name: str) -> int:
    """Every cold key of a type: may have been dispensed already (never reissued).

    DELETE, not TRUNCATE: guarded statements queued on the clock row already hold the
    cold table's row lock, and TRUNCATE's exclusive lock would deadlock with them.
    """
    return int(await conn.fetchval(sql.for_type(fence_sql.DISCARD_COLD, name)))


async def _advance_sequence(conn: Any, held: Any, floor: int, skip_ranges: int) -> int:
    """Move a type's sequence so the next lease starts at or after ``floor`` (plus any
    ranges the operator skips); forward only. Returns the next lease's start. ``held``:
    the type's row of SELECT_FENCED_TYPES (range size and its site's share of the domain
    from its sequence)."""
    size, bottom, top = int(held["increment_by"]), int(held["min_value"]), int(held["max_value"])
    last = held["last_value"]
    next_start = int(last) + size if last is not None else bottom
    target = max(floor, next_start) + skip_ranges * size
    if target > next_start:
        value = max(min(target - size, top), bottom)
        await conn.execute(sql.for_type(fence_sql.SET_SEQUENCE, str(held["name"])), value)
        return value + size
    return next_start


FenceListener = Callable[[FenceReport], None]


class GuardedCold:
    """The cold-tier operations that must run behind the PostgreSQL fence.

    Each reads the record first (settling when a stamp proved lost commits or Redis lost
    the record), runs its guarded statement, and on a refusal settles and tries once
    more. A type's statements are judged against its key group's record
    (``SyncRecords``). With ``sync`` None the guard is switched off (a drill's control
    case): statements get a record that always passes and nothing is recorded.
    """

    def __init__(
        self,
        cold: ColdStore,
        sync: SyncRecord | SyncRecords | None,
        id_types: dict[str, IdType],
        on_fence: FenceListener | None = None,
    ) -> None:
        self.cold = cold
        self._sync = records_of(sync) if sync is not None else None
        self._types = id_types
        self._on_fence = on_fence

    @property
    def guarded(self) -> bool:
        return self._sync is not None

    async def record(self, name: str) -> Record:
        """The record type ``name``'s next statement is judged against, settled first
        when it says so."""
        if self._sync is None:
            return UNGUARDED
        sync = self._sync.of(name)
        record = await sync.read()
        if record.halted:
            raise FenceHalted(record.halt_reason or "halted")
        if record.fence_needed or record.needs_vouch or record.claim_fences:
            await self.fence()
            record = await sync.read()
        return dataclasses.replace(record, strict=self._sync.several)

    async def fence(self) -> FenceReport | None:
        """Settle this server and the records (``settle``); the fence's report if one ran."""
        if self._sync is None:
            return None
        report = await settle(self.cold, self._sync)
        if report is not None and self._on_fence is not None:
            self._on_fence(report)
        return report

    async def begin_take(self, name: str, size: int) -> OpenTake:
        """A batch taken in a transaction left open (``OpenTake``), with its stamp
        (NO_STAMP with the guard off: nothing is recorded)."""
        in_order = name in self._types and self._types[name].sequential
        try:
            taken = await self.cold.begin_take(
                name, size, await self.record(name), in_order=in_order
            )
        except PostgresBehind:
            await self.fence()
            taken = await self.cold.begin_take(
                name, size, await self.record(name), in_order=in_order
            )
        return taken if self._sync is not None else dataclasses.replace(taken, stamp=NO_STAMP)

    async def take_batch(self, name: str, size: int) -> tuple[list[str], Stamp]:
        """``begin_take`` and commit: the keys are taken when this returns."""
        taken = await self.begin_take(name, size)
        await taken.commit()
        return taken.keys, taken.stamp

    async def lease_range(self, id_type: IdType, lessee: str) -> LeasedRange:
        """Lease behind the guard and record the lease before any key of it is made."""
        try:
            leased, stamp = await self.cold.lease_range(
                id_type, lessee, await self.record(id_type.name)
            )
        except PostgresBehind:
            await self.fence()
            leased, stamp = await self.cold.lease_range(
                id_type, lessee, await self.record(id_type.name)
            )
        if self._sync is None:
            return leased
        status = await self._sync.of(id_type.name).record_lease(id_type.name, leased.stop, stamp)
        if status != "ok":
            # Wasted, never used: the next read of the record settles what it says.
            raise PostgresBehind(f"lease of '{id_type.name}' not recorded: {status}")
        return leased

    async def write(
        self, name: str, work: Callable[[Any], Awaitable[T]], operation: str
    ) -> tuple[T, Stamp | None]:
        """Run ``work(conn)`` in one transaction that ends with the guard (judged against
        type ``name``'s record), and record its stamp once committed: a promotion that
        loses the commit is then seen by the fence. (result, stamp); the stamp is None
        with the guard off. PostgresBehind when the write may be lost: refused twice (a
        fence ran between), or committed on a history the record no longer follows
        (the caller does it again later: the work must be harmless to repeat)."""
        try:
            return await self._write_once(name, work, operation)
        except PostgresBehind:
            await self.fence()
            return await self._write_once(name, work, operation)

    async def _write_once(
        self, name: str, work: Callable[[Any], Awaitable[T]], operation: str
    ) -> tuple[T, Stamp | None]:
        record = await self.record(name)
        async with self.cold.connection() as conn, translated(operation), conn.transaction():
            result = await work(conn)
            if self._sync is None:
                return result, None
            # Last: the clock row's lock is held only while the transaction commits.
            guard = await conn.fetchrow(fence_sql.GUARD_TAKE, *record.guard_args())
            if guard is None:
                raise PostgresBehind(f"{operation} of '{name}' refused by the guard")
        stamp = Stamp.of(guard)
        status = await self._sync.of(name).record_write(name, stamp)
        if status != "ok":
            raise PostgresBehind(f"{operation} of '{name}' not recorded: {status}")
        return result, stamp

    async def vouch(self) -> None:
        """Settle now (a push found the record untrusted): rebuild it if Redis lost it."""
        await self.fence()

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        return await self.cold.sequence_state(id_type)

    async def wake_keygen(self, name: str) -> None:
        await self.cold.wake_keygen(name)
