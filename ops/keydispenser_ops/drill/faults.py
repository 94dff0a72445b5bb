"""The drill's faults (Jepsen's nemeses, on loopback): kills, failovers, partitions,
pauses, restarts without persistence, two PostgreSQL primaries at once.

Each fault is an async method returning an ``Outcome``: its own figures (merged into
its round's row) and, where the fault needs it, where its round's discard counts start.
A fault that cannot be injected raises RuntimeError, redis.RedisError or OSError, and
the round says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import redis

from keydispenser_ops.drill.fleet import Fleet
from keydispenser_ops.drill.leases import LeaseFaults, worker_pids
from keydispenser_ops.drill.links import Links
from keydispenser_ops.drill.load import RecordingLoad
from keydispenser_ops.drill.postgres import PostgresStack
from keydispenser_ops.drill.topology import Topology
from shared.domain import redis_keys
from shared.stores.fence import sql as fence_sql

DRILL_NAMESPACE = "kd"  # the Redis namespace of the drill's own servers
LAG_WINDOW_S = 2.0  # postgres faults: how long the replicas miss commits first
PAUSE_S = 6.0  # pause: longer than every TTL and deadline the drill configures
PARTITION_S = 6.0  # partition: how long the two sides stay apart (> a lease TTL)
PAUSE_TARGETS = ("keysync", "keygen", "dispenser", "redis_primary", "postgres_primary")
# partition: the processes that stay with the old primary, in turn; the others (and
# the Sentinels and replicas) lose it.
PARTITION_SIDES = (
    ("dispenser-0", "keysync", "lease-0"),
    ("dispenser-1", "keygen", "keysync-2", "lease-1"),
)
# After each PostgreSQL promotion, no ledger entry at all (the loads of ledger types
# wait) for longer than the keysyncs keep the ledger log with the pair
# (PostgresPair.ledger_retain_s): what the promotion lost is restored at once, not when
# the next entry arrives. (Under Patroni the log must outlive a whole leader key's life,
# longer than this spell.)
QUIET_AFTER_PROMOTION_S = 12.0


@dataclass(frozen=True)
class Outcome:
    """What a fault hands its round: figures for the round's row, and the discard
    counters as they stood when the fault began, for a fault that does something first
    (a snapshot) or whose fence is PostgreSQL's (counted apart from Redis's)."""

    figures: dict[str, Any] = field(default_factory=dict)
    redis_discarded_before: int | None = None  # None: counted from the round's start
    # When the Redis data the fault destroys starts (monotonic; a snapshot restarted
    # from): None, from the oldest ledger entry not applied when the fault began.
    destroys_from: float | None = None
    postgres_discarded_before: int | None = None  # None: the PostgreSQL fence is not counted


Fault = Callable[[], Awaitable[Outcome]]


class Pausable(Protocol):
    """A load that can hold its requests for a while (and go on afterwards)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


