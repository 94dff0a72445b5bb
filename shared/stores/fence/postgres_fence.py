"""The PostgreSQL fence: a promoted asynchronous replica may lack the last commits, and
an old primary may stay up and reachable by some processes after another was promoted.

Every range lease and keysync batch runs behind a guard (``fence_sql.GUARD``) that advances
a sync clock in the same statement and refuses to run on a server whose history does
not cover the clock's record in Redis (``sync_record.py``). When the guard refuses, a
stamp proved lost commits, or Redis lost the record, ``settle`` runs under the clock
row's lock (every other fencer and guarded statement on that server waits), reads the
record under that lock, and does what the verdict says:

- ``vouch``: Redis lost the record, and this server has not forked since its last
  guarded write: the record is rebuilt from it (its stamp, the highest counter its
  history leased per type);
- ``behind``/``stamp``: this server lost commits: discard the cold inventory of every
  type (counted, never reissued), move every sequence past the highest counter ever
  leased, leave the ledger of each key group whose record names a ledger link this
  server lacks to be restored (``ledger_restore``: keysync restores those links from
  the ledger log before the ledger does anything else), and claim the record for this
  server (a new history) before committing; the claim is refused when a lease or a
  ledger link was recorded since the record was read (read again);
- ``adopt``: a promoted server whose history covers the record takes up its new
  timeline before the ledger writes on it (a guarded write of its own; refused when any
  stamp was recorded since the record was read);
- ``superseded``: the record follows a newer timeline: this server must not write
  (``PostgresSuperseded``: fail closed, never fence back);
- ``foreign``: the namespace is bound to another database (``NamespaceBound``);
- ``halt``: Redis lost the record and this server forked since its last guarded write:
  nothing can prove what was lost; an operator fences (``fence-postgres``).

Keys already in Redis are not touched. docs/reliability.md explains the design.

With several key groups (a Redis Cluster with ``slot_per: type``) each group has its
own record, and a type's statements are judged against its group's. PostgreSQL is one
history, so ``settle`` judges this server against every record and does what the worst
verdict says: a fence claims every record (one that is not claimed would take the new
history for another and fence again), and a fence needed while a record must be
vouched for halts (that group's lost leases may be above anything it can name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import asyncpg

from shared.domain.errors import (
    FenceHalted,
    NamespaceBound,
    PostgresBehind,
    PostgresSuperseded,
    StoreUnavailable,
)
from shared.domain.idtypes import IdType
from shared.domain.tiers import FenceReport, Stamp
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.fence.verdict import ClockRow, combined, verdict
from shared.stores.groups import SyncRecords, records_of
from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import DRIVER_ERRORS, ColdStore, one_row, translated
from shared.stores.postgres.connect import any_server, dsn_hosts

log = logging.getLogger(__name__)
# How often a fence reads the record again when its claim found a lease recorded since.
CLAIM_ATTEMPTS = 5
HALT_REASON = "redis and postgres both lost state; postgres forked since its last guarded write"
SPLIT_HALT_REASON = (
    "redis lost state while two postgres primaries take writes (a split brain): no record "
    "can be rebuilt from either; demote the old one, then fence"
)


class _Moved(Exception):
    """The fence's claim found the record moved since it read it: roll back."""


async def settle(
    cold: ColdStore,
    sync: SyncRecord | SyncRecords,
    id_types: dict[str, IdType] | None = None,
    *,
    skip_ranges: int | None = None,
    take_over: bool = False,
    adopt: bool = False,
) -> FenceReport | None:
    """Bring the record and this server into agreement (module docstring); the
    report of the fence when one ran (None otherwise).

    ``skip_ranges`` is the operator's command after a halt: fence unconditionally and
    move every sequence that many extra ranges on; with ``take_over`` the operator also
    asserts that this database is the one from now on, whatever timeline or database
    the record follows (a restore onto an older timeline, a dump moved to a new
    cluster). The fence covers every type the database holds (``id_types`` is kept for
    callers; the database says which types there are). With ``adopt`` (a ledger
    transaction refused on a new timeline) a server whose history covers every record
    takes its timeline up.
    """
    records = records_of(sync)
    for _ in range(CLAIM_ATTEMPTS):
        try:
            return await _settle_once(cold, records, skip_ranges, take_over, adopt)
        except _Moved:
            log.info("postgres_fence_reread", extra={"reason": "the record changed meanwhile"})
    raise PostgresBehind(f"the record kept moving during {CLAIM_ATTEMPTS} fence attempts")


