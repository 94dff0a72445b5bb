"""Two PostgreSQL promotions in a row, on real servers: a primary and two asynchronous
streaming replicas, the second cascading from the first; a real keysync and dispenser,
MOSIP's API over HTTP.

A keysync that read a repeated ``PUT ASSIGNED`` is frozen (SIGSTOP, at the fault point
``keysync.ledger_read``) before it applies it; the first replica is promoted and fenced
by another process, then the second (which never saw that fence) is promoted and
fenced in turn; the keysync resumes. The fence of the second promotion must leave the
restore the first one found needed pending on the server it fences (the record's
``restore_to``, not only its head, which by then is the first fenced server's own):
otherwise the keysync decides the repeat on a history lacking the UIN's issue and
answers "not found" after the same client was answered ASSIGNED
(docs/reliability.md, "The ledger's one history").

On the code before that rule this test fails in most runs, not all: whether the resumed
keysync's first statement errors on its pooled connection to the dead primary (it then
backs off, and its next turn restores first) or reaches the new primary at once is the
driver's. The deterministic proof, with its mutant, is
tests/integration/test_ledger_history.py::test_a_second_promotion_keeps_the_restore_the_first_one_found_needed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.drill.postgres import PostgresChain
from keydispenser_ops.embedded import free_port
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate, scratch_database
from shared.stores.redis.endpoint import RedisEndpoint
from tests.acceptance.harness import (
    ChildProcesses,
    mosip_dispenser,
    process_env,
    uin_ledger_type,
    wait_for_http,
    write_config,
)
from tests.acceptance.test_ledger_failover import Mosip
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings

pytestmark = pytest.mark.acceptance
DATABASE = "kd_two_promotions"
CLIENTS = ("client-a", "client-b", "auditor")
UIN = "uin"
WAIT_S = 40.0


@pytest.fixture
def chain() -> Iterator[PostgresChain]:
    with tempfile.TemporaryDirectory(prefix="kd-two-promotions-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs unprivileged when we are root
        servers = PostgresChain(Path(tmp), 3)
        servers.start()
        try:
            yield servers
        finally:
            servers.stop()


def chain_settings(servers: Servers, chain: PostgresChain, keys: dict[str, str]) -> Settings:
    settings = make_settings(
        Servers(chain.servers[0].dsn(), servers.redis_url),
        DATABASE,
        id_types={UIN: uin_ledger_type()},
        dispenser=mosip_dispenser(UIN, 60, keys),
        keysync={"poll_interval_s": 0.2, "ledger_batch": 100, "ledger_retain_s": 300},
        postgres_connect_timeout_s=2,
    )
    return settings.model_copy(update={"postgres_dsn": chain.dsn(DATABASE)})


async def fence(settings: Settings) -> None:
    """The PostgreSQL fence, run by a process other than keysync (as keygen's next lease
    would run it): settles whichever server the DSN reaches now."""
    cold = await ColdStore.connect(settings.postgres_dsn, min_size=0, max_size=1)
    sync = SyncRecord(RedisEndpoint(settings.redis_url), NS)
    try:
        report = await settle(cold, sync)
        assert report is not None, "the promoted server was not fenced"
    finally:
        await cold.close()
        await sync.close()


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return any(line.split()[1] == "T" for line in status.splitlines() if line.startswith("State:"))


async def until_stopped(pid: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while not stopped(pid):
        assert time.monotonic() < deadline, "keysync did not stop at its read"
        await asyncio.sleep(0.05)


@pytest.fixture
async def stack(
    chain: PostgresChain, servers: Servers, redis_client: aioredis.Redis, tmp_path: Path
) -> AsyncIterator[tuple[Mosip, int, Path]]:
    """Three UINs in the hot list (two are taken: the list never falls below its low
    watermark, so keysync's refill never reaches PostgreSQL), no keygen; one keysync
    that freezes itself just after it reads a ledger batch once ``armed`` exists; one
    dispenser."""
    await scratch_database(chain.servers[0].dsn(), DATABASE)
    for index in (1, 2):
        await chain.caught_up(index)  # the database exists on every server
    keys = {name: new_api_key()[0] for name in CLIENTS}
    settings = chain_settings(servers, chain, keys)
    await run_migrate(settings)
    uins = build_id_types(settings)[UIN].generate(500_000_000, 500_001_000)[0][:3]
    hot = HotStore(RedisEndpoint(servers.redis_url), NS)
    await hot.push(UIN, uins, "seed")
    await hot.close()
    children = ChildProcesses(tmp_path)
    config = write_config(settings, tmp_path / "config.yaml")
    armed = tmp_path / "armed"
    port = free_port()
    freezing = process_env(
        settings, config, KD_FAULT_POINT="keysync.ledger_read:stop", KD_FAULT_ARMED=str(armed)
    )
    keysync = children.spawn("keysync", freezing, "keysync")
    try:
        env = process_env(
            settings, config, KD_DISPENSER__PORT=str(port), KD_DISPENSER__HOST="127.0.0.1"
        )
        children.spawn("dispenser", env, "dispenser")
        await asyncio.to_thread(wait_for_http, f"http://127.0.0.1:{port}/healthz")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=90) as http:
            yield Mosip(settings, http, keys), keysync.pid, armed
    finally:
        os.kill(keysync.pid, signal.SIGCONT)  # stopped or not: it must hear its SIGTERM
        children.close()


async def test_a_second_promotion_keeps_the_restore_the_first_one_found_needed(
    chain: PostgresChain, stack: tuple[Mosip, int, Path]
) -> None:
    service, keysync, armed = stack
    other = await service.get_uin("client-b")  # a ledger link every server holds
    assert other is not None
    await service.in_the_ledger(other, "client-b")
    for index in (1, 2):
        await chain.caught_up(index)
    await chain.pause(1)  # from now on, on the primary only
    uin = await service.get_uin("client-a")
    assert uin is not None
    assert await service.put("client-a", uin, "ASSIGNED") == "ASSIGNED"

    # The repeat is read by keysync, which freezes before it applies it.
    armed.touch()
    repeat = asyncio.create_task(service.put("client-a", uin, "ASSIGNED"))
    await until_stopped(keysync)

    # The first replica promoted (the second follows it onto its timeline, then stops
    # receiving), and fenced by another process: the restore is pending on it.
    await chain.promote(1)
    await chain.caught_up(2)
    await chain.pause(2)
    await fence(service.settings)
    # The second replica, which never saw that fence, promoted and fenced in turn.
    await chain.promote(2)
    await fence(service.settings)

    os.kill(keysync, signal.SIGCONT)
    assert await repeat == "ASSIGNED"  # as first answered; never "not found"
    assert await service.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
    found = await service.looked_up(uin)
    assert found["client"] == "client-a" and found["used"] is True


async def test_a_restore_pending_across_a_promotion_that_lost_nothing_completes(
    chain: PostgresChain, stack: tuple[Mosip, int, Path]
) -> None:
    """A restore left pending by a fence (keysync frozen before it ran), then a
    switchover to a replica that has every commit (a new timeline, nothing lost): the
    restore passes the guard only on the record's timeline, so the server's timeline is
    taken up first. Before, the restore was refused for ever (nothing else wrote there)
    and every lookup and PUT of the ledger answered 503 until some refill or lease
    happened to write on the new timeline."""
    service, keysync, _ = stack
    for index in (1, 2):
        await chain.caught_up(index)
    await chain.pause(1)  # from now on, on the primary only
    uin = await service.get_uin("client-a")
    assert uin is not None
    assert await service.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
    os.kill(keysync, signal.SIGSTOP)  # the restore waits for it
    await chain.promote(1)  # lossy: the issue and the PUT are gone
    await fence(service.settings)  # the restore is pending, on the server and the record
    await chain.caught_up(2)  # the second replica has the fence, and all the rest
    await chain.promote(2)  # nothing lost: a new timeline
    os.kill(keysync, signal.SIGCONT)
    found = await service.looked_up(uin)
    assert found["client"] == "client-a" and found["used"] is True
    assert await service.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
