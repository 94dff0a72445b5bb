"""``keydispenser export``: a ledger type's ledger, streamed (CSV or JSON lines), for an
auditor or the system that comes after keydispenser."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from datetime import datetime
from typing import Any, TextIO

import asyncpg

from shared.domain.config import Settings
from shared.domain.errors import ConfigError
from shared.domain.idtypes import build_id_types
from shared.stores.postgres import sql
from shared.stores.postgres.connect import check_files, driver_options

CHUNK = 10_000


def run(settings: Settings, args: argparse.Namespace) -> None:
    types = build_id_types(settings, generating=False)
    id_type = types.get(args.type_name)
    if id_type is None or not id_type.config.ledger:
        ledgers = ", ".join(sorted(n for n, t in types.items() if t.config.ledger)) or "none"
        raise ConfigError(
            f"--type: '{args.type_name}' is not a configured type with a ledger "
            f"(those with one: {ledgers})"
        )
    asyncio.run(export(settings, args.type_name, args.format, sys.stdout))


async def export(settings: Settings, name: str, form: str, out: TextIO) -> int:
    """Write every issue of ``name`` to ``out``; how many."""
    check_files(settings.postgres_dsn)
    conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))
    write = _csv(out) if form == "csv" else _jsonl(out)
    written = 0
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            cursor = await conn.cursor(sql.for_type(sql.EXPORT_LEDGER, name), name)
            while rows := await cursor.fetch(CHUNK):
                for row in rows:
                    write([_text(row[c]) for c in sql.EXPORT_COLUMNS])
                written += len(rows)
    finally:
        await conn.close()
    return written


def _csv(out: TextIO) -> Any:
    writer = csv.writer(out)
    writer.writerow(sql.EXPORT_COLUMNS)
    return writer.writerow


def _jsonl(out: TextIO) -> Any:
    def write(values: list[str | None]) -> None:
        out.write(json.dumps(dict(zip(sql.EXPORT_COLUMNS, values, strict=True))) + "\n")

    return write


def _text(value: object) -> str | None:
    if isinstance(value, datetime):
        return value.isoformat()
    return None if value is None else str(value)
