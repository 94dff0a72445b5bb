"""The ledger as a system of record: an entry applied again changes nothing, and a
released key goes back only when nothing anywhere may still hold it.

Entries are applied as keysync applies them (``apply`` on real PostgreSQL), with the
entry IDs a Redis stream gives; a promoted replica that lost commits is a clone of the
database promoted after the old primary committed more (``promote``, as in
test_postgres_fence.py), and each hazard has its control case with the guard off.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from keysync.ledger import LedgerDrain
from keysync.main import Keysync
from shared.domain.config import Settings
from shared.domain.errors import LedgerHalted
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.batch import parse
from shared.stores.ledger.decide import apply
from shared.stores.ledger.replay import apply_ops
from shared.stores.ledger.stream import LedgerEntry, LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_postgres_fence import clone, cold_at, drop, promote

# Counters far above anything a test's keygen leases: the keys tests issue by hand.
HIGH_COUNTER = 900_000_000


def reissue_settings(servers: Servers, database: str) -> Settings:
    types = small_types()
    types["farmer"] |= {"ledger": True, "reissue_released": True, "reissue_after_s": 0}
    return make_settings(servers, database, id_types=types)


def entry(ms: int, op: str, key: str, client: str) -> LedgerEntry:
    return f"{ms}-0", {"op": op, "type": "farmer", "keys": key, "clients": client}


async def applied(settings: Settings, *batches: list[LedgerEntry]) -> dict[str, list[str]]:
    """Apply each batch in a transaction of its own; the duplicates alarmed."""
    types = build_id_types(settings)
    alarms: dict[str, list[str]] = {}
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        for batch in batches:
            async with conn.transaction():
                result = await apply(conn, parse(batch, types))
            for name, keys in result.duplicates.items():
                alarms.setdefault(name, []).extend(keys)
    finally:
        await conn.close()
    return alarms


async def fetch(settings: Settings, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return list(await conn.fetch(sql.for_type(query, "farmer"), *args))
    finally:
        await conn.close()


def high_key(settings: Settings, offset: int = 0) -> str:
    farmer = build_id_types(settings)["farmer"]
    return farmer.generate(HIGH_COUNTER + offset * 100, HIGH_COUNTER + offset * 100 + 100)[0][0]


async def test_a_replayed_issue_never_revives_a_released_issue(
    servers: Servers, database: str
) -> None:
    """A Redis restart from a snapshot taken while an issue entry was still in the
    stream brings the entry back after its key was released (and requeued, and issued
    again): applied again, it neither revives the first issue nor raises the
    duplicate alarm, while the key is out of the ledger and after its next issue."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    first, release = entry(1_000, "issue", key, "c1"), entry(2_000, "release", key, "c1")
    assert await applied(settings, [first], [release]) == {}
    # Released (its issue row moved to the history), not issued again yet.
    assert await applied(settings, [first]) == {}
    assert await fetch(settings, "SELECT * FROM {ledger} WHERE key = $1", key) == []
    # Issued again, to another client: the replay is still only a replay.
    second = entry(3_000, "issue", key, "c2")
    assert await applied(settings, [second], [first]) == {}
    rows = await fetch(settings, "SELECT client, entry_id FROM {ledger} WHERE key = $1", key)
    assert [(r["client"], r["entry_id"]) for r in rows] == [("c2", "3000-0")]
    # A true second issue of a key still held (another entry) does raise the alarm.
    assert await applied(settings, [entry(4_000, "issue", key, "c3")]) == {"farmer": [key]}


async def test_a_replayed_issue_beside_the_keys_next_issue_in_one_batch_keeps_the_next(
    servers: Servers, database: str
) -> None:
    """A Redis failover brings a released issue's entry back unacknowledged, and the key's
    next issue (to another client) is read in the same batch: the replay changes
    nothing and the next issue is recorded, with no alarm. Parsing that took the two
    for a key issued twice in the batch dropped the next issue (found by the
    simulation, seed 608: its client held a key the ledger did not know). A restore
    writes the link again the same way (its skip names the replayed issue only)."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    first, release = entry(1_000, "issue", key, "c1"), entry(2_000, "release", key, "c1")
    assert await applied(settings, [first], [release]) == {}
    second = entry(3_000, "issue", key, "c2")
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with conn.transaction():
            done = await apply(conn, parse([first, second], build_id_types(settings)))
        assert done.duplicates == {} and done.issued == 1
        rows = await conn.fetch(
            sql.for_type("SELECT * FROM {ledger} WHERE key = $1", "farmer"), key
        )
        assert [(r["client"], r["entry_id"]) for r in rows] == [("c2", "3000-0")]
        (issue,) = [op for op in done.ops if op["op"] == "issue"]
        assert issue["skip"] == [f"1000-0 {key}"]
        # The restore's replay of this link on a server that lost it.
        await conn.execute(sql.for_type("DELETE FROM {ledger} WHERE key = $1", "farmer"), key)
        async with conn.transaction():
            await apply_ops(conn, done.ops)
        rows = await conn.fetch(
            sql.for_type("SELECT * FROM {ledger} WHERE key = $1", "farmer"), key
        )
        assert [(r["client"], r["entry_id"]) for r in rows] == [("c2", "3000-0")]
    finally:
        await conn.close()


async def test_a_key_issued_by_two_live_entries_of_one_batch_raises_the_alarm(
    servers: Servers, database: str
) -> None:
    """Two entries of one batch issuing a key nobody gave back: the earlier is recorded
    (stream order), the later raises the duplicate alarm."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    batch = [entry(1_000, "issue", key, "c1"), entry(1_001, "issue", key, "c2")]
    assert await applied(settings, batch) == {"farmer": [key]}
    rows = await fetch(settings, "SELECT client, entry_id FROM {ledger} WHERE key = $1", key)
    assert [(r["client"], r["entry_id"]) for r in rows] == [("c1", "1000-0")]


