"""``bench dispense``'s ledger measure: the single-ID route of a ledger type, with the
default durability (``async``) and with ``replicated`` (WAIT), beside a plain type, in
the same run and on the same servers; and a plain type that holds no keys ahead
(``prefetch: 0``, as a ledger type must), which pops at each (coalesced) request as a
ledger type does: against it, the ledger's own cost, apart from the prefetch's gain.

``replicated`` needs a replica: the measure runs its own Redis primary and replica on
loopback ports (embedded), and the dispenser serves three types from them, each filled
beforehand; one load generator takes each type's route in turn. Its PostgreSQL is a
scratch database: the dispenser never writes it
(no keysync runs; the ledger stream only grows, well below ``ledger_max_backlog``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import yaml

from keydispenser_ops.bench import BENCH_PERMUTATION_KEY
from keydispenser_ops.bench.dispense import FILL_SCRIPT, BenchServer, LoadGenerator
from keydispenser_ops.embedded import EmbeddedRedis, free_port
from keydispenser_ops.processes import cli_command, scrubbed_env
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.databases import drop_database, run_migrate, scratch_database
from shared.stores.redis.endpoint import RedisEndpoint

BASE = {"kind": "numeric", "length": 10, "hot": {"low": 0, "high": 1}}
TYPES: dict[str, dict[str, Any]] = {
    "kd_bench_plain": BASE,
    "kd_bench_popped": BASE | {"prefetch": 0},
    "kd_bench_ledger": BASE | {"ledger": True},
    "kd_bench_replicated": BASE | {"ledger": True, "ledger_durability": "replicated"},
}
KEYS_PER_S = 40_000  # filled per second of each measure, per type (above what one serves)
# Each type's route is taken this many times, in turn with the others, for an equal
# share of the seconds: a ratio is taken between measures seconds apart, in each round,
# and the median of the rounds' reported (on 2 cores the machine's other work moves a
# single measure by more than the ledger costs).
ROUNDS = 4


async def _fill(url: str, namespace: str, name: str, count: int) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    store = HotStore(RedisEndpoint(url), namespace)
    try:
        await store.observe(name)  # the fence owns the server before the fill
        hot = redis_keys.hot_list_key(namespace, name)
        registry = redis_keys.hot_registry_key(namespace)
        for start in range(0, count, 500_000):
            last = min(start + 500_000, count) - 1
            await client.eval(FILL_SCRIPT, 2, hot, registry, start, last)
    finally:
        await store.close()
        await client.aclose()


async def _replicated(primary: EmbeddedRedis, replica: EmbeddedRedis) -> None:
    client = aioredis.Redis.from_url(replica.url)
    try:
        await client.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


async def measure(settings: Settings, seconds: float, load: str) -> dict[str, Any]:
    """rps of each type's single-ID route (the median of ``ROUNDS``), and the ledger
    types' against the plain one and the popped one (the median of each round's ratio)."""
    generator = LoadGenerator(seconds / ROUNDS, load)
    database = f"kd_bench_ledger_dispense_{os.getpid()}"
    dsn = await scratch_database(settings.postgres_dsn, database)
    with tempfile.TemporaryDirectory(prefix="kd-bench-ledger-") as work:
        primary = EmbeddedRedis(Path(work) / "primary")
        replica = EmbeddedRedis(Path(work) / "replica")
        try:
            primary.start()
            replica.start()
            await _replicated(primary, replica)
            local = {
                "postgres_dsn": dsn,
                "redis_url": primary.url,
                "redis_namespace": settings.redis_namespace,
                "log_level": "WARNING",
                "id_types": TYPES,
            }
            config = Path(work) / "ledger.yaml"
            config.write_text(yaml.safe_dump(local))
            secret = {"permutation_key": BENCH_PERMUTATION_KEY}
            await run_migrate(Settings.model_validate(local | secret))
            keys = int(KEYS_PER_S * generator.duration * ROUNDS) + 50_000
            for name in TYPES:
                await _fill(primary.url, settings.redis_namespace, name, keys)
            port = free_port()
            env = scrubbed_env(
                KD_CONFIG=str(config),
                KD_PERMUTATION_KEY=BENCH_PERMUTATION_KEY,
                KD_DISPENSER__PORT=str(port),
            )
            rounds: list[dict[str, dict[str, float]]] = []
            with BenchServer(cli_command("dispenser"), env, port, ready_path="/healthz"):
                for _ in range(ROUNDS):
                    found: dict[str, dict[str, float]] = {}
                    for name in TYPES:
                        url = f"http://127.0.0.1:{port}/v1/idgenerator/{name}/id"
                        found[name] = await generator.run(url)
                    rounds.append(found)
        finally:
            replica.stop()
            primary.stop()
            await drop_database(settings.postgres_dsn, database)
    return _report(rounds)


def _report(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The rounds' medians: each type's rps and p99, and each ratio taken in a round."""

    def rps(name: str) -> int:
        return round(statistics.median(r[name]["rps"] for r in rounds))

    def ratio(name: str, base: str) -> float:
        return round(
            statistics.median(r[name]["rps"] / max(r[base]["rps"], 1.0) for r in rounds), 3
        )

    plain, popped = "kd_bench_plain", "kd_bench_popped"
    ledger, replicated = "kd_bench_ledger", "kd_bench_replicated"
    return {
        "rounds": len(rounds),
        "plain_rps": rps(plain),
        "plain_popped_rps": rps(popped),
        "ledger_async_rps": rps(ledger),
        "ledger_replicated_rps": rps(replicated),
        "ledger_async_vs_plain": ratio(ledger, plain),
        "ledger_replicated_vs_plain": ratio(replicated, plain),
        "plain_popped_vs_plain": ratio(popped, plain),
        "ledger_async_vs_popped": ratio(ledger, popped),
        "ledger_replicated_vs_popped": ratio(replicated, popped),
        "each_round_vs_plain": [
            {name: round(r[name]["rps"] / max(r[plain]["rps"], 1.0), 3) for name in TYPES}
            for r in rounds
        ],
        "p99_ms": {
            name: round(statistics.median(r[name]["p99_ms"] for r in rounds), 3) for name in TYPES
        },
        "non_2xx": {name: sum(r[name]["non_2xx"] for r in rounds) for name in TYPES},
    }
