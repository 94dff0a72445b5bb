"""Restoring PostgreSQL from a backup (docs/operations.md, "Backup and restore"): into
the same database the fence runs by itself, and no key handed out after the backup is
handed out again; the control without the fence's record hands them out again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.metrics import FENCE_REFUSALS
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings

TYPE = "shortlink"


async def _run_until_served(
    settings: Settings, sync: SyncRecord | None, hot: HotStore, popped: int
) -> list[str]:
    """keygen fills, keysync moves a batch and a client pops ``popped`` keys, riding
    out the fence's refusals (the fence runs at the next lease) as the loops do."""
    cold = await ColdStore.connect(settings.postgres_dsn)
    generator = Generator(1)
    types = build_id_types(settings)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), generator)
        keysync = Keysync(settings, GuardedCold(cold, sync, types), hot)
        for _ in range(20):
            try:
                await keygen.lease_and_generate(types[TYPE])
                await keysync.refill(types[TYPE])
                break
            except FENCE_REFUSALS:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the pipeline never served after the restore")
        return (await hot.pop(TYPE, popped)).keys
    finally:
        generator.close()
        await cold.close()


async def _copy(admin_dsn: str, source: str, target: str) -> None:
    """``target`` as a file-level copy of ``source`` (CREATE DATABASE ... TEMPLATE): a
    backup, or a restore of one under the original's name on the same server."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')
    finally:
        await admin.close()


@pytest.fixture
async def backup_name(servers: Servers, database: str) -> AsyncIterator[str]:
    name = f"{database}_backup"
    yield name
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control-no-fence"])
async def test_a_restore_into_the_same_database_hands_out_nothing_again(
    servers: Servers,
    database: str,
    backup_name: str,
    redis_client: aioredis.Redis,
    fenced: bool,
) -> None:
    settings = make_settings(servers, database, postgres_fence=fenced)
    sync = SyncRecord.from_settings(settings) if fenced else None
    hot = HotStore.from_settings(settings)
    try:
        await _run_until_served(settings, sync, hot, 10)
        await _copy(servers.postgres_admin_dsn, database, backup_name)  # the backup
        # After the backup: keys taken from the cold tier the backup still holds, and
        # handed out (the hot list emptied first, so that they are those keys).
        await redis_client.delete(redis_keys.hot_list_key(NS, TYPE))
        after_backup = set(await _run_until_served(settings, sync, hot, 400))
        assert len(after_backup) == 400
        # The restore, under the same name on the same server.
        await _copy(servers.postgres_admin_dsn, backup_name, database)
        await redis_client.delete(redis_keys.hot_list_key(NS, TYPE))
        again = set(await _run_until_served(settings, sync, hot, 500))
        assert len(again) == 500
    finally:
        await hot.close()
        if sync is not None:
            await sync.close()
    if fenced:
        assert not after_backup & again
    else:  # the hazard the fence closes: the restored cold tier hands them out again
        assert after_backup & again