# How long a fence's transaction may wait for the clock row's lock, or sit idle holding
# it (fence_sql.LIMIT_FENCE): every lease and take on the server waits for it.
FENCE_LIMIT_MS = 10_000


async def _settle_once(
    cold: ColdStore, records: SyncRecords, skip_ranges: int | None, take_over: bool, adopt: bool
) -> FenceReport | None:
    operator = skip_ranges is not None
    report, vouched, halt, claimed = None, None, "", None
    async with cold.connection() as conn, translated("postgres_fence"), conn.transaction():
        await conn.execute(fence_sql.LIMIT_FENCE, str(FENCE_LIMIT_MS))
        row = ClockRow.of(
            one_row(await conn.fetchrow(fence_sql.LOCK_SYNC_CLOCK), "lock_sync_clock")
        )
        # Every record that judges a type the database holds (with a record per type,
        # also those of types this process is not configured with).
        held = [str(r["name"]) for r in await conn.fetch(fence_sql.SELECT_FENCED_TYPES)]
        judged = records.covering(held)
        # Under the lock it fences under; every shard asked at once (the lock holds
        # every type's takes and leases meanwhile).
        read = dict(zip(judged, await asyncio.gather(*(s.read() for s in judged)), strict=True))
        for record in read.values():
            if record.halted and not operator:
                raise FenceHalted(record.halt_reason or "halted")
        found = {sync: _verdict_of(row, record, operator) for sync, record in read.items()}
        for sync, each in found.items():
            _refuse(each, row, read[sync], sync.namespace)
        worst = combined(list(found.values()), list(read.values()))
        if worst == "ok" and _takes_up(row, list(read.values()), records.several, adopt):
            worst = "adopt"  # a new timeline that covers every record: taken up here
        if worst == "vouch" and await _another_primary(conn, cold.dsn, cold.connect_timeout_s):
            halt = SPLIT_HALT_REASON
        elif worst == "vouch":
            vouched = await _vouch_stamp(conn)
        elif worst == "halt":
            halt = HALT_REASON
        elif worst == "adopt":
            adopted = await _adopt(conn, read, row, records.several)
            claimed = adopted if records.several else None
        elif worst != "ok":
            mode = "take_over" if take_over else ("operator" if operator else "automatic")
            pending = records.several
            report = await _fence(conn, read, row, worst, skip_ranges or 0, mode, pending)
            claimed = report.stamp if pending else None
    if vouched is not None:  # committed first: PostgreSQL ahead of the record is harmless
        for sync, each in found.items():
            if each == "vouch":
                await _record_vouch(sync, row, *vouched, epoch=read[sync].fenced_at)
    if halt:
        await _halt(judged, halt)
    # Committed: the claims this settle made, or found made by a fence that committed,
    # are no longer pending (a record left pending is confirmed by the next settle).
    for sync, record in read.items():
        expected = claimed.fences if claimed is not None else record.claim_fences
        if (claimed is not None or found[sync] == "confirm") and expected:
            with contextlib.suppress(StoreUnavailable):
                await sync.clear_claim(expected)
    if report is not None:
        log.warning("postgres_fenced", extra=_fields(report))
    return report


def _takes_up(row: ClockRow, records: list[Record], several: bool, asked: bool) -> bool:
    """Whether a server whose history covers every record takes its new timeline up:
    with several records at its first write there (the guard lets no single group's
    statement do it), and when a ledger transaction asked (it waits for the record to
    follow this timeline)."""
    if several and row.timeline not in (0, row.here):
        return True
    return asked and any(record.timeline != row.here for record in records)


def _verdict_of(row: ClockRow, record: Record, operator: bool) -> str:
    if operator:
        return "operator"
    if record.claim_fences and not record.needs_vouch:
        # Claimed by a fence (or a new timeline's take-up) of several records: it holds
        # only if that transaction committed, i.e. this server is on the claimed history
        # with at least the fence count the claim expected; else as lost commits.
        on_claim = row.timeline == record.timeline == row.here and row.fork == record.fork
        return "confirm" if on_claim and row.fences >= record.claim_fences else "behind"
    found = verdict(row, record)
    return "stamp" if found == "ok" and record.fence_needed else found  # a stamp proved a
    # commit this server lacks


def _refuse(found: str, row: ClockRow, record: Record, namespace: str) -> None:
    """Raise what a verdict (or a claim's answer) of 'foreign' or 'superseded' means."""
    if found == "foreign":
        raise NamespaceBound.elsewhere(namespace, record.database, row.database)
    if found == "superseded":
        log.critical(
            "postgres_superseded",
            extra={"server_timeline": row.here, "record_timeline": record.timeline},
        )
        raise PostgresSuperseded(
            f"this server is on timeline {row.here}, the record follows a newer one"
        )


