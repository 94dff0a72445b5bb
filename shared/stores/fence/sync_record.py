"""The sync clock's record outside PostgreSQL (the PostgreSQL fence, Redis side).

Every guarded PostgreSQL statement (a range lease, a keysync batch) returns a ``Stamp``
of the sync clock; the stamp is recorded here, fenced like the hot lists, before
anything it covers can be dispensed. ``lua/sync_record.lua`` holds the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.domain.config import Settings
from shared.domain.tiers import Stamp
from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import RedisPort, Script, fence_slots

LEASED = "leased:"

# The record's scripts, each behind the fence; the fence's four slots are all their keys.
READ_RECORD = Script("read_record", fence_slots, fenced=True)
RECORD_LEASE = Script("record_lease", fence_slots, fenced=True)
BIND_RECORD = Script("bind_record", fence_slots, fenced=True)
VOUCH_RECORD = Script("vouch_record", fence_slots, fenced=True)
RESET_RECORD = Script("reset_record", fence_slots, fenced=True)
CONFIRM_RECORD = Script("confirm_record", fence_slots, fenced=True)
HALT_RECORD = Script("halt_record", fence_slots, fenced=True)
LEDGER_HALT = Script("ledger_halt", fence_slots, fenced=True)


@dataclass(frozen=True)
class Record:
    """What Redis knows of PostgreSQL's sync clock (all zero: nothing yet)."""

    timeline: int = 0
    fork: int = 0
    clock: int = 0
    untrusted: bool = False  # Redis lost state: PostgreSQL must vouch for itself
    fence_needed: bool = False  # a stamp proved that PostgreSQL lost commits
    halted: bool = False  # both tiers lost state: an operator must fence
    halt_reason: str = ""
    leased: dict[str, int] = field(default_factory=dict)  # type -> highest counter leased
    database: str = ""  # the database this namespace is bound to ("": not yet)
    # With several key groups a fence claims every record before it commits, each
    # marked with the fence count the claim expects (the fence's own, once committed):
    # until ``settle`` saw the server at that count on the claimed history (and cleared
    # the mark), the claim may belong to a fence that rolled back.
    claim_fences: int = 0
    strict: bool = False  # not stored: the guard refuses a new timeline (several groups)
    # The ledger's one history (docs/reliability.md): the newest ledger link the newest
    # stamp named; the link a fence found this history behind and keysync restores up
    # to ("": none pending); why the ledger failed closed ("": it did not).
    head: str = ""
    restore_to: str = ""
    ledger_halt: str = ""
    # When this Redis server's fence last took over (fence.lua; "": never): the epoch a
    # record read belongs to. A vouch decided on a record of one epoch is not written
    # into a later one (a Redis loss since, while the vouching process stalled).
    fenced_at: str = ""

    @property
    def needs_vouch(self) -> bool:
        """No trusted record (Redis lost it, or never had one): nothing it says may
        judge PostgreSQL until a server that has not forked rebuilds it (VOUCH)."""
        return self.untrusted or self.timeline == 0

    def guard_args(self, *, ledger: bool = False) -> list[object]:
        """$1..$4 of the guarded statements in sql.py (``ledger``: a ledger transaction,
        which passes only on the record's own timeline)."""
        flags = (1 if self.needs_vouch else 0) | (2 if self.strict else 0)
        flags |= 4 if ledger else 0
        return [self.timeline, self.clock, self.fork, flags]

    @classmethod
    def parse(cls, fields: dict[str, str]) -> Record:
        return cls(
            timeline=int(fields.get("timeline", 0)),
            fork=int(fields.get("fork", 0)),
            clock=int(fields.get("clock", 0)),
            untrusted=fields.get("untrusted") == "1",
            fence_needed=fields.get("fence_needed") == "1",
            halted=fields.get("halted") == "1",
            halt_reason=fields.get("halt_reason", ""),
            leased={
                k.removeprefix(LEASED): int(v) for k, v in fields.items() if k.startswith(LEASED)
            },
            database=fields.get("database", ""),
            claim_fences=int(fields.get("claim_fences", 0)),
            head=fields.get("head", ""),
            # stored under its first name: a rolling update and a rollback read it
            restore_to=fields.get("restore_from", ""),
            ledger_halt=fields.get("ledger_halt", ""),
            fenced_at=fields.get("fenced_at", ""),
        )


UNGUARDED = Record(timeline=-1)  # given to the guard when it is switched off: always passes


