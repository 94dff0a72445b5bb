"""The PostgreSQL fence: a promoted asynchronous replica may lack the last commits.

Every range lease and keysync batch runs behind a guard (``sql._GUARD``) that advances
a sync clock in the same statement and refuses to run on a server whose history does
not cover the clock's record in Redis (``sync_record.py``). When the guard refuses, or
a stamp proved lost commits, ``ensure_fenced`` runs once (the clock row's lock makes
every other fencer and guarded statement wait): it discards the cold inventory of every
type (counted, never reissued), moves every sequence past the highest counter ever
leased, records the event and restarts the record. Keys already in Redis are not
touched. docs/reliability.md explains the design.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.domain.errors import FenceHalted, PostgresBehind
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


@dataclass(frozen=True)
class ClockRow:
    """The sync clock row as locked by the fence, and the server's current timeline."""

    timeline: int
    fork: int
    clock: int
    here: int

    def history_start(self) -> int:
        """The clock value this server's history covers on its current timeline."""
        return self.clock if self.timeline != self.here else self.fork


def verdict(row: ClockRow, record: Record) -> str:
    """'ok', 'behind' (lost commits: fence) or 'halt' (cannot tell: operator).

    The same rule as the SQL guard, with the record read under the row lock.
    """
    if record.untrusted:
        return "ok" if row.timeline in (0, row.here) else "halt"
    if record.timeline == 0:
        return "ok"
    if row.here == record.timeline:
        return "ok" if row.clock >= record.clock else "behind"
    if row.here > record.timeline:
        return "ok" if row.history_start() >= record.clock else "behind"
    return "behind"  # a server from an older timeline took writes again


@dataclass(frozen=True)
class FenceReport:
    reason: str
    keys_discarded: dict[str, int]
    next_starts: dict[str, int]  # type -> where its next lease starts
    stamp: Stamp

    @property
    def total_discarded(self) -> int:
        return sum(self.keys_discarded.values())


async def ensure_fenced(
    cold: ColdStore,
    sync: SyncRecord,
    id_types: dict[str, IdType],
    *,
    skip_ranges: int | None = None,
) -> FenceReport | None:
    """Fence PostgreSQL when it needs it (None when it did not).

    ``skip_ranges`` is the operator's command after a halt: fence unconditionally and
    move every sequence that many extra ranges on.
    """
    record = await sync.read()
    operator = skip_ranges is not None
    if record.halted and not operator:
        raise FenceHalted(record.halt_reason or "halted")
    async with cold.connection() as conn, translated("postgres_fence"), conn.transaction():
        row = _clock_row(one_row(await conn.fetchrow(sql.LOCK_SYNC_CLOCK), "lock_sync_clock"))
        found = "operator" if operator else verdict(row, record)
        if found == "ok" and record.fence_needed:
            found = "stamp"  # a stamp proved a commit this server lacks
        report = None
        if found not in ("ok", "halt"):
            report = await _fence(conn, row, record, id_types, found, skip_ranges or 0)
    if found == "halt":
        await _halt(sync)
    if report is not None:
        await sync.reset(report.stamp)
        log.warning("postgres_fenced", extra=_fields(report))
    return report


async def _halt(sync: SyncRecord) -> None:
    reason = "redis and postgres both lost state; postgres forked since its last guarded write"
    await sync.halt(reason)
    log.critical("postgres_fence_halted", extra={"reason": reason})
    raise FenceHalted(reason)


def _fields(report: FenceReport) -> dict[str, object]:
    return {
        "reason": report.reason,
        "keys_discarded": report.total_discarded,
        "next_starts": report.next_starts,
        "clock": report.stamp.clock,
    }


def _clock_row(row: Any) -> ClockRow:
    return ClockRow(int(row["timeline"]), int(row["fork"]), int(row["clock"]), int(row["here"]))


async def _fence(
    conn: Any,
    row: ClockRow,
    record: Record,
    id_types: dict[str, IdType],
    reason: str,
    skip_ranges: int,
) -> FenceReport:
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
    stamp = Stamp(int(stamp_row["timeline"]), int(stamp_row["fork"]), int(stamp_row["clock"]))
    detail = {"next_starts": starts, "record_clock": record.clock, "server_clock": row.clock}
    await conn.execute(sql.INSERT_FENCE_EVENT, reason, sum(discarded.values()), json.dumps(detail))
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

    Each reads the record first (running the fence when a stamp proved lost commits),
    runs its guarded statement, and on a refusal fences and tries once more. With
    ``sync`` None the guard is switched off (a drill's control case): statements get a
    record that always passes and nothing is recorded.
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

    async def record(self) -> Record:
        if self._sync is None:
            return UNGUARDED
        record = await self._sync.read()
        if record.halted:
            raise FenceHalted(record.halt_reason or "halted")
        if record.fence_needed:
            await self.fence()
            record = await self._sync.read()
        return record

    async def fence(self) -> FenceReport | None:
        if self._sync is None:
            return None
        report = await ensure_fenced(self.cold, self._sync, self._types)
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
        if self._sync is not None and not await self._sync.record_lease(
            id_type.name, leased.stop, stamp
        ):
            # Wasted, never used: the next read of the record runs the fence.
            raise PostgresBehind(f"lease of '{id_type.name}' has a stale stamp")
        return leased

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        return await self.cold.sequence_state(id_type)

    async def wake_keygen(self, name: str) -> None:
        await self.cold.wake_keygen(name)
