"""``keydispenser bench keygen``: generation and generation+storage throughput."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from typing import Any

import asyncpg

from keygen.generation import Generator
from keygen.main import Keygen
from shared.cli.databases import drop_database, scratch_database
from shared.domain.config import Settings
from shared.domain.idtypes import IdType, build_id_types
from shared.ops.bench import Options
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.schema import migrate

# Name in the results -> ID type definition.
BENCH_TYPES: dict[str, dict[str, Any]] = {
    "numeric10": {"kind": "numeric", "length": 10},
    "numeric12": {"kind": "numeric", "length": 12},
    "numeric16": {"kind": "numeric", "length": 16},
    "base62_7": {"kind": "base62", "length": 7},
}
_RANGE = 1 << 20


def bench_settings(settings: Settings, dsn: str) -> Settings:
    types = {
        name: {**spec, "range_size": _RANGE, "cold": {"low": 10**8, "high": 10**9 - 1}}
        for name, spec in BENCH_TYPES.items()
    }
    return Settings.model_validate(settings.model_dump() | {"postgres_dsn": dsn, "id_types": types})


async def generation_only(id_type: IdType, threads: int, seconds: float) -> dict[str, float]:
    generator = Generator(threads)
    try:
        await generator.generate(id_type, 0, 1 << 16)  # warm up tables and threads
        started, start, keys, candidates = time.perf_counter(), 1 << 20, 0, 0
        while time.perf_counter() - started < seconds:
            got, tried = await generator.generate(id_type, start, start + _RANGE)
            keys, candidates, start = keys + len(got), candidates + tried, start + _RANGE
        elapsed = time.perf_counter() - started
    finally:
        generator.close()
    return {
        "candidates_per_s": candidates / elapsed,
        "valid_per_s": keys / elapsed,
        "acceptance": keys / candidates,
    }


async def stored(settings: Settings, name: str, seconds: float) -> float:
    """Committed keys/s of one keygen (leasing, generating, COPYing) for ``name``."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    generator = Generator(settings.keygen.threads)
    try:
        # A scratch database: no PostgreSQL fence (its record would be the real one's).
        keygen = Keygen.on_postgres(settings, cold, None, asyncio.Event(), generator)
        id_type = build_id_types(settings)[name]
        before = (await cold.range_stats(name))["accepted"]
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            await keygen.lease_and_generate(id_type)
        elapsed = time.perf_counter() - started
        return ((await cold.range_stats(name))["accepted"] - before) / elapsed
    finally:
        generator.close()
        await cold.close()


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    threads = settings.keygen.threads or os.cpu_count() or 1
    results: dict[str, Any] = {
        "benchmark": "keygen",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "threads": threads,
        "seconds_per_measure": seconds,
    }
    types = build_id_types(bench_settings(settings, settings.postgres_dsn))
    for name, id_type in types.items():
        for label, n in (("", threads), ("_1thread", 1)):
            figures = await generation_only(id_type, n, seconds)
            results[f"{name}{label}_candidates_per_s"] = round(figures["candidates_per_s"])
            results[f"{name}{label}_valid_per_s"] = round(figures["valid_per_s"])
        results[f"{name}_acceptance"] = round(figures["acceptance"], 5)
    database = f"kd_bench_{os.getpid()}"
    dsn = await scratch_database(settings.postgres_dsn, database)
    try:
        local = bench_settings(settings, dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, build_id_types(local))
        finally:
            await conn.close()
        for name in BENCH_TYPES:
            results[f"{name}_stored_per_s"] = round(await stored(local, name, seconds))
    finally:
        await drop_database(settings.postgres_dsn, database)
    return results
