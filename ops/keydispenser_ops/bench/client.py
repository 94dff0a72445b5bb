"""``keydispenser bench client``: keys per second one caller process takes through the
Python client (``keydispenser_client``), sync and async.

A real dispenser process serves a hot list filled with synthetic keys (the dispenser
never looks inside keys) in the Redis database at ``redis_url`` (a scratch one: the
bench refuses one holding keydispenser state). One caller takes keys one at a time in
a loop for ``--seconds`` while the client's background fetchers refill its buffer
with batches of 5,000, four requests in flight. Every key taken comes from the
dispenser over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import yaml

from keydispenser_client import AsyncKeyClient, Buffering, KeyClient
from keydispenser_ops.bench import BENCH_PERMUTATION_KEY, Options
from keydispenser_ops.bench.dispense import FILL_SCRIPT
from keydispenser_ops.bench.scratch import clear, refuse_unless_scratch
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, scrubbed_env, serving, spawn, stop_process
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import KeydispenserError
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint

CLIENT_TYPE = "kd_bench_client"
# Four requests in flight: the caller outruns one fetcher, which waits on the
# dispenser's answer for most of each round trip (docs/benchmarks.md).
BUFFERING = Buffering(batch=5_000, low=50_000, high=100_000, fetchers=4)
# Hot keys per second of --seconds, filled before each variant (12 bytes a key in Redis).
KEYS_PER_SECOND_SIZING = 5_000_000
CHECK_EVERY = 10_000  # takes between two looks at the clock
# Takes between two yields of the async caller to the event loop (where the fetcher
# runs): a caller that does some I/O per thousand keys.
ASYNC_YIELD_EVERY = 1_000
START_DEADLINE_S = 60.0
TARGETS = {"keys_per_s": 1_000_000}


async def _fill(settings: Settings, client: aioredis.Redis, first: int, count: int) -> None:
    """The hot list, emptied, then holding keys ``first`` .. ``first + count - 1``."""
    store = HotStore(RedisEndpoint(settings.redis_url), settings.redis_namespace)
    try:
        await store.observe(CLIENT_TYPE)  # the fence takes ownership before the fill
    finally:
        await store.close()
    ns = settings.redis_namespace
    hot, step = redis_keys.hot_list_key(ns, CLIENT_TYPE), 500_000
    await client.delete(hot)  # what a previous variant left
    for start in range(first, first + count, step):
        end = min(start + step, first + count) - 1
        await client.eval(FILL_SCRIPT, 2, hot, redis_keys.hot_registry_key(ns), start, end)


def _warm(depth: Callable[[], int]) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while depth() < BUFFERING.mark_high:
        if time.monotonic() > deadline:
            raise KeydispenserError("bench client: the buffer never filled")
        time.sleep(0.01)


def take_sync(url: str, seconds: float) -> dict[str, float]:
    with KeyClient(url, CLIENT_TYPE, buffering=BUFFERING) as client:
        _warm(lambda: client.depth)
        take, taken = client.take, 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            for _ in range(CHECK_EVERY):
                take()
            taken += CHECK_EVERY
        elapsed = time.perf_counter() - started
    return {"keys_per_s": taken / elapsed, "keys": taken}


async def take_async(url: str, seconds: float) -> dict[str, float]:
    async with AsyncKeyClient(url, CLIENT_TYPE, buffering=BUFFERING) as client:
        await asyncio.to_thread(_warm, lambda: client.depth)
        take, take_nowait, taken = client.take, client.take_nowait, 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            for _ in range(ASYNC_YIELD_EVERY):
                take_nowait() or await take()  # awaits only when the buffer is empty
            taken += ASYNC_YIELD_EVERY
            await asyncio.sleep(0)  # a caller does I/O now and then: the fetchers run
        elapsed = time.perf_counter() - started
    return {"keys_per_s": taken / elapsed, "keys": taken}


def _config(settings: Settings, work: Path, port: int) -> Path:
    config = work / "client.yaml"
    values = {
        "postgres_dsn": settings.postgres_dsn,
        "redis_url": settings.redis_url,
        "redis_namespace": settings.redis_namespace,
        "log_level": "WARNING",
        "id_types": {CLIENT_TYPE: {"kind": "numeric", "length": 10, "hot": {"low": 0, "high": 1}}},
        "dispenser": {"port": port, "max_batch": BUFFERING.batch, "idempotency_ttl_s": 60},
    }
    config.write_text(yaml.safe_dump(values))
    return config


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    redis_client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    port = free_port()
    process = None
    scratch = False  # found to be a scratch database: this run's to tidy
    try:
        await refuse_unless_scratch(redis_client, settings.redis_namespace, "client")
        scratch = True
        per_variant = round(KEYS_PER_SECOND_SIZING * seconds) + 300_000
        await _fill(settings, redis_client, 0, per_variant)
        with tempfile.TemporaryDirectory(prefix="kd-bench-client-") as work:
            env = scrubbed_env(
                KD_CONFIG=str(_config(settings, Path(work), port)),
                KD_PERMUTATION_KEY=BENCH_PERMUTATION_KEY,
            )
            process = spawn(cli_command("dispenser"), env, "stderr_only")
            url = f"http://127.0.0.1:{port}"
            if not serving(f"{url}/healthz", START_DEADLINE_S):
                raise KeydispenserError("bench client: the dispenser did not start")
            sync = await asyncio.to_thread(take_sync, url, seconds)
            # Keys the sync variant never had, as many again: neither runs dry.
            await _fill(settings, redis_client, per_variant, per_variant)
            aio = await take_async(url, seconds)
    finally:
        stop_process(process)
        if scratch:  # never the state of a database it refused
            await clear(redis_client, settings.redis_namespace, CLIENT_TYPE)
        await redis_client.aclose()
    return {
        "benchmark": "client",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds_each": seconds,
        "batch": BUFFERING.batch,
        "buffer_marks": [BUFFERING.mark_low, BUFFERING.mark_high],
        "fetchers": BUFFERING.fetchers,
        "keys_per_s": round(sync["keys_per_s"]),
        "keys_taken": int(sync["keys"]),
        "async_keys_per_s": round(aio["keys_per_s"]),
        "async_keys_taken": int(aio["keys"]),
        "async_take": "take_nowait() or await take()",
        "targets": TARGETS,
        "targets_met": sync["keys_per_s"] >= TARGETS["keys_per_s"],
    }
