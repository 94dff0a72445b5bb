"""``keydispenser bench pipeline``: keygen + keysync + dispenser live, drained by batches.

The three processes run as they do in production (``keydispenser keygen|keysync|
dispenser``, one each; ``--keysyncs N`` runs N keysyncs) on a scratch PostgreSQL
database and the Redis database at ``redis_url`` (a scratch one: the bench refuses one
holding keydispenser state). keygen first fills the cold inventory alone to
``PREFILL_KEYS_PER_S x --seconds`` keys (what the target rate needs for the whole run),
then keysync fills the hot list (low 100,000, high 400,000; less for runs under 4 s);
then batch clients take ``POST /v1/keys/{type}?count=5000`` for ``--seconds`` while
keysync refills and keygen, idle at first, generates again once the cold inventory
falls below half the prefill (its low watermark), as in production.

``--types N`` runs N ID types at once (each with the same watermarks, a share of the
prefill, and its own clients offering a share of the rate); with ``--redis-cluster
SHARDS --slot-per type`` each type's keys live in a slot of their own, placed on
distinct shards as far as there are shards (``EmbeddedRedisCluster.spread``).

The clients offer a fixed aggregate load, ``--rate`` keys/s (default 200,000, the
target): request k is due ``k x 5000 / rate`` seconds after the start, by the
monotonic clock, so waits never drift; a client that is late sends at once. ``--rate
0`` takes at full speed instead (each client asks again as soon as it is answered).

Reported: keys/s dispensed next to the keys/s offered; ``hot_ran_dry`` (any 503
IDG-001, after which that client waits the Retry-After as every client must, any batch
answered short: the pop emptied the list, or a sampled hot depth of 0); the smallest
hot depth sampled (LLEN every 50 ms); and each tier's rate over the same window:
keygen's committed keys, keysync's moved keys (dispensed plus the hot list's growth).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml
from redis.exceptions import RedisError

from dispenser import codes
from keydispenser_ops.bench import BENCH_PERMUTATION_KEY, Options
from keydispenser_ops.bench.scratch import clear, refuse_unless_scratch
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, scrubbed_env, serving, spawn, stop_processes
from keydispenser_ops.redis_cluster import EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import ClusterConfig, Settings
from shared.domain.errors import KeydispenserError, StoreUnavailable
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, run_migrate, scratch_database
from shared.stores.redis.endpoint import RedisEndpoint

PIPE_TYPE = "kd_bench_pipe"
BATCH = 5_000
CLIENTS = 4
PREFILL_KEYS_PER_S = 200_000  # the target rate: the prefill covers the run at it
RANGE_SIZE = 1 << 20
HOT_HIGH = 400_000  # the hot list's high watermark (low: a quarter), for runs of 4 s or more
MIN_PREFILL = 40_000  # short runs (tests) scale the prefill and the hot list down
# keysync's batch: fewer, larger takes keep up with 200,000 keys/s on a shared machine
# (a crash loses at most one batch: 20,000 keys wasted, never reissued).
SYNC_BATCH = 20_000
SAMPLE_S = 0.05
DEFAULT_RATE = 200_000  # keys/s the clients offer together (0: full speed)
POOL_EMPTY = codes.POOL_EMPTY.code.encode()  # in the body of a 503 that is no fault
START_DEADLINE_S = 60.0
TARGETS = {"keys_per_s": 200_000, "hot_ran_dry": False}


def hot_marks(prefill: int) -> dict[str, int]:
    high = min(HOT_HIGH, prefill // 2)
    return {"low": high // 4, "high": high}


def pipeline_config(
    settings: Settings, dsn: str, prefill: int, port: int, names: tuple[str, ...] = (PIPE_TYPE,)
) -> dict[str, Any]:
    """``prefill``: each type's."""
    cluster = settings.redis_cluster
    on_cluster = {"nodes": list(cluster.nodes), "slot_per": cluster.slot_per} if cluster else None
    return {
        "postgres_dsn": dsn,
        "redis_url": settings.redis_url,
        **({"redis_cluster": on_cluster} if on_cluster else {}),
        "redis_namespace": settings.redis_namespace,
        "log_level": "WARNING",
        "id_types": {
            name: {
                "kind": "numeric",
                "length": 10,
                "range_size": RANGE_SIZE,
                "cold": {"low": prefill // 2, "high": prefill},
                "hot": hot_marks(prefill),
                "sync_batch": SYNC_BATCH,
            }
            for name in names
        },
        "dispenser": {"port": port, "max_batch": BATCH, "idempotency_ttl_s": 60},
        "keysync": {"poll_interval_s": 0.05},
    }


@dataclass
class Drain:
    """What the batch clients saw."""

    keys: int = 0
    requests: int = 0
    short_batches: int = 0  # answered with fewer keys than asked: the list ran empty
    pool_empty: int = 0  # 503 IDG-001
    other_errors: int = 0
    depths: list[int] = field(default_factory=list)


@dataclass
class Schedule:
    """When each request is due: the k-th at ``start + k x interval`` (monotonic clock;
    interval 0: full speed, every request due at once until ``deadline``)."""

    start: float
    deadline: float
    interval: float
    offered: int = 0  # requests claimed so far
    max_lag: float = 0.0  # the latest a request was sent after it was due

    @classmethod
    def at_rate(cls, start: float, seconds: float, rate: float) -> Schedule:
        return cls(start, start + seconds, BATCH / rate if rate else 0.0)

    def claim(self) -> float | None:
        """The due time of the next request; None when the schedule is over."""
        due = self.start + self.offered * self.interval if self.interval else time.monotonic()
        if due >= self.deadline:
            return None
        self.offered += 1
        return due

    def sent_late(self, lag: float) -> None:
        self.max_lag = max(self.max_lag, lag)


async def _client(
    session: aiohttp.ClientSession, url: str, schedule: Schedule, drain: Drain
) -> None:
    while (due := schedule.claim()) is not None:
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        elif schedule.interval:
            schedule.sent_late(-wait)
        async with session.post(url) as reply:
            body = await reply.read()
        drain.requests += 1
        if reply.status == 200:
            got = body.count(b'","') + 1 if body != b'{"keys":[]}' else 0
            drain.keys += got
            drain.short_batches += got < BATCH
        elif reply.status == 503 and POOL_EMPTY in body:
            drain.pool_empty += 1
            # As every client must: wait the Retry-After (spinning would starve keysync).
            retry = float(reply.headers.get("Retry-After", "1"))
            await asyncio.sleep(max(0.0, min(retry, schedule.deadline - time.monotonic())))
        else:
            drain.other_errors += 1


async def _sample(client: aioredis.Redis, hot_key: str, deadline: float, drain: Drain) -> None:
    while time.monotonic() < deadline:
        drain.depths.append(int(await client.llen(hot_key)))
        await asyncio.sleep(SAMPLE_S)


async def _wait_for(what: str, check: Any, deadline_s: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > deadline:
            raise KeydispenserError(
                f"bench pipeline: {what} not reached within {deadline_s:.0f}s\n{logs()}"
            )
        await asyncio.sleep(0.2)


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        seconds: float,
        work: Path,
        keysyncs: int,
        rate: float,
        names: tuple[str, ...] = (PIPE_TYPE,),
    ) -> None:
        self.settings, self.seconds, self.work = settings, seconds, work
        self.keysyncs, self.rate, self.names = keysyncs, rate, names
        # The key the scratch database is migrated with, and the processes run with.
        secret = settings.permutation_key
        self.permutation_key = secret.get_secret_value() if secret else BENCH_PERMUTATION_KEY
        # Each type's share of what the whole run needs at the target rate.
        self.prefill = max(MIN_PREFILL, round(PREFILL_KEYS_PER_S * seconds / len(names)))
        self.port = free_port()
        self.database = f"kd_bench_pipe_{os.getpid()}"
        self.processes: list[Any] = []

    def _spawn(self, command: str, config: Path, log: str = "") -> None:
        env = scrubbed_env(KD_CONFIG=str(config), KD_PERMUTATION_KEY=self.permutation_key)
        output = self.work / f"{log or command}.log"
        self.processes.append(spawn(cli_command(command), env, output))

    async def run(self) -> dict[str, Any]:
        # Each type's key namespace (one for all but with a cluster's slot_per: type).
        spaces = {name: self.settings.key_namespace_of(name) for name in self.names}
        endpoints = {
            ns: RedisEndpoint.for_keys(self.settings, ns) for ns in dict.fromkeys(spaces.values())
        }
        scratch = False  # the databases were found to be scratch ones: this run's to tidy
        try:
            clients = {name: await endpoints[ns].client() for name, ns in spaces.items()}
            for name, ns in spaces.items():
                await refuse_unless_scratch(clients[name], ns, "pipeline")
            scratch = True
            dsn = await scratch_database(self.settings.postgres_dsn, self.database)
            return await self._run(clients, dsn)
        finally:
            stop_processes(self.processes)
            for name, ns in spaces.items() if scratch else ():
                # Redis is gone (a run that failed on it): nothing to tidy there.
                with contextlib.suppress(StoreUnavailable, RedisError):
                    await clear(await endpoints[ns].client(), ns, name)
            for endpoint in endpoints.values():
                await endpoint.close()
            await drop_database(self.settings.postgres_dsn, self.database)

    async def _run(self, clients: dict[str, aioredis.Redis], dsn: str) -> dict[str, Any]:
        values = pipeline_config(self.settings, dsn, self.prefill, self.port, self.names)
        config = self.work / "pipeline.yaml"
        config.write_text(yaml.safe_dump(values))
        local = Settings.model_validate(values | {"permutation_key": self.permutation_key})
        await run_migrate(local)
        cold = await ColdStore.connect(dsn)
        try:
            return await self._measure(clients, cold, config)
        finally:
            await cold.close()

    async def _depths(self, clients: dict[str, aioredis.Redis]) -> dict[str, int]:
        return {name: int(await c.llen(self._hot_key(name))) for name, c in clients.items()}

    async def _measure(
        self, clients: dict[str, aioredis.Redis], cold: ColdStore, config: Path
    ) -> dict[str, Any]:
        started = time.monotonic()
        self._spawn("keygen", config)
        fill_deadline = START_DEADLINE_S + self.prefill * len(self.names) / 20_000

        async def cold_full() -> bool:
            self._alive()
            depths = [await cold.depth(name, self.prefill) for name in self.names]
            return min(depths) >= self.prefill

        async def hot_full() -> bool:
            self._alive()
            return min((await self._depths(clients)).values()) >= hot_marks(self.prefill)["high"]

        await _wait_for("the cold prefill", cold_full, fill_deadline, self._logs)
        for n in range(self.keysyncs):  # now: they would take keys as keygen commits them
            self._spawn("keysync", config, f"keysync-{n}")
        await _wait_for("the hot high watermark", hot_full, START_DEADLINE_S, self._logs)
        prefill_s = time.monotonic() - started
        self._spawn("dispenser", config)
        if not serving(f"http://127.0.0.1:{self.port}/healthz", START_DEADLINE_S):
            raise KeydispenserError("bench pipeline: the dispenser did not start")
        accepted_before = await self._accepted(cold)
        hot_before = sum((await self._depths(clients)).values())
        drains, schedules, elapsed = await self._drain(clients)
        self._alive()
        accepted_after = await self._accepted(cold)
        hot_after = sum((await self._depths(clients)).values())
        drain = Drain(
            keys=sum(d.keys for d in drains.values()),
            requests=sum(d.requests for d in drains.values()),
            short_batches=sum(d.short_batches for d in drains.values()),
            pool_empty=sum(d.pool_empty for d in drains.values()),
            other_errors=sum(d.other_errors for d in drains.values()),
            depths=[depth for d in drains.values() for depth in d.depths],
        )
        schedule = Schedule(
            started,
            started + self.seconds,
            0.0,
            offered=sum(s.offered for s in schedules.values()),
            max_lag=max(s.max_lag for s in schedules.values()),
        )
        report = self._report(
            drain,
            schedule,
            elapsed,
            prefill_s,
            accepted_after - accepted_before,
            drain.keys + hot_after - hot_before,
        )
        if len(self.names) > 1:
            report["types"] = {
                name: {
                    "keys_per_s": round(d.keys / elapsed),
                    "hot_ran_dry": d.pool_empty > 0 or d.short_batches > 0 or 0 in d.depths,
                    "key_namespace": self.settings.key_namespace_of(name),
                }
                for name, d in drains.items()
            }
        return report

    async def _accepted(self, cold: ColdStore) -> int:
        return sum([(await cold.range_stats(name))["accepted"] for name in self.names])

    def _hot_key(self, name: str) -> str:
        return redis_keys.hot_list_key(self.settings.key_namespace_of(name), name)

    async def _drain(
        self, clients: dict[str, aioredis.Redis]
    ) -> tuple[dict[str, Drain], dict[str, Schedule], float]:
        """Every type's clients at once, each type offered its share of the rate."""
        drains = {name: Drain() for name in self.names}
        per_type = max(1, CLIENTS // len(self.names)) if len(self.names) < CLIENTS else 2
        connector = aiohttp.TCPConnector(limit=per_type * len(self.names))
        async with aiohttp.ClientSession(connector=connector) as session:
            started = time.monotonic()
            share = self.rate / len(self.names)
            schedules = {
                name: Schedule.at_rate(started, self.seconds, share) for name in self.names
            }
            samplers = [
                asyncio.ensure_future(
                    _sample(c, self._hot_key(name), schedules[name].deadline, drains[name])
                )
                for name, c in clients.items()
            ]
            await asyncio.gather(
                *(
                    _client(session, self._url(name), schedules[name], drains[name])
                    for name in self.names
                    for _ in range(per_type)
                )
            )
            # The window: from the first request to the last answer (not the samplers'
            # last sleep).
            elapsed = time.monotonic() - started
            await asyncio.gather(*samplers)
        return drains, schedules, elapsed

    def _url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/v1/keys/{name}?count={BATCH}"

    def _logs(self) -> str:
        return "\n".join(
            f"{log.name}: {log.read_text(errors='replace')[-1500:]}"
            for log in sorted(self.work.glob("*.log"))
        )

    def _alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise KeydispenserError(
                    f"bench pipeline: {process.args[-1]} exited ({process.returncode}):\n"
                    + self._logs()
                )

    def _report(
        self,
        drain: Drain,
        schedule: Schedule,
        elapsed: float,
        prefill_s: float,
        generated: int,
        moved: int,
    ) -> dict[str, Any]:
        zero_depths = drain.depths.count(0)
        dry = drain.pool_empty > 0 or drain.short_batches > 0 or zero_depths > 0
        keys_per_s = round(drain.keys / elapsed)
        return {
            "benchmark": "pipeline",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "seconds": round(elapsed, 3),
            "keys_per_s": keys_per_s,
            "keys_dispensed": drain.keys,
            "hot_ran_dry": dry,
            "hot_min_depth": min(drain.depths, default=0),
            "hot_depth_samples": len(drain.depths),
            "hot_zero_depth_samples": zero_depths,
            "rate_keys_per_s": self.rate,
            "offered_keys_per_s": round(schedule.offered * BATCH / elapsed),
            "max_send_lag_ms": round(schedule.max_lag * 1000, 1),
            "idg001_answers": drain.pool_empty,
            "short_batches": drain.short_batches,
            "other_errors": drain.other_errors,
            "requests": drain.requests,
            "keygen_keys_per_s": round(generated / elapsed),
            "keysync_keys_per_s": round(moved / elapsed),
            "cold_prefill_keys": self.prefill,
            "prefill_seconds": round(prefill_s, 1),
            "batch": BATCH,
            "sync_batch": SYNC_BATCH,
            "clients": CLIENTS if len(self.names) == 1 else len(self.names) * 2,
            "id_types": len(self.names),
            "keysync_processes": self.keysyncs,
            "redis": _redis_described(self.settings),
            "targets": TARGETS,
            "targets_met": keys_per_s >= TARGETS["keys_per_s"] and not dry,
        }


def _redis_described(settings: Settings) -> str:
    if settings.redis_cluster is not None:
        return (
            f"cluster ({len(settings.redis_cluster.nodes)} nodes given, "
            f"slot_per {settings.redis_cluster.slot_per})"
        )
    return "redis_url"


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    """``options.rate``: keys/s the clients offer together (0: full speed; None: 200,000).
    ``options.cluster_shards``: run on a Redis Cluster of that many primaries (a replica
    each) started on loopback for the run, instead of the configured Redis."""
    keysyncs = options.keysyncs
    rate = DEFAULT_RATE if options.rate is None else options.rate
    stems = [PIPE_TYPE] + [f"{PIPE_TYPE}_{n}" for n in range(2, options.types + 1)]
    with tempfile.TemporaryDirectory(prefix="kd-bench-pipeline-") as work:
        if not options.cluster_shards:
            names = tuple(stems)
            return await Pipeline(settings, seconds, Path(work), keysyncs, rate, names).run()
        # A failure detection time no busy machine trips by itself (a bench is not a
        # drill: no node is to be failed over during it).
        cluster = EmbeddedRedisCluster(
            Path(work) / "cluster", primaries=options.cluster_shards, node_timeout_ms=15_000
        )
        await asyncio.to_thread(cluster.start)
        try:
            on_cluster = settings.model_copy(
                update={
                    "redis_cluster": ClusterConfig.model_validate(
                        {"nodes": cluster.seeds, "slot_per": options.slot_per}
                    )
                }
            )
            names = tuple(
                cluster.spread(settings.redis_namespace, stems)
                if options.slot_per == "type"
                else stems
            )
            before = await asyncio.to_thread(_shard_work, cluster)
            results = await Pipeline(on_cluster, seconds, Path(work), keysyncs, rate, names).run()
            after = await asyncio.to_thread(_shard_work, cluster)
        finally:
            await asyncio.to_thread(cluster.stop)
        shards = options.cluster_shards
        return results | {
            "redis": f"cluster of {shards} primaries, a replica each, on loopback, "
            f"slot_per {options.slot_per}",
            # What each primary did over the whole run (prefill included): where the load
            # went, whatever bounds the keys/s on this machine.
            "shards": {
                address: {
                    "cpu_s": round(after[address][0] - cpu, 2),
                    "commands": after[address][1] - commands,
                }
                for address, (cpu, commands) in before.items()
            },
        }


def _shard_work(cluster: EmbeddedRedisCluster) -> dict[str, tuple[float, int]]:
    """Each primary's CPU seconds (user and system) and commands processed so far."""
    found = {}
    for node in cluster.live():
        client = node.client()
        if client.info("replication")["role"] != "master":
            continue
        cpu, stats = client.info("cpu"), client.info("stats")
        used = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        found[node.address] = (used, int(stats["total_commands_processed"]))
    return found
