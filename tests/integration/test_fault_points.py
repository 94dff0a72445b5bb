"""keysync killed exactly between its commit and its push: the batch is lost, counted.

The fault point stands for a SIGKILL at that instant (``KD_FAULT_POINT`` makes the
real process ``os._exit`` there); here it raises instead, so the test can look at both
tiers right after the "crash" and then run a fresh keysync over what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.domain.tiers import NO_STAMP, Pushed, Stamp
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS
from tests.integration.test_pipeline import cold_keys


class Killed(BaseException):
    """The process died at a fault point (BaseException: nothing may catch it)."""


async def test_killed_between_commit_and_push_loses_exactly_one_batch(
    settings: Settings, redis_client: aioredis.Redis, sync: SyncRecord
) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    types = build_id_types(settings)
    batch = settings.pooled("farmer").sync_batch
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        before = set(await cold_keys(settings.postgres_dsn, "farmer"))
        reached: list[str] = []

        def fault(point: str) -> None:
            if point == "keysync.committed":
                reached.append(point)
                raise Killed(point)

        dying = Keysync(settings, GuardedCold(cold, sync, types), hot, fault=fault)
        with pytest.raises(Killed):
            await dying.refill(types["farmer"])
        assert reached == ["keysync.committed"]
        # The DELETE committed, the push never ran: one batch gone from cold, none hot.
        after_crash = set(await cold_keys(settings.postgres_dsn, "farmer"))
        lost = before - after_crash
        assert len(lost) == batch and after_crash < before
        assert await redis_client.llen(redis_keys.hot_list_key(NS, "farmer")) == 0

        # A fresh keysync refills from what is left and never hands out the lost batch.
        moved = await Keysync(settings, GuardedCold(cold, sync, types), hot).refill(types["farmer"])
        pushed = await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1)
        remaining = set(await cold_keys(settings.postgres_dsn, "farmer"))
        assert moved == len(pushed) == len(set(pushed)) == settings.pooled("farmer").hot.high
        assert not set(pushed) & lost
        assert not set(pushed) & remaining
        assert len(before) == len(remaining) + len(pushed) + len(lost)  # nothing twice
    finally:
        await cold.close()
        await hot.close()


class DiesInFirstPush(HotStore):
    """Dies (as SIGKILL would) during its first push, after the next batch was taken."""

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = NO_STAMP,
        not_after_ms: int = 0,
        marker_ttl_s: float = 3600,
        epoch: int = 0,
    ) -> Pushed:
        await asyncio.sleep(0.2)  # long enough for the next batch's DELETE to have run
        raise Killed("keysync.pushing")


async def test_killed_while_pushing_loses_only_the_batch_being_pushed(
    settings: Settings, redis_client: aioredis.Redis, sync: SyncRecord
) -> None:
    """The next batch is deleted during the push, but commits only after it succeeded."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = DiesInFirstPush.from_settings(settings)
    types = build_id_types(settings)
    config = settings.pooled("farmer")
    assert config.hot.high >= 2 * config.sync_batch  # a second batch is taken meanwhile
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        before = set(await cold_keys(settings.postgres_dsn, "farmer"))
        with pytest.raises(Killed):
            await Keysync(settings, GuardedCold(cold, sync, types), hot).refill(types["farmer"])
        after_crash = set(await cold_keys(settings.postgres_dsn, "farmer"))
        assert len(before - after_crash) == config.sync_batch  # the second was rolled back
        assert await redis_client.llen(redis_keys.hot_list_key(NS, "farmer")) == 0
        async with cold.connection() as conn:  # and nothing of it is left open
            await conn.fetchval("SELECT clock FROM kd_sync_clock WHERE id = 1 FOR UPDATE NOWAIT")
    finally:
        await cold.close()
        await hot.close()


async def range_rows(dsn: str, name: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(
            await conn.fetch(
                "SELECT range_start, accepted, filled_at FROM kd_ranges"
                " WHERE id_type = $1 ORDER BY range_start",
                name,
            )
        )
    finally:
        await conn.close()


async def test_keygen_killed_between_copy_and_commit_loses_only_that_slice(
    settings: Settings, sync: SyncRecord
) -> None:
    # Four slices per range, so the crash lands inside a range with one slice committed.
    keygen_settings = settings.keygen.model_copy(update={"slice_size": 5_000})
    settings = settings.model_copy(update={"keygen": keygen_settings})
    farmer = build_id_types(settings)["farmer"]
    cold = await ColdStore.connect(settings.postgres_dsn)
    copied: list[str] = []

    def fault(point: str) -> None:
        if point == "keygen.copied":
            copied.append(point)
            if len(copied) == 2:
                raise Killed(point)

    try:
        dying = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2), fault=fault)
        with pytest.raises(Killed):
            await dying.lease_and_generate(farmer)
        assert copied == ["keygen.copied", "keygen.copied"]
        # The second slice was copied but never committed: only the first is stored,
        # the range's accounting says exactly that, and the range stays unfilled.
        survivors = await cold_keys(settings.postgres_dsn, "farmer")
        [crashed] = await range_rows(settings.postgres_dsn, "farmer")
        assert 0 < len(survivors) == crashed["accepted"]
        assert crashed["filled_at"] is None

        # A fresh keygen never returns to the abandoned range: it leases the next one.
        await Keygen.on_postgres(
            settings, cold, sync, asyncio.Event(), Generator(2)
        ).lease_and_generate(farmer)
        rows = await range_rows(settings.postgres_dsn, "farmer")
        assert [r["range_start"] for r in rows] == [0, farmer.config.range_size]
        assert rows[0]["accepted"] == crashed["accepted"] and rows[1]["filled_at"] is not None
        stored = await cold_keys(settings.postgres_dsn, "farmer")
        assert len(stored) == len(set(stored)) == rows[0]["accepted"] + rows[1]["accepted"]
        assert set(survivors) <= set(stored)
    finally:
        await cold.close()
