"""A restore's writes: what ledger transactions wrote (``Applied.ops``, kept in the
ledger log), written again in order after a PostgreSQL promotion lost them. Nothing is
decided here: each operation writes the rows its decision wrote (``decide.py``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def apply_ops(conn: asyncpg.Connection, ops: list[dict[str, Any]]) -> None:
    """Write again, in order, what ledger transactions wrote (``Applied.ops``, from the
    ledger log), in the caller's transaction. Nothing is decided: each statement writes
    the rows the decision wrote. Keys requeued are not put back in the cold table (a
    restore follows a fence, which discarded it)."""
    for op in ops:
        await _OPS[op["op"]](conn, op["type"], op)


async def _force_issue(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    arrays = (op["keys"], [_at(t) for t in op["times"]], op["clients"], op["idem"], op["entries"])
    await conn.execute(sql.for_type(ledger_sql.FORCE_ISSUED, name), *arrays, op["skip"])


async def _force_early(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    keys, times, clients = op["applied"]
    statement = sql.for_type(ledger_sql.FORCE_EARLY_MARKS_APPLIED, name)
    await conn.execute(statement, name, op["keys"], keys, [_at(t) for t in times], clients)


async def _force_used(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    keys, times, clients = op["applied"]
    if keys:
        await conn.execute(
            sql.for_type(ledger_sql.FORCE_USED, name), keys, [_at(t) for t in times], clients
        )
    keys, times, clients, admin = op["waiting"]
    if keys:
        await conn.execute(
            ledger_sql.INSERT_EARLY_MARKS, name, keys, [_at(t) for t in times], clients, admin
        )


async def _force_release(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    if not op["rows"][0]:
        return
    if op["history"]:
        keys, times, clients, entries, recorded = op["rows"]
        statement = sql.for_type(ledger_sql.FORCE_RELEASED_TO_HISTORY, name)
        await conn.execute(
            statement,
            name,
            keys,
            [_at(t) for t in times],
            clients,
            entries,
            [_at(t) for t in recorded],
        )
        return
    keys, times, clients = op["rows"]
    await conn.execute(
        sql.for_type(ledger_sql.FORCE_RELEASED, name), keys, [_at(t) for t in times], clients
    )


async def _force_outcomes(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    entries, outcomes = op["outcomes"]
    await conn.execute(ledger_sql.FORCE_OUTCOMES, name, entries, outcomes)


async def _force_requeue(conn: asyncpg.Connection, name: str, op: dict[str, Any]) -> None:
    keys, entries, discarded, times = op["rows"]
    await conn.execute(
        ledger_sql.FORCE_REQUEUED, name, keys, entries, discarded, [_at(t) for t in times]
    )


_OPS = {
    "issue": _force_issue,
    "early": _force_early,
    "used": _force_used,
    "release": _force_release,
    "outcomes": _force_outcomes,
    "requeue": _force_requeue,
}
