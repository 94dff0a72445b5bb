"""Every error a failover or an overload makes PostgreSQL answer is an outage that
passes, never an exit: keygen and keysync back off, say so once, and resume.

The errors are made by the real server: a trigger on the cold table and on
``kd_ranges`` raises the SQLSTATE under test for every statement keygen (COPY, lease)
and keysync (take) run, until it is cleared; besides, every backend of the database is
terminated (a real admin shutdown), and the database is made read-only for new
sessions (as a demoted primary is). Only configuration errors (a wrong password, a
missing database or table) end a process: that is tests/acceptance/test_cli.py's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.domain.config import Settings
from tests.acceptance.harness import ChildProcesses, process_env, write_config
from tests.conftest import NS
from tests.integration.fixtures import Servers

pytestmark = pytest.mark.acceptance
# What an overloaded or failing-over PostgreSQL answers with, besides a closed socket.
SQLSTATES = {
    "53300": "too_many_connections",
    "57014": "query_canceled",
    "57P01": "admin_shutdown",
    "25006": "read_only_sql_transaction",
    "53100": "disk_full",
    "53200": "out_of_memory",
    "40001": "serialization_failure",
    "40P01": "deadlock_detected",
    "23505": "unique_violation",
    "55P03": "lock_not_available",
    "58030": "io_error",
    "XX000": "internal_error",
}
FAULT_S = 1.5  # how long each error is answered
DEADLINE_S = 60.0

INSTALL_FAULTS = """
CREATE TABLE kd_test_fault (id int PRIMARY KEY, sqlstate text);
INSERT INTO kd_test_fault VALUES (1, NULL);
CREATE FUNCTION kd_test_raise() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE code text;
BEGIN
    SELECT sqlstate INTO code FROM kd_test_fault WHERE id = 1;
    IF code IS NOT NULL THEN
        RAISE EXCEPTION 'injected fault %', code USING ERRCODE = code;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER kd_test_cold BEFORE INSERT OR DELETE ON kd_cold_farmer
    FOR EACH STATEMENT EXECUTE FUNCTION kd_test_raise();
CREATE TRIGGER kd_test_ranges BEFORE INSERT ON kd_ranges
    FOR EACH STATEMENT EXECUTE FUNCTION kd_test_raise();
"""


async def until(check: object, what: str) -> None:
    assert callable(check)
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {DEADLINE_S}s")
        await asyncio.sleep(0.1)


async def test_keygen_and_keysync_ride_out_every_store_error(
    servers: Servers,
    database: str,
    settings: Settings,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    # The faults are made on the server itself (behind a pooler, a database made
    # read-only would refuse the statement that makes it writable again).
    admin = await asyncpg.connect(servers.direct_dsn_for(database))
    await admin.execute(INSTALL_FAULTS)
    env = process_env(settings, write_config(settings, tmp_path / "config.yaml"))
    children = ChildProcesses(tmp_path)
    hot_list = redis_keys.hot_list_key(NS, "farmer")
    high = settings.pooled("farmer").hot.high

    low = settings.pooled("farmer").hot.low
    still: list[tuple[int, float]] = []

    async def refilled() -> bool:
        """At the high watermark. A batch taken before starve() may land after it and
        leave the list between the watermarks, where keysync rightly leaves it: once
        such a depth has held still for a second, it is emptied (as if dispensed)."""
        depth, now = int(await redis_client.llen(hot_list)), time.monotonic()
        if depth >= high:
            return True
        if depth < low or not still or still[-1][0] != depth:
            still[:] = [(depth, now)]
        elif now - still[-1][1] > 1.0:
            await redis_client.delete(hot_list)
            still.clear()
        return False

    def alive() -> list[str]:
        return [
            f"{c.args!r}: exit {c.returncode}" for c in children.children if c.poll() is not None
        ]

    async def starve() -> None:
        """Empty both tiers, so keysync takes and keygen leases and copies next."""
        await admin.execute("DELETE FROM kd_cold_farmer")
        await redis_client.delete(hot_list)

    try:
        children.spawn("keygen", env, "keygen")
        children.spawn("keysync", env, "keysync")
        await until(refilled, "first refill")
        for code in SQLSTATES:
            await starve()
            await admin.execute("UPDATE kd_test_fault SET sqlstate = $1", code)
            await asyncio.sleep(FAULT_S)
            await admin.execute("UPDATE kd_test_fault SET sqlstate = NULL")
            assert alive() == [], f"exited on SQLSTATE {code}"
            await until(refilled, f"refill after SQLSTATE {code}")

        # A real admin shutdown of every session, and a database that turned read-only
        # (a demoted primary) for every new one.
        await starve()
        await admin.execute(
            "ALTER DATABASE "
            + settings.postgres_dsn.rsplit("/", 1)[1]
            + " SET default_transaction_read_only = on"
        )
        await terminate_all(admin)
        await asyncio.sleep(FAULT_S)
        await admin.execute(
            "ALTER DATABASE "
            + settings.postgres_dsn.rsplit("/", 1)[1]
            + " RESET default_transaction_read_only"
        )
        await terminate_all(admin)
        assert alive() == [], "exited on an admin shutdown or a read-only database"
        await until(refilled, "refill after the shutdown")
    finally:
        children.close()
        await admin.close()
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("keygen", "keysync")}
    seen = {code for code in SQLSTATES for log in logs.values() if f"SQLSTATE {code}" in log}
    assert seen == set(SQLSTATES), sorted(set(SQLSTATES) - seen)
    assert all("Traceback" not in log for log in logs.values())


async def terminate_all(admin: asyncpg.Connection) -> None:
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
