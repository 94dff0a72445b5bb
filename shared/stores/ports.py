"""The stores as the processes see them (ports): what a unit test fakes.

``ColdStore`` and ``HotStore`` satisfy these structurally; a fake needs only these
methods, no ``cast``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shared.domain.idtypes import IdType
from shared.stores.cold_store import SequenceState
from shared.stores.hot_store import Depth, Pushed
from shared.stores.sync_record import Stamp


class OpenBatch(Protocol):
    """Keys deleted in a transaction still open (``cold_store.OpenTake``)."""

    @property
    def keys(self) -> list[str]: ...

    @property
    def stamp(self) -> Stamp: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


class ColdInventory(Protocol):
    """keysync's view of the cold tier."""

    async def begin_take(self, name: str, size: int) -> OpenBatch: ...

    async def vouch(self) -> None: ...

    async def sequence_state(self, id_type: IdType) -> SequenceState: ...

    async def wake_keygen(self, name: str) -> None: ...


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
    ) -> Pushed: ...

    async def server_time_ms(self) -> int: ...

    async def record_refill(self, name: str, rate: float, at: float) -> None: ...

    async def mark_exhausted(self, name: str) -> None: ...
