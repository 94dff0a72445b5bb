"""The ledger's decisions in PostgreSQL: which key was issued when, to which client,
its status.

Dispensers never write PostgreSQL. The pop script appends an "issue" entry to a Redis
stream in the same atomic step that takes the keys, and a mark of use or a release
appends its own entry; keysync applies the stream to per-type ledger tables in batches
(``keysync/ledger.py``), one ledger transaction per batch.

Each transaction decides once (``apply``) and returns what it wrote as operations
(``Applied.ops``): they are copied to the ledger log before the transaction commits,
and a restore after a PostgreSQL promotion writes them again as they are
(``replay.apply_ops``), deciding nothing. The outcome of a status change a client waits for
(MOSIP's PUT, an entry with ``reply``) is written beside it (``kd_outcomes``) and is
the answer whenever the entry is applied again.

A redelivered issue is recognised by its stream entry ID; any other key issued twice
hits the table's primary key and raises the duplicate alarm (metric + error log). A
"release" entry records a key given back unused; for a type with ``reissue_released``
its issue row moves to ``kd_released_issues``, and the key goes back to the cold table,
once, when the release is older than the type's ``reissue_after_s`` (``requeue``). A
mark of use or a release applies only to an issue row older than itself.

Applying is order-independent: a "used" entry applied before its "issue" entry (two
keysyncs) waits in ``kd_ledger_early_marks`` and is applied in the transaction that
inserts the issue row; drains take one advisory lock, so the two never miss each other.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime

import asyncpg

from shared.domain.idtypes import IdType
from shared.domain.outcomes import outcome_of
from shared.domain.tiers import KeyStatus
from shared.stores.ledger import sql as ledger_sql
from shared.stores.ledger.batch import Applied, Batch, Issued, Reply, Used
from shared.stores.postgres import sql

log = logging.getLogger(__name__)


def _ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


# The advisory lock every ledger transaction takes ("kdlg").
LEDGER_LOCK = 0x6B64_6C67


async def apply(conn: asyncpg.Connection, batch: Batch) -> Applied:
    """Decide one batch in the caller's transaction: issues first (with any marks that
    came before them), then uses and releases (a mark of a key not issued yet waits for
    it); marks of one key in the batch in stream order (``in_stream_order``); a status
    change decided before (its outcome is in kd_outcomes) is not applied again. Returns
    what was written (``Applied.ops``) and each status change's outcome."""
    alone = bool(batch.used or batch.released)
    await conn.execute(
        ledger_sql.LOCK_LEDGER if alone else ledger_sql.LOCK_LEDGER_SHARED, LEDGER_LOCK
    )
    done = Applied(duplicates={name: list(keys) for name, keys in batch.duplicates.items()})
    decided = await _decided(conn, batch)
    for name, rows in batch.issued.items():
        await _issue(conn, name, rows, done)
    for name in {**batch.used, **batch.released}:
        await _marks(conn, batch, name, decided.get(name, {}), done)
    for name, replies in batch.replies.items():
        await _decide(conn, name, replies, decided.get(name, {}), done)
    done.duplicates = {k: v for k, v in done.duplicates.items() if v}
    return done


async def _decided(conn: asyncpg.Connection, batch: Batch) -> dict[str, dict[str, str]]:
    """The outcomes decided before of the batch's status changes, per type."""
    found: dict[str, dict[str, str]] = {}
    for name, replies in batch.replies.items():
        rows = await conn.fetch(ledger_sql.SELECT_OUTCOMES, name, [r.entry for r in replies])
        if rows:
            found[name] = {str(r["entry_id"]): str(r["outcome"]) for r in rows}
    return found


