"""``keydispenser import``: take over what another generator issued (docs/operations.md,
"Moving from OpenG2P's or MOSIP's generator").

Each type is imported in one transaction of keydispenser's database: every ID its
source holds is excluded (never handed out), removed from the cold table, and, for a
type with a ledger, the issued ones recorded as issues; nothing is left half done by a
failure (it rolls back; run it again). Then the type's hot list is swept (exclude.lua):
the import epoch is raised first, so that no keysync batch taken before the import
lands after the sweep. Running it again changes nothing the source did not change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import asyncpg

from shared.domain.config import Settings
from shared.domain.errors import ConfigError, KeydispenserError
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.imports import (
    FILE,
    MOSIP_UIN,
    MOSIP_VID,
    OPENG2P,
    STOCK_FRESH_S,
    Intake,
    Meaning,
    SourceRow,
    file_row,
)
from shared.stores.groups import Groups
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import schema
from shared.stores.postgres.connect import check_files, driver_options
from shared.stores.postgres.imports import (
    MOSIP_UIN_ROWS,
    MOSIP_VID_ROWS,
    OPENG2P_ROWS,
    ImportTarget,
    Recorded,
    Source,
    excluded_among,
    source_table,
)

CHUNK = 50_000  # rows read, checked and copied at a time
PROGRESS_EVERY_S = 1.0
# Past STOCK_FRESH_S, for clocks that run a little apart.
STOCK_MARGIN_S = 0.5
MOSIP_UIN_TABLES = ("kernel.uin", "kernel.uin_assigned")
MOSIP_VID_TABLES = ("kernel.vid", "kernel.vid_assigned")

Rows = Callable[[], AsyncIterator[list[SourceRow]]]


@dataclass(frozen=True)
class Plan:
    """One type's import: where its rows come from and what their statuses mean."""

    type_name: str
    source: str  # openg2p, mosip or file: the ledger and kd_excluded say so
    statuses: dict[str, Meaning]
    rows: Rows
    total: int | None  # rows to read, when known (progress)


def run(settings: Settings, args: argparse.Namespace) -> None:
    """The command: one report (JSON) per type imported."""
    types = build_id_types(settings)
    reports = asyncio.run(_run(settings, types, args))
    print(json.dumps(reports, indent=2, default=str))
    short = [
        r["id_type"] for r in reports if r.get("replicas_acknowledged", 0) < r.get("replicas", 0)
    ]
    if short:
        raise KeydispenserError(
            f"imported, but not every Redis replica acknowledged the sweep of {', '.join(short)}"
            " (a replica promoted now could take a superseded batch): run the import again "
            "once the replicas are back"
        )


async def _run(
    settings: Settings, types: dict[str, IdType], args: argparse.Namespace
) -> list[dict[str, Any]]:
    source: Source | None = None
    if args.source != "file":
        source = await Source.connect(args.dsn)
    try:
        plans = await _plans(args, source, types)
        return [
            await import_type(settings, types[plan.type_name], plan, args.client, args.dry_run)
            for plan in plans
        ]
    finally:
        if source is not None:
            await source.close()


async def _plans(
    args: argparse.Namespace, source: Source | None, types: dict[str, IdType]
) -> list[Plan]:
    if args.source == "file":
        return [file_plan(args.path, _type(types, args.type_name), args.status)]
    assert source is not None
    if args.source == "openg2p":
        table = args.table or f"id_pool_{args.type_name}"
        source_table(table)  # a name, before it is looked for
        name = _type(types, args.type_name)
        return [await _table_plan(source, "openg2p", name, OPENG2P, OPENG2P_ROWS, [table])]
    if not (args.uin_type or args.vid_type):
        raise ConfigError("import mosip: name --uin-type, --vid-type or both")
    plans = []
    for type_name, statuses, rows, tables in (
        (args.uin_type, MOSIP_UIN, MOSIP_UIN_ROWS, MOSIP_UIN_TABLES),
        (args.vid_type, MOSIP_VID, MOSIP_VID_ROWS, MOSIP_VID_TABLES),
    ):
        if type_name:
            name = _type(types, type_name)
            plans.append(await _table_plan(source, "mosip", name, statuses, rows, tables))
    return plans


def _type(types: dict[str, IdType], name: str) -> str:
    if name not in types:
        known = ", ".join(sorted(types)) or "none"
        raise ConfigError(f"--type: no pooled ID type '{name}' is configured (configured: {known})")
    return name


async def _table_plan(
    source: Source,
    label: str,
    type_name: str,
    statuses: dict[str, Meaning],
    statement: str,
    tables: tuple[str, ...] | list[str],
) -> Plan:
    present = await source.present(tables)
    if not present:
        raise ConfigError(f"--from {source.where}: no table {' or '.join(tables)} there")
    total = await source.count(present)
    return Plan(type_name, label, statuses, lambda: source.rows(statement, present, CHUNK), total)


def file_plan(path: str, type_name: str, status: str) -> Plan:
    if status not in FILE:
        raise ConfigError(f"--status: {status!r} is none of {', '.join(FILE)}")
    total = None if path == "-" else _lines(path)

    async def rows() -> AsyncIterator[list[SourceRow]]:
        try:
            with _opened(path) as stream:
                for chunk in _chunks(stream, status):
                    yield chunk
        except (OSError, UnicodeDecodeError) as exc:
            raise KeydispenserError(f"import file: cannot read {path}: {exc}") from exc

    return Plan(type_name, "file", FILE, rows, total)


