"""``keydispenser bench TARGET``: throughput measures that write JSON results.

Benchmarks are operator tooling: they live apart from the process packages and from the
tests, and tests never assert their figures.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, cast

from pydantic import SecretStr

from keydispenser_ops.bench import scratch
from keydispenser_ops.catalog import BENCHES
from shared.domain.config import Settings
from shared.domain.errors import ConfigError

POSTGRES_ONLY = frozenset({"keygen"})
# A benchmark whose name is no module name Python allows: its module.
MODULES = {"import": "importing"}  # benches that never reach Redis

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
    cluster_shards: int = 0  # pipeline: on a loopback Redis Cluster of this many primaries
    slot_per: str = "namespace"  # pipeline on a cluster: redis_cluster.slot_per
    types: int = 1  # pipeline: ID types served at once
    existing_rows: int = 0  # ledger, lifecycle: ledger rows loaded before measuring
    spent: float = 0.0  # keygen: the fraction of each keyspace spent before measuring
    rounds: int = 1  # dispense: each measure made this many times, the best kept
    rows: int = 1_000_000  # import: IDs imported


async def run(name: str, settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    """Run the benchmark ``name`` (a key of ``catalog.BENCHES``, and the name of its
    module here), loaded only now (the dispense bench needs aiohttp). Whatever keys it
    creates under the Redis namespace it removes when it ends (``scratch.as_found``)."""
    if name not in BENCHES:
        raise ValueError(f"unknown benchmark {name!r}")
    if settings.redis_cluster is not None and name not in (*POSTGRES_ONLY, "pipeline"):
        raise ConfigError(
            f"redis_cluster: bench {name} runs against redis_url (a scratch server); unset "
            "redis_cluster for it (bench pipeline runs on a cluster: --redis-cluster)"
        )
    bench = importlib.import_module(f"{__name__}.{MODULES.get(name, name)}")
    if settings.permutation_key is None:  # scratch databases: any key will do
        settings = settings.model_copy(update={"permutation_key": SecretStr(BENCH_PERMUTATION_KEY)})
    if name in POSTGRES_ONLY:
        return cast(dict[str, Any], await bench.run(settings, seconds, options))
    async with scratch.as_found(settings):
        return cast(dict[str, Any], await bench.run(settings, seconds, options))
