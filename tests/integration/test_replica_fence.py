"""The fence on a real replica (REPLICAOF), and on a real promotion.

Two embedded servers on loopback ports, whatever KD_TEST_REDIS_URL says: a primary
and its replica. Every hot-list script must refuse on the replica, even one whose
``replica-read-only`` is off, where only the fence's role check stands between a
stale copy of the lists and a client. A promoted replica has a new identity and
discards exactly the lists it inherited; so does a failed-back primary, and a server
restarted from a snapshot older than what it dispensed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import EmbeddedRedis
from shared.domain import redis_keys
from shared.domain.errors import StoreUnavailable
from shared.leases.store import MachineLeases
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint
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
    await synced(pair.primary_client, pair.replica_client)


async def synced(primary_client: aioredis.Redis, replica_client: aioredis.Redis) -> None:
    async def same_offset() -> bool:
        primary = await primary_client.info("replication")
        replica = await replica_client.info("replication")
        return bool(
            replica.get("master_link_status") == "up"
            and replica.get("slave_repl_offset") == primary.get("master_repl_offset")
        )

    await until(same_offset, "replica caught up")


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with started_pair() as found:
        yield found


@contextlib.asynccontextmanager
async def started_pair(binary: str = "", *primary_options: str) -> AsyncIterator[Pair]:
    """An embedded primary (started with ``primary_options``) and its replica, caught up;
    ``binary``: the servers' executable ("": the default)."""
    with tempfile.TemporaryDirectory(prefix="kd-replica-") as tmp:
        primary = EmbeddedRedis(Path(tmp) / "primary", binary=binary)
        replica = EmbeddedRedis(Path(tmp) / "replica", binary=binary)
        primary.start(*primary_options)
        replica.start()
        clients = [
            aioredis.Redis.from_url(s.url, decode_responses=True) for s in (primary, replica)
        ]
        try:
            for client in clients:  # full syncs start at once, not after the default 5 s
                await client.config_set("repl-diskless-sync-delay", 0)
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


async def test_a_failed_back_primary_has_a_new_identity_and_discards_what_it_inherited(
    pair: Pair,
) -> None:
    farmer = redis_keys.hot_list_key(NS, "farmer")
    first = await filled_primary(pair, 30)
    assert len((await first.pop("farmer", 5)).keys) == 5
    await caught_up(pair)
    first_token = await token(pair.primary_client)
    # Failover: the replica takes over (discarding 25) and is refilled with 10 keys.
    await replicaof(pair.replica_client, "NO", "ONE")
    promoted = HotStore(RedisEndpoint(pair.replica.url), NS)
    assert (await promoted.observe("farmer")).discarded == 25
    await promoted.push("farmer", [f"g{i}" for i in range(10)], "b2")
    promoted_token = await token(pair.replica_client)
    # The old primary returns as the new primary's replica: it must refuse everything.
    await replicaof(pair.primary_client, "127.0.0.1", str(pair.replica.port))
    await synced(pair.replica_client, pair.primary_client)
    for text in await refusals(first):
        assert REPLICA_REFUSAL in text, text
    # Failback: the old primary is promoted again, the other follows it.
    await replicaof(pair.primary_client, "NO", "ONE")
    await replicaof(pair.replica_client, "127.0.0.1", str(pair.primary.port))
    try:
        back = await first.observe("farmer")
        assert (await pair.primary_client.info("replication"))["role"] == "master"
        assert back.token == await token(pair.primary_client)
        assert back.token not in (first_token, promoted_token)
        assert back.discarded == 10 and back.length == 0  # exactly what it inherited
        assert await first.discarded_counts() == {farmer: 25 + 10}
        assert (await first.pop("farmer", 5)).keys == []
    finally:
        await promoted.close()
        await first.close()


async def test_a_restart_from_an_older_snapshot_discards_the_stale_lists() -> None:
    farmer = redis_keys.hot_list_key(NS, "farmer")
    with tempfile.TemporaryDirectory(prefix="kd-snapshot-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "server")
        server.start()
        client = aioredis.Redis.from_url(server.url, decode_responses=True)
        hot = HotStore(RedisEndpoint(server.url), NS)
        try:
            await hot.push("farmer", [f"f{i}" for i in range(20)], "b1")
            await client.save()
            snapshot = Path(tmp) / "old.rdb"
            shutil.copy(server.data_dir / "dump.rdb", snapshot)
            dispensed = (await hot.pop("farmer", 8)).keys  # after the snapshot
            assert len(dispensed) == 8
            old_token = await token(client)
            await hot.close()
            await client.aclose()
            server.stop()
            shutil.copy(snapshot, server.data_dir / "dump.rdb")
            server.start()  # same port, loads the older snapshot
            client = aioredis.Redis.from_url(server.url, decode_responses=True)
            hot = HotStore(RedisEndpoint(server.url), NS)
            # The snapshot is stale: it still holds the 8 dispensed keys and the old owner.
            assert await client.llen(farmer) == 20
            assert await client.get(redis_keys.fence_key(NS)) == old_token
            seen = await hot.observe("farmer")
            assert seen.token == await token(client) != old_token
            assert seen.discarded == 20 and seen.length == 0
            assert (await hot.pop("farmer", 20)).keys == []
        finally:
            await hot.close()
            await client.aclose()
            server.stop()


async def test_a_promotion_ends_every_machine_id_lease_and_grants_wait_one_ttl(
    pair: Pair,
) -> None:
    """The lease replicated to the promoted server, alive there, is refused all the same:
    its holder re-acquires after the settle period (docs/leases.md)."""
    old = MachineLeases(RedisEndpoint(pair.primary.url), NS)
    await old.holders("p")  # first use of the primary: end its settle period by hand
    await pair.primary_client.hset(redis_keys.sync_record_key(NS), "fenced_at", 0)
    held = await old.acquire("p", 0, 0, "holder", 30_000, 12_345, 0)
    assert held.granted
    await caught_up(pair)
    promoted = MachineLeases(RedisEndpoint(pair.replica.url), NS)
    try:
        with pytest.raises(StoreUnavailable, match=REPLICA_REFUSAL):  # not yet promoted
            await promoted.acquire("p", 0, 0, "next", 30_000, 0, 0)
        await replicaof(pair.replica_client, "NO", "ONE")
        assert await promoted.renew("p", 0, "holder", held.fence, 30_000, 0) == "fenced"
        settling = await promoted.acquire("p", 0, 0, "next", 30_000, 0, 0)
        assert settling.status == "settling" and settling.wait_ms > 25_000
        assert (await promoted.holders("p")).last_ms == {0: 12_345}  # the floor survives
    finally:
        await promoted.close()
        await old.close()
