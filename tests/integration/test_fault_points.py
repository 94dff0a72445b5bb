"""keysync killed exactly between its commit and its push: the batch is lost, counted.

The fault point stands for a SIGKILL at that instant (``KD_FAULT_POINT`` makes the
real process ``os._exit`` there); here it raises instead, so the test can look at both
tiers right after the "crash" and then run a fresh keysync over what is left.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain.idtypes import build_id_types
from shared.domain.settings import Settings
from shared.stores import redis_keys
from shared.stores.cold_store import ColdStore
from shared.stores.hot_store import HotStore
from shared.stores.postgres_fence import GuardedCold
from shared.stores.sync_record import SyncRecord
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
    batch = settings.id_types["farmer"].sync_batch
    try:
        keygen = Keygen(settings, cold, sync, asyncio.Event(), Generator(2))
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
        assert moved == len(pushed) == len(set(pushed)) == settings.id_types["farmer"].hot.high
        assert not set(pushed) & lost
        assert not set(pushed) & remaining
        assert len(before) == len(remaining) + len(pushed) + len(lost)  # nothing twice
    finally:
        await cold.close()
        await hot.close()
