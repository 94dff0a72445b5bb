"""The cold tier's operations that run behind the PostgreSQL fence (``GuardedCold``):
each judged against its key group's record, settled first when the record says so,
and recorded once committed. The fence itself is ``postgres_fence.settle``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shared.domain.errors import FenceHalted, PostgresBehind
from shared.domain.idtypes import IdType
from shared.domain.tiers import NO_STAMP, FenceReport, LeasedRange, SequenceState, Stamp
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import UNGUARDED, Record, SyncRecord
from shared.stores.groups import SyncRecords, records_of
from shared.stores.postgres.cold_store import ColdStore, OpenTake, translated

T = TypeVar("T")

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

    @property
    def records(self) -> SyncRecords:
        """The records this adapter's statements are judged against (guarded only)."""
        assert self._sync is not None
        return self._sync

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

    async def import_epoch(self, name: str) -> int:
        return await self.cold.import_epoch(name)
