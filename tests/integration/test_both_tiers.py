"""Redis loses state, then PostgreSQL fails over: the record is rebuilt from PostgreSQL
before it judges anything again.

A real Redis failover that loses the latest update of the record (the replica was
frozen while the primary recorded a lease, then the primary died and the replica was
promoted) leaves ``leased:<type>`` below what was leased. The next guarded statement
finds the record untrusted and rebuilds it from the PostgreSQL primary (its stamp and
the highest counter its history leased). When PostgreSQL then fails over to a replica
that missed that lease, the fence moves the sequence past it: no range is leased
twice. The PostgreSQL failover is made by cloning the database before the lease and
giving the clone the original's name (as in test_postgres_fence.py).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import EmbeddedRedis
from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_postgres_fence import clone, drop, promote
from tests.integration.test_replica_fence import replicaof, synced


@dataclass
class RedisPair:
    primary: EmbeddedRedis
    replica: EmbeddedRedis


@pytest.fixture
async def redis_pair() -> AsyncIterator[RedisPair]:
    with tempfile.TemporaryDirectory(prefix="kd-tiers-") as tmp:
        primary, replica = EmbeddedRedis(Path(tmp) / "p"), EmbeddedRedis(Path(tmp) / "r")
        primary.start()
        replica.start()
        try:
            async with (
                aioredis.Redis.from_url(primary.url) as p,
                aioredis.Redis.from_url(replica.url) as r,
            ):
                await p.config_set("repl-diskless-sync-delay", 0)
                await replicaof(r, "127.0.0.1", str(primary.port))
                await synced(p, r)
            yield RedisPair(primary, replica)
        finally:
            replica.stop()
            primary.stop()


def tier_settings(servers: Servers, database: str, redis_url: str) -> Settings:
    marks = {
        "range_size": 20_000,
        "hot": {"low": 100, "high": 20_000},
        "cold": {"low": 2_000, "high": 8_000},
        "sync_batch": 20_000,
    }
    return make_settings(
        servers,
        database,
        redis_url=redis_url,
        id_types={"farmer": {"kind": "numeric", "length": 10, **marks}},
    )


async def lease_and_fill(settings: Settings, sync: SyncRecord) -> tuple[int, int]:
    """One range leased and generated; returns it."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), generator)
        farmer = build_id_types(settings)["farmer"]
        leased = await keygen._leases.lease_range(farmer, "keygen")
        await keygen.generate_range(farmer, leased)
        return leased.start, leased.stop
    finally:
        generator.close()
        await cold.close()


async def test_a_record_redis_lost_is_rebuilt_before_a_postgres_failover_uses_it(
    servers: Servers, database: str, redis_pair: RedisPair
) -> None:
    settings = tier_settings(servers, database, redis_pair.primary.url)
    on_primary = SyncRecord(RedisEndpoint(redis_pair.primary.url), NS)
    first = await lease_and_fill(settings, on_primary)
    await clone(servers, database, f"{database}_replica")  # PostgreSQL's replica: R1 only
    async with (
        aioredis.Redis.from_url(redis_pair.primary.url) as p,
        aioredis.Redis.from_url(redis_pair.replica.url) as r,
    ):
        await synced(p, r)
    # Redis fails over to a replica that missed the record of the next lease: promoted
    # (as Sentinel would, the old primary still taking writes), then the old one dies.
    async with aioredis.Redis.from_url(redis_pair.replica.url) as r:
        await r.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
    second = await lease_and_fill(settings, on_primary)
    await on_primary.close()
    assert redis_pair.primary.process is not None
    redis_pair.primary.process.kill()

    promoted = tier_settings(servers, database, redis_pair.replica.url)
    sync = SyncRecord.from_settings(promoted)
    hot = HotStore.from_settings(promoted)
    types = build_id_types(promoted)
    try:
        assert (await sync.read()).leased["farmer"] == first[1]  # the record lost a lease
        # keysync, still on PostgreSQL's primary, dispenses both ranges' keys. Its first
        # guarded statement rebuilds the record from PostgreSQL.
        cold = await ColdStore.connect(promoted.postgres_dsn)
        try:
            await Keysync(promoted, GuardedCold(cold, sync, types), hot).refill(types["farmer"])
        finally:
            await cold.close()
        dispensed = (await hot.pop("farmer", 5_000)).keys
        assert (await sync.read()).leased["farmer"] == second[1]

        # PostgreSQL fails over to its replica, which never saw the second lease.
        replica_dsn = await promote(servers, database, f"{database}_replica")
        cold = await ColdStore.connect(replica_dsn)
        try:
            guarded = GuardedCold(cold, sync, types)
            leased = await guarded.lease_range(types["farmer"], "keygen")
            assert leased.start >= second[1], "the second range was leased twice"
            keygen = Keygen.on_postgres(promoted, cold, sync, asyncio.Event(), Generator(1))
            await keygen.generate_range(types["farmer"], leased)
            taken, _ = await guarded.take_batch("farmer", 50_000)
        finally:
            await cold.close()
        assert taken and not set(taken) & set(dispensed)
    finally:
        await sync.close()
        await hot.close()
        await drop(servers, f"{database}_old")
