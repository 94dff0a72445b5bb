"""The whole stack with types spread over a real Redis Cluster's shards: keygen and
keysync as processes, the dispenser over HTTP, MOSIP's UIN and VID types each on a
shard of its own (``redis_cluster.slot_per: type``).

keysync refills each type through its own key group (its own fence, record and wake
list) and drains each type's own ledger stream into PostgreSQL; MOSIP's PUT waits on
its type's stream. Everything a user of the service does works as on one server.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
from redis.crc import key_slot

from keydispenser_ops.processes import run_cli
from keydispenser_ops.redis_cluster import EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.postgres import sql
from tests.acceptance.harness import ChildProcesses, process_env, write_config
from tests.conftest import small_types
from tests.integration.fixtures import (
    Servers,
    connect_as_processes,
    dispenser_over_http,
    make_settings,
)

NAMESPACE = "kd"
READY_S = 60.0


def spread(servers: Servers, database: str, cluster: EmbeddedRedisCluster) -> Settings:
    uin, vid = cluster.spread(NAMESPACE, ["farmer", "shortlink"])
    small = small_types()
    types = {
        uin: small["farmer"] | {"ledger": True, "filter_profile": "mosip"},
        vid: small["shortlink"] | {"ledger": True},
    }
    return make_settings(
        servers,
        database,
        id_types=types,
        redis_namespace=NAMESPACE,
        redis_cluster={"nodes": list(cluster.seeds), "slot_per": "type"},
        dispenser={"mosip": {"uin": uin, "vid": vid, "ledger_wait_s": 10}},
    )


async def serving_every_type(http: httpx.AsyncClient, names: list[str]) -> None:
    deadline = time.monotonic() + READY_S
    while True:
        reply = await http.get("/readyz")
        states = reply.json().get("types", {}) if reply.status_code == 200 else {}
        if all(states.get(name, {}).get("state") == "serving" for name in names):
            return
        assert time.monotonic() < deadline, f"not every type served: {reply.text}"
        await asyncio.sleep(0.2)


async def test_the_stack_serves_mosip_with_each_type_on_its_own_shard(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster, tmp_path: Path
) -> None:
    settings = spread(servers, database, cluster)
    uin_type, vid_type = list(settings.id_types)
    config = write_config(settings, tmp_path / "spread.yaml")
    body = json.loads(config.read_text()) | {"redis_namespace": NAMESPACE}
    config.write_text(json.dumps(body))
    cluster_env = json.dumps({"nodes": list(cluster.seeds), "slot_per": "type"})
    env = process_env(settings, config, KD_REDIS_CLUSTER=cluster_env)
    migrated = run_cli("migrate", env=env, timeout_s=120)
    assert migrated.returncode == 0, migrated.stderr
    stack = ChildProcesses(tmp_path)
    try:
        stack.spawn("keygen", env, "keygen")
        stack.spawn("keysync", env, "keysync")
        async with dispenser_over_http(settings) as http:
            await serving_every_type(http, [uin_type, vid_type])
            got = await http.get("/v1/idgenerator/uin")
            assert got.status_code == 200, got.text
            uin = got.json()["response"]["uin"]
            request = {
                "id": "mosip.kernel.uinservice",
                "version": "1.0",
                "requesttime": "2026-11-27T10:00:00.000Z",
                "metadata": {},
                "request": {"uin": uin, "status": "ASSIGNED"},
            }
            # At once: the PUT waits until keysync applied the UIN's issue from its
            # type's stream, then its own change.
            put = await http.put("/v1/idgenerator/uin", json=request)
            assert put.json()["response"] == {"uin": uin, "status": "ASSIGNED"}, put.text
            vid = await http.get("/v1/idgenerator/vid")
            assert vid.status_code == 200 and vid.json()["response"]["vid"], vid.text
        for child in stack.children:
            assert child.poll() is None, "a process exited"
    finally:
        stack.close()
    conn = await connect_as_processes(settings)
    try:
        row = await conn.fetchrow(
            sql.for_type("SELECT * FROM {ledger} WHERE key = $1", uin_type), uin
        )
        assert row is not None and row["used_at"] is not None
        assert await conn.fetchval(sql.for_type("SELECT count(*) FROM {ledger}", vid_type)) > 0
    finally:
        await conn.close()
    # Each type's keys (its hot list, fence and ledger stream among them) on its own shard.
    homes = {
        name: cluster.primary_of(key_slot(settings.key_namespace_of(name).encode()))
        for name in (uin_type, vid_type)
    }
    assert homes[uin_type].address != homes[vid_type].address
    for name, node in homes.items():
        held = set(node.client().scan_iter(match=settings.key_namespace_of(name) + ":*"))
        namespace = settings.key_namespace_of(name)
        assert {
            redis_keys.hot_list_key(namespace, name),
            redis_keys.fence_key(namespace),
            redis_keys.sync_record_key(namespace),
        } <= held, (name, held)
