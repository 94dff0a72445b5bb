"""``keydispenser drill``: Sentinel failovers, restarts and SIGKILLs under load.

Every key received is recorded; the drill passes when none was received twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis

from shared.domain.settings import Settings
from shared.ops.databases import scratch_database
from shared.ops.drill import leases
from shared.ops.drill.fleet import Fleet
from shared.ops.drill.leases import LeaseFaults
from shared.ops.drill.load import RecordingLoad, SnowflakeLoad
from shared.ops.drill.postgres import PostgresPair
from shared.ops.drill.topology import MASTER, Topology
from shared.ops.embedded import free_port
from shared.ops.processes import run_cli, scrubbed_env, serving
from shared.stores import redis_keys, sql

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # normal load between faults
# The one ID type the drill takes keys of; it keeps a ledger, checked after the drill.
DRILL_TYPE = "drill"
DRILL_NAMESPACE = "kd"  # the Redis namespace of the drill's own servers
DRILL_TYPE_CONFIG: dict[str, Any] = {
    "kind": "numeric",
    "length": 10,
    "range_size": 262_144,
    "hot": {"low": 3_000, "high": 8_000},
    "cold": {"low": 30_000, "high": 60_000},
    "sync_batch": 1_000,
    "ledger": True,
}
LEDGER_SETTLE_S = 30.0  # how long the drill waits for keysync to drain the ledger
LAG_WINDOW_S = 2.0  # postgres_failover: how long the replica misses commits before it
# Faults that give Redis a primary with a new identity: the fence must engage after each.
REDIS_FAULTS = frozenset(
    {
        "primary_sigkill",
        "sentinel_failover",
        "failback",
        "cut_links_then_sigkill",
        "restart_from_old_snapshot",
    }
)
FENCE_DEADLINE_S = 15.0  # how long after a Redis fault the fence may take to engage


@dataclass
class Drill:
    topology: Topology
    fleet: Fleet
    load: RecordingLoad
    postgres: PostgresPair
    database: str
    snapshot: Path
    lease_faults: LeaseFaults
    results: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)  # the current fault's own figures

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

    # --- faults: each returns a baseline of discarded keys when it changes it ------

    async def primary_sigkill(self) -> int | None:
        old = self.topology.primary()
        self.topology.kill(old)
        await asyncio.to_thread(self.topology.wait_for_primary, 30, old.port)
        self.topology.restart(old)  # comes back empty; Sentinel makes it a replica
        await self.settle_redis()
        return None

    async def sentinel_failover(self) -> int | None:
        old = self.topology.primary()
        await self._forced_failover(old.port)  # the old primary stays up: split brain
        await self.settle_redis()
        return None

    async def _forced_failover(self, away_from: int) -> None:
        """SENTINEL FAILOVER until a new primary is up; Sentinel sometimes aborts one."""
        for _ in range(3):
            with contextlib.suppress(redis.RedisError):
                self.topology.sentinel_failover()
            try:
                await asyncio.to_thread(self.topology.wait_for_primary, 12, away_from)
                return
            except RuntimeError:
                log.warning("drill_failover_retry", extra={"away_from": away_from})
        raise RuntimeError(f"Sentinel would not fail over from port {away_from}")

    async def failback(self) -> int | None:
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
        self.notes["returned_to_first_primary"] = self.topology.primary().port == first.port
        return None

    async def cut_links_then_sigkill(self) -> int | None:
        old = self.topology.primary()
        old.command("CLIENT", "KILL", "TYPE", "replica")
        await asyncio.sleep(0.3)  # pops now happen that no replica has seen
        self.topology.kill(old)
        await asyncio.to_thread(self.topology.wait_for_primary, 30, old.port)
        self.topology.restart(old)
        await self.settle_redis()
        return None

    async def restart_from_old_snapshot(self) -> int | None:
        primary = self.topology.primary()
        baseline = self.discarded()
        self.topology.snapshot(primary, self.snapshot)
        dispensed = self.load.dispensed
        await asyncio.sleep(1.5)  # keys dispensed after the snapshot: it is stale
        self.notes["keys_dispensed_after_snapshot"] = self.load.dispensed - dispensed
        self.topology.restart(primary, snapshot=self.snapshot)
        await self.settle_redis()
        return baseline

    def _process(self, name: str) -> Callable[[], Awaitable[int | None]]:
        async def kill_and_restart() -> int | None:
            self.fleet.kill(name)
            await asyncio.sleep(0.5)
            self.fleet.restart(name)
            return None

        return kill_and_restart

    async def restart_postgres(self) -> int | None:
        primary = self.postgres.pair()[0]
        await asyncio.to_thread(primary.stop, "immediate")
        await asyncio.sleep(1.0)
        await asyncio.to_thread(primary.start)
        return None

    async def postgres_failover(self) -> int | None:
        """The replica falls behind under load, the primary dies, the replica is promoted:
        the new primary lacks leases and batches whose keys were already dispensed."""
        fenced_before = await self.postgres_discarded()
        dispensed = self.load.dispensed
        await self.postgres.pause_replication()
        await asyncio.sleep(LAG_WINDOW_S)
        self.notes["keys_in_lag_window"] = self.load.dispensed - dispensed
        await self.postgres.fail_over()
        await self.postgres.wait_for_replica()
        self.notes["postgres_fenced_before"] = fenced_before
        return None

    async def postgres_discarded(self) -> int:
        """Cold keys PostgreSQL fences discarded so far (0 while unreachable)."""
        dsn = self.postgres.dsn(self.database)
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                return int(await conn.fetchval(sql.SUM_FENCE_DISCARDED))
            finally:
                await conn.close()
        return 0

    def faults(self) -> dict[str, Callable[[], Awaitable[int | None]]]:
        return {
            "primary_sigkill": self.primary_sigkill,
            "sentinel_failover": self.sentinel_failover,
            "kill_keysync": self._process("keysync"),
            "failback": self.failback,
            "postgres_failover": self.postgres_failover,
            "cut_links_then_sigkill": self.cut_links_then_sigkill,
            "kill_keygen": self._process("keygen"),
            "restart_from_old_snapshot": self.restart_from_old_snapshot,
            "kill_dispenser": self._process("dispenser-0"),
            "restart_postgres": self.restart_postgres,
            "kill_lease_holder": self._noted(self.lease_faults.kill_lease_holder),
            "clock_back": self._noted(self.lease_faults.clock_back),
        }

    def _noted(
        self, fault: Callable[[], Awaitable[dict[str, Any]]]
    ) -> Callable[[], Awaitable[int | None]]:
        async def inject() -> int | None:
            self.notes.update(await fault())
            return None

        return inject

    async def fence_engaged(self, identity: str) -> bool:
        """Whether the fence records the primary ``identity`` as its owner (the first
        fenced script on a new primary takes ownership), within FENCE_DEADLINE_S."""
        deadline = time.monotonic() + FENCE_DEADLINE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, RuntimeError):
                owner = self.topology.primary().client().get(redis_keys.fence_key(DRILL_NAMESPACE))
                if owner == identity:
                    return True
            await asyncio.sleep(0.1)
        return False

    async def identity_notes(self, before: tuple[int, str] | None) -> dict[str, Any]:
        """After a Redis fault: did the primary change identity, and did the fence engage."""
        after = await asyncio.to_thread(self.topology.identity)
        changed = before is not None and after is not None and after[1] != before[1]
        return {
            "primary_port_before": before[0] if before else None,
            "primary_port_after": after[0] if after else None,
            "identity_changed": changed,
            "fence_engaged": changed and after is not None and await self.fence_engaged(after[1]),
        }

    async def round(self, number: int, name: str) -> None:
        await asyncio.sleep(SETTLE_S)
        before, requests = self.discarded(), self.load.requests
        identity = await asyncio.to_thread(self.topology.identity)
        at, wall = time.monotonic(), time.time()
        error = None
        try:
            baseline = await self.faults()[name]()
        except (RuntimeError, redis.RedisError, OSError) as exc:
            # The fault could not be injected as planned: say so, restore, go on.
            error, baseline = str(exc), None
            log.error("drill_fault_failed", extra={"fault": name, "error": error})
            await self.settle_redis()
        ended = time.monotonic()
        if name in REDIS_FAULTS:
            self.notes.update(await self.identity_notes(identity))
            # Leases were held through it: every worker must hold a new one.
            self.notes.update(await self.lease_faults.reacquired(wall * 1000))
        await asyncio.sleep(1.0)  # let the first refill after the fault land
        redis_discarded = max(self.discarded() - (before if baseline is None else baseline), 0)
        row = {
            "round": number,
            "fault": name,
            "fault_at": time.strftime("%H:%M:%S", time.gmtime(wall))
            + f".{int(wall % 1 * 1000):03d}",
            "keys_discarded": redis_discarded,
            "error": error,
            "requests": self.load.requests - requests,
            "_at": at,
            "_ended": ended,
        }
        if "postgres_fenced_before" in self.notes:
            fenced = await self.postgres_discarded() - self.notes.pop("postgres_fenced_before")
            row["postgres_keys_discarded"] = fenced
            row["keys_discarded"] = redis_discarded + fenced
        row.update(self.notes)
        self.lease_faults.respawn_cli_holders()
        row["process_exits"] = self.fleet.restart_exited()
        self.notes.clear()
        self.results.append(row)
        log.info("drill_round", extra={k: v for k, v in self.results[-1].items() if k[0] != "_"})

    def measure_disruptions(self) -> None:
        """Outage figures per round, from every request the load made (after the drill)."""
        for i, row in enumerate(self.results):
            until = self.results[i + 1]["_at"] if i + 1 < len(self.results) else float("inf")
            began, resume = self.load.disruption(row.pop("_at"), until)
            row["outage_began_ms"] = round(began)
            row["resume_ms"] = round(resume)
            # Service resumed: requests answered with keys after the fault was over.
            row["served_after_fault"] = self.load.served_between(row.pop("_ended"), until)


async def run(
    settings: Settings,
    rounds: int,
    only: list[str] | None,
    work_dir: Path | None,
    postgres_fence: bool = True,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kd-drill-") as tmp:
        base = work_dir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)  # embedded PostgreSQL runs unprivileged when we are root
        return await _drill(settings, rounds, only, base, postgres_fence)


async def _drill(
    settings: Settings, rounds: int, only: list[str] | None, base: Path, postgres_fence: bool
) -> dict[str, Any]:
    """The drill runs its own servers (it kills and promotes them): Redis with replicas
    and Sentinels, PostgreSQL with a streaming replica."""
    topology = Topology(base / "redis")
    postgres = PostgresPair(base)
    fleet: Fleet | None = None
    load: RecordingLoad | None = None
    snowflakes: SnowflakeLoad | None = None
    try:
        topology.start()
        await asyncio.to_thread(postgres.start)
        database = f"kd_drill_{os.getpid()}"
        await scratch_database(postgres.pair()[0].dsn("postgres"), database)
        dsn = postgres.dsn(database)
        fleet = _fleet(settings, base, dsn, topology, postgres_fence)
        migrated = await asyncio.to_thread(_migrate, fleet)
        if migrated:
            raise RuntimeError(f"migrate failed: {migrated}")
        ports = [free_port(), free_port()]
        fleet.spawn("keygen", "keygen")
        fleet.spawn("keysync", "keysync")
        for i, port in enumerate(ports):
            extra = {"KD_DISPENSER__PORT": str(port)} | leases.dispenser_env()
            fleet.spawn(f"dispenser-{i}", "dispenser", extra)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            if not await asyncio.to_thread(serving, f"{url}/readyz", 60):
                raise RuntimeError(f"{url}/readyz not ready after 60s")
        load = RecordingLoad(urls, DRILL_TYPE)
        snowflakes = SnowflakeLoad(urls, leases.SNOWFLAKE_TYPE, leases.SNOWFLAKE_TYPE_CONFIG)
        lease_faults = LeaseFaults(fleet, snowflakes)
        lease_faults.start_cli_holders()
        drill = Drill(
            topology, fleet, load, postgres, database, base / "snapshot.rdb", lease_faults
        )
        kinds = only or list(drill.faults())
        unknown = set(kinds) - set(drill.faults())
        if unknown:
            raise RuntimeError(f"unknown faults: {sorted(unknown)}")
        until = time.monotonic() + rounds * 40 + 60
        holders_done = asyncio.Event()  # the CLI lease holders' supervisor stops
        runner = asyncio.ensure_future(
            asyncio.gather(
                load.run(until), snowflakes.run(until), lease_faults.supervise(holders_done, until)
            )
        )
        for number in range(rounds):
            await drill.round(number + 1, kinds[number % len(kinds)])
        await asyncio.sleep(SETTLE_S)
        load.stop()
        snowflakes.stop()
        holders_done.set()
        await runner
        drill.measure_disruptions()
        ledger = await ledger_check(dsn, DRILL_TYPE, set(load.keys), base / "logs")
        report = _report(drill, kinds) | {"ledger": ledger, "postgres_fence": postgres_fence}
        fleet.stop()  # holders release their leases: every interval ends with its stop
        return report | lease_faults.report() | {"process_exits": fleet.exits}
    finally:
        if load is not None:
            load.stop()
        if snowflakes is not None:
            snowflakes.stop()
        if fleet is not None:
            fleet.stop()
        topology.stop()
        postgres.stop()


async def ledger_check(dsn: str, name: str, received: set[str], logs: Path) -> dict[str, int]:
    """Compare the ledger keysync wrote for type ``name`` with the keys clients received.

    ``missing``: received but not recorded (entries lost with a primary that died before
    replicating them). ``unreceived``: recorded but never received (the answer was lost:
    a killed dispenser, a timed-out request). ``duplicate_alarms`` must be 0.
    """
    ledger = sql.ledger_table(name)
    conn = await asyncpg.connect(dsn)
    try:
        rows, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + LEDGER_SETTLE_S
        while time.monotonic() < deadline and time.monotonic() - stable_since < 3:
            now = int(await conn.fetchval(f"SELECT count(*) FROM {ledger}"))
            if now != rows:
                rows, stable_since = now, time.monotonic()
            await asyncio.sleep(0.5)
        recorded = {r["key"] for r in await conn.fetch(f"SELECT key FROM {ledger}")}
    finally:
        await conn.close()
    alarms = await asyncio.to_thread(_duplicate_alarms, logs)
    return {
        "rows": len(recorded),
        "missing": len(received - recorded),
        "unreceived": len(recorded - received),
        "duplicate_alarms": alarms,
    }


def _duplicate_alarms(logs: Path) -> int:
    """How often keysync logged the ledger's duplicate alarm (keysync logs JSON lines)."""
    return sum(
        path.read_text(errors="replace").count('"duplicate_key_issued"')
        for path in logs.glob("keysync*.log")
    )


