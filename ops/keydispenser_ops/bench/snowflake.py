"""``keydispenser bench snowflake``: minting in-process, and over HTTP against the ceiling.

One run, one machine:
  a. one process minting in batches from a real machine-ID lease (``inprocess_ids_per_s``);
  b. a bare Starlette endpoint returning a constant JSON body (``bare_rps``);
  c. ``POST /v1/idgenerator/{type}/id`` of a snowflake type (``single_rps``);
  d. ``POST /v1/keys/{type}?count=1000`` (``batch_ids_per_s``).
b to d use the HTTP setup of ``bench dispense`` (uvicorn, 32 connections, the same load
generator), first with one worker, then with one worker per core.

The bench type's layout is 41/8/14 bits: one machine ID can mint 16,384 IDs per
millisecond. The default layout (41/10/12) caps one process at 4,096 per millisecond,
below the in-process target by construction; ``inprocess_default_layout_ids_per_s``
measures it too. Uses the configured ``redis_url`` for the leases: point it at a
scratch database.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from keydispenser_ops.bench import Options
from keydispenser_ops.bench.dispense import (
    BATCH,
    CONNECTIONS,
    BenchServer,
    LoadGenerator,
    uvicorn_argv,
)
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, scrubbed_env
from shared.domain.config import Settings, SnowflakeConfig
from shared.domain.errors import ConfigError
from shared.domain.snowflake import Minter, SnowflakeType
from shared.leases.holder import lease_machine_id
from shared.stores.redis.endpoint import RedisEndpoint

SNOWFLAKE_TYPE = "kd_bench_snowflake"
SNOWFLAKE_TYPE_CONFIG: dict[str, Any] = {
    "kind": "snowflake",
    "bits": {"time": 41, "machine": 8, "sequence": 14},
}
DEFAULT_LAYOUT: dict[str, Any] = {"kind": "snowflake"}
MINT_BATCH = 16_384
TARGETS = {
    "single_vs_bare": 0.9,
    "batch_ids_per_s": 1_000_000,
    "inprocess_ids_per_s": 5_000_000,
}


async def inprocess(settings: Settings, config: dict[str, Any], seconds: float) -> float:
    """IDs per second one process mints, in batches, from a lease held in Redis."""
    id_type = SnowflakeType(SNOWFLAKE_TYPE, SnowflakeConfig.model_validate(config))
    minter = Minter(id_type)
    lo, hi = id_type.machine_range
    endpoint = RedisEndpoint(settings.redis_url)
    try:
        # A Redis server seen for the first time grants no machine ID for one lease TTL.
        wait_s = id_type.config.lease_ttl_s + 5.0
        async with lease_machine_id(
            endpoint, id_type.pool, lo, hi, wait_s=wait_s, namespace=settings.redis_namespace
        ) as lease:
            minter.attach(lease)
            minted = 0
            started = time.perf_counter()
            deadline = started + seconds
            while time.perf_counter() < deadline:
                for span in minter.mint(MINT_BATCH):
                    minted += len(list(span))  # the integers themselves, not just a count
            elapsed = time.perf_counter() - started
    finally:
        await endpoint.close()
    return minted / elapsed


class SnowflakeBench:
    def __init__(self, settings: Settings, seconds: float, work: Path, load: str) -> None:
        if settings.redis_sentinel is not None:
            raise ConfigError(
                "redis_sentinel: bench snowflake needs redis_url (a scratch database)"
            )
        self.settings = settings
        self.seconds = seconds
        self.load = LoadGenerator(seconds, load)
        self.config = work / "bench.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "redis_url": settings.redis_url,
                    "redis_namespace": settings.redis_namespace,  # as the in-process lease
                    "log_level": "WARNING",
                    "id_types": {SNOWFLAKE_TYPE: SNOWFLAKE_TYPE_CONFIG},
                }
            )
        )

    def _env(self, **extra: str) -> dict[str, str]:
        return scrubbed_env(KD_CONFIG=str(self.config), **extra)

    async def _dispenser(self, workers: int, path: str) -> dict[str, float]:
        port = free_port()
        env = self._env(KD_DISPENSER__PORT=str(port), KD_DISPENSER__WORKERS=str(workers))
        with BenchServer(cli_command("dispenser"), env, port, ready_path="/healthz"):
            return await self.load.run(f"http://127.0.0.1:{port}{path}")

    async def _round(self, workers: int) -> dict[str, Any]:
        single_path = f"/v1/idgenerator/{SNOWFLAKE_TYPE}/id"
        port = free_port()
        bare_argv = uvicorn_argv("keydispenser_ops.bench.servers:bare", port, workers)
        with BenchServer(bare_argv, self._env(), port):
            bare = await self.load.run(f"http://127.0.0.1:{port}{single_path}")
        single = await self._dispenser(workers, single_path)
        batch = await self._dispenser(workers, f"/v1/keys/{SNOWFLAKE_TYPE}?count={BATCH}")
        answered = batch["requests"] - batch["non_2xx"]
        return {
            "bare_rps": round(bare["rps"]),
            "single_rps": round(single["rps"]),
            "single_p99_ms": round(single["p99_ms"], 3),
            "batch_ids_per_s": round(answered * BATCH / self.load.duration),
            "batch_p99_ms": round(batch["p99_ms"], 3),
            "non_2xx": {
                "bare": bare["non_2xx"],
                "single": single["non_2xx"],
                "batch": batch["non_2xx"],
            },
        }

    async def run(self) -> dict[str, Any]:
        cores = os.cpu_count() or 1
        measured = await inprocess(self.settings, SNOWFLAKE_TYPE_CONFIG, self.seconds)
        default = await inprocess(self.settings, DEFAULT_LAYOUT, self.seconds)
        runs = {f"workers_{w}": await self._round(w) for w in sorted({1, cores})}
        return report(runs, measured, default, cores, self.load.name, self.seconds)


def report(
    runs: dict[str, Any],
    inprocess_ids_per_s: float,
    default_layout_ids_per_s: float,
    cores: int,
    load_generator: str,
    seconds: float,
) -> dict[str, Any]:
    """The JSON report: headline fields from one worker, every run, targets met."""
    first = runs["workers_1"]
    result: dict[str, Any] = {
        "benchmark": "snowflake",
        "load_generator": load_generator,
        "connections": CONNECTIONS,
        "seconds_each": seconds,
        "cores": cores,
        "layout": SNOWFLAKE_TYPE_CONFIG["bits"],
        "inprocess_ids_per_s": round(inprocess_ids_per_s),
        "inprocess_default_layout_ids_per_s": round(default_layout_ids_per_s),
        **{k: first[k] for k in ("single_rps", "bare_rps", "batch_ids_per_s")},
        "runs": runs,
        "targets": TARGETS,
    }
    for name, run in runs.items():
        run["single_vs_bare"] = round(run["single_rps"] / max(run["bare_rps"], 1), 3)
        run["targets_met"] = {
            "single_vs_bare": run["single_vs_bare"] >= TARGETS["single_vs_bare"],
            "batch_ids_per_s": run["batch_ids_per_s"] >= TARGETS["batch_ids_per_s"],
            "inprocess_ids_per_s": inprocess_ids_per_s >= TARGETS["inprocess_ids_per_s"],
        }
        result[f"{name}_targets_met"] = all(run["targets_met"].values())
    return result


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    load = options.load
    if seconds < 1:
        raise ConfigError("bench snowflake --seconds: at least 1")
    with tempfile.TemporaryDirectory(prefix="kd-bench-") as work:
        return await SnowflakeBench(settings, seconds, Path(work), load).run()
