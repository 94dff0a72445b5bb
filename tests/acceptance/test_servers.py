"""Both HTTP servers as real processes: several workers, each running the app's
start-up, and SIGTERM finishing the requests in flight before the app shuts down."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, spawn, stop_process
from shared.stores.hot.hot_store import HotStore
from tests.conftest import small_types
from tests.integration.fixtures import (
    Servers,
    both_servers,
    dispenser_process_env,
    make_settings,
    wait_until_serving,
)

pytestmark = pytest.mark.acceptance
WORKERS = 2
DEADLINE_S = 30.0
USED = b'{"keys": ["aZ09xYq"]}'


async def events(log: Path, event: str, count: int) -> list[dict[str, object]]:
    """The first ``count`` log lines of ``event``, waiting for them (with a deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = await asyncio.to_thread(log.read_text)
        found = [
            line
            for line in map(_json_or_none, text.splitlines())
            if line and line.get("event") == event
        ]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{count} x {event} not logged:\n{text}"
        await asyncio.sleep(0.05)


def _json_or_none(line: str) -> dict[str, object] | None:
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


@both_servers
async def test_workers_serve_and_sigterm_drains_requests_in_flight(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    hot: HotStore,
    tmp_path: Path,
    server: str,
) -> None:
    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = make_settings(servers, database, id_types=types)
    await hot.push("farmer", [f"{i:010d}" for i in range(100)], uuid.uuid4().hex)
    port = free_port()
    env = dispenser_process_env(
        settings,
        tmp_path,
        KD_DISPENSER__SERVER=server,
        KD_DISPENSER__PORT=str(port),
        KD_DISPENSER__WORKERS=str(WORKERS),
    )
    log = tmp_path / "dispenser.log"
    child = spawn(cli_command("dispenser"), env, log)
    try:
        await wait_until_serving(port, child, log, DEADLINE_S)
        started = await events(log, "dispenser_started", WORKERS)
        assert len({line["pid"] for line in started}) == WORKERS  # one start-up per worker
        await _single_ids_are_unique(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # A request in flight: its head and part of its body sent.
            writer.write(
                b"POST /v1/keys/shortlink/used HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n" % len(USED) + USED[:5]
            )
            await writer.drain()
            await asyncio.sleep(0.3)
            child.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)  # the server is stopping meanwhile
            assert child.poll() is None, "exited with a request in flight"
            writer.write(USED[5:])
            await writer.drain()
            # The whole answer: a stopping server closes the connection after it.
            answer = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 202"), answer[:80]
        assert b'{"accepted":1}' in answer
        assert await asyncio.to_thread(child.wait, DEADLINE_S) in (0, -signal.SIGTERM)
        stopped = await events(log, "dispenser_stopped", WORKERS)
        assert {line["pid"] for line in stopped} == {line["pid"] for line in started}
    finally:
        stop_process(child)


async def _single_ids_are_unique(port: int) -> None:
    """Concurrent single-ID requests over several connections (the fast path and the
    coalescer in each worker): 200 each, never the same key twice."""
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=DEADLINE_S
    ) as client:
        replies = await asyncio.gather(
            *(client.post("/v1/idgenerator/farmer/id") for _ in range(60))
        )
    assert [r.status_code for r in replies] == [200] * 60, [
        r.text for r in replies if r.status_code != 200
    ][:3]
    assert len({r.json()["response"]["id"] for r in replies}) == 60
