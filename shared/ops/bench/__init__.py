"""``keydispenser bench TARGET``: throughput measures that write JSON results.

Benchmarks are operator tooling: they live apart from the process packages and from the
tests, and tests never assert their figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.domain.settings import Settings

TARGETS = (
    "keygen",
    "fence",
    "dispense",
    "fastpath",
    "snowflake",
    "keysync",
    "pipeline",
    "client",
)
# Benchmarks generate into scratch databases: any permutation key will do there.
BENCH_PERMUTATION_KEY = "keydispenser-benchmark-key"


@dataclass(frozen=True)
class Options:
    """What the command line passes to a benchmark beyond ``--seconds``."""

    load: str = "auto"  # dispense: the load generator
    processes: tuple[int, ...] = (1, 2)  # keysync: process counts measured
    sync_batch: int = 0  # keysync: keys per batch (0: the product default)
    keysyncs: int = 1  # pipeline: keysync processes
    servers: tuple[str, ...] = ("uvicorn", "granian")  # dispense: HTTP servers measured
    rate: float | None = None  # pipeline: keys/s offered (0: full speed; None: its default)


async def run(target: str, settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    """Run one benchmark; the modules load lazily (the dispense bench needs aiohttp)."""
    if target == "keygen":
        from shared.ops.bench import keygen

        return await keygen.run(settings, seconds)
    if target == "fence":
        from shared.ops.bench import fence

        return await fence.run(settings, seconds)
    if target == "dispense":
        from shared.ops.bench import dispense

        return await dispense.run(settings, seconds, options.load, options.servers)
    if target == "fastpath":
        from shared.ops.bench import fastpath

        return await fastpath.run(settings, seconds)
    if target == "keysync":
        from shared.ops.bench import keysync

        return await keysync.run(settings, seconds, options.processes, options.sync_batch)
    if target == "pipeline":
        from shared.ops.bench import pipeline

        rate = pipeline.DEFAULT_RATE if options.rate is None else options.rate
        return await pipeline.run(settings, seconds, options.keysyncs, rate)
    if target == "client":
        from shared.ops.bench import client

        return await client.run(settings, seconds)
    if target == "snowflake":
        from shared.ops.bench import snowflake

        return await snowflake.run(settings, seconds, options.load)
    raise ValueError(f"unknown benchmark {target!r}")
