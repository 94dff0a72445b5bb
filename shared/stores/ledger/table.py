"""The audit ledger: which key was issued when, to which client, and when it was used.

Dispensers never write PostgreSQL. The pop script appends an "issue" entry to a Redis
stream in the same atomic step that takes the keys, and mark-used appends a "used"
entry; keysync drains the stream into per-type ledger tables in batches, and
acknowledges (then deletes) entries only after their transaction commits.
A redelivered entry is recognised by its stream ID; any other key issued twice hits the
table's primary key and raises the duplicate alarm (metric + error log).

A "release" entry (MOSIP's UNASSIGNED) records a key given back unused; for a type
with ``reissue_released`` its issue row moves to ``kd_released_issues``, and the key
goes back to the cold table, once, when the release is older than the type's
``reissue_after_s`` (``requeue_released``). A mark of use or a release applies only to
an issue row older than itself: an entry applied again (redelivered) after its key was
given back and issued again does nothing to the new issue.

Applying is order-independent: two keysyncs (or one restarted, whose pending entries
another claims) may apply a key's "used" entry before its "issue" entry. Such a mark
waits in ``kd_ledger_early_marks`` and is applied in the transaction that inserts the
issue row; drains take one advisory lock, so the two never miss each other.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import IdType
from shared.domain.tiers import KeyStatus, Stamp
from shared.stores.fence.postgres_fence import GuardedCold
from shared.stores.ledger import sql as ledger_sql
from shared.stores.ledger.stream import LedgerEntry, LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore, translated

log = logging.getLogger(__name__)


def entry_time(entry_id: str) -> datetime:
    """A stream entry ID starts with the Redis server's clock in milliseconds."""
    return datetime.fromtimestamp(int(entry_id.split("-", 1)[0]) / 1000, UTC)


@dataclass
class Issued:
    """Issue entries of one type, one item per entry (as ledger_sql._ISSUE_BATCH takes them)."""

    keys: list[str] = field(default_factory=list)  # each entry's keys, space-separated
    times: list[datetime] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)  # one per key, or one for all
    idempotency_keys: list[str | None] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    count: int = 0  # keys in all

    def arrays(self) -> tuple[list[str], list[datetime], list[str], list[str | None], list[str]]:
        return self.keys, self.times, self.clients, self.idempotency_keys, self.entries

    def all_keys(self) -> list[str]:
        return " ".join(self.keys).split()


@dataclass
class Used:
    keys: list[str] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)  # who marked each key
    admin: list[bool] = field(default_factory=list)  # whether it may mark any key
    entries: list[str] = field(default_factory=list)  # the stream entry of each mark


@dataclass
class Batch:
    issued: dict[str, Issued] = field(default_factory=lambda: defaultdict(Issued))
    used: dict[str, Used] = field(default_factory=lambda: defaultdict(Used))
    released: dict[str, Used] = field(default_factory=lambda: defaultdict(Used))
    reissue: set[str] = field(default_factory=set)  # types whose released keys go back
    duplicates: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    skipped: int = 0


def parse(entries: list[LedgerEntry], types: dict[str, IdType]) -> Batch:
    """Group stream entries by type and operation; flag keys issued twice in the batch."""
    batch = Batch()
    seen: dict[str, set[str]] = defaultdict(set)  # keys issued in this batch, per type
    for entry_id, fields in entries:
        name, op = fields.get("type", ""), fields.get("op", "")
        id_type = types.get(name)
        keys = fields.get("keys", "").split()
        if id_type is None or not id_type.config.ledger or op not in ("issue", "used", "release"):
            batch.skipped += 1
            log.warning("ledger_entry_skipped", extra={"entry": entry_id, "id_type": name})
            continue
        when = entry_time(entry_id)
        if op in ("used", "release"):
            used = batch.used[name] if op == "used" else batch.released[name]
            if op == "release" and id_type.config.reissue_released:
                batch.reissue.add(name)
            used.keys.extend(keys)
            used.times.extend([when] * len(keys))
            used.clients.extend([fields.get("clients") or ANONYMOUS] * len(keys))
            used.admin.extend([fields.get("admin") == "1"] * len(keys))
            used.entries.extend([entry_id] * len(keys))
            continue
        clients = fields.get("clients") or ANONYMOUS
        held = seen[name]
        fresh = set(keys)
        if len(fresh) != len(keys) or not held.isdisjoint(fresh):
            keys, clients = _without_repeats(keys, clients, held, batch.duplicates[name])
            fresh = set(keys)
        held |= fresh
        if not keys:
            continue
        issued = batch.issued[name]
        issued.keys.append(" ".join(keys))
        issued.times.append(when)
        issued.clients.append(clients)
        issued.idempotency_keys.append(fields.get("idem") or None)
        issued.entries.append(entry_id)
        issued.count += len(keys)
    return batch


