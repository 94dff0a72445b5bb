"""``keydispenser drill --redis cluster``: a Redis Cluster's shard faults under load.

The drill runs its own servers: a Redis Cluster of 3 primaries and 3 replicas
(``redis_cluster.EmbeddedRedisCluster``) and a PostgreSQL, then keygen, keysync and
two dispensers through the real CLI, with clients taking keys (single and batch) and
marking some used. Every key of the namespace lives in one hash slot: the faults hit
the shard that serves it, in turn:

- ``shard_primary_sigkill``: SIGKILL its primary; the cluster promotes the replica;
  the killed node comes back empty and follows it;
- ``cluster_failover``: ``CLUSTER FAILOVER`` on its replica, the old primary up;
- ``lagging_replica_failover``: the replica frozen (SIGSTOP) for ``LAG_S`` while the
  primary keeps serving, then the primary SIGKILLed and the replica let go: it is
  promoted without what it missed (popped keys it still lists, ledger entries);
- ``shard_restart_empty``: SIGKILL its primary and start it again at once, empty
  (no persistence), faster than the cluster fails it over.

Checked on the whole history as the Sentinel drill is (history.py): no key received
twice, every ledger record kept but those a fault destroyed, no process exit, and
after every fault the shard's new primary owns the fence and keys flow again.

With ``--slot-per type`` (``redis_cluster.slot_per: type``) two more types, each on
another shard, are taken throughout: the faults hit the drill type's shard only, and
those types must be answered with a key every time, never paused (``BYSTANDER_PAUSE_S``)
while the struck shard fails over.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
from redis.crc import key_slot

from keydispenser_ops.drill import fault_kinds, lifecycle
from keydispenser_ops.drill.fleet import Fleet
from keydispenser_ops.drill.lifecycle import LIFECYCLE_CLIENTS, LifecycleLoad
from keydispenser_ops.drill.load import RecordingLoad
from keydispenser_ops.drill.report import Report, common_fields
from keydispenser_ops.drill.rounds import Round, measure_disruptions
from keydispenser_ops.drill.runner import (
    DRILL_CLIENT,
    DRILL_TYPE,
    DRILL_TYPE_CONFIG,
    LEDGER_DRAIN_S,
    rounds_table,
)
from keydispenser_ops.embedded import EmbeddedPostgres, EmbeddedServerError, free_port
from keydispenser_ops.processes import run_cli, scrubbed_env, serving
from keydispenser_ops.redis_cluster import ClusterNode, EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.postgres.databases import scratch_database

NAMESPACE = "kd"
# The types taken beside the drill type with --slot-per type, each placed on a shard of
# its own (EmbeddedRedisCluster.spread), and the longest they may go without a key.
BYSTANDER_STEMS = ("bystander", "onlooker")
BYSTANDER_PAUSE_S = 1.0
BYSTANDER_TIERS = {"ledger": False, "hot": {"low": 12_000, "high": 24_000}, "sync_batch": 2_000}
CLUSTER_FAULTS = tuple(fault_kinds.of("cluster"))
LAG_S = 1.0  # lagging_replica_failover: how long the replica misses writes
SETTLE_S = 2.0  # normal load between faults
# ... and until the ledger stream holds at most this many entries (keysync caught up
# with the backlog the last fault left), for at most DRAIN_S.
DRAINED_ENTRIES = 2_000
DRAIN_S = 20.0
FAILOVER_S = 30.0  # how long the cluster may take to put a primary on the slot
FENCE_DEADLINE_S = 15.0
DRILL_KEYSYNC = {"poll_interval_s": 0.2, "ledger_claim_idle_s": 2.0}


@dataclass(frozen=True)
class ClusterDrillReport(Report):
    """The Cluster drill: what every drill reports (``Report``), and the other shards'
    types (with --slot-per type) and their checks."""

    kind: ClassVar[str] = "redis_cluster"

    slot_per: str = "namespace"
    # With slot_per type: each type on another shard than the struck one (its keys,
    # duplicates, refusals, and longest wait for a key during any fault).
    bystanders: dict[str, dict[str, Any]] = field(default_factory=dict)

    def own_checks(self) -> list[tuple[bool, str]]:
        checks: list[tuple[bool, str]] = []
        for name, seen in self.bystanders.items():
            checks += [
                (seen["keys"] > 0, f"{name} (another shard) dispensed nothing"),
                (seen["duplicates"] == 0, f"{name}: {seen['duplicates']} keys dispensed twice"),
                (seen["refusals"] == 0, f"{name} (another shard) refused {seen['refusals']}"),
                (
                    seen["longest_gap_ms"] <= BYSTANDER_PAUSE_S * 1000,
                    f"{name} (another shard) paused {seen['longest_gap_ms']} ms",
                ),
            ]
        return checks


def format_table(report: ClusterDrillReport) -> str:
    lines = rounds_table(report.faults)
    ledger = report.ledger
    lines.append(f"keys dispensed {report.keys_dispensed}, duplicates {report.duplicates}")
    lines.append(
        f"ledger rows {ledger['rows']}, missing {ledger['missing']}, used marks missing "
        f"{ledger['used_missing']} of {ledger['marked']}, lost to faults "
        f"{sum(ledger['lost_to_fault'].values())}"
    )
    uins = report.lifecycle
    lines.append(
        f"UIN lifecycle: {uins.get('uins_received', 0)} received, "
        f"{uins.get('uins_reissued', 0)} issued again; in two hands "
        f"{uins.get('keys_in_two_hands', 0)}, changes lost {uins.get('status_changes_lost', 0)}"
        f", under another client {uins.get('ledger_wrong_client', 0)}, missing "
        f"{uins.get('ledger_missing', 0)}"
    )
    lines.append(f"process exits {len(report.process_exits)}")
    for name, seen in report.bystanders.items():
        lines.append(
            f"{name} (another shard): keys {seen['keys']}, duplicates {seen['duplicates']}, "
            f"refusals during faults {seen['refusals']}, longest wait "
            f"{seen['longest_gap_ms']} ms"
        )
    lines.extend(f"FAILED: {failure}" for failure in report.failures())
    return "\n".join(lines)


@dataclass
class ClusterDrill:
    cluster: EmbeddedRedisCluster
    fleet: Fleet
    load: RecordingLoad
    tag: str  # the drill type's key namespace: its slot is the one struck
    bystanders: list[RecordingLoad] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    undrained_at_end: int = 0  # ledger entries left when the fleet was stopped

    @property
    def slot(self) -> int:
        return key_slot(self.tag.encode())

    def faults(self) -> dict[str, Callable[[], Awaitable[dict[str, Any]]]]:
        return {
            "shard_primary_sigkill": self.shard_primary_sigkill,
            "cluster_failover": self.cluster_failover,
            "lagging_replica_failover": self.lagging_replica_failover,
            "shard_restart_empty": self.shard_restart_empty,
        }

    # --- who is who -------------------------------------------------------------------

    def primary(self) -> ClusterNode:
        return self.cluster.primary_of(self.slot)

    def identity(self) -> tuple[str, str]:
        """The slot's primary and its identity (what the fence records as its owner)."""
        node = self.primary()
        client = node.client()
        server, replication = client.info("server"), client.info("replication")
        return node.address, f"{server['run_id']}:{replication['master_replid']}"

    def discarded(self) -> int:
        try:
            counts = self.primary().client().hgetall(redis_keys.discarded_key(self.tag))
        except (redis.RedisError, EmbeddedServerError):
            return 0
        return sum(int(v) for v in counts.values())

    async def until_new_primary(self, old: ClusterNode) -> ClusterNode:
        deadline = time.monotonic() + FAILOVER_S
        while time.monotonic() < deadline:
            try:
                node = self.primary()
                if node is not old:
                    return node
            except (redis.RedisError, EmbeddedServerError):
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no new primary for slot {self.slot} within {FAILOVER_S}s")

    async def healthy(self) -> None:
        await asyncio.to_thread(self.cluster.wait_healthy, 60)

    async def fence_engaged(self, token: str) -> bool:
        """Whether the slot's primary records itself as the fence's owner (the first
        script it ran after the fault fenced it)."""
        deadline = time.monotonic() + FENCE_DEADLINE_S
        while time.monotonic() < deadline:
            try:
                if self.primary().client().get(redis_keys.fence_key(self.tag)) == token:
                    return True
            except (redis.RedisError, EmbeddedServerError):
                pass
            await asyncio.sleep(0.1)
        return False

    # --- faults -------------------------------------------------------------------------

    async def shard_primary_sigkill(self) -> dict[str, Any]:
        old = self.primary()
        self.cluster.kill(old)
        new = await self.until_new_primary(old)
        self.cluster.restart(old)  # empty: it follows the promoted node
        await self.healthy()
        return {"promoted": new.address}

    async def cluster_failover(self) -> dict[str, Any]:
        old = self.primary()
        replica = self.cluster.replica_of(old)
        await asyncio.to_thread(self.cluster.failover, replica, FAILOVER_S)
        new = await self.until_new_primary(old)
        await self.healthy()
        return {"promoted": new.address}

    async def lagging_replica_failover(self) -> dict[str, Any]:
        old = self.primary()
        replica = self.cluster.replica_of(old)
        process = replica.server.process
        assert process is not None
        process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(LAG_S)
            lag = _lag(old)
            self.cluster.kill(old)
        finally:
            process.send_signal(signal.SIGCONT)
        new = await self.until_new_primary(old)
        self.cluster.restart(old)
        await self.healthy()
        return {"promoted": new.address, "replica_lag_bytes": lag}

    async def shard_restart_empty(self) -> dict[str, Any]:
        old = self.primary()
        self.cluster.kill(old)
        self.cluster.restart(old)
        await self.healthy()
        return {"primary_after_restart": self.primary().address}

    # --- rounds -------------------------------------------------------------------------

    async def drained(self, most: int = DRAINED_ENTRIES, deadline_s: float = DRAIN_S) -> int:
        """Wait (up to ``deadline_s``) until keysync has caught up with the ledger stream
        (at most ``most`` entries left): before a fault, so that it destroys only what it
        destroys itself, not a backlog the one before left; at the end (``most`` 0), so
        that the checker reads every record. Returns the entries left (-1: unknown)."""
        deadline = time.monotonic() + deadline_s
        left = -1
        while time.monotonic() < deadline:
            try:
                left = int(self.primary().client().xlen(redis_keys.ledger_stream_key(self.tag)))
            except (redis.RedisError, EmbeddedServerError):
                left = -1
            if 0 <= left <= most:
                break
            await asyncio.sleep(0.2)
        return left

    def oldest_undrained(self) -> float | None:
        """When the oldest entry the ledger stream still holds was written (monotonic
        time; None for none): keysync has applied everything before it."""
        try:
            first = self.primary().client().xrange(redis_keys.ledger_stream_key(self.tag), count=1)
        except (redis.RedisError, EmbeddedServerError):
            return None
        if not first:
            return None
        written_s = int(str(first[0][0]).split("-")[0]) / 1000
        return time.monotonic() - (time.time() - written_s)

    async def round(self, number: int, name: str) -> None:
        await asyncio.sleep(SETTLE_S)
        backlog = await self.drained()
        undrained_since = await asyncio.to_thread(self.oldest_undrained)
        before_address, before_token = await asyncio.to_thread(self.identity)
        discarded_before = self.discarded()
        began, wall = time.monotonic(), time.time()
        error, figures = None, {}
        try:
            figures = await self.faults()[name]()
        except (RuntimeError, EmbeddedServerError, redis.RedisError, OSError) as exc:
            error = str(exc)
            await self.healthy()
        ended = time.monotonic()
        figures["ledger_backlog_at_fault"] = backlog
        if undrained_since is not None:
            figures["ledger_undrained_for_s"] = round(began - undrained_since, 3)
        after_address, after_token = await asyncio.to_thread(self.identity)
        changed = after_token != before_token
        engaged = changed and await self.fence_engaged(after_token)
        await asyncio.sleep(1.0)  # the first refill after the fault lands
        done = Round(
            number, name, began, ended, wall, error, _since(self.discarded(), discarded_before)
        )
        done.figures = {
            "primary_before": before_address,
            "primary_after": after_address,
            "identity_changed": changed,
            **figures,
        }
        done.fence_engaged = engaged
        # A replica promoted has every entry it copied, applied or not; a restart
        # without persistence has none: the records it may destroy start at the oldest
        # entry not applied when the fault began.
        done.loss_from = min(began, undrained_since) if undrained_since is not None else began
        done.process_exits = self.fleet.restart_exited()
        self.rounds.append(done)

    def measure_disruptions(self) -> None:
        measure_disruptions(self.rounds, self.load)
        if not self.bystanders:
            return
        for done in self.rounds:
            # The other shards' types, from the fault until the struck shard serves again
            # (and a second more): refused requests, and the longest wait.
            end = done.ended + 1.0
            done.figures["bystander_refusals"] = sum(
                _refusals(load, done.began, end) for load in self.bystanders
            )
            done.figures["bystander_longest_gap_ms"] = max(
                _longest_gap_ms(load, done.began, end) for load in self.bystanders
            )


