"""``keydispenser bench import``: `keydispenser import` of ``--rows`` IDs (rows/s, memory,
a rerun), and keygen's stored keys/s with those IDs excluded against a type without.

The IDs are keys keygen would generate (so that keygen has to leave them out): one key
in a hundred of the first counters (the ranges keygen leases while measured: as dense
as 10^7 excluded in a 10^9 keyspace), the rest from the middle of the keyspace.
"""

from __future__ import annotations

import os
import platform
import resource
import tempfile
import time
from typing import IO, Any

import asyncpg

from keydispenser_ops.bench import Options
from keydispenser_ops.bench.keygen import stored
from shared.cli.imports import file_plan, import_type
from shared.domain.config import Settings
from shared.domain.idtypes import IdType, build_id_types
from shared.stores.postgres.databases import drop_database, scratch_database
from shared.stores.postgres.schema import migrate

_RANGE = 1 << 20
_SPEC = {"kind": "numeric", "length": 10, "range_size": _RANGE}
DENSE_COUNTERS = 64 * _RANGE  # what keygen may lease while measured, 1% of it excluded


def bench_settings(settings: Settings, dsn: str) -> Settings:
    cold = {"low": 10**8, "high": 10**9 - 1}
    types = {name: {**_SPEC, "cold": cold} for name in ("imported", "plain")}
    return Settings.model_validate(settings.model_dump() | {"postgres_dsn": dsn, "id_types": types})


def write_ids(id_type: IdType, rows: int, out: IO[str]) -> None:
    """``rows`` keys of the type, a block at a time: 1 in 100 of its first counters,
    then the keys of a stretch from the middle of its keyspace."""
    left = rows
    for start in range(0, DENSE_COUNTERS, _RANGE):
        if left <= 0:
            return
        block, _ = id_type.generate(start, start + _RANGE)
        left -= _write(block[::100][:left], out)
    start = id_type.domain_size // 2
    while left > 0:
        block, _ = id_type.generate(start, start + _RANGE)
        left -= _write(block[:left], out)
        start += _RANGE


def _write(keys: list[str], out: IO[str]) -> int:
    out.write("".join(f"{key}\n" for key in keys))
    return len(keys)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    results: dict[str, Any] = {
        "benchmark": "import",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": options.rows,
        "seconds_per_measure": seconds,
    }
    database = f"kd_bench_import_{os.getpid()}"
    dsn = await scratch_database(settings.postgres_dsn, database)
    try:
        local = bench_settings(settings, dsn)
        types = build_id_types(local)
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, types)
        finally:
            await conn.close()
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
            write_ids(types["imported"], options.rows, listing)
            listing.flush()
            rss = _rss_mb()
            results["rss_before_mb"] = round(rss, 1)
            for label in ("first", "again"):
                plan = file_plan(listing.name, "imported", "ISSUED")
                started = time.perf_counter()
                report = await import_type(local, types["imported"], plan, None, False)
                elapsed = time.perf_counter() - started
                results[f"{label}_s"] = round(elapsed, 2)
                results[f"{label}_rows_per_s"] = round(report["rows_read"] / elapsed)
                results[f"{label}_excluded_added"] = report["excluded_added"]
            results["max_rss_growth_mb"] = round(_rss_mb() - rss, 1)
        # The import's rows vacuumed first (autovacuum would, during the measures).
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("VACUUM (ANALYZE) kd_excluded")
        finally:
            await conn.close()
        # In turn, twice each, the best kept: a machine's load drifts during a run.
        for name in ("plain", "imported", "imported", "plain"):
            found = await stored(local, name, seconds)
            key = f"keygen_{name}_stored_per_s"
            results[key] = max(results.get(key, 0), round(found["stored_per_s"]))
    finally:
        await drop_database(settings.postgres_dsn, database)
    return results
