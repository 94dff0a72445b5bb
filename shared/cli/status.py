"""``keydispenser status``: inventory and keyspace headroom per type."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.domain.config import Settings
from shared.domain.errors import ledger_halt_message
from shared.domain.idtypes import build_id_types
from shared.domain.snowflake import build_snowflake_types
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.binding import bind
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import Record
from shared.stores.fence.verdict import ClockRow, combined, verdict
from shared.stores.groups import Groups, HotRouter, SyncRecords
from shared.stores.ledger import sql as ledger_sql
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore

_STATUS_CAP = 10_000_000


async def collect_status(settings: Settings) -> dict[str, Any]:
    """{"id_types": {name: inventory and headroom}, "postgres_fence": its state}."""
    cold = await ColdStore.for_settings(settings)
    groups = Groups(settings)
    hot = HotRouter.open(groups)
    sync = SyncRecords.open(groups)
    report: dict[str, Any] = {}
    try:
        for name, id_type in build_id_types(settings, generating=False).items():
            state = await cold.sequence_state(id_type)
            ranges = await cold.range_stats(name)
            rate = ranges["accepted"] / ranges["candidates"] if ranges["candidates"] else None
            report[name] = {
                "hot_depth": await hot.depth(name),
                "cold_depth": await cold.depth(name, _STATUS_CAP),
                "ranges_leased": ranges["leased"],
                "ranges_filled": ranges["filled"],
                # This stack's share of the counters, [start, stop): the whole domain
                # without a site; headroom and the forecast count the share.
                "site": None if id_type.config.site is None else id_type.config.site.model_dump(),
                "counter_range": [id_type.config.counter_start, id_type.config.counter_stop],
                "counters_leased": state.leased_counters,
                "counters_excluded_ahead": state.excluded_ahead,
                "counters_headroom": state.headroom,
                "headroom_fraction": state.headroom / state.domain,
                "acceptance_rate": rate,
                "estimated_keys_left": None if rate is None else int(state.headroom * rate),
            }
        fence = await postgres_fence_state(cold, sync)
        async with cold.connection() as conn:
            quarantined = await conn.fetch(ledger_sql.COUNT_QUARANTINED)
    finally:
        await cold.close()
        await groups.close()
    return {
        "id_types": report,
        "snowflake_types": snowflake_status(settings),
        "postgres_fence": fence,
        # Keys an accepted ledger loss quarantined, per type (never given back nor issued).
        "ledger_quarantined": {r["id_type"]: int(r["keys"]) for r in quarantined},
    }


def snowflake_status(settings: Settings) -> dict[str, Any]:
    """Snowflake types keep no inventory: their layout and machine-ID pool."""
    report: dict[str, Any] = {}
    for name, id_type in build_snowflake_types(settings).items():
        lo, hi = id_type.machine_range
        report[name] = {
            "text": id_type.config.text,
            "bits": id_type.config.bits.model_dump(),
            "pool": id_type.pool,
            "machine_ids": [lo, hi],
        }
    return report


STATUS_COLUMNS = (
    "hot_depth",
    "cold_depth",
    "ranges_leased",
    "ranges_filled",
    "counters_headroom",
    "headroom_%",
    "acceptance_rate",
    "estimated_keys_left",
)


def format_status(report: dict[str, Any]) -> str:
    """Every column the JSON has per type (README, Commands), one row per type."""
    lines = ["id_type".ljust(16) + "".join(c.rjust(20) for c in STATUS_COLUMNS)]
    for name, row in report["id_types"].items():
        cells = [_cell(row, column) for column in STATUS_COLUMNS]
        lines.append(name.ljust(16) + "".join(cell.rjust(20) for cell in cells))
    for name, row in report["id_types"].items():
        if row.get("site") is not None:
            lo, hi = row["counter_range"]
            site = row["site"]
            lines.append(
                f"{name.ljust(16)}site {site['index']} of {site['of']}: counters "
                f"[{lo}, {hi}); headroom counts this share"
            )
    for name, row in report.get("snowflake_types", {}).items():
        lo, hi = row["machine_ids"]
        lines.append(
            f"{name.ljust(16)}snowflake ({row['text']}): no inventory; "
            f"machine IDs {lo}..{hi} of pool {row['pool']}"
        )
    lines.append(_fence_line(report["postgres_fence"]))
    lines.extend(_ledger_lines(report["postgres_fence"]))
    for name, count in report.get("ledger_quarantined", {}).items():
        lines.append(
            f"{name.ljust(16)}ledger: {count} keys quarantined (an accepted loss: never "
            "given back nor issued again; kd_quarantined_keys)"
        )
    return "\n".join(lines)


def _ledger_lines(fence: dict[str, Any]) -> list[str]:
    """The ledger's state per key group, when it is anything but ok."""
    lines = []
    for lane, state in fence.get("ledger", {}).items():
        if state["halted"]:
            lines.append(f"ledger ({lane}): HALTED: {ledger_halt_message(state['halted'])}")
        elif state["restoring_to"]:
            lines.append(
                f"ledger ({lane}): restoring what a PostgreSQL promotion lost "
                f"(up to link {state['restoring_to']}): keysync does it at its next turn"
            )
    return lines


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "headroom_%":
        return f"{100 * row['headroom_fraction']:.4f}"
    value = row[column]
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _fence_line(fence: dict[str, Any]) -> str:
    if fence["halted"]:
        state = f"HALTED ({fence['halt_reason']}): run `keydispenser fence-postgres`"
    elif fence["verdict"] == "superseded":
        state = "SUPERSEDED: this PostgreSQL is an old primary; a newer one took over"
    elif fence["verdict"] == "foreign":
        state = f"REFUSED: the namespace is bound to database {fence['record']['database']}"
    elif fence["fence_needed"] or fence["verdict"] == "behind":
        state = "fence pending (lost commits detected)"
    elif _written(fence) and (fence["untrusted"] or fence["verdict"] == "vouch"):
        state = "record to be rebuilt from PostgreSQL (Redis lost it)"
    else:
        state = "ok"
    last = fence["last_fence"]
    seen = "never fenced" if last is None else f"last fence {last['at']} ({last['reason']})"
    return f"postgres fence: {state}; {seen}"