def _without_repeats(
    keys: list[str], clients: str, held: set[str], repeats: list[str]
) -> tuple[list[str], str]:
    """An entry's keys less those already issued in the batch (added to ``repeats``),
    with their clients (one per key, or one for all)."""
    names = clients.split() or [ANONYMOUS]
    if len(names) != len(keys):
        names = [names[0]] * len(keys)
    kept, kept_names, mine = [], [], set()
    for key, client in zip(keys, names, strict=True):
        if key in held or key in mine:
            repeats.append(key)
            continue
        mine.add(key)
        kept.append(key)
        kept_names.append(client)
    return kept, " ".join(kept_names)


@dataclass(frozen=True)
class Applied:
    issued: int
    used: int
    duplicates: dict[str, list[str]]
    used_unknown: int  # marks of keys not (yet) issued: they wait for their issue row
    used_refused: int = 0  # marks by a client the key was not issued to (not applied)
    released: int = 0  # keys given back (and put back in the cold tier when reissued)
    replayed: int = 0  # retained entries applied again after a PostgreSQL fence


# The advisory lock every ledger drain takes in its transaction ("kdlg").
LEDGER_LOCK = 0x6B64_6C67


async def apply(conn: asyncpg.Connection, batch: Batch) -> Applied:
    """Write one batch in the caller's transaction: issues first (with any marks that
    came before them), then uses and releases (a mark of a key not issued yet waits for
    it); marks of one key in the batch in stream order (``in_stream_order``). Across
    batches the first mark applied wins: with one keysync that is stream order, with
    two it is the order their batches commit in."""
    alone = bool(batch.used or batch.released)
    await conn.execute(
        ledger_sql.LOCK_LEDGER if alone else ledger_sql.LOCK_LEDGER_SHARED, LEDGER_LOCK
    )
    issued = used = unknown = refused = 0
    duplicates = {name: list(keys) for name, keys in batch.duplicates.items()}
    for name, rows in batch.issued.items():
        statement = sql.for_type(ledger_sql.INSERT_LEDGER_ISSUED, name)
        inserted = int(await conn.fetchval(statement, *rows.arrays(), name))
        issued += inserted
        if await conn.fetchval(ledger_sql.HAS_EARLY_MARKS, name):
            early = await _apply_early_marks(conn, name, set(rows.all_keys()))
            used, refused = used + early[1], refused + early[0] - early[1]
        if inserted < rows.count:  # redelivered, applied again, or issued twice
            twice = sql.for_type(ledger_sql.SELECT_ISSUED_TWICE, name)
            found = await conn.fetch(twice, *rows.arrays(), name)
            duplicates.setdefault(name, []).extend(r["key"] for r in found)
    released = 0
    for name in {**batch.used, **batch.released}:
        for op, marks in in_stream_order(batch.used.get(name), batch.released.get(name)):
            if op == "release":
                released += await _release(conn, name, marks, reissue=name in batch.reissue)
                continue
            counts = await _mark_used(conn, name, marks)
            used, unknown, refused = used + counts[0], unknown + counts[1], refused + counts[2]
    dups = {k: v for k, v in duplicates.items() if v}
    return Applied(issued, used, dups, unknown, refused, released)


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
    """One type's marks of a batch as the statements that apply them: the first mark of
    a key wins, whatever the batch's bounds. A key marked once goes in the bulk
    statements (uses, then releases); a key marked more than once in the batch (a use
    and a release, or two of either) gets one statement per mark, in stream order, as
    batches of their own would have applied them (a replay after a fence applies in
    other bounds than the first drain did). Across batches the first applied wins: with
    two keysyncs that is their commit order, which a replay in the retained stream's
    (acknowledgement) order need not repeat."""
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


async def _mark_used(conn: asyncpg.Connection, name: str, marks: Used) -> tuple[int, int, int]:
    """Apply use marks: (applied, waiting for their issue, refused)."""
    updated = {
        r["key"]
        for r in await conn.fetch(
            sql.for_type(ledger_sql.UPDATE_LEDGER_USED, name),
            marks.keys,
            marks.times,
            marks.clients,
            marks.admin,
        )
    }
    missing, foreign = await _not_marked(conn, name, marks, updated)
    await _keep_early_marks(conn, name, marks, missing)
    return len(updated), len(missing), len(foreign)


