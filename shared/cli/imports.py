"""``keydispenser import``: take over what another generator issued (docs/operations.md,
"Moving from OpenG2P's or MOSIP's generator").

Each type is imported in three steps, and a run killed in any of them is resumed by the
next run of the same source (kd_import_runs), never started over: its rows are read, a
chunk at a time, into a staging table of keydispenser's database, each chunk committed
with the cursor just past it (the source's rows in the order of their IDs, or the
file's byte offset); then one transaction records them all: every ID its source holds
is excluded (never handed out), removed from the cold table, and, for a type with a
ledger, the issued ones recorded as issues; a refusal leaves nothing recorded. Then the
type's hot list is swept (exclude.lua): the import epoch is raised first, so that no
keysync batch taken before the import lands after the sweep. Running it again changes
nothing the source did not change.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, TextIO

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
    Run,
    Source,
    SourceRows,
    excluded_among,
    source_table,
)

CHUNK = 50_000  # rows read, checked and copied at a time
PROGRESS_EVERY_S = 1.0
# Past STOCK_FRESH_S, for clocks that run a little apart.
STOCK_MARGIN_S = 0.5
MOSIP_UIN_TABLES = ("kernel.uin", "kernel.uin_assigned")
MOSIP_VID_TABLES = ("kernel.vid", "kernel.vid_assigned")

# A source's rows from just past a cursor (None: from the start), a chunk at a time,
# each with the cursor just past it (JSON: kd_import_runs keeps it).
Rows = Callable[[Any], AsyncIterator[tuple[list[SourceRow], Any]]]


@dataclass(frozen=True)
class Plan:
    """One type's import: where its rows come from and what their statuses mean."""

    type_name: str
    source: str  # openg2p, mosip or file: the ledger and kd_excluded say so
    statuses: dict[str, Meaning]
    rows: Rows
    total: int | None  # rows to read, when known (progress)
    # What is read (a killed run of the same origin is resumed); None: never resumed.
    origin: str | None


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
    spec: SourceRows,
    tables: tuple[str, ...] | list[str],
) -> Plan:
    present = await source.present(tables)
    if not present:
        raise ConfigError(f"--from {source.where}: no table {' or '.join(tables)} there")
    total = await source.count(present)

    def rows(cursor: Any) -> AsyncIterator[tuple[list[SourceRow], Any]]:
        return source.rows(spec, present, CHUNK, cursor)

    origin = f"{source.where} {' '.join(present)}"
    return Plan(type_name, label, statuses, rows, total, origin)


def file_plan(path: str, type_name: str, status: str) -> Plan:
    if status not in FILE:
        raise ConfigError(f"--status: {status!r} is none of {', '.join(FILE)}")
    total = None if path == "-" else _lines(path)
    origin = None if path == "-" else f"{_identity(path)} --status {status}"

    async def rows(cursor: Any) -> AsyncIterator[tuple[list[SourceRow], Any]]:
        try:
            with _opened(path) as stream:
                if cursor:
                    stream.seek(int(cursor["offset"]))
                for chunk in _chunks(stream, status, int(cursor["offset"]) if cursor else 0):
                    yield chunk
        except (OSError, UnicodeDecodeError) as exc:
            raise KeydispenserError(f"import file: cannot read {path}: {exc}") from exc

    return Plan(type_name, "file", FILE, rows, total, origin)


def _lines(path: str) -> int:
    """Lines of a file (progress), or ConfigError naming why it cannot be read."""
    try:
        with open(path, "rb") as counted:
            return sum(block.count(b"\n") for block in iter(lambda: counted.read(1 << 20), b""))
    except OSError as exc:
        raise ConfigError(f"import file: cannot read {path}: {exc.strerror or exc}") from exc


def _identity(path: str) -> str:
    """The file as a killed run saw it: path, size and time of its last change (another
    file, or this one changed, is read from the start)."""
    found = os.stat(path)
    return f"{os.path.realpath(path)} {found.st_size} {found.st_mtime_ns}"