async def _another_primary(conn: Any, dsn: str | None, timeout_s: float) -> bool:
    """Whether another host of a multi-host DSN is a writable primary too (a split
    brain): then no record can be rebuilt from this one, which may be the old one."""
    hosts = dsn_hosts(dsn or "")
    if len(hosts) < 2 or dsn is None:
        return False
    here = await conn.fetchval(fence_sql.SELECT_SERVER_STARTED)
    for host, port in hosts:
        with contextlib.suppress(*DRIVER_ERRORS):
            other = await asyncpg.connect(any_server(dsn), host=host, port=port, timeout=timeout_s)
            try:
                found = await other.fetchrow(fence_sql.SELECT_IS_PRIMARY)
            finally:
                await other.close()
            if found is not None and found["primary"] and found["started"] != here:
                log.critical("postgres_two_primaries", extra={"host": host, "port": port})
                return True
    return False


async def _vouch_stamp(conn: Any) -> tuple[Stamp, dict[str, int], dict[str, str]]:
    """Under the lock: this server's stamp, the highest counter its history leased per
    type, and the ledger restores it holds pending per lane; recorded in Redis once the
    transaction committed."""
    found = one_row(await conn.fetchrow(fence_sql.VOUCH), "vouch")
    highs = {
        r["id_type"]: int(r["highest"]) for r in await conn.fetch(fence_sql.SELECT_LEASED_HIGHS)
    }
    return Stamp.of(found), highs, json.loads(found["restore_to"] or "{}")


async def _record_vouch(
    sync: SyncRecord,
    row: ClockRow,
    stamp: Stamp,
    highs: dict[str, int],
    restore_to: dict[str, str],
    *,
    epoch: str,
) -> None:
    """Rebuild the record from this server (lua/vouch_record.lua), if Redis has not lost
    state again since the record was read as of ``epoch`` (else settle again)."""
    status = await sync.vouch(stamp, highs, restore_to.get(sync.namespace, ""), epoch)
    if status in ("ok", "trusted"):
        log.info("postgres_vouched", extra={"status": status, "clock": stamp.clock})
        return
    if status == "stale":
        log.warning("postgres_vouch_stale", extra={"clock": stamp.clock})
        raise _Moved()
    _refuse(status, row, await sync.read(), sync.namespace)
    raise FenceHalted(HALT_REASON)  # 'halted': another process found it so meanwhile


async def _adopt(conn: Any, read: dict[SyncRecord, Record], row: ClockRow, several: bool) -> Stamp:
    """Take up this server's new timeline (every record is covered by its history):
    a guarded write of its own starts the new history, and every record is claimed for
    it (with a record per type, pending until the commit: the guard lets no statement do
    this, it would be judged against one record only). A claim is refused when any stamp
    was recorded since the record was read: the old primary's late commit, which this
    server may lack (read again: then it fences)."""
    stamp = Stamp.of(one_row(await conn.fetchrow(fence_sql.VOUCH), "adopt_timeline"))
    for sync, record in read.items():
        status = await sync.reset(stamp, record.leased, "adopt", pending=several, read=record)
        if status == "moved":
            raise _Moved()
        _refuse(status, row, await sync.read(), sync.namespace)
    log.info("postgres_timeline_adopted", extra={"timeline": stamp.timeline, "fork": stamp.fork})
    return stamp


async def _halt(records: list[SyncRecord], reason: str) -> None:
    """Halt every record that can be reached (one on a shard that is down stays as
    it is: nothing of its types runs meanwhile), then refuse."""
    for sync in records:
        with contextlib.suppress(StoreUnavailable):
            await sync.halt(reason)
    log.critical("postgres_fence_halted", extra={"reason": reason})
    raise FenceHalted(reason)


def _fields(report: FenceReport) -> dict[str, object]:
    return {
        "reason": report.reason,
        "keys_discarded": report.total_discarded,
        "releases_settled": report.releases_settled,
        "restore_to": report.restore_to,
        "next_starts": report.next_starts,
        "clock": report.stamp.clock,
    }


