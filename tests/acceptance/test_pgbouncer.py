"""PgBouncer in front of PostgreSQL, as operators run it (docs/operations.md, "PgBouncer").

In transaction mode a client's statements go to whichever server connection is free at
each transaction: named prepared statements, startup parameters, session settings and
LISTEN do not last. Every process works there with ``postgres_pooler: transaction``
(unnamed statements, no startup parameter, every setting and lock the transaction's
own, keygen polling instead of LISTENing), and in session mode with ``session``; a
process not told refuses to start, naming ``postgres_pooler``, instead of failing
within seconds (``prepared statement "__asyncpg_stmt_N__" does not exist``) and never
recovering. A take left open by a frozen keysync holds the others back no longer than
its limit behind the pooler too.

The real PgBouncer (Debian's ``pgbouncer``), started here in front of the suite's
PostgreSQL. Without it these skip, unless ``KD_TEST_REQUIRE_STACK=1`` (set by .ci/run).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from keydispenser_ops.embedded import free_port
from keydispenser_ops.pgbouncer import EmbeddedPgBouncer, PoolMode
from keydispenser_ops.processes import run_cli
from keygen.generation import Generator
from keygen.main import Keygen
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, SchemaError, StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore, translated
from shared.stores.postgres.connect import pooled_per_transaction
from tests.acceptance.harness import ChildProcesses, process_env, wait_for_http, write_config
from tests.conftest import small_types
from tests.integration.fixtures import Servers, connect_as_processes, make_settings, require_tool

pytestmark = [pytest.mark.acceptance, pytest.mark.not_pooled]

KEYS = 3_000  # keys taken through the pooler, in batches
DEADLINE_S = 90.0


def ledger_types() -> dict[str, Any]:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return types


def bouncer_in_front(
    servers: Servers, work: Path, mode: PoolMode, **options: Any
) -> Iterator[EmbeddedPgBouncer]:
    require_tool("pgbouncer", "apt-get install pgbouncer")
    target = urlsplit(servers.postgres_admin_dsn)
    bouncer = EmbeddedPgBouncer(
        work,
        target.hostname or "127.0.0.1",
        target.port or 5432,
        mode,
        admin_user=target.username or "postgres",
        **options,
    )
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def transaction_pooler(
    servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedPgBouncer]:
    """Transaction mode, letting plan_cache_mode through unread (as docs/operations.md
    once advised): a process not told connects, and must find out by itself."""
    work = tmp_path_factory.mktemp("pgbouncer-transaction")
    yield from bouncer_in_front(
        servers, work, "transaction", ignore_startup_parameters=("plan_cache_mode",)
    )


@pytest.fixture(scope="module")
def session_pooler(
    servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedPgBouncer]:
    """Session mode, PgBouncer's defaults (it refuses unknown startup parameters)."""
    yield from bouncer_in_front(servers, tmp_path_factory.mktemp("pgbouncer-session"), "session")


def pooled(
    servers: Servers, database: str, bouncer: EmbeddedPgBouncer, pooler: str, **overrides: Any
) -> Settings:
    dsn = bouncer.dsn(servers.direct_dsn_for(database))
    values = {"id_types": ledger_types(), "keysync": {"poll_interval_s": 0.1}} | overrides
    return make_settings(servers, database, postgres_dsn=dsn, postgres_pooler=pooler, **values)


async def take_and_mark(url: str, count: int) -> list[str]:
    """``count`` shortlink keys in batches of 100; the first ten of each batch marked
    used. Waits out a pool still filling (503 IDG-001)."""
    keys: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while len(keys) < count:
            assert time.monotonic() < deadline, f"{len(keys)} of {count} keys in {DEADLINE_S}s"
            reply = await client.post("/v1/keys/shortlink", params={"count": 100})
            if reply.status_code == 503:
                await asyncio.sleep(0.1)
                continue
            assert reply.status_code == 200, reply.text
            batch = reply.json()["keys"]
            keys += batch
            marked = await client.post("/v1/keys/shortlink/used", json={"keys": batch[:10]})
            assert marked.status_code == 202, marked.text
    return keys