@dataclass
class Drill:
    topology: Topology
    fleet: Fleet
    load: RecordingLoad
    postgres: PostgresStack
    links: Links
    database: str
    snapshot: Path
    lease_faults: LeaseFaults
    turns: dict[str, int] = field(default_factory=dict)  # faults that rotate their target
    # The loads of ledger types (paused for the quiet spells after PostgreSQL promotions).
    ledger_loads: list[Pausable] = field(default_factory=list)
    quiet_after_promotion: bool = True
    # The PostgreSQL stack's own faults (pair_faults.py, patroni_faults.py), set once the
    # drill is built: they use its load, links and checks.
    postgres_faults: Callable[[], dict[str, Fault]] = dict

    def turn(self, fault: str) -> int:
        self.turns[fault] = self.turns.get(fault, 0) + 1
        return self.turns[fault] - 1

    def discarded(self) -> int:
        try:
            counts = (
                self.topology.primary().client().hgetall(redis_keys.discarded_key(DRILL_NAMESPACE))
            )
        except (redis.RedisError, RuntimeError):
            return 0
        return sum(int(v) for v in counts.values())

    async def settle_redis(self) -> None:
        await asyncio.to_thread(self.topology.wait_for_primary, 60)
        await asyncio.to_thread(self.topology.wait_for_replicas, 2, 60)

    def faults(self) -> dict[str, Fault]:
        return {
            "primary_sigkill": self.primary_sigkill,
            "sentinel_failover": self.sentinel_failover,
            "kill_keysync": self._kill_and_restart("keysync"),
            "failback": self.failback,
            "cut_links_then_sigkill": self.cut_links_then_sigkill,
            "kill_keygen": self._kill_and_restart("keygen"),
            "redis_restart_old_snapshot": self.redis_restart_old_snapshot,
            "kill_dispenser": self._kill_and_restart("dispenser-0"),
            "kill_lease_holder": _figures_only(self.lease_faults.kill_lease_holder),
            "clock_back": _figures_only(self.lease_faults.clock_back),
            "partition": self.partition,
            "pause": self.pause,
            "redis_restart_empty": self.redis_restart_empty,
            **self.postgres_faults(),
        }

    # --- Redis --------------------------------------------------------------------

    async def primary_sigkill(self) -> Outcome:
        old = self.topology.primary()
        self.topology.kill(old)
        await asyncio.to_thread(self.topology.wait_for_primary, 30, old.port)
        self.topology.restart(old)  # comes back empty; Sentinel makes it a replica
        await self.settle_redis()
        return Outcome()

    async def sentinel_failover(self) -> Outcome:
        old = self.topology.primary()
        await self._forced_failover(old.port)  # the old primary stays up: split brain
        await self.settle_redis()
        return Outcome()

    async def _forced_failover(self, away_from: int) -> None:
        """SENTINEL FAILOVER until a new primary is up; Sentinel sometimes aborts one."""
        for _ in range(3):
            with contextlib.suppress(redis.RedisError):
                self.topology.sentinel_failover()
            try:
                await asyncio.to_thread(self.topology.wait_for_primary, 12, away_from)
                return
            except RuntimeError:
                continue
        raise RuntimeError(f"Sentinel would not fail over from port {away_from}")

    async def failback(self) -> Outcome:
        first = self.topology.primary()
        await self.sentinel_failover()
        others = [s for s in self.topology.servers if s.port != first.port]
        second = self.topology.primary()
        for server in others:
            if server.port != second.port:
                server.client().config_set("replica-priority", 0)
        try:
            await self._forced_failover(second.port)
        finally:
            for server in others:
                if server.alive():
                    server.client().config_set("replica-priority", 100)
        await self.settle_redis()
        return Outcome({"returned_to_first_primary": self.topology.primary().port == first.port})

    async def cut_links_then_sigkill(self) -> Outcome:
        old = self.topology.primary()
        old.command("CLIENT", "KILL", "TYPE", "replica")
        await asyncio.sleep(0.3)  # pops now happen that no replica has seen
        self.topology.kill(old)
        await asyncio.to_thread(self.topology.wait_for_primary, 30, old.port)
        self.topology.restart(old)
        await self.settle_redis()
        return Outcome()

    async def redis_restart_old_snapshot(self) -> Outcome:
        """The primary restarted in place from an RDB taken 1.5 s earlier: what was
        dispensed, applied and deleted since comes back (hot lists, ledger entries)."""
        primary = self.topology.primary()
        baseline = self.discarded()
        snapshot_at = time.monotonic()
        self.topology.snapshot(primary, self.snapshot)
        dispensed = self.load.dispensed
        await asyncio.sleep(1.5)  # keys dispensed after the snapshot: it is stale
        after = self.load.dispensed - dispensed
        self.topology.restart(primary, snapshot=self.snapshot)
        await self.settle_redis()
        return Outcome(
            {"keys_dispensed_after_snapshot": after},
            redis_discarded_before=baseline,
            destroys_from=snapshot_at,
        )

    async def redis_restart_empty(self) -> Outcome:
        """The primary restarts at once without persistence, before Sentinel notices:
        an empty primary with a new identity, whose replicas then empty themselves."""
        primary = self.topology.primary()
        self.topology.kill(primary)
        self.topology.restart(primary)
        await self.settle_redis()
        return Outcome({"restarted_port": primary.port})

    async def partition(self) -> Outcome:
        """The primary is cut off from the Sentinels, its replicas and half the
        processes; the other half stays with it, cut off from everything else. The
        Sentinels promote a replica; both primaries answer for PARTITION_S; then the
        links heal and the old primary is demoted."""
        old = self.topology.primary()
        near = PARTITION_SIDES[self.turn("partition") % len(PARTITION_SIDES)]
        far = [name for side in PARTITION_SIDES for name in side if name not in near]
        self.links.cut_infra(old.port)
        for name in near:
            self.links.cut_sentinels(name)
            for server in self.topology.servers:
                if server.port != old.port:
                    self.links.cut_redis(name, server.port)
        for name in far:
            self.links.cut_redis(name, old.port)
        try:
            new = await asyncio.to_thread(self.topology.wait_for_primary, 30, old.port)
            await asyncio.sleep(PARTITION_S)
        finally:
            self.links.heal()
        await self.settle_redis()
        return Outcome({"partition_near": list(near), "old_primary": old.port, "new_primary": new})

    # --- pauses -------------------------------------------------------------------

    async def pause(self) -> Outcome:
        """SIGSTOP a process or a server for PAUSE_S (longer than every TTL and deadline
        the drill configures), then SIGCONT, in turn over PAUSE_TARGETS."""
        target = PAUSE_TARGETS[self.turn("pause") % len(PAUSE_TARGETS)]
        pids = self._pause_pids(target)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        if target == "redis_primary":
            await self.settle_redis()  # Sentinel failed over meanwhile; the old one rejoins
        return Outcome({"paused": target, "paused_pids": len(pids), "paused_s": PAUSE_S})

    def _pause_pids(self, target: str) -> list[int]:
        if target in ("keysync", "keygen"):
            return [self.fleet.processes[target].pid]
        if target == "dispenser":
            return worker_pids(self.fleet.processes["dispenser-0"].pid)[:1]
        if target == "redis_primary":
            process = self.topology.primary().process
            assert process is not None
            return [process.pid]
        return self.postgres.primary_pids()

    # --- processes ----------------------------------------------------------------

    def _kill_and_restart(self, name: str) -> Fault:
        async def kill_and_restart() -> Outcome:
            self.fleet.kill(name)
            await asyncio.sleep(0.5)
            self.fleet.restart(name)
            return Outcome()

        return kill_and_restart

    # --- PostgreSQL ---------------------------------------------------------------

    async def quiet_ledger(self) -> float:
        """No ledger traffic for QUIET_AFTER_PROMOTION_S (the loads of ledger types
        wait); how long it was (0: the drill runs without quiet spells)."""
        if not self.quiet_after_promotion:
            return 0.0
        for load in self.ledger_loads:
            load.pause()
        try:
            await asyncio.sleep(QUIET_AFTER_PROMOTION_S)
        finally:
            for load in self.ledger_loads:
                load.resume()
        return QUIET_AFTER_PROMOTION_S

    async def postgres_discarded(self) -> int:
        """Cold keys PostgreSQL fences discarded so far (0 while unreachable)."""
        dsn = self.postgres.dsn(self.database)
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                return int(await conn.fetchval(fence_sql.SUM_FENCE_DISCARDED))
            finally:
                await conn.close()
        return 0

    async def postgres_fenced_since(self, before: int, deadline_s: float) -> int:
        """Cold keys a PostgreSQL fence discarded since ``before``. The process that
        fences is the first to write on the promoted server, which may be one that
        reconnects only once the fault is over (after its backoff): wait for it, up to
        ``deadline_s``."""
        deadline = time.monotonic() + deadline_s
        while True:
            fenced = await self.postgres_discarded() - before
            if fenced > 0 or time.monotonic() >= deadline:
                return max(fenced, 0)
            await asyncio.sleep(0.2)

    async def ledger_drained(self, deadline_s: float) -> int:
        """Wait until keysync has applied every ledger entry (up to ``deadline_s``);
        the entries left (-1: the stream could not be read)."""
        stream = redis_keys.ledger_stream_key(DRILL_NAMESPACE)
        deadline = time.monotonic() + deadline_s
        left = -1
        while time.monotonic() < deadline:
            left = -1
            with contextlib.suppress(redis.RedisError, RuntimeError):
                left = int(self.topology.primary().client().xlen(stream))
            if left == 0:
                break
            await asyncio.sleep(0.2)
        return left

    def oldest_undrained(self) -> float | None:
        """When the oldest entry the ledger stream still holds was written (monotonic
        time; None for none): keysync has applied everything before it."""
        stream = redis_keys.ledger_stream_key(DRILL_NAMESPACE)
        try:
            first = self.topology.primary().client().xrange(stream, count=1)
        except (redis.RedisError, RuntimeError):
            return None
        if not first:
            return None
        written_s = int(str(first[0][0]).split("-")[0]) / 1000
        return time.monotonic() - (time.time() - written_s)

    # --- checks after a Redis fault -----------------------------------------------

    async def fence_engaged(self, identity: str, deadline_s: float) -> bool:
        """Whether the fence records the primary ``identity`` as its owner (the first
        fenced script on a new primary takes ownership), within ``deadline_s``."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, RuntimeError):
                owner = self.topology.primary().client().get(redis_keys.fence_key(DRILL_NAMESPACE))
                if owner == identity:
                    return True
            await asyncio.sleep(0.1)
        return False


def _figures_only(fault: Callable[[], Awaitable[dict[str, Any]]]) -> Fault:
    """A fault with figures only (the lease faults count no discards)."""

    async def figures_only() -> Outcome:
        return Outcome(await fault())

    return figures_only
