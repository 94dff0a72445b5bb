"""A registry's state for the growth benches (``--existing-rows N``): a type's ledger
loaded with N rows as years of service leave it, before anything is measured.

The rows are made by the server (``INSERT ... SELECT`` over ``generate_series``, in
chunks, on two connections at once), with the ledger's primary key dropped for the load
and built once after it (a sorted build, far cheaper than N random inserts), then
``VACUUM (ANALYZE)``, so the plans, the visibility map and the statistics are those of
an old table, not of an empty one; last the indexes are read into PostgreSQL's buffers,
as a registry in service holds them (``warm_s``).

What a row is, by its number n (proportions of a registry that issues, assigns and
sometimes gives back):

- its key: ``(n * SPREAD) mod 10^length``, zero-padded: spread over the whole keyspace
  as a permuted type's keys are, so an insert lands anywhere in the index (the benches'
  own keys are spread the same way, from numbers no row uses: ``spread_key``);
- issued over six years, to one of CLIENTS clients, 20 keys an entry, a quarter under
  an Idempotency-Key;
- 80% marked used (ASSIGNED) an hour after their issue, 3% released in place
  (UNASSIGNED), the rest issued and waiting;
- for a type that issues released keys again (``history``), 2% have an earlier issue
  given back, requeued and issued again: a row each in ``kd_released_issues`` (a type
  that does not keeps its releases in place, and has no such rows).

Keys listed in ``avoid`` (a bench's own valid keys, loaded apart) are left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, Final

import asyncpg

from shared.stores.postgres import sql

SPREAD: Final = 2_654_435_761  # odd and not a multiple of 5: n -> n * SPREAD mod 10^k is 1-1
CLIENTS: Final = 1_000
CHUNK: Final = 2_000_000  # rows a statement (each its own transaction)
JOBS: Final = 2  # connections loading at once
YEARS_S: Final = 6 * 365 * 86_400  # the span the rows were issued over
AVOID_TABLE: Final = "kd_bench_avoid"
LOADED_ENTRY: Final = "loaded-"  # entry IDs of loaded rows start so (never a stream ID)


def spread_key(n: int, length: int) -> str:
    """Key number ``n`` of a spread type of ``length`` digits (as the loader makes them)."""
    return f"{(n * SPREAD) % 10**length:0{length}d}"


# Row number n, its key k.key, issue time t.issued_at and client c.client ($1-$5:
# the chunk's first and end numbers, 10^length, length, seconds between two issues).
_NUMBERED: Final = """
FROM generate_series($1::bigint, $2::bigint - 1) AS n
CROSS JOIN LATERAL (
    SELECT lpad(((n * {spread}) % $3::bigint)::text, $4::int, '0') AS key
) AS k
CROSS JOIN LATERAL (
    SELECT timestamptz '2020-01-01 00:00:00+00' + make_interval(secs => n * $5::float8)
        AS issued_at
) AS t
CROSS JOIN LATERAL (SELECT 'client-' || (n % {clients}) AS client) AS c
"""

_ROWS: Final = """
INSERT INTO {ledger} (key, issued_at, client, idempotency_key, entry_id, used_at, used_by,
                      released_at, released_by)
SELECT k.key, t.issued_at, c.client,
       CASE WHEN n % 4 = 0 THEN 'idem-' || n END,
       'loaded-' || (n / 20),
       CASE WHEN n % 100 < 80 THEN t.issued_at + interval '1 hour' END,
       CASE WHEN n % 100 < 80 THEN c.client END,
       CASE WHEN n % 100 >= 97 THEN t.issued_at + interval '2 hours' END,
       CASE WHEN n % 100 >= 97 THEN c.client END
{numbered}WHERE NOT EXISTS (SELECT 1 FROM {avoid} AS a WHERE a.key = k.key)
"""

_HISTORY: Final = """
INSERT INTO kd_released_issues
    (id_type, key, issued_at, client, idempotency_key, entry_id, released_at, released_by,
     release_entry, recorded_at, requeued_at, requeue_discarded)