async def _fence(
    conn: Any,
    read: dict[SyncRecord, Record],
    row: ClockRow,
    reason: str,
    skip_ranges: int,
    mode: str,
    pending: bool = False,
) -> FenceReport:
    """Discard, move the sequences of every type the database holds past the highest
    counter any record holds, reset the clock past every record's, then claim every
    record (still under the lock: the claims land before the commit, or the fence rolls
    back; a record claimed for a fence that rolled back names a history this server
    does not have, and the next statement judged against it fences again)."""
    floors: dict[str, int] = {}
    for record in read.values():
        for name, leased in record.leased.items():
            floors[name] = max(floors.get(name, 0), leased)
    record_clock = max(record.clock for record in read.values())
    discarded: dict[str, int] = {}
    starts: dict[str, int] = {}
    for held in await conn.fetch(fence_sql.SELECT_FENCED_TYPES):
        name = str(held["name"])
        if held["has_cold"]:
            discarded[name] = await _discard_cold(conn, name)
        starts[name] = await _advance_sequence(conn, held, floors.get(name, 0), skip_ranges)
    # An operator's fence follows a halt (Redis lost the record, so the ledger log may be
    # gone too): no release not requeued yet is ever requeued. An automatic one restores
    # the ledger's lost links exactly, requeues among them.
    settled = await _settle_releases(conn) if mode != "automatic" else {}
    restore_to = {
        sync.namespace: await _restore_target(conn, row, sync, rec) for sync, rec in read.items()
    }
    restore_to = {lane: link for lane, link in restore_to.items() if link}
    stamp_row = one_row(
        await conn.fetchrow(fence_sql.RESET_SYNC_CLOCK, row.here, max(row.clock, record_clock)),
        "reset_sync_clock",
    )
    stamp = Stamp.of(stamp_row)
    detail = {"next_starts": starts, "record_clock": record_clock, "server_clock": row.clock}
    await conn.execute(
        fence_sql.INSERT_FENCE_EVENT, reason, sum(discarded.values()), json.dumps(detail)
    )
    for sync, record in read.items():
        target = restore_to.get(sync.namespace, "")
        claimed = await sync.reset(stamp, record.leased, mode, pending, record, target)
        if claimed == "moved":
            raise _Moved()
        if claimed != "ok":  # read again only to say why: nothing else runs between a
            # claim and the commit that makes it true (a Redis error there would roll
            # the fence back after its record was claimed)
            _refuse(claimed, row, await sync.read(), sync.namespace)
    return FenceReport(reason, discarded, starts, stamp, settled, restore_to)


async def _restore_target(conn: Any, row: ClockRow, sync: SyncRecord, record: Record) -> str:
    """The ledger link this server must be restored up to for ``sync``'s lane, marked
    pending in this (the fence's) transaction; "" when it holds that link already.

    The target is the newest history anyone may have been answered from, as the record
    says it: the restore it has pending (one no server has done yet: a second promotion
    before it ran; by then the record's head is the first fenced server's own, older
    than what that fence found missing), else its head. A restore this server has
    pending from an earlier fence is replaced: the record has moved past it since (that
    restore was done on a server this one never saw, and more was answered there).
    docs/reliability.md, "The ledger's one history"."""
    lane = sync.namespace
    target = record.restore_to or record.head
    if not target or await conn.fetchval(ledger_sql.HOLDS_LINK, target):
        return ""
    if row.restore_to.get(lane) != target:
        await conn.execute(ledger_sql.MARK_RESTORE, lane, target)
    return target


async def _settle_releases(conn: Any) -> dict[str, int]:
    """Every released key not requeued yet, per type: the history this server lost may
    have requeued and issued it already, so it never goes back (counted)."""
    rows = await conn.fetch(ledger_sql.SETTLE_RELEASES)
    return {str(r["id_type"]): int(r["releases"]) for r in rows}


async def _discard_cold(conn: Any, name: str) -> int:
    """Every cold key of a type: may have been dispensed already (never reissued).

    DELETE, not TRUNCATE: guarded statements queued on the clock row already hold the
    cold table's row lock, and TRUNCATE's exclusive lock would deadlock with them.
    """
    return int(await conn.fetchval(sql.for_type(fence_sql.DISCARD_COLD, name)))


async def _advance_sequence(conn: Any, held: Any, floor: int, skip_ranges: int) -> int:
    """Move a type's sequence so the next lease starts at or after ``floor`` (plus any
    ranges the operator skips); forward only. Returns the next lease's start. ``held``:
    the type's row of SELECT_FENCED_TYPES (range size and its site's share of the domain
    from its sequence)."""
    size, bottom, top = int(held["increment_by"]), int(held["min_value"]), int(held["max_value"])
    last = held["last_value"]
    next_start = int(last) + size if last is not None else bottom
    target = max(floor, next_start) + skip_ranges * size
    if target > next_start:
        value = max(min(target - size, top), bottom)
        await conn.execute(sql.for_type(fence_sql.SET_SEQUENCE, str(held["name"])), value)
        return value + size
    return next_start
