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


class ColdInventory(Protocol):
    """keysync's view of the cold tier."""

    async def take_batch(self, name: str, size: int) -> tuple[list[str], Stamp]: ...

    async def sequence_state(self, id_type: IdType) -> SequenceState: ...

    async def wake_keygen(self, name: str) -> None: ...


class HotLists(Protocol):
    """keysync's view of the hot tier."""

    async def observe(self, name: str) -> Depth: ...

    async def push(
        self, name: str, keys: Sequence[str], batch_id: str, pin: str = "", stamp: Stamp = ...
    ) -> Pushed: ...

    async def record_refill(self, name: str, rate: float, at: float) -> None: ...

    async def mark_exhausted(self, name: str) -> None: ...
