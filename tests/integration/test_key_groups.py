"""The PostgreSQL fence over several key groups (a Redis Cluster with ``slot_per:
type``: each type's record in its own slot), on real PostgreSQL and Redis.

Each group here is a namespace on the one test server: the record's rules do not
depend on where its slot lives (tests/integration/test_cluster_types.py puts them on
a real cluster's shards). Lost commits are made real as in test_postgres_fence.py: a
clone of the database is promoted after the old primary committed more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import FenceHalted, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.tiers import Stamp
from shared.stores.fence.binding import bind
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.fence.verdict import combined
from shared.stores.groups import SyncRecords
from shared.stores.postgres import sql
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import Servers
from tests.integration.test_postgres_fence import clone, cold_at, drop, promote

FARMER_NS, SHORTLINK_NS = f"{NS}-farmer", f"{NS}-shortlink"


@pytest.fixture
async def records(servers: Servers, redis_client: aioredis.Redis) -> AsyncIterator[SyncRecords]:
    endpoint = RedisEndpoint(servers.redis_url)
    found = SyncRecords(
        {ns: SyncRecord(endpoint, ns) for ns in (FARMER_NS, SHORTLINK_NS)},
        {FARMER_NS: ("farmer",), SHORTLINK_NS: ("shortlink",)},
    )
    yield found
    await endpoint.close()


async def lease(settings: Settings, dsn: str, records: SyncRecords, id_type: IdType) -> None:
    async with cold_at(dsn) as cold:
        generator = Generator(1)
        try:
            keygen = Keygen.on_postgres(settings, cold, records, asyncio.Event(), generator)
            await keygen.lease_and_generate(id_type)
        finally:
            generator.close()


async def take_all(dsn: str, records: SyncRecords, types: dict[str, IdType]) -> dict[str, set[str]]:
    """A batch of each type, through the guard."""
    async with cold_at(dsn) as cold:
        guarded = GuardedCold(cold, records, types)
        return {name: set((await guarded.take_batch(name, 500))[0]) for name in types}


async def fences(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM kd_fence_events"))
    finally:
        await conn.close()


async def test_each_type_is_recorded_in_its_own_group(
    settings: Settings, records: SyncRecords
) -> None:
    types = build_id_types(settings)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    size = settings.pooled("farmer").range_size
    assert (await records.of("farmer").read()).leased == {"farmer": size}
    assert (await records.of("shortlink").read()).leased == {"shortlink": size}


async def test_a_fence_claims_every_group_and_no_group_reissues(
    servers: Servers, database: str, settings: Settings, records: SyncRecords
) -> None:
    """PostgreSQL lost commits of both types. The first statement to find it fences
    once for every group: every record follows the new history (the other group's next
    take does not fence again), and each type's sequence moves past the highest lease
    its own group recorded."""
    types = build_id_types(settings)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    await clone(servers, database, f"{database}_replica")
    # The old primary keeps committing, for both types: takes, then leases.
    before = await take_all(settings.postgres_dsn, records, types)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    replica = await promote(servers, database, f"{database}_replica")
    try:
        async with cold_at(replica) as cold:
            guarded = GuardedCold(cold, records, types)
            farmer_keys, _ = await guarded.take_batch("farmer", 500)
            assert farmer_keys == []  # fenced: the replica's inventory was discarded
            assert await fences(replica) == 1
            shortlink_keys, _ = await guarded.take_batch("shortlink", 500)
            assert shortlink_keys == []  # discarded by that one fence too
            assert await fences(replica) == 1  # its group was claimed by the same fence
        read = [await r.read() for r in records]
        assert len({(r.timeline, r.fork) for r in read}) == 1
        assert not any(r.untrusted or r.fence_needed for r in read)
        size = settings.pooled("farmer").range_size
        for id_type in types.values():  # the first lease after the fence
            await lease(settings, replica, records, id_type)
        conn = await asyncpg.connect(replica)
        try:
            for name in types:
                row = await conn.fetchrow(sql.for_type(sql.SELECT_SEQUENCE_STATE, name))
                assert row is not None
                assert int(row["last_value"]) >= 2 * size  # past both ranges leased before
        finally:
            await conn.close()
        after = await take_all(replica, records, types)
        for name in types:
            assert before[name] and after[name]
            assert not before[name] & after[name]
    finally:
        await drop(servers, f"{database}_old")


async def test_a_fence_needed_while_a_group_lost_its_record_halts(
    servers: Servers,
    database: str,
    settings: Settings,
    records: SyncRecords,
    redis_client: aioredis.Redis,
) -> None:
    """PostgreSQL lost commits, and one group's shard lost its record at the same time:
    that group's leases on the lost history are above anything left to name them, so
    nothing is fenced automatically; every group halts for the operator."""
    types = build_id_types(settings)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    await clone(servers, database, f"{database}_replica")
    await take_all(settings.postgres_dsn, records, types)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    replica = await promote(servers, database, f"{database}_replica")
    await redis_client.delete(redis_keys.sync_record_key(SHORTLINK_NS))  # restarted empty
    try:
        async with cold_at(replica) as cold:
            depth = await cold.depth("shortlink", 10**9)
            guarded = GuardedCold(cold, records, types)
            with pytest.raises(FenceHalted):
                await guarded.take_batch("farmer", 10)
            with pytest.raises(FenceHalted):
                await guarded.take_batch("shortlink", 10)
            assert await cold.depth("shortlink", 10**9) == depth  # nothing taken or discarded
        assert all([(await r.read()).halted for r in records])
        assert await fences(replica) == 0
    finally:
        await drop(servers, f"{database}_old")


async def test_a_group_that_lost_its_record_alone_is_vouched_for_alone(
    settings: Settings, records: SyncRecords, redis_client: aioredis.Redis
) -> None:
    """One shard restarted empty, PostgreSQL is fine: that group's record is rebuilt
    from PostgreSQL; the other group's is left as it was, and nothing is fenced."""
    types = build_id_types(settings)
    for id_type in types.values():
        await lease(settings, settings.postgres_dsn, records, id_type)
    farmer_before = await records.of("farmer").read()
    await redis_client.delete(redis_keys.sync_record_key(SHORTLINK_NS))
    taken = await take_all(settings.postgres_dsn, records, types)
    assert taken["farmer"] and taken["shortlink"]
    rebuilt = await records.of("shortlink").read()
    assert not rebuilt.needs_vouch
    assert rebuilt.leased["shortlink"] == settings.pooled("shortlink").range_size
    farmer_after = await records.of("farmer").read()
    assert farmer_after.fork == farmer_before.fork
    assert farmer_after.timeline == farmer_before.timeline
    assert await fences(settings.postgres_dsn) == 0


