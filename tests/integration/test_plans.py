"""The stores' statements are planned for the tables as they are, not as they were.

asyncpg prepares each statement once per connection; after five runs PostgreSQL may
keep a generic plan for it. Made while a ledger table was empty (a fresh type), that
plan joined a batch's marks by scanning the whole table once per mark, and stayed as
the table grew: a ledger drain in the cluster drill took 4 s and more per batch and
fell tens of seconds behind (500 marks on 100,000 rows: 22 s instead of 5 ms).
``ColdStore`` connections plan every run (``connect.SERVER_SETTINGS``); the control, a
connection without that setting, keeps the scan.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from shared.domain.config import Settings
from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings

ROWS = 20_000  # issue rows added after the statement's first runs
# One mark of a key that is not there (EXECUTE takes literals, not bound parameters).
MARK = "('{absent}', '{2026-01-01T00:00:00Z}', '{a}', '{false}')"


@pytest.fixture
def settings(servers: Servers, database: str) -> Settings:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return make_settings(servers, database, id_types=types)


@pytest.fixture
async def cold_store(settings: Settings) -> AsyncIterator[ColdStore]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    yield cold
    await cold.close()


async def plan_after_growth(conn: asyncpg.Connection) -> dict[str, Any]:
    """The plan ``conn`` uses for the ledger's mark-of-use statement (UPDATE_LEDGER_USED)
    after running it six times on an empty ledger table and then filling the table."""
    ledger = sql.ledger_table("shortlink")
    statement = sql.for_type(ledger_sql.UPDATE_LEDGER_USED, "shortlink")
    await conn.execute(f"PREPARE mark_used(text[], timestamptz[], text[], bool[]) AS {statement}")
    try:
        for _ in range(6):  # custom plans first; then PostgreSQL may settle on a generic one
            await conn.execute(f"EXECUTE mark_used{MARK}")
        await conn.execute(
            f"INSERT INTO {ledger} (key, issued_at, client, entry_id) "
            "SELECT 'k' || g, now() - interval '1 hour', 'a', '1-' || g "
            "FROM generate_series(1, $1::int) AS g",
            ROWS,
        )
        found = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE mark_used{MARK}")
    finally:
        await conn.execute("DEALLOCATE mark_used")
        await conn.execute(f"TRUNCATE {ledger}")
    plan: dict[str, Any] = json.loads(found)[0]["Plan"]
    return plan


def scans_of(plan: dict[str, Any], table: str) -> list[str]:
    """Each scan of ``table`` in ``plan`` (its node type; the update itself is no scan)."""
    node = plan["Node Type"]
    own = [node] if plan.get("Relation Name") == table and node.endswith("Scan") else []
    return own + [s for child in plan.get("Plans", []) for s in scans_of(child, table)]


async def test_a_statement_first_run_on_an_empty_table_uses_its_index_once_it_grew(
    cold_store: ColdStore,
) -> None:
    async with cold_store.connection() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        plan = await plan_after_growth(conn)
    assert scans_of(plan, sql.ledger_table("shortlink").strip('"')) == ["Index Scan"]


async def test_control_a_connection_keeping_its_first_plans_scans_the_whole_table(
    settings: Settings, cold_store: ColdStore
) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
        plan = await plan_after_growth(conn)
    finally:
        await conn.close()
    assert scans_of(plan, sql.ledger_table("shortlink").strip('"')) == ["Seq Scan"]