def _pairs(values: dict[str, int]) -> list[object]:
    """leased:<type>, value, ... as the record scripts take them."""
    return [item for name, value in sorted(values.items()) for item in (LEASED + name, value)]


class SyncRecord(RedisPort):
    @classmethod
    def from_settings(cls, settings: Settings) -> SyncRecord:
        return cls(RedisEndpoint.from_settings(settings), settings.redis_key_namespace)

    async def read(self) -> Record:
        async with self._guard("read_record"):
            raw = await self._run(READ_RECORD, fence_slots(self.namespace), [])
        pairs = [str(item) for item in raw[1:]]
        return Record.parse(dict(zip(pairs[::2], pairs[1::2], strict=True)))

    async def record_lease(self, name: str, range_end: int, stamp: Stamp) -> str:
        """Record a committed lease: 'ok', or why the range must not be used
        (``record_stamp`` in lua/sync_record.lua; the range is wasted)."""
        async with self._guard("record_lease"):
            status, _ = await self._run(
                RECORD_LEASE,
                fence_slots(self.namespace),
                [LEASED + name, range_end, *stamp.args(self.namespace)],
            )
        return str(status)

    async def record_write(self, name: str, stamp: Stamp) -> str:
        """Record a committed guarded write of type ``name`` that leased nothing (a
        ledger batch): 'ok', or why what it wrote may be lost (``record_stamp``)."""
        return await self.record_lease(name, 0, stamp)

    async def bind(self, database: str) -> str:
        """Bind the namespace to ``database`` on first use; the database it is bound to."""
        async with self._guard("bind_record"):
            bound, _ = await self._run(BIND_RECORD, fence_slots(self.namespace), [database])
        return str(bound)

    async def vouch(
        self, stamp: Stamp, leased: dict[str, int], restore_to: str = "", epoch: str | None = None
    ) -> str:
        """Rebuild a lost record from a server that has not forked (``stamp``), the
        highest counters its history leased and the ledger restore it holds pending
        (``restore_to``): 'ok', 'trusted' (already rebuilt), 'foreign', 'superseded',
        'halted', or 'stale': the record's epoch is no longer ``epoch`` (the
        ``fenced_at`` of the record the vouch was decided on; None: not checked), Redis
        lost state again since (lua/vouch_record.lua)."""
        args = [*stamp.args(self.namespace), restore_to, "-" if epoch is None else epoch]
        args += _pairs(leased)
        async with self._guard("vouch_record"):
            status, _ = await self._run(VOUCH_RECORD, fence_slots(self.namespace), args)
        return str(status)

    async def reset(
        self,
        stamp: Stamp,
        floors: dict[str, int],
        mode: str = "automatic",
        pending: bool = False,
        read: Record | None = None,
        restore_to: str = "",
    ) -> str:
        """A fence claims the record for its server: 'ok', or 'foreign', 'superseded',
        'moved' (a lease was recorded above ``floors``, or a ledger link, since the
        fence read the record as ``read``, or Redis lost state meanwhile) with nothing changed
        (lua/reset_record.lua). ``mode``: 'automatic', 'adopt' (a new timeline taken
        up, nothing fenced: refused when any stamp was recorded since ``read``),
        'operator' (fence-postgres), 'take_over' (fence-postgres --take-over: database
        and timeline are the operator's word). ``restore_to``: the ledger link
        keysync must restore up to (kept when one is pending already)."""
        seen = read or Record()
        args = [
            *stamp.args(self.namespace),
            mode,
            stamp.fences if pending else 0,
            seen.head,
            restore_to,
            f"{seen.timeline}/{seen.fork}/{seen.clock}",
            *_pairs(floors),
        ]
        async with self._guard("reset_record"):
            status, _ = await self._run(RESET_RECORD, fence_slots(self.namespace), args)
        return str(status)

    async def clear_claim(self, claim_fences: int) -> None:
        """The fence whose claim expected ``claim_fences`` committed: clear the mark
        (only that claim's; lua/confirm_record.lua)."""
        async with self._guard("confirm_record"):
            await self._run(CONFIRM_RECORD, fence_slots(self.namespace), [claim_fences])

    async def halt(self, reason: str) -> None:
        async with self._guard("halt_record"):
            await self._run(HALT_RECORD, fence_slots(self.namespace), [reason])

    async def halt_ledger(self, reason: str) -> None:
        """The ledger fails closed (``reason``), or with "" resumes: the halt and any
        pending restore cleared (lua/ledger_halt.lua)."""
        async with self._guard("ledger_halt"):
            await self._run(LEDGER_HALT, fence_slots(self.namespace), [reason])