async def _issue(conn: asyncpg.Connection, name: str, rows: Issued, done: Applied) -> None:
    inserted = int(
        await conn.fetchval(
            sql.for_type(ledger_sql.INSERT_LEDGER_ISSUED, name), *rows.arrays(), name
        )
    )
    done.issued += inserted
    skipped: list[str] = []  # "<entry> <key>": issues not inserted
    if inserted < rows.count:  # redelivered, released since, or issued twice
        found = await conn.fetch(sql.for_type(ledger_sql.SELECT_NOT_INSERTED, name), *rows.arrays())
        skipped = [r["issue"] for r in found]
        twice = await conn.fetch(
            sql.for_type(ledger_sql.SELECT_ISSUED_TWICE, name), *rows.arrays(), name
        )
        done.duplicates.setdefault(name, []).extend(r["key"] for r in twice)
    done.ops.append(
        {
            "op": "issue",
            "type": name,
            "keys": rows.keys,
            "times": [_ms(t) for t in rows.times],
            "clients": rows.clients,
            "idem": rows.idempotency_keys,
            "entries": rows.entries,
            "skip": skipped,
        }
    )
    if await conn.fetchval(ledger_sql.HAS_EARLY_MARKS, name):
        inserted_keys = {i.split(" ")[1] for i in set(rows.issues()) - set(skipped)}
        await _apply_early_marks(conn, name, inserted_keys, done)


async def _apply_early_marks(
    conn: asyncpg.Connection, name: str, inserted: set[str], done: Applied
) -> None:
    """Marks that waited for these new issue rows: the first of each key's by its
    client (or one with ledger permission) is applied, the others refused."""
    if not inserted:
        return
    keys = sorted(inserted)
    row = await conn.fetchrow(sql.for_type(ledger_sql.APPLY_EARLY_MARKS, name), name, keys)
    assert row is not None
    found, applied = int(row["found"]), int(row["applied"])
    done.used += applied
    done.used_refused += found - applied
    if found:
        done.ops.append(
            {
                "op": "early",
                "type": name,
                "keys": keys,
                "applied": [
                    list(row["keys"]),
                    [_ms(t) for t in row["times"]],
                    list(row["clients"]),
                ],
            }
        )


async def _marks(
    conn: asyncpg.Connection, batch: Batch, name: str, decided: dict[str, str], done: Applied
) -> None:
    """One type's uses and releases, in stream order where a key is marked twice."""
    used, released = (
        _undecided(batch.used.get(name), decided),
        _undecided(batch.released.get(name), decided),
    )
    replies = {reply.entry for reply in batch.replies.get(name, ())}
    for op, marks in in_stream_order(used, released):
        if not marks.keys:
            continue
        if op == "release":
            done.released += await _release(conn, name, marks, name in batch.reissue, done)
        else:
            await _mark_used(conn, name, marks, replies, done)


def _undecided(marks: Used | None, decided: dict[str, str]) -> Used | None:
    """The marks whose entry was not decided before (a status change applied again
    keeps its first outcome, and is not applied again)."""
    if marks is None or not decided:
        return marks
    return _picked(marks, [i for i, entry in enumerate(marks.entries) if entry not in decided])