def _written(fence: dict[str, Any]) -> bool:
    """Whether PostgreSQL has taken a guarded write (a lease or a batch) yet."""
    return fence["server"] is not None and fence["server"]["timeline"] != 0


async def fence_postgres(
    settings: Settings, skip_ranges: int, take_over: bool = False
) -> dict[str, Any]:
    """The operator's fence after a halt: unconditional, sequences moved ``skip_ranges``
    ranges past the highest lease on record; ``take_over``: whatever timeline or database
    the record follows (the operator asserts this database is the one from now on)."""
    id_types = build_id_types(settings, generating=False)
    cold = await ColdStore.for_settings(settings)
    groups = Groups(settings)
    sync = SyncRecords.open(groups)  # every key group's record: the fence claims them all
    try:
        # A take-over binds the namespace to this database (the fence's claim does it on
        # the Redis side); otherwise both sides must already agree.
        await bind(cold, None if take_over else sync, settings.redis_namespace)
        report = await settle(cold, sync, id_types, skip_ranges=skip_ranges, take_over=take_over)
    finally:
        await cold.close()
        await groups.close()
    assert report is not None  # an operator's fence always runs
    return {
        "keys_discarded": report.keys_discarded,
        "next_starts": report.next_starts,
        "clock": report.stamp.clock,
    }


async def postgres_fence_state(cold: ColdStore, sync: SyncRecords) -> dict[str, Any]:
    """The fence as status shows it: the record, the server's clock, what the fence
    would make of this server now (``verdict``: ok, vouch, behind, superseded,
    foreign, halt), the last event. With several key groups, ``groups`` has each
    group's record and verdict, and the top level what ``settle`` would do over them
    all (the record shown: the one furthest on)."""
    records = {each.namespace: await each.read() for each in sync}
    async with cold.connection() as conn:
        clock = await conn.fetchrow(fence_sql.LOCK_SYNC_CLOCK.replace("FOR UPDATE", ""))
        event = await conn.fetchrow(fence_sql.SELECT_LAST_FENCE)
    row = None if clock is None else ClockRow.of(clock)
    verdicts = {ns: None if row is None else verdict(row, r) for ns, r in records.items()}
    record = max(records.values(), key=lambda r: (r.timeline, r.clock))
    return {
        "record": _record_fields(record),
        "server": None if row is None else _server_fields(row),
        "verdict": _overall(verdicts, records),
        "untrusted": any(r.untrusted for r in records.values()),
        "fence_needed": any(r.fence_needed for r in records.values()),
        "halted": any(r.halted for r in records.values()),
        "halt_reason": next((r.halt_reason for r in records.values() if r.halt_reason), None),
        "groups": {
            ns: _record_fields(r) | {"verdict": verdicts[ns], "untrusted": r.untrusted}
            for ns, r in records.items()
        },
        # The ledger's one history: per key group, a restore keysync has still to do
        # (after a fence found this server behind), and a halt an operator must end.
        "ledger": {
            ns: {
                "restoring_to": r.restore_to or (row.restore_to.get(ns) if row else None) or None,
                "halted": r.ledger_halt or None,
            }
            for ns, r in records.items()
        },
        "last_fence": None
        if event is None
        else {
            "at": event["fenced_at"].isoformat(),
            "reason": event["reason"],
            "keys_discarded": event["keys_discarded"],
        },
    }


