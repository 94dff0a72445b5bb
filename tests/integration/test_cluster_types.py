"""Types spread over a real Redis Cluster's shards (``redis_cluster.slot_per: type``):
3 primaries and 3 replicas on loopback, one ID type on each shard.

Each type's keys (hot list, fence, sync record, ledger stream, wake list, idempotency
records) share a slot of the type's own, so every script runs on that type's shard. A
shard's failover is fenced there alone: the promoted node discards what it inherited
of its own type, and the other types are dispensed throughout, never refused, their
lists untouched.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from redis.crc import key_slot

from keydispenser_ops.redis_cluster import EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.groups import Groups, HotRouter
from shared.stores.hot.hot_store import HotStore
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings
from tests.integration.test_redis_cluster import caught_up, eventually, keys_by_node

NAMESPACE = "kd"


def spread_settings(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster, slot_per: str = "type"
) -> tuple[Settings, list[str]]:
    """Three types (numeric with a ledger, base62 with a ledger, numeric), one per
    shard (with ``slot_per: namespace``, the control: all three on the namespace's
    shard)."""
    small = small_types()
    names = cluster.spread(NAMESPACE, ["farmer", "shortlink", "citizen"])
    ledger = {"ledger": True}
    configs = [small["farmer"] | ledger, small["shortlink"] | ledger, small["farmer"]]
    settings = make_settings(
        servers,
        database,
        id_types=dict(zip(names, configs, strict=True)),
        redis_namespace=NAMESPACE,
        redis_cluster={"nodes": list(cluster.seeds[:2]), "slot_per": slot_per},
    )
    return settings, names


def tag(name: str) -> str:
    return "{" + f"{NAMESPACE}.{name}" + "}"


async def failover_under_load(
    settings: Settings, names: list[str], cluster: EmbeddedRedisCluster, kill: bool = False
) -> tuple[Any, list[tuple[Counter[int], list[str]]], Counter[int], HotRouter, Groups]:
    """3,000 keys of each type; CLUSTER FAILOVER (or SIGKILL) on the first type's
    shard while
    clients take keys of the other two over HTTP and a probe asks /readyz. Returns
    what the first type's hot list looked like after the failover, each other type's
    answers and keys, the probe's answers, and the stores (to close)."""
    struck, *others = names
    groups = Groups(settings)
    hot = HotRouter.open(groups)
    for name in names:
        for batch in range(3):
            keys = [f"{name}-{batch}-{i}" for i in range(1_000)]
            await hot.of(name).push(name, keys, f"b-{name}-{batch}")
    old = cluster.primary_of(key_slot(settings.key_namespace_of(struck).encode()))
    async with dispenser_over_http(settings) as client:
        assert (await client.post(f"/v1/keys/{struck}?count=20")).status_code == 200
        await caught_up(cluster, old)
        stop = asyncio.Event()
        taking = [asyncio.ensure_future(take_until(client, name, stop)) for name in others]
        probing = asyncio.ensure_future(probe_until(client, stop))
        await asyncio.sleep(0.3)
        if kill:  # SIGKILL: the cluster promotes the replica after the node timeout
            cluster.kill(old)
        else:
            await asyncio.to_thread(cluster.failover, cluster.replica_of(old))
        await asyncio.to_thread(cluster.wait_healthy)
        struck_store: HotStore = hot.of(struck)
        seen = await eventually(lambda: struck_store.observe(struck))
        await asyncio.sleep(0.3)
        stop.set()
        taken = [await each for each in taking]
        probed = await probing
    return seen, taken, probed, hot, groups


