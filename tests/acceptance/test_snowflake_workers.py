"""The real `keydispenser dispenser` with two worker processes and a snowflake type."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import scrubbed_env
from shared.leases.store import MachineLeases
from shared.stores.redis.endpoint import RedisEndpoint
from tests.acceptance.harness import ChildProcesses, wait_for_http
from tests.conftest import NS
from tests.integration.fixtures import Servers, end_lease_settling
from tests.integration.test_snowflake import EVENTS, EVENTS_CONFIG

pytestmark = pytest.mark.acceptance
DEADLINE_S = 20.0


async def holders(leases: MachineLeases) -> list[int]:
    return [h.machine_id for h in (await leases.holders(EVENTS)).holders]


async def until_held(leases: MachineLeases, count: int) -> list[int]:
    deadline = time.monotonic() + DEADLINE_S
    while len(held := await holders(leases)) != count:
        assert time.monotonic() < deadline, f"{held} held, expected {count} machine IDs"
        await asyncio.sleep(0.05)
    return held


async def batch(base: str) -> list[str]:
    async with httpx.AsyncClient(base_url=base) as client:  # a new connection each time
        reply = await client.post(f"/v1/keys/{EVENTS}", params={"count": 1000})
    assert reply.status_code == 200, reply.text
    keys: list[str] = reply.json()["keys"]
    return keys


async def test_each_worker_leases_its_own_machine_id_and_releases_it(
    servers: Servers, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    await end_lease_settling(servers.redis_url, redis_client)
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps({"redis_url": servers.redis_url, "id_types": {EVENTS: EVENTS_CONFIG}})
    )
    port = free_port()
    env = scrubbed_env(
        KD_CONFIG=str(config), KD_DISPENSER__PORT=str(port), KD_DISPENSER__WORKERS="2"
    )
    stack = ChildProcesses(tmp_path)
    leases = MachineLeases(RedisEndpoint(servers.redis_url), NS)
    try:
        stack.spawn("dispenser", env, "dispenser")
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/healthz")
        held = await until_held(leases, 2)
        minted = [
            k for keys in await asyncio.gather(*(batch(base) for _ in range(20))) for k in keys
        ]
        assert len(minted) == len(set(minted)) == 20_000
        stack.close()  # SIGTERM: each worker releases its lease
        assert len(set(held)) == 2
        assert await until_held(leases, 0) == []
    finally:
        stack.close()
        await leases.close()