def _refusals(load: RecordingLoad, start: float, until: float) -> int:
    return sum(1 for t, ok in load.events if not ok and start <= t < until)


def _longest_gap_ms(load: RecordingLoad, start: float, until: float) -> int:
    """The longest time in [start, until) between answers with a key (from ``start``
    to the first, and from the last to ``until``, count too)."""
    served = [t for t, ok in load.events if ok and start <= t < until]
    last = load.events[-1][0] if load.events else start
    edges = [start, *served, max(start, min(until, last))]
    return round(max(b - a for a, b in itertools.pairwise(edges)) * 1000)


def _since(now: int, before: int) -> int:
    """Keys discarded in a round: the counts live on the shard's primary, and a new one
    carries on from what it inherited, or from nothing when the counts were lost with
    its data (a restart without persistence)."""
    return now - before if now >= before else now


def _lag(primary: ClusterNode) -> int:
    """Bytes the primary has written that its (frozen) replica has not acknowledged."""
    info = primary.client().info("replication")
    offsets = [
        int(v["offset"])
        for k, v in info.items()
        if k.startswith("slave") and isinstance(v, dict) and "offset" in v
    ]
    return int(info["master_repl_offset"]) - min(offsets, default=0)


async def run(
    settings: Settings,
    rounds: int,
    only: list[str] | None,
    work_dir: Path | None,
    slot_per: str = "namespace",
) -> ClusterDrillReport:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kd-cluster-drill-") as tmp:
        base = work_dir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)  # embedded PostgreSQL runs unprivileged when we are root
        return await _drill(settings, rounds, only, base, slot_per)


