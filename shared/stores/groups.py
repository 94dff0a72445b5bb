"""Key groups: where each ID type's Redis keys live, and a store per group.

A key group is a key namespace (``Settings.key_groups``) with everything the scripts
need beside the hot lists it holds: its own fence (token, registry, discards), its own
PostgreSQL sync record, ledger stream, wake list, idempotency records and batch
markers. No script touches two groups. One server, Sentinel, and a Redis Cluster with
``slot_per: namespace`` have one group; a cluster with ``slot_per: type`` has one per
type, each in a hash slot of its own, wherever the cluster put that slot: a shard's
failover then fences only the groups it holds, and the others never notice.

Each group has its own endpoint (the primary of its slot). The classes here give a
process the ports it already uses (``HotPool``, ``Nudges``, ``LedgerWrites``) over
every group at once, routing by type name; keysync and keygen instead run their work
per group (``keysync.main``), or per type against its group's record (``SyncRecords``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

from shared.domain.apikeys import ANONYMOUS
from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.domain.ports import HotPool, LedgerWrites, Nudges
from shared.domain.tiers import Popped
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.hot.wake import WakeChannel
from shared.stores.ledger.stream import LedgerStream
from shared.stores.redis.endpoint import RedisEndpoint

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P")
# With types spread over shards: how long a check of every shard (the eviction policy)
# waits for each, at once.
CHECK_S = 0.4


class Groups:
    """One endpoint per key namespace the settings use, opened on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.types = settings.key_groups()  # namespace -> its pooled types
        self._endpoints: dict[str, RedisEndpoint] = {}

    def endpoint(self, namespace: str) -> RedisEndpoint:
        found = self._endpoints.get(namespace)
        if found is None:
            found = self._endpoints[namespace] = self.fresh(namespace)
        return found

    def fresh(self, namespace: str) -> RedisEndpoint:
        """An endpoint of the group's own, for a port whose calls block (a wait on the
        wake list, a read of the ledger stream); closed with the port."""
        return RedisEndpoint.for_keys(self.settings, namespace)

    def place(self, name: str) -> tuple[RedisEndpoint, str]:
        """The endpoint and key namespace of a type's (or machine-ID pool's) keys."""
        namespace = self.settings.key_namespace_of(name)
        return self.endpoint(namespace), namespace

    def each(self, port: Callable[[RedisEndpoint, str], T]) -> dict[str, T]:
        """``port`` of every group that holds pooled types (one group at least)."""
        return {ns: port(self.endpoint(ns), ns) for ns in self.types}

    async def close(self) -> None:
        for endpoint in self._endpoints.values():
            await endpoint.close()
        self._endpoints.clear()


class _ByType(Generic[P]):
    """Ports of one kind, one per group, chosen by type name.

    A router names the port it serves as a base (``HotPool``) and writes each of its
    operations out: one that names a type first goes to that type's group (``of``),
    one that names none spans every group (``_all``). ``tests/unit/test_routers.py``
    refuses a port operation that names a type first and that the router does not
    write, and checks each forwarder's signature against the port's."""

    def __init__(self, ports: dict[str, P], groups: Groups) -> None:
        self.ports = ports
        self._groups = groups

    def of(self, name: str) -> P:
        """The port of the group that holds type ``name``."""
        return self.ports[self._groups.settings.key_namespace_of(name)]

    async def _all(self, call: Callable[[P], Awaitable[T]]) -> list[T]:
        return [await call(port) for port in self.ports.values()]