async def test_a_replayed_release_never_gives_back_the_next_issue_whatever_the_clock(
    servers: Servers, database: str
) -> None:
    """A release applied again is recognised by its entry, not by its time: after a
    failover to a Redis whose clock is behind, the key's next issue (to the same
    client) can carry an earlier entry time than the old release."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    release = entry(3_000, "release", key, "c1")
    await applied(settings, [entry(1_000, "issue", key, "c1")], [release])
    await applied(settings, [entry(2_000, "issue", key, "c1")], [release])
    rows = await fetch(settings, "SELECT * FROM {ledger} WHERE key = $1", key)
    assert len(rows) == 1 and rows[0]["entry_id"] == "2000-0"
    assert rows[0]["released_at"] is None  # the second issue is still held
    history = await fetch(settings, "SELECT * FROM kd_released_issues WHERE key = $1", key)
    assert [(r["entry_id"], r["release_entry"]) for r in history] == [("1000-0", "3000-0")]


async def test_a_release_waits_on_postgresqls_clock_and_never_requeues_a_live_key(
    servers: Servers, database: str, hot: HotStore
) -> None:
    """reissue_after_s counts from when PostgreSQL recorded the release (its own
    clock), not from the Redis server's entry time; and a released key whose issue is
    live again in the ledger is settled, never put back."""
    types = small_types()
    types["farmer"] |= {"ledger": True, "reissue_released": True, "reissue_after_s": 0.5}
    settings = make_settings(servers, database, id_types=types)
    await run_migrate(settings)
    key, live = high_key(settings, 0), high_key(settings, 1)
    # Released "an hour ago" by the Redis server's clock, recorded just now.
    hour_ago = 1_000
    await applied(
        settings,
        [entry(hour_ago, "issue", key, "c1"), entry(hour_ago, "issue", live, "c1")],
        [entry(hour_ago + 1, "release", key, "c1"), entry(hour_ago + 1, "release", live, "c1")],
    )
    # The live key's first issue comes back (applied again after a promotion lost its
    # release's requeue and the key's next issue was re-applied).
    await applied(settings, [entry(5_000, "issue", live, "c2")])
    async with cold_at(settings.postgres_dsn) as cold:
        drain = LedgerDrain(
            LedgerStream(hot.endpoint, hot.namespace), cold, build_id_types(settings), "t", 10
        )
        assert await drain.requeue_released() == {}  # not yet: recorded < 0.5 s ago
        await asyncio.sleep(0.6)
        assert await drain.requeue_released() == {"farmer": 1}
    in_cold = await fetch(settings, "SELECT key FROM {cold} WHERE key = ANY($1)", [key, live])
    assert [r["key"] for r in in_cold] == [key]
    settled = await fetch(
        settings, "SELECT requeue_discarded FROM kd_released_issues WHERE key = $1", live
    )
    assert [r["requeue_discarded"] for r in settled] == [True]


async def requeue_then_dispense(
    settings: Settings, dsn: str, sync: SyncRecord | None, hot: HotStore
) -> list[str]:
    """keysync on ``dsn``: a refill (the fence runs here when it must), the requeue of
    due releases, another refill; every key pushed is then dispensed."""
    types = build_id_types(settings)
    farmer = types["farmer"]
    async with cold_at(dsn) as cold:
        guard = GuardedCold(cold, sync, types)
        keysync = Keysync(settings, guard, hot)
        stream = LedgerStream(hot.endpoint, hot.namespace)
        drain = LedgerDrain(stream, cold, types, "t", 10, guard=guard, sync=sync)
        await keysync.refill(farmer)
        await drain.requeue_released()
        await keysync.refill(farmer)
    return (await hot.pop(farmer.name, 10_000)).keys


async def requeue_across_a_promotion(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord | None
) -> tuple[str, list[str], list[str]]:
    """A released key is requeued and dispensed on the old primary; the promoted
    replica never saw the requeue. (key, dispensed before, dispensed after)."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    await applied(
        settings, [entry(1_000, "issue", key, "c1")], [entry(2_000, "release", key, "c1")]
    )
    replica = f"{database}_replica"
    await clone(servers, database, replica)
    try:
        before = await requeue_then_dispense(settings, settings.postgres_dsn, sync, hot)
        await promote(servers, database, replica)
        after = await requeue_then_dispense(settings, settings.postgres_dsn, sync, hot)
    finally:
        await drop(servers, f"{database}_old")
    return key, before, after


