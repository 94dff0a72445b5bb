"""``keydispenser bench lifecycle``: MOSIP's ``PUT /v1/idgenerator/uin`` and the ledger
lookup (``GET /v1/keys/{type}/{key}``), p50/p99 under a steady load, on a ledger that
holds ``--existing-rows`` rows of a registry's past (``registry.load_ledger``).

A scratch PostgreSQL database holds one MOSIP UIN type (``kd_bench_uin``: numeric,
length 10, MOSIP's filters, a ledger, released UINs issued again later); its ledger is
loaded with the registry's rows and with PROBES of its own valid UINs issued to the
anonymous client and not used yet (the PUTs' targets). keysync and a dispenser (MOSIP's
API on, no API keys) run as the processes they are, on that database and on the scratch
Redis database. For ``--seconds`` an open-loop load (each request timed from when it was
due, so a slow answer delays no later request's clock) sends ``--rate`` PUTs a second,
ASSIGNED and UNASSIGNED of fresh UINs in turn, and LOOKUPS_PER_PUT lookups for each,
half of probes, half of the registry's rows (another client's: answered as never
issued, after the same index lookup). Dead tuples of the ledger are sampled each second.
Then ``keydispenser status`` (the process, start to end) and ``/readyz`` are timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import redis.asyncio as aioredis
import yaml

from keydispenser_ops.bench import BENCH_PERMUTATION_KEY, Options
from keydispenser_ops.bench.dispense import BenchServer
from keydispenser_ops.bench.registry import load_ledger, sizes, spread_key
from keydispenser_ops.bench.scratch import clear, refuse_unless_scratch
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, run_cli, scrubbed_env, spawn, stop_process
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.postgres import sql
from shared.stores.postgres.databases import drop_database, run_migrate, scratch_database

UIN_TYPE: Final = "kd_bench_uin"
LENGTH: Final = 10
TYPE_CONFIG: Final = {
    "kind": "numeric",
    "length": LENGTH,
    "filter_profile": "mosip",
    "ledger": True,
    "reissue_released": True,
    "reissue_after_s": 86_400,
}
DEFAULT_RATE: Final = 50.0  # PUTs a second
LOOKUPS_PER_PUT: Final = 10
MAX_IN_FLIGHT: Final = 256  # requests open at once; more due are counted as shed
ANONYMOUS: Final = "-"  # the client of requests when no API keys are configured
READYZ_SAMPLES: Final = 5
SERVING_DEADLINE_S: Final = 60.0
DEAD_TUPLES: Final = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::text::regclass"


def probes(settings: Settings, count: int) -> list[str]:
    """``count`` valid UINs of the type, from its own generator."""
    id_type = build_id_types(settings)[UIN_TYPE]
    found: list[str] = []
    start = 0
    while len(found) < count:
        keys, _ = id_type.generate(start, start + 4 * count)
        found.extend(keys)
        start += 4 * count
    return found[:count]


async def _load_probes(dsn: str, keys: list[str]) -> None:
    issued = datetime.now(UTC) - timedelta(days=1)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.copy_records_to_table(
            sql.ledger_table(UIN_TYPE).strip('"'),
            records=[(k, issued, ANONYMOUS, f"loaded-probe-{n // 20}") for n, k in enumerate(keys)],
            columns=["key", "issued_at", "client", "entry_id"],
        )
        await conn.execute(f"VACUUM (ANALYZE) {sql.ledger_table(UIN_TYPE)}")
    finally:
        await conn.close()


class Load:
    """An open-loop load: requests started when due, timed from then."""

    def __init__(self, base: str, uins: list[str], registry_rows: int) -> None:
        self.base, self.uins, self.rows = base, uins, registry_rows
        self.puts: list[float] = []
        self.lookups: list[float] = []
        self.errors: dict[str, int] = {}
        self.shed = 0
        self.sent = {"put": 0, "lookup": 0}
        self._in_flight = 0
        self._next_uin = 0

    async def run(self, rate: float, seconds: float) -> None:
        lookup_rate = rate * LOOKUPS_PER_PUT
        connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
        async with aiohttp.ClientSession(connector=connector) as session:
            started, puts, lookups = time.monotonic(), 0, 0
            tasks: set[asyncio.Task[None]] = set()
            while (elapsed := time.monotonic() - started) < seconds:
                while puts < rate * elapsed:
                    self._start(tasks, self._put(session, started + puts / rate, puts))
                    puts += 1
                while lookups < lookup_rate * elapsed:
                    self._start(tasks, self._lookup(session, started + lookups / lookup_rate))
                    lookups += 1
                await asyncio.sleep(0.002)
            if tasks:
                await asyncio.wait(tasks, timeout=30)
            self.sent = {"put": puts, "lookup": lookups}

    def _start(self, tasks: set[asyncio.Task[None]], request: Any) -> None:
        if self._in_flight >= MAX_IN_FLIGHT:
            request.close()
            self.shed += 1
            return
        task = asyncio.create_task(request)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _put(self, session: aiohttp.ClientSession, due: float, n: int) -> None:
        uin = self.uins[self._next_uin % len(self.uins)]
        self._next_uin += 1
        status = "ASSIGNED" if n % 2 == 0 else "UNASSIGNED"
        body = {"id": "mosip.kernel.uinstatus.update", "version": "1.0",
                "request": {"uin": uin, "status": status}}  # fmt: skip
        url = f"{self.base}/v1/idgenerator/uin"
        async with self._timed(self.puts, "put", due), session.put(url, json=body) as answer:
            found = await answer.json()
            if answer.status != 200 or found.get("errors"):
                self._error(f"put {found.get('errors') or answer.status}")

    async def _lookup(self, session: aiohttp.ClientSession, due: float) -> None:
        if random.random() < 0.5 or not self.rows:
            key = random.choice(self.uins)
        else:
            key = spread_key(random.randrange(self.rows), LENGTH)
        url = f"{self.base}/v1/keys/{UIN_TYPE}/{key}"
        async with self._timed(self.lookups, "lookup", due), session.get(url) as answer:
            await answer.read()
            if answer.status != 200:
                self._error(f"lookup {answer.status}")

    def _timed(self, into: list[float], what: str, due: float) -> Any:
        load = self

        class Timed:
            async def __aenter__(self) -> None:
                load._in_flight += 1

            async def __aexit__(self, kind: object, exc: object, tb: object) -> bool:
                load._in_flight -= 1
                if exc is not None:
                    load._error(f"{what} {type(exc).__name__}")
                    return True
                into.append((time.monotonic() - due) * 1000)
                return False

        return Timed()

    def _error(self, what: str) -> None:
        self.errors[what[:120]] = self.errors.get(what[:120], 0) + 1


def percentiles(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"count": len(ordered), "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def _sample(
    dsn: str, redis_url: str, namespace: str, stop: asyncio.Event, into: list[dict[str, float]]
) -> None:
    """Each second: the ledger's dead tuples (autovacuum keeping up), and what Redis
    holds for the ledger (its stream and log, entries) and in all (MB)."""
    conn = await asyncpg.connect(dsn)
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    ledger = sql.ledger_table(UIN_TYPE).strip('"')
    stream, log = redis_keys.ledger_stream_key(namespace), redis_keys.ledger_log_key(namespace)
    try:
        while not stop.is_set():
            memory = await client.info("memory")
            into.append(
                {
                    "dead_tuples": int(await conn.fetchval(DEAD_TUPLES, ledger) or 0),
                    "stream_entries": int(await client.xlen(stream)),
                    "log_entries": int(await client.xlen(log)),
                    "redis_used_mb": round(int(memory["used_memory"]) / 2**20, 1),
                }
            )
            await asyncio.sleep(1.0)
    finally:
        await conn.close()
        await client.aclose()


async def _serving(base: str, uin: str) -> None:
    """Wait until the stack answers a PUT (keysync has applied and recorded a change:
    the measures start from a stack in service, not from its first turn)."""
    body = {"request": {"uin": uin, "status": "ASSIGNED"}}
    deadline = time.monotonic() + SERVING_DEADLINE_S
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.put(f"{base}/v1/idgenerator/uin", json=body) as answer:
                found = await answer.json()
            if answer.status == 200 and not found.get("errors"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stack did not serve a PUT in {SERVING_DEADLINE_S} s")
            await asyncio.sleep(0.2)


async def _readyz_ms(base: str) -> float:
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(READYZ_SAMPLES):
            started = time.monotonic()
            async with session.get(f"{base}/readyz") as answer:
                await answer.read()
            times.append((time.monotonic() - started) * 1000)
    return round(statistics.median(times), 2)


def _status_s(env: dict[str, str]) -> float:
    started = time.monotonic()
    result = run_cli("status", "--json", env=env, timeout_s=120)
    if result.returncode != 0:
        raise RuntimeError(f"status failed: {result.stderr[-2000:]}")
    json.loads(result.stdout)
    return round(time.monotonic() - started, 3)


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    rate = options.rate or DEFAULT_RATE
    rows = options.existing_rows
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    database = f"kd_bench_lifecycle_{os.getpid()}"
    report: dict[str, Any] = {
        "benchmark": "lifecycle",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "existing_rows": rows,
        "puts_per_s": rate,
        "lookups_per_s": rate * LOOKUPS_PER_PUT,
        "seconds": seconds,
    }
    scratch = False
    try:
        await refuse_unless_scratch(client, settings.redis_namespace, "lifecycle")
        scratch = True
        dsn = await scratch_database(settings.postgres_dsn, database)
        with tempfile.TemporaryDirectory(prefix="kd-bench-lifecycle-") as work:
            local = {
                "postgres_dsn": dsn,
                "redis_url": settings.redis_url,
                "redis_namespace": settings.redis_namespace,
                "log_level": "WARNING",
                "id_types": {UIN_TYPE: TYPE_CONFIG},
                "dispenser": {"mosip": {"uin": UIN_TYPE}},
            }
            config = Path(work) / "lifecycle.yaml"
            config.write_text(yaml.safe_dump(local))
            bench = Settings.model_validate(local | {"permutation_key": BENCH_PERMUTATION_KEY})
            await run_migrate(bench)
            uins = probes(bench, max(int(rate * seconds * 1.2), 10_000))
            loaded = await load_ledger(dsn, UIN_TYPE, rows, LENGTH, avoid=uins, history=True)
            report["load"] = loaded
            await _load_probes(dsn, uins)
            report |= await _measure(config, bench, uins, rows, rate, seconds)
            conn = await asyncpg.connect(dsn)
            try:
                report["after"] = await sizes(conn, UIN_TYPE)
            finally:
                await conn.close()
    finally:
        if scratch:
            await clear(client, settings.redis_namespace, UIN_TYPE)
        await client.aclose()
        await drop_database(settings.postgres_dsn, database)
    return report


async def _measure(
    config: Path, bench: Settings, uins: list[str], rows: int, rate: float, seconds: float
) -> dict[str, Any]:
    port = free_port()
    env = scrubbed_env(KD_CONFIG=str(config), KD_DISPENSER__PORT=str(port))
    keysync = spawn(cli_command("keysync"), env, "stderr_only")
    try:
        with BenchServer(cli_command("dispenser"), env, port, ready_path="/healthz"):
            base = f"http://127.0.0.1:{port}"
            stop, samples = asyncio.Event(), list[dict[str, float]]()
            sampler = asyncio.create_task(
                _sample(bench.postgres_dsn, bench.redis_url, bench.redis_namespace, stop, samples)
            )
            await _serving(base, uins[-1])
            load = Load(base, uins[:-1], rows)
            await load.run(rate, seconds)
            stop.set()
            await sampler
            readyz = await _readyz_ms(base)
    finally:
        stop_process(keysync)
    status = await asyncio.to_thread(_status_s, env)
    return {
        "put_uin": percentiles(load.puts),
        "lookup": percentiles(load.lookups),
        "sent": load.sent,
        "errors": load.errors,
        "shed": load.shed,
        "sampled": samples[:: max(1, len(samples) // 20)],
        "max": {
            name: max((sample[name] for sample in samples), default=0)
            for name in ("dead_tuples", "stream_entries", "log_entries", "redis_used_mb")
        },
        "readyz_ms": readyz,
        "status_s": status,
    }
