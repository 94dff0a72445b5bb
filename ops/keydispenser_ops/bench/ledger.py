"""``keydispenser bench ledger``: ledger records applied per second, per keysync.

A scratch ledger type in a scratch PostgreSQL database. Two measures per number of
keysync processes (``--processes``), each process running keysync's own drain
(``keysync.ledger.LedgerDrain``: each batch a ledger transaction behind the PostgreSQL
fence's guard, what it wrote copied to the ledger log before it commits, its stamp
recorded once committed; the log kept ``ledger_retain_s``):

- ``drain``: the stream filled beforehand with ``--seconds`` worth of issues at
  ``--rate`` keys/s; keys applied per second until the stream is empty;
- ``sustained``: a producer process appends issues at ``--rate`` keys/s for
  ``--seconds`` while the keysyncs drain; the stream's backlog is sampled every second
  (flat: the drain keeps up).

Issues are appended as the dispenser's pops append them, ENTRY_KEYS keys an entry (a
coalesced pop of that many single-ID requests, or a batch request), each with its
client; their keys are spread over the keyspace as a permuted type's are
(``registry.spread_key``), so each insert lands anywhere in the ledger's index.

``--existing-rows N``: the ledger holds N rows of a registry's past before the measures
(``registry.load_ledger``); between two measures only the rows a measure added go.

The Redis database at ``redis_url`` must be a scratch one (the bench refuses a database
that already holds a sync record or hot lists).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import platform
import time
from collections.abc import Awaitable, Callable
from multiprocessing.synchronize import Event as EventType
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from keydispenser_ops.bench import Options
from keydispenser_ops.bench.keysync import _gather
from keydispenser_ops.bench.registry import LOADED_ENTRY, load_ledger, spread_key
from keydispenser_ops.bench.scratch import clear, refuse_unless_scratch
from keysync.ledger import LedgerDrain
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, scratch_database
from shared.stores.postgres.schema import migrate

LEDGER_TYPE = "kd_bench_ledger"
KEY_LENGTH = 12
# Keys drained after a checkpoint before the measures (after_checkpoint): one per
# WARMUP_SHARE loaded rows, some five for each page of the ledger's index.
WARMUP_SHARE = 50
WARMUP_BASE = 9 * 10**10
ENTRY_KEYS = 20  # keys per issue entry
DEFAULT_RATE = 100_000.0  # keys/s offered
PIPELINE_ENTRIES = 100  # entries per XADD pipeline
DRAIN_DEADLINE_S = 900.0
START_DEADLINE_S = 120.0


def bench_settings(settings: Settings, dsn: str) -> Settings:
    config = {"kind": "numeric", "length": KEY_LENGTH, "ledger": True}
    return Settings.model_validate(
        settings.model_dump()
        | {"postgres_dsn": dsn, "postgres_fence": True, "id_types": {LEDGER_TYPE: config}}
    )


def _entry(first: int) -> dict[str, str]:
    keys = " ".join(spread_key(n, KEY_LENGTH) for n in range(first, first + ENTRY_KEYS))
    clients = " ".join(f"client-{n % 7}" for n in range(first, first + ENTRY_KEYS))
    return {"op": "issue", "type": LEDGER_TYPE, "keys": keys, "clients": clients}


async def _append(client: aioredis.Redis, stream: str, first: int, entries: int) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for n in range(entries):
            pipe.xadd(stream, _entry(first + n * ENTRY_KEYS))  # type: ignore[arg-type]
        await pipe.execute()


def _producer(url: str, stream: str, first: int, rate: float, seconds: float, go: Any) -> None:
    asyncio.run(_produce(url, stream, first, rate, seconds, go))


async def _produce(
    url: str, stream: str, first: int, rate: float, seconds: float, go: EventType
) -> None:
    """Append issues at ``rate`` keys/s for ``seconds``, in steps of PIPELINE_ENTRIES."""
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await asyncio.to_thread(go.wait, START_DEADLINE_S)
        started, sent = time.monotonic(), 0
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(rate * elapsed) - sent
            if due < PIPELINE_ENTRIES * ENTRY_KEYS:
                await asyncio.sleep(0.005)
                continue
            await _append(client, stream, first + sent, PIPELINE_ENTRIES)
            sent += PIPELINE_ENTRIES * ENTRY_KEYS
    finally:
        await client.aclose()


def _drainer(settings: Settings, name: str, go: Any, stop: Any, ready: Any, out: Any) -> None:
    logging.getLogger("shared.stores").setLevel(logging.ERROR)
    out.put(asyncio.run(_drain(settings, name, go, stop, ready)))


async def _drain(
    settings: Settings, name: str, go: EventType, stop: EventType, ready: Any
) -> dict[str, float]:
    """One keysync's drain: from the common start until ``stop`` and the stream empty."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    sync = SyncRecord.from_settings(settings)
    stream = LedgerStream.from_settings(settings)
    types = build_id_types(settings, generating=False)
    keysync = settings.keysync
    drain = LedgerDrain(
        stream,
        cold,
        types,
        name,
        keysync.ledger_batch,
        keysync.ledger_claim_idle_s,
        guard=GuardedCold(cold, sync, types),
        retain_s=keysync.ledger_retain_s,
        sync=sync,
    )
    try:
        await drain.drain_once(block_ms=10)  # the consumer group, the record
        ready.put(os.getpid())
        await asyncio.to_thread(go.wait, START_DEADLINE_S)
        started, applied, last = time.monotonic(), 0, time.monotonic()
        while True:
            done = await drain.drain_once(block_ms=100)
            if done is not None:
                applied, last = applied + done.issued, time.monotonic()
            elif stop.is_set():
                break
        return {"applied": applied, "started": started, "ended": last}
    finally:
        await cold.close()
        await stream.close()
        await sync.close()


