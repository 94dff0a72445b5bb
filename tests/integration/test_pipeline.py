"""keygen fills the cold table; keysync moves exactly what it deleted."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen, listen_for_wakes
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.checkdigit import verhoeff_valid
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.domain.tiers import Popped
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.hot.wake import WakeChannel
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, make_settings


async def cold_keys(dsn: str, name: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch(f"SELECT key FROM {sql.cold_table(name)}")]
    finally:
        await conn.close()


async def test_keygen_fills_cold_to_high_watermark(settings: Settings, sync: SyncRecord) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        for name in settings.id_types:
            config = settings.pooled(name)
            depth = await cold.depth(name, 10**9)
            assert config.cold.high <= depth < config.cold.high + config.range_size
        keys = await cold_keys(settings.postgres_dsn, "farmer")
        assert len(keys) == len(set(keys))
        assert all(len(k) == 10 and verhoeff_valid(k) for k in keys)
        stats = await cold.range_stats("farmer")
        assert stats["leased"] == stats["filled"] >= 1
        assert stats["accepted"] == len(keys)
    finally:
        await cold.close()


async def test_keygen_idles_above_low_watermark(settings: Settings, sync: SyncRecord) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        assert not await keygen.step()
    finally:
        await cold.close()


async def test_concurrent_keygens_never_produce_the_same_key(
    servers: Servers, database: str, sync: SyncRecord
) -> None:
    types = small_types()
    types["shortlink"]["cold"] = {"low": 500_000, "high": 1_000_000}
    settings = make_settings(servers, database, id_types=types)
    stores = [await ColdStore.connect(settings.postgres_dsn) for _ in range(3)]
    try:
        gens = [
            Keygen.on_postgres(settings, store, sync, asyncio.Event(), Generator(2))
            for store in stores
        ]
        await asyncio.gather(*(g.step() for g in gens))
        await asyncio.gather(*(g.step() for g in gens))
        keys = await cold_keys(settings.postgres_dsn, "shortlink")
        # The cold table's key is its primary key: a duplicate would fail a keygen's
        # COPY (raised above), never show up as a repeated row. What can go wrong
        # silently is a range generated twice or not at all: count and accounting.
        size = settings.pooled("shortlink").range_size
        assert len(keys) == 6 * size
        stats = await stores[0].range_stats("shortlink")
        assert stats["leased"] == stats["filled"] == 6
        assert stats["accepted"] == len(keys)
    finally:
        for store in stores:
            await store.close()


async def test_exhausted_keyspace_is_logged_and_generation_stops(
    servers: Servers, database: str, caplog: pytest.LogCaptureFixture, sync: SyncRecord
) -> None:
    tiny = {
        "kind": "numeric",
        "length": 4,
        "filter_profile": "none",
        "range_size": 300,
        "cold": {"low": 5_000, "high": 10_000},
    }
    settings = make_settings(servers, database, id_types={"tiny": tiny})
    await run_migrate(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        with caplog.at_level(logging.ERROR):
            for _ in range(10):
                await keygen.step()
        keys = await cold_keys(settings.postgres_dsn, "tiny")
        assert sorted(k[:3] for k in keys) == [f"{n:03d}" for n in range(1000)]
        assert any(r.getMessage() == "keyspace_exhausted" for r in caplog.records)
        assert not await keygen.step()
        state = await cold.sequence_state(build_id_types(settings)["tiny"])
        assert state.headroom == 0
    finally:
        await cold.close()


async def test_keysync_moves_exactly_what_it_deleted(
    settings: Settings, redis_client: aioredis.Redis, sync: SyncRecord
) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        before = set(await cold_keys(settings.postgres_dsn, "farmer"))
        moved = await Keysync(
            settings, GuardedCold(cold, sync, build_id_types(settings)), hot
        ).refill(build_id_types(settings)["farmer"])
        after = set(await cold_keys(settings.postgres_dsn, "farmer"))
        pushed = await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1)
        assert moved == len(pushed) == settings.pooled("farmer").hot.high
        assert set(pushed) == before - after
        assert not set(pushed) & after
        # The refill rate dispensers derive Retry-After from is published.
        refill = await redis_client.hgetall(redis_keys.refill_key(NS, "farmer"))
        assert float(refill["rate"]) > 0
        assert abs(float(refill["at"]) - time.time()) < 60
    finally:
        await cold.close()
        await hot.close()


async def test_keysync_leaves_a_list_above_low_watermark_alone(
    settings: Settings, redis_client: aioredis.Redis, sync: SyncRecord
) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    try:
        low = settings.pooled("farmer").hot.low
        await hot.push("farmer", [f"k{i}" for i in range(low)], "batch-1")
        assert (
            await Keysync(settings, GuardedCold(cold, sync, build_id_types(settings)), hot).refill(
                build_id_types(settings)["farmer"]
            )
            == 0
        )
    finally:
        await cold.close()
        await hot.close()


async def test_concurrent_keysyncs_never_push_a_key_twice(
    settings: Settings, redis_client: aioredis.Redis, sync: SyncRecord
) -> None:
    stores = [await ColdStore.connect(settings.postgres_dsn) for _ in range(3)]
    hots = [HotStore.from_settings(settings) for _ in range(3)]
    try:
        keygen = Keygen.on_postgres(settings, stores[0], sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        syncs = [
            Keysync(settings, GuardedCold(c, sync, build_id_types(settings)), h)
            for c, h in zip(stores, hots, strict=True)
        ]
        config = settings.pooled("shortlink")
        shortlink = build_id_types(settings)["shortlink"]
        await asyncio.gather(*(s.refill(shortlink) for s in syncs))
        pushed = await redis_client.lrange(redis_keys.hot_list_key(NS, "shortlink"), 0, -1)
        assert len(pushed) == len(set(pushed)) >= config.hot.high
        assert not set(pushed) & set(await cold_keys(settings.postgres_dsn, "shortlink"))
    finally:
        for store in stores:
            await store.close()
        for h in hots:
            await h.close()


async def test_hot_store_push_and_pop_in_order(hot: HotStore) -> None:
    keys = [f"key{i}" for i in range(9_000)]  # more than Lua's unpack limit at once
    pushed = await hot.push("farmer", keys, "b1")
    assert (pushed.length, pushed.status) == (9_000, "pushed")
    popped = await hot.pop("farmer", 3)
    assert popped == Popped(["key0", "key1", "key2"], 8_997, False)
    popped = await hot.pop("farmer", 10_000)
    assert len(popped.keys) == 8_997 and popped.remaining == 0
    assert await hot.pop("farmer", 1) == Popped([], 0, False)
    await hot.mark_exhausted("farmer")
    assert await hot.pop("farmer", 1) == Popped([], 0, True)
    await hot.push("farmer", ["late"], "b2")  # keys still in flight are served first
    assert await hot.pop("farmer", 1) == Popped(["late"], 0, False)


async def test_nudge_wakes_a_waiting_keysync(hot: HotStore) -> None:
    wake = WakeChannel(hot.endpoint, hot.namespace)
    await wake.nudge("farmer")
    assert await wake.wait(1) == "farmer"
    assert await wake.wait(0.1) is None


async def test_keygen_listens_again_after_its_connection_dies(
    settings: Settings, sync: SyncRecord
) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    stop = asyncio.Event()
    keygen = Keygen.on_postgres(settings, cold, sync, stop, Generator(1))
    listening = asyncio.ensure_future(listen_for_wakes(settings, keygen, stop))
    admin = await asyncpg.connect(settings.postgres_dsn)
    try:
        for _ in range(2):  # the second round needs the connection re-established
            pid = None
            for _ in range(100):
                pid = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                )
                if pid is not None:
                    break
                await asyncio.sleep(0.05)
            assert pid is not None
            await asyncio.sleep(0.1)
            keygen._wake.clear()
            await cold.wake_keygen("farmer")
            await asyncio.wait_for(keygen._wake.wait(), 5)
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        stop.set()
        await asyncio.wait_for(listening, 5)
        await admin.close()
        await cold.close()
