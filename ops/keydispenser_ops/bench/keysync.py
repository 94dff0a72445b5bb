"""``keydispenser bench keysync``: keys moved cold -> hot per second, 1 and 2 processes.

Each measure fills the cold table of a scratch type in a scratch PostgreSQL database
(synthetic keys: keysync never looks inside them), then starts N processes that each
run keysync's own refill (``Keysync.refill``: the guarded ``DELETE ... RETURNING``
behind the PostgreSQL fence, commit, then the fenced, idempotent push) until the cold
table is empty. keys_per_s is every key moved over the time from the common start to
the last process's end; the hot list must then hold exactly the keys moved.

The PostgreSQL fence's record lives in the Redis database at ``redis_url``: use a
scratch one (the bench refuses a database that already holds a record or hot lists).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import platform
import time
from multiprocessing.synchronize import Event as EventType
from queue import Empty
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from keydispenser_ops.bench import Options
from keydispenser_ops.bench.scratch import clear, refuse_unless_scratch
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.config import IdTypeConfig, Settings
from shared.domain.errors import KeydispenserError
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, scratch_database
from shared.stores.postgres.schema import migrate

SYNC_TYPE = "kd_bench_sync"
# Cold keys per measure: this many per second of --seconds (above the 300 k/s target,
# so the measure lasts about --seconds or less).
KEYS_PER_SECOND_SIZING = 400_000
START_DEADLINE_S = 120.0
RUN_DEADLINE_S = 1_800.0
# $1: first counter, $2: how many. Synthetic 10-digit keys.
FILL_COLD = (
    "INSERT INTO {cold} (key) SELECT lpad(g::text, 10, '0') "
    "FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g"
)


def bench_settings(settings: Settings, dsn: str, sync_batch: int) -> Settings:
    config = {
        "kind": "numeric",
        "length": 10,
        "sync_batch": sync_batch,
        "hot": {"low": 10**9 - 1, "high": 10**9},  # refill never stops for the hot list
    }
    return Settings.model_validate(
        settings.model_dump()
        | {"postgres_dsn": dsn, "postgres_fence": True, "id_types": {SYNC_TYPE: config}}
    )


def _worker(settings: Settings, go: EventType, ready: Any, results: Any) -> None:
    logging.getLogger("keysync").setLevel(logging.ERROR)  # "cold_empty" ends every measure
    results.put(asyncio.run(_move(settings, go, ready)))


async def _move(settings: Settings, go: EventType, ready: Any) -> dict[str, float]:
    """One keysync process: connect, wait for the common start, refill until cold is empty."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    sync = SyncRecord.from_settings(settings)
    types = build_id_types(settings, generating=False)
    try:
        keysync = Keysync(settings, GuardedCold(cold, sync, types), hot)
        await hot.observe(SYNC_TYPE)  # connected, scripts loaded
        await sync.read()
        ready.put(os.getpid())
        if not await asyncio.to_thread(go.wait, START_DEADLINE_S):
            raise KeydispenserError("bench keysync: no start signal")
        started = time.monotonic()
        moved = await keysync.refill(types[SYNC_TYPE])
        return {"moved": moved, "started": started, "ended": time.monotonic()}
    finally:
        await cold.close()
        await hot.close()
        await sync.close()


async def _fill(dsn: str, start: int, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql.for_type(FILL_COLD, SYNC_TYPE), start, count)
        await conn.execute(f"VACUUM ANALYZE {sql.cold_table(SYNC_TYPE)}")
    finally:
        await conn.close()


def _gather(queue: Any, count: int, workers: list[Any], deadline_s: float) -> list[Any]:
    """``count`` items from ``queue``; fails fast when a worker died without its item."""
    items: list[Any] = []
    deadline = time.monotonic() + deadline_s
    while len(items) < count:
        try:
            items.append(queue.get(timeout=0.5))
        except Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"keysync processes exited {failed}" if failed else "deadline passed"
                raise KeydispenserError(f"bench keysync: {why}") from None
    return items


def _collect(
    processes: int, go: EventType, ready: Any, results: Any, workers: list[Any]
) -> list[dict[str, float]]:
    _gather(ready, processes, workers, START_DEADLINE_S)
    go.set()
    return _gather(results, processes, workers, RUN_DEADLINE_S)


async def measure(
    settings: Settings, client: aioredis.Redis, processes: int, start: int, keys: int
) -> dict[str, Any]:
    await client.delete(redis_keys.hot_list_key(settings.redis_namespace, SYNC_TYPE))
    await _fill(settings.postgres_dsn, start, keys)
    context = multiprocessing.get_context("spawn")
    go, ready, results = context.Event(), context.Queue(), context.Queue()
    workers = [
        context.Process(target=_worker, args=(settings, go, ready, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        runs = await asyncio.to_thread(_collect, processes, go, ready, results, workers)
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    moved = sum(int(r["moved"]) for r in runs)
    elapsed = max(r["ended"] for r in runs) - min(r["started"] for r in runs)
    in_hot = int(await client.llen(redis_keys.hot_list_key(settings.redis_namespace, SYNC_TYPE)))
    return {
        "keys_per_s": round(moved / elapsed),
        "keys_moved": moved,
        "seconds": round(elapsed, 3),
        "per_process_moved": [int(r["moved"]) for r in runs],
        "exact": moved == keys == in_hot,
    }


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    processes, sync_batch = options.processes, options.sync_batch
    keys = max(10_000, round(KEYS_PER_SECOND_SIZING * seconds))
    batch = sync_batch or int(IdTypeConfig.model_fields["sync_batch"].default)
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    database = f"kd_bench_sync_{os.getpid()}"
    report: dict[str, Any] = {
        "benchmark": "keysync",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "keys_per_measure": keys,
        "sync_batch": batch,
        "postgres_fence": True,
    }
    scratch = False  # found to be a scratch database: this run's to tidy
    try:
        await refuse_unless_scratch(client, settings.redis_namespace, "keysync")
        scratch = True
        dsn = await scratch_database(settings.postgres_dsn, database)
        local = bench_settings(settings, dsn, batch)
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, build_id_types(local))
        finally:
            await conn.close()
        for n, count in enumerate(processes):
            result = await measure(local, client, count, 10**9 + n * keys, keys)
            report[f"processes_{count}"] = result
        report["keys_per_s"] = report[f"processes_{processes[0]}"]["keys_per_s"]
    finally:
        if scratch:  # never the state of a database it refused
            await clear(client, settings.redis_namespace, SYNC_TYPE)
        await client.aclose()
        await drop_database(settings.postgres_dsn, database)
    return report
