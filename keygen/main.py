"""keygen: leases counter ranges and fills the cold inventory up to its high watermark."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import asyncpg
from prometheus_client import CollectorRegistry

from keygen.generation import Generator
from keygen.headroom import Headroom, HeadroomWatch
from keygen.metrics import KeygenMetrics
from shared.domain.config import Settings
from shared.domain.errors import KeyspaceExhausted, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.ports import KeyInventory, RangeLeases
from shared.domain.tiers import LeasedRange
from shared.metrics import FENCE_REFUSALS, Heartbeat
from shared.runtime import (
    FaultPoint,
    Outage,
    fault_points_from_environ,
    instance_name,
    no_fault,
    sleep_or_stop,
)
from shared.startup import ProcessStart, Started, serve_process
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.groups import Groups, SyncRecords, refuse_evicting_redis
from shared.stores.postgres.cold_store import DRIVER_ERRORS, ColdStore
from shared.stores.postgres.connect import connect_each_host, driver_options
from shared.stores.postgres.sql import KEYGEN_CHANNEL

log = logging.getLogger(__name__)
# One line per range filled: `up` quiets it (its own progress lines say as much).
range_log = logging.getLogger("keygen.ranges")
# How often a type keygen is not filling has its headroom read again (the sequence moves
# with other keygens' leases, `fill` and fences too).
HEADROOM_EVERY_S = 15.0


class Keygen:
    def __init__(
        self,
        settings: Settings,
        cold: KeyInventory,
        leases: RangeLeases,
        stop: asyncio.Event,
        generator: Generator,
        metrics: KeygenMetrics | None = None,
        heartbeat: Heartbeat | None = None,
        fault: FaultPoint = no_fault,
    ) -> None:
        """Fills ``cold`` with the keys of the ranges ``leases`` grants."""
        self._settings = settings
        self._cold = cold
        self._leases = leases
        self._stop = stop
        self._types = build_id_types(settings)
        self._exhausted: set[str] = set()
        self._filling: set[str] = set()
        self._wake = asyncio.Event()
        self._name = instance_name()
        self._generator = generator
        self._fault = fault  # test-only fault points (KD_FAULT_POINT)
        self.metrics = metrics or KeygenMetrics(CollectorRegistry())
        self.heartbeat = heartbeat or Heartbeat(self.metrics.registry)
        self._watches = {
            name: HeadroomWatch(t.config.counter_share, t.config.headroom_warnings)
            for name, t in self._types.items()
        }
        self._headroom_seen: dict[str, float] = {}  # type -> when its headroom was read

    @classmethod
    def on_postgres(
        cls,
        settings: Settings,
        cold: ColdStore,
        sync: SyncRecord | SyncRecords | None,
        stop: asyncio.Event,
        generator: Generator,
        metrics: KeygenMetrics | None = None,
        heartbeat: Heartbeat | None = None,
        fault: FaultPoint = no_fault,
    ) -> Keygen:
        """keygen on PostgreSQL, its range leases behind the PostgreSQL fence (``sync``
        None switches the fence off: scratch databases only)."""
        metrics = metrics or KeygenMetrics(CollectorRegistry())
        types = build_id_types(settings)
        leases = GuardedCold(cold, sync, types, metrics.fence.observe)
        return cls(settings, cold, leases, stop, generator, metrics, heartbeat, fault)

    def _copied(self) -> None:
        self._fault("keygen.copied")  # a slice copied, not yet accounted or committed

    def wake(self, *_: object) -> None:
        self._wake.set()

    async def run(self) -> None:
        outage = Outage("postgres", first_delay_s=0.1, max_delay_s=1.0)
        fenced = Outage("postgres_fence", first_delay_s=0.5, max_delay_s=10.0)
        while not self._stop.is_set():
            try:
                worked = await self.step()
                outage.succeeded()
                fenced.succeeded()
                self.metrics.fence.refusing(None)
                self.heartbeat.beat()
            except StoreUnavailable as exc:
                self.heartbeat.beat(ok=False)
                await sleep_or_stop(self._stop, outage.failed(exc))
                continue
            except FENCE_REFUSALS as exc:
                # Behind: the fence runs at the next lease. Superseded: this server is an
                # old primary. Halted: an operator must act. A range leased before a
                # fence is abandoned. Keep trying (and saying so) rather than exit.
                self.metrics.fence.refusing(exc)
                self.heartbeat.beat(ok=False)
                await sleep_or_stop(
                    self._stop, fenced.failed(StoreUnavailable("postgres", str(exc)))
                )
                continue
            if not worked:
                await self._idle()

    async def step(self) -> bool:
        """One range for every type that needs keys (round-robin); False when none did.

        A type whose Redis cannot be reached (its record: with types spread over a
        cluster's shards, its shard) is skipped, and the others are served; its error
        is raised only when no type got a range (then the loop backs off)."""
        worked = False
        unreachable: StoreUnavailable | None = None
        for id_type in self._types.values():
            if self._stop.is_set():
                break
            if await self._needs_keys(id_type):
                try:
                    await self.lease_and_generate(id_type)
                except StoreUnavailable as exc:
                    if exc.store != "redis":
                        raise
                    unreachable = unreachable or exc
                    continue
                worked = True
            elif time.monotonic() - self._headroom_seen.get(id_type.name, -math.inf) >= (
                HEADROOM_EVERY_S
            ):
                # Other keygens, `fill` and fences move the sequence too: the metric
                # follows it as `keydispenser status` does, not only this one's leases.
                await self.watch_headroom(id_type)
        if unreachable is not None and not worked:
            raise unreachable
        return worked

    async def _needs_keys(self, id_type: IdType) -> bool:
        """Below the low watermark a type starts filling; at the high one it stops."""
        if id_type.name in self._exhausted:
            return False
        marks = id_type.config.cold
        depth = await self._cold.depth(id_type.name, marks.high)
        self.metrics.cold_depth.labels(id_type.name).set(depth)
        if depth < marks.low:
            self._filling.add(id_type.name)
        elif depth >= marks.high:
            self._filling.discard(id_type.name)
        return id_type.name in self._filling

    async def _idle(self) -> None:
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait(
            {waiter, stopper},
            timeout=self._settings.keygen.poll_interval_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        waiter.cancel()
        stopper.cancel()

    def exhausted(self, name: str) -> bool:
        return name in self._exhausted

    async def lease_and_generate(
        self, id_type: IdType, progress: Callable[[int], object] | None = None
    ) -> int:
        """Lease one range and fill it; returns keys added (0: keyspace exhausted)."""
        try:
            leased = await self._leases.lease_range(id_type, self._name)
        except KeyspaceExhausted:
            self._exhausted.add(id_type.name)
            self.metrics.exhausted.labels(id_type.name).set(1)
            log.error("keyspace_exhausted", extra={"id_type": id_type.name})
            return 0
        self.metrics.ranges.labels(id_type.name).inc()
        added = await self.generate_range(id_type, leased, progress)
        await self.watch_headroom(id_type)
        return added

    async def watch_headroom(self, id_type: IdType) -> Headroom:
        """Export headroom and its forecast; warn once per threshold crossed."""
        self._headroom_seen[id_type.name] = time.monotonic()
        state = await self._cold.sequence_state(id_type)
        stats = await self._cold.range_stats(id_type.name)
        rate = stats["accepted"] / stats["candidates"] if stats["candidates"] else None
        now = time.monotonic()
        watch = self._watches[id_type.name]
        seen = watch.observe(now, state.leased_counters, rate, state.excluded_ahead)
        labels = id_type.name
        self.metrics.counters_headroom.labels(labels).set(seen.counters_left)
        self.metrics.headroom_ratio.labels(labels).set(seen.fraction_left)
        self.metrics.keys_left.labels(labels).set(seen.estimated_keys_left or 0)
        self.metrics.exhaustion_eta.labels(labels).set(-1 if seen.eta_s is None else seen.eta_s)
        for threshold in seen.crossed:
            log.warning(
                "keyspace_headroom_low",
                extra={
                    "id_type": id_type.name,
                    "threshold": threshold,
                    "headroom_ratio": round(seen.fraction_left, 6),
                    "counters_left": seen.counters_left,
                    "estimated_keys_left": seen.estimated_keys_left,
                    "exhaustion_eta_s": None if seen.eta_s is None else round(seen.eta_s),
                },
            )
        return seen

    async def generate_range(
        self,
        id_type: IdType,
        leased: LeasedRange,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Generate a range slice by slice; the next slice is generated while the
        current one is being copied into PostgreSQL. Each slice commits on its own."""
        step = self._settings.keygen.slice_size
        slices = [(s, min(s + step, leased.stop)) for s in range(leased.start, leased.stop, step)]
        accepted = candidates = 0
        pending = asyncio.ensure_future(self._generator.generate(id_type, *slices[0]))
        try:
            for i in range(len(slices)):
                keys, tried = await pending
                final = i + 1 == len(slices)
                if not final:
                    next_slice = self._generator.generate(id_type, *slices[i + 1])
                    pending = asyncio.ensure_future(next_slice)
                await self._cold.insert_keys(
                    id_type,
                    leased,
                    keys,
                    tried,
                    final=final,
                    before_commit=self._copied,
                    counters=slices[i],
                )
                self.metrics.keys.labels(id_type.name).inc(len(keys))
                self.metrics.candidates.labels(id_type.name).inc(tried)
                self.heartbeat.beat()  # a long range is progress, not a stall
                if progress is not None:
                    progress(len(keys))
                accepted += len(keys)
                candidates += tried
        finally:
            pending.cancel()
        range_log.info(
            "range_filled",
            extra={
                "id_type": id_type.name,
                "range_start": leased.start,
                "range_end": leased.stop,
                "candidates": candidates,
                "accepted": accepted,
            },
        )
        return accepted


async def listen_for_wakes(settings: Settings, keygen: Keygen, stop: asyncio.Event) -> None:
    """LISTEN for keysync's wake-ups on a dedicated connection, re-established after
    PostgreSQL restarts (until then keygen still polls)."""
    outage = Outage("postgres-listen")
    while not stop.is_set():
        try:
            conn = await connect_each_host(
                settings.postgres_dsn,
                host_timeout_s=settings.postgres_connect_timeout_s,
                **driver_options(settings.postgres_pooler),
            )
        except DRIVER_ERRORS as exc:
            await sleep_or_stop(stop, outage.failed(StoreUnavailable("postgres", str(exc))))
            continue
        try:
            await _listen_until_closed(conn, keygen, stop, outage)
        except DRIVER_ERRORS:
            continue
        finally:
            if not conn.is_closed():
                conn.terminate()


async def _listen_until_closed(
    conn: asyncpg.Connection, keygen: Keygen, stop: asyncio.Event, outage: Outage
) -> None:
    closed = asyncio.Event()
    conn.add_termination_listener(lambda _: closed.set())
    await conn.add_listener(KEYGEN_CHANNEL, keygen.wake)
    outage.succeeded()
    keygen.wake()  # wake-ups may have been missed while not listening
    waits = {asyncio.ensure_future(closed.wait()), asyncio.ensure_future(stop.wait())}
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


async def serve(settings: Settings) -> None:
    metrics = KeygenMetrics(CollectorRegistry())
    heartbeat = Heartbeat(metrics.registry)
    start = ProcessStart(
        "keygen",
        settings.keygen,
        log,
        metrics.registry,
        heartbeat,
        build_id_types(settings),
        keyspace=True,
        groups=Groups(settings),
        # The fence's record lives in Redis: a server that may evict it may lose it.
        check_redis=lambda: refuse_evicting_redis(settings),
    )
    await serve_process(settings, start, lambda up: _fill(settings, up, metrics, heartbeat))


async def _fill(
    settings: Settings, up: Started, metrics: KeygenMetrics, heartbeat: Heartbeat
) -> None:
    """keygen's loop, and its LISTEN for keysync's wake-ups beside it."""
    generator = Generator(settings.keygen.threads)
    try:
        faults = fault_points_from_environ()
        keygen = Keygen.on_postgres(
            settings, up.cold, up.sync, up.stop, generator, metrics, heartbeat, faults
        )
        listening = _listening(settings, keygen, up.stop)
        try:
            await keygen.run()
        finally:
            if listening is not None:
                listening.cancel()
    finally:
        generator.close()


def _listening(
    settings: Settings, keygen: Keygen, stop: asyncio.Event
) -> asyncio.Future[None] | None:
    """keysync's wake-ups LISTENed for, beside the loop; none behind a pooler in
    transaction mode, where a LISTEN ends with its transaction (its server goes back to
    the pool, and the NOTIFY reaches no one): keygen then polls, and says so once."""
    if settings.postgres_pooler == "transaction":
        log.info(
            "keygen_wakes_polled",
            extra={
                "reason": "postgres_pooler: transaction (LISTEN needs a session)",
                "poll_interval_s": settings.keygen.poll_interval_s,
            },
        )
        return None
    return asyncio.ensure_future(listen_for_wakes(settings, keygen, stop))


def main(settings: Settings) -> None:
    asyncio.run(serve(settings))