async def _drill(
    settings: Settings, rounds: int, only: list[str] | None, base: Path, slot_per: str
) -> ClusterDrillReport:
    kinds = fault_kinds.chosen("cluster", only)
    cluster = EmbeddedRedisCluster(base / "redis-cluster")
    postgres = EmbeddedPostgres(base / "postgres")
    fleet: Fleet | None = None
    loads: list[RecordingLoad] = []
    try:
        await asyncio.to_thread(cluster.start)
        await asyncio.to_thread(postgres.start)
        database = f"kd_cluster_drill_{os.getpid()}"
        await scratch_database(postgres.dsn("postgres"), database)
        bystanders = (
            cluster.spread(NAMESPACE, [DRILL_TYPE, *BYSTANDER_STEMS])[1:]
            if slot_per == "type"
            else []
        )
        api_config, api_keys = lifecycle.api_keys((DRILL_CLIENT, *LIFECYCLE_CLIENTS))
        fleet = _fleet(
            settings, base, postgres.dsn(database), cluster, slot_per, bystanders, api_config
        )
        done = await asyncio.to_thread(run_cli, "migrate", env=fleet.env, timeout_s=120)
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed: {done.stderr}")
        ports = [free_port(), free_port()]
        fleet.spawn("keygen", "keygen")
        # Two keysyncs: the ledger stream's consumer group shares its entries between
        # them, and one alone drains fewer records a second than the load takes keys.
        fleet.spawn("keysync-0", "keysync")
        fleet.spawn("keysync-1", "keysync")
        for i, port in enumerate(ports):
            fleet.spawn(f"dispenser-{i}", "dispenser", {"KD_DISPENSER__PORT": str(port)})
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            if not await asyncio.to_thread(serving, f"{url}/readyz", 60):
                raise RuntimeError(f"{url}/readyz not ready after 60s")
        headers = {"X-API-Key": api_keys[DRILL_CLIENT]}
        load = RecordingLoad(urls, DRILL_TYPE, headers=headers)
        # Bystanders: a few clients each, marking nothing (their types keep no ledger).
        others = [
            RecordingLoad(urls, name, clients=2, mark_every=0, headers=headers)
            for name in bystanders
        ]
        uins = LifecycleLoad(urls, {n: api_keys[n] for n in LIFECYCLE_CLIENTS})
        loads = [load, *others]
        tag = "{" + NAMESPACE + (f".{DRILL_TYPE}" if slot_per == "type" else "") + "}"
        drill = ClusterDrill(cluster, fleet, load, tag, others)
        fault_kinds.check_implemented("cluster", drill.faults())
        until = time.monotonic() + rounds * 45 + 60
        running = [asyncio.ensure_future(each.run(until)) for each in loads]
        running.append(asyncio.ensure_future(uins.run(until)))
        for number in range(rounds):
            await drill.round(number + 1, kinds[number % len(kinds)])
        await asyncio.sleep(SETTLE_S)
        for each in loads:
            each.stop()
        await uins.until_reissued(lifecycle.REISSUE_WAIT_S)
        uins.stop()
        await asyncio.gather(*running)
        drill.measure_disruptions()
        # keysync applies everything the stream holds before it stops: the checker reads
        # the ledger after (entries still there would count as records missing).
        drill.undrained_at_end = await drill.drained(0, LEDGER_DRAIN_S)
        fleet.stop()
        dsn = postgres.dsn(database)
        return await _report(drill, kinds, dsn, base / "logs", slot_per, uins)
    finally:
        for each in loads:
            each.stop()
        if fleet is not None:
            fleet.stop()
        await asyncio.to_thread(cluster.stop)
        postgres.stop()


