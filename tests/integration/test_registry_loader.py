"""The growth benches' registry (``keydispenser_ops.bench.registry``): N ledger rows as a
registry's years leave them, loaded with the primary key back in place, the keys a
bench uses for itself left out, and the proportions the docs state."""

from __future__ import annotations

from keydispenser_ops.bench.registry import load_ledger, spread_key
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings

ROWS = 5_000


async def test_the_loader_makes_a_registry_of_n_rows_around_the_keys_it_must_avoid(
    servers: Servers, database: str
) -> None:
    types = small_types()
    types["farmer"] |= {"ledger": True, "reissue_released": True, "reissue_after_s": 3600}
    settings = make_settings(servers, database, id_types=types)
    await run_migrate(settings)
    length = types["farmer"]["length"]
    avoid = [spread_key(n, length) for n in (7, 99, 4_321)]
    report = await load_ledger(
        settings.postgres_dsn, "farmer", ROWS, length, avoid=avoid, history=True
    )
    assert report["rows"] == ROWS and report["sizes_mb"]["ledger_indexes"] > 0
    store = await ColdStore.connect(settings.postgres_dsn)
    try:
        async with store.connection() as conn:
            row = await conn.fetchrow(
                sql.for_type(
                    """
                    SELECT count(*) AS rows, count(DISTINCT key) AS keys,
                           count(used_at) AS used, count(released_at) AS released,
                           count(DISTINCT client) AS clients,
                           bool_and(length(key) = $1) AS lengths,
                           count(*) FILTER (WHERE key = ANY($2::text[])) AS avoided
                    FROM {ledger}
                    """,
                    "farmer",
                ),
                length,
                avoid,
            )
            history = await conn.fetchval(
                "SELECT count(*) FROM kd_released_issues WHERE id_type = 'farmer'"
            )
            primary = await conn.fetchval(
                "SELECT count(*) FROM pg_constraint"
                " WHERE conrelid = 'kd_ledger_farmer'::regclass AND contype = 'p'"
            )
    finally:
        await store.close()
    assert row["rows"] == row["keys"] == ROWS - len(avoid)
    assert row["avoided"] == 0 and row["lengths"] is True
    assert 0.78 < row["used"] / row["rows"] < 0.82
    assert 0.02 < row["released"] / row["rows"] < 0.04
    assert row["clients"] == 1_000
    assert 0.015 < history / ROWS < 0.025
    assert primary == 1  # the key is unique again, as migrate made it


def test_spread_keys_of_distinct_numbers_are_distinct_and_fill_the_length() -> None:
    keys = {spread_key(n, 6) for n in range(100_000)}
    assert len(keys) == 100_000 and all(len(k) == 6 for k in keys)
