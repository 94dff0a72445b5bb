"""The dispenser's service: pops keys from the hot tier, counts them, nudges keysync.

The routes (``dispenser.app``) and the single-ID answer (``dispenser.single``) call it;
it knows nothing of HTTP beyond the API-key gate it holds for them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from dataclasses import dataclass

from dispenser.auth import Gate
from dispenser.coalesce import STOCKED, Coalescer
from dispenser.metrics import DispenserMetrics
from dispenser.snowflake import Snowflakes, no_leases
from shared.domain.config import Settings, path_segments
from shared.domain.errors import (
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    LedgerBacklogFull,
    LedgerDisabled,
    PoolEmpty,
    StoreUnavailable,
    UnknownIdType,
)
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.names import ID_TYPE_NAME
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


# A refill rate keysync reported longer ago than this is not trusted for Retry-After.
REFILL_FRESH_S = 30.0
# With types spread over a cluster's shards: how long readiness waits for each shard
# (a probe's own timeout is 1 s by default).
TYPE_STATE_S = 0.4
# How often the ledger stream's length is read (for dispenser.ledger_max_backlog).
LEDGER_BACKLOG_READ_S = 1.0


@dataclass(frozen=True)
class Stores:
    """The ports the dispenser's service uses (Redis and PostgreSQL in ``create_app``,
    in-memory adapters in unit tests)."""

    hot: HotPool
    wake: Nudges
    ledger_stream: LedgerWrites
    ledger: LedgerLookup


@dataclass(frozen=True)
class Route:
    """A type as the single-ID path uses it, resolved once per request from the path's
    type segment (its name or an alias): the name it is known by, and what serves it
    (a pool it is popped from, or a minter). A segment that names no type resolves to a
    Route of neither kind, refused where it is used (after the API-key check: a caller
    without a key is not told which names exist)."""

    name: str
    id_type: IdType | None = None  # popped from the hot tier
    minter: Minter | None = None  # a snowflake type, minted here


class Dispenser:
    """Pops keys from the hot tier; PostgreSQL is read only for ledger lookups."""

    def __init__(
        self,
        settings: Settings,
        stores: Stores,
        metrics: DispenserMetrics,
        snowflakes: Snowflakes | None = None,
    ) -> None:
        self.settings = settings
        self.hot = stores.hot
        self.wake = stores.wake
        self.ledger_stream = stores.ledger_stream
        self.ledger = stores.ledger
        self.metrics = metrics
        self.id_types = build_id_types(settings, generating=False)
        # Whether any type keeps a ledger: only then does this process use PostgreSQL.
        self.keeps_ledgers = any(t.config.ledger for t in self.id_types.values())
        for name, id_type in self.id_types.items():  # what KdHotDepthLow compares with
            metrics.hot_low.labels(name).set(id_type.config.hot.low)
        # Each path segment that names a type (its name and its aliases) -> its name.
        self.segments = path_segments(settings.id_types)
        self.gate = Gate(settings.dispenser.auth, self.segments)
        # Snowflake types are minted here, from a machine-ID lease: no hot list, no pop.
        self.snowflakes = snowflakes or Snowflakes({}, no_leases, metrics)
        self.minters: dict[str, Minter] = self.snowflakes.minters
        self.names = frozenset(self.id_types) | frozenset(self.minters)
        # Each path segment that names a type served here -> its type's one Route.
        served = {n: Route(n, self.id_types.get(n), self.minters.get(n)) for n in self.names}
        self.routes = {s: served[n] for s, n in self.segments.items() if n in served}
        # Counted when handed out (a prefetched key is not issued until then).
        metrics.issued.seed(self.names)
        self.coalescer = Coalescer(
            self._pop_many,
            settings.dispenser.max_batch,
            self.lost,
            {name: id_type.config.stock for name, id_type in self.id_types.items()},
        )
        metrics.watch_stock(self.coalescer.stocked)
        metrics.issued.also(self.coalescer.handed_out)
        self._last_nudge: dict[str, float] = {}
        self._memory_policy_ok = False  # checked once the primary answers
        # Each ledger type's stream length, as last read, and when (with types spread
        # over a cluster's shards each type has a stream of its own).
        self._backlog: dict[str, int] = {}
        self._backlog_read_at: dict[str, float] = {}
        self._nudges: set[asyncio.Task[None]] = set()

    def route(self, segment: str) -> Route:
        """The type the path segment ``segment`` names, resolved once for the request."""
        found = self.routes.get(segment)
        return found if found is not None else Route(segment)

    def canonical(self, segment: str) -> str:
        """The type's name for a path segment that is one of its aliases; any other
        segment as it is (``id_type`` refuses it when it names no type)."""
        return self.segments.get(segment, segment)

    def id_type(self, name: str) -> IdType:
        if not ID_TYPE_NAME.fullmatch(name):
            raise InvalidInput(f"id_type must match {ID_TYPE_NAME.pattern}")
        found = self.id_types.get(name)
        if found is None:
            raise UnknownIdType(name, tuple(sorted(self.settings.id_types)))
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

    def take_ready(self, route: Route) -> str | None:
        """One key of ``route``'s type if one is at hand (prefetched, or a snowflake ID
        minted now), without waiting; else None, and ``take_one`` waits for it."""
        minter = route.minter
        if minter is None:
            return self.coalescer.ready(route.name)  # counted as issued by the coalescer
        got = minter.mint_some(1)
        if not isinstance(got, range):
            return None
        self.metrics.issued.inc(route.name)
        return minter.layout.encode(got.start)

    async def take_one(self, route: Route, client: str) -> str:
        """One key; concurrent callers of a type share one Redis call (snowflake types
        mint it in-process). A route of neither kind is refused here (``id_type``)."""
        if route.minter is not None:
            return await self._mint_one(route.minter)
        name = route.name
        id_type = route.id_type or self.id_type(name)
        if id_type.config.ledger:
            await self.ledger_open(id_type)
        key = self.coalescer.ready(name)
        if key is not None:
            return key
        taken, popped = await self.coalescer.take(name, client)
        if taken is None:
            raise self._none_left(id_type, popped)
        if popped is not STOCKED:  # a key of the stock is counted by the coalescer
            self.metrics.issued.inc(name)
        return taken

    async def take(
        self, name: str, count: int, client: str, idempotency_key: str | None = None
    ) -> Popped:
        if name in self.minters:
            return await self._mint(name, count, idempotency_key)
        id_type = self.id_type(name)
        if id_type.config.ledger:
            await self.ledger_open(id_type)
        if idempotency_key is None:
            popped = await self.hot.pop(name, count, (client,), id_type.config.ledger)
        else:
            popped = await self.hot.pop_once(
                name,
                count,
                idempotency_key,
                id_type.config.idempotency_ttl_s(self.settings.dispenser.idempotency_ttl_s),
                client,
                id_type.config.ledger,
            )
        self._after_pop(id_type, popped)
        if not popped.keys:
            raise self._none_left(id_type, popped)
        await self._confirmed(id_type, popped)
        return popped

    async def _confirmed(self, id_type: IdType, popped: Popped) -> None:
        """Return once the ledger type's issue entry of ``popped`` is as durable as its
        ``ledger_durability`` asks; else its keys are never handed out (counted), and
        StoreUnavailable says why (503)."""
        config = id_type.config
        if config.ledger_durability == "async" or not popped.keys:
            return
        try:
            durable = await self.ledger_stream.confirm(
                id_type.name,
                config.ledger_durability,
                config.ledger_replicas,
                config.ledger_wait_ms,
            )
        except StoreUnavailable:
            durable = False
        if durable:
            return
        self.metrics.ledger_unconfirmed.labels(id_type.name).inc(len(popped.keys))
        log.warning(
            "ledger_entry_unconfirmed",
            extra={"id_type": id_type.name, "count": len(popped.keys)},
        )
        raise StoreUnavailable(
            "redis",
            f"the ledger record of '{id_type.name}' was not {config.ledger_durability} on "
            f"{config.ledger_replicas} replica(s) within {config.ledger_wait_ms} ms",
        )

    async def _mint_one(self, minter: Minter) -> str:
        got = minter.mint_some(1)
        value = got.start if isinstance(got, range) else (await minter.amint(1))[0].start
        self.metrics.issued.inc(minter.name)
        return minter.layout.encode(value)

    async def _mint(self, name: str, count: int, idempotency_key: str | None) -> Popped:
        if idempotency_key is not None:
            raise InvalidInput(
                f"Idempotency-Key is not accepted for snowflake type '{name}': its IDs are "
                "minted, not taken from a pool; send the request without it"
            )
        minter = self.minters[name]
        spans = await minter.amint(count)
        self.metrics.issued.inc(name, count)
        return Popped(minter.layout.encode_ranges(spans), remaining=0, exhausted=False)

    async def _pop_many(self, name: str, count: int, clients: list[str]) -> Popped:
        id_type = self.id_types[name]
        # One pop of a type in flight at a time (the coalescer's): the type's own line.
        popped = await self.hot.pop(name, count, clients, id_type.config.ledger, on_line=True)
        self.metrics.pop_requests.observe(count)
        self._after_pop(id_type, popped, issued=False)  # counted as each is handed out
        await self._confirmed(id_type, popped)
        return popped

    async def ledger_open(self, id_type: IdType) -> None:
        """Refuse (LedgerBacklogFull) while the ledger stream that holds the type's
        entries is over its maximum backlog (a stream on a shard that is down refuses
        only its own types: StoreUnavailable).

        Its length is read at most once per LEDGER_BACKLOG_READ_S, so the bound may be
        passed by what a process hands out in that time.
        """
        name, now = id_type.name, time.monotonic()
        if now - self._backlog_read_at.get(name, -math.inf) >= LEDGER_BACKLOG_READ_S:
            self._backlog_read_at[name] = now
            self._backlog[name] = await self.ledger_stream.backlog(name)
            self.metrics.ledger_backlog.set(max(self._backlog.values()))
        if self._backlog.get(name, 0) >= self.settings.dispenser.ledger_max_backlog:
            self.metrics.ledger_refusals.labels(id_type.name).inc()
            raise LedgerBacklogFull(id_type.name, self.settings.dispenser.retry_after_max_s)

    def lost(self, name: str, count: int) -> None:
        """Keys popped that will never be handed out (their client was gone, or they were
        still prefetched when this process stopped): counted, never reissued."""
        self.metrics.keys_lost.labels(name).inc(count)
        log.warning("keys_not_handed_out", extra={"id_type": name, "keys": count})

    def _after_pop(self, id_type: IdType, popped: Popped, *, issued: bool = True) -> None:
        """Metrics (``issued``: the keys popped are handed out now), and a nudge to
        keysync below the low watermark. Never raises."""
        name, metrics = id_type.name, self.metrics
        metrics.hot_depth.labels(name).set(popped.remaining)
        if popped.replayed:
            metrics.replays.labels(name).inc()
        elif popped.keys and issued:
            metrics.issued.inc(name, len(popped.keys))
        if popped.discarded:
            metrics.discarded.inc(popped.discarded)
        if popped.remaining < id_type.config.hot.low and not popped.exhausted:
            self._nudge(name)

    def _none_left(self, id_type: IdType, popped: Popped) -> KeydispenserError:
        if popped.exhausted:
            return KeyspaceExhausted(id_type.name)
        return PoolEmpty(id_type.name, self.retry_after(id_type, popped))

    def retry_after(self, id_type: IdType, popped: Popped) -> int:
        """Seconds until keysync's next batch lands, at the refill rate it last observed."""
        config = self.settings.dispenser
        refill = popped.refill
        if refill is None or refill.rate <= 0 or time.time() - refill.at > REFILL_FRESH_S:
            return config.retry_after_s
        seconds = math.ceil(min(id_type.config.sync_batch, id_type.config.hot.high) / refill.rate)
        return min(config.retry_after_max_s, max(1, seconds))

    def _nudge(self, name: str) -> None:
        """Wake keysync, at most once per nudge interval per type, off the request path."""
        now = time.monotonic()
        if now - self._last_nudge.get(name, -math.inf) < self.settings.dispenser.nudge_interval_s:
            return
        self._last_nudge[name] = now
        self.metrics.nudges.labels(name).inc()
        task = asyncio.get_running_loop().create_task(self._send_nudge(name))
        self._nudges.add(task)
        task.add_done_callback(self._nudges.discard)

    async def _send_nudge(self, name: str) -> None:
        try:
            await self.wake.nudge(name)
        except KeydispenserError as exc:  # keysync still polls; nothing is lost
            log.warning("nudge_failed", extra={"id_type": name, "error": str(exc)})

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
        await self.gate.close()
        self.coalescer.drop_stock()
        await self.snowflakes.close()
        await asyncio.gather(*self._nudges, return_exceptions=True)
        await self.ledger.close()