async def _release(conn: asyncpg.Connection, name: str, marks: Used, *, reissue: bool) -> int:
    """Record keys given back (issued, neither used nor released, by their client or one
    with ledger permission); with ``reissue`` their issue rows move to
    kd_released_issues, from which ``requeue_released`` puts them back later."""
    arrays = (marks.keys, marks.times, marks.clients, marks.admin)
    if reissue:
        statement = sql.for_type(ledger_sql.RELEASE_TO_HISTORY, name)
        rows = await conn.fetch(statement, name, *arrays, marks.entries)
    else:
        rows = await conn.fetch(sql.for_type(ledger_sql.RELEASE_LEDGER, name), *arrays)
    done = {r["key"] for r in rows}
    if done:
        log.info(
            "keys_released",
            extra={"id_type": name, "count": len(done), "to_be_reissued": reissue},
        )
    rest = sorted(set(marks.keys) - done)
    if rest:  # used or released already, another client's, or never issued
        log.warning("release_not_applied", extra={"id_type": name, "keys": rest[:10]})
    return len(done)


async def _apply_early_marks(
    conn: asyncpg.Connection, name: str, inserted: set[str]
) -> tuple[int, int]:
    """(found, applied): marks that waited for these new issue rows."""
    if not inserted:
        return 0, 0
    row = await conn.fetchrow(
        sql.for_type(ledger_sql.APPLY_EARLY_MARKS, name), name, sorted(inserted)
    )
    assert row is not None
    return int(row["found"]), int(row["applied"])


async def _keep_early_marks(
    conn: asyncpg.Connection, name: str, marks: Used, missing: set[str]
) -> None:
    """Marks of keys with no issue row yet: kept until it comes (each marker's first)."""
    if not missing:
        return
    first: dict[tuple[str, str], int] = {}
    for i, (key, client) in enumerate(zip(marks.keys, marks.clients, strict=True)):
        if key in missing:
            first.setdefault((key, client), i)
    rows = list(first.values())
    await conn.execute(
        ledger_sql.INSERT_EARLY_MARKS,
        name,
        [marks.keys[i] for i in rows],
        [marks.times[i] for i in rows],
        [marks.clients[i] for i in rows],
        [marks.admin[i] for i in rows],
    )


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


def not_issued(name: str, key: str) -> dict[str, Any]:
    """The lookup answer for a key the ledger holds no issue of."""
    return {"id_type": name, "key": key, "issued": False, "used": False}


