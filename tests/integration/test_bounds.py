"""Bounds that keep Redis safe and pops countable: batch size, memory policy, ledger backlog,
and the warning when the API is open beyond loopback."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import EmbeddedRedis
from shared.domain import redis_keys
from shared.domain.errors import StoreUnavailable
from shared.domain.tiers import MAX_KEYS_PER_POP
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import EMPTY_CONFIG, NS, TEST_SECRET, small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings


async def test_a_full_batch_with_one_client_per_key_pops_and_records_all(hot: HotStore) -> None:
    keys = [f"K{i:06d}" for i in range(MAX_KEYS_PER_POP)]
    await hot.push("shortlink", keys, uuid.uuid4().hex)
    clients = [f"c{i}" for i in range(MAX_KEYS_PER_POP)]
    popped = await hot.pop("shortlink", MAX_KEYS_PER_POP, clients, ledger=True)
    assert popped.keys == keys


async def test_a_pop_the_script_cannot_finish_takes_nothing(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """Past Lua's unpack limit the script fails before LPOP: no key is gone uncounted."""
    await hot.push("shortlink", [f"K{i:06d}" for i in range(9_000)], uuid.uuid4().hex)
    with pytest.raises(StoreUnavailable):
        await hot.pop("shortlink", 9_000, [f"c{i}" for i in range(9_000)], ledger=True)
    assert await hot.depth("shortlink") == 9_000
    assert await redis_client.xlen(redis_keys.ledger_stream_key(NS)) == 0


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis", memory_policy="allkeys-lru")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("command", ["dispenser", "keysync", "keygen"])
async def test_a_redis_that_may_evict_is_refused_naming_the_setting(
    evicting_redis: EmbeddedRedis, servers: Servers, database: str, command: str
) -> None:
    env = {
        **os.environ,
        "KD_CONFIG": str(EMPTY_CONFIG),
        "KD_REDIS_URL": evicting_redis.url,
        "KD_POSTGRES_DSN": servers.dsn_for(database),
        "KD_ID_TYPES": '{"farmer": {"kind": "numeric", "length": 10, "range_size": 20000}}',
        **({"KD_PERMUTATION_KEY": TEST_SECRET} if command == "keygen" else {}),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shared.cli",
        command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "maxmemory-policy is 'allkeys-lru'" in lines[0], lines
    assert "noeviction" in lines[0] and "Traceback" not in err.decode()

    # A process that started while Redis was away checks again before it is ready.
    settings = make_settings(servers, database, redis_url=evicting_redis.url)
    async with dispenser_over_http(settings) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["error"] == "redis may evict keys"


async def test_the_embedded_redis_never_evicts(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    store = HotStore(RedisEndpoint(server.url), NS)
    try:
        await store.refuse_eviction()
        assert await store.memory_policy() == "noeviction"
    finally:
        await store.close()
        server.stop()


async def test_past_the_ledger_backlog_ledger_types_answer_503(
    servers: Servers, database: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = make_settings(servers, database, id_types=types, dispenser={"ledger_max_backlog": 3})
    await hot.push("shortlink", [f"L{i:06d}" for i in range(10)], uuid.uuid4().hex)
    await hot.push("farmer", ["3029384756"], uuid.uuid4().hex)
    for _ in range(3):
        await redis_client.xadd(redis_keys.ledger_stream_key(NS), {"op": "noop"})
    async with dispenser_over_http(settings) as client:
        replies = [
            await client.post("/v1/idgenerator/shortlink/id"),
            await client.post("/v1/keys/shortlink", params={"count": "2"}),
            await client.post("/v1/idgenerator/shortlink/id/L000001/used"),
        ]
        other = await client.post("/v1/idgenerator/farmer/id")
        metrics = (await client.get("/metrics")).text
    for reply in replies:
        assert reply.status_code == 503, reply.text
        assert reply.json()["errors"][0]["errorCode"] == "IDG-014"
        assert int(reply.headers["Retry-After"]) >= 1
    assert other.status_code == 200  # types without a ledger are unaffected
    assert await hot.depth("shortlink") == 10
    assert "kd_ledger_stream_backlog 3.0" in metrics
    assert 'kd_ledger_backlog_refusals_total{id_type="shortlink"} 3.0' in metrics


async def test_an_open_api_beyond_loopback_is_announced(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    exposed = make_settings(servers, database, dispenser={"host": "0.0.0.0"})
    async with dispenser_over_http(exposed) as client:
        assert "kd_api_open 1.0" in (await client.get("/metrics")).text
    assert [r for r in caplog.records if r.message == "api_open"]
    caplog.clear()
    local = make_settings(servers, database)
    async with dispenser_over_http(local) as client:
        assert "kd_api_open 0.0" in (await client.get("/metrics")).text
    assert not [r for r in caplog.records if r.message == "api_open"]


async def test_up_waits_for_every_type_through_readyz(
    servers: Servers, database: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    """What `keydispenser up` waits on before it announces itself."""
    from keydispenser_ops.processes import types_not_serving

    settings = make_settings(servers, database)
    async with dispenser_over_http(settings) as client:
        url = str(client.base_url.join("/readyz"))
        assert await asyncio.to_thread(types_not_serving, url, 0) == ["farmer", "shortlink"]
        # Told to stop (Ctrl-C while `up` waits for the first keys), it stops waiting.
        started = time.monotonic()
        stopped = await asyncio.to_thread(types_not_serving, url, 300, lambda: True)
        assert stopped == ["farmer", "shortlink"] and time.monotonic() - started < 60
        await hot.push("farmer", ["3029384756"], uuid.uuid4().hex)
        assert await asyncio.to_thread(types_not_serving, url, 0) == ["shortlink"]
        await hot.push("shortlink", ["aZ09xYq"], uuid.uuid4().hex)
        assert await asyncio.to_thread(types_not_serving, url, 5) == []
    assert await asyncio.to_thread(types_not_serving, url, 0.3) == ["dispenser"]


async def test_readiness_says_when_the_redis_primary_is_unreachable(
    servers: Servers, database: str
) -> None:
    """kd_redis_up feeds the KdRedisPrimaryUnreachable alert."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    settings = make_settings(servers, database, redis_url=url)
    async with dispenser_over_http(settings) as client:
        ready = await client.get("/readyz")
        metrics = (await client.get("/metrics")).text
    assert ready.status_code == 503 and ready.json()["error"] == "redis unreachable"
    assert "kd_redis_up 0.0" in metrics


def test_the_embedded_redis_runs_in_a_session_of_its_own(tmp_path: Path) -> None:
    """A Ctrl-C at `keydispenser up` signals its process group: the Redis server must
    not get it, so the dispenser can still release its leases there before `up` stops
    the server."""
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        assert server.process is not None
        assert os.getsid(server.process.pid) == server.process.pid != os.getsid(0)
    finally:
        server.stop()
