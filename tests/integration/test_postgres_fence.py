"""The PostgreSQL fence: a server that lost commits never hands a key out again.

Lost commits are made real by cloning the test database (the "replica" that will be
promoted), then committing more work on the original (the "old primary") and moving
the processes to the clone, which takes the original's name (``promote``): exactly what
a promoted asynchronous replica looks like, down to the database's identity (system
identifier and name). Each hazard has its control case with the guard switched off.
The same hazards on real streaming replicas, with the old primary left up (a split
brain), are in tests/acceptance/test_postgres_split_brain.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import FenceHalted, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.stores.fence import postgres_fence
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS
from tests.integration.fixtures import Servers


@asynccontextmanager
async def cold_at(dsn: str) -> AsyncIterator[ColdStore]:
    store = await ColdStore.connect(dsn)
    try:
        yield store
    finally:
        await store.close()


async def clone(servers: Servers, source: str, name: str) -> str:
    """A copy of ``source`` as it is now (no session may be connected to it)."""
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    finally:
        await admin.close()
    return servers.dsn_for(name)


async def promote(servers: Servers, database: str, replica: str) -> str:
    """The clone ``replica`` takes over ``database``'s name (the old primary's becomes
    ``<database>_old``): processes that reach ``database`` now reach the replica, whose
    identity is the old primary's. Returns the DSN, unchanged."""
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        for name in (database, replica):
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
            )
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}_old" WITH (FORCE)')
        await admin.execute(f'ALTER DATABASE "{database}" RENAME TO "{database}_old"')
        await admin.execute(f'ALTER DATABASE "{replica}" RENAME TO "{database}"')
    finally:
        await admin.close()
    return servers.dsn_for(database)


async def drop(servers: Servers, name: str) -> None:
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def generate(
    settings: Settings, sync: SyncRecord | None, farmer: IdType, dsn: str | None = None
) -> None:
    async with cold_at(dsn or settings.postgres_dsn) as cold:
        generator = Generator(1)
        try:
            await Keygen.on_postgres(
                settings, cold, sync, asyncio.Event(), generator
            ).lease_and_generate(farmer)
        finally:
            generator.close()


async def refill_and_dispense(
    settings: Settings, dsn: str, sync: SyncRecord | None, hot: HotStore, farmer: IdType
) -> list[str]:
    """keysync fills the hot list from ``dsn``; every key pushed is then dispensed."""
    types = build_id_types(settings)
    async with cold_at(dsn) as cold:
        keysync = Keysync(settings, GuardedCold(cold, sync, types), hot)
        await keysync.refill(farmer)
    popped = await hot.pop(farmer.name, 10_000)
    return popped.keys


async def failover_scenario(
    servers: Servers, database: str, settings: Settings, hot: HotStore, sync: SyncRecord | None
) -> tuple[list[str], list[str], str]:
    farmer = build_id_types(settings)["farmer"]
    await generate(settings, sync, farmer)
    await clone(servers, database, f"{database}_replica")
    # The old primary keeps committing: batches taken (and dispensed), another lease.
    before = await refill_and_dispense(settings, settings.postgres_dsn, sync, hot, farmer)
    await generate(settings, sync, farmer)
    # The replica, which never saw those commits, is promoted; the processes follow:
    # keysync first (it finds the replica's inventory), then keygen and keysync again.
    replica = await promote(servers, database, f"{database}_replica")
    after = await refill_and_dispense(settings, replica, sync, hot, farmer)
    await generate(settings, sync, farmer, replica)
    after += await refill_and_dispense(settings, replica, sync, hot, farmer)
    return before, after, replica


async def test_a_server_that_lost_commits_is_fenced_and_reissues_nothing(
    servers: Servers, database: str, settings: Settings, hot: HotStore, sync: SyncRecord
) -> None:
    before, after, replica = await failover_scenario(servers, database, settings, hot, sync)
    try:
        assert before and after
        assert not set(before) & set(after)
        conn = await asyncpg.connect(replica)
        try:
            event = await conn.fetchrow(fence_sql.SELECT_LAST_FENCE)
            assert event is not None
            assert event["reason"] == "behind"
            assert event["keys_discarded"] > 0  # the replica's whole inventory
            state = await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, "farmer"))
        finally:
            await conn.close()
        # The replica had seen one lease; its first lease after the fence starts past
        # both ranges leased on the old primary.
        size = settings.pooled("farmer").range_size
        assert state is not None
        assert int(state["last_value"]) == 2 * size
        record = await sync.read()
        assert record.leased["farmer"] == 3 * size
        assert not record.untrusted and not record.fence_needed
    finally:
        await drop(servers, f"{database}_old")


async def test_control_without_the_guard_the_same_failover_reissues_keys(
    servers: Servers, database: str, settings: Settings, hot: HotStore
) -> None:
    """The hazard the guard closes: without it, dispensed keys come back."""
    before, after, _ = await failover_scenario(servers, database, settings, hot, None)
    try:
        assert set(before) & set(after)
    finally:
        await drop(servers, f"{database}_old")


