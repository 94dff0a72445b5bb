"""``keydispenser bench keygen``: generation and generation+storage throughput.

``--spent F``: each type's keyspace is a fraction F spent before the measures (the
generator starts at counter F x domain; the stored measure's sequence is set there), as
for a type deep into its life; the stored measure then reports the type's headroom and
its exhaustion forecast (keygen's own ``HeadroomWatch``) beside what it measured.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from typing import Any

import asyncpg

from keydispenser_ops.bench import Options
from keygen.generation import Generator
from keygen.headroom import HeadroomWatch
from keygen.main import Keygen
from shared.domain.config import Settings
from shared.domain.idtypes import IdType, build_id_types
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, scratch_database
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


def first_counter(id_type: IdType, spent: float) -> int:
    """Where a type whose keyspace is ``spent`` starts (room left for a few ranges)."""
    return min(int(id_type.domain_size * spent), id_type.domain_size - 64 * _RANGE)


async def generation_only(
    id_type: IdType, threads: int, seconds: float, spent: float = 0.0
) -> dict[str, float]:
    generator = Generator(threads)
    try:
        await generator.generate(id_type, 0, 1 << 16)  # warm up tables and threads
        first = max(first_counter(id_type, spent), 1 << 20)
        started, start, keys, candidates = time.perf_counter(), first, 0, 0
        while time.perf_counter() - started < seconds:
            got, tried = await generator.generate(id_type, start, start + _RANGE)
            keys, candidates, start = keys + len(got), candidates + tried, start + _RANGE
            if start + _RANGE > id_type.domain_size:
                start = first
        elapsed = time.perf_counter() - started
    finally:
        generator.close()
    return {
        "candidates_per_s": candidates / elapsed,
        "valid_per_s": keys / elapsed,
        "acceptance": keys / candidates,
    }


async def stored(
    settings: Settings, name: str, seconds: float, spent: float = 0.0
) -> dict[str, Any]:
    """Committed keys/s of one keygen (leasing, generating, COPYing) for ``name``; with
    a keyspace ``spent``, its headroom and forecast as keygen sees them after."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    generator = Generator(settings.keygen.threads)
    id_type = build_id_types(settings)[name]
    try:
        if spent:
            async with cold.connection() as conn:
                first = first_counter(id_type, spent)
                await conn.execute(f"SELECT setval('{sql.sequence(name)}', $1)", first)
        # A scratch database: no PostgreSQL fence (its record would be the real one's).
        keygen = Keygen.on_postgres(settings, cold, None, asyncio.Event(), generator)
        watch = HeadroomWatch(id_type.domain_size, ())
        before = await cold.range_stats(name)
        leased_before = await _leased(cold, name)
        started = time.perf_counter()
        watch.observe(started, leased_before, None)
        while time.perf_counter() - started < seconds:
            await keygen.lease_and_generate(id_type)
        elapsed = time.perf_counter() - started
        after = await cold.range_stats(name)
        leased = await _leased(cold, name)
        accepted = after["accepted"] - before["accepted"]
        acceptance = accepted / max(leased - leased_before, 1)
        headroom = watch.observe(time.perf_counter(), leased, acceptance)
        return {
            "stored_per_s": accepted / elapsed,
            "fraction_left": round(headroom.fraction_left, 6),
            "eta_s": round(headroom.eta_s) if headroom.eta_s is not None else None,
            "counters_left": headroom.counters_left,
        }
    finally:
        generator.close()
        await cold.close()


async def _leased(cold: ColdStore, name: str) -> int:
    """Counters the type's sequence has handed out (its next value)."""
    async with cold.connection() as conn:
        row = await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, name))
    assert row is not None
    return int(row["last_value"]) + (1 if row["is_called"] else 0)


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    threads = settings.keygen.threads or os.cpu_count() or 1
    results: dict[str, Any] = {
        "benchmark": "keygen",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "threads": threads,
        "seconds_per_measure": seconds,
        "spent": options.spent,
    }
    types = build_id_types(bench_settings(settings, settings.postgres_dsn))
    for name, id_type in types.items():
        for label, n in (("", threads), ("_1thread", 1)):
            figures = await generation_only(id_type, n, seconds, options.spent)
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
            found = await stored(local, name, seconds, options.spent)
            results[f"{name}_stored_per_s"] = round(found["stored_per_s"])
            if options.spent:
                found.pop("stored_per_s")
                results[f"{name}_headroom"] = found
    finally:
        await drop_database(settings.postgres_dsn, database)
    return results