async def test_a_requeue_the_promotion_lost_is_restored_never_done_again(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """The requeue was a ledger transaction of its own, its writes in the ledger log:
    after the fence the restore writes it again (the release settled, requeued), so the
    key is never requeued a second time."""
    key, before, after = await requeue_across_a_promotion(servers, database, hot, sync)
    assert key in before
    assert key not in after
    settings = reissue_settings(servers, database)
    rows = await fetch(settings, "SELECT requeued_at FROM kd_released_issues WHERE key = $1", key)
    assert len(rows) == 1 and rows[0]["requeued_at"] is not None


async def test_control_without_the_guard_a_released_key_is_handed_out_twice(
    servers: Servers, database: str, hot: HotStore
) -> None:
    key, before, after = await requeue_across_a_promotion(servers, database, hot, None)
    assert key in before and key in after  # the hazard the fence closes


async def issue(hot: HotStore, client: str, count: int) -> list[str]:
    """``count`` keys popped as the dispenser pops a ledger type's: the same script
    appends their issue entry to the ledger stream."""
    return (await hot.pop("farmer", count, [client], ledger=True)).keys


async def drained(
    settings: Settings, hot: HotStore, sync: SyncRecord | None, retain_s: float
) -> int:
    """One keysync's drain, on whatever server the DSN reaches now, until the stream
    is empty; how many ledger links it restored after a fence."""
    types = build_id_types(settings)
    async with cold_at(settings.postgres_dsn) as cold:
        drain = LedgerDrain(
            LedgerStream(hot.endpoint, hot.namespace),
            cold,
            types,
            "keysync-1",
            100,
            guard=GuardedCold(cold, sync, types),
            retain_s=retain_s,
            sync=sync,
        )
        first = await drain.drain_once(block_ms=10)  # creates the consumer group if need be
        while first or await drain.drain_once(block_ms=10) is not None:
            first = None
    return drain.restored


async def ledger_across_a_promotion(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord | None, retain_s: float
) -> tuple[dict[str, str], dict[str, str], int]:
    """Keys issued and applied before the standby's copy, then more applied on the
    old primary only, then more after the promotion. (every key -> the client it went
    to, the ledger's key -> client, entries applied again)."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    farmer = build_id_types(settings)["farmer"]
    await hot.push("farmer", farmer.generate(HIGH_COUNTER, HIGH_COUNTER + 4_000)[0][:60], "b1")
    handed: dict[str, str] = {}
    replica = f"{database}_replica"
    try:
        handed |= dict.fromkeys(await issue(hot, "before", 20), "before")
        await drained(settings, hot, sync, retain_s)
        await clone(servers, database, replica)
        handed |= dict.fromkeys(await issue(hot, "lost", 20), "lost")
        await drained(settings, hot, sync, retain_s)  # committed on the old primary only
        await promote(servers, database, replica)
        handed |= dict.fromkeys(await issue(hot, "after", 20), "after")
        replayed = await drained(settings, hot, sync, retain_s)
        rows = await fetch(settings, "SELECT key, client FROM {ledger}")
    finally:
        await drop(servers, f"{database}_old")
    return handed, {r["key"]: r["client"] for r in rows}, replayed


async def test_ledger_rows_a_promotion_lost_are_restored_after_the_fence(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    handed, ledger, restored = await ledger_across_a_promotion(
        servers, database, hot, sync, retain_s=300
    )
    assert len(handed) == 60
    assert ledger == handed  # every key, under the client it went to
    assert restored == 1  # the one lost link, written again from the log


async def test_without_the_log_the_ledger_fails_closed_instead_of_losing_rows(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """The log kept no time (ledger_retain_s: 0, so the lost link is trimmed): the
    restore cannot be whole, and the ledger halts rather than answer without it."""
    with pytest.raises(LedgerHalted):
        await ledger_across_a_promotion(servers, database, hot, sync, retain_s=0)
    record = await sync.read()
    assert "gone from the log" in record.ledger_halt


async def test_control_without_the_guard_nothing_sees_the_ledger_rows_lost(
    servers: Servers, database: str, hot: HotStore
) -> None:
    handed, ledger, restored = await ledger_across_a_promotion(
        servers, database, hot, None, retain_s=300
    )
    assert restored == 0
    assert set(handed) - set(ledger) == {k for k, c in handed.items() if c == "lost"}


async def test_a_mark_applied_beside_its_issue_waits_for_it(
    servers: Servers, database: str
) -> None:
    """Two keysyncs at once: batches of issues insert side by side, but a batch with a
    mark of use waits until the issue batch in flight committed, then sees its row (it
    never parks the mark after the issue batch looked for parked marks)."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    types = build_id_types(settings)
    key = high_key(settings)
    issuing = await asyncpg.connect(settings.postgres_dsn)
    marking = await asyncpg.connect(settings.postgres_dsn)
    try:
        open_issue = issuing.transaction()
        await open_issue.start()
        await apply(issuing, parse([entry(1_000, "issue", key, "c1")], types))
        other = await asyncpg.connect(settings.postgres_dsn)
        try:  # another batch of issues is not held up
            async with other.transaction():
                await apply(
                    other, parse([entry(1_001, "issue", high_key(settings, 1), "c2")], types)
                )
        finally:
            await other.close()

        async def mark() -> int:
            async with marking.transaction():
                return (await apply(marking, parse([entry(2_000, "used", key, "c1")], types))).used

        marked = asyncio.create_task(mark())
        await asyncio.sleep(0.5)
        assert not marked.done()  # waits for the issue batch in flight
        await open_issue.commit()
        assert await asyncio.wait_for(marked, 10) == 1
    finally:
        await issuing.close()
        await marking.close()
    rows = await fetch(settings, "SELECT used_by FROM {ledger} WHERE key = $1", key)
    assert [r["used_by"] for r in rows] == ["c1"]


async def test_each_key_is_recorded_under_its_own_client(servers: Servers, database: str) -> None:
    """A coalesced pop names one client per key; a batch request one for all."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    one, two, three = (high_key(settings, n) for n in range(3))
    coalesced = (
        "1000-0",
        {"op": "issue", "type": "farmer", "keys": f"{one} {two}", "clients": "c1 c2"},
    )
    batch = ("1001-0", {"op": "issue", "type": "farmer", "keys": three, "clients": "c3"})
    assert await applied(settings, [coalesced, batch]) == {}
    rows = await fetch(settings, "SELECT key, client FROM {ledger}")
    assert {r["key"]: r["client"] for r in rows} == {one: "c1", two: "c2", three: "c3"}


@pytest.mark.parametrize("first", ["release", "used"])
async def test_the_first_mark_of_a_key_wins_whatever_the_batch_bounds(
    servers: Servers, database: str, first: str
) -> None:
    """A use and a release of one key (two requests at once, or a replay after a fence
    applying in other bounds than the first drain did): the one first in the stream wins,
    whether the two entries are applied in batches of their own or in one. Were uses
    applied before releases within a batch, a release answered first would be undone by
    a replay that found both entries in one batch."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    then = "used" if first == "release" else "release"
    apart, together = high_key(settings, 0), high_key(settings, 1)
    await applied(
        settings, [entry(1_000, "issue", apart, "c1"), entry(1_000, "issue", together, "c1")]
    )
    await applied(settings, [entry(2_000, first, apart, "c1")], [entry(2_001, then, apart, "c1")])
    await applied(
        settings, [entry(2_000, first, together, "c1"), entry(2_001, then, together, "c1")]
    )
    states = []
    for key in (apart, together):
        rows = await fetch(settings, "SELECT used_by FROM {ledger} WHERE key = $1", key)
        given_back = await fetch(settings, "SELECT 1 FROM kd_released_issues WHERE key = $1", key)
        states.append(([r["used_by"] for r in rows], len(given_back)))
    expected = ([], 1) if first == "release" else (["c1"], 0)
    assert states == [expected, expected]


async def test_an_operators_fence_settles_every_release_not_requeued(
    servers: Servers, database: str, sync: SyncRecord
) -> None:
    """After a halt (Redis and PostgreSQL both lost state) the ledger log may be gone
    too, and nothing can say which requeue the lost history made: an operator's fence
    (``fence-postgres``) never lets a release not requeued yet go back."""
    settings = reissue_settings(servers, database)
    await run_migrate(settings)
    key = high_key(settings)
    await applied(
        settings, [entry(1_000, "issue", key, "c1")], [entry(2_000, "release", key, "c1")]
    )
    async with cold_at(settings.postgres_dsn) as cold:
        report = await settle(cold, sync, skip_ranges=1)
    assert report is not None and report.releases_settled == {"farmer": 1}
    rows = await fetch(
        settings, "SELECT requeue_discarded FROM kd_released_issues WHERE key = $1", key
    )
    assert [r["requeue_discarded"] for r in rows] == [True]
