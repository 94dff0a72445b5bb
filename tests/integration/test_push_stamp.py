"""push.lua records each batch's PostgreSQL stamp, and refuses a stale one.

A stale stamp means the batch was taken from a PostgreSQL that lost commits: its
keys may already have been handed out, so it is lost (counted by keysync), never
pushed. Driven through the real script, with stamps written by hand.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.stores import redis_keys
from shared.stores.hot_store import HotStore
from shared.stores.sync_record import Stamp
from tests.conftest import NS


async def test_a_batch_from_a_newer_timeline_that_forked_too_early_is_not_pushed(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    first = await hot.push("farmer", ["a", "b"], "b1", stamp=Stamp(2, 0, 20))
    assert first.status == "pushed"
    # Timeline 3 forked at clock 15, before the recorded commit 20: commits were lost.
    stale = await hot.push("farmer", ["c", "d"], "b2", stamp=Stamp(3, 15, 16))
    assert stale.status == "stale"
    assert await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1) == ["a", "b"]
    record = await redis_client.hgetall(redis_keys.sync_record_key(NS))
    assert record["fence_needed"] == "1"
    assert (record["timeline"], record["clock"]) == ("2", "20")  # the record is untouched


async def test_a_straggler_from_an_older_timeline_is_not_pushed(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    assert (await hot.push("farmer", ["a"], "b1", stamp=Stamp(3, 10, 12))).status == "pushed"
    straggler = await hot.push("farmer", ["b"], "b2", stamp=Stamp(2, 0, 11))
    assert straggler.status == "stale"
    assert await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1) == ["a"]


async def test_nothing_is_pushed_while_the_fence_is_halted(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    await redis_client.hset(redis_keys.sync_record_key(NS), "halted", "1")
    halted = await hot.push("farmer", ["a"], "b1", stamp=Stamp(2, 0, 5))
    assert halted.status == "stale"
    assert await hot.depth("farmer") == 0


async def test_a_current_stamp_is_pushed_and_advances_the_record(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """The control: the same script pushes batches whose stamps are current."""
    assert (await hot.push("farmer", ["a"], "b1", stamp=Stamp(2, 0, 5))).status == "pushed"
    assert (await hot.push("farmer", ["b"], "b2", stamp=Stamp(2, 0, 9))).status == "pushed"
    assert (await hot.push("farmer", ["c"], "b3", stamp=Stamp(3, 9, 10))).status == "pushed"
    record = await redis_client.hgetall(redis_keys.sync_record_key(NS))
    assert (record["timeline"], record["fork"], record["clock"]) == ("3", "9", "10")
    assert await hot.depth("farmer") == 3
