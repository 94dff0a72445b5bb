"""``keydispenser bench fence``: the fenced pop against the same pop without the fence."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import redis.asyncio as aioredis

from keydispenser_ops.bench import Options
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.hot.hot_store import pop_keys
from shared.stores.redis.scripts import fenced_script, load_script

# The ID type whose hot list this bench pops from (one it fills itself).
FENCE_TYPE = "kd_bench_fence"
CONCURRENCY = 32
ARGS: list[str | int] = [1, "", "-"]  # one key, no ledger


async def _measure(
    client: aioredis.Redis, body: str, seconds: float, namespace: str
) -> dict[str, float]:
    script = client.register_script(body)
    hot = redis_keys.hot_list_key(namespace, FENCE_TYPE)
    keys = pop_keys(namespace, FENCE_TYPE)
    await client.delete(hot)
    await client.rpush(hot, *[f"k{i}" for i in range(200_000)])
    await script(keys=keys, args=ARGS)  # load it; the fence takes ownership once here
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds / 2
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await script(keys=keys, args=ARGS)
        latencies.append(time.perf_counter() - started)
    count = 0
    deadline = time.perf_counter() + seconds / 2
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await script(keys=keys, args=ARGS)
            count += 1

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    await client.delete(hot)
    latencies.sort()
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "pops_per_s": count / elapsed,
    }


def _unfenced_pop() -> str:
    return load_script("ledger") + "\n" + load_script("pop").replace("enforce_fence()", "0")


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    """Against ``redis_url`` (use a scratch database: the bench writes a list there)."""
    client = aioredis.Redis.from_url(
        settings.redis_url, decode_responses=True, max_connections=CONCURRENCY + 4
    )
    try:
        plain = await _measure(client, _unfenced_pop(), seconds, settings.redis_namespace)
        fenced = await _measure(client, fenced_script("pop"), seconds, settings.redis_namespace)
    finally:
        await client.aclose()
    return {
        "benchmark": "fence",
        "redis_url": settings.redis_url,
        "concurrency": CONCURRENCY,
        **{f"plain_pop_{k}": round(v, 1) for k, v in plain.items()},
        **{f"fenced_pop_{k}": round(v, 1) for k, v in fenced.items()},
        "fenced_throughput_ratio": round(fenced["pops_per_s"] / plain["pops_per_s"], 3),
    }