def _entry_order(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def _picked(marks: Used, rows: list[int]) -> Used:
    return Used(
        [marks.keys[i] for i in rows],
        [marks.times[i] for i in rows],
        [marks.clients[i] for i in rows],
        [marks.admin[i] for i in rows],
        [marks.entries[i] for i in rows],
    )


def in_stream_order(used: Used | None, released: Used | None) -> list[tuple[str, Used]]:
    """Order one type's marks of a batch as the statements that apply them: the first
    mark of a key wins, whatever the batch's bounds. A key marked once goes in the bulk
    statements (uses, then releases); a key marked more than once in the batch (a use
    and a release, or two of either) gets one statement per mark, in stream order, as
    batches of their own would have applied them."""
    marks = {"used": used or Used(), "release": released or Used()}
    seen: Counter[str] = Counter(key for each in marks.values() for key in each.keys)
    bulk: list[tuple[str, Used]] = []
    one_by_one: list[tuple[tuple[int, int], int, str, Used]] = []
    for op, each in marks.items():
        alone = [i for i, key in enumerate(each.keys) if seen[key] == 1]
        if alone:
            bulk.append((op, each if len(alone) == len(each.keys) else _picked(each, alone)))
        for i, key in enumerate(each.keys):
            if seen[key] > 1:
                one_by_one.append((_entry_order(each.entries[i]), i, op, _picked(each, [i])))
    return bulk + [(op, mark) for *_, op, mark in sorted(one_by_one, key=lambda m: m[:2])]


async def _mark_used(
    conn: asyncpg.Connection, name: str, marks: Used, replies: set[str], done: Applied
) -> None:
    """Apply use marks; a mark of a key with no issue row yet waits for it, but for a
    status change a client waits for (``replies``): it is answered now."""
    rows = await conn.fetch(
        sql.for_type(ledger_sql.UPDATE_LEDGER_USED, name),
        marks.keys,
        marks.times,
        marks.clients,
        marks.admin,
    )
    updated = {r["key"] for r in rows}
    missing, foreign = await _not_marked(conn, name, marks, updated)
    waiting = _early_marks(marks, missing, replies)
    if waiting.keys:
        await conn.execute(
            ledger_sql.INSERT_EARLY_MARKS,
            name,
            waiting.keys,
            waiting.times,
            waiting.clients,
            waiting.admin,
        )
    done.used += len(updated)
    done.used_unknown += len(missing)
    done.used_refused += len(foreign)
    done.ops.append(
        {
            "op": "used",
            "type": name,
            "applied": [
                [r["key"] for r in rows],
                [_ms(r["used_at"]) for r in rows],
                [r["used_by"] for r in rows],
            ],
            "waiting": [
                waiting.keys,
                [_ms(t) for t in waiting.times],
                waiting.clients,
                waiting.admin,
            ],
        }
    )


async def _release(
    conn: asyncpg.Connection, name: str, marks: Used, reissue: bool, done: Applied
) -> int:
    """Record keys given back (issued, neither used nor released, by their client or one
    with ledger permission); with ``reissue`` their issue rows move to
    kd_released_issues, from which ``requeue`` puts them back later."""
    arrays = (marks.keys, marks.times, marks.clients, marks.admin)
    if reissue:
        statement = sql.for_type(ledger_sql.RELEASE_TO_HISTORY, name)
        rows = await conn.fetch(statement, name, *arrays, marks.entries)
        written = [
            [r["key"] for r in rows],
            [_ms(r["released_at"]) for r in rows],
            [r["released_by"] for r in rows],
            [r["release_entry"] for r in rows],
            [_ms(r["recorded_at"]) for r in rows],
        ]
    else:
        rows = await conn.fetch(sql.for_type(ledger_sql.RELEASE_LEDGER, name), *arrays, name)
        written = [
            [r["key"] for r in rows],
            [_ms(r["released_at"]) for r in rows],
            [r["released_by"] for r in rows],
        ]
    done.ops.append({"op": "release", "type": name, "history": reissue, "rows": written})
    released = {r["key"] for r in rows}
    if released:
        log.info(
            "keys_released",
            extra={"id_type": name, "count": len(released), "to_be_reissued": reissue},
        )
    rest = sorted(set(marks.keys) - released)
    if rest:  # used or released already, another client's, or never issued
        log.warning("release_not_applied", extra={"id_type": name, "keys": rest[:10]})
    return len(released)


def _early_marks(marks: Used, missing: set[str], replies: set[str]) -> Used:
    """Marks of keys with no issue row yet, kept until it comes (each marker's first;
    never a status change a client waits for: it was answered)."""
    first: dict[tuple[str, str], int] = {}
    for i, (key, client) in enumerate(zip(marks.keys, marks.clients, strict=True)):
        if key in missing and marks.entries[i] not in replies:
            first.setdefault((key, client), i)
    return _picked(marks, list(first.values()))


async def _not_marked(
    conn: asyncpg.Connection, name: str, marks: Used, updated: set[str]
) -> tuple[set[str], set[str]]:
    """Of the marks not applied: keys never issued, and keys their marker may not mark."""
    rest = sorted(set(marks.keys) - updated)
    if not rest:
        return set(), set()
    known = {
        r["key"]: r
        for r in await conn.fetch(sql.for_type(ledger_sql.SELECT_LEDGER_ENTRIES, name), rest)
    }
    missing = set(rest) - set(known)
    if missing:  # given back (the issue row moved away): refused, never kept waiting
        given_back = await conn.fetch(ledger_sql.SELECT_RELEASED_KEYS, name, sorted(missing))
        released = {r["key"] for r in given_back}
        missing -= released
    else:
        released = set()
    foreign = {
        key
        for key, client, admin in zip(marks.keys, marks.clients, marks.admin, strict=True)
        if key in known and key not in updated and not admin and known[key]["client"] != client
    } | released
    if missing:
        log.info(
            "used_mark_waits_for_its_issue",
            extra={"id_type": name, "keys": sorted(missing)[:10], "count": len(missing)},
        )
    if foreign:
        log.warning(
            "used_mark_refused",
            extra={"id_type": name, "keys": sorted(foreign)[:10], "count": len(foreign)},
        )
    return missing, foreign


# --- outcomes of status changes -----------------------------------------------------


async def _decide(
    conn: asyncpg.Connection,
    name: str,
    replies: list[Reply],
    decided: dict[str, str],
    done: Applied,
) -> None:
    """The outcome of each status change of the batch: the one decided before, or the
    status its key has now that the batch is applied, as the client asked it. Written
    beside the change (kd_outcomes) in this transaction."""
    fresh: dict[str, str] = {}
    for reply in replies:
        if reply.entry in decided:
            done.outcomes[reply.entry] = decided[reply.entry]
            continue
        found = await key_status(conn, name, reply.key)
        fresh[reply.entry] = outcome_of(reply.op, reply.client, reply.admin, found)
    if fresh:
        await conn.execute(ledger_sql.INSERT_OUTCOMES, name, list(fresh), list(fresh.values()))
        done.ops.append(
            {"op": "outcomes", "type": name, "outcomes": [list(fresh), list(fresh.values())]}
        )
        done.outcomes.update(fresh)


async def key_status(conn: asyncpg.Connection, name: str, key: str) -> KeyStatus:
    """The key's state now: its current issue row (an open one may be quarantined),
    else its last issue that was released back to the cold tier, else never issued."""
    row = await conn.fetchrow(sql.for_type(ledger_sql.SELECT_LEDGER_KEY, name), key)
    if row is not None:
        if row["used_at"] is not None:
            return KeyStatus("assigned", row["client"])
        if row["released_at"] is not None:
            return KeyStatus("released", row["client"])
        if await conn.fetchval(ledger_sql.IS_QUARANTINED, key, name):
            return KeyStatus("quarantined", row["client"])
        return KeyStatus("issued", row["client"], idempotency_key=row["idempotency_key"])
    past = await conn.fetchrow(ledger_sql.SELECT_RELEASED_ISSUE, name, key)
    if past is not None:
        return KeyStatus("released", past["client"], reissued=True)
    return KeyStatus("unknown")


# --- requeue: a ledger transaction of its own ----------------------------------------


async def requeue(conn: asyncpg.Connection, id_type: IdType, done: Applied) -> int:
    """Put keys given back longer ago than the type's ``reissue_after_s`` back in the cold
    table, each once (in the caller's ledger transaction); how many went back."""
    name = id_type.name
    await conn.execute(ledger_sql.LOCK_LEDGER, LEDGER_LOCK)
    await conn.execute(sql.LOCK_IMPORT_SHARED, name)
    rows = await conn.fetch(
        sql.for_type(ledger_sql.REQUEUE_RELEASED, name), name, id_type.config.reissue_after_s
    )
    if not rows:
        return 0
    done.ops.append(
        {
            "op": "requeue",
            "type": name,
            "rows": [
                [r["key"] for r in rows],
                [r["entry_id"] for r in rows],
                [bool(r["requeue_discarded"]) for r in rows],
                [_ms(r["requeued_at"]) for r in rows],
            ],
        }
    )
    back = sum(1 for r in rows if r["back"])
    if back:
        log.info("released_keys_requeued", extra={"id_type": name, "count": back})
    return back


# --- a restore: the ops written again -------------------------------------------------


async def prune_early_marks(conn: asyncpg.Connection, max_age_s: float) -> int:
    """Forget "used" marks that waited longer than ``max_age_s`` for their issue row
    (keys never issued, or whose issue entry a Redis loss took); returns how many."""
    rows = await conn.fetch(ledger_sql.PRUNE_EARLY_MARKS, max_age_s)
    for row in rows:
        log.warning(
            "used_key_never_issued", extra={"id_type": row["id_type"], "count": row["marks"]}
        )
    return sum(int(row["marks"]) for row in rows)