def _fleet(
    settings: Settings, base: Path, dsn: str, topology: Topology, postgres_fence: bool
) -> Fleet:
    config = base / "drill.yaml"
    keysync = {"poll_interval_s": 0.2, "ledger_claim_idle_s": 2.0}
    types = {DRILL_TYPE: DRILL_TYPE_CONFIG, leases.SNOWFLAKE_TYPE: leases.SNOWFLAKE_TYPE_CONFIG}
    # Every lease renewal is logged: the interval checks read each holder's deadlines.
    log_levels = {"shared.leasing": "DEBUG"}
    config.write_text(
        json.dumps(
            {
                "id_types": types,
                "keysync": keysync,
                "redis_namespace": DRILL_NAMESPACE,
                "log_levels": log_levels,
            }
        )
    )
    key = settings.permutation_key.get_secret_value() if settings.permutation_key else ""
    env = scrubbed_env(
        KD_CONFIG=str(config),
        KD_POSTGRES_DSN=dsn,
        KD_PERMUTATION_KEY=key or secrets.token_urlsafe(32),
        KD_REDIS_SENTINEL=json.dumps(
            {"sentinels": topology.sentinel_addresses(), "master_name": MASTER}
        ),
        KD_POSTGRES_FENCE=str(postgres_fence).lower(),
    )
    (base / "logs").mkdir(exist_ok=True)
    return Fleet(base / "logs", env)


