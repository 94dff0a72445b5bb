"""Two sites that never collide, as complete stacks with no link between them.

Three stacks on loopback, each with its own PostgreSQL database, its own Redis server
and its own keygen, keysync and dispenser processes, all on one configuration and one
permutation key except the site index: sites 0 and 1 of 2, and a third stack that
reuses index 0 (the control: what a reused index does). Many keys of each type are
drawn from every stack over HTTP; the two sites share none, the reused index shares
most of what it drew with the stack that had it first.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from keydispenser_ops.embedded import EmbeddedRedis, free_port
from keydispenser_ops.processes import run_cli
from shared.stores.postgres.databases import drop_database, scratch_database
from tests.acceptance.harness import ChildProcesses, process_env, wait_for_http, write_config
from tests.integration.fixtures import Servers, make_settings

pytestmark = pytest.mark.acceptance

TYPES = ("farmer", "shortlink")
PER_TYPE = 20_000  # keys drawn of each type from each stack
BATCH = 1_000
STALL_S = 60  # no key for this long from a stack: it hung


def site_types(index: int) -> dict[str, Any]:
    marks = {
        "range_size": 20_000,
        "hot": {"low": 1_000, "high": 4_000},
        "cold": {"low": 10_000, "high": 30_000},
        "sync_batch": 1_000,
        "site": {"index": index, "of": 2},
    }
    return {
        "farmer": {"kind": "numeric", "length": 10, **marks},
        "shortlink": {"kind": "base62", "length": 7, **marks},
    }


@contextmanager
def redis_server(directory: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def draw(url: str) -> dict[str, set[str]]:
    """PER_TYPE keys of each type, in batches; waits while the pool fills."""
    drawn: dict[str, set[str]] = {t: set() for t in TYPES}
    async with aiohttp.ClientSession() as session:
        for name in TYPES:
            since = time.monotonic()
            while len(drawn[name]) < PER_TYPE:
                async with session.post(f"{url}/v1/keys/{name}?count={BATCH}") as reply:
                    assert reply.status in (200, 503), await reply.text()
                    keys = (await reply.json()).get("keys", []) if reply.status == 200 else []
                if keys:
                    assert drawn[name].isdisjoint(keys)  # and never twice within a stack
                    drawn[name].update(keys)
                    since = time.monotonic()
                else:
                    assert time.monotonic() - since < STALL_S, f"{url}: no {name} key"
                    await asyncio.sleep(0.05)
    return drawn


async def test_two_sites_share_no_key_and_a_reused_index_collides(
    servers: Servers, tmp_path: Path
) -> None:
    indexes = {"site-0": 0, "site-1": 1, "reused-0": 0}
    stack = ChildProcesses(tmp_path)
    databases: list[str] = []
    urls: dict[str, str] = {}
    with ExitStack() as redis_servers:
        try:
            for tag, index in indexes.items():
                database = f"kd_sites_{os.getpid()}_{tag.replace('-', '_')}"
                await scratch_database(servers.postgres_admin_dsn, database)
                databases.append(database)
                redis = redis_servers.enter_context(redis_server(tmp_path / f"redis-{tag}"))
                settings = make_settings(
                    servers, database, id_types=site_types(index), redis_url=redis.url
                )
                env = process_env(settings, write_config(settings, tmp_path / f"{tag}.yaml"))
                assert run_cli("migrate", env=env).returncode == 0
                port = free_port()
                stack.spawn("keygen", env, f"{tag}-keygen")
                stack.spawn("keysync", env, f"{tag}-keysync")
                stack.spawn("dispenser", env | {"KD_DISPENSER__PORT": str(port)}, f"{tag}-disp")
                urls[tag] = f"http://127.0.0.1:{port}"
            for url in urls.values():
                wait_for_http(f"{url}/healthz")
            drawn = dict(zip(urls, await asyncio.gather(*map(draw, urls.values())), strict=True))
        finally:
            stack.close()
            for database in databases:
                await drop_database(servers.postgres_admin_dsn, database)
    for name in TYPES:
        site_0, site_1, reused = (drawn[tag][name] for tag in indexes)
        assert len(site_0) >= PER_TYPE and len(site_1) >= PER_TYPE
        assert site_0.isdisjoint(site_1), f"{name}: two sites drew the same key"
        assert reused.isdisjoint(site_1)
        # The control: a stack on a reused index makes the keys its twin made.
        assert len(reused & site_0) > PER_TYPE // 2, f"{name}: {len(reused & site_0)} shared"
