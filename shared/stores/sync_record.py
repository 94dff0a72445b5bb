"""The sync clock's record outside PostgreSQL (the PostgreSQL fence, Redis side).

Every guarded PostgreSQL statement (a range lease, a keysync batch) returns a ``Stamp``
of the sync clock; the stamp is recorded here, fenced like the hot lists, before
anything it covers can be dispensed. ``lua/sync_record.lua`` holds the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.domain.settings import Settings
from shared.stores.redis_endpoint import RedisEndpoint
from shared.stores.redis_scripts import RedisPort, record_keys

LEASED = "leased:"


@dataclass(frozen=True)
class Stamp:
    """The sync clock after a guarded statement: server timeline, fork point, value."""

    timeline: int
    fork: int
    clock: int

    def args(self) -> list[int]:
        return [self.timeline, self.fork, self.clock]


NO_STAMP = Stamp(0, 0, 0)  # not recorded (the guard is switched off)


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

    def guard_args(self) -> list[object]:
        """$1..$3 of the guarded statements in sql.py."""
        return [self.timeline, self.clock, self.untrusted]

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
        )


UNGUARDED = Record()  # what the guard is given when it is switched off: always passes


class SyncRecord(RedisPort):
    @classmethod
    def from_settings(cls, settings: Settings) -> SyncRecord:
        return cls(RedisEndpoint.from_settings(settings), settings.redis_namespace)

    async def read(self) -> Record:
        async with self._guard("read_record"):
            raw = await self._run("read_record", record_keys(self.namespace), [])
        pairs = [str(item) for item in raw[1:]]
        return Record.parse(dict(zip(pairs[::2], pairs[1::2], strict=True)))

    async def record_lease(self, name: str, range_end: int, stamp: Stamp) -> bool:
        """Record a committed lease; False when its stamp is stale (the range is wasted)."""
        async with self._guard("record_lease"):
            status, _ = await self._run(
                "record_lease",
                record_keys(self.namespace),
                [LEASED + name, range_end, *stamp.args()],
            )
        return str(status) == "ok"

    async def reset(self, stamp: Stamp) -> None:
        """After a PostgreSQL fence: the record restarts from the fenced server's stamp."""
        async with self._guard("reset_record"):
            await self._run("reset_record", record_keys(self.namespace), stamp.args())

    async def halt(self, reason: str) -> None:
        async with self._guard("halt_record"):
            await self._run("halt_record", record_keys(self.namespace), [reason])