async def _backlog(client: aioredis.Redis, stream: str) -> int:
    return int(await client.xlen(stream))


async def measure(
    settings: Settings, client: aioredis.Redis, processes: int, rate: float, seconds: float
) -> dict[str, Any]:
    """Both measures (module docstring) with ``processes`` keysyncs."""
    base = 10**10 * (processes + 1)
    keys = max(ENTRY_KEYS * PIPELINE_ENTRIES, int(rate * seconds))
    vacuums = await _autovacuums(settings.postgres_dsn)
    drained = await _run(settings, client, processes, None, _filled(settings, client, base, keys))
    sustained = await _run(settings, client, processes, (base + keys, rate, seconds))
    vacuums = {k: v - vacuums[k] for k, v in (await _autovacuums(settings.postgres_dsn)).items()}
    return {
        "drain": drained,
        "sustained": sustained,
        **await _retained(settings, client),
        "autovacuum_runs": vacuums,  # on the ledger table, during the two measures
    }


async def _autovacuums(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables"
            " WHERE relid = $1::text::regclass",
            sql.ledger_table(LEDGER_TYPE).strip('"'),
        )
    finally:
        await conn.close()
    assert row is not None
    return {"vacuum": int(row["autovacuum_count"]), "analyze": int(row["autoanalyze_count"])}


async def _retained(settings: Settings, client: aioredis.Redis) -> dict[str, Any]:
    """What keeping the ledger log (ledger_retain_s) costs in Redis memory."""
    log = redis_keys.ledger_log_key(settings.redis_namespace)
    links = int(await client.xlen(log))
    used = int(await client.memory_usage(log, samples=0) or 0)
    return {
        "log_links": links,
        "log_bytes": used,
        "log_bytes_per_link": round(used / links, 1) if links else None,
    }