async def test_a_redis_failover_alone_needs_no_fence(
    settings: Settings, hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    farmer = build_id_types(settings)["farmer"]
    await generate(settings, sync, farmer)
    await redis_client.delete(redis_keys.fence_key(NS))  # the next call sees a new server
    assert (await sync.read()).untrusted
    keys = await refill_and_dispense(settings, settings.postgres_dsn, sync, hot, farmer)
    assert keys  # PostgreSQL vouched for itself: same timeline as its last write
    assert not (await sync.read()).untrusted


async def test_both_tiers_losing_state_halts_until_an_operator_fences(
    settings: Settings, hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    types = build_id_types(settings)
    farmer = types["farmer"]
    await generate(settings, sync, farmer)
    async with cold_at(settings.postgres_dsn) as cold:
        # PostgreSQL's last guarded write was on another timeline (it was promoted),
        # and Redis lost its record (a new server): nothing can prove what was lost.
        async with cold.connection() as conn:
            await conn.execute("UPDATE kd_sync_clock SET timeline = timeline + 100")
        await redis_client.delete(redis_keys.fence_key(NS))
        guarded = GuardedCold(cold, sync, types)
        with pytest.raises(FenceHalted):
            await guarded.take_batch("farmer", 10)
        with pytest.raises(FenceHalted):  # and it stays halted
            await guarded.take_batch("farmer", 10)
        assert await cold.depth("farmer", 10**9) > 0  # nothing was taken
        report = await settle(cold, sync, types, skip_ranges=10)
        assert report is not None and report.reason == "operator"
        keys, _ = await guarded.take_batch("farmer", 10)
        assert keys == []  # the inventory was discarded; keygen makes new keys
        state = await cold.sequence_state(farmer)
        assert state.leased_counters >= 11 * farmer.config.range_size


async def test_a_take_left_open_cannot_hold_every_other_take_for_long(
    settings: Settings, sync: SyncRecord
) -> None:
    """A keysync paused (or cut off) between its DELETE and its commit holds the clock's
    row lock; the server ends its session after the idle limit, rolling the take back,
    and every other take and lease goes on."""
    types = build_id_types(settings)
    await generate(settings, sync, types["farmer"])
    async with cold_at(settings.postgres_dsn) as paused, cold_at(settings.postgres_dsn) as other:
        guarded_other = GuardedCold(other, sync, types)
        before = await other.depth("farmer", 10**9)
        paused.open_take_idle_limit_s = 0  # no limit: the hazard
        stuck = await GuardedCold(paused, sync, types).begin_take("farmer", 10)
        waiting = asyncio.ensure_future(guarded_other.take_batch("farmer", 10))
        try:
            done, _ = await asyncio.wait([waiting], timeout=2)
            assert not done  # every other take waits for as long as the paused one is open
        finally:
            # Frees the connection whatever failed, so the stores can close (closing a
            # pool waits for every connection it lent).
            await stuck.rollback()
        await waiting

        paused.open_take_idle_limit_s = 1.0
        stuck = await GuardedCold(paused, sync, types).begin_take("farmer", 10)
        try:
            # A client cut off while the server sends it the keys is bounded the same way
            # (over TCP: on a Unix socket the server keeps no such setting).
            if await stuck._conn.fetchval("SELECT inet_server_addr() IS NOT NULL"):
                assert await stuck._conn.fetchval("SHOW tcp_user_timeout") == "1000"
            take = guarded_other.take_batch("farmer", 10)
            keys, _ = await asyncio.wait_for(take, timeout=10)
            assert len(keys) == 10  # went on once the paused session was ended
            with pytest.raises(StoreUnavailable):
                await stuck.commit()  # its take was rolled back: never pushed
        finally:
            await stuck.rollback()  # as above; nothing once the commit was tried
        assert await other.depth("farmer", 10**9) == before - 20  # the two completed takes


async def test_a_fence_covers_every_type_the_database_holds(
    servers: Servers, database: str, settings: Settings, hot: HotStore, sync: SyncRecord
) -> None:
    """A process whose configuration lacks a type (an older one, during a rolling
    update) fences that type too: its cold keys may have been dispensed, its sequence
    may be behind a lease the promoted server lacks."""
    types = build_id_types(settings)
    farmer = types["farmer"]
    await generate(settings, sync, farmer)
    await clone(servers, database, f"{database}_replica")
    before = await refill_and_dispense(settings, settings.postgres_dsn, sync, hot, farmer)
    await generate(settings, sync, farmer)
    replica = await promote(servers, database, f"{database}_replica")
    try:
        async with cold_at(replica) as cold:
            shortlink_only = {"shortlink": types["shortlink"]}
            report = await GuardedCold(cold, sync, shortlink_only).fence()
            assert report is not None and report.keys_discarded["farmer"] > 0
            assert report.next_starts["farmer"] >= (await sync.read()).leased["farmer"]
            assert await cold.depth("farmer", 10**9) == 0
        assert before
    finally:
        await drop(servers, f"{database}_old")


class FrozenInTheFence(SyncRecord):
    """The fence's process freezes (SIGSTOP, a GC pause) right after taking the clock
    row's lock, when it reads the record."""

    def __init__(self, other: SyncRecord) -> None:
        super().__init__(other.endpoint, other.namespace)
        self.frozen = asyncio.Event()

    async def read(self) -> Record:
        if not self.frozen.is_set():
            self.frozen.set()
            await asyncio.sleep(3_600)
        return await super().read()


async def test_a_fence_left_open_cannot_hold_every_lease_and_take_for_long(
    settings: Settings, sync: SyncRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process paused (or cut off) inside a fence holds the clock row's lock, which
    every lease and take on the server waits for; the server ends its session after the
    fence's limit, and they go on."""
    monkeypatch.setattr(postgres_fence, "FENCE_LIMIT_MS", 1_000)
    types = build_id_types(settings)
    await generate(settings, sync, types["farmer"])
    frozen = FrozenInTheFence(sync)
    async with cold_at(settings.postgres_dsn) as paused, cold_at(settings.postgres_dsn) as other:
        fencing = asyncio.ensure_future(settle(paused, frozen))
        try:
            await asyncio.wait_for(frozen.frozen.wait(), 10)  # it holds the lock now
            take = GuardedCold(other, sync, types).take_batch("farmer", 10)
            keys, _ = await asyncio.wait_for(take, timeout=10)
            assert len(keys) == 10
        finally:
            fencing.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
                await fencing
