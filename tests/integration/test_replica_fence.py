"""The fence on a real replica (REPLICAOF), and on a real promotion.

Two embedded servers on loopback ports, whatever KD_TEST_REDIS_URL says: a primary
and its replica. Every hot-list script must refuse on the replica, even one whose
``replica-read-only`` is off, where only the fence's role check stands between a
stale copy of the lists and a client. A promoted replica has a new identity and
discards exactly the lists it inherited.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.domain.errors import StoreUnavailable
from shared.ops.embedded import EmbeddedRedis
from shared.stores import redis_keys
from shared.stores.hot_store import HotStore
from shared.stores.redis_endpoint import RedisEndpoint
from tests.conftest import NS

REPLICA_REFUSAL = "this server is a replica, not the primary"
SYNC_DEADLINE_S = 20.0


@dataclass
class Pair:
    primary: EmbeddedRedis
    replica: EmbeddedRedis
    primary_client: aioredis.Redis
    replica_client: aioredis.Redis


async def until(check: object, what: str) -> None:
    """Poll an async predicate until it holds; fail after SYNC_DEADLINE_S."""
    assert callable(check)
    deadline = time.monotonic() + SYNC_DEADLINE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {SYNC_DEADLINE_S}s")
        await asyncio.sleep(0.05)


async def replicaof(client: aioredis.Redis, host: str, port: str) -> None:
    await client.execute_command("REPLICAOF", host, port)  # type: ignore[no-untyped-call]


async def token(client: aioredis.Redis) -> str:
    server, replication = await client.info("server"), await client.info("replication")
    return f"{server['run_id']}:{replication['master_replid']}"


async def caught_up(pair: Pair) -> None:
    async def same_offset() -> bool:
        primary = await pair.primary_client.info("replication")
        replica = await pair.replica_client.info("replication")
        return bool(
            replica.get("master_link_status") == "up"
            and replica.get("slave_repl_offset") == primary.get("master_repl_offset")
        )

    await until(same_offset, "replica caught up")


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    with tempfile.TemporaryDirectory(prefix="kd-replica-") as tmp:
        primary = EmbeddedRedis(Path(tmp) / "primary")
        replica = EmbeddedRedis(Path(tmp) / "replica")
        primary.start()
        replica.start()
        clients = [
            aioredis.Redis.from_url(s.url, decode_responses=True) for s in (primary, replica)
        ]
        try:
            await replicaof(clients[1], "127.0.0.1", str(primary.port))
            found = Pair(primary, replica, *clients)
            await caught_up(found)
            yield found
        finally:
            for client in clients:
                await client.aclose()
            replica.stop()
            primary.stop()


async def filled_primary(pair: Pair, keys: int) -> HotStore:
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    await hot.push("farmer", [f"f{i}" for i in range(keys)], "b1")
    await caught_up(pair)
    return hot


async def refusals(hot: HotStore) -> list[str]:
    """Every hot-list operation on ``hot``; the error text of each (all must fail)."""
    calls = {
        "observe": hot.observe("farmer"),
        "depth": hot.depth("farmer"),
        "pop": hot.pop("farmer", 3),
        "push": hot.push("farmer", ["x"], "b2"),
    }
    texts = []
    for name, call in calls.items():
        with pytest.raises(StoreUnavailable) as raised:
            await call
        texts.append(f"{name}: {raised.value}")
    return texts


async def test_every_script_refuses_on_a_replica(pair: Pair) -> None:
    primary = await filled_primary(pair, 20)
    replica = HotStore(RedisEndpoint(pair.replica.url), NS)
    try:
        for text in await refusals(replica):
            assert REPLICA_REFUSAL in text, text
        assert await pair.replica_client.llen(redis_keys.hot_list_key(NS, "farmer")) == 20
    finally:
        await replica.close()
        await primary.close()


async def test_a_writable_replica_is_refused_too(pair: Pair) -> None:
    """replica-read-only off: Redis itself would let the scripts write; the fence must not."""
    primary = await filled_primary(pair, 20)
    await pair.replica_client.config_set("replica-read-only", "no")
    replica = HotStore(RedisEndpoint(pair.replica.url), NS)
    try:
        for text in await refusals(replica):
            assert REPLICA_REFUSAL in text, text
        assert await pair.replica_client.llen(redis_keys.hot_list_key(NS, "farmer")) == 20
        assert await pair.replica_client.get(redis_keys.fence_key(NS)) == await token(
            pair.primary_client
        )
    finally:
        await replica.close()
        await primary.close()


async def test_a_promoted_replica_has_a_new_identity_and_discards_what_it_inherited(
    pair: Pair,
) -> None:
    primary = await filled_primary(pair, 30)
    popped = await primary.pop("farmer", 5)
    assert len(popped.keys) == 5
    await caught_up(pair)
    old_token = await token(pair.primary_client)
    await replicaof(pair.replica_client, "NO", "ONE")
    promoted = HotStore(RedisEndpoint(pair.replica.url), NS)
    try:
        seen = await promoted.observe("farmer")
        assert seen.token != old_token
        assert seen.token == await token(pair.replica_client)
        assert seen.discarded == 25 and seen.length == 0  # exactly the inherited keys
        assert await promoted.discarded_counts() == {redis_keys.hot_list_key(NS, "farmer"): 25}
        assert (await promoted.pop("farmer", 5)).keys == []
    finally:
        await promoted.close()
        await primary.close()