class LedgerReader:
    """Lookups for the dispenser's GET route: a small pool, opened on first use."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._store: ColdStore | None = None

    async def lookup(self, name: str, key: str) -> dict[str, Any]:
        store = await self._opened()
        async with store.connection() as conn, translated("ledger_lookup"):
            try:
                row = await conn.fetchrow(sql.for_type(ledger_sql.SELECT_LEDGER_KEY, name), key)
            except asyncpg.UndefinedTableError as exc:
                raise StoreUnavailable(
                    "postgres", f"no ledger table for '{name}': run `keydispenser migrate`"
                ) from exc
        if row is None:
            return not_issued(name, key)
        return {
            "id_type": name,
            "key": key,
            "issued": True,
            "issued_at": _iso(row["issued_at"]),
            "client": row["client"],
            "idempotency_key": row["idempotency_key"],
            "used": row["used_at"] is not None,
            "used_at": _iso(row["used_at"]),
            "used_by": row["used_by"],
            "released": row["released_at"] is not None,
            "released_at": _iso(row["released_at"]),
            "released_by": row["released_by"],
        }

    async def status(self, name: str, key: str) -> KeyStatus:
        """The key's state now: its current issue row, else its last issue that was
        released back to the cold tier, else never issued."""
        store = await self._opened()
        async with store.connection() as conn, translated("ledger_status"):
            row = await conn.fetchrow(sql.for_type(ledger_sql.SELECT_LEDGER_KEY, name), key)
            past = None
            if row is None:
                past = await conn.fetchrow(ledger_sql.SELECT_RELEASED_ISSUE, name, key)
        if row is not None:
            if row["used_at"] is not None:
                return KeyStatus("assigned", row["client"])
            if row["released_at"] is not None:
                return KeyStatus("released", row["client"])
            return KeyStatus("issued", row["client"], idempotency_key=row["idempotency_key"])
        if past is not None:
            return KeyStatus("released", past["client"], reissued=True)
        return KeyStatus("unknown")

    async def _opened(self) -> ColdStore:
        if self._store is None:
            self._store = await ColdStore.connect(self._dsn, min_size=0, max_size=2)
        return self._store

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LedgerDrain:
    """keysync's side: stream -> PostgreSQL, one transaction per batch.

    With ``guard`` each batch's transaction ends with the PostgreSQL fence's guard and
    its stamp is recorded (``GuardedCold.write``): a promotion that lost ledger commits
    is fenced like one that lost a take, and a superseded primary applies nothing. An
    applied entry is kept ``retain_s`` (``LedgerStream.ack``); after a fence, every
    entry kept is applied again (``replay``), which brings back what the promotion lost
    and changes nothing else.
    """

    def __init__(
        self,
        stream: LedgerStream,
        cold: ColdStore,
        types: dict[str, IdType],
        consumer: str,
        batch_size: int,
        claim_idle_s: float = 30.0,
        guard: GuardedCold | None = None,
        retain_s: float = 0.0,
    ) -> None:
        self._stream = stream
        self._cold = cold
        self._types = types
        self._consumer = consumer
        self._batch_size = batch_size
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._guard = guard
        self._retain_ms = int(retain_s * 1000)
        # The type whose key group's record the batches are judged against (one group
        # per drain: its types share it).
        self._lane = next(iter(sorted(types)), "")
        self._replayed: int | None = None  # fence count replayed up to, as last seen

    @property
    def enabled(self) -> bool:
        return any(t.config.ledger for t in self._types.values())

    async def prune(self, max_age_s: float) -> int:
        """Forget "used" marks that waited longer than ``max_age_s`` for their issue row
        (keys never issued, or whose issue entry a Redis loss took); returns how many."""
        async with self._cold.connection() as conn, translated("ledger_prune"):
            rows = await conn.fetch(ledger_sql.PRUNE_EARLY_MARKS, max_age_s)
        for row in rows:
            log.warning(
                "used_key_never_issued", extra={"id_type": row["id_type"], "count": row["marks"]}
            )
        return sum(int(row["marks"]) for row in rows)

    async def requeue_released(self) -> dict[str, int]:
        """Put keys given back longer ago than their type's ``reissue_after_s`` back in
        the cold table (types with ``reissue_released``), each once; how many per type."""
        requeued: dict[str, int] = {}
        for name, id_type in self._types.items():
            if not (id_type.config.ledger and id_type.config.reissue_released):
                continue
            statement = sql.for_type(ledger_sql.REQUEUE_RELEASED, name)
            async with self._cold.connection() as conn, translated("ledger_requeue"):
                rows = await conn.fetch(statement, name, id_type.config.reissue_after_s)
            if rows:
                requeued[name] = len(rows)
                log.info("released_keys_requeued", extra={"id_type": name, "count": len(rows)})
        return requeued

    async def drain_once(self, block_ms: int) -> Applied | None:
        """Apply one batch (waiting up to ``block_ms`` for one); None when there was none."""
        await self._stream.beat(self._consumer)
        # A batch that fails (not applied, or applied and not acknowledged) stays
        # pending under this consumer: the next read takes it again first (applying
        # again is harmless).
        entries = await self._stream.read(
            self._consumer, self._batch_size, block_ms, self._claim_idle_ms
        )
        if not entries:
            return None
        applied, stamp = await self._apply(parse(entries, self._types))
        await self._stream.ack([entry_id for entry_id, _ in entries], self._retain_ms)
        for name, keys in applied.duplicates.items():
            log.error(
                "duplicate_key_issued",
                extra={"id_type": name, "keys": keys[:10], "count": len(keys)},
            )
        if stamp is not None and (self._replayed is None or stamp.fences > self._replayed):
            replayed = await self.replay(stamp.fences)
            applied = dataclasses.replace(applied, replayed=replayed)
        return applied

    async def _apply(self, batch: Batch) -> tuple[Applied, Stamp | None]:
        if self._guard is None:
            async with self._cold.connection() as conn, translated("ledger"), conn.transaction():
                return await apply(conn, batch), None
        return await self._guard.write(self._lane, lambda conn: apply(conn, batch), "ledger")

    async def replay(self, fences: int) -> int:
        """After a PostgreSQL fence (``fences``: the count this server's history has
        seen): apply every retained entry again, once per fence; how many were."""
        done = await self._stream.replayed_fences()
        if done is not None and done >= fences:
            self._replayed = done
            return 0
        after, count, issued = "-", 0, 0
        while chunk := await self._stream.retained(after, self._batch_size):
            applied, _ = await self._apply(parse([e for _, e in chunk], self._types))
            after, count, issued = chunk[-1][0], count + len(chunk), issued + applied.issued
        await self._stream.set_replayed(fences)
        self._replayed = fences
        log.warning(
            "ledger_replayed_after_fence",
            extra={"fences": fences, "entries": count, "issues_restored": issued},
        )
        return count
