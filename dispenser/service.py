"""The dispenser's service: the types it serves and what the routes ask of the stores.

The routes (``dispenser.routes``) call it; it knows nothing of HTTP. Keys come from
each type's source (``dispenser.sources``), which the single-ID route asks directly.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass

from dispenser.metrics import DispenserMetrics
from dispenser.snowflake import Snowflakes, no_leases
from dispenser.sources import LedgerBacklog, Mint, Pool, Source, Unknown, count_lost
from shared.domain.config import Settings, path_segments
from shared.domain.errors import (
    LedgerDisabled,
    StoreUnavailable,
)
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.ports import HotPool, LedgerLookup, LedgerWrites, Nudges
from shared.domain.snowflake import Minter, SnowflakeType
from shared.domain.tiers import Popped

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: assume it is reachable from elsewhere


# With types spread over a cluster's shards: how long readiness waits for each shard
# (a probe's own timeout is 1 s by default).
TYPE_STATE_S = 0.4


@dataclass(frozen=True)
class Stores:
    """The ports the dispenser's service uses (Redis and PostgreSQL in ``create_app``,
    in-memory adapters in unit tests)."""

    hot: HotPool
    wake: Nudges
    ledger_stream: LedgerWrites
    ledger: LedgerLookup


class Dispenser:
    """The types this process serves, each by its source (``dispenser.sources``), and
    what the routes other than "one ID" ask of the stores: ledger lookups and marks,
    each type's state. PostgreSQL is read only for ledger lookups."""

    def __init__(
        self,
        settings: Settings,
        stores: Stores,
        metrics: DispenserMetrics,
        snowflakes: Snowflakes | None = None,
    ) -> None:
        self.settings = settings
        self.hot = stores.hot
        self.ledger_stream = stores.ledger_stream
        self.ledger = stores.ledger
        self.metrics = metrics
        self.id_types = build_id_types(settings, generating=False)
        # Whether any type keeps a ledger: only then does this process use PostgreSQL.
        self.keeps_ledgers = any(t.config.ledger for t in self.id_types.values())
        # Each path segment that names a type (its name and its aliases) -> its name.
        self.segments = path_segments(settings.id_types)
        # Snowflake types are minted here, from a machine-ID lease: no hot list, no pop.
        self.snowflakes = snowflakes or Snowflakes({}, no_leases, metrics)
        self.minters: dict[str, Minter] = self.snowflakes.minters
        self.backlog = LedgerBacklog(stores.ledger_stream, metrics, settings.dispenser)
        self.pools = {
            name: Pool(
                id_type,
                stores.hot,
                stores.wake,
                stores.ledger_stream,
                self.backlog,
                metrics,
                settings.dispenser,
            )
            for name, id_type in self.id_types.items()
        }
        self.sources: dict[str, Source] = {
            **self.pools,
            **{name: Mint(minter, metrics) for name, minter in self.minters.items()},
        }
        # Counted when handed out (a prefetched key is not issued until then).
        metrics.issued.seed(self.sources)
        metrics.watch_stock(lambda: {n: p.stocked() for n, p in self.pools.items() if p.ahead})
        metrics.issued.also(lambda: {n: p.handed_out() for n, p in self.pools.items() if p.ahead})
        self._memory_policy_ok = False  # checked once the primary answers

    def by_segment(self) -> dict[str, Source]:
        """Each path segment that names a type served here (its name, its aliases) ->
        the type's one source."""
        return {s: self.sources[n] for s, n in self.segments.items() if n in self.sources}

    def source(self, name: str) -> Source:
        """The source of the type ``name``; a name that is no served type resolves to
        one that refuses it (InvalidInput or UnknownIdType) where it is used."""
        found = self.sources.get(name)
        if found is None:
            return Unknown(name, tuple(sorted(self.settings.id_types)))
        return found

    def canonical(self, segment: str) -> str:
        """The type's name for a path segment that is one of its aliases; any other
        segment as it is (``id_type`` refuses it when it names no type)."""
        return self.segments.get(segment, segment)

    def id_type(self, name: str) -> IdType:
        """The named pooled type (refused: InvalidInput or UnknownIdType)."""
        found = self.id_types.get(name)
        if found is None:
            Unknown(name, tuple(sorted(self.settings.id_types))).refuse()
        return found

    def any_type(self, name: str) -> IdType | SnowflakeType:
        """The named type of any kind (pooled or snowflake)."""
        snowflake = self.snowflakes.types.get(name)
        return snowflake if snowflake is not None else self.id_type(name)

    def ledger_type(self, name: str) -> IdType:
        """The named type, refused when it keeps no ledger to record in or read."""
        if name in self.minters:
            raise LedgerDisabled(name)
        id_type = self.id_type(name)
        if not id_type.config.ledger:
            raise LedgerDisabled(name)
        return id_type

    async def take(
        self, name: str, count: int, client: str, idempotency_key: str | None = None
    ) -> Popped:
        """``count`` keys of the type ``name`` (the batch route's)."""
        return await self.source(name).take(count, client, idempotency_key)

    def lost(self, name: str, count: int) -> None:
        """Keys of ``name`` taken for a client that was gone: counted, never reissued."""
        count_lost(self.metrics, name, count)

    async def ledger_open(self, id_type: IdType) -> None:
        """Refuse (LedgerBacklogFull) while the type's ledger stream is over its maximum
        backlog (``sources.LedgerBacklog``)."""
        await self.backlog.open(id_type.name)

    def announce_exposure(self) -> None:
        """Warn (and set kd_api_open) when anyone who can reach the port can take keys."""
        config = self.settings.dispenser
        open_api = not config.auth.api_keys and not is_loopback(config.host)
        self.metrics.api_open.set(1 if open_api else 0)
        if open_api:
            log.warning(
                "api_open",
                extra={
                    "host": config.host,
                    "hint": "no dispenser.auth.api_keys: any client that reaches this "
                    "address can take keys (see `keydispenser apikey`)",
                },
            )

    @property
    def started(self) -> bool:
        """Start-up is complete once the Redis primary answered and refuses eviction."""
        return self._memory_policy_ok

    async def type_states(self) -> dict[str, dict[str, int | str]]:
        """Each type's hot depth and state (serving, empty, exhausted; with types spread
        over a cluster's shards, unreachable: its shard is down), into the metrics too.
        Raises StoreUnavailable when the Redis primary cannot be reached (the depth
        script runs only on a primary; with types spread, when no shard answers),
        ConfigError when it may evict keys."""
        if not self._memory_policy_ok or self.settings.slot_per_type:
            await self.hot.refuse_eviction()  # with types spread: shards not checked yet
            self._memory_policy_ok = True
        states: dict[str, dict[str, int | str]] = {}
        if self.settings.slot_per_type:
            # Each type on its own shard, asked at once, each for a moment only: a shard
            # whose host is gone (no reset, only timeouts) must not hold the answer up.
            found = await asyncio.gather(
                *(asyncio.wait_for(self._type_state(n), TYPE_STATE_S) for n in self.id_types),
                return_exceptions=True,
            )
            for name, state in zip(self.id_types, found, strict=True):
                if isinstance(state, StoreUnavailable | TimeoutError):
                    self.metrics.serving.labels(name).set(0)  # its types are refused
                    state = {"hot_depth": 0, "state": "unreachable"}
                elif isinstance(state, BaseException):
                    raise state
                states[name] = state
        else:
            for name in self.id_types:
                states[name] = await self._type_state(name)
        if states and all(each["state"] == "unreachable" for each in states.values()):
            raise StoreUnavailable("redis", "no shard that holds a type answers")
        return states | self.snowflakes.states()

    async def _type_state(self, name: str) -> dict[str, int | str]:
        depth = await self.hot.depth(name)
        state = "serving" if depth else "empty"
        if not depth and await self.hot.exhausted(name):
            state = "exhausted"
        self.metrics.hot_depth.labels(name).set(depth)
        self.metrics.serving.labels(name).set(1 if depth else 0)
        return {"hot_depth": depth, "state": state}

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()
        await self.snowflakes.close()
        await self.ledger.close()