def _migrate(fleet: Fleet) -> str:
    done = run_cli("migrate", env=fleet.env, timeout_s=120)
    return "" if done.returncode == 0 else done.stderr


def _report(drill: Drill, kinds: list[str]) -> dict[str, Any]:
    by_fault: dict[str, dict[str, Any]] = {}
    for row in drill.results:
        entry = by_fault.setdefault(
            row["fault"], {"rounds": 0, "keys_discarded": 0, "resume_ms_max": 0}
        )
        entry["rounds"] += 1
        entry["keys_discarded"] += row["keys_discarded"]
        entry["resume_ms_max"] = max(entry["resume_ms_max"], row["resume_ms"])
    return {
        "drill": "failover",
        "rounds": len(drill.results),
        "faults": drill.results,
        "by_fault": by_fault,
        "keys_dispensed": drill.load.dispensed,
        "unique_keys": len(drill.load.keys),
        "duplicates": drill.load.duplicates,
        "requests": drill.load.requests,
        "errors": dict(drill.load.errors),
        "faults_not_injected": sum(1 for row in drill.results if row["error"]),
        # Rounds whose Redis fault left no new primary owning the fence, or after which
        # no key was handed out: either fails the drill.
        "fence_not_engaged": [
            row["round"]
            for row in drill.results
            if row["fault"] in REDIS_FAULTS and not row["error"] and not row["fence_engaged"]
        ],
        "not_resumed": [row["round"] for row in drill.results if not row["served_after_fault"]],
        "lease_faults_not_observed": leases.not_observed(drill.results),
        "fault_kinds": kinds,
    }


def format_table(report: dict[str, Any]) -> str:
    head = ("round", "fault", "keys_discarded", "outage_began_ms", "resume_ms")
    lines = ["{:>5}  {:<26} {:>14} {:>15} {:>9}".format(*head)]
    for row in report["faults"]:
        cells = (
            row[k] for k in ("round", "fault", "keys_discarded", "outage_began_ms", "resume_ms")
        )
        lines.append("{:>5}  {:<26} {:>14} {:>15} {:>9}".format(*cells))
    lines.append(f"keys dispensed {report['keys_dispensed']}, duplicates {report['duplicates']}")
    lines.append(
        f"snowflake IDs {report['snowflake_ids']}, duplicates {report['snowflake_duplicates']}; "
        f"lease intervals {report['lease_intervals']}, overlaps {report['lease_overlaps']}"
    )
    ledger = report.get("ledger")
    if ledger:
        lines.append(
            f"ledger rows {ledger['rows']}, missing {ledger['missing']}, "
            f"unreceived {ledger['unreceived']}, duplicate alarms {ledger['duplicate_alarms']}"
        )
    return "\n".join(lines)
