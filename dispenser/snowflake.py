"""Snowflake types in a dispenser process: one machine-ID lease per type, held for the
life of the process (re-acquired after a loss), and a minter that mints from it.

Minting is in-process: no Redis round trip per request. While a type holds no live
lease (starting, lost, being re-acquired) its requests are refused with 503 IDG-016.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from dispenser.metrics import DispenserMetrics
from shared.domain.errors import ConfigError, NoMachineIdFree
from shared.domain.leases import NO_WAIT, LeaseWait
from shared.domain.snowflake import Clock, Lease, Minter, SnowflakeType, wall_clock_ms
from shared.leases.holder import LeaseMetrics, lease_machine_id
from shared.stores.redis.endpoint import RedisEndpoint

log = logging.getLogger(__name__)
# A lease for one type: entered to acquire, exited to release (with the last time issued).
LeaseSource = Callable[[SnowflakeType], AbstractAsyncContextManager[Lease]]
# Pause between failed acquisitions (no machine ID free, Redis unreachable).
RETRY_S = 0.5


class Holder:
    """Holds a machine-ID lease for one snowflake type and feeds it to the type's minter."""

    def __init__(
        self, id_type: SnowflakeType, source: LeaseSource, metrics: DispenserMetrics, clock: Clock
    ) -> None:
        self.id_type = id_type
        self.minter = Minter(id_type, clock)
        self._source = source
        self._metrics = metrics
        self.leased = asyncio.Event()  # set while a lease is attached
        self._said_settling = False  # the current wait for grants to resume was logged

    async def run(self, closing: asyncio.Event) -> None:
        """Acquire, hold until lost or closing, release; again until closing."""
        name = self.id_type.name
        self._metrics.machine_id.labels(name).set(-1)
        while not closing.is_set():
            try:
                await self._hold_once(closing)
            except Exception as exc:  # any failure: log it, wait, re-acquire
                self._log_failure(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closing.wait(), RETRY_S)

    def _log_failure(self, exc: Exception) -> None:
        """A failed acquire: a warning, but for the expected wait after the fence took
        over (a failover, a restart, a server's first use): one line of info per wait."""
        name = self.id_type.name
        if isinstance(exc, NoMachineIdFree) and exc.settling_s is not None:
            if not self._said_settling:
                self._said_settling = True
                resume = round(exc.settling_s, 1)
                log.info(
                    "machine_id_settling", extra={"id_type": name, "grants_resume_in_s": resume}
                )
            return
        error = f"{type(exc).__name__}: {exc}"
        log.warning("machine_id_lease_failed", extra={"id_type": name, "error": error})

    async def _hold_once(self, closing: asyncio.Event) -> None:
        name = self.id_type.name
        async with self._source(self.id_type) as lease:
            self._said_settling = False
            self.minter.attach(lease)
            self.leased.set()
            self._metrics.machine_id.labels(name).set(lease.machine_id)
            log.info(
                "machine_id_leased",
                extra={"id_type": name, "pool": lease.pool, "machine_id": lease.machine_id},
            )
            try:
                await _first(lease.lost.wait(), closing.wait())
                lost = lease.lost.is_set()  # read before the release (which sets it)
                # Released with the last time issued; the floor when nothing was minted,
                # so the next holder need not wait out the ceiling this one recorded.
                lease.note_issued(lease.floor_ms)
            finally:
                self.minter.detach()
                self.leased.clear()
                self._metrics.machine_id.labels(name).set(-1)
            if lost:
                self._metrics.leases_lost.labels(name).inc()
                log.warning(
                    "machine_id_lost", extra={"id_type": name, "machine_id": lease.machine_id}
                )


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``waits`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Snowflakes:
    """Every snowflake type of a dispenser process: holders started and stopped together."""

    def __init__(
        self,
        types: dict[str, SnowflakeType],
        source: LeaseSource,
        metrics: DispenserMetrics,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.types = types
        self.holders = {name: Holder(t, source, metrics, clock) for name, t in types.items()}
        self.minters = {name: holder.minter for name, holder in self.holders.items()}
        self._closing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, wait_s: float) -> None:
        """Start holding leases; wait up to ``wait_s`` for the first of each type."""
        self._tasks = [
            asyncio.get_running_loop().create_task(h.run(self._closing))
            for h in self.holders.values()
        ]
        waits = [h.leased.wait() for h in self.holders.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), wait_s)

    def states(self) -> dict[str, dict[str, int | str]]:
        """Each type's state for readiness: its machine ID, or that it holds none."""
        states: dict[str, dict[str, int | str]] = {}
        for name, minter in self.minters.items():
            lease = minter.lease
            if lease is not None and lease.valid():
                states[name] = {"state": "serving", "machine_id": lease.machine_id}
            else:
                states[name] = {"state": "no_machine_id"}
        return states

    async def close(self, deadline_s: float = 5.0) -> None:
        """Stop minting and release every lease (each with the last time it issued)."""
        self._closing.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=deadline_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


def no_leases(id_type: SnowflakeType) -> AbstractAsyncContextManager[Lease]:
    raise ConfigError(f"id_types.{id_type.name}: snowflake types need a machine-ID lease source")


def redis_leases(
    place: Callable[[str], tuple[RedisEndpoint, str]],
    metrics: LeaseMetrics | None = None,
    wait: LeaseWait = NO_WAIT,
) -> LeaseSource:
    """Machine-ID leases kept in the hot tier's Redis (``shared.leases.holder``), one pool per
    type, each where ``place`` says its pool's keys live (``Groups.place``); an acquire
    waits up to one lease TTL (a new Redis server grants none for that long) before it
    is logged and tried again."""

    def source(id_type: SnowflakeType) -> AbstractAsyncContextManager[Lease]:
        config = id_type.config
        lo, hi = id_type.machine_range
        endpoint, namespace = place(id_type.pool)
        return lease_machine_id(
            endpoint,
            id_type.pool,
            lo,
            hi,
            ttl_s=config.lease_ttl_s,
            renew_every_s=config.lease_renew_s,
            wait_s=config.lease_ttl_s,
            metrics=metrics,
            namespace=namespace,
            wait=wait,
        )

    return source