def test_the_worst_verdict_decides() -> None:
    trusted, lost = Record(timeline=1, clock=5), Record()
    assert combined(["ok"], [trusted]) == "ok"
    assert combined(["ok", "vouch"], [trusted, lost]) == "vouch"
    assert combined(["behind", "ok"], [trusted, trusted]) == "behind"
    assert combined(["stamp", "ok"], [trusted, trusted]) == "stamp"
    assert combined(["behind", "vouch"], [trusted, lost]) == "halt"
    assert combined(["operator", "operator"], [trusted, lost]) == "operator"
    assert combined(["halt", "ok"], [lost, trusted]) == "halt"


def with_shortlinks(endpoint: RedisEndpoint, record: type[SyncRecord]) -> SyncRecords:
    """farmer's group with a plain record, shortlink's with ``record``."""
    return SyncRecords(
        {FARMER_NS: SyncRecord(endpoint, FARMER_NS), SHORTLINK_NS: record(endpoint, SHORTLINK_NS)},
        {FARMER_NS: ("farmer",), SHORTLINK_NS: ("shortlink",)},
    )


class ClaimFailsOnce(SyncRecord):
    """A record whose shard fails the fence's claim once (down for a moment)."""

    failed = False

    async def reset(
        self,
        stamp: Stamp,
        floors: dict[str, int],
        mode: str = "automatic",
        pending: bool = False,
        read: Record | None = None,
        restore_to: str = "",
    ) -> str:
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("redis", "reset_record failed: the shard is down")
        return await super().reset(stamp, floors, mode, pending, read, restore_to)