def _lines(path: str) -> int:
    """Lines of a file (progress), or ConfigError naming why it cannot be read."""
    try:
        with open(path, "rb") as counted:
            return sum(block.count(b"\n") for block in iter(lambda: counted.read(1 << 20), b""))
    except OSError as exc:
        raise ConfigError(f"import file: cannot read {path}: {exc.strerror or exc}") from exc


@contextmanager
def _opened(path: str) -> Iterator[TextIO]:
    if path == "-":
        yield sys.stdin
        return
    with open(path, encoding="utf-8") as stream:
        yield stream


def _chunks(stream: TextIO, status: str) -> Iterator[list[SourceRow]]:
    chunk: list[SourceRow] = []
    for line in stream:
        row = file_row(line, status)
        if row is not None:
            chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def import_type(
    settings: Settings, id_type: IdType, plan: Plan, client: str | None, dry_run: bool
) -> dict[str, Any]:
    """One type: its transaction (rolled back for a dry run or a refusal), then its hot
    list swept."""
    check_files(settings.postgres_dsn)
    conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))
    intake = Intake(id_type, plan.statuses)
    progress = Progress(id_type.name, plan.total)
    try:
        await schema.check(conn, {id_type.name: id_type})
        transaction = conn.transaction()
        await transaction.start()
        try:
            recorded = await _record(conn, intake, plan, client or plan.source, progress)
        except BaseException:
            await transaction.rollback()
            raise
        await (transaction.rollback() if dry_run else transaction.commit())
    finally:
        progress.done()
        await conn.close()
    swept = None if dry_run else await sweep(settings, id_type.name, recorded.epoch)
    return _report(id_type.name, plan, intake, recorded, swept, dry_run)


async def _record(
    conn: asyncpg.Connection, intake: Intake, plan: Plan, client: str, progress: Progress
) -> Recorded:
    target = ImportTarget(conn)
    async for rows in plan.rows():
        await target.stage(intake.take(rows))
        progress.show(intake.rows)
    refusal = intake.refusal()
    if refusal is not None:
        raise KeydispenserError(f"{plan.source} into '{intake.id_type.name}': {refusal}")
    return await target.record(intake.id_type, plan.source, client)


@dataclass(frozen=True)
class Swept:
    """The hot list's sweep: keys removed, and the replicas that hold it, of how many."""

    hot_removed: int
    replicas: int
    replicas_acknowledged: int


async def sweep(settings: Settings, name: str, epoch: int) -> Swept:
    """Raise the type's import epoch in Redis, then remove every excluded key its hot
    list holds, then move the stock epoch on and, when a dispenser held a stock lately,
    wait until every stock was read again (``STOCK_FRESH_S``), and for the replicas to
    hold all of it (a promoted replica lacking the epoch would take a batch the import
    superseded)."""
    groups = Groups(settings)
    conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))
    try:
        hot = HotStore(*groups.place(name))
        removed = await hot.exclude(name, epoch)
        async for keys in hot.listed(name):
            found = await excluded_among(conn, name, keys)
            if found:
                removed += await hot.exclude(name, epoch, found)
        bumped = await hot.bump_stock(name)
        if bumped.held:  # a dispenser held a stock lately: it reads the epoch again
            await asyncio.sleep(STOCK_FRESH_S + STOCK_MARGIN_S)
        return Swept(removed, bumped.replicas, bumped.acknowledged)
    finally:
        await conn.close()
        await groups.close()


def _report(
    name: str, plan: Plan, intake: Intake, recorded: Recorded, swept: Swept | None, dry_run: bool
) -> dict[str, Any]:
    return {
        "id_type": name,
        "source": plan.source,
        "dry_run": dry_run,
        "rows_read": intake.rows,
        "invalid": intake.invalid,
        "invalid_examples": intake.invalid_examples,
        **asdict(recorded),
        **(asdict(swept) if swept is not None else {"hot_removed": None}),
    }


class Progress:
    """Plain progress lines on standard error, only when it is a terminal."""

    def __init__(self, name: str, total: int | None, stream: TextIO = sys.stderr) -> None:
        self._name, self._total, self._stream = name, total, stream
        self._on = stream.isatty()
        self._start = self._last = time.monotonic()
        self._rows = 0

    def show(self, rows: int) -> None:
        self._rows = rows
        now = time.monotonic()
        if self._on and now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self._stream.write(self.line(now) + "\n")

    def line(self, now: float) -> str:
        elapsed = max(now - self._start, 1e-9)
        rate = self._rows / elapsed
        text = f"import {self._name}: {self._rows:,} rows"
        if self._total:
            text += f" of {self._total:,}"
        text += f", {rate:,.0f} rows/s"
        if self._total and rate > 0:
            text += f", {max(self._total - self._rows, 0) / rate:,.0f} s left"
        return text

    def done(self) -> None:
        if self._on and self._rows:
            self._stream.write(self.line(time.monotonic()) + ", done\n")
