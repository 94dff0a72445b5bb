"""The integration fixtures: real servers (KD_TEST_POSTGRES_DSN / KD_TEST_REDIS_URL when
set, else embedded PostgreSQL and a Redis-compatible server started once per session), a
fresh database and a flushed Redis database per test, and the dispenser served over HTTP.

With ``KD_TEST_POSTGRES_POOLER=pgbouncer-transaction`` (or ``pgbouncer-session``) the
processes' DSNs go through a PgBouncer the session starts in front of that PostgreSQL
(``postgres_pooler`` set to its pool mode), and only the tests that use a database of
the suite's server run: CI runs the acceptance tests that way once more. Databases are
still made and dropped directly (``Servers.postgres_admin_dsn``).

A pytest plugin, registered once by tests/integration/conftest.py and
tests/acceptance/conftest.py (so each xdist worker starts its servers once, whichever of
the two it runs), and never loaded for the unit tests."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn

from dispenser.app import create_app
from dispenser.server import uvicorn_options
from keydispenser_ops.embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from keydispenser_ops.pgbouncer import EmbeddedPgBouncer, PoolMode, through
from keydispenser_ops.processes import cli_command, scrubbed_env, spawn, stop_process
from keydispenser_ops.redis_cluster import EmbeddedRedisCluster
from shared.domain import redis_keys
from shared.domain.config import Settings, load_settings
from shared.leases.store import MachineLeases
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.connect import driver_options
from shared.stores.postgres.databases import (
    drop_database,
    dsn_with_database,
    run_migrate,
    scratch_database,
)
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import EMPTY_CONFIG, NS, TEST_SECRET, small_types

_counter = itertools.count()
SERVER_START_DEADLINE_S = 30.0
# The HTTP servers a dispenser runs on (dispenser.server). Tests marked ``both_servers``
# run against each; the others against uvicorn in this process.
HTTP_SERVERS = ("uvicorn", "granian")
both_servers = pytest.mark.parametrize("server", HTTP_SERVERS, indirect=True)


# KD_TEST_POSTGRES_POOLER: the processes reach PostgreSQL through a PgBouncer in this
# pool mode.
POOLER_ENV = "KD_TEST_POSTGRES_POOLER"
POOLERS: dict[str, PoolMode] = {
    "pgbouncer-transaction": "transaction",
    "pgbouncer-session": "session",
}


def pool_mode_asked() -> PoolMode | None:
    """The pool mode KD_TEST_POSTGRES_POOLER asks for (None: processes connect directly)."""
    asked = os.environ.get(POOLER_ENV, "")
    if asked and asked not in POOLERS:
        raise RuntimeError(f"{POOLER_ENV}={asked}: expected one of {', '.join(POOLERS)}")
    return POOLERS.get(asked)


@dataclass(frozen=True)
class Servers:
    postgres_admin_dsn: str
    redis_url: str
    # The PgBouncer the processes' DSNs go through, and its pool mode (postgres_pooler).
    pooler_port: int | None = None
    postgres_pooler: str = "none"

    def dsn_for(self, database: str) -> str:
        """What the processes connect to: the server, or the pooler in front of it."""
        direct = self.direct_dsn_for(database)
        if self.pooler_port is None:
            return direct
        return through(direct, self.pooler_port)

    def direct_dsn_for(self, database: str) -> str:
        """The server itself, whatever the processes go through (to inspect and set up)."""
        return dsn_with_database(self.postgres_admin_dsn, database)


def make_settings(servers: Servers, database: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "postgres_dsn": servers.dsn_for(database),
        "postgres_pooler": servers.postgres_pooler,
        "redis_url": servers.redis_url,
        "permutation_key": TEST_SECRET,
        "id_types": small_types(),
        "keygen": {"poll_interval_s": 0.2, "slice_size": 10_000},
        "keysync": {"poll_interval_s": 0.1},
    }
    values.update(overrides)
    return load_settings(EMPTY_CONFIG, **values)


# KD_TEST_REQUIRE_STACK=1 (set by .ci/run): a tool of the stack operators run (PgBouncer,
# etcd and Patroni, a Redis built with TLS) missing fails its tests instead of skipping.
REQUIRE_STACK_ENV = "KD_TEST_REQUIRE_STACK"


def require_tool(name: str, install: str, found: bool | None = None) -> None:
    """Skip (or fail, under KD_TEST_REQUIRE_STACK=1) unless ``name`` is installed
    (``found``: already looked up; by default, on PATH or in /usr/sbin)."""
    if found is None:
        found = bool(shutil.which(name) or shutil.which(name, path="/usr/sbin"))
    if found:
        return
    if os.environ.get(REQUIRE_STACK_ENV) == "1":
        pytest.fail(f"{name} is missing ({install}) and {REQUIRE_STACK_ENV}=1")
    pytest.skip(f"{name} is not installed ({install})")


async def connect_as_processes(settings: Settings) -> asyncpg.Connection:
    """A connection to ``settings.postgres_dsn`` made as the processes make theirs
    (through the pooler, if any: no named statements there)."""
    return await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))


def worker_redis_url(url: str) -> str:
    """With pytest-xdist, each worker flushes a Redis database of its own: the given
    database number minus the worker's index (gw0: as given, gw1: one below, ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw") or 0)
    if index == 0:
        return url
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) - index
    if db < 0:
        raise RuntimeError(f"KD_TEST_REDIS_URL: no Redis database left for xdist worker {worker}")
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    pg_dsn = os.environ.get("KD_TEST_POSTGRES_DSN")
    redis_url = os.environ.get("KD_TEST_REDIS_URL")
    redis_url = worker_redis_url(redis_url) if redis_url else None
    started: list[EmbeddedPostgres | EmbeddedRedis | EmbeddedPgBouncer] = []
    with tempfile.TemporaryDirectory(prefix="kd-test-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs as an unprivileged user when we are root
        if not pg_dsn:
            postgres = EmbeddedPostgres(Path(tmp) / "postgres")
            postgres.start()
            started.append(postgres)
            pg_dsn = postgres.dsn("postgres")
        if not redis_url:
            server = EmbeddedRedis(Path(tmp) / "redis")
            server.start()
            started.append(server)
            redis_url = server.url
        mode = pool_mode_asked()
        pooler_port = None
        if mode is not None:
            target = urlsplit(pg_dsn)
            pooler = EmbeddedPgBouncer(
                Path(tmp) / "pgbouncer",
                target.hostname or "127.0.0.1",
                target.port or 5432,
                mode,
                admin_user=target.username or "postgres",
            )
            pooler.start()
            started.append(pooler)
            pooler_port = pooler.port
        try:
            yield Servers(pg_dsn, redis_url, pooler_port, mode or "none")
        finally:
            for each in reversed(started):
                each.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Behind a pooler (KD_TEST_POSTGRES_POOLER), only the tests that use a database of
    the suite's server, and not the drills (they run servers of their own) nor those
    marked ``not_pooled``."""
    if pool_mode_asked() is None:
        return
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        uses = "database" in getattr(item, "fixturenames", ())
        apart = any(item.get_closest_marker(m) for m in ("drill", "not_pooled"))
        (kept if uses and not apart else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session")
async def template_db(servers: Servers) -> AsyncIterator[str]:
    """A database migrated with the test types; each test clones it."""
    name = f"kd_template_{os.getpid()}"
    await scratch_database(servers.postgres_admin_dsn, name)
    try:
        # Directly: a pooler would keep server connections to the template open, and
        # PostgreSQL copies no database others are connected to.
        direct = servers.direct_dsn_for(name)
        await run_migrate(make_settings(servers, name, postgres_dsn=direct, postgres_pooler="none"))
        yield name
    finally:
        await drop_database(servers.postgres_admin_dsn, name)


@asynccontextmanager
async def cloned_database(servers: Servers, template_db: str) -> AsyncIterator[str]:
    """A fresh database cloned from the migrated template, dropped at the end."""
    name = f"kd_test_{os.getpid()}_{next(_counter)}"
    admin = await asyncpg.connect(servers.postgres_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        yield name
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def database(servers: Servers, template_db: str) -> AsyncIterator[str]:
    """A fresh database per test, cloned from the migrated template."""
    async with cloned_database(servers, template_db) as name:
        yield name


@pytest.fixture
async def redis_client(servers: Servers) -> AsyncIterator[aioredis.Redis]:
    """A flushed Redis database per test."""
    client = aioredis.Redis.from_url(servers.redis_url, decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def hot(servers: Servers, redis_client: aioredis.Redis) -> AsyncIterator[HotStore]:
    """A hot store on the flushed test database."""
    store = HotStore(RedisEndpoint(servers.redis_url), NS)
    yield store
    await store.close()


@pytest.fixture
async def sync(servers: Servers, redis_client: aioredis.Redis) -> AsyncIterator[SyncRecord]:
    """The PostgreSQL fence's record, on the flushed test database."""
    record = SyncRecord(RedisEndpoint(servers.redis_url), NS)
    yield record
    await record.close()


async def end_lease_settling(redis_url: str, redis_client: aioredis.Redis) -> None:
    """Start and end at once the settle period a fresh Redis database starts on first
    use (no machine ID is granted for one lease TTL), so leases are granted at once."""
    leases = MachineLeases(RedisEndpoint(redis_url), NS)
    try:
        await leases.holders("settle")
    finally:
        await leases.close()
    await redis_client.hset(redis_keys.sync_record_key(NS), "fenced_at", 0)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> str:
    """The HTTP server under test: uvicorn unless the test is marked ``both_servers``."""
    name: str = getattr(request, "param", "uvicorn")
    return name


@asynccontextmanager
async def dispenser_over_http(
    settings: Settings, server: str = "uvicorn", **app_options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The dispenser served on a loopback port, and a client for it: uvicorn in this
    process (``app_options`` go to ``create_app``: a clock), or granian
    as a real ``keydispenser dispenser`` process (granian serves only from worker
    processes of its own)."""
    if server == "granian":
        if app_options:
            raise ValueError(f"a granian dispenser runs in its own process: {sorted(app_options)}")
        serving = _granian_process(settings)
    else:
        serving = _uvicorn_in_process(settings, **app_options)
    async with (
        serving as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        yield client


@asynccontextmanager
async def _uvicorn_in_process(settings: Settings, **app_options: Any) -> AsyncIterator[int]:
    port = free_port()
    options = uvicorn_options(settings.dispenser) | {"host": "127.0.0.1", "port": port}
    config = uvicorn.Config(create_app(settings, **app_options), **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + SERVER_START_DEADLINE_S
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            server.should_exit = True
            await asyncio.wait_for(task, SERVER_START_DEADLINE_S)  # its error, if it failed
            raise RuntimeError(f"dispenser did not start within {SERVER_START_DEADLINE_S}s")
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


def dispenser_process_env(settings: Settings, work: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``keydispenser dispenser`` child configured as ``settings``."""
    config = work / "dispenser.yaml"
    body = settings.model_dump(
        mode="json", include={"id_types", "dispenser", "log_level", "redis_namespace"}
    )
    config.write_text(json.dumps(body))
    key = settings.permutation_key
    return scrubbed_env(
        KD_CONFIG=str(config),
        KD_POSTGRES_DSN=settings.postgres_dsn,
        KD_POSTGRES_POOLER=settings.postgres_pooler,
        KD_REDIS_URL=settings.redis_url,
        KD_PERMUTATION_KEY=key.get_secret_value() if key else "",
        **extra,
    )


async def wait_until_serving(
    port: int, child: subprocess.Popen[bytes], log: Path, deadline_s: float
) -> None:
    """Poll ``/healthz`` on loopback ``port`` until it answers 200; fail with the
    child's log when it exits first or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1) as probe:
        while time.monotonic() < deadline and child.poll() is None:
            try:
                if (await probe.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.02)
    output = await asyncio.to_thread(log.read_text)
    raise RuntimeError(f"dispenser did not serve on {port}:\n{output}")


@asynccontextmanager
async def _granian_process(settings: Settings) -> AsyncIterator[int]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kd-granian-") as work:
        env = dispenser_process_env(
            settings,
            Path(work),
            KD_DISPENSER__SERVER="granian",
            KD_DISPENSER__HOST="127.0.0.1",
            KD_DISPENSER__PORT=str(port),
        )
        log = Path(work) / "dispenser.log"
        child = spawn(cli_command("dispenser"), env, log)
        try:
            await wait_until_serving(port, child, log, SERVER_START_DEADLINE_S)
            yield port
        finally:
            stop_process(child)


@asynccontextmanager
async def dispenser_in_process(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The dispenser app called in-process through httpx, its lifespan entered around it."""
    app = create_app(settings)
    starlette = app.app  # the lifespan is the Starlette app's, inside the fast path
    transport = httpx.ASGITransport(app=app)
    async with (
        starlette.router.lifespan_context(starlette),
        httpx.AsyncClient(transport=transport, base_url="http://dispenser") as client,
    ):
        yield client


@pytest.fixture
def settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    return make_settings(servers, database)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedRedisCluster]:
    """A Redis Cluster of 3 primaries and 3 replicas on loopback, for one test. Failure
    detection in 2 s: fast enough for a killed primary, slow enough that a busy machine
    (the suite runs two workers on two cores) does not fail a node by itself."""
    made = EmbeddedRedisCluster(tmp_path / "cluster", node_timeout_ms=2_000)
    await asyncio.to_thread(made.start)
    try:
        yield made
    finally:
        await asyncio.to_thread(made.stop)
