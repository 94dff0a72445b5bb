"""In-memory adapters of the ports (``shared.domain.ports``), for unit tests of the
processes' logic: the dispenser's service and pools, keygen's loop, keysync's
refill. ``tests/integration/test_port_conformance.py`` runs the same cases against
each of them and the real adapter it stands for (all but ``MemoryNudges``: its port
only writes).

They keep the contracts a unit test relies on (a key popped once is gone, a range
leased once is never leased again, an idempotency record replays its keys to its own
client, the ledger applies uses and releases by the drain's rules) and none of the
faults the real stores guard against: no fence, no failover, no transaction. Whatever
a test proves with them is about the logic above the port; what the stores themselves
guarantee is proven against real servers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import IdempotencyMismatch, KeydispenserError, KeyspaceExhausted
from shared.domain.idtypes import IdType
from shared.domain.outcomes import outcome_of
from shared.domain.tiers import (
    NO_STAMP,
    Depth,
    KeyStatus,
    LeasedRange,
    Popped,
    Pushed,
    SequenceState,
    Stamp,
)

MEMORY_TOKEN = "memory:1"  # the identity MemoryHot answers with (a server's run_id:replid)


@dataclass(frozen=True)
class Issue:
    """A key popped for a ledger type: the entry the pop writes in the ledger stream."""

    name: str
    key: str
    client: str
    idempotency_key: str | None = None


@dataclass
class MemoryHot:
    """The hot lists, as dispensers see them (``HotPool``) and as keysync does
    (``HotLists``): a deque of keys per type on one server that never changes
    (``token``), whose clock is ``now_ms``."""

    lists: dict[str, deque[str]] = field(default_factory=dict)
    exhausted_types: set[str] = field(default_factory=set)
    # Issues written for ledger types, in pop order (the pop scripts' ledger entries).
    issued: list[Issue] = field(default_factory=list)
    pops: list[tuple[str, int]] = field(default_factory=list)  # (type, count) per pop
    token: str = MEMORY_TOKEN
    now_ms: int = 1_000_000
    batches: set[str] = field(default_factory=set)  # batch IDs pushed (push.lua's markers)
    stamps: list[Stamp] = field(default_factory=list)  # each pushed batch's, in order
    refills: dict[str, tuple[float, float]] = field(default_factory=dict)  # rate, at
    import_epochs: dict[str, int] = field(default_factory=dict)  # exclude.lua's epochs
    stock_epochs: dict[str, int] = field(default_factory=dict)  # moved on by imports
    _records: dict[tuple[str, str], tuple[str, Popped]] = field(default_factory=dict)

    def fill(self, name: str, keys: Iterable[str]) -> None:
        """Put keys in a type's list directly (a test's setup, not the port)."""
        self.lists.setdefault(name, deque()).extend(keys)

    async def observe(self, name: str) -> Depth:
        return Depth(len(self.lists.get(name, ())), self.token)

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = NO_STAMP,
        not_after_ms: int = 0,
        marker_ttl_s: float = 3_600.0,
        epoch: int = 0,
    ) -> Pushed:
        """Append a batch once (``batch_id``); refused when pinned to another server,
        superseded when taken before an import's epoch, expired after ``not_after_ms``
        of this server's clock (none of them appends)."""
        hot = self.lists.setdefault(name, deque())
        if pin and pin != self.token:
            return Pushed(len(hot), self.token, "refused")
        if batch_id not in self.batches and epoch < self.import_epochs.get(name, 0):
            return Pushed(len(hot), self.token, "superseded")
        if not_after_ms and self.now_ms > not_after_ms:
            return Pushed(len(hot), self.token, "expired")
        if batch_id in self.batches:
            return Pushed(len(hot), self.token, "duplicate")
        self.batches.add(batch_id)
        self.stamps.append(stamp)
        hot.extend(keys)
        return Pushed(len(hot), self.token, "pushed")

    async def stock_epoch(self, name: str, hold_ms: int) -> int:
        return self.stock_epochs.get(name, 0)

    async def server_time_ms(self) -> int:
        return self.now_ms

    async def record_refill(self, name: str, rate: float, at: float) -> None:
        self.refills[name] = (rate, at)

    async def mark_exhausted(self, name: str) -> None:
        self.exhausted_types.add(name)

    async def pop(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        return self._pop(name, count, clients, ledger)

    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        return self._pop(name, count, clients, ledger)

    def _pop(
        self, name: str, count: int, clients: Sequence[str], ledger: bool, under: str | None = None
    ) -> Popped:
        self.pops.append((name, count))
        hot = self.lists.setdefault(name, deque())
        taken = [hot.popleft() for _ in range(min(count, len(hot)))]
        if ledger:
            names = list(clients or (ANONYMOUS,))
            for index, key in enumerate(taken):
                client = names[index] if len(names) > 1 else names[0]
                self.issued.append(Issue(name, key, client, under))
        if not taken:
            return Popped([], 0, name in self.exhausted_types)
        return Popped(taken, len(hot), exhausted=False)

    async def pop_once(
        self,
        name: str,
        count: int,
        idempotency_key: str,
        ttl_s: int,
        client: str = ANONYMOUS,
        ledger: bool = False,
    ) -> Popped:
        fingerprint = f"{client}:{name}:{count}"
        record = self._records.get((client, idempotency_key))
        if record is not None:
            made_for, popped = record
            if made_for != fingerprint:
                raise IdempotencyMismatch(idempotency_key)
            return Popped(popped.keys, popped.remaining, popped.exhausted, replayed=True)
        popped = self._pop(name, count, (client,), ledger, idempotency_key)
        if popped.keys:
            self._records[(client, idempotency_key)] = (fingerprint, popped)
        return popped

    def forget(self, client: str, idempotency_key: str) -> None:
        """Drop an idempotency record (a release given back what it answered)."""
        self._records.pop((client, idempotency_key), None)

    async def depth(self, name: str) -> int:
        return len(self.lists.get(name, ()))

    async def exhausted(self, name: str) -> bool:
        return name in self.exhausted_types

    async def refuse_eviction(self) -> None:
        return None


@dataclass
class MemoryNudges:
    """keysync's wake list (``Nudges``): the types nudged, in order."""

    nudged: list[str] = field(default_factory=list)

    async def nudge(self, name: str) -> None:
        self.nudged.append(name)


@dataclass
class _Row:
    """A key's issue row in the ledger table."""

    issue: Issue
    issued_at: str
    used_at: str | None = None
    used_by: str | None = None
    released_at: str | None = None
    released_by: str | None = None

    @property
    def open(self) -> bool:
        return self.used_at is None and self.released_at is None

    def may_mark(self, client: str, admin: bool) -> bool:
        return self.open and (admin or self.issue.client == client)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class MemoryLedger:
    """The ledger (``LedgerWrites``, ``LedgerLookup``): the issues ``hot`` wrote, the uses
    and releases recorded here, applied at once, by the real drain's rules: only the
    client a key was issued to (or one with ledger permission) marks or releases it, the
    first mark wins, a release gives back the key's idempotency records (``forget``), and
    a type in ``reissue`` moves a released key's issue to its history (the cold tier gets
    it back later). Not kept: a mark of a key not issued yet is dropped (the drain keeps
    it until the issue comes; here a pop is recorded before any mark can follow it), and
    a key issued twice is not alarmed."""

    hot: MemoryHot  # the hot tier whose pops it records (the one the test pops from)
    reissue: set[str] = field(default_factory=set)
    durable_waits: list[str] = field(default_factory=list)  # types whose pops were waited on
    durable: bool = True  # what ``wait_durable`` answers
    held: int = 0  # entries not yet drained (what ``backlog`` reports)
    rows: dict[tuple[str, str], _Row] = field(default_factory=dict)  # (type, key)
    given_back: dict[tuple[str, str], _Row] = field(default_factory=dict)  # reissue history
    outcomes: dict[str, str] = field(default_factory=dict)  # a status change's, by entry
    _applied: int = 0  # how many of ``hot.issued`` are in ``rows``
    _entries: int = 0  # entries recorded (each gets an ID of its own)

    def _drain(self) -> None:
        for issue in self.hot.issued[self._applied :]:
            self.rows[(issue.name, issue.key)] = _Row(issue, _now())
            self.given_back.pop((issue.name, issue.key), None)
        self._applied = len(self.hot.issued)

    async def backlog(self, name: str = "") -> int:
        return self.held

    async def record_used(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        reply: bool = False,
    ) -> str:
        self._drain()
        for key in keys:
            row = self.rows.get((name, key))
            if row is not None and row.may_mark(client, admin):
                row.used_at, row.used_by = _now(), client
        return await self._entry(name, keys, "used", client, admin, reply)

    async def _entry(
        self, name: str, keys: Sequence[str], op: str, client: str, admin: bool, reply: bool
    ) -> str:
        """A new entry ID; a status change's outcome decided from the key's status now."""
        self._entries += 1
        entry = f"{self._entries}-0"
        if reply and len(keys) == 1:
            found = await self.status(name, keys[0])
            self.outcomes[entry] = outcome_of(op, client, admin, found)
        return entry

    async def outcome(self, name: str, entry: str) -> str | None:
        return self.outcomes.get(entry)

    async def record_released(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        forget: Sequence[tuple[str, str]] = (),
        reply: bool = False,
    ) -> str:
        self._drain()
        for owner, idempotency_key in forget:
            self.hot.forget(owner, idempotency_key)
        for key in keys:
            row = self.rows.get((name, key))
            if row is None or not row.may_mark(client, admin):
                continue
            row.released_at, row.released_by = _now(), client
            if name in self.reissue:
                self.given_back[(name, key)] = self.rows.pop((name, key))
        return await self._entry(name, keys, "release", client, admin, reply)

    async def wait_durable(
        self, name: str, durability: str, replicas: int, timeout_ms: int
    ) -> bool:
        self.durable_waits.append(name)
        return self.durable

    async def newest_entry(self, name: str) -> str | None:
        return None  # applied at once

    async def applied(self, name: str, entry: str) -> bool:
        return True

    async def confirmed_mark(self, name: str) -> str:
        return "0-0"  # applied at once: nothing to wait for

    async def wait_confirmed(self, name: str, mark: str, timeout_ms: int) -> str:
        await asyncio.sleep(timeout_ms / 1000)
        return mark

    async def lookup(self, name: str, key: str) -> dict[str, Any]:
        self._drain()
        row = self.rows.get((name, key))
        if row is None:
            return {"id_type": name, "key": key, "issued": False, "used": False}
        return {
            "id_type": name,
            "key": key,
            "issued": True,
            "issued_at": row.issued_at,
            "client": row.issue.client,
            "idempotency_key": row.issue.idempotency_key,
            "used": row.used_at is not None,
            "used_at": row.used_at,
            "used_by": row.used_by,
            "released": row.released_at is not None,
            "released_at": row.released_at,
            "released_by": row.released_by,
        }

    async def status(self, name: str, key: str) -> KeyStatus:
        self._drain()
        row = self.rows.get((name, key))
        if row is None:
            past = self.given_back.get((name, key))
            if past is None:
                return KeyStatus("unknown")
            return KeyStatus("released", past.issue.client, reissued=True)
        if row.used_at is not None:
            return KeyStatus("assigned", row.issue.client)
        if row.released_at is not None:
            return KeyStatus("released", row.issue.client)
        return KeyStatus("issued", row.issue.client, idempotency_key=row.issue.idempotency_key)

    problem: str | None = None
    halt: str = ""  # why the ledger is halted ("": it is not)

    async def halted(self, name: str) -> str:
        return self.halt

    async def probe(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class MemoryTake:
    """Keys taken out of a ``MemoryCold`` by a take still open (``OpenBatch``): gone
    once committed, back in the cold tier after a rollback."""

    keys: list[str]
    stamp: Stamp
    _cold: MemoryCold = field(repr=False)
    _name: str = field(repr=False)
    _finished: bool = field(default=False, repr=False)
    epoch: int = 0

    async def commit(self) -> None:
        if self._finished:
            raise KeydispenserError("take_batch: this batch's transaction already ended")
        self._finished = True

    async def rollback(self) -> None:
        if not self._finished:
            self._finished = True
            self._cold.keys.setdefault(self._name, set()).update(self.keys)


@dataclass
class MemoryCold:
    """The cold tier, as keygen sees it (``KeyInventory`` and ``RangeLeases``: a set of
    keys per type, one counter per type from which disjoint ranges are leased) and as
    keysync does (``ColdInventory``: takes left open until committed)."""

    keys: dict[str, set[str]] = field(default_factory=dict)
    next_counter: dict[str, int] = field(default_factory=dict)
    ranges: list[tuple[str, int, int]] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    woken: list[str] = field(default_factory=list)  # wake_keygen's types, in order
    vouched: int = 0
    clock: int = 0  # the sync clock: each take's stamp moves it on
    import_epochs: dict[str, int] = field(default_factory=dict)  # kd_import_epochs
    excluded: dict[str, set[str]] = field(default_factory=dict)  # kd_excluded's keys

    async def begin_take(self, name: str, size: int) -> MemoryTake:
        stored = self.keys.get(name, set())
        taken = [stored.pop() for _ in range(min(size, len(stored)))]
        self.clock += 1
        epoch = self.import_epochs.get(name, 0)
        return MemoryTake(taken, Stamp(1, 0, self.clock), self, name, epoch=epoch)

    async def vouch(self) -> None:
        self.vouched += 1

    async def wake_keygen(self, name: str) -> None:
        self.woken.append(name)

    async def import_epoch(self, name: str) -> int:
        return self.import_epochs.get(name, 0)

    async def lease_range(self, id_type: IdType, lessee: str) -> LeasedRange:
        config = id_type.config
        start = self.next_counter.get(id_type.name, config.counter_start)
        if start >= config.counter_stop:
            raise KeyspaceExhausted(id_type.name)
        stop = min(start + config.range_size, config.counter_stop)
        self.next_counter[id_type.name] = stop
        self.ranges.append((id_type.name, start, stop))
        self._stats(id_type.name)["leased"] += 1
        return LeasedRange(start, stop)

    async def depth(self, name: str, cap: int) -> int:
        return min(len(self.keys.get(name, ())), cap)

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
        stored = self.keys.setdefault(id_type.name, set())
        keys = [k for k in keys if k not in self.excluded.get(id_type.name, ())]
        if not stored.isdisjoint(keys):
            raise AssertionError(f"{id_type.name}: a key inserted twice")
        before_commit()
        stored.update(keys)
        stats = self._stats(id_type.name)
        stats["candidates"] += candidates
        stats["accepted"] += len(keys)
        stats["filled"] += 1 if final else 0

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        config = id_type.config
        leased = self.next_counter.get(id_type.name, config.counter_start) - config.counter_start
        return SequenceState(leased, config.counter_share)

    async def range_stats(self, name: str) -> dict[str, int]:
        return dict(self._stats(name))

    def take(self, name: str, count: int) -> list[str]:
        """Remove up to ``count`` keys (as keysync would), any of them."""
        stored = self.keys.get(name, set())
        return [stored.pop() for _ in range(min(count, len(stored)))]

    def _stats(self, name: str) -> dict[str, int]:
        return self.stats.setdefault(
            name, {"leased": 0, "filled": 0, "candidates": 0, "accepted": 0}
        )
