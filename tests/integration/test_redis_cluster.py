"""The hot tier on a real Redis Cluster: 3 primaries and 3 replicas on loopback.

Every key of a namespace shares one hash slot (the namespace is the hash tag), so
every script runs on the one primary that serves it; the endpoint finds that primary
from the cluster's map and follows it through a failover. The fence keeps its
guarantee per shard: a shard's promoted replica has a new identity and discards
exactly the lists it inherited, and its old primary, now a replica, refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from redis.crc import key_slot

from keydispenser_ops.redis_cluster import ClusterNode, EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.leases.store import MachineLeases
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

T = TypeVar("T")
NAMESPACE = "kd"
TAG = "{kd}"
SLOT = key_slot(TAG.encode())
FOLLOW_S = 30.0


def on_cluster(servers: Servers, database: str, cluster: EmbeddedRedisCluster) -> Settings:
    types = small_types()
    types["shortlink"]["ledger"] = True
    types["events"] = {"kind": "snowflake"}
    return make_settings(
        servers, database, id_types=types, redis_cluster={"nodes": list(cluster.seeds[:2])}
    )


async def eventually(call: Callable[[], Awaitable[T]]) -> T:
    """``call`` once the endpoint has found the slot's primary again (StoreUnavailable
    until then: a MOVED or READONLY reply, or a node that does not answer)."""
    deadline = time.monotonic() + FOLLOW_S
    while True:
        try:
            return await call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def caught_up(cluster: EmbeddedRedisCluster, primary: ClusterNode) -> None:
    replica = cluster.replica_of(primary)
    deadline = time.monotonic() + FOLLOW_S
    while True:
        mine = primary.client().info("replication")["master_repl_offset"]
        theirs = replica.client().info("replication").get("slave_repl_offset")
        if mine == theirs:
            return
        assert time.monotonic() < deadline, "replica never caught up"
        await asyncio.sleep(0.05)


def keys_by_node(cluster: EmbeddedRedisCluster) -> dict[str, list[str]]:
    """Every key each live primary holds."""
    found = {}
    for node in cluster.live():
        if node.client().info("replication")["role"] == "master":
            found[node.address] = sorted(node.client().scan_iter(count=1_000))
    return found


async def test_every_key_of_a_namespace_lives_in_its_one_slot(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """Pushes, pops of a ledger type over HTTP (single, batch, with an Idempotency-Key),
    a machine-ID lease and the PostgreSQL fence's record: every key any of them wrote is
    in the namespace's slot, on its primary; the other shards hold nothing. (A script
    whose keys crossed slots would have been refused with CROSSSLOT.)"""
    settings = on_cluster(servers, database, cluster)
    assert settings.redis_key_namespace == TAG
    hot = HotStore.from_settings(settings)
    sync = SyncRecord(hot.endpoint, hot.namespace)
    leases = MachineLeases(RedisEndpoint.from_settings(settings), hot.namespace)
    try:
        for name in ("farmer", "shortlink"):
            await hot.push(name, [f"{name}-{i}" for i in range(100)], f"batch-{name}")
        await sync.bind("a-database")
        # A machine-ID grant (after the settle period a new namespace starts with).
        await leases.holders("events")
        await sync.endpoint.client()
        owner = cluster.primary_of(SLOT)
        owner.command("HSET", redis_keys.sync_record_key(TAG), "fenced_at", 0)
        granted = await leases.acquire("events", 0, 1023, "test", 10_000, 0, 0)
        assert granted.granted, granted
        async with dispenser_over_http(settings) as client:
            one = await client.post("/v1/idgenerator/shortlink/id")
            batch = await client.post("/v1/keys/farmer?count=10")
            again = await client.post(
                "/v1/keys/shortlink?count=3", headers={"Idempotency-Key": "k"}
            )
            assert (one.status_code, batch.status_code, again.status_code) == (200, 200, 200)
            assert len(batch.json()["keys"]) == 10
    finally:
        await hot.close()
        await leases.close()
    holding = {address: keys for address, keys in keys_by_node(cluster).items() if keys}
    owner_address = cluster.primary_of(SLOT).address
    assert list(holding) == [owner_address]
    assert all(
        key.startswith(TAG + ":") and key_slot(key.encode()) == SLOT
        for key in holding[owner_address]
    )
    expected = {
        redis_keys.hot_list_key(TAG, "farmer"),
        redis_keys.fence_key(TAG),
        redis_keys.sync_record_key(TAG),
        redis_keys.ledger_stream_key(TAG),
        redis_keys.machine_leases_key(TAG, "events"),
    }
    assert expected <= set(holding[owner_address])


async def test_a_shard_failover_discards_exactly_what_its_new_primary_inherited(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """CLUSTER FAILOVER on the slot's replica (the old primary stays up, as a replica):
    the endpoint moves to the promoted node, whose fence discards the 25 keys it
    inherited (never handed out again), and the old primary refuses as a replica."""
    settings = on_cluster(servers, database, cluster)
    hot = HotStore.from_settings(settings)
    try:
        await hot.push("farmer", [f"f{i}" for i in range(30)], "b1")
        popped = (await hot.pop("farmer", 5)).keys
        assert len(popped) == 5
        old = cluster.primary_of(SLOT)
        before = (await hot.observe("farmer")).token
        await caught_up(cluster, old)
        replica = cluster.replica_of(old)
        await asyncio.to_thread(cluster.failover, replica)
        await asyncio.to_thread(cluster.wait_healthy)
        seen = await eventually(lambda: hot.observe("farmer"))
        assert cluster.primary_of(SLOT).address == replica.address
        assert seen.token != before
        # Exactly the inherited keys, as the fence recorded them (the figure of the call
        # that took over is lost when its reply is: a call retried finds none left).
        assert seen.length == 0
        assert await hot.discarded_counts() == {redis_keys.hot_list_key(TAG, "farmer"): 25}
        assert (await hot.pop("farmer", 30)).keys == []
        # The shard serves new keys; the old primary, now a replica, refuses.
        await hot.push("farmer", ["g1", "g2"], "b2")
        assert (await hot.pop("farmer", 5)).keys == ["g1", "g2"]
        stale = HotStore(RedisEndpoint(f"redis://{old.address}/0"), TAG)
        try:
            with pytest.raises(StoreUnavailable, match="MOVED"):
                await stale.pop("farmer", 5)
        finally:
            await stale.close()
    finally:
        await hot.close()


async def test_a_killed_shard_primary_is_replaced_and_serving_resumes_without_a_key_twice(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """SIGKILL the slot's primary: the cluster promotes its replica after the node
    timeout; the endpoint finds it; what it inherited is discarded, nothing popped
    before comes back, and a node restarted empty rejoins without taking the slot."""
    settings = on_cluster(servers, database, cluster)
    hot = HotStore.from_settings(settings)
    try:
        await hot.push("farmer", [f"f{i}" for i in range(1_000)], "b1")
        handed_out = set((await hot.pop("farmer", 400)).keys)
        old = cluster.primary_of(SLOT)
        await caught_up(cluster, old)
        cluster.kill(old)
        seen = await eventually(lambda: hot.observe("farmer"))
        assert seen.length == 0  # the inherited keys discarded, as the fence recorded:
        assert await hot.discarded_counts() == {redis_keys.hot_list_key(TAG, "farmer"): 600}
        await hot.push("farmer", [f"g{i}" for i in range(100)], "b2")
        after = (await hot.pop("farmer", 1_000)).keys
        assert len(after) == 100 and handed_out.isdisjoint(after)
        # The killed node comes back with no data (no persistence) and its cluster
        # config: it follows the promoted node; the slot stays where it is.
        promoted = cluster.primary_of(SLOT)
        cluster.restart(old)
        await asyncio.to_thread(cluster.wait_healthy)
        assert cluster.primary_of(SLOT).address == promoted.address
        await hot.push("farmer", ["h1"], "b3")
        assert (await eventually(lambda: hot.pop("farmer", 5))).keys == ["h1"]
    finally:
        await hot.close()


async def test_the_endpoint_names_every_node_it_could_not_use(tmp_path: Path) -> None:
    """No node answers: the error lists what each given node said."""
    from keydispenser_ops.embedded import free_port
    from shared.domain.config import ClusterConfig

    nodes = (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    endpoint = RedisEndpoint(cluster=ClusterConfig(nodes=nodes), key_namespace=TAG)
    try:
        with pytest.raises(StoreUnavailable, match=r"cluster node 127\.0\.0\.1:.*cluster node"):
            await endpoint.client()
    finally:
        await endpoint.close()


async def test_the_primary_is_found_through_the_cluster_after_every_given_node_is_gone(
    cluster: EmbeddedRedisCluster,
) -> None:
    """The one node given (a replica of another shard) is gone, then the slot's primary
    fails over: the endpoint finds the promoted replica through the nodes the cluster
    had named (CLUSTER NODES), not only the nodes its settings list."""
    from redis.exceptions import RedisError

    from shared.domain.config import ClusterConfig

    primary = cluster.primary_of(SLOT)
    ours = {primary.address, cluster.replica_of(primary).address}
    seed = next(
        node
        for node in cluster.live()
        if node.address not in ours and node.client().info("replication")["role"] == "slave"
    )
    endpoint = RedisEndpoint(cluster=ClusterConfig(nodes=(seed.address,)), key_namespace=TAG)

    async def written() -> tuple[str, int] | None:
        try:
            await (await endpoint.client()).set(f"{TAG}:probe", "1")
        except RedisError as exc:
            endpoint.invalidate()
            raise StoreUnavailable("redis", str(exc)) from exc
        return endpoint.address

    try:
        assert await eventually(written) == ("127.0.0.1", primary.server.port)
        promoted = cluster.replica_of(primary)
        cluster.kill(seed)
        cluster.kill(primary)
        assert await eventually(written) == ("127.0.0.1", promoted.server.port)
    finally:
        await endpoint.close()


async def test_moving_the_slot_to_another_shard_hands_out_nothing_twice(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """A reshard of the namespace's slot (the steps `redis-cli --cluster reshard`
    takes): while its keys move, every script is refused (ASK, TRYAGAIN); once they
    moved, the receiving primary is a new identity to the fence and discards the lists
    that arrived with the slot."""
    settings = on_cluster(servers, database, cluster)
    hot = HotStore.from_settings(settings)
    try:
        await hot.push("farmer", [f"f{i}" for i in range(50)], "b1")
        handed_out = set((await hot.pop("farmer", 10)).keys)
        source = cluster.primary_of(SLOT)
        target = next(
            n
            for n in cluster.live()
            if n is not source and n.client().info("replication")["role"] == "master"
        )
        target.command("CLUSTER", "SETSLOT", SLOT, "IMPORTING", source.node_id)
        source.command("CLUSTER", "SETSLOT", SLOT, "MIGRATING", target.node_id)
        fence = redis_keys.fence_key(TAG)
        source.command("MIGRATE", "127.0.0.1", target.server.port, "", 0, 5000, "KEYS", fence)
        # Half moved: the scripts' keys are on two nodes; none runs.
        with pytest.raises(StoreUnavailable):
            await hot.pop("farmer", 5)
        rest = source.command("CLUSTER", "GETKEYSINSLOT", SLOT, 1000)
        source.command("MIGRATE", "127.0.0.1", target.server.port, "", 0, 5000, "KEYS", *rest)
        for node in cluster.live():
            if node.client().info("replication")["role"] == "master":
                node.command("CLUSTER", "SETSLOT", SLOT, "NODE", target.node_id)
        await asyncio.to_thread(cluster.wait_healthy)
        seen = await eventually(lambda: hot.observe("farmer"))
        assert cluster.primary_of(SLOT).address == target.address
        assert seen.length == 0
        assert await hot.discarded_counts() == {redis_keys.hot_list_key(TAG, "farmer"): 40}
        await hot.push("farmer", ["g1"], "b2")
        after = (await hot.pop("farmer", 50)).keys
        assert after == ["g1"] and handed_out.isdisjoint(after)
    finally:
        await hot.close()
