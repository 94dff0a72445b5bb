"""Restores are visible: older data loaded into Redis never hands a key out again.

A server restarted from an older RDB or AOF has a new run_id: the fence discards what
it inherited (test_replica_fence.py). The one restore the fence cannot see is an
in-place reload on a running server (``DEBUG RELOAD``), which keeps run_id and
replication ID: the servers keydispenser starts (``keydispenser up``, the drill) and
the Helm chart's Redis values refuse it (``enable-debug-command no``, Redis's default), processes
warn at start-up when it is allowed, and docs/operations.md forbids it. The control
shows why: allowed, it hands out again keys already popped.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from keydispenser_ops.embedded import EmbeddedRedis
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS


@pytest.fixture
async def own_redis() -> AsyncIterator[EmbeddedRedis]:
    with tempfile.TemporaryDirectory(prefix="kd-restore-") as tmp:
        server = EmbeddedRedis(Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


async def test_the_servers_keydispenser_starts_refuse_an_in_place_reload(
    own_redis: EmbeddedRedis,
) -> None:
    async with aioredis.Redis.from_url(own_redis.url) as client:
        with pytest.raises(ResponseError, match="DEBUG command not allowed"):
            await client.execute_command("DEBUG", "RELOAD")  # type: ignore[no-untyped-call]


async def test_control_an_allowed_in_place_reload_hands_out_popped_keys_again(
    tmp_path: Path,
) -> None:
    server = EmbeddedRedis(tmp_path)
    server.start("--enable-debug-command", "yes")
    hot = HotStore(RedisEndpoint(server.url), NS)
    try:
        await hot.push("farmer", [f"k{i}" for i in range(10)], uuid.uuid4().hex)
        async with aioredis.Redis.from_url(server.url) as client:
            await client.save()  # the "backup"
            first = (await hot.pop("farmer", 5)).keys
            await client.execute_command("DEBUG", "RELOAD", "NOSAVE")  # type: ignore[no-untyped-call]
        again = (await hot.pop("farmer", 10)).keys
        assert set(first) & set(again)  # same run_id, same replid: the fence cannot see it
    finally:
        await hot.close()
        server.stop()


async def test_a_process_warns_when_the_server_would_allow_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    allowed, refused = EmbeddedRedis(tmp_path / "a"), EmbeddedRedis(tmp_path / "r")
    allowed.start("--enable-debug-command", "yes")
    refused.start()
    stores = [HotStore(RedisEndpoint(s.url), NS) for s in (allowed, refused)]
    try:
        assert [await store.warn_if_reloadable() for store in stores] == [True, False]
        assert [r.getMessage() for r in caplog.records] == ["redis_debug_command_enabled"]
    finally:
        for store in stores:
            await store.close()
        allowed.stop()
        refused.stop()
