"""push.lua records each batch's PostgreSQL stamp, and refuses one it cannot trust.

A stale stamp means the batch was taken from a PostgreSQL that lost commits, from
another history (an older timeline, another server promoted to the same one, or from
before a fence), or from another database: its keys may already have been handed
out, so it is lost (counted by keysync), never pushed. Driven through the real
script, with stamps written by hand.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.domain.tiers import Stamp
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from tests.conftest import NS

DB = "7712819248751995008/kd"


def stamp(timeline: int, fork: int, clock: int, database: str = DB) -> Stamp:
    return Stamp(timeline, fork, clock, database)


async def start_record(sync: SyncRecord, timeline: int, fork: int, clock: int) -> None:
    """A record rebuilt from a server (as the fence's vouch does)."""
    assert await sync.vouch(stamp(timeline, fork, clock), {}) == "ok"


async def listed(redis_client: aioredis.Redis) -> list[str]:
    return [str(k) for k in await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1)]


async def test_a_batch_from_a_newer_timeline_that_forked_too_early_is_not_pushed(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    await start_record(sync, 2, 0, 1)
    first = await hot.push("farmer", ["a", "b"], "b1", stamp=stamp(2, 0, 20))
    assert first.status == "pushed"
    # Timeline 3 forked at clock 15, before the recorded commit 20: commits were lost.
    stale = await hot.push("farmer", ["c", "d"], "b2", stamp=stamp(3, 15, 16))
    assert stale.status == "stale"
    assert await listed(redis_client) == ["a", "b"]
    record = await redis_client.hgetall(redis_keys.sync_record_key(NS))
    assert record["fence_needed"] == "1"
    assert (record["timeline"], record["clock"]) == ("2", "20")  # the record is untouched


async def test_a_straggler_from_an_older_timeline_is_not_pushed(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    await start_record(sync, 3, 10, 11)
    assert (await hot.push("farmer", ["a"], "b1", stamp=stamp(3, 10, 12))).status == "pushed"
    straggler = await hot.push("farmer", ["b"], "b2", stamp=stamp(2, 0, 11))
    assert straggler.status == "stale"
    assert await listed(redis_client) == ["a"]
    # Everything recorded before timeline 3 took over is in its history: nothing to
    # fence, and the record stays on timeline 3 (no fencing back and forth).
    record = await sync.read()
    assert (record.timeline, record.clock) == (3, 12) and not record.fence_needed


async def test_another_history_on_the_same_timeline_is_not_pushed(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """A second server promoted to the same timeline number, or a batch taken before a
    fence restarted the record (a new fork): not the history the record follows."""
    await start_record(sync, 2, 50, 51)
    other = await hot.push("farmer", ["x"], "b1", stamp=stamp(2, 40, 99))
    assert other.status == "stale"
    assert await listed(redis_client) == []


async def test_nothing_is_pushed_until_a_lost_record_is_rebuilt(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """Redis restarted empty (no record) or failed over (untrusted): a straggler from an
    older timeline would otherwise set the record back to its own timeline."""
    assert (await hot.push("farmer", ["a"], "b1", stamp=stamp(1, 0, 9))).status == "untrusted"
    await start_record(sync, 2, 5, 6)
    await redis_client.delete(redis_keys.fence_key(NS))  # a new server: record untrusted
    assert (await sync.read()).untrusted
    straggler = await hot.push("farmer", ["b"], "b2", stamp=stamp(1, 0, 9))
    assert straggler.status == "untrusted"
    # A vouch from the old timeline's server is refused: the record never goes back.
    assert await sync.vouch(stamp(1, 0, 10), {}) == "superseded"
    assert await sync.vouch(stamp(2, 5, 7), {"farmer": 40}) == "ok"
    assert (await hot.push("farmer", ["b"], "b2", stamp=stamp(1, 0, 9))).status == "stale"
    assert (await hot.push("farmer", ["c"], "b3", stamp=stamp(2, 5, 8))).status == "pushed"
    assert await listed(redis_client) == ["c"]
    record = await sync.read()
    assert (record.timeline, record.fork, record.clock, record.leased) == (2, 5, 8, {"farmer": 40})


async def test_another_databases_batch_is_not_pushed(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    await start_record(sync, 1, 0, 1)
    foreign = await hot.push("farmer", ["a"], "b1", stamp=stamp(1, 0, 5, "1/other"))
    assert foreign.status == "foreign"
    assert await sync.bind("1/other") == DB  # the namespace stays bound to its database
    assert await listed(redis_client) == []


async def test_nothing_is_pushed_while_the_fence_is_halted(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    await start_record(sync, 2, 0, 1)
    await redis_client.hset(redis_keys.sync_record_key(NS), "halted", "1")
    halted = await hot.push("farmer", ["a"], "b1", stamp=stamp(2, 0, 5))
    assert halted.status == "halted"
    assert await hot.depth("farmer") == 0


async def test_a_push_past_its_deadline_on_the_servers_clock_adds_nothing(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """A keysync paused past its batch's deadline: refused by the server's TIME, even
    once the marker of an earlier attempt has expired."""
    now = await hot.server_time_ms()
    late = await hot.push("farmer", ["a"], "b1", not_after_ms=now - 1)
    assert late.status == "expired"
    assert (await hot.push("farmer", ["a"], "b2", not_after_ms=now + 60_000)).status == "pushed"
    # The marker outlives the deadline, whatever the marker's own TTL says.
    ttl_ms = await redis_client.pttl(redis_keys.batch_key(NS, "b2"))
    assert ttl_ms > 60_000 - 5_000
    short = await hot.push("farmer", ["b"], "b3", not_after_ms=now + 30_000, marker_ttl_s=1)
    assert short.status == "pushed"
    assert await redis_client.pttl(redis_keys.batch_key(NS, "b3")) > 25_000
    assert await listed(redis_client) == ["a", "b"]


async def test_a_current_stamp_is_pushed_and_advances_the_record(
    hot: HotStore, sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """The control: the same script pushes batches whose stamps are current."""
    await start_record(sync, 2, 0, 1)
    assert (await hot.push("farmer", ["a"], "b1", stamp=stamp(2, 0, 5))).status == "pushed"
    assert (await hot.push("farmer", ["b"], "b2", stamp=stamp(2, 0, 9))).status == "pushed"
    assert (await hot.push("farmer", ["c"], "b3", stamp=stamp(3, 9, 10))).status == "pushed"
    record = await redis_client.hgetall(redis_keys.sync_record_key(NS))
    assert (record["timeline"], record["fork"], record["clock"]) == ("3", "9", "10")
    assert await hot.depth("farmer") == 3


async def test_a_fence_claims_the_record_only_with_an_up_to_date_view(sync: SyncRecord) -> None:
    """reset_record: refused when a lease was recorded above the floors the fence moved
    its sequences to since it read the record, when the record follows a newer timeline,
    or belongs to another database; otherwise a new history starts."""
    await start_record(sync, 3, 0, 39)
    assert await sync.record_lease("farmer", 100, stamp(3, 0, 40)) == "ok"
    assert await sync.reset(stamp(4, 41, 42), {"farmer": 60}) == "moved"
    assert await sync.reset(stamp(2, 41, 42), {"farmer": 100}) == "superseded"
    assert await sync.reset(stamp(4, 41, 42, "1/other"), {"farmer": 100}) == "foreign"
    assert await sync.reset(stamp(4, 41, 42), {"farmer": 100}) == "ok"
    record = await sync.read()
    assert (record.timeline, record.fork, record.clock, record.leased) == (
        4,
        41,
        42,
        {"farmer": 100},
    )


async def test_a_fence_never_claims_a_record_redis_lost_meanwhile(
    sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """Redis changed identity between the fence's read and its claim (the record turned
    untrusted, maybe lost leases): the fence reads again rather than certify it. An
    operator's fence claims it, and gives back the leases it moved past."""
    await start_record(sync, 3, 0, 39)
    assert await sync.record_lease("farmer", 100, stamp(3, 0, 40)) == "ok"
    await redis_client.delete(redis_keys.fence_key(NS))  # a new Redis server
    await redis_client.hdel(redis_keys.sync_record_key(NS), "leased:farmer")  # lost
    assert (await sync.read()).untrusted
    assert await sync.reset(stamp(4, 41, 42), {"farmer": 100}) == "moved"
    assert await sync.reset(stamp(4, 41, 42), {"farmer": 100}, "operator") == "ok"
    record = await sync.read()
    assert not record.untrusted and record.leased == {"farmer": 100}


async def test_a_vouch_decided_before_redis_lost_state_again_is_not_written(
    sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """A process decides a vouch (its VOUCH committed at clock 10) and stalls before
    writing the record; another vouches at clock 11, and a take is recorded at 12; then
    Redis restarts empty again. The stalled vouch, written now, would rebuild the record
    at clock 10, behind the take it no longer knows: a PostgreSQL promoted back to clock
    10 would then not be fenced, and the taken keys issued again. Its epoch (the
    record's fenced_at when it was decided) is gone: refused as 'stale'."""
    await start_record(sync, 2, 0, 1)
    await redis_client.flushdb()  # Redis restarted without persistence
    decided = await sync.read()
    assert decided.untrusted and decided.fenced_at
    assert await sync.vouch(stamp(2, 0, 11), {}, "", decided.fenced_at) == "ok"
    assert await sync.record_lease("farmer", 5_000, stamp(2, 0, 12)) == "ok"
    await asyncio.sleep(0.005)  # fenced_at counts milliseconds
    await redis_client.flushdb()  # and again
    now = await sync.read()
    assert now.untrusted and now.fenced_at != decided.fenced_at
    assert await sync.vouch(stamp(2, 0, 10), {}, "", decided.fenced_at) == "stale"
    assert (await sync.read()).untrusted  # nothing rebuilt from the stalled stamp
    assert await sync.vouch(stamp(2, 0, 13), {}, "", now.fenced_at) == "ok"
    assert (await sync.read()).clock == 13


async def test_control_a_vouch_without_its_epoch_rebuilds_from_a_stalled_stamp(
    sync: SyncRecord, redis_client: aioredis.Redis
) -> None:
    """The hazard the epoch closes: unchecked, the stalled stamp is written."""
    await start_record(sync, 2, 0, 1)
    await redis_client.flushdb()
    await sync.read()
    assert await sync.vouch(stamp(2, 0, 11), {}) == "ok"
    await redis_client.flushdb()
    await sync.read()
    assert await sync.vouch(stamp(2, 0, 10), {}) == "ok"
    assert (await sync.read()).clock == 10  # behind what was recorded before the loss
