"""A dispenser with two worker processes: its counters never go backwards between
scrapes, and every scrape counts every worker's keys (dispenser/worker_metrics.py). The
real `keydispenser dispenser` (uvicorn, dispenser.workers: 2) over real HTTP."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import httpx
import pytest

from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.acceptance.harness import ChildProcesses, process_env, wait_for_http, write_config

pytestmark = pytest.mark.acceptance

ISSUED = re.compile(r'^kd_keys_issued_total\{id_type="farmer"\} (\S+)$', re.M)
REQUESTS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def scrape(base: str) -> float:
    """One scrape on a connection of its own (each may reach either worker)."""
    async with httpx.AsyncClient(base_url=base) as client:
        found = ISSUED.search((await client.get("/metrics")).text)
    assert found is not None
    return float(found.group(1))


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
async def test_two_workers_counters_never_go_backwards(
    settings: Settings, tmp_path: Path, server: str
) -> None:
    hot = HotStore.from_settings(settings)
    try:
        await hot.push("farmer", [f"{n:010d}" for n in range(REQUESTS)], "batch-1")
    finally:
        await hot.close()
    port = free_port()
    env = process_env(
        settings,
        write_config(settings, tmp_path / "c.yaml"),
        KD_DISPENSER__PORT=str(port),
        KD_DISPENSER__WORKERS="2",
        KD_DISPENSER__SERVER=server,
        KD_KEYSYNC__POLL_INTERVAL_S="60",
    )
    del env["KD_PERMUTATION_KEY"]
    base = f"http://127.0.0.1:{port}"
    stack = ChildProcesses(tmp_path)
    stack.spawn("dispenser", env, "dispenser")
    try:
        await asyncio.to_thread(wait_for_http, f"{base}/readyz", 60)
        seen: list[float] = []
        for n in range(REQUESTS):
            # Each request on a connection of its own: the workers share them out.
            async with httpx.AsyncClient(base_url=base) as client:
                answer = await client.post("/v1/idgenerator/farmer/id")
                assert answer.status_code == 200, answer.text
            if n % 4 == 0:
                seen.append(await scrape(base))
        # Every worker's last snapshot is at most a second old.
        await asyncio.sleep(1.5)
        final = [await scrape(base) for _ in range(12)]
    finally:
        stack.close()
    assert seen == sorted(seen), seen  # never backwards
    assert seen[-1] <= final[0]
    assert final == [float(REQUESTS)] * len(final), final  # every worker's keys, each time