async def test_each_type_lives_in_its_own_slot_on_its_own_shard(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """Pushes, and pops over HTTP (single, batch, with an Idempotency-Key, with a
    ledger): every key written is in its type's slot, and each shard holds exactly one
    type's keys. (A script whose keys crossed slots would be refused: CROSSSLOT.)"""
    settings, names = spread_settings(servers, database, cluster)
    groups = Groups(settings)
    hot = HotRouter.open(groups)
    try:
        for name in names:
            await hot.of(name).push(name, [f"{name}-{i}" for i in range(100)], f"b-{name}")
        async with dispenser_over_http(settings) as client:
            for name in names:
                one = await client.post(f"/v1/idgenerator/{name}/id")
                batch = await client.post(f"/v1/keys/{name}?count=10")
                again = await client.post(
                    f"/v1/keys/{name}?count=3", headers={"Idempotency-Key": "k"}
                )
                assert (one.status_code, batch.status_code, again.status_code) == (200,) * 3
                assert one.json()["response"]["id"] == f"{name}-0"
    finally:
        await hot.close()
        await groups.close()
    holding = {address: keys for address, keys in keys_by_node(cluster).items() if keys}
    assert len(holding) == 3  # one type per shard
    for name in names:
        owner = cluster.primary_of(key_slot(tag(name).encode())).address
        assert all(
            key.startswith(tag(name) + ":")
            and key_slot(key.encode()) == key_slot(tag(name).encode())
            for key in holding[owner]
        )
        assert {
            redis_keys.hot_list_key(tag(name), name),
            redis_keys.fence_key(tag(name)),
        } <= set(holding[owner])
    ledger_type = names[1]
    assert (
        redis_keys.ledger_stream_key(tag(ledger_type))
        in holding[cluster.primary_of(key_slot(tag(ledger_type).encode())).address]
    )


@pytest.mark.parametrize("kill", [False, True], ids=["cluster_failover", "primary_killed"])
async def test_a_shard_failover_touches_only_its_type_and_the_others_never_pause(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster, kill: bool
) -> None:
    """The promoted node discards exactly what it inherited of its own type; every
    request for the other types is answered with a key, before, during and after the
    failover (the struck type keeps a ledger, and so does one of the others: each reads
    its own stream's backlog); their lists lose only the keys handed out."""
    settings, names = spread_settings(servers, database, cluster)
    seen, taken, probed, hot, groups = await failover_under_load(settings, names, cluster, kill)
    try:
        # Exactly what it inherited (whichever call ran the new primary's fence first).
        struck = names[0]
        inherited = {redis_keys.hot_list_key(tag(struck), struck): 2_980}
        assert await hot.of(struck).discarded_counts() == inherited
        assert seen.length == 0
        assert set(probed) == {200}  # the process stays ready: its other types serve
        for name, (codes, keys) in zip(names[1:], taken, strict=True):
            assert set(codes) == {200}, (name, codes)  # never refused, never an error
            assert len(keys) == len(set(keys)) > 0
            assert await hot.of(name).discarded_counts() == {}
            assert await hot.depth(name) == 3_000 - len(keys)
    finally:
        await hot.close()
        await groups.close()


async def test_control_with_one_slot_per_namespace_the_same_failover_stops_every_type(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """The hazard ``slot_per: type`` closes: with every type in the namespace's slot,
    the one shard's failover refuses the other types too, and its fence discards their
    lists as well."""
    settings, names = spread_settings(servers, database, cluster, slot_per="namespace")
    seen, taken, _, hot, groups = await failover_under_load(settings, names, cluster)
    try:
        discarded = await hot.of(names[0]).discarded_counts()  # the one group's counts
        for name, (codes, _) in zip(names[1:], taken, strict=True):
            assert set(codes) - {200}, (name, codes)  # refused while the slot moved
            assert discarded[redis_keys.hot_list_key("{kd}", name)] > 0  # went with it
        assert seen.length == 0
    finally:
        await hot.close()
        await groups.close()


async def take_until(
    client: httpx.AsyncClient, name: str, stop: asyncio.Event
) -> tuple[Counter[int], list[str]]:
    """Batches of ``name`` until ``stop`` (at most 60 s): the status of every answer
    (0: none within the client's timeout), and every key received."""
    codes: Counter[int] = Counter()
    keys: list[str] = []
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            reply = await client.post(f"/v1/keys/{name}?count=2")
        except httpx.TimeoutException:
            codes[0] += 1  # no answer in time: counted as a refusal, 0
            continue
        codes[reply.status_code] += 1
        body: Any = reply.json()
        if reply.status_code == 200:
            keys.extend(body["keys"])
        await asyncio.sleep(0.02)
    return codes, keys


async def probe_until(client: httpx.AsyncClient, stop: asyncio.Event) -> Counter[int]:
    """/readyz every 50 ms until ``stop`` (at most 60 s): the status of every answer
    (0 for none in the client's timeout)."""
    codes: Counter[int] = Counter()
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            codes[(await client.get("/readyz")).status_code] += 1
        except httpx.TimeoutException:
            codes[0] += 1  # no answer in time: 0 (the spread tests require every 200)
        await asyncio.sleep(0.05)
    return codes


async def test_readiness_answers_within_a_probes_second_while_a_shard_is_frozen(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster
) -> None:
    """A shard's primary frozen (SIGSTOP: its host accepts connections and never
    answers, as a host gone without a reset does): /readyz still answers within a
    probe's default second, ready, with that shard's type unreachable and the others
    serving."""
    settings, names = spread_settings(servers, database, cluster)
    struck, *others = names
    groups = Groups(settings)
    hot = HotRouter.open(groups)
    frozen = cluster.primary_of(key_slot(tag(struck).encode()))
    process = frozen.server.process
    assert process is not None
    try:
        for name in names:
            await hot.of(name).push(name, [f"{name}-{i}" for i in range(100)], f"b-{name}")
        async with dispenser_over_http(settings) as client:
            assert (await client.get("/readyz")).status_code == 200
            process.send_signal(signal.SIGSTOP)
            try:
                for _ in range(3):
                    reply = await client.get("/readyz", timeout=1.0)
                    assert reply.status_code == 200, reply.text
                    states = reply.json()["types"]
                    assert states[struck]["state"] == "unreachable"
                    assert all(states[name]["state"] == "serving" for name in others)
            finally:
                process.send_signal(signal.SIGCONT)
    finally:
        await hot.close()
        await groups.close()
