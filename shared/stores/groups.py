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
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.domain.ports import HotPool, LedgerWrites, Nudges
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


def routed_operations(port: type) -> tuple[str, ...]:
    """The operations of ``port`` (a Protocol) that name a type first: those a router
    forwards to the group that holds it."""
    found = []
    for op, member in vars(port).items():
        if op.startswith("_") or not inspect.iscoroutinefunction(member):
            continue
        params = list(inspect.signature(member).parameters)
        if params[1:2] == ["name"]:
            found.append(op)
    return tuple(found)


def _forward(op: str) -> Callable[..., Awaitable[Any]]:
    async def forward(self: _ByType[Any], name: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.of(name), op)(name, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = op
    return forward


class _ByType(Generic[P]):
    """Ports of one kind, one per group, chosen by type name.

    A router names the port it serves as a base (``HotPool``): every operation of it
    that names a type first (``routed_operations``) is forwarded to that type's group,
    with the port's own signature; the router writes only what spans every group. A
    router is built by its class method (``open``, ``over``): mypy holds the port's
    operations abstract on the class, since they are added when the class is made."""

    def __init__(self, ports: dict[str, P], groups: Groups) -> None:
        self.ports = ports
        self._groups = groups

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # typing marks each Protocol class so (and not the classes that implement one)
        served = [base for base in cls.__bases__ if getattr(base, "_is_protocol", False)]
        for port in served:
            for op in routed_operations(port):
                if op not in cls.__dict__:
                    setattr(cls, op, _forward(op))

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


class LedgerRouter(_ByType[LedgerStream], LedgerWrites):
    """The ledger streams of every group: a type's entries are all in its group's
    stream, in order."""

    @classmethod
    def over(cls, streams: dict[str, LedgerStream], groups: Groups) -> LedgerRouter:
        return cls(streams, groups)

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