@contextmanager
def _opened(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as stream:
        yield stream


def _chunks(stream: BinaryIO, status: str, offset: int) -> Iterator[tuple[list[SourceRow], Any]]:
    """The file's rows from ``offset``, a chunk at a time, each with the offset past it."""
    chunk: list[SourceRow] = []
    for line in stream:
        offset += len(line)
        row = file_row(line.decode("utf-8"), status)
        if row is not None:
            chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk, {"offset": offset}
            chunk = []
    if chunk:
        yield chunk, {"offset": offset}


async def import_type(
    settings: Settings, id_type: IdType, plan: Plan, client: str | None, dry_run: bool
) -> dict[str, Any]:
    """One type: its rows read and staged (where a killed run stopped, when one did),
    recorded, its hot list swept, its run ended. A dry run does all but the sweep in a
    transaction it rolls back (a killed run it went on from is left as it was)."""
    check_files(settings.postgres_dsn)
    conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))
    try:
        await schema.check(conn, {id_type.name: id_type})
        target = ImportTarget(conn, id_type.name, plan.source)
        if dry_run:
            transaction = conn.transaction()
            await transaction.start()
            try:
                done = await _recorded(target, id_type, plan, client or plan.source)
            finally:
                await transaction.rollback()
            return _report(id_type.name, plan, done, None, dry_run)
        done = await _recorded(target, id_type, plan, client or plan.source)
        swept = await sweep(settings, id_type.name, done.recorded.epoch)
        await target.end()
    finally:
        await conn.close()
    return _report(id_type.name, plan, done, swept, dry_run)


@dataclass(frozen=True)
class Done:
    """A type's rows read and recorded; where a killed run had stopped, if one had."""

    intake: Intake
    recorded: Recorded
    resumed: dict[str, Any] | None


def _with_type(origin: str | None, id_type: IdType) -> str | None:
    """``origin`` and the type's settings as the rows were checked against them: a run
    killed before the type's settings changed (its filters, say) is started over, not
    resumed with rows staged under the old ones."""
    if origin is None:
        return None
    settings = id_type.config.model_dump_json(exclude={"hot", "cold"})
    return f"{origin} type:{hashlib.sha256(settings.encode()).hexdigest()[:16]}"


async def _recorded(target: ImportTarget, id_type: IdType, plan: Plan, client: str) -> Done:
    """Read and stage what is left of the source's rows (all of them, unless a killed
    run of the same origin staged some), then record them; a refusal ends the run."""
    intake = Intake(id_type, plan.statuses)
    run = await target.resume(_with_type(plan.origin, id_type), intake.counts())
    if run.resumed:
        intake = Intake.resumed(id_type, plan.statuses, run.tally)
    resumed = _resuming(id_type.name, run, intake)
    if run.recorded is not None:
        return Done(intake, run.recorded, resumed)
    progress = Progress(id_type.name, plan.total, first=intake.rows)
    try:
        async for rows, cursor in plan.rows(run.cursor):
            await target.stage(intake.take(rows), cursor, intake.counts())
            progress.show(intake.rows)
    finally:
        progress.done()
    refusal = intake.refusal()
    if refusal is not None:
        await target.end()
        raise KeydispenserError(f"{plan.source} into '{id_type.name}': {refusal}")
    return Done(intake, await target.record(id_type, client), resumed)


def _resuming(name: str, run: Run, intake: Intake) -> dict[str, Any] | None:
    """Where a killed run had stopped (said on standard error too), if one had."""
    if not run.resumed:
        return None
    step = "reading" if run.recorded is None else "sweeping"
    sys.stderr.write(f"import {name}: resuming a killed run at row {intake.rows:,} ({step})\n")
    return {"at_row": intake.rows, "step": step}


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
    name: str, plan: Plan, done: Done, swept: Swept | None, dry_run: bool
) -> dict[str, Any]:
    return {
        "id_type": name,
        "source": plan.source,
        "dry_run": dry_run,
        "resumed": done.resumed,
        "rows_read": done.intake.rows,
        "invalid": done.intake.invalid,
        "invalid_examples": done.intake.invalid_examples,
        **asdict(done.recorded),
        **(asdict(swept) if swept is not None else {"hot_removed": None}),
    }


class Progress:
    """Plain progress lines on standard error, only when it is a terminal."""

    def __init__(
        self, name: str, total: int | None, stream: TextIO = sys.stderr, first: int = 0
    ) -> None:
        self._name, self._total, self._stream = name, total, stream
        self._on = stream.isatty()
        self._start = self._last = time.monotonic()
        self._rows = self._first = first  # rows a killed run had read (not this one's rate)

    def show(self, rows: int) -> None:
        self._rows = rows
        now = time.monotonic()
        if self._on and now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self._stream.write(self.line(now) + "\n")

    def line(self, now: float) -> str:
        elapsed = max(now - self._start, 1e-9)
        rate = (self._rows - self._first) / elapsed
        text = f"import {self._name}: {self._rows:,} rows"
        if self._total:
            text += f" of {self._total:,}"
        text += f", {rate:,.0f} rows/s"
        if self._total and rate > 0:
            text += f", {max(self._total - self._rows, 0) / rate:,.0f} s left"
        return text

    def done(self) -> None:
        if self._on and self._rows > self._first:
            self._stream.write(self.line(time.monotonic()) + ", done\n")
