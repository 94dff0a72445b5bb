"""PostgreSQL dying in the middle of any operation is an outage, never a crash.

A server of the test's own is SIGKILLed during a COPY, during a transaction and under
a LISTEN, and while a multi-host DSN names it first; every failure surfaces as
StoreUnavailable (which the processes ride out with back-off) and work resumes on the
same store objects once a primary answers again. The dispenser, which needs PostgreSQL
only for ledger lookups, keeps handing out keys while it is down.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import asyncpg
import pytest

from keydispenser_ops.embedded import EmbeddedPostgres
from keygen.generation import Generator
from keygen.main import Keygen, listen_for_wakes
from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.domain.tiers import LeasedRange
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore, translated
from shared.stores.postgres.connect import connect_each_host
from shared.stores.postgres.databases import run_migrate
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

pytestmark = pytest.mark.acceptance
T = TypeVar("T")


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with tempfile.TemporaryDirectory(prefix="kd-outage-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs unprivileged when we are root
        server = EmbeddedPostgres(Path(tmp) / "postgres")
        server.start()
        try:
            yield server
        finally:
            server.stop("immediate")


@pytest.fixture
async def own_settings(
    postgres: EmbeddedPostgres, servers: Servers, redis_client: object
) -> AsyncIterator[Settings]:
    if not postgres_is_up(postgres):
        await asyncio.to_thread(postgres.start)
    settings = make_settings(Servers(postgres.dsn("postgres"), servers.redis_url), "kd_outage")
    await run_migrate(settings)
    yield settings


def postgres_is_up(postgres: EmbeddedPostgres) -> bool:
    return (postgres.pgdata / "postmaster.pid").exists()


async def crash_and_restart(postgres: EmbeddedPostgres, after_s: float) -> None:
    await asyncio.sleep(after_s)
    await asyncio.to_thread(postgres.kill)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(postgres.start)


async def test_a_crash_during_copy_is_an_outage_then_work_resumes(
    postgres: EmbeddedPostgres, own_settings: Settings
) -> None:
    farmer = build_id_types(own_settings)["farmer"]
    keys = [f"{i:010d}" for i in range(1_000_000)]  # a COPY that takes seconds
    # A client can wait forever to write into a dead server: the deadline ends it.
    cold = await ColdStore.connect(own_settings.postgres_dsn, command_timeout_s=5)
    try:
        before = await cold.depth("farmer", 10**7)
        crash = asyncio.ensure_future(crash_and_restart(postgres, 0.3))
        copy = cold.insert_keys(farmer, LeasedRange(0, 1), keys, len(keys), final=False)
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(copy, 60)  # a hang fails the test instead of stalling it
        await crash
        fresh = [f"x{i:09d}" for i in range(10)]
        await retry(lambda: cold.insert_keys(farmer, LeasedRange(0, 1), fresh, 10, final=False))
        # The interrupted COPY left nothing behind; the store works on.
        assert await cold.depth("farmer", 10**7) == before + 10
    finally:
        await cold.close()


async def test_a_crash_inside_a_transaction_is_an_outage(
    postgres: EmbeddedPostgres, own_settings: Settings
) -> None:
    cold = await ColdStore.connect(own_settings.postgres_dsn)
    try:
        crash = asyncio.ensure_future(crash_and_restart(postgres, 0.3))
        with pytest.raises(StoreUnavailable):
            async with cold.connection() as conn, translated("probe"), conn.transaction():
                await conn.execute("SELECT pg_sleep(10)")
        await crash
        assert await retry(lambda: cold.depth("farmer", 10)) >= 0
    finally:
        await cold.close()


async def test_listen_is_re_established_after_a_crash(
    postgres: EmbeddedPostgres, own_settings: Settings
) -> None:
    cold = await ColdStore.connect(own_settings.postgres_dsn)
    stop = asyncio.Event()
    generator = Generator(1)
    keygen = Keygen.on_postgres(own_settings, cold, None, stop, generator)
    listening = asyncio.ensure_future(listen_for_wakes(own_settings, keygen, stop))
    try:
        await crash_and_restart(postgres, 0.5)
        woken = await wait_for_wake(keygen, own_settings.postgres_dsn)
        assert woken
        assert not listening.done()  # the loop rode the crash out
    finally:
        stop.set()
        await asyncio.wait_for(listening, 10)
        generator.close()
        await cold.close()


async def test_a_multi_host_dsn_skips_a_dead_host(
    postgres: EmbeddedPostgres, own_settings: Settings
) -> None:
    dead = "127.0.0.1:1"  # nothing listens on port 1
    live = f"127.0.0.1:{postgres.port}"
    dsn = f"postgresql://postgres@{dead},{live}/kd_outage?target_session_attrs=read-write"
    cold = await ColdStore.connect(dsn)
    try:
        assert await cold.depth("farmer", 10) >= 0
    finally:
        await cold.close()


async def retry(call: Callable[[], Awaitable[T]], deadline_s: float = 30) -> T:
    """``call`` until the server answers again (StoreUnavailable until then)."""
    end = asyncio.get_running_loop().time() + deadline_s
    while True:
        try:
            return await call()
        except StoreUnavailable:
            if asyncio.get_running_loop().time() > end:
                raise
            await asyncio.sleep(0.2)


async def wait_for_wake(keygen: Keygen, dsn: str, deadline_s: float = 30) -> bool:
    """NOTIFY until the re-established listener sets keygen's wake event."""
    end = asyncio.get_running_loop().time() + deadline_s
    while asyncio.get_running_loop().time() < end:
        keygen._wake.clear()
        try:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(sql.NOTIFY, sql.KEYGEN_CHANNEL, "farmer")
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError):
            pass
        try:
            await asyncio.wait_for(keygen._wake.wait(), 0.5)
            return True
        except TimeoutError:
            continue
    return False