async def test_a_claim_made_by_a_fence_that_rolled_back_is_not_taken_for_a_fence(
    servers: Servers, database: str, settings: Settings, redis_client: aioredis.Redis
) -> None:
    """A fence claims farmer's record, then fails to claim shortlink's and rolls back:
    nothing was discarded, no sequence moved. farmer's record, claimed for that fence,
    stays pending (the fence count it expects): the next settle finds the server not on
    the claimed history and fences again, for real, before farmer's next take."""
    endpoint = RedisEndpoint(servers.redis_url)
    records = with_shortlinks(endpoint, ClaimFailsOnce)
    try:
        types = build_id_types(settings)
        for id_type in types.values():
            await lease(settings, settings.postgres_dsn, records, id_type)
        await clone(servers, database, f"{database}_replica")
        # Only farmer's work is lost: shortlink's record is covered by the replica.
        await take_all(settings.postgres_dsn, records, {"farmer": types["farmer"]})
        await lease(settings, settings.postgres_dsn, records, types["farmer"])
        replica = await promote(servers, database, f"{database}_replica")
        try:
            async with cold_at(replica) as cold:
                guarded = GuardedCold(cold, records, types)
                with pytest.raises(StoreUnavailable):
                    await guarded.take_batch("farmer", 10)  # the fence rolled back
                assert await fences(replica) == 0
                assert (await records.of("farmer").read()).claim_fences > 0  # pending
                keys, _ = await guarded.take_batch("farmer", 10)  # fenced, for real
                assert keys == [] and await fences(replica) == 1
            read = [await r.read() for r in records]
            assert [r.claim_fences for r in read] == [0, 0]  # confirmed after the commit
            assert len({(r.timeline, r.fork) for r in read}) == 1
        finally:
            await drop(servers, f"{database}_old")
    finally:
        await endpoint.close()


async def test_a_fence_claims_the_records_of_types_its_process_does_not_know(
    servers: Servers, database: str, settings: Settings
) -> None:
    """A process configured with farmer only (a rolling update is adding shortlink)
    fences a server that lost shortlink's work: the fence still reads and claims
    shortlink's record, and moves shortlink's sequence past the lease that record
    holds."""
    endpoint = RedisEndpoint(servers.redis_url)
    full = SyncRecords(
        {ns: SyncRecord(endpoint, ns) for ns in (FARMER_NS, SHORTLINK_NS)},
        {FARMER_NS: ("farmer",), SHORTLINK_NS: ("shortlink",)},
    )

    def opener(name: str) -> SyncRecord:
        return SyncRecord(endpoint, f"{NS}-{name}")

    farmer_only = SyncRecords(
        {FARMER_NS: SyncRecord(endpoint, FARMER_NS)}, {FARMER_NS: ("farmer",)}, opener
    )
    try:
        types = build_id_types(settings)
        for id_type in types.values():
            await lease(settings, settings.postgres_dsn, full, id_type)
        await clone(servers, database, f"{database}_replica")
        await lease(settings, settings.postgres_dsn, full, types["shortlink"])  # lost
        leased = (await full.of("shortlink").read()).leased["shortlink"]
        replica = await promote(servers, database, f"{database}_replica")
        try:
            async with cold_at(replica) as cold:
                only = {"farmer": types["farmer"]}
                report = await settle(cold, farmer_only, only, skip_ranges=None)
                assert report is not None and report.reason == "behind"
                assert report.next_starts["shortlink"] >= leased
            read = [await r.read() for r in full]
            assert len({(r.timeline, r.fork) for r in read}) == 1  # both claimed
        finally:
            await drop(servers, f"{database}_old")
    finally:
        await endpoint.close()


class BindFailsOnce(SyncRecord):
    """A record whose shard is down when the process starts (binds the namespace)."""

    failed = False

    async def bind(self, database: str) -> str:
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("redis", "bind_record failed: the shard is down")
        return await super().bind(database)


async def test_a_record_whose_shard_was_down_at_start_is_bound_before_its_first_statement(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    """One shard down does not hold every type's start-up: ``bind`` binds the records
    it reaches, and the other is bound (one namespace, one database) by its type's
    first guarded statement (the vouch that a record never written needs)."""
    endpoint = RedisEndpoint(settings.redis_url)
    records = with_shortlinks(endpoint, BindFailsOnce)
    try:
        async with cold_at(settings.postgres_dsn) as cold:
            bound = await bind(cold, records, NS)
            assert (await records.of("farmer").read()).database == bound
            assert (await records.of("shortlink").read()).database == ""  # deferred
            await GuardedCold(cold, records, build_id_types(settings)).take_batch("shortlink", 1)
            assert (await records.of("shortlink").read()).database == bound
    finally:
        await endpoint.close()
