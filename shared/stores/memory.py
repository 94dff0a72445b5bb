"""In-memory adapters of the ports (``shared.domain.ports``), for unit tests of the
processes' logic: the dispenser's service and coalescer, keygen's loop, keysync's
refill. ``tests/integration/test_port_conformance.py`` runs the same cases against
each of them and the real adapter it stands for.

They keep the contracts a unit test relies on (a key popped once is gone, a range
leased once is never leased again, an idempotency record replays its keys to its own
client) and none of the faults the real stores guard against: no fence, no failover,
no transaction. Whatever a test proves with them is about the logic above the port;
what the stores themselves guarantee is proven against real servers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import IdempotencyMismatch, KeydispenserError, KeyspaceExhausted
from shared.domain.idtypes import IdType
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


@dataclass
class MemoryHot:
    """The hot lists, as dispensers see them (``HotPool``) and as keysync does
    (``HotLists``): a deque of keys per type on one server that never changes
    (``token``), whose clock is ``now_ms``."""

    lists: dict[str, deque[str]] = field(default_factory=dict)
    exhausted_types: set[str] = field(default_factory=set)
    # Issues recorded for ledger types: (type, key, client), in pop order.
    issued: list[tuple[str, str, str]] = field(default_factory=list)
    pops: list[tuple[str, int]] = field(default_factory=list)  # (type, count) per pop
    token: str = MEMORY_TOKEN
    now_ms: int = 1_000_000
    batches: set[str] = field(default_factory=set)  # batch IDs pushed (push.lua's markers)
    stamps: list[Stamp] = field(default_factory=list)  # each pushed batch's, in order
    refills: dict[str, tuple[float, float]] = field(default_factory=dict)  # rate, at
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
    ) -> Pushed:
        """Append a batch once (``batch_id``); refused when pinned to another server,
        expired after ``not_after_ms`` of this server's clock (neither appends)."""
        hot = self.lists.setdefault(name, deque())
        if pin and pin != self.token:
            return Pushed(len(hot), self.token, "refused")
        if not_after_ms and self.now_ms > not_after_ms:
            return Pushed(len(hot), self.token, "expired")
        if batch_id in self.batches:
            return Pushed(len(hot), self.token, "duplicate")
        self.batches.add(batch_id)
        self.stamps.append(stamp)
        hot.extend(keys)
        return Pushed(len(hot), self.token, "pushed")

    async def server_time_ms(self) -> int:
        return self.now_ms

    async def record_refill(self, name: str, rate: float, at: float) -> None:
        self.refills[name] = (rate, at)

    async def mark_exhausted(self, name: str) -> None:
        self.exhausted_types.add(name)

    async def pop(
        self,
        name: str,
        count: int,
        clients: Sequence[str] = (),
        ledger: bool = False,
        *,
        on_line: bool = False,
    ) -> Popped:
        self.pops.append((name, count))
        hot = self.lists.setdefault(name, deque())
        taken = [hot.popleft() for _ in range(min(count, len(hot)))]
        if ledger:
            names = list(clients or (ANONYMOUS,))
            for index, key in enumerate(taken):
                self.issued.append((name, key, names[index] if len(names) > 1 else names[0]))
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
        popped = await self.pop(name, count, (client,), ledger)
        if popped.keys:
            self._records[(client, idempotency_key)] = (fingerprint, popped)
        return popped

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
class MemoryLedger:
    """The ledger stream and its lookups (``LedgerWrites``, ``LedgerLookup``)."""

    used: list[tuple[str, str, str, bool]] = field(default_factory=list)
    released: list[tuple[str, str, str, bool]] = field(default_factory=list)
    forgotten: list[tuple[str, str]] = field(default_factory=list)  # idempotency records
    confirms: list[str] = field(default_factory=list)  # types whose pops were confirmed
    durable: bool = True  # what ``confirm`` answers
    held: int = 0  # entries not yet drained (what ``backlog`` reports)

    async def backlog(self, name: str = "") -> int:
        return self.held

    async def record_used(
        self, name: str, keys: Sequence[str], client: str, admin: bool = False
    ) -> str:
        self.used.extend((name, key, client, admin) for key in keys)
        return f"0-{len(self.used)}"

    async def record_released(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        forget: Sequence[tuple[str, str]] = (),
    ) -> str:
        self.released.extend((name, key, client, admin) for key in keys)
        self.forgotten.extend(forget)
        return f"1-{len(self.released)}"

    async def confirm(self, name: str, durability: str, replicas: int, timeout_ms: int) -> bool:
        self.confirms.append(name)
        return self.durable

    async def newest_entry(self, name: str) -> str | None:
        return None  # applied at once

    async def applied(self, name: str, entry: str) -> bool:
        return True

    async def lookup(self, name: str, key: str) -> dict[str, Any]:
        return {"id_type": name, "key": key, "issued": False, "used": False}

    async def status(self, name: str, key: str) -> KeyStatus:
        return KeyStatus("unknown")

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

    async def begin_take(self, name: str, size: int) -> MemoryTake:
        stored = self.keys.get(name, set())
        taken = [stored.pop() for _ in range(min(size, len(stored)))]
        self.clock += 1
        return MemoryTake(taken, Stamp(1, 0, self.clock), self, name)

    async def vouch(self) -> None:
        self.vouched += 1

    async def wake_keygen(self, name: str) -> None:
        self.woken.append(name)

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
    ) -> None:
        stored = self.keys.setdefault(id_type.name, set())
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
