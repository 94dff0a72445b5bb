"""`keydispenser retire`: the real command against real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.processes import run_cli
from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.cli.retire import retire
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import SchemaError
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.acceptance.harness import process_env, write_config
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings

MARKS = {
    "range_size": 1_000,
    "hot": {"low": 50, "high": 200},
    "cold": {"low": 300, "high": 600},
    "sync_batch": 100,
}


def types(*names: str) -> dict[str, Any]:
    return {name: {"kind": "numeric", "length": 8, **MARKS} for name in names}


def cli(settings: Settings, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = process_env(settings, write_config(settings, tmp_path / "config.yaml"))
    done = run_cli("retire", *args, env=env)
    return done.returncode, done.stdout, done.stderr


async def fill(settings: Settings, sync: SyncRecord, hot: HotStore) -> None:
    await run_migrate(settings)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), Generator(2))
        while await keygen.step():
            pass
        guarded = GuardedCold(cold, sync, build_id_types(settings))
        await Keysync(settings, guarded, hot).refill_all()
    finally:
        await cold.close()


async def relations(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT relname FROM pg_class WHERE relname LIKE 'kd\\_%\\_old' OR relname LIKE "
            "'kd\\_%\\_farmer'"
        )
        return {r[0] for r in rows}
    finally:
        await conn.close()


async def fetch(dsn: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()


def test_retire_refuses_a_configured_type_and_an_unconfirmed_one(
    servers: Servers, database: str, tmp_path: Path
) -> None:
    settings = make_settings(servers, database, id_types=types("farmer"))
    code, _, err = cli(settings, tmp_path, "--type", "farmer", "--yes")
    assert code != 0 and "farmer" in err and "still configured" in err
    code, _, err = cli(settings, tmp_path, "--type", "old")
    assert code != 0 and "'old'" in err and "--yes" in err


async def test_retire_drops_a_removed_type_everywhere_once(
    servers: Servers,
    database: str,
    tmp_path: Path,
    sync: SyncRecord,
    hot: HotStore,
    redis_client: aioredis.Redis,
) -> None:
    before = make_settings(servers, database, id_types=types("farmer", "old"))
    await fill(before, sync, hot)
    await hot.mark_exhausted("old")
    cold_old = int(
        (await fetch(before.postgres_dsn, f"SELECT count(*) FROM {sql.cold_table('old')}"))[0][0]
    )
    hot_old = await hot.depth("old")
    assert cold_old and hot_old and await hot.depth("farmer")
    assert "leased:old" in await redis_client.hgetall(redis_keys.sync_record_key(NS))

    after = make_settings(servers, database, id_types=types("farmer"))
    code, out, err = cli(after, tmp_path, "--type", "old", "--yes")
    assert code == 0, err
    report = json.loads(out)
    assert report["cold_keys_dropped"] == cold_old and report["hot_keys_dropped"] == hot_old
    assert report["ranges_leased"] >= 1 and not report["already_retired"]

    assert await relations(before.postgres_dsn) == {
        "kd_cold_farmer",
        "kd_seq_farmer",
        "kd_ledger_farmer",
        "kd_ledger_old",  # ledger kept
    }
    dsn = before.postgres_dsn
    assert not await fetch(dsn, "SELECT 1 FROM kd_id_types WHERE name = 'old'")
    assert not await fetch(dsn, "SELECT 1 FROM kd_ranges WHERE id_type = 'old'")
    tombstone = await fetch(dsn, "SELECT * FROM kd_retired_types")
    assert [r["name"] for r in tombstone] == ["old"] and tombstone[0]["fingerprint"] is not None
    redis_left = {str(k) for k in await redis_client.keys("*")}
    assert not {k for k in redis_left if k.endswith(":old")}
    assert redis_keys.hot_list_key(NS, "farmer") in redis_left
    assert await redis_client.smembers(redis_keys.hot_registry_key(NS)) == {
        redis_keys.hot_list_key(NS, "farmer")
    }
    record = await redis_client.hgetall(redis_keys.sync_record_key(NS))
    assert "leased:old" not in record and "leased:farmer" in record

    code, out, err = cli(after, tmp_path, "--type", "old", "--yes")  # again: nothing to do
    assert code == 0 and json.loads(out)["already_retired"], err
    with pytest.raises(SchemaError, match=r"id_types\.old: retired on"):
        await run_migrate(before)  # the name is never used again
    dropped = await retire(after, "old", drop_ledger=True)
    assert dropped["ledger_dropped"] and "kd_ledger_old" not in await relations(dsn)
    code, _, err = cli(after, tmp_path, "--type", "never_was", "--yes")
    assert code == 1 and "never_was" in err