async def ledger_of(settings: Settings, count: int) -> dict[str, bool]:
    """key -> used, once the ledger holds ``count`` issued keys (read as the processes
    read, through the pooler)."""
    ledger = sql.ledger_table("shortlink")
    conn = await connect_as_processes(settings)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            rows = await conn.fetch(f"SELECT key, used_at IS NOT NULL AS used FROM {ledger}")
            if len(rows) >= count or time.monotonic() > deadline:
                return {r["key"]: r["used"] for r in rows}
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["transaction", "session"])
async def test_every_process_works_behind_pgbouncer(
    request: pytest.FixtureRequest,
    servers: Servers,
    database: str,
    redis_client: object,
    tmp_path: Path,
    mode: PoolMode,
) -> None:
    """migrate, keygen, two keysyncs (the ledger drain among them), a dispenser (its
    lookups), status: keys flow, each once, the ledger holds every key and mark."""
    bouncer: EmbeddedPgBouncer = request.getfixturevalue(f"{mode}_pooler")
    settings = pooled(servers, database, bouncer, mode)
    env = process_env(settings, write_config(settings, tmp_path / "config.yaml"))
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    stack = ChildProcesses(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        stack.spawn("keygen", env, "keygen")
        stack.spawn("keysync", env, "keysync-0")
        stack.spawn("keysync", env, "keysync-1")
        stack.spawn("dispenser", env | {"KD_DISPENSER__PORT": str(port)}, "dispenser")
        wait_for_http(f"{url}/healthz")
        keys = await take_and_mark(url, KEYS)
        ledger = await ledger_of(settings, len(keys))
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            looked_up = await client.get(f"/v1/keys/shortlink/{keys[0]}")
        status = run_cli("status", "--json", env=env)
        assert all(child.poll() is None for child in stack.children), "a process exited"
    finally:
        stack.close()
    assert len(set(keys)) == len(keys) >= KEYS
    assert sorted(ledger) == sorted(keys)
    assert looked_up.status_code == 200 and looked_up.json()["issued"], looked_up.text
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id_types"]["shortlink"]["cold_depth"] >= 0
    keygen_log = (tmp_path / "keygen.log").read_text()
    # In transaction mode keygen cannot LISTEN, and says so; in session mode it does.
    assert ("keygen_wakes_polled" in keygen_log) == (mode == "transaction"), keygen_log[-2000:]
    # Every mark of use reached the ledger (the drain applies them once issued).
    deadline = time.monotonic() + DEADLINE_S
    marked = {k for i, k in enumerate(keys) if i % 100 < 10}
    while not all(ledger.get(k) for k in marked) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        ledger = await ledger_of(settings, len(keys))
    assert all(ledger[k] for k in marked)


@pytest.mark.parametrize("pooler", ["none", "session"])
@pytest.mark.parametrize("command", ["migrate", "keygen", "keysync", "dispenser"])
def test_a_process_not_told_of_transaction_pooling_refuses_to_start(
    servers: Servers,
    database: str,
    transaction_pooler: EmbeddedPgBouncer,
    tmp_path: Path,
    command: str,
    pooler: str,
) -> None:
    """Connections lent a server per transaction, and postgres_pooler says "none" or
    "session": refused at start (exit 2), naming the setting and the value to set."""
    settings = pooled(servers, database, transaction_pooler, pooler)
    env = process_env(settings, write_config(settings, tmp_path / "config.yaml"))
    env["KD_DISPENSER__PORT"] = str(free_port())
    done = run_cli(command, env=env, timeout_s=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "postgres_pooler: transaction" in done.stderr and "Traceback" not in done.stderr


async def test_pooling_is_told_from_one_connection_answered_by_two_servers(
    servers: Servers,
    database: str,
    transaction_pooler: EmbeddedPgBouncer,
    session_pooler: EmbeddedPgBouncer,
) -> None:
    """The start-up check: per transaction through PgBouncer in transaction mode; not
    directly, nor through one in session mode."""
    direct = servers.direct_dsn_for(database)
    assert await pooled_per_transaction(transaction_pooler.dsn(direct))
    assert not await pooled_per_transaction(session_pooler.dsn(direct))
    assert not await pooled_per_transaction(direct)


async def test_what_a_pooler_refuses_or_loses_names_the_setting(
    servers: Servers,
    database: str,
    transaction_pooler: EmbeddedPgBouncer,
    session_pooler: EmbeddedPgBouncer,
) -> None:
    """A startup parameter refused (PgBouncer's default), and a named statement not found
    on the server a transaction was lent (the issue seen in the field): each a
    configuration error naming postgres_pooler, never an outage retried forever."""
    direct = servers.direct_dsn_for(database)
    with pytest.raises(ConfigError, match="postgres_pooler: session or transaction"):
        await ColdStore.connect(session_pooler.dsn(direct))
    # Let through unread, the startup parameter does not stop a process not told.
    cold = await ColdStore.connect(transaction_pooler.dsn(direct), min_size=2, max_size=2)
    try:
        async with cold.connection() as first, cold.connection() as second:
            await first.fetchval(sql.SELECT_BACKEND_PID)  # prepared on its server
            async with second.transaction():  # which the pooler lends to the other now
                await second.fetchval(sql.SELECT_BACKEND_PID)
                with pytest.raises(ConfigError, match="postgres_pooler: transaction"):
                    async with translated("asked again"):
                        await first.fetchval(sql.SELECT_BACKEND_PID)
    finally:
        await cold.close()


async def test_a_login_the_pooler_refuses_is_a_setup_to_fix_not_an_outage(
    servers: Servers, database: str, transaction_pooler: EmbeddedPgBouncer
) -> None:
    """PgBouncer refuses every login with SQLSTATE 08P01 (a connection failure's class),
    the server's own code lost: an unknown role or database would be retried forever.
    Told apart by its text: a configuration error naming the role, and migrate's hint."""
    scheme, rest = servers.direct_dsn_for(database).split("://", 1)
    nobody = transaction_pooler.dsn(f"{scheme}://kd_no_such_role@{rest.rpartition('@')[2]}")
    with pytest.raises(ConfigError, match=r"no such user.*'kd_no_such_role'"):
        await ColdStore.connect(nobody, pooler="transaction")
    missing = transaction_pooler.dsn(servers.direct_dsn_for("kd_no_such_database"))
    with pytest.raises(SchemaError, match="keydispenser migrate"):
        await ColdStore.connect(missing, pooler="transaction")


async def test_a_take_left_open_behind_the_pooler_holds_the_others_at_most_its_limit(
    servers: Servers, database: str, transaction_pooler: EmbeddedPgBouncer, sync: SyncRecord
) -> None:
    """A keysync frozen with a take open holds the sync clock's row lock, which every
    other take waits for. Behind the pooler the limit is still the transaction's own
    (set_config(..., true)): PostgreSQL ends the session it was lent, the others go on,
    and the frozen take's commit fails (its keys never pushed). tcp_user_timeout is set
    too, but reaches only the pooler's link to the server."""
    settings = pooled(servers, database, transaction_pooler, "transaction")
    types = build_id_types(settings)
    paused = await ColdStore.for_settings(settings)
    other = await ColdStore.for_settings(settings)
    generator = Generator(1)
    try:
        stop = asyncio.Event()
        await Keygen.on_postgres(settings, other, sync, stop, generator).lease_and_generate(
            types["farmer"]
        )
        before = await other.depth("farmer", 10**9)
        taking = GuardedCold(other, sync, types)
        paused.open_take_idle_limit_s = 0  # the control: no limit
        stuck = await GuardedCold(paused, sync, types).begin_take("farmer", 10)
        waiting = asyncio.ensure_future(taking.take_batch("farmer", 10))
        try:
            done, _ = await asyncio.wait([waiting], timeout=2)
            assert not done  # every other take waits as long as the frozen one is open
        finally:
            await stuck.rollback()
        await waiting

        paused.open_take_idle_limit_s = 1.0
        stuck = await GuardedCold(paused, sync, types).begin_take("farmer", 10)
        try:
            keys, _ = await asyncio.wait_for(taking.take_batch("farmer", 10), timeout=10)
            assert len(keys) == 10  # went on once the server ended the frozen session
            with pytest.raises(StoreUnavailable):
                await stuck.commit()
        finally:
            await stuck.rollback()
        assert await other.depth("farmer", 10**9) == before - 20
    finally:
        generator.close()
        await paused.close()
        await other.close()
