"""The PostgreSQL fence: a promoted asynchronous replica may lack the last commits, and
an old primary may stay up and reachable by some processes after another was promoted.

Every range lease and keysync batch runs behind a guard (``sql._GUARD``) that advances
a sync clock in the same statement and refuses to run on a server whose history does
not cover the clock's record in Redis (``sync_record.py``). When the guard refuses, a
stamp proved lost commits, or Redis lost the record, ``settle`` runs under the clock
row's lock (every other fencer and guarded statement on that server waits), reads the
record under that lock, and does what the verdict says:

- ``vouch``: Redis lost the record, and this server has not forked since its last
  guarded write: the record is rebuilt from it (its stamp, the highest counter its
  history leased per type);
- ``behind``/``stamp``: this server lost commits: discard the cold inventory of every
  type (counted, never reissued), move every sequence past the highest counter ever
  leased, and claim the record for this server (a new history) before committing; the
  claim is refused when a lease was recorded since the record was read (read again);
- ``superseded``: the record follows a newer timeline: this server must not write
  (``PostgresSuperseded``: fail closed, never fence back);
- ``foreign``: the namespace is bound to another database (``NamespaceBound``);
- ``halt``: Redis lost the record and this server forked since its last guarded write:
  nothing can prove what was lost; an operator fences (``fence-postgres``).

Keys already in Redis are not touched. docs/reliability.md explains the design.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.domain.errors import (
    FenceHalted,
    NamespaceBound,
    PostgresBehind,
    PostgresSuperseded,
)
from shared.domain.idtypes import IdType
from shared.stores import sql
from shared.stores.cold_store import (
    ColdStore,
    LeasedRange,
    OpenTake,
    SequenceState,
    one_row,
    translated,
)
from shared.stores.sync_record import NO_STAMP, UNGUARDED, Record, Stamp, SyncRecord

log = logging.getLogger(__name__)
# How often a fence reads the record again when its claim found a lease recorded since.
CLAIM_ATTEMPTS = 5
HALT_REASON = "redis and postgres both lost state; postgres forked since its last guarded write"


@dataclass(frozen=True)
class ClockRow:
    """The sync clock row as locked by the fence, and the server's current timeline."""

    timeline: int
    fork: int
    clock: int
    here: int
    database: str = ""

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

    @property
    def total_discarded(self) -> int:
        return sum(self.keys_discarded.values())


class _Moved(Exception):
    """The fence's claim found a lease recorded since it read the record: roll back."""


async def settle(
    cold: ColdStore,
    sync: SyncRecord,
    id_types: dict[str, IdType],
    *,
    skip_ranges: int | None = None,
) -> FenceReport | None:
    """Bring the record and this server into agreement (module docstring); the
    report of the fence when one ran (None otherwise).

    ``skip_ranges`` is the operator's command after a halt: fence unconditionally and
    move every sequence that many extra ranges on.
    """
    for _ in range(CLAIM_ATTEMPTS):
        try:
            return await _settle_once(cold, sync, id_types, skip_ranges)
        except _Moved:
            log.info("postgres_fence_reread", extra={"reason": "a lease was recorded meanwhile"})
    raise PostgresBehind(f"the record kept moving during {CLAIM_ATTEMPTS} fence attempts")


async def _settle_once(
    cold: ColdStore, sync: SyncRecord, id_types: dict[str, IdType], skip_ranges: int | None
) -> FenceReport | None:
    operator = skip_ranges is not None
    report = None
    async with cold.connection() as conn, translated("postgres_fence"), conn.transaction():
        row = _clock_row(one_row(await conn.fetchrow(sql.LOCK_SYNC_CLOCK), "lock_sync_clock"))
        record = await sync.read()  # under the lock it fences under
        if record.halted and not operator:
            raise FenceHalted(record.halt_reason or "halted")
        found = "operator" if operator else verdict(row, record)
        if found == "ok" and record.fence_needed:
            found = "stamp"  # a stamp proved a commit this server lacks
        _refuse(found, row, record)
        if found == "vouch":
            await _vouch(conn, sync, row)
        elif found not in ("ok", "halt"):
            report = await _fence(conn, sync, row, record, id_types, found, skip_ranges or 0)
    if found == "halt":
        await _halt(sync)
    if report is not None:
        log.warning("postgres_fenced", extra=_fields(report))
    return report


