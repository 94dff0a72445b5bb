"""keysync: moves keys cold -> hot when a hot list falls below its low watermark.

Order matters: the DELETE ... RETURNING commits first, then the keys are pushed.
A crash in between loses at most that batch; pushing first could duplicate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from keysync.ledger import LedgerDrain
from keysync.metrics import KeysyncMetrics
from shared.domain.config import IdTypeConfig, Settings
from shared.domain.config.pipeline import LEDGER_READ_BLOCK_S
from shared.domain.errors import LedgerHalted, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.ports import ColdInventory, HotLists, OpenBatch
from shared.domain.tiers import NO_STAMP, Stamp
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
from shared.stores.groups import Groups, LedgerRouter
from shared.stores.hot.hot_store import HotStore
from shared.stores.hot.wake import WakeChannel
from shared.stores.ledger.stream import LedgerStream

log = logging.getLogger(__name__)
REFILL_WINDOW_S = 10.0  # the refill rate dispensers see is the average over this window
LEDGER_FAILURE_DELAY_S = 5.0  # after an unexpected ledger error, before trying again
# How long the next batch's open transaction waits for the push before it is rolled back.
# A push takes milliseconds; while the transaction is open, every guarded statement of
# every type waits on the sync clock's row: a push that is retried (its shard failing
# over) must not hold the other types' refills and leases for long.
NEXT_BATCH_HOLD_S = 0.25


# Why a batch refused by push.lua is lost (the ``batch_lost`` log line's reason).
LOST_BECAUSE = {
    "refused": "primary_changed",  # after an attempt that may have landed elsewhere
    "expired": "push_deadline_passed",
    "stale": "postgres_lost_commits",
    "foreign": "namespace_bound_to_another_database",
    "halted": "postgres_fence_halted",
    "superseded": "taken_before_an_import",
}


class Backoff:
    """Sleeps between push attempts: 50 ms, doubling up to 1 s."""

    def __init__(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._sleep = sleep
        self._delay = 0.05

    async def sleep(self) -> None:
        await self._sleep(self._delay)
        self._delay = min(self._delay * 2, 1.0)


def _want(config: IdTypeConfig, depth: int) -> int:
    """Keys to take next for a hot list of ``depth`` keys (0 or less: none)."""
    return min(config.sync_batch, config.hot.high - depth)


class RefillMeter:
    """Keys pushed per second to one hot list over the last ``REFILL_WINDOW_S``."""

    def __init__(self) -> None:
        self._pushes: collections.deque[tuple[float, int]] = collections.deque()

    def pushed(self, keys: int, now: float) -> float:
        self._pushes.append((now, keys))
        while self._pushes[0][0] < now - REFILL_WINDOW_S:
            self._pushes.popleft()
        span = max(now - self._pushes[0][0], 1.0)
        return sum(n for _, n in self._pushes) / span


class Keysync:
    def __init__(
        self,
        settings: Settings,
        cold: ColdInventory,
        hot: HotLists,
        metrics: KeysyncMetrics | None = None,
        fault: FaultPoint = no_fault,
    ) -> None:
        self._settings = settings
        self._types = build_id_types(settings, generating=False)
        self._cold = cold
        self._hot = hot
        self._metrics = metrics or KeysyncMetrics(CollectorRegistry())
        self._meters = {name: RefillMeter() for name in self._types}
        self._token = ""  # identity of the Redis primary last seen (run_id:master_replid)
        self._empty: set[str] = set()  # types whose cold tier was found empty, until refilled
        self._fault = fault  # test-only fault points (KD_FAULT_POINT)
        # How a push retry tells time and waits (a unit test freezes the process here).
        self.clock: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def fence_refusing(self, exc: BaseException | None) -> None:
        self._metrics.fence.refusing(exc)

    async def refill_all(self) -> None:
        for id_type in self._types.values():
            await self.refill(id_type)

    async def refill(self, id_type: IdType) -> int:
        """Top a hot list up to its high watermark when below its low one; returns moved.

        Pipelined: while a committed batch is pushed, the next one is deleted in a
        transaction left open, committed only once that push succeeded
        (``_push_taking_next``).
        So at any instant at most one batch is committed and not yet pushed.
        """
        name, config = id_type.name, id_type.config
        seen = await self._hot.observe(name)
        self._token, depth = seen.token, seen.length
        if depth >= config.hot.low:
            return 0
        moved, following = 0, None
        try:
            while depth < config.hot.high:
                taken = following or await self._cold.begin_take(name, _want(config, depth))
                if not taken.keys:
                    # A take of nothing changes nothing: rolled back, its step of the
                    # sync clock goes with it. Committed, that step would never be
                    # recorded, and every ledger read would wait for a record that
                    # covers it until the next recorded write.
                    await taken.rollback()
                    await self._cold_empty(name)
                    break
                await taken.commit()
                self._empty.discard(name)
                self._fault("keysync.committed")  # the DELETE committed, nothing pushed yet
                size = _want(config, depth + len(taken.keys))
                depth, following = await self._push_taking_next(name, taken, size)
                moved += len(taken.keys)
        finally:
            if following is not None:  # still open: another keysync filled the list, or
                await following.rollback()  # this one failed (no-op once committed)
        if moved:
            log.info("refilled", extra={"id_type": name, "moved": moved, "hot_depth": depth})
        return moved

    async def _push_taking_next(
        self, name: str, taken: OpenBatch, size: int
    ) -> tuple[int, OpenBatch | None]:
        """Push a committed batch while the next ``size`` keys are taken (none when 0).

        The next batch's transaction stays open until this push succeeded, and is rolled
        back if it failed or has not succeeded within ``NEXT_BATCH_HOLD_S`` (the open
        transaction holds the sync clock's row lock). Returns the hot list's length and
        the next batch, still to be committed.
        """
        pushing = asyncio.ensure_future(self._push_recorded(name, taken))
        if size <= 0:
            return await pushing, None
        try:
            following = await self._cold.begin_take(name, size)
        except BaseException:
            await asyncio.wait([pushing])
            pushing.result()  # the committed batch's own failure comes first
            raise
        done, _ = await asyncio.wait([pushing], timeout=NEXT_BATCH_HOLD_S)
        if not done or pushing.cancelled() or pushing.exception() is not None:
            await following.rollback()
            return await pushing, None
        return pushing.result(), following

    async def _push_recorded(self, name: str, taken: OpenBatch) -> int:
        depth = await self.push(name, taken.keys, taken.stamp, taken.epoch)
        await self._record_refill(name, len(taken.keys))
        return depth

    async def _record_refill(self, name: str, keys: int) -> None:
        """Publish the refill rate, from which dispensers derive IDG-001's Retry-After."""
        rate = self._meters[name].pushed(keys, time.monotonic())
        self._metrics.moved.labels(name).inc(keys)
        self._metrics.refill_rate.labels(name).set(rate)
        await self._hot.record_refill(name, rate, time.time())

    async def _cold_empty(self, name: str) -> None:
        """Wake keygen; when the keyspace is used up, tell dispensers (IDG-002)."""
        state = await self._cold.sequence_state(self._types[name])
        if state.headroom == 0:
            await self._hot.mark_exhausted(name)
            log.error("keyspace_exhausted", extra={"id_type": name})
            return
        await self._cold.wake_keygen(name)
        if name not in self._empty:  # once per spell, not at every poll while it lasts
            self._empty.add(name)
            log.warning("cold_empty", extra={"id_type": name})

    async def push(
        self, name: str, keys: list[str], stamp: Stamp = NO_STAMP, epoch: int = 0
    ) -> int:
        """Push a committed batch exactly once, or lose it (counted); never on two servers.

        Each attempt is pinned to the server identity the batch is meant for. A
        refusal is definitive (nothing was pushed), so it may re-pin; after an
        ambiguous failure the batch may already sit on the pinned server, so
        retries stay pinned there and the batch marker makes them idempotent.
        Attempts end at a deadline on the Redis server's own clock (``push_retry_s``
        after the first), which the marker outlives: a keysync paused past it (SIGSTOP,
        a VM pause) gets 'expired', never a second copy. The push records ``stamp``
        (the PostgreSQL fence): a batch from a PostgreSQL that lost commits, from
        another history or another database is lost, never pushed; a record Redis lost
        is rebuilt first (vouch), then the push is tried again. A batch taken under an
        import ``epoch`` older than one an import set since is lost ('superseded': it may
        hold IDs the import excluded).
        """
        config = self._settings.keysync
        batch, pin, ambiguous = uuid.uuid4().hex, self._token, False
        deadline = self.clock() + config.push_retry_s
        not_after: int | None = None  # the deadline on the server's clock (ms)
        backoff = Backoff(self.sleep)
        while True:
            if self.clock() > deadline:  # checked again after every sleep
                return self._lost(name, keys, "unreachable")
            try:
                if not_after is None:
                    not_after = await self._hot.server_time_ms() + round(config.push_retry_s * 1000)
            except StoreUnavailable:
                await backoff.sleep()  # nothing was sent: not ambiguous
                continue
            try:
                pushed = await self._hot.push(
                    name, keys, batch, pin, stamp, not_after, config.batch_marker_ttl_s, epoch
                )
            except StoreUnavailable:
                ambiguous = True  # it may have landed on the pinned server
                self._fault("keysync.push_retry")  # an ambiguous attempt, before the next
                await backoff.sleep()
                continue
            if pushed.status in ("pushed", "duplicate"):
                self._token = pushed.token
                return pushed.length
            if pushed.status == "refused" and not ambiguous:
                pin, not_after = pushed.token, None  # the primary changed; nothing pushed
                if await self._superseded(name, epoch):
                    return self._lost(name, keys, LOST_BECAUSE["superseded"])
                continue
            if pushed.status == "untrusted":
                await self._cold.vouch()  # Redis lost the record: rebuild it, try again
                continue
            return self._lost(name, keys, LOST_BECAUSE.get(pushed.status, pushed.status))

    async def _superseded(self, name: str, epoch: int) -> bool:
        """Whether an import ran since the batch was taken: a new Redis primary may not
        hold the epoch the import set on the old one (restarted empty, or promoted
        before it replicated), so the push could not refuse the batch."""
        try:
            return await self._cold.import_epoch(name) > epoch
        except StoreUnavailable:
            return True  # unknown: lost (counted), never pushed

    def _lost(self, name: str, keys: list[str], reason: str) -> int:
        # Already deleted from the cold table and committed: wasted, never reissued.
        log.error("batch_lost", extra={"id_type": name, "keys": len(keys), "reason": reason})
        raise StoreUnavailable("redis", f"batch of {len(keys)} {name} keys lost: {reason}")


async def run(
    keysync: Keysync,
    wake: WakeChannel,
    settings: Settings,
    stop: asyncio.Event,
    beat: Callable[[bool], None] | None = None,
) -> None:
    """Refill until stopped; every iteration calls ``beat`` (a ``Heartbeat``'s, the
    liveness probe; or a key group's lane of it, ``GroupBeats``)."""
    beat = beat or Heartbeat(CollectorRegistry()).beat
    # A Redis failover takes seconds: retry quickly so the new primary is refilled at once.
    pg_outage, redis_outage = (
        Outage("postgres", first_delay_s=0.1, max_delay_s=1.0),
        Outage("redis", first_delay_s=0.02, max_delay_s=0.05),
    )
    fence_outage = Outage("postgres_fence", first_delay_s=0.5, max_delay_s=10.0)
    while not stop.is_set():
        try:
            await keysync.refill_all()
            pg_outage.succeeded()
            redis_outage.succeeded()
            fence_outage.succeeded()
            keysync.fence_refusing(None)
            beat(True)
            await wake.wait(settings.keysync.poll_interval_s)
        except StoreUnavailable as exc:
            beat(False)
            outage = redis_outage if exc.store == "redis" else pg_outage
            await sleep_or_stop(stop, outage.failed(exc))
        except FENCE_REFUSALS as exc:
            # Behind: the fence runs before the next batch. Superseded: this server is
            # an old primary. Halted: an operator must act. Keep trying (and saying so)
            # rather than exit.
            keysync.fence_refusing(exc)
            beat(False)
            await sleep_or_stop(stop, fence_outage.failed(StoreUnavailable("postgres", str(exc))))


async def drain_ledger(
    drain: LedgerDrain,
    metrics: KeysyncMetrics,
    backlog: Callable[[], Awaitable[int]],
    stop: asyncio.Event,
    early_mark_ttl_s: float = 7 * 86_400,
    prune_every_s: float = 60.0,
) -> None:
    """Move ledger entries from the Redis stream into PostgreSQL until stopped;
    ``backlog`` reads the length of every stream (the ``kd_ledger_backlog`` gauge)."""
    outage = Outage("ledger", first_delay_s=0.1, max_delay_s=2.0)
    next_prune = time.monotonic()
    while not stop.is_set():
        restored = drain.restored
        try:
            applied = await drain.drain_once(block_ms=int(LEDGER_READ_BLOCK_S * 1000))
            if time.monotonic() >= next_prune:
                metrics.ledger_marks_expired.inc(await drain.prune(early_mark_ttl_s))
                await drain.requeue_released()
                next_prune = time.monotonic() + prune_every_s
            outage.succeeded()
        except StoreUnavailable as exc:
            await sleep_or_stop(stop, outage.failed(exc))
            continue
        except LedgerHalted as exc:
            # Failed closed: nothing is applied until an operator accepts the loss
            # (`keydispenser ledger-resume --accept-loss`); refills go on.
            metrics.ledger_halted.set(1)
            await sleep_or_stop(stop, outage.failed(StoreUnavailable("postgres", str(exc))))
            continue
        except FENCE_REFUSALS as exc:
            # The batch stays pending (applied again, harmlessly) until the fence has
            # settled this server: behind, superseded or halted, said as for refills.
            await sleep_or_stop(stop, outage.failed(StoreUnavailable("postgres", str(exc))))
            continue
        except Exception:
            # Never let the ledger take refills down with it: log, back off, retry.
            # The entries stay in the stream (kd_ledger_backlog grows) until applied.
            log.exception("ledger_drain_failed")
            await sleep_or_stop(stop, LEDGER_FAILURE_DELAY_S)
            continue
        metrics.ledger_halted.set(1 if drain.halted else 0)
        metrics.ledger_restored.inc(drain.restored - restored)
        if applied is not None:
            metrics.ledger_issued.inc(applied.issued)
            metrics.ledger_used.inc(applied.used)
            metrics.ledger_used_unknown.inc(applied.used_unknown)
            metrics.ledger_used_refused.inc(applied.used_refused)
            for name, keys in applied.duplicates.items():
                metrics.ledger_duplicates.labels(name).inc(len(keys))
        with contextlib.suppress(StoreUnavailable):
            metrics.ledger_backlog.set(await backlog())


class GroupBeats:
    """The process's heartbeat, beaten by the refill loop of every key group: alive
    while any loop turns, ready only while every group's last turn succeeded (a shard
    that is down leaves keysync alive and says it is not ready)."""

    def __init__(self, heartbeat: Heartbeat, groups: int) -> None:
        self._heartbeat = heartbeat
        self._ok = [False] * groups

    def lane(self, index: int) -> Callable[[bool], None]:
        def beat(ok: bool = True) -> None:
            self._ok[index] = ok
            self._heartbeat.beat(all(self._ok))

        return beat


@dataclass(frozen=True)
class GroupPorts:
    """Per key group (one, unless a cluster holds each type in a slot of its own): its
    hot lists, and on separate connections its wake list and ledger stream (the wake
    wait and the stream read block)."""

    groups: Groups
    hot: dict[str, HotStore]
    wakes: dict[str, WakeChannel]
    streams: dict[str, LedgerStream]

    @classmethod
    def open(cls, settings: Settings) -> GroupPorts:
        groups = Groups(settings)
        return cls(
            groups,
            groups.each(HotStore),
            groups.each(lambda _, ns: WakeChannel(groups.fresh(ns), ns)),
            groups.each(lambda _, ns: LedgerStream(groups.fresh(ns), ns)),
        )

    async def refuse_eviction(self) -> None:
        for each in self.hot.values():
            with contextlib.suppress(StoreUnavailable):  # unreachable yet: the loop retries
                await each.refuse_eviction()
                await each.warn_if_reloadable()

    async def close(self) -> None:
        for port in [*self.hot.values(), *self.wakes.values(), *self.streams.values()]:
            await port.close()
        await self.groups.close()


async def serve(settings: Settings) -> None:
    metrics = KeysyncMetrics(CollectorRegistry())
    heartbeat = Heartbeat(metrics.registry)
    ports = GroupPorts.open(settings)
    start = ProcessStart(
        "keysync",
        settings.keysync,
        log,
        metrics.registry,
        heartbeat,
        build_id_types(settings, generating=False),
        keyspace=False,
        groups=ports.groups,
        check_redis=ports.refuse_eviction,
    )

    async def loops(up: Started) -> None:
        await _sync(settings, up, start.types, ports, metrics, heartbeat)

    try:
        await serve_process(settings, start, loops)
    finally:
        await ports.close()


async def _sync(
    settings: Settings,
    up: Started,
    types: dict[str, IdType],
    ports: GroupPorts,
    metrics: KeysyncMetrics,
    heartbeat: Heartbeat,
) -> None:
    """Every key group's refill loop, and its ledger drain where a type keeps a ledger."""
    cold, sync, stop = up.cold, up.sync, up.stop
    cold.open_take_idle_limit_s = settings.keysync.take_idle_limit_s
    ledger = LedgerRouter.over(ports.streams, ports.groups)
    beats = GroupBeats(heartbeat, len(ports.groups.types))
    faults = fault_points_from_environ()
    tasks = []
    for index, (namespace, names) in enumerate(ports.groups.types.items()):
        mine = {name: types[name] for name in names}
        guarded = GuardedCold(cold, sync, mine, metrics.fence.observe)
        keysync = Keysync(
            settings.with_types(names), guarded, ports.hot[namespace], metrics, faults
        )
        tasks.append(run(keysync, ports.wakes[namespace], settings, stop, beats.lane(index)))
        drain = LedgerDrain(
            ports.streams[namespace],
            cold,
            mine,
            instance_name(),
            settings.keysync.ledger_batch,
            settings.keysync.ledger_claim_idle_s,
            guard=guarded,
            retain_s=settings.keysync.ledger_retain_s,
            sync=sync.records.get(namespace) if sync is not None else None,
            fault=faults,
            watch_s=settings.keysync.ledger_watch_s,
        )
        if drain.enabled:
            with contextlib.suppress(StoreUnavailable):
                await ports.streams[namespace].forget_retired()
            ttl = settings.keysync.ledger_early_mark_ttl_s
            every = settings.keysync.ledger_requeue_every_s
            tasks.append(drain_ledger(drain, metrics, ledger.total_backlog, stop, ttl, every))
    await asyncio.gather(*tasks)


def main(settings: Settings) -> None:
    asyncio.run(serve(settings))