def _record_fields(record: Record) -> dict[str, Any]:
    return {
        "timeline": record.timeline,
        "fork": record.fork,
        "clock": record.clock,
        "database": record.database or None,
    }


def _overall(verdicts: dict[str, str | None], records: dict[str, Record]) -> str | None:
    """What ``settle`` would make of every group's verdict (refusals first)."""
    found = [v for v in verdicts.values() if v is not None]
    if not found:
        return None
    for refusal in ("foreign", "superseded"):
        if refusal in found:
            return refusal
    return combined(found, list(records.values()))


def _server_fields(row: ClockRow) -> dict[str, Any]:
    return {
        "timeline": row.timeline,
        "fork": row.fork,
        "clock": row.clock,
        "here": row.here,
        "database": row.database,
        "fences": row.fences,
    }


async def resume_ledger(settings: Settings, quarantine_file: Path | None = None) -> dict[str, Any]:
    """The operator accepts what a halted ledger lost (``ledger-resume --accept-loss``):
    in each key group whose ledger is halted or has a restore pending, the restore is
    given up (PostgreSQL and Redis), every key the lost history may have changed is
    quarantined (an issue still open, a release not requeued yet: never given back nor
    issued again; listed in ``quarantine_file``, CSV ``id_type,key``), every release not
    requeued yet is settled (the lost history may have requeued and issued it: never
    issued again), and the ledger resumes from what this server holds. What the ledger
    log could not restore is lost to the record, and said so here."""
    types = build_id_types(settings, generating=False)
    cold = await ColdStore.for_settings(settings)
    groups = Groups(settings)
    sync = SyncRecords.open(groups)
    resumed: dict[str, Any] = {}
    held: list[tuple[str, str]] = []
    try:
        for record_of in sync:
            record = await record_of.read()
            lane = record_of.namespace
            ledgers = [n for n in groups.types.get(lane, ()) if types[n].config.ledger]
            async with cold.connection() as conn, conn.transaction():
                row = ClockRow.of(await conn.fetchrow(fence_sql.LOCK_SYNC_CLOCK))
                pending = row.restore_to.get(lane) or record.restore_to
                if not (pending or record.ledger_halt):
                    continue
                await conn.execute(ledger_sql.CLEAR_RESTORE, lane)
                reason = f"ledger-resume --accept-loss: {record.ledger_halt or 'restore given up'}"
                quarantined = {n: await _quarantine(conn, n, reason) for n in ledgers}
                settled = await conn.fetch(ledger_sql.SETTLE_RELEASES)
            await record_of.halt_ledger("")
            held += [(name, key) for name, keys in quarantined.items() for key in keys]
            resumed[lane] = {
                "halt_reason": record.ledger_halt or None,
                "given_up_restore_to": pending or None,
                "releases_settled": {r["id_type"]: int(r["releases"]) for r in settled},
                "quarantined": {name: len(keys) for name, keys in quarantined.items()},
            }
    finally:
        await cold.close()
        await groups.close()
    listed = _list_quarantined(held, quarantine_file) if resumed else None
    return {"resumed": resumed, "quarantined": len(held), "quarantine_file": listed}


async def _quarantine(conn: Any, name: str, reason: str) -> list[str]:
    """Quarantine every key of type ``name`` a lost history may have changed; them."""
    rows = await conn.fetch(sql.for_type(ledger_sql.QUARANTINE_UNVOUCHED, name), name, reason)
    return sorted(str(r["key"]) for r in rows)


def _list_quarantined(held: list[tuple[str, str]], path: Path | None) -> str:
    """The keys quarantined, one ``id_type,key`` line each, in ``path`` (default: a file
    named after the time in the working directory); the file's path."""
    if path is None:
        path = Path(f"ledger-quarantine-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.csv")
    path.write_text("id_type,key\n" + "".join(f"{name},{key}\n" for name, key in held))
    return str(path)