def _refuse(found: str, row: ClockRow, record: Record) -> None:
    """Raise what a verdict (or a claim's answer) of 'foreign' or 'superseded' means."""
    if found == "foreign":
        raise NamespaceBound(
            f"redis_namespace: bound to database {record.database}; this PostgreSQL is "
            f"{row.database} (one namespace, one database: point postgres_dsn at the bound "
            "database, or use another redis_namespace)"
        )
    if found == "superseded":
        log.critical(
            "postgres_superseded",
            extra={"server_timeline": row.here, "record_timeline": record.timeline},
        )
        raise PostgresSuperseded(
            f"this server is on timeline {row.here}, the record follows a newer one"
        )


async def _vouch(conn: Any, sync: SyncRecord, row: ClockRow) -> None:
    """Rebuild the record from this server, under the lock (nothing else writes here)."""
    stamp = Stamp.of(one_row(await conn.fetchrow(sql.VOUCH), "vouch"))
    highs = {r["id_type"]: int(r["highest"]) for r in await conn.fetch(sql.SELECT_LEASED_HIGHS)}
    status = await sync.vouch(stamp, highs)
    if status in ("ok", "trusted"):
        log.info("postgres_vouched", extra={"status": status, "clock": stamp.clock})
        return
    _refuse(status, row, await sync.read())
    raise FenceHalted(HALT_REASON)  # 'halted': another process found it so meanwhile


async def _halt(sync: SyncRecord) -> None:
    await sync.halt(HALT_REASON)
    log.critical("postgres_fence_halted", extra={"reason": HALT_REASON})
    raise FenceHalted(HALT_REASON)


def _fields(report: FenceReport) -> dict[str, object]:
    return {
        "reason": report.reason,
        "keys_discarded": report.total_discarded,
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
    )


async def _fence(
    conn: Any,
    sync: SyncRecord,
    row: ClockRow,
    record: Record,
    id_types: dict[str, IdType],
    reason: str,
    skip_ranges: int,
) -> FenceReport:
    """Discard, move the sequences, reset the clock, then claim the record (still under
    the lock: the claim lands before the commit, or the fence rolls back)."""
    discarded: dict[str, int] = {}
    starts: dict[str, int] = {}
    for id_type in id_types.values():
        discarded[id_type.name] = await _discard_cold(conn, id_type.name)
        floor = record.leased.get(id_type.name, 0)
        starts[id_type.name] = await _advance_sequence(conn, id_type, floor, skip_ranges)
    stamp_row = one_row(
        await conn.fetchrow(sql.RESET_SYNC_CLOCK, row.here, max(row.clock, record.clock)),
        "reset_sync_clock",
    )
    stamp = Stamp.of(stamp_row)
    detail = {"next_starts": starts, "record_clock": record.clock, "server_clock": row.clock}
    await conn.execute(sql.INSERT_FENCE_EVENT, reason, sum(discarded.values()), json.dumps(detail))
    claimed = await sync.reset(stamp, record.leased)
    if claimed == "moved":
        raise _Moved()
    _refuse(claimed, row, await sync.read())
    return FenceReport(reason, discarded, starts, stamp)


async def _discard_cold(conn: Any, name: str) -> int:
    """Every cold key of a type: may have been dispensed already (never reissued).

    DELETE, not TRUNCATE: guarded statements queued on the clock row already hold the
    cold table's row lock, and TRUNCATE's exclusive lock would deadlock with them.
    """
    return int(await conn.fetchval(sql.for_type(sql.DISCARD_COLD, name)))


