"""One Redis namespace, one PostgreSQL database: bound on first use, on both sides.

An operator who points a second environment (its own database, maybe the same
permutation key) at a namespace already in use would have each environment's stamps
judge the other's PostgreSQL: fences taking turns, and the same keys pushed twice. The
second pairing is refused at start-up, naming both; at run time (Redis lost the
binding and the other environment bound it first) nothing of the other database is
pushed, and no fence runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.processes import run_cli
from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.errors import NamespaceBound, StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.binding import bind
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from tests.acceptance.harness import process_env, write_config
from tests.integration.fixtures import Servers, make_settings


@pytest.fixture
async def second_database(servers: Servers, template_db: str) -> AsyncIterator[str]:
    name = f"{template_db}_second"
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    yield name
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def identity(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval(fence_sql.SELECT_DATABASE_IDENTITY))
    finally:
        await conn.close()


def keysync_refuses(settings: Settings, tmp_path: Path) -> str:
    """Start a real keysync; it must refuse at once (exit 2, one line); its message."""
    config = write_config(settings, tmp_path / f"{settings.redis_namespace}.yaml")
    config.write_text(
        json.dumps(json.loads(config.read_text()) | {"redis_namespace": settings.redis_namespace})
    )
    done = run_cli("keysync", env=process_env(settings, config), timeout_s=60)
    assert done.returncode == 2, done.stderr
    assert "keysync_started" not in done.stderr  # refused at start-up, not later
    lines = [line for line in done.stderr.splitlines() if "configuration error" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


async def test_a_second_database_on_a_bound_namespace_refuses_to_start(
    settings: Settings, servers: Servers, second_database: str, tmp_path: Path
) -> None:
    first = SyncRecord.from_settings(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        bound = await bind(cold, first, settings.redis_namespace)
    finally:
        await cold.close()
        await first.close()
    other = make_settings(servers, second_database)
    message = keysync_refuses(other, tmp_path)
    assert bound in message and await identity(other.postgres_dsn) in message


async def test_a_second_namespace_on_a_bound_database_refuses_to_start(
    settings: Settings, servers: Servers, database: str, tmp_path: Path
) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        await bind(cold, None, settings.redis_namespace)
    finally:
        await cold.close()
    other = make_settings(servers, database, redis_namespace="kdtwo")
    message = keysync_refuses(other, tmp_path)
    assert "'kd'" in message and "'kdtwo'" in message


async def test_another_database_is_refused_at_run_time_without_a_fence(
    settings: Settings, servers: Servers, second_database: str, redis_client: aioredis.Redis
) -> None:
    """Redis lost the binding (restarted empty) and the other environment bound the
    namespace first: this one's stamps and guarded statements are refused; neither
    database is fenced, and no key of it reaches the hot list."""
    types = build_id_types(settings)
    other = make_settings(servers, second_database)
    sync = SyncRecord.from_settings(settings)
    hot = HotStore.from_settings(settings)
    mine = await ColdStore.connect(settings.postgres_dsn)
    theirs = await ColdStore.connect(other.postgres_dsn)
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(settings, mine, sync, asyncio.Event(), generator)
        await keygen.lease_and_generate(types["farmer"])
        taken = await GuardedCold(mine, sync, types).begin_take("farmer", 100)
        await taken.commit()
        await redis_client.flushdb()  # Redis restarted empty
        await bind(theirs, sync, other.redis_namespace)  # the other environment first
        with pytest.raises(StoreUnavailable, match="namespace_bound_to_another_database"):
            await Keysync(settings, GuardedCold(mine, sync, types), hot).push(
                "farmer", taken.keys, taken.stamp
            )
        with pytest.raises(NamespaceBound):
            await GuardedCold(mine, sync, types).begin_take("farmer", 100)
        with pytest.raises(NamespaceBound):
            await keygen.lease_and_generate(types["farmer"])
        assert await hot.depth("farmer") == 0
        for store in (mine, theirs):
            async with store.connection() as conn:
                assert await conn.fetchrow(fence_sql.SELECT_LAST_FENCE) is None
    finally:
        generator.close()
        await mine.close()
        await theirs.close()
        await sync.close()
        await hot.close()


async def test_an_operator_takes_a_bound_namespace_over_for_a_moved_database(
    settings: Settings, servers: Servers, second_database: str, redis_client: aioredis.Redis
) -> None:
    """The data moved to a new cluster (a dump restored: another system identifier): the
    operator's fence with --take-over rebinds the namespace to it and fences it; without
    it, the fence refuses, naming both."""
    from shared.cli.status import fence_postgres

    sync = SyncRecord.from_settings(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        await bind(cold, sync, settings.redis_namespace)
    finally:
        await cold.close()
        await sync.close()
    moved = make_settings(servers, second_database)
    with pytest.raises(NamespaceBound) as refused:
        await fence_postgres(moved, 1)
    # The one rule, in the refusal: the same service's data keeps its namespace and is
    # taken over; another environment gets a namespace of its own.
    assert "--take-over" in str(refused.value) and "redis_namespace of its own" in str(
        refused.value
    )
    report = await fence_postgres(moved, 1, take_over=True)
    assert report["next_starts"]
    sync = SyncRecord.from_settings(moved)
    try:
        assert (await sync.read()).database == await identity(moved.postgres_dsn)
    finally:
        await sync.close()
