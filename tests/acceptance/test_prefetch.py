"""The prefetch stock under a failover and a pause: real processes, real servers.

A dispenser process keeps a stock of keys popped ahead of requests (``prefetch``).
Here it pops its stock from a primary that a promotion has just cut off (the replica
was promoted with every key still on its list: none of the pops reached it), is frozen
(SIGSTOP) while a second dispenser serves from the promoted server, then resumes and
hands its stock out. The promoted server discards the lists it inherited before it
serves (the fence), so no key is handed out by both: the stock only delays a
hand-out, it adds no way to make one twice. A mutant that keeps inherited lists
(``fence_keeps_inherited_lists`` in tests/mutants.py) makes this test fail.
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import cli_command, spawn, stop_process
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import (
    Servers,
    dispenser_process_env,
    make_settings,
    wait_until_serving,
)
from tests.integration.test_replica_fence import Pair, caught_up, pair  # noqa: F401

pytestmark = pytest.mark.acceptance
DEADLINE_S = 30.0
KEYS = 4_000  # plenty (over PLENTY x prefetch): the stock fills


class Dispenser:
    """A ``keydispenser dispenser`` process on one Redis server."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.child = spawn(cli_command("dispenser"), env, log)

    async def take(self, count: int) -> list[str]:
        """``count`` single IDs, one request at a time; every answer must be 200."""
        keys = []
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.port}", timeout=DEADLINE_S
        ) as http:
            for _ in range(count):
                reply = await http.post("/v1/idgenerator/farmer/id")
                assert reply.status_code == 200, reply.text
                keys.append(reply.json()["response"]["id"])
        return keys

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}") as http:
            text = (await http.get("/metrics")).text
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        return float(line.rsplit(" ", 1)[1])


@pytest.fixture
async def work() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kd-prefetch-") as tmp:
        yield Path(tmp)


async def test_a_stock_popped_from_a_cut_off_primary_is_never_handed_out_twice(
    pair: Pair,  # noqa: F811
    servers: Servers,
    database: str,
    work: Path,
) -> None:
    old = HotStore(RedisEndpoint(pair.primary.url), NS)
    await old.push("farmer", [f"{i:010d}" for i in range(KEYS)], "b1")
    await caught_up(pair)
    # The promotion: the replica stops following with every key on its list.
    await pair.replica_client.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]

    def start(url: str, name: str) -> Dispenser:
        settings = make_settings(servers, database, redis_url=url)
        port = free_port()
        (work / name).mkdir()
        env = dispenser_process_env(settings, work / name, KD_DISPENSER__PORT=str(port))
        return Dispenser(env, port, work / f"{name}.log")

    cut_off = start(pair.primary.url, "cut_off")
    promoted: Dispenser | None = None
    try:
        await wait_until_serving(cut_off.port, cut_off.child, cut_off.log, DEADLINE_S)
        before = await cut_off.take(50)
        held = await cut_off.metric('kd_prefetched_keys{id_type="farmer"}')
        assert held > 0  # a stock popped from the old primary, not yet handed out
        cut_off.child.send_signal(signal.SIGSTOP)

        # keysync's next push lands on the promoted server (keys never pushed before).
        new = HotStore(RedisEndpoint(pair.replica.url), NS)
        await new.push("farmer", [f"{i:010d}" for i in range(KEYS, 2 * KEYS)], "b2")
        promoted = start(pair.replica.url, "promoted")
        await wait_until_serving(promoted.port, promoted.child, promoted.log, DEADLINE_S)
        served = await promoted.take(600)

        cut_off.child.send_signal(signal.SIGCONT)
        after = await cut_off.take(int(held))  # the stock, handed out after the pause
    finally:
        cut_off.child.send_signal(signal.SIGCONT)
        stop_process(cut_off.child)
        if promoted is not None:
            stop_process(promoted.child)

    everything = before + served + after
    assert len(everything) == len(set(everything)), "a key was handed out twice"
    assert all(int(key) >= KEYS for key in served)  # the inherited list was discarded
    assert set(after) <= {f"{i:010d}" for i in range(KEYS)}  # the stock: old keys