async def _advance_sequence(conn: Any, id_type: IdType, floor: int, skip_ranges: int) -> int:
    """Move the sequence so the next lease starts at or after ``floor`` (plus any
    ranges the operator skips); forward only. Returns the next lease's start."""
    size = id_type.config.range_size
    state = one_row(
        await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, id_type.name)), "sequence"
    )
    next_start = int(state["last_value"]) + size if state["is_called"] else 0
    target = max(floor, next_start) + skip_ranges * size
    if target > next_start:
        last = min(target - size, id_type.domain_size - 1)
        await conn.execute(sql.for_type(sql.SET_SEQUENCE, id_type.name), last)
        return last + size
    return next_start


FenceListener = Callable[[FenceReport], None]


class GuardedCold:
    """The cold-tier operations that must run behind the PostgreSQL fence.

    Each reads the record first (settling when a stamp proved lost commits or Redis lost
    the record), runs its guarded statement, and on a refusal settles and tries once
    more. With ``sync`` None the guard is switched off (a drill's control case):
    statements get a record that always passes and nothing is recorded.
    """

    def __init__(
        self,
        cold: ColdStore,
        sync: SyncRecord | None,
        id_types: dict[str, IdType],
        on_fence: FenceListener | None = None,
    ) -> None:
        self.cold = cold
        self._sync = sync
        self._types = id_types
        self._on_fence = on_fence

    @property
    def guarded(self) -> bool:
        return self._sync is not None

    async def record(self) -> Record:
        if self._sync is None:
            return UNGUARDED
        record = await self._sync.read()
        if record.halted:
            raise FenceHalted(record.halt_reason or "halted")
        if record.fence_needed or record.needs_vouch:
            await self.fence()
            record = await self._sync.read()
        return record

    async def fence(self) -> FenceReport | None:
        """Settle this server and the record (``settle``); the fence's report if one ran."""
        if self._sync is None:
            return None
        report = await settle(self.cold, self._sync, self._types)
        if report is not None and self._on_fence is not None:
            self._on_fence(report)
        return report

    async def begin_take(self, name: str, size: int) -> OpenTake:
        """A batch taken in a transaction left open (``OpenTake``), with its stamp
        (NO_STAMP with the guard off: nothing is recorded)."""
        in_order = name in self._types and self._types[name].sequential
        try:
            taken = await self.cold.begin_take(name, size, await self.record(), in_order=in_order)
        except PostgresBehind:
            await self.fence()
            taken = await self.cold.begin_take(name, size, await self.record(), in_order=in_order)
        return taken if self._sync is not None else dataclasses.replace(taken, stamp=NO_STAMP)

    async def take_batch(self, name: str, size: int) -> tuple[list[str], Stamp]:
        """``begin_take`` and commit: the keys are taken when this returns."""
        taken = await self.begin_take(name, size)
        await taken.commit()
        return taken.keys, taken.stamp

    async def lease_range(self, id_type: IdType, lessee: str) -> LeasedRange:
        """Lease behind the guard and record the lease before any key of it is made."""
        try:
            leased, stamp = await self.cold.lease_range(id_type, lessee, await self.record())
        except PostgresBehind:
            await self.fence()
            leased, stamp = await self.cold.lease_range(id_type, lessee, await self.record())
        if self._sync is None:
            return leased
        status = await self._sync.record_lease(id_type.name, leased.stop, stamp)
        if status != "ok":
            # Wasted, never used: the next read of the record settles what it says.
            raise PostgresBehind(f"lease of '{id_type.name}' not recorded: {status}")
        return leased

    async def vouch(self) -> None:
        """Settle now (a push found the record untrusted): rebuild it if Redis lost it."""
        await self.fence()

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        return await self.cold.sequence_state(id_type)

    async def wake_keygen(self, name: str) -> None:
        await self.cold.wake_keygen(name)