def _fleet(
    settings: Settings,
    base: Path,
    dsn: str,
    cluster: EmbeddedRedisCluster,
    slot_per: str,
    bystanders: list[str],
    api_keys: list[dict[str, Any]],
) -> Fleet:
    config = base / "drill.yaml"
    # The bystanders' hot lists hold several seconds of their load: what they prove is
    # that the struck shard never holds up another shard's pops, not how fast keysync
    # refills on a loaded machine (a refill waits on PostgreSQL, shared by every type).
    others = {name: DRILL_TYPE_CONFIG | BYSTANDER_TIERS for name in bystanders}
    uin = {lifecycle.LIFECYCLE_TYPE: lifecycle.type_config(1)}  # a replica per primary
    dispenser = {
        "auth": {"api_keys": api_keys},
        "mosip": {"uin": lifecycle.LIFECYCLE_TYPE, "ledger_wait_s": 5},
    }
    config.write_text(
        json.dumps(
            {
                "id_types": {DRILL_TYPE: DRILL_TYPE_CONFIG, **uin, **others},
                "keysync": DRILL_KEYSYNC | {"ledger_requeue_every_s": 1.0},
                "dispenser": dispenser,
                "redis_namespace": NAMESPACE,
                "postgres_connect_timeout_s": 1.0,
            }
        )
    )
    key = settings.permutation_key.get_secret_value() if settings.permutation_key else ""
    env = scrubbed_env(
        KD_CONFIG=str(config),
        KD_POSTGRES_DSN=dsn,
        KD_PERMUTATION_KEY=key or secrets.token_urlsafe(32),
        KD_REDIS_CLUSTER=json.dumps({"nodes": list(cluster.seeds), "slot_per": slot_per}),
    )
    (base / "logs").mkdir(exist_ok=True)
    return Fleet(base / "logs", env)


async def _report(
    drill: ClusterDrill,
    kinds: list[str],
    dsn: str,
    logs: Path,
    slot_per: str,
    uins: LifecycleLoad,
) -> ClusterDrillReport:
    common = await common_fields(
        drill.rounds,
        drill.load,
        uins,
        kinds=kinds,
        dsn=dsn,
        logs=logs,
        exits=drill.fleet.exits,
        unapplied=drill.undrained_at_end,
        fence_rounds=drill.rounds,
    )
    return ClusterDrillReport(
        **common,
        slot_per=slot_per,
        bystanders={
            other.name: {
                "keys": other.dispensed,
                "duplicates": other.duplicates,
                "refusals": sum(_refusals(other, r.began, r.ended + 1.0) for r in drill.rounds),
                "errors": dict(other.errors),
                "longest_gap_ms": max(
                    (_longest_gap_ms(other, r.began, r.ended + 1.0) for r in drill.rounds),
                    default=0,
                ),
            }
            for other in drill.bystanders
        },
    )
