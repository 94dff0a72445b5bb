"""The ports: each process's view of the tiers, as the process needs it.

The stores (``shared.stores``) implement them over PostgreSQL and Redis; the in-memory
adapters (``shared.stores.memory``) implement them for unit tests of the processes'
logic (the dispenser's service and pools, keygen's loop). A port names only what
its process calls, and imports only the domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shared.domain.idtypes import IdType
from shared.domain.tiers import (
    Depth,
    KeyStatus,
    LeasedRange,
    Popped,
    Pushed,
    SequenceState,
    Stamp,
)

# --- the dispenser ---------------------------------------------------------------


class HotPool(Protocol):
    """The dispenser's view of the hot tier: it pops keys and reads depths."""

    async def pop(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped: ...

    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """``pop`` for a type's one coalescing caller: at most one in flight per type."""

    async def pop_once(
        self,
        name: str,
        count: int,
        idempotency_key: str,
        ttl_s: int,
        client: str = ...,
        ledger: bool = False,
    ) -> Popped: ...

    async def depth(self, name: str) -> int: ...

    async def exhausted(self, name: str) -> bool: ...

    async def refuse_eviction(self) -> None: ...

    async def stock_epoch(self, name: str, hold_ms: int) -> int:
        """The type's stock epoch (moved on by imports), marking a stock held for
        ``hold_ms``."""
        ...


class Nudges(Protocol):
    """How a dispenser wakes keysync for a type at once."""

    async def nudge(self, name: str) -> None: ...


class LedgerWrites(Protocol):
    """The ledger stream as a dispenser writes it (marks of use, releases) and reads it:
    its length, whether keysync has applied it up to an entry, and the outcome keysync
    decided for a status change a client waits for (``reply``)."""

    async def backlog(self, name: str) -> int: ...

    async def record_used(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        reply: bool = False,
    ) -> str: ...

    async def record_released(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        forget: Sequence[tuple[str, str]] = (),
        reply: bool = False,
    ) -> str: ...

    async def outcome(self, name: str, entry: str) -> str | None: ...

    async def wait_durable(
        self, name: str, durability: str, replicas: int, timeout_ms: int
    ) -> bool: ...

    async def newest_entry(self, name: str) -> str | None: ...

    async def applied(self, name: str, entry: str) -> bool: ...

    async def confirmed_mark(self, name: str) -> str:
        """The newest confirmation of a ledger transaction keysync made ("0-0": none)."""
        ...

    async def wait_confirmed(self, name: str, mark: str, timeout_ms: int) -> str:
        """Wait until a ledger transaction is confirmed after ``mark`` (at most
        ``timeout_ms``); the newest mark seen."""
        ...


class LedgerLookup(Protocol):
    """What the ledger knows of one key (``GET /v1/keys/{type}/{key}``)."""

    async def lookup(self, name: str, key: str) -> dict[str, Any]: ...

    async def status(self, name: str, key: str) -> KeyStatus: ...

    async def halted(self, name: str) -> str:
        """Why the type's ledger is halted ("": it is not)."""
        ...

    problem: str | None  # the last failure's detail, for the log

    async def probe(self) -> str | None:
        """None when the ledger can be read, else why not (``/readyz``)."""
        ...

    async def close(self) -> None: ...


# --- keygen ----------------------------------------------------------------------


class RangeLeases(Protocol):
    """keygen's counter ranges: each lease disjoint from every other, ever."""

    async def lease_range(self, id_type: IdType, lessee: str) -> LeasedRange: ...


class KeyInventory(Protocol):
    """keygen's view of the cold tier: how deep it is, and the keys it adds."""

    async def depth(self, name: str, cap: int) -> int: ...

    async def insert_keys(
        self,
        id_type: IdType,
        leased: LeasedRange,
        keys: Sequence[str],
        candidates: int,
        *,
        final: bool,
        before_commit: Callable[[], object] = ...,
        counters: tuple[int, int] | None = None,
    ) -> None:
        """Add ``keys``, generated from ``counters`` (default: the whole range), but for
        those an import excluded."""
        ...

    async def sequence_state(self, id_type: IdType) -> SequenceState: ...

    async def range_stats(self, name: str) -> dict[str, int]: ...


# --- keysync ---------------------------------------------------------------------


class OpenBatch(Protocol):
    """Keys deleted in a transaction still open (``cold_store.OpenTake``)."""

    @property
    def keys(self) -> list[str]: ...

    @property
    def stamp(self) -> Stamp: ...

    @property
    def epoch(self) -> int:
        """The type's import epoch when its keys were taken (``kd_import_epochs``)."""
        ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


class ColdInventory(Protocol):
    """keysync's view of the cold tier."""

    async def begin_take(self, name: str, size: int) -> OpenBatch: ...

    async def vouch(self) -> None: ...

    async def sequence_state(self, id_type: IdType) -> SequenceState: ...

    async def wake_keygen(self, name: str) -> None: ...

    async def import_epoch(self, name: str) -> int:
        """The type's import epoch now (``kd_import_epochs``; 0: never imported into)."""
        ...


class HotLists(Protocol):
    """keysync's view of the hot tier."""

    async def observe(self, name: str) -> Depth: ...

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = ...,
        not_after_ms: int = 0,
        marker_ttl_s: float = ...,
        epoch: int = 0,
    ) -> Pushed: ...

    async def server_time_ms(self) -> int: ...

    async def record_refill(self, name: str, rate: float, at: float) -> None: ...

    async def mark_exhausted(self, name: str) -> None: ...