SELECT $6, k.key, t.issued_at - interval '30 days', c.client, NULL, 'loaded-old-' || n,
       t.issued_at - interval '20 days', c.client, 'loaded-release-' || n,
       t.issued_at - interval '20 days', t.issued_at - interval '10 days', false
{numbered}WHERE n % 50 = 0 AND NOT EXISTS (SELECT 1 FROM {avoid} AS a WHERE a.key = k.key)
"""


async def load_ledger(
    dsn: str,
    id_type: str,
    rows: int,
    length: int,
    avoid: Sequence[str] = (),
    *,
    history: bool = False,
) -> dict[str, Any]:
    """Load ``rows`` rows (module docstring) into ``id_type``'s empty ledger; what it
    took and what the tables weigh after."""
    ledger = sql.ledger_table(id_type)
    started = time.monotonic()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE UNLOGGED TABLE IF NOT EXISTS {AVOID_TABLE} (key text)")
        await conn.execute(f"TRUNCATE {AVOID_TABLE}")
        if avoid:
            await conn.copy_records_to_table(AVOID_TABLE, records=[(k,) for k in avoid])
        await conn.execute(f"ANALYZE {AVOID_TABLE}")
        pkey = await conn.fetchval(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = $1::text::regclass AND contype = 'p'",
            ledger.strip('"'),
        )
        await conn.execute(f"ALTER TABLE {ledger} DROP CONSTRAINT {pkey}")
        chunks = [(lo, min(lo + CHUNK, rows)) for lo in range(0, rows, CHUNK)]
        step_s = YEARS_S / max(rows, 1)
        values = (10**length, length, step_s)
        statements = [
            text.format(ledger=ledger, numbered=_NUMBERED, avoid=AVOID_TABLE).format(
                spread=SPREAD, clients=CLIENTS
            )
            for text in (_ROWS, _HISTORY)[: 2 if history else 1]
        ]
        await _in_parallel(dsn, chunks, statements, values, id_type)
        inserted = time.monotonic()
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute(f"ALTER TABLE {ledger} ADD CONSTRAINT {pkey} PRIMARY KEY (key)")
        indexed = time.monotonic()
        await conn.execute(f"VACUUM (ANALYZE) {ledger}")
        await conn.execute("VACUUM (ANALYZE) kd_released_issues")
        await conn.execute(f"DROP TABLE {AVOID_TABLE}")
        # What the load wrote goes to disk now, not in a checkpoint during the measures.
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CHECKPOINT")
        vacuumed = time.monotonic()
        await _warm(conn, ledger)
        ended = time.monotonic()
        return {
            "rows": rows,
            "load_s": round(ended - started, 1),
            "insert_s": round(inserted - started, 1),
            "index_s": round(indexed - inserted, 1),
            "vacuum_s": round(vacuumed - indexed, 1),  # and the checkpoint after it
            "warm_s": round(ended - vacuumed, 1),
            "rows_per_s": round(rows / (ended - started)) if rows else 0,
            **await sizes(conn, id_type),
        }
    finally:
        await conn.close()


async def _warm(conn: asyncpg.Connection, ledger: str) -> None:
    """The indexes read into PostgreSQL's buffers (an index-only scan of each: index
    pages are not read through a ring as a large sequential scan is), as a registry in
    service holds them: its index is what every insert and lookup walks."""
    async with conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        await conn.fetchval(f"SELECT count(*) FROM {ledger} WHERE key >= ''")
        await conn.fetchval("SELECT count(*) FROM kd_released_issues WHERE id_type >= ''")


async def _in_parallel(
    dsn: str,
    chunks: list[tuple[int, int]],
    statements: list[str],
    values: tuple[int, int, float],
    id_type: str,
) -> None:
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)

    async def job() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            # Each chunk is its own transaction: the WAL a commit waits for is written
            # as the rows are, not in one flush at the end.
            await conn.execute("SET synchronous_commit = off")
            while not queue.empty():
                lo, hi = queue.get_nowait()
                async with conn.transaction():
                    await conn.execute(statements[0], lo, hi, *values)
                    if len(statements) > 1:
                        await conn.execute(statements[1], lo, hi, *values, id_type)
        finally:
            await conn.close()

    await asyncio.gather(*(job() for _ in range(JOBS)))


async def sizes(conn: asyncpg.Connection, id_type: str) -> dict[str, Any]:
    """The ledger's and the released issues' tables and indexes, in MB and per million
    rows of the ledger."""
    ledger = sql.ledger_table(id_type).strip('"')
    row = await conn.fetchrow(
        """
        SELECT (SELECT reltuples FROM pg_class WHERE oid = $1::text::regclass) AS rows,
               pg_table_size($1::text::regclass) AS ledger_table,
               pg_indexes_size($1::text::regclass) AS ledger_indexes,
               pg_table_size('kd_released_issues') AS history_table,
               pg_indexes_size('kd_released_issues') AS history_indexes
        """,
        ledger,
    )
    assert row is not None
    rows = max(float(row["rows"]), 0.0)
    mb = {name: round(int(row[name]) / 2**20, 1) for name in list(row.keys())[1:]}
    per_million = {
        name: round(value / rows * 1e6, 1) if rows >= 1e5 else None for name, value in mb.items()
    }
    return {"sizes_mb": mb, "sizes_mb_per_million_rows": per_million}
