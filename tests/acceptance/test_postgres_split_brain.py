"""Two writable PostgreSQL primaries at once: a promoted replica, and the old primary
left up and reached by some processes (a partition, a failover manager that could not
stop it). Real servers: an embedded primary and its streaming replica on loopback.

What must hold: the two never lease the same range, and never both get keys into
Redis. Once the promoted server's fence claimed the record (bound to its history:
timeline and fork), the old primary is superseded: every guarded statement there is
refused, and it never fences the record back. Each mechanism has its control.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import asyncpg
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.drill.postgres import PostgresPair
from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import FenceHalted, PostgresSuperseded, RangeFenced, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.tiers import Stamp
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.groups import SyncRecords
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate, scratch_database
from shared.stores.redis.endpoint import RedisEndpoint
from tests.acceptance.harness import postgres_pair
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_key_groups import ClaimFailsOnce

pytestmark = pytest.mark.acceptance
DATABASE = "kd_split"
CATCH_UP_S = 30.0


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with postgres_pair("kd-split-") as servers:
        yield servers


@dataclass
class Side:
    """One of the two servers, as the processes that reach it see it."""

    settings: Settings
    cold: ColdStore
    guarded: GuardedCold
    types: dict[str, IdType]

    @property
    def farmer(self) -> IdType:
        return self.types["farmer"]


@dataclass
class Split:
    old: Side  # the primary keydispenser started on, left up
    new: Side  # its replica, promoted
    hot: HotStore
    sync: SyncRecord | None


async def caught_up(primary_dsn: str, replica_dsn: str) -> None:
    """Until the replica has replayed everything the primary has written."""
    primary = await asyncpg.connect(primary_dsn)
    replica = await asyncpg.connect(replica_dsn)
    try:
        target = await primary.fetchval("SELECT pg_current_wal_lsn()")
        deadline = asyncio.get_running_loop().time() + CATCH_UP_S
        while not await replica.fetchval("SELECT pg_last_wal_replay_lsn() >= $1", target):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("the replica did not catch up")
            await asyncio.sleep(0.05)
    finally:
        await primary.close()
        await replica.close()


@pytest.fixture
async def split(
    pair: PostgresPair,
    servers: Servers,
    redis_client: aioredis.Redis,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Split]:
    """Both servers with one migrated database and one shared history, replication
    then paused (the old primary's later commits never reach the replica)."""
    guard = getattr(request, "param", True)
    if pair.primary is None or not (pair.replica and pair.replica.pgdata.exists()):
        raise RuntimeError("the pair did not start")
    if pair.failovers:  # an earlier test promoted the replica: heal the pair first
        await pair.heal()
    primary, replica = pair.pair()
    await scratch_database(primary.dsn(), DATABASE)
    old_settings = make_settings(Servers(primary.dsn(), servers.redis_url), DATABASE)
    new_settings = make_settings(Servers(replica.dsn(), servers.redis_url), DATABASE)
    await run_migrate(old_settings)
    await caught_up(primary.dsn(), replica.dsn())
    sync = SyncRecord.from_settings(old_settings) if guard else None
    sides = []
    for settings in (old_settings, new_settings):
        cold = await ColdStore.connect(settings.postgres_dsn, min_size=0)
        types = build_id_types(settings)
        sides.append(Side(settings, cold, GuardedCold(cold, sync, types), types))
    hot = HotStore.from_settings(old_settings)
    try:
        yield Split(sides[0], sides[1], hot, sync)
    finally:
        for side in sides:
            await side.cold.close()
        await hot.close()
        if sync is not None:
            await sync.close()


async def generate(side: Side, sync: SyncRecord | None) -> None:
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(side.settings, side.cold, sync, asyncio.Event(), generator)
        await keygen.lease_and_generate(side.farmer)
    finally:
        generator.close()


async def refill_and_dispense(side: Side, hot: HotStore) -> list[str]:
    await Keysync(side.settings, side.guarded, hot).refill(side.farmer)
    return (await hot.pop("farmer", 10_000)).keys


async def ranges(dsn: str) -> set[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["range_start"] for r in await conn.fetch("SELECT range_start FROM kd_ranges")}
    finally:
        await conn.close()


async def test_two_primaries_never_lease_one_range_nor_both_reach_redis(
    pair: PostgresPair, split: Split
) -> None:
    old, new, hot = split.old, split.new, split.hot
    await generate(old, split.sync)
    dispensed = await refill_and_dispense(old, hot)
    shared_history = await ranges(old.settings.postgres_dsn)
    await pair.pause_replication()
    await generate(old, split.sync)  # a lease the replica never sees
    dispensed += await refill_and_dispense(old, hot)
    # A batch the old primary committed but had not pushed yet when the other took over.
    straggler = await old.guarded.begin_take("farmer", 50)
    await straggler.commit()
    await pair.promote_replica()  # the old primary stays up and writable

    # Processes that reach the promoted server: its first guarded statement fences it.
    dispensed += await refill_and_dispense(new, hot)
    await generate(new, split.sync)
    dispensed += await refill_and_dispense(new, hot)

    # Processes that still reach the old primary: refused, and it never fences back.
    with pytest.raises(StoreUnavailable, match="lost"):
        await Keysync(old.settings, old.guarded, hot).push(
            "farmer", straggler.keys, straggler.stamp
        )
    with pytest.raises(PostgresSuperseded):
        await refill_and_dispense(old, hot)
    with pytest.raises(PostgresSuperseded):
        await generate(old, split.sync)
    assert split.sync is not None
    record = await split.sync.read()
    assert record.timeline >= 2 and not record.halted

    dispensed += await refill_and_dispense(new, hot)
    assert len(dispensed) == len(set(dispensed)), "a key was dispensed twice"
    assert not set(straggler.keys) & set(dispensed)
    after_old = await ranges(old.settings.postgres_dsn) - shared_history
    after_new = await ranges(new.settings.postgres_dsn) - shared_history
    assert after_old and after_new
    assert not after_old & after_new, "both primaries leased one range"


@pytest.mark.parametrize("split", [False], indirect=True)
async def test_control_without_the_guard_both_primaries_hand_out_the_same_keys(
    pair: PostgresPair, split: Split
) -> None:
    """The hazard: the promoted server leases again the range the old one leased after
    the replica stopped replaying, and both push its keys."""
    old, new, hot = split.old, split.new, split.hot
    await generate(old, None)
    await caught_up(old.settings.postgres_dsn, new.settings.postgres_dsn)
    await pair.pause_replication()
    await generate(old, None)
    dispensed = await refill_and_dispense(old, hot)
    await pair.promote_replica()
    await generate(new, None)
    await generate(new, None)
    for _ in range(4):
        dispensed += await refill_and_dispense(new, hot)
        dispensed += await refill_and_dispense(old, hot)
    assert len(dispensed) > len(set(dispensed))


class LeasesDuringTheClaim(SyncRecord):
    """The old primary leases a range (and records it) after the promoted server's
    fence read the record, just before the fence claims it. Shares ``other``'s
    endpoint (so it is not closed on its own)."""

    def __init__(self, other: SyncRecord) -> None:
        super().__init__(other.endpoint, other.namespace)
        self.before_claim: list[object] = []

    async def reset(
        self,
        stamp: Stamp,
        floors: dict[str, int],
        mode: str = "automatic",
        pending: bool = False,
        read: Record | None = None,
        restore_to: str = "",
    ) -> str:
        while self.before_claim:
            step = self.before_claim.pop()
            assert callable(step)
            await step()
        return await super().reset(stamp, floors, mode, pending, read, restore_to)


async def test_a_lease_recorded_during_a_fence_moves_the_fence_past_it(
    pair: PostgresPair, split: Split
) -> None:
    """The fence reads the record under the lock it fences under, and its claim is
    refused when a lease was recorded since: it reads again, and moves past that lease
    too. Without the refusal, the promoted server would lease the same range."""
    old, new = split.old, split.new
    assert split.sync is not None
    await generate(old, split.sync)
    await caught_up(old.settings.postgres_dsn, new.settings.postgres_dsn)
    await pair.pause_replication()
    await old.guarded.lease_range(old.farmer, "old-keygen")  # the replica never sees it
    await pair.promote_replica()
    racing = LeasesDuringTheClaim(split.sync)
    leased: list[int] = []

    async def old_primary_leases() -> None:
        leased.append((await old.guarded.lease_range(old.farmer, "old-keygen")).stop)

    racing.before_claim.append(old_primary_leases)
    report = await settle(new.cold, racing, new.types)
    assert report is not None and leased
    assert report.next_starts["farmer"] >= leased[0]
    next_lease = await new.guarded.lease_range(new.farmer, "new-keygen")
    assert next_lease.start >= leased[0]


async def test_a_range_leased_before_a_fence_is_never_copied_after_it(
    split: Split,
) -> None:
    """keygen paused (or slow) between its lease and its COPY while the fence ran: the
    fence discarded the inventory, and the range's keys must not land after it."""
    old = split.old
    assert split.sync is not None
    leased = await old.guarded.lease_range(old.farmer, "paused-keygen")
    await split.sync.halt("test")  # force a fence (an operator's, here)
    await settle(old.cold, split.sync, old.types, skip_ranges=1)
    with pytest.raises(RangeFenced):
        await old.cold.insert_keys(old.farmer, leased, ["1234567890"], 1, final=False)
    assert await old.cold.depth("farmer", 10) == 0
    conn = await asyncpg.connect(old.settings.postgres_dsn)
    try:
        clock = await conn.fetchrow(fence_sql.SELECT_SYNC_CLOCK)
        assert clock is not None and clock["fences"] == leased.fences + 1
    finally:
        await conn.close()


async def test_redis_losing_the_record_during_a_split_brain_halts_both_sides(
    pair: PostgresPair, split: Split, redis_client: aioredis.Redis
) -> None:
    """Redis restarts empty while both primaries take writes: neither may rebuild the
    record (the old one would set it back to its own timeline and hand out again what
    the new one did). A process whose DSN names both sees the other writable primary
    and halts; an operator demotes the old one, then fences."""
    old, new = split.old, split.new
    assert split.sync is not None
    await generate(old, split.sync)
    await caught_up(old.settings.postgres_dsn, new.settings.postgres_dsn)
    await pair.pause_replication()
    await pair.promote_replica()
    await new.guarded.lease_range(new.farmer, "new-keygen")  # the record follows the new one
    await redis_client.flushdb()  # Redis restarts without persistence
    hosts = ",".join(s.settings.postgres_dsn.split("@")[1].split("/")[0] for s in (old, new))
    dsn = f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"
    cold = await ColdStore.connect(dsn, min_size=0, connect_timeout_s=2)
    try:
        with pytest.raises(FenceHalted, match="two postgres primaries"):
            await GuardedCold(cold, split.sync, old.types).take_batch("farmer", 10)
    finally:
        await cold.close()
    record = await split.sync.read()
    assert record.halted and record.timeline == 0  # nothing was rebuilt from either


@dataclass
class PerType:
    """farmer and shortlink each with a record of its own (a Redis Cluster's
    ``slot_per: type``), here as two namespaces on the test server."""

    records: SyncRecords
    hot: dict[str, HotStore]
    spaces: dict[str, str]

    @classmethod
    def on(cls, endpoint: RedisEndpoint, prefix: str, shortlink: type[SyncRecord]) -> PerType:
        spaces = {name: f"{prefix}-{name}" for name in ("farmer", "shortlink")}
        made: dict[str, type[SyncRecord]] = {"farmer": SyncRecord, "shortlink": shortlink}
        records = SyncRecords(
            {ns: made[name](endpoint, ns) for name, ns in spaces.items()},
            {ns: (name,) for name, ns in spaces.items()},
        )
        return cls(records, {name: HotStore(endpoint, ns) for name, ns in spaces.items()}, spaces)

    async def lease(self, side: Side, names: tuple[str, ...]) -> None:
        generator = Generator(1)
        try:
            keygen = Keygen.on_postgres(
                side.settings, side.cold, self.records, asyncio.Event(), generator
            )
            for name in names:
                await keygen.lease_and_generate(side.types[name])
        finally:
            generator.close()

    async def dispensed(self, side: Side, name: str) -> set[str]:
        """A batch taken and pushed (its stamp recorded in its type's record)."""
        keys, stamp = await GuardedCold(side.cold, self.records, side.types).take_batch(name, 100)
        pushed = await self.hot[name].push(name, keys, uuid.uuid4().hex, stamp=stamp)
        assert pushed.status == "pushed", pushed
        return set((await self.hot[name].pop(name, 1_000)).keys)

    async def farmer_after(self, side: Side) -> set[str]:
        """farmer's keys once the promoted server leased a range of its own."""
        await self.lease(side, ("farmer",))
        guarded = GuardedCold(side.cold, self.records, side.types)
        return {key for _ in range(5) for key in (await guarded.take_batch("farmer", 1_000))[0]}


async def test_with_a_record_per_type_a_new_timeline_is_judged_against_every_record(
    pair: PostgresPair, split: Split, servers: Servers, redis_client: aioredis.Redis
) -> None:
    """farmer's last batch on the old primary never reached the replica that is
    promoted; shortlink's record knows nothing of it. shortlink's first write on the
    promoted server must not take up its new timeline on shortlink's record alone: it
    is refused, and ``settle`` judges every record, finds farmer's ahead of the new
    history, and fences. Without that, the promoted server's clock would move on past
    the lost batch, and once farmer's record is lost (its shard restarted empty) it
    would be vouched for, and the lost batch's keys handed out again."""
    old, new = split.old, split.new
    endpoint = RedisEndpoint(servers.redis_url)
    groups = PerType.on(endpoint, "kd-split", SyncRecord)
    try:
        await groups.lease(old, ("farmer", "shortlink"))
        taken = await groups.dispensed(old, "farmer")
        await groups.dispensed(old, "shortlink")
        await caught_up(old.settings.postgres_dsn, new.settings.postgres_dsn)
        await pair.pause_replication()
        lost = await groups.dispensed(old, "farmer")  # its take never reached the replica
        await pair.promote_replica()

        await GuardedCold(new.cold, groups.records, new.types).take_batch("shortlink", 100)
        conn = await asyncpg.connect(new.settings.postgres_dsn)
        try:
            event = await conn.fetchrow(fence_sql.SELECT_LAST_FENCE)
        finally:
            await conn.close()
        assert event is not None and event["reason"] == "behind"  # refused, settled
        await redis_client.delete(redis_keys.sync_record_key(groups.spaces["farmer"]))
        after = await groups.farmer_after(new)
        assert lost and after  # new keys flow on the promoted server
        assert not after & (taken | lost)
    finally:
        await endpoint.close()


async def test_with_a_record_per_type_a_fence_that_rolled_back_is_done_again(
    pair: PostgresPair, split: Split, servers: Servers
) -> None:
    """The promoted server's fence claims farmer's record (farmer's last batch on the
    old primary never reached it), then fails to claim shortlink's and rolls back.
    farmer's record, claimed for a fence that never committed, must not pass for
    fenced: on the next settle (shortlink's write on the new timeline) farmer's claim
    is found pending on a history the server does not have, and the fence runs again,
    for real. Taken for fenced, the new timeline would be taken up over farmer's lost
    batch, and its keys, still in the promoted server's cold table, handed out again."""
    old, new = split.old, split.new
    endpoint = RedisEndpoint(servers.redis_url)
    groups = PerType.on(endpoint, "kd-split2", ClaimFailsOnce)
    try:
        await groups.lease(old, ("farmer", "shortlink"))
        await caught_up(old.settings.postgres_dsn, new.settings.postgres_dsn)
        await pair.pause_replication()
        lost = await groups.dispensed(old, "farmer")  # its take never reached the replica
        await pair.promote_replica()

        on_new = GuardedCold(new.cold, groups.records, new.types)
        with pytest.raises(StoreUnavailable):
            await on_new.take_batch("shortlink", 100)  # the fence rolled back
        await on_new.take_batch("shortlink", 100)  # settled again: fenced for real
        after = await groups.farmer_after(new)
        assert after and not after & lost
        assert [(await r.read()).claim_fences for r in groups.records] == [0, 0]
    finally:
        await endpoint.close()
