"""The values the tiers hand the processes: what a pop, a push, a depth read, a range
lease, a guarded statement and a PostgreSQL fence give back. Plain data, shared by the ports
(``shared.domain.ports``), the stores that implement them and the processes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

# The most keys one pop hands back. The pop script takes one API-client name per key as
# an argument, and Lua's unpack() fails near 8,000 of them (after the keys were popped):
# dispenser.max_batch stays at or below this.
MAX_KEYS_PER_POP = 5_000


@dataclass(frozen=True)
class Refill:
    """What keysync last observed of a hot list's refill (only read when it is empty)."""

    rate: float  # keys/s
    at: float  # unix time of the observation


@dataclass(frozen=True)
class Popped:
    keys: list[str]
    remaining: int
    exhausted: bool  # only ever True when ``keys`` is empty
    discarded: int = 0  # inherited keys a fence discarded during this call
    replayed: bool = False  # the keys a previous request with the same idempotency key got
    refill: Refill | None = None  # set only when no key was available


@dataclass(frozen=True)
class Pushed:
    length: int
    token: str  # identity of the server that answered: run_id:master_replid
    # pushed | duplicate | refused | expired, or the stamp's refusal: stale | untrusted |
    # foreign | halted (push.lua)
    status: str
    discarded: int = 0


@dataclass(frozen=True)
class Depth:
    length: int
    token: str
    discarded: int = 0


@dataclass(frozen=True)
class LeasedRange:
    start: int
    stop: int
    fences: int = 0  # the fences the lease was made under (sql.LOCK_FENCES)


@dataclass(frozen=True)
class SequenceState:
    """Counters of this stack's share of a type's domain (the whole domain without a
    site) already leased, and the share's size."""

    leased_counters: int
    domain: int
    excluded_ahead: int = 0  # counters not leased yet whose keys an import excluded

    @property
    def headroom(self) -> int:
        """Counters still to lease that make keys keydispenser may hand out."""
        return self.domain - self.leased_counters - self.excluded_ahead


@dataclass(frozen=True)
class Stamp:
    """The sync clock after a guarded statement: the history it belongs to (database,
    timeline, fork), its value, the fences that history has seen, and each ledger
    lane's newest link at that clock (``heads``: the ledger's one history)."""

    timeline: int
    fork: int
    clock: int
    database: str = ""  # DATABASE_IDENTITY in sql.py: system identifier / database name
    fences: int = 0
    heads: tuple[tuple[str, str], ...] = ()  # (lane, link id), from kd_sync_clock

    def head(self, lane: str) -> str:
        """The newest ledger link of ``lane`` at this stamp ("": none yet)."""
        return dict(self.heads).get(lane, "")

    def args(self, lane: str = "") -> list[object]:
        """What sync_record.lua's ``record_stamp`` takes (database first), for the record
        of ``lane`` (the key namespace whose record it is)."""
        return [self.database, self.timeline, self.fork, self.clock, self.head(lane)]

    @classmethod
    def of(cls, row: Any) -> Stamp:
        """From a row holding timeline, fork, clock, fences and database (and ``heads``,
        the ledger heads as JSON, when the statement returns them)."""
        raw = column(row, "heads")
        heads = tuple(sorted(json.loads(raw).items())) if raw else ()
        return cls(
            int(row["timeline"]),
            int(row["fork"]),
            int(row["clock"]),
            str(row["database"]),
            int(row["fences"]),
            heads,
        )


def column(row: Any, name: str) -> Any:
    """A column a row may not have (None then)."""
    try:
        return row[name]
    except (KeyError, IndexError):
        return None


NO_STAMP = Stamp(0, 0, 0)  # not recorded (the guard is switched off)


@dataclass(frozen=True)
class FenceReport:
    """What a PostgreSQL fence did (``postgres_fence.settle``): why it ran, the cold keys
    it discarded per type, where each type's next lease starts, and the history it
    claimed. keygen's and keysync's fence metrics count it."""

    reason: str
    keys_discarded: dict[str, int]
    next_starts: dict[str, int]  # type -> where its next lease starts
    stamp: Stamp
    # type -> releases settled instead of requeued (their keys never go back): an
    # operator's fence only (an automatic one restores the ledger exactly instead)
    releases_settled: dict[str, int] = field(default_factory=dict)
    # lane -> the ledger link keysync restores this server up to
    restore_to: dict[str, str] = field(default_factory=dict)

    @property
    def total_discarded(self) -> int:
        return sum(self.keys_discarded.values())


@dataclass(frozen=True)
class KeyStatus:
    """What the ledger says of one key now: never issued (``unknown``), issued, marked
    used (``assigned``) or given back by its client (``released``; ``reissued``: put
    back in the cold tier to be issued again), or issued and ``quarantined`` (a history
    lost and accepted: never given back nor issued again)."""

    state: Literal["unknown", "issued", "assigned", "released", "quarantined"]
    client: str | None = None  # the client it was issued to
    reissued: bool = False
    idempotency_key: str | None = None  # the Idempotency-Key it was issued under


def not_issued(name: str, key: str) -> dict[str, Any]:
    """The lookup answer for a key the ledger holds no issue of."""
    return {"id_type": name, "key": key, "issued": False, "used": False}