async def _run(
    settings: Settings,
    client: aioredis.Redis,
    processes: int,
    produce: tuple[int, float, float] | None,
    fill: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    stream = redis_keys.ledger_stream_key(settings.redis_namespace)
    context = multiprocessing.get_context("spawn")
    go, stop, ready, out = context.Event(), context.Event(), context.Queue(), context.Queue()
    workers = [
        context.Process(target=_drainer, args=(settings, f"bench-{n}", go, stop, ready, out))
        for n in range(processes)
    ]
    producer = None
    if produce is not None:
        first, rate, seconds = produce
        producer = context.Process(
            target=_producer, args=(settings.redis_url, stream, first, rate, seconds, go)
        )
        workers.append(producer)
    for worker in workers:
        worker.start()
    samples: list[int] = []
    try:
        await asyncio.to_thread(_gather, ready, processes, workers, START_DEADLINE_S)
        if fill is not None:
            await fill()
        go.set()
        started = time.monotonic()
        if producer is not None:
            while producer.is_alive():
                samples.append(await _backlog(client, stream))
                await asyncio.sleep(1.0)
        stop.set()
        runs = await asyncio.to_thread(_gather, out, processes, workers, DRAIN_DEADLINE_S)
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    applied = sum(int(r["applied"]) for r in runs)
    elapsed = max(r["ended"] for r in runs) - min(r["started"] for r in runs)
    result: dict[str, Any] = {
        "keys_applied": applied,
        "keys_per_s": round(applied / elapsed) if elapsed > 0 else 0,
        "keys_per_s_per_keysync": round(applied / elapsed / processes) if elapsed > 0 else 0,
        "seconds": round(elapsed, 3),
    }
    if produce is not None:
        result |= {
            "offered_keys_per_s": produce[1],
            "produced_for_s": round(time.monotonic() - started, 1),
            "backlog_entries_sampled": samples,
            "backlog_entries_max": max(samples, default=0),
            "backlog_flat": bool(samples) and samples[-1] <= max(2 * samples[0], 1_000),
        }
    return result


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    rate = options.rate or DEFAULT_RATE
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    database = f"kd_bench_ledger_{os.getpid()}"
    report: dict[str, Any] = {
        "benchmark": "ledger",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "keys_per_entry": ENTRY_KEYS,
        "offered_keys_per_s": rate,
        "seconds": seconds,
        "ledger_retain_s": settings.keysync.ledger_retain_s,
        "existing_rows": options.existing_rows,
    }
    scratch = False
    try:
        await refuse_unless_scratch(client, settings.redis_namespace, "ledger")
        scratch = True
        dsn = await scratch_database(settings.postgres_dsn, database)
        local = bench_settings(settings, dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, build_id_types(local))
        finally:
            await conn.close()
        if rows := options.existing_rows:
            report["load"] = await load_ledger(dsn, LEDGER_TYPE, rows, KEY_LENGTH)
            report["after_checkpoint"] = await after_checkpoint(local, client, rows)
        for count in options.processes:
            report[f"keysyncs_{count}"] = await measure(local, client, count, rate, seconds)
            await _forget_measured(dsn, bool(options.existing_rows))
        first = report[f"keysyncs_{options.processes[0]}"]
        report["keys_per_s"] = first["drain"]["keys_per_s"]
    finally:
        if scratch:
            await clear(client, settings.redis_namespace, LEDGER_TYPE)
        await client.aclose()
        await drop_database(settings.postgres_dsn, database)
    return report


async def after_checkpoint(settings: Settings, client: aioredis.Redis, rows: int) -> dict[str, Any]:
    """The drain right after a checkpoint, unmeasured by the figures that follow: each
    index page's first change after a checkpoint writes the whole page to the WAL, and
    inserts spread over a large index change a new page nearly every time until most
    have been changed once. A registry in service pays this after each checkpoint
    (``checkpoint_timeout``); the measures after it are the ledger between two."""
    keys = max(ENTRY_KEYS * PIPELINE_ENTRIES, rows // WARMUP_SHARE)
    return await _run(settings, client, 1, None, _filled(settings, client, WARMUP_BASE, keys))


def _filled(
    settings: Settings, client: aioredis.Redis, first: int, keys: int
) -> Callable[[], Awaitable[None]]:
    """Fills the stream with ``keys`` issues from key number ``first``: called once the
    keysyncs are ready (their first turn made the consumer group) and before they go,
    so every key is drained inside the measure."""
    stream = redis_keys.ledger_stream_key(settings.redis_namespace)

    async def fill() -> None:
        for at in range(0, keys, ENTRY_KEYS * PIPELINE_ENTRIES):
            await _append(client, stream, first + at, PIPELINE_ENTRIES)

    return fill


async def _forget_measured(dsn: str, loaded: bool) -> None:
    """The rows a measure added go (the loaded ones stay), and their dead tuples."""
    ledger = sql.ledger_table(LEDGER_TYPE)
    conn = await asyncpg.connect(dsn)
    try:
        if not loaded:
            await conn.execute(f"TRUNCATE {ledger}")
            return
        await conn.execute(f"DELETE FROM {ledger} WHERE entry_id NOT LIKE '{LOADED_ENTRY}%'")
        await conn.execute(f"VACUUM {ledger}")
    finally:
        await conn.close()
