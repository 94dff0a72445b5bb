"""A process frozen longer than every TTL and deadline, then resumed, hands out nothing
twice (SIGSTOP, as a GC pause or a VM pause would freeze it; SIGCONT).

keysync's push is made ambiguous for real: a TCP proxy between keysync and Redis lets
the push through and loses its answer (``lose_large_replies``), so keysync retries,
pinned and idempotent through the batch's marker. Frozen past the marker's life and
then resumed with the link healed, a retry would push the batch a second time; the
batch's deadline (on the Redis server's clock, and re-checked by keysync after every
sleep) refuses it instead: the batch is lost (counted), never doubled.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.drill.proxy import standalone
from keygen.generation import Generator
from keygen.main import Keygen
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.postgres.cold_store import ColdStore
from tests.acceptance.harness import ChildProcesses, process_env
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings

pytestmark = pytest.mark.acceptance
DEADLINE_S = 30.0
MARKER_TTL_S = 1.0
PUSH_RETRY_S = 2.0


def through(url: str, port: int) -> str:
    """``url`` reaching its server through a proxy on loopback ``port``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


async def until(check: object, what: str, timeout_s: float = DEADLINE_S) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        await asyncio.sleep(0.05)


@pytest.fixture
def paused_settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    marks = {"hot": {"low": 500, "high": 1_000}, "sync_batch": 1_000, "range_size": 20_000}
    return make_settings(
        servers,
        database,
        id_types={"farmer": {"kind": "numeric", "length": 10, **marks}},
        keysync={
            "poll_interval_s": 0.1,
            "push_retry_s": PUSH_RETRY_S,
            "batch_marker_ttl_s": MARKER_TTL_S,
        },
    )


async def fill_cold(settings: Settings) -> None:
    cold = await ColdStore.for_settings(settings)
    sync = SyncRecord.from_settings(settings)
    generator = Generator(1)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), generator)
        while await cold.depth("farmer", 10_000) < 10_000:
            await keygen.lease_and_generate(build_id_types(settings)["farmer"])
    finally:
        generator.close()
        await cold.close()
        await sync.close()


async def test_a_keysync_frozen_past_every_deadline_never_pushes_a_batch_twice(
    paused_settings: Settings, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    settings = paused_settings
    await fill_cold(settings)
    target = urlsplit(settings.redis_url)
    proxy = standalone(target.hostname or "127.0.0.1", target.port or 6379)
    config = tmp_path / "keysync.yaml"
    config.write_text(json.dumps(settings.model_dump(mode="json", include={"id_types", "keysync"})))
    env = process_env(settings, config, KD_REDIS_URL=through(settings.redis_url, proxy.port))
    children = ChildProcesses(tmp_path)
    hot_list = redis_keys.hot_list_key(NS, "farmer")
    try:
        keysync = children.spawn("keysync", env, "keysync")

        async def filled() -> bool:
            return int(await redis_client.llen(hot_list)) >= 1_000

        await until(filled, "first refill")
        first = [str(k) for k in await redis_client.lrange(hot_list, 0, -1)]
        proxy.set("lose_large_replies")  # the next push runs, its answer never comes
        await redis_client.delete(hot_list)  # dispensed: keysync refills

        await until(filled, "the ambiguous push landed")
        os.kill(keysync.pid, signal.SIGSTOP)  # frozen while it retries the push
        await asyncio.sleep(PUSH_RETRY_S + MARKER_TTL_S + 2.5)  # past every deadline
        proxy.set("pass")
        os.kill(keysync.pid, signal.SIGCONT)
        await asyncio.sleep(PUSH_RETRY_S)  # it resumes its retries, if it would

        pushed = [str(k) for k in await redis_client.lrange(hot_list, 0, -1)]
        assert keysync.poll() is None, "keysync exited"
        assert len(pushed) == len(set(pushed)), "the frozen keysync pushed its batch twice"
        assert not set(pushed) & set(first)
        log = (tmp_path / "keysync.log").read_text()
        assert "batch_lost" in log, log[-3000:]
        assert "push_deadline_passed" in log or "unreachable" in log

        # And it goes on refilling with new keys.
        await redis_client.delete(hot_list)
        await until(filled, "refill after the pause")
        later = [str(k) for k in await redis_client.lrange(hot_list, 0, -1)]
        every = first + pushed + later
        assert len(every) == len(set(every))
    finally:
        with_resumed(children)
        children.close()
        proxy.hub.close()


def with_resumed(children: ChildProcesses) -> None:
    """A stopped child cannot act on SIGTERM: resume every one before stopping them."""
    for child in children.children:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
