"""The failover fence on a real server: inherited hot lists are discarded, never reissued.

A change of primary is simulated by overwriting the owner token, which is what a
promoted replica, a failed-back primary or a restarted one looks like to the
script: a token that is not its own. The drill does it for real (docs/reliability.md).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.stores.hot.hot_store import HotStore
from tests.conftest import NS


async def server_token(client: aioredis.Redis) -> str:
    server = await client.info("server")
    replication = await client.info("replication")
    return f"{server['run_id']}:{replication['master_replid']}"


async def test_first_use_takes_ownership(hot: HotStore, redis_client: aioredis.Redis) -> None:
    seen = await hot.observe("farmer")
    assert seen.token == await server_token(redis_client)
    assert await redis_client.get(redis_keys.fence_key(NS)) == seen.token


async def test_a_new_owner_discards_every_inherited_list(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    await hot.push("farmer", [f"f{i}" for i in range(30)], "b1")
    await hot.push("shortlink", [f"s{i}" for i in range(12)], "b2")
    await hot.pop("farmer", 5)
    await redis_client.set(redis_keys.fence_key(NS), "another-server:another-replid")

    popped = await hot.pop("farmer", 10)
    assert popped.keys == [] and popped.discarded == 25 + 12
    assert await hot.depth("shortlink") == 0  # every list, not only the one popped
    counts = await hot.discarded_counts()
    assert counts == {
        redis_keys.hot_list_key(NS, "farmer"): 25,
        redis_keys.hot_list_key(NS, "shortlink"): 12,
    }
    assert hot.discarded == 37
    # Ownership is taken once: later pushes and pops work normally.
    await hot.push("farmer", ["new"], "b3")
    assert (await hot.pop("farmer", 1)).keys == ["new"]


async def test_a_retried_push_is_not_added_twice(hot: HotStore) -> None:
    first = await hot.push("farmer", ["a", "b"], "same-batch")
    again = await hot.push("farmer", ["a", "b"], "same-batch")
    assert (first.status, again.status) == ("pushed", "duplicate")
    assert await hot.depth("farmer") == 2


async def test_a_pinned_push_lands_only_on_its_server(hot: HotStore) -> None:
    token = (await hot.observe("farmer")).token
    refused = await hot.push("farmer", ["x"], "b1", pin="some-other-server:replid")
    assert refused.status == "refused" and refused.token == token
    assert await hot.depth("farmer") == 0
    accepted = await hot.push("farmer", ["x"], "b1", pin=token)  # refusal set no marker
    assert accepted.status == "pushed"
    assert await hot.depth("farmer") == 1


async def test_large_batches_are_chunked(hot: HotStore) -> None:
    pushed = await hot.push("shortlink", [f"k{i}" for i in range(20_000)], "big")
    assert pushed.length == 20_000