async def test_the_dispenser_serves_keys_while_postgres_is_down(
    postgres: EmbeddedPostgres, own_settings: Settings, hot: HotStore
) -> None:
    farmer = own_settings.id_types["farmer"].model_copy(update={"ledger": True})
    settings = own_settings.model_copy(
        update={"id_types": {**own_settings.id_types, "farmer": farmer}}
    )
    pushed = [f"{i:010d}" for i in range(1_000_000_000, 1_000_000_020)]
    await hot.push("farmer", pushed, "b1")
    await asyncio.to_thread(postgres.kill)  # own_settings starts it again for the next test
    with pytest.raises((OSError, asyncpg.PostgresError)):
        await asyncpg.connect(settings.postgres_dsn, timeout=2)
    async with dispenser_over_http(settings) as client:
        single = await client.post("/v1/idgenerator/farmer/id")
        batch = await client.post("/v1/keys/farmer", params={"count": 5})
        health = await client.get("/v1/idgenerator/health")
        lookup = await client.get(f"/v1/keys/farmer/{pushed[0]}")
    assert single.status_code == 200 and batch.status_code == 200, (single.text, batch.text)
    issued = [single.json()["response"]["id"], *batch.json()["keys"]]
    assert issued == pushed[:6]
    assert health.status_code == 200 and health.json()["response"]["status"] == "UP"
    # Only the ledger lookup needs PostgreSQL: it answers the documented outage error.
    assert lookup.status_code == 503 and lookup.json()["errors"][0]["errorCode"] == "IDG-005"


@pytest.fixture
def frozen_host(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A second PostgreSQL whose postmaster is stopped (SIGSTOP): the kernel still
    accepts TCP connections to it, and nothing ever answers them."""
    os.chmod(tmp_path, 0o755)
    server = EmbeddedPostgres(tmp_path / "frozen")
    server.start()
    pid = int((server.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield server
    finally:
        os.kill(pid, signal.SIGCONT)
        server.stop("immediate")


async def test_a_frozen_host_listed_first_costs_one_connect_timeout(
    postgres: EmbeddedPostgres, own_settings: Settings, frozen_host: EmbeddedPostgres
) -> None:
    """A hung old primary first in a multi-host DSN: each host gets its own connect
    timeout, so the live primary after it is reached; keygen's LISTEN too."""
    hosts = f"127.0.0.1:{frozen_host.port},127.0.0.1:{postgres.port}"
    dsn = f"postgresql://postgres@{hosts}/kd_outage?target_session_attrs=read-write"
    # The hazard: asyncpg gives all hosts one timeout, and the frozen one uses it up.
    with pytest.raises(TimeoutError):
        await asyncpg.connect(dsn, timeout=3)
    cold = await asyncio.wait_for(ColdStore.connect(dsn, connect_timeout_s=1), 20)
    try:
        assert await cold.depth("farmer", 10) >= 0
    finally:
        await cold.close()
    conn = await asyncio.wait_for(connect_each_host(dsn, host_timeout_s=1), 20)
    await conn.close()