class HotRouter(_ByType[HotStore], HotPool):
    """The dispenser's hot tier over every group."""

    def __init__(self, ports: dict[str, HotStore], groups: Groups) -> None:
        super().__init__(ports, groups)
        self._checked: set[str] = set()  # groups whose server refused eviction

    @classmethod
    def open(cls, groups: Groups) -> HotRouter:
        return cls(groups.each(HotStore), groups)

    async def pop(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """Pops up to ``count`` keys of type ``name`` from its group (``HotStore.pop``)."""
        return await self.of(name).pop(name, count, clients, ledger)

    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        """Pops for type ``name``'s one coalescing caller, on its group's own line
        (``HotStore.pop_coalesced``): the single-ID request's refill."""
        return await self.of(name).pop_coalesced(name, count, clients, ledger)

    async def pop_once(
        self,
        name: str,
        count: int,
        idempotency_key: str,
        ttl_s: int,
        client: str = ANONYMOUS,
        ledger: bool = False,
    ) -> Popped:
        """Pops keys of type ``name`` under an Idempotency-Key, from its group: a retry
        gets the same keys (``HotStore.pop_once``)."""
        return await self.of(name).pop_once(name, count, idempotency_key, ttl_s, client, ledger)

    async def depth(self, name: str) -> int:
        """Returns the length of type ``name``'s hot list."""
        return await self.of(name).depth(name)

    async def exhausted(self, name: str) -> bool:
        """Returns whether keysync marked type ``name``'s keyspace used up."""
        return await self.of(name).exhausted(name)

    async def stock_epoch(self, name: str, hold_ms: int) -> int:
        """Type ``name``'s stock epoch, from its group (``HotStore.stock_epoch``)."""
        return await self.of(name).stock_epoch(name, hold_ms)

    async def refuse_eviction(self) -> None:
        """ConfigError when a group's server may evict keys (a cluster's shards each
        have their own policy). A server not reachable yet is checked at the next
        call (each is checked once); StoreUnavailable only while none could be."""
        unchecked = [ns for ns in self.ports if ns not in self._checked]
        wait = CHECK_S if self._groups.settings.slot_per_type else None  # one server: its own
        answers = await asyncio.gather(
            *(asyncio.wait_for(self.ports[ns].refuse_eviction(), wait) for ns in unchecked),
            return_exceptions=True,
        )
        unreachable: list[BaseException] = []
        for namespace, answer in zip(unchecked, answers, strict=True):
            if isinstance(answer, StoreUnavailable | TimeoutError):
                unreachable.append(answer)
            elif isinstance(answer, BaseException):
                raise answer  # ConfigError: a server that may evict
            else:
                self._checked.add(namespace)
        if unreachable and not self._checked:
            first = unreachable[0]
            if isinstance(first, StoreUnavailable):
                raise first
            raise StoreUnavailable("redis", "no shard answered in time")

    async def warn_if_reloadable(self) -> bool:
        return any(await self._all(lambda hot: hot.warn_if_reloadable()))

    async def close(self) -> None:
        await self._all(lambda hot: hot.close())


class WakeRouter(_ByType[WakeChannel], Nudges):
    """Nudges for keysync, each on its type's group's wake list."""

    @classmethod
    def open(cls, groups: Groups) -> WakeRouter:
        return cls(groups.each(WakeChannel), groups)

    async def nudge(self, name: str) -> None:
        """Wakes keysync for type ``name``, on its group's wake list."""
        await self.of(name).nudge(name)


class LedgerRouter(_ByType[LedgerStream], LedgerWrites):
    """The ledger streams of every group: a type's entries are all in its group's
    stream, in order."""

    @classmethod
    def over(cls, streams: dict[str, LedgerStream], groups: Groups) -> LedgerRouter:
        return cls(streams, groups)

    async def backlog(self, name: str) -> int:
        """Returns the length of the stream that holds type ``name``'s entries."""
        return await self.of(name).backlog(name)

    async def record_used(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        reply: bool = False,
    ) -> str:
        """Records that ``client`` used ``keys`` of type ``name``; the entry's ID
        (``LedgerStream.record_used``)."""
        return await self.of(name).record_used(name, keys, client, admin, reply)

    async def record_released(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        forget: Sequence[tuple[str, str]] = (),
        reply: bool = False,
    ) -> str:
        """Records that ``client`` gave ``keys`` of type ``name`` back; the entry's ID
        (``LedgerStream.record_released``)."""
        return await self.of(name).record_released(name, keys, client, admin, forget, reply)

    async def outcome(self, name: str, entry: str) -> str | None:
        """Returns what keysync decided for ``entry`` of type ``name``, None until it has."""
        return await self.of(name).outcome(name, entry)

    async def wait_durable(
        self, name: str, durability: str, replicas: int, timeout_ms: int
    ) -> bool:
        """Returns whether type ``name``'s stream holds its last writes as durably as
        ``durability`` asks, within ``timeout_ms`` (``LedgerStream.wait_durable``)."""
        return await self.of(name).wait_durable(name, durability, replicas, timeout_ms)

    async def newest_entry(self, name: str) -> str | None:
        """Returns the ID of the newest entry of the stream that holds type ``name``."""
        return await self.of(name).newest_entry(name)

    async def applied(self, name: str, entry: str) -> bool:
        """Returns whether keysync has applied type ``name``'s stream up to ``entry``."""
        return await self.of(name).applied(name, entry)

    async def confirmed_mark(self, name: str) -> str:
        """Returns the newest confirmation of type ``name``'s ledger transactions."""
        return await self.of(name).confirmed_mark(name)

    async def wait_confirmed(self, name: str, mark: str, timeout_ms: int) -> str:
        """Waits for a confirmation of type ``name``'s ledger after ``mark``."""
        return await self.of(name).wait_confirmed(name, mark, timeout_ms)

    async def total_backlog(self) -> int:
        """Every stream's length, together (keysync's ``kd_ledger_backlog``)."""
        return sum(await self._all(lambda stream: stream.backlog()))


def dispenser_ports(groups: Groups) -> tuple[HotRouter, WakeRouter, LedgerRouter]:
    """The hot tier, wake lists and ledger streams of every group, sharing each
    group's endpoint (its connections)."""
    return (
        HotRouter.open(groups),
        WakeRouter.open(groups),
        LedgerRouter.over(groups.each(LedgerStream), groups),
    )


class SyncRecords:
    """The PostgreSQL fence's record in every group: a type's statements are judged
    against its group's record; a fence judges and claims them all
    (``postgres_fence.settle``)."""

    def __init__(
        self,
        records: dict[str, SyncRecord],
        types: dict[str, tuple[str, ...]],
        opener: Callable[[str], SyncRecord] | None = None,
    ):
        self.records = records  # namespace -> its record
        self._of_type = {name: ns for ns, names in types.items() for name in names}
        # With a record per type: the record of a type this process is not configured
        # with (the database may hold it: a rolling update, a retired type).
        self._opener = opener
        self._extra: dict[str, SyncRecord] = {}  # type name -> its record, once opened

    @classmethod
    def open(cls, groups: Groups) -> SyncRecords:
        def opener(name: str) -> SyncRecord:
            return SyncRecord(*groups.place(name))

        opens = opener if groups.settings.slot_per_type else None
        return cls(groups.each(SyncRecord), groups.types, opens)

    @property
    def several(self) -> bool:
        """Whether types have records of their own (the guard is strict then)."""
        return self._opener is not None or len(self.records) > 1

    def covering(self, names: Sequence[str]) -> list[SyncRecord]:
        """Every record that judges one of the types ``names`` (every type the
        database holds, for a fence): the configured ones, and with a record per type
        those of types this process was not configured with."""
        found = dict(self.records)
        for name in names:
            if self._opener is None or name in self._of_type:
                continue
            record = self._extra.get(name)
            if record is None:
                record = self._extra[name] = self._opener(name)
            found.setdefault(record.namespace, record)
        return list(found.values())

    @classmethod
    def from_settings(cls, settings: Settings) -> SyncRecords:
        return cls.open(Groups(settings))

    @classmethod
    def single(cls, record: SyncRecord) -> SyncRecords:
        """One record for every type (one key group)."""
        return cls({record.namespace: record}, {})

    def of(self, name: str) -> SyncRecord:
        """The record a type's statements are judged against."""
        if len(self.records) == 1:
            return next(iter(self.records.values()))
        return self.records[self._of_type[name]]

    def __iter__(self) -> Iterator[SyncRecord]:
        return iter(self.records.values())

    async def close(self) -> None:
        for record in [*self.records.values(), *self._extra.values()]:
            await record.close()


def records_of(sync: SyncRecord | SyncRecords) -> SyncRecords:
    return sync if isinstance(sync, SyncRecords) else SyncRecords.single(sync)


async def refuse_evicting_redis(settings: Settings) -> None:
    """ConfigError on a Redis (any key group's) that may evict; a warning when it cannot
    be reached yet (the process checks again before it counts as ready, or at its next
    start). keygen, keysync and the dispenser call it before they serve."""
    hot = HotRouter.open(Groups(settings))
    try:
        await hot.refuse_eviction()
        await hot.warn_if_reloadable()
    except StoreUnavailable as exc:
        log.warning("redis_unreachable_at_start", extra={"error": str(exc)})
    finally:
        await hot.close()
