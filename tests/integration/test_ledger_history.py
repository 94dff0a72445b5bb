"""The ledger's one history: what it answered holds across a PostgreSQL promotion that
lost ledger transactions (docs/reliability.md, "The ledger's one history").

A promotion is made real as in test_postgres_fence.py: the database is cloned (the
"replica"), the old primary commits more, and the clone takes the database's name.
Each of round 4's three behaviours is reproduced here and must not happen; each
mechanism has its mutant in tests/mutants.py and, where a switch shows the hazard, its
control (the guard off). The same on real streaming replicas, with real processes, is in
tests/acceptance/test_ledger_failover.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keysync.ledger import LedgerDrain
from keysync.main import Keysync
from shared.cli.status import collect_status, format_status, resume_ledger
from shared.domain import outcomes, redis_keys
from shared.domain.apikeys import ANONYMOUS
from shared.domain.config import Settings
from shared.domain.errors import LedgerHalted, StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.tiers import Stamp
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.groups import SyncRecords
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.batch import parse
from shared.stores.ledger.decide import apply
from shared.stores.ledger.reader import LedgerReader
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings
from tests.integration.test_postgres_fence import clone, drop, promote

HIGH_COUNTER = 900_000_000  # far above anything a keygen leases here


def ledger_settings(servers: Servers, database: str, *, reissue: bool, **more: Any) -> Settings:
    types = small_types()
    types["farmer"] |= {"ledger": True, "reissue_released": reissue, "reissue_after_s": 0.3}
    return make_settings(servers, database, id_types=types, **more)


@dataclass
class Ledger:
    """One key group's ledger as keysync and a dispenser see it, on whatever server the
    database's DSN reaches now (a promotion renames the clone in)."""

    settings: Settings
    hot: HotStore
    sync: SyncRecord | None
    stream: LedgerStream
    # The ledger log's retention, given to the drains directly: shorter than the
    # settings allow (the fence's detection time), to show what a short log does.
    retain_s: float = 300

    @property
    def farmer(self) -> IdType:
        return build_id_types(self.settings)["farmer"]

    def drain(self, cold: ColdStore, consumer: str = "keysync-1") -> LedgerDrain:
        types = build_id_types(self.settings)
        guard = GuardedCold(cold, self.sync, types)
        return LedgerDrain(
            self.stream,
            cold,
            types,
            consumer,
            1,  # one entry a batch: each test says which transaction holds which
            guard=guard,
            retain_s=self.retain_s,
            sync=self.sync,
        )

    async def applied(self, consumer: str = "keysync-1") -> LedgerDrain:
        """A drain on the server reached now, run until the stream is empty (the first
        turn fences and restores whatever it must)."""
        async with cold(self.settings) as store:
            drain = self.drain(store, consumer)
            while (
                await drain.drain_once(block_ms=10) is not None
                or await self.stream.backlog() > 0  # (the first read makes the group)
            ):
                pass
            return drain

    async def pop(self, client: str) -> str:
        popped = await self.hot.pop("farmer", 1, [client], ledger=True)
        assert len(popped.keys) == 1
        return popped.keys[0]

    async def change(self, op: str, key: str, client: str) -> str:
        """A status change a client waits for (MOSIP's PUT): its entry."""
        if op == "used":
            return await self.stream.record_used("farmer", [key], client, reply=True)
        return await self.stream.record_released("farmer", [key], client, reply=True)

    async def outcome(self, entry: str) -> str | None:
        return await self.stream.outcome("farmer", entry)

    async def lookup(self, key: str) -> dict[str, Any]:
        records = SyncRecords.single(self.sync) if self.sync is not None else None
        reader = LedgerReader(self.settings.postgres_dsn, records)
        try:
            return await reader.lookup("farmer", key)
        finally:
            await reader.close()

    async def rows(self, query: str, *args: object) -> list[Any]:
        async with cold(self.settings) as store, store.connection() as conn:
            return list(await conn.fetch(sql.for_type(query, "farmer"), *args))


class cold:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store: ColdStore | None = None

    async def __aenter__(self) -> ColdStore:
        self._store = await ColdStore.connect(self._settings.postgres_dsn, min_size=0)
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        assert self._store is not None
        await self._store.close()


@pytest.fixture
async def promotion(servers: Servers, database: str) -> AsyncIterator[PromotionPlan]:
    plan = PromotionPlan(servers, database)
    try:
        yield plan
    finally:
        await drop(servers, f"{database}_old")
        await drop(servers, plan.replica)


@dataclass
class PromotionPlan:
    servers: Servers
    database: str

    @property
    def replica(self) -> str:
        return f"{self.database}_replica"

    async def replica_copies_now(self) -> None:
        """The replica has replayed everything committed so far, and nothing after."""
        await clone(self.servers, self.database, self.replica)

    async def promote(self) -> None:
        await promote(self.servers, self.database, self.replica)


async def ledger_of(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord | None,
    *,
    reissue: bool,
    retain_s: float = 300,
    **more: Any,
) -> Ledger:
    settings = ledger_settings(servers, database, reissue=reissue, **more)
    await run_migrate(settings)
    farmer = build_id_types(settings)["farmer"]
    await hot.push("farmer", farmer.generate(HIGH_COUNTER, HIGH_COUNTER + 100)[0][:1], "b1")
    return Ledger(settings, hot, sync, LedgerStream(hot.endpoint, hot.namespace), retain_s)


async def refill(ledger: Ledger) -> None:
    """keysync's refill on the server reached now (the fence runs here when it must)."""
    types = build_id_types(ledger.settings)
    async with cold(ledger.settings) as store:
        guard = GuardedCold(store, ledger.sync, types)
        await Keysync(ledger.settings, guard, ledger.hot).refill(types["farmer"])


async def requeue(ledger: Ledger) -> dict[str, int]:
    async with cold(ledger.settings) as store:
        return await ledger.drain(store).requeue_released()


# --- 1. A replay revives a release ------------------------------------------------


async def reissued_across_a_promotion(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord | None,
    promotion: PromotionPlan,
) -> tuple[Ledger, str]:
    """A is issued K; the replica copies; A releases K, K is requeued, issued to B, and
    B's PUT ASSIGNED is answered; then the replica is promoted (all that lost)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=True)
    key = await ledger.pop("client-a")
    await ledger.applied()
    await promotion.replica_copies_now()
    released = await ledger.change("release", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(released) == outcomes.UNUSED
    await asyncio.sleep(0.4)  # reissue_after_s
    assert await requeue(ledger) == {"farmer": 1}
    await refill(ledger)
    assert await ledger.pop("client-b") == key
    await ledger.applied()
    assigned = await ledger.change("used", key, "client-b")
    await ledger.applied()
    assert await ledger.outcome(assigned) == outcomes.ASSIGNED
    await promotion.promote()
    return ledger, key


async def test_a_restore_never_revives_a_release(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """Round 4 applied A's release again after the fence had settled releases, dropped
    B's issue as "issued twice" and requeued the key while B held it. The restore
    writes what the lost transactions wrote: B's issue, used; A's release, requeued."""
    ledger, key = await reissued_across_a_promotion(servers, database, hot, sync, promotion)
    drain = await ledger.applied()
    assert drain.restored >= 4  # the release, the requeue, B's issue, B's PUT
    live = await ledger.rows("SELECT client, used_by FROM {ledger} WHERE key = $1", key)
    assert [(r["client"], r["used_by"]) for r in live] == [("client-b", "client-b")]
    past = await ledger.rows(
        "SELECT client, requeued_at FROM kd_released_issues WHERE key = $1", key
    )
    assert [r["client"] for r in past] == ["client-a"] and past[0]["requeued_at"] is not None
    assert await requeue(ledger) == {}  # never requeued again
    await refill(ledger)
    assert key not in (await hot.pop("farmer", 100)).keys
    again = await ledger.change("used", key, "client-b")  # B asks again
    await ledger.applied()
    assert await ledger.outcome(again) == outcomes.ASSIGNED
    looked = await ledger.lookup(key)
    assert looked["client"] == "client-b" and looked["used"] is True


async def test_control_without_the_guard_the_ledger_names_the_wrong_client(
    servers: Servers, database: str, hot: HotStore, promotion: PromotionPlan
) -> None:
    """The hazard: a promotion that lost those transactions, seen by nothing, leaves
    the key under A, who gave it back, while B holds it."""
    ledger, key = await reissued_across_a_promotion(servers, database, hot, None, promotion)
    await ledger.applied()
    live = await ledger.rows("SELECT client FROM {ledger} WHERE key = $1", key)
    assert [r["client"] for r in live] == ["client-a"]


# --- 2. A quiet spell after a promotion ---------------------------------------------


async def test_a_quiet_spell_after_a_promotion_keeps_what_was_answered(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """Round 4 restored only after the next batch, whose acknowledgement first trimmed
    what the restore needed: after a quiet spell longer than the retention the UIN was
    gone and A's PUT refused. Now the fence marks the restore pending, nothing trims the
    log meanwhile, and keysync restores at its next turn, with or without entries."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False, retain_s=1.0)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    assigned = await ledger.change("used", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(assigned) == outcomes.ASSIGNED
    await promotion.promote()
    await refill(ledger)  # keygen or keysync reaches the promoted server: fenced at once
    record = await sync.read()
    assert record.restore_to  # the head the promoted server lacks
    with pytest.raises(StoreUnavailable, match="restored"):
        await ledger.lookup(key)  # never answered from the server before its restore
    await asyncio.sleep(2.0)  # a quiet spell, twice the log's retention
    async with cold(ledger.settings) as store:
        drain = ledger.drain(store)
        assert await drain.drain_once(block_ms=10) is None  # no entry: restored anyway
    assert drain.restored == 2
    looked = await ledger.lookup(key)
    assert looked["client"] == "client-a" and looked["used"] is True
    again = await ledger.change("used", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(again) == outcomes.ASSIGNED


async def test_two_keysyncs_restore_a_promoted_server_once(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """Two keysyncs find the same restore pending at once. Each finds the links the
    server lacks inside its restore's transaction, under the ledger's lock: the second
    finds them held and writes nothing (found before the lock, it wrote every link's
    operations a second time, over what was decided since)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    await ledger.outcome(await ledger.change("used", key, "client-a"))
    await ledger.applied()
    await promotion.promote()
    await refill(ledger)  # fenced: the restore is pending
    async with cold(ledger.settings) as one, cold(ledger.settings) as two:
        drains = [ledger.drain(one, "keysync-1"), ledger.drain(two, "keysync-2")]
        await asyncio.gather(*(drain.drain_once(block_ms=10) for drain in drains))
    assert sorted(drain.restored for drain in drains) == [0, 2]
    looked = await ledger.lookup(key)
    assert looked["client"] == "client-a" and looked["used"] is True


async def test_a_restore_refuses_a_ledger_another_keysync_halted(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """A keysync whose batch was refused runs the restore pending; another keysync's
    restore has meanwhile halted the ledger (a link gone). This one refuses at once: a
    halted ledger waits for an operator, even when what it would restore can be read."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    await ledger.outcome(await ledger.change("used", key, "client-a"))
    await ledger.applied()
    await promotion.promote()
    await refill(ledger)  # fenced: the restore is pending
    target = (await sync.read()).restore_to
    assert target
    await sync.halt_ledger("ledger link x of lane kd is gone from the log")
    async with cold(ledger.settings) as store:
        drain = ledger.drain(store)
        with pytest.raises(LedgerHalted):
            await drain.restore(target)
    assert drain.restored == 0
    with pytest.raises(LedgerHalted):
        await ledger.lookup(key)  # the halt said at once


async def test_a_restore_no_longer_asked_for_writes_nothing_and_never_halts(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """A keysync's restore whose target is pending no more, neither on the server nor in
    the record: another keysync restored it, or a later fence put another in its place
    that was restored since (a server promoted back keeps the mark an earlier fence left
    it; the model's two-keysync world with a second promotion). It writes nothing; it
    walked the log to that target before, found the links the server holds only inside
    a restore's own link, and halted the ledger for nothing."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    assert not (await sync.read()).restore_to
    async with cold(ledger.settings) as store:
        drain = ledger.drain(store)
        assert await drain.restore(str(uuid.uuid4())) == 0  # a link id no one asks for
    assert not (await sync.read()).ledger_halt
    assert (await ledger.lookup(key))["client"] == "client-a"


async def test_a_refused_confirmation_neither_trims_nor_clears_the_restore_pending(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, redis_client: Any
) -> None:
    """A confirmation trims the log to its retention and clears the restore pending only
    when the record accepts its stamp (its link is the restore or follows it, on the
    fenced server's history). A refused one, an old primary's still confirming after the
    fence, leaves both: the restore still needs what the log holds."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False, retain_s=1.0)
    await ledger.pop("client-a")
    await ledger.applied()
    log = redis_keys.ledger_log_key(hot.namespace)
    kept = await redis_client.xlen(log)
    assert kept >= 1
    record_key = redis_keys.sync_record_key(hot.namespace)
    await redis_client.hset(record_key, "restore_from", "a-link-to-restore")
    await asyncio.sleep(1.2)  # older than the retention now
    stamp = await _stamp_of(sync)
    stale = dataclasses.replace(stamp, fork=stamp.fork + 1)  # another server, same timeline
    assert await ledger.stream.confirm_link(stale, {}, [], 1_000) == "stale"
    assert await redis_client.xlen(log) == kept
    assert (await sync.read()).restore_to == "a-link-to-restore"
    assert await ledger.stream.confirm_link(stamp, {}, [], 1_000) == "ok"
    assert await redis_client.xlen(log) < kept
    assert (await sync.read()).restore_to == ""


async def test_a_client_waiting_for_an_outcome_is_woken_by_its_confirmation(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """A PUT waits for its outcome blocked on the confirmations (not a poll): keysync's
    confirmation of the transaction that decided it wakes it, and the outcome is there
    when it looks again. With no confirmation, the wait ends at its timeout."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    mark = await ledger.stream.confirmed_mark("farmer")
    entry = await ledger.change("used", key, "client-a")
    waiting = asyncio.create_task(ledger.stream.wait_confirmed("farmer", mark, 10_000))
    await ledger.applied()  # keysync decides it, commits, confirms
    woken = await asyncio.wait_for(waiting, 10)
    assert woken != mark
    assert await ledger.outcome(entry) == outcomes.ASSIGNED
    assert await ledger.stream.wait_confirmed("farmer", woken, 20) == woken


async def _stamp_of(sync: SyncRecord) -> Stamp:
    """A stamp of the record as it is (recording it moves nothing)."""
    record = await sync.read()
    heads = ((sync.namespace, record.head),)
    return Stamp(record.timeline, record.fork, record.clock, record.database, 0, heads)


# --- 3. Two keysyncs: a replay reverses a decision -----------------------------------


async def pair_across_a_promotion(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord | None,
    promotion: PromotionPlan,
) -> tuple[Ledger, str, str, str]:
    """A's PUT ASSIGNED and PUT UNASSIGNED of one UIN, sent together, each in another
    keysync's batch; the later entry's batch commits first. Then a promotion loses both.
    (ledger, key, the assign's entry, the release's entry)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    await promotion.replica_copies_now()
    assign = await ledger.change("used", key, "client-a")
    release = await ledger.change("release", key, "client-a")
    async with cold(ledger.settings) as one, cold(ledger.settings) as two:
        second = ledger.drain(two, "keysync-2")
        await ledger.stream.beat("keysync-3")  # alive: nobody takes what it holds
        held = await ledger.stream.read("keysync-3", 1, 10, 60_000)  # holds the assign
        assert [entry for entry, _ in held] == [assign]
        assert (await second.drain_once(block_ms=10)) is not None  # the release, first
        third = ledger.drain(one, "keysync-3")
        assert (await third.drain_once(block_ms=10)) is not None  # its own: the assign
    assert await ledger.outcome(release) == outcomes.UNASSIGNED
    assert await ledger.outcome(assign) == outcomes.NOT_ISSUED
    await promotion.promote()
    return ledger, key, assign, release


async def test_two_keysyncs_a_restore_never_reverses_a_decision(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """Round 4's replay decided both again, in stream order: the assign first, the
    opposite of what was answered. The restore writes them in commit order, as written."""
    ledger, key, _, _ = await pair_across_a_promotion(servers, database, hot, sync, promotion)
    await ledger.applied()
    looked = await ledger.lookup(key)
    assert looked["released"] is True and looked["used"] is False
    again = await ledger.change("release", key, "client-a")  # the answered one, again
    refused = await ledger.change("used", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(again) == outcomes.UNASSIGNED
    assert await ledger.outcome(refused) == outcomes.NOT_ISSUED


async def test_control_without_the_guard_a_repeated_put_gets_the_opposite(
    servers: Servers, database: str, hot: HotStore, promotion: PromotionPlan
) -> None:
    ledger, key, _, _ = await pair_across_a_promotion(servers, database, hot, None, promotion)
    assigned = await ledger.change("used", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(assigned) == outcomes.ASSIGNED  # the release was answered


# --- two promotions in a row -------------------------------------------------------


async def test_a_second_promotion_keeps_the_restore_the_first_one_found_needed(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """A keysync reads A's repeated PUT ASSIGNED, then two replicas are promoted one
    after the other (the second never saw the first one's fence), each fenced by another
    process. The second fence leaves pending on its server the restore the first found
    needed (the record's ``restore_to``; the record's head is by then the first
    fenced server's own, which the second holds): the keysync's transaction waits for
    that restore instead of deciding the repeat on a history lacking the UIN's issue
    ("not found" after A was answered ASSIGNED)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    other = ledger.farmer.generate(HIGH_COUNTER + 100, HIGH_COUNTER + 200)[0][:1]
    await hot.push("farmer", other, "b2")
    await ledger.pop("client-b")  # a link both replicas hold
    await ledger.applied()
    second = f"{database}_replica2"
    await promotion.replica_copies_now()
    await clone(servers, database, second)  # the cascaded replica, as far behind
    try:
        key = await ledger.pop("client-a")
        assigned = await ledger.change("used", key, "client-a")
        await ledger.applied()
        assert await ledger.outcome(assigned) == outcomes.ASSIGNED
        repeat = await ledger.change("used", key, "client-a")
        # The keysync that read the repeat (its turn's look at the record is behind it).
        entries = await ledger.stream.read("keysync-1", 10, 10, 30_000)
        assert [entry for entry, _ in entries] == [repeat]
        batch = parse(entries, build_id_types(ledger.settings))
        await promotion.promote()
        await refill(ledger)  # another process reaches the promoted server: fenced
        assert (await sync.read()).restore_to
        await promote(servers, database, second)  # the next replica, behind that fence
        await refill(ledger)  # fenced in turn
        async with cold(ledger.settings) as store:
            stale = ledger.drain(store)
            await stale._transact(lambda conn: apply(conn, batch), [repeat])
        assert await ledger.outcome(repeat) == outcomes.ASSIGNED  # as first answered
        looked = await ledger.lookup(key)
        assert looked["client"] == "client-a" and looked["used"] is True
    finally:
        await drop(servers, second)


async def test_a_promotion_back_to_an_earlier_fence_restores_what_was_answered_since(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    """A is issued a UIN; a replica lacking it is promoted and fenced (the issue's
    restore left pending on it), and a second replica copies it there. The restore is
    done and A's PUT ASSIGNED answered. Then the second replica (which holds the fence's
    pending restore, not the restore nor the PUT) is promoted: its fence restores up to
    the record's head, past the restore it had pending; keeping that one would bring the
    issue back, not the answered ASSIGNED."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    await ledger.applied()
    await promotion.promote()
    await refill(ledger)  # another process reaches the promoted server: fenced
    assert (await sync.read()).restore_to
    second = f"{database}_replica2"
    await clone(servers, database, second)  # the fence committed, its restore not yet
    try:
        await ledger.applied()  # keysync restores the issue, here
        assigned = await ledger.change("used", key, "client-a")
        await ledger.applied()
        assert await ledger.outcome(assigned) == outcomes.ASSIGNED
        await promote(servers, database, second)
        await ledger.applied()  # fenced, then restored up to the record's head
        looked = await ledger.lookup(key)
        assert looked["client"] == "client-a" and looked["used"] is True
    finally:
        await drop(servers, second)


# --- decisions, lookups, halts ------------------------------------------------------


async def test_an_entry_applied_again_keeps_its_first_outcome(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """A release decided (UNUSED) is applied again after its key went back and was
    issued to the same client anew (an entry left pending by a keysync that died after
    its commit): decided again it would be refused; its outcome stays the first."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=True)
    key = await ledger.pop("client-a")
    release = await ledger.change("release", key, "client-a")
    await ledger.applied()
    await asyncio.sleep(0.4)  # reissue_after_s
    assert await requeue(ledger) == {"farmer": 1}
    await refill(ledger)
    assert await ledger.pop("client-a") == key  # issued anew, to A
    await ledger.applied()
    fields = {"op": "release", "type": "farmer", "keys": key, "clients": "client-a", "reply": "1"}
    batch = parse([(release, fields)], build_id_types(ledger.settings))
    async with cold(ledger.settings) as store, store.connection() as conn, conn.transaction():
        again = await apply(conn, batch)
    assert again.outcomes == {release: outcomes.UNUSED}
    live = await ledger.rows("SELECT released_at FROM {ledger} WHERE key = $1", key)
    assert [r["released_at"] for r in live] == [None]  # the new issue is untouched


async def test_a_lookup_waits_for_the_restore_and_never_reads_a_server_behind(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, promotion: PromotionPlan
) -> None:
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    await ledger.applied()
    assert (await ledger.lookup(key))["issued"] is True
    await promotion.promote()
    with pytest.raises(StoreUnavailable):
        await ledger.lookup(key)  # promoted, not fenced yet: its history is behind
    await ledger.applied()  # keysync's turn: fence, restore
    assert (await ledger.lookup(key))["client"] == "client-a"


async def halted_ledger(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord,
    redis_client: Any,
    promotion: PromotionPlan,
    **more: Any,
) -> tuple[Ledger, str]:
    """A promotion whose lost link the log no longer holds (Redis restarted from an
    older snapshot, or the promotion lagged longer than the retention): the ledger
    halts rather than decide without it. (ledger, the key issued in the lost link)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False, **more)
    await promotion.replica_copies_now()
    key = await ledger.pop("client-a")
    await ledger.applied()
    await redis_client.delete(redis_keys.ledger_log_key(hot.namespace))
    await promotion.promote()
    with pytest.raises(LedgerHalted):
        await ledger.applied()
    assert "gone from the log" in (await sync.read()).ledger_halt
    return ledger, key


async def test_a_restore_missing_a_link_halts_the_ledger_until_an_operator_resumes(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord,
    redis_client: Any,
    promotion: PromotionPlan,
    tmp_path: Path,
) -> None:
    """The ledger halts rather than decide without the lost link; keys are still
    served, and an operator accepts the loss."""
    ledger, key = await halted_ledger(servers, database, hot, sync, redis_client, promotion)
    with pytest.raises(LedgerHalted, match="halted: ledger history lost"):
        await ledger.lookup(key)
    shown = format_status(await collect_status(ledger.settings))
    assert f"ledger ({hot.namespace}): HALTED: halted: ledger history lost" in shown
    assert "gone from the log" in shown and "ledger-resume" in shown
    listed = tmp_path / "quarantined.csv"
    resumed = await resume_ledger(ledger.settings, listed)  # `ledger-resume --accept-loss`
    assert resumed["quarantine_file"] == str(listed) and listed.read_text().startswith(
        "id_type,key\n"
    )
    assert set(resumed["resumed"]) == {hot.namespace}
    await ledger.applied()
    assert (await ledger.lookup(key))["issued"] is False  # lost, and said so


# MOSIP's PUT waiting up to 30 s for keysync: a halt must be said long before.
HALT_WAIT_S = 30.0
MOSIP_WAITING = {"mosip": {"uin": "farmer", "ledger_wait_s": HALT_WAIT_S}}


async def put_and_look_up_while_halted(ledger: Any, key: str) -> tuple[dict[str, Any], Any]:
    """A MOSIP PUT ASSIGNED of ``key`` and a lookup of it, over HTTP; asserts the PUT's
    answer came at once (before ``ledger_wait_s``) as KER-UIG-005 with Retry-After 60.
    (the PUT's error, the lookup's response)."""
    async with dispenser_over_http(ledger.settings) as http:
        started = time.monotonic()
        body = {"id": "mosip.kernel.uinservice", "version": "1.0"}
        put = await http.put(
            "/v1/idgenerator/uin", json=body | {"request": {"uin": key, "status": "ASSIGNED"}}
        )
        looked = await http.get(f"/v1/keys/farmer/{key}")
        answered_s = time.monotonic() - started
    assert answered_s < HALT_WAIT_S  # answered before ledger_wait_s elapsed
    assert put.status_code == 200 and put.headers["Retry-After"] == "60"
    (error,) = put.json()["errors"]
    assert error["errorCode"] == "KER-UIG-005"
    return error, looked


async def test_a_halted_ledger_says_so_at_once_to_puts_and_lookups(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord,
    redis_client: Any,
    promotion: PromotionPlan,
) -> None:
    """While the ledger is halted, MOSIP's PUT and a lookup answer at once why (the
    halt, its reason, the runbook's section), not "behind" after ``ledger_wait_s``."""
    ledger, key = await halted_ledger(
        servers, database, hot, sync, redis_client, promotion, dispenser=MOSIP_WAITING
    )
    error, looked = await put_and_look_up_while_halted(ledger, key)
    for message in (error["message"], looked.json()["errors"][0]["message"]):
        assert message.startswith("halted: ledger history lost (")
        assert "gone from the log" in message and '"KdLedgerHalted"' in message
    assert looked.status_code == 503 and looked.json()["errors"][0]["errorCode"] == "IDG-017"


async def test_a_fence_halt_is_said_at_once_to_puts_and_lookups(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """Redis and PostgreSQL both lost state (the fence halted leases and syncs): the
    ledger's history cannot be judged, and MOSIP's PUT and a lookup say so at once
    (IDG-019, the operator's command), not "being restored" or "behind"."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False, dispenser=MOSIP_WAITING)
    key = await ledger.pop("client-a")
    await ledger.applied()
    await sync.halt("redis and postgres both lost state; postgres forked")
    error, looked = await put_and_look_up_while_halted(ledger, key)
    assert looked.status_code == 503 and looked.headers["Retry-After"] == "60"
    assert looked.json()["errors"][0]["errorCode"] == "IDG-019"
    for message in (error["message"], looked.json()["errors"][0]["message"]):
        assert message.startswith("leases and syncs halted: redis and postgres both lost")
        assert "fence-postgres" in message


async def test_accepting_a_loss_quarantines_what_it_cannot_vouch_for(
    servers: Servers,
    database: str,
    hot: HotStore,
    sync: SyncRecord,
    redis_client: Any,
    promotion: PromotionPlan,
    tmp_path: Path,
) -> None:
    """(A: the anonymous client, as the dispenser over HTTP sees it without API keys.)
    A's PUT ASSIGNED was answered, then lost with a link the log no longer holds: the
    promoted server has the UIN issued and unused. Accepting the loss quarantines it,
    and a UIN A gave back that was not requeued yet (listed in the file), so A's
    release is refused (not given back and issued to another client while A uses it),
    a release recorded anyway is never requeued, and neither key is handed out; a mark
    of use still stands."""
    mosip = {"mosip": {"uin": "farmer", "ledger_wait_s": 30}}
    ledger = await ledger_of(servers, database, hot, sync, reissue=True, dispenser=mosip)
    await hot.push(
        "farmer", ledger.farmer.generate(HIGH_COUNTER + 100, HIGH_COUNTER + 200)[0][:1], "b2"
    )
    key, given_back = await ledger.pop(ANONYMOUS), await ledger.pop(ANONYMOUS)
    released = await ledger.change("release", given_back, ANONYMOUS)
    await ledger.applied()
    assert await ledger.outcome(released) == outcomes.UNUSED  # not requeued yet
    await promotion.replica_copies_now()
    assigned = await ledger.change("used", key, ANONYMOUS)
    await ledger.applied()
    assert await ledger.outcome(assigned) == outcomes.ASSIGNED
    await redis_client.delete(redis_keys.ledger_log_key(hot.namespace))
    await promotion.promote()
    with pytest.raises(LedgerHalted):
        await ledger.applied()
    listed = tmp_path / "quarantined.csv"
    resumed = await resume_ledger(ledger.settings, listed)
    assert resumed["quarantined"] == 2 and resumed["quarantine_file"] == str(listed)
    assert resumed["resumed"][hot.namespace]["quarantined"] == {"farmer": 2}
    assert (await collect_status(ledger.settings))["ledger_quarantined"] == {"farmer": 2}
    header, *lines = listed.read_text().splitlines()
    assert header == "id_type,key" and sorted(lines) == sorted(
        f"farmer,{k}" for k in (key, given_back)
    )
    async with dispenser_over_http(ledger.settings) as http:
        request = {"id": "mosip.kernel.uinservice", "version": "1.0"}
        put = asyncio.create_task(
            http.put(
                "/v1/idgenerator/uin",
                json=request | {"request": {"uin": key, "status": "UNASSIGNED"}},
            )
        )
        while not put.done():
            await ledger.applied()
            await asyncio.sleep(0.01)
    (error,) = (await put).json()["errors"]
    assert error["errorCode"] == "IDG-018" and "quarantined" in error["message"]
    await asyncio.sleep(0.4)  # reissue_after_s
    assert await requeue(ledger) == {}
    await ledger.rows(  # a release recorded anyway (an earlier version's keysync)
        "INSERT INTO kd_released_issues (id_type, key, issued_at, client, entry_id, "
        "released_at, released_by, recorded_at) VALUES ('farmer', $1, now(), '-', "
        "'1-1', now(), '-', now() - interval '1 hour')",
        given_back,
    )
    assert await requeue(ledger) == {}  # never requeued
    await refill(ledger)
    popped = (await hot.pop("farmer", 100)).keys
    assert key not in popped and given_back not in popped
    again = await ledger.change("used", key, ANONYMOUS)  # its holder keeps it
    await ledger.applied()
    assert await ledger.outcome(again) == outcomes.ASSIGNED


async def test_a_quarantined_key_of_a_type_never_reissuing_is_not_released(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """A type that never issues a key again: a quarantined key's release is refused
    too (the ledger never says "given back" of a key whose use may have been lost)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    await ledger.rows(
        "INSERT INTO kd_quarantined_keys (id_type, key, reason) VALUES ('farmer', $1, 't')", key
    )
    released = await ledger.change("release", key, "client-a")
    await ledger.applied()
    assert await ledger.outcome(released) == outcomes.QUARANTINED
    live = await ledger.rows("SELECT released_at FROM {ledger} WHERE key = $1", key)
    assert [r["released_at"] for r in live] == [None]


async def test_a_lookup_answers_its_snapshot_once_the_record_covers_it(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord, redis_client: Any
) -> None:
    """A read waits for the record to cover the commit its snapshot saw (a commit whose
    stamp is being recorded), and no longer: a later commit, also in flight by then,
    does not make it wait again (a ledger written steadily is still read). A commit the
    record never covers is never answered from."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    record_key = redis_keys.sync_record_key(hot.namespace)
    clock = int(await redis_client.hget(record_key, "clock"))

    async def commit_in_flight() -> None:  # what a guarded commit does before its stamp
        await ledger.rows("UPDATE kd_sync_clock SET clock = clock + 1 WHERE id = 1")

    await commit_in_flight()
    with pytest.raises(StoreUnavailable, match="not recorded yet"):
        await ledger.lookup(key)  # the record never covers it

    async def recorded_while_the_next_commits() -> None:
        await asyncio.sleep(0.3)
        await redis_client.hset(record_key, "clock", clock + 1)
        await commit_in_flight()

    found, _ = await asyncio.gather(ledger.lookup(key), recorded_while_the_next_commits())
    assert found["client"] == "client-a"


async def test_a_refill_from_an_empty_cold_table_leaves_lookups_answered(
    servers: Servers, database: str, hot: HotStore, sync: SyncRecord
) -> None:
    """keysync's refill of a type whose cold table is empty commits nothing: no step of
    the sync clock that no record will ever cover (a lookup would wait for one until
    the ledger's next write, and answer 503 on a quiet ledger)."""
    ledger = await ledger_of(servers, database, hot, sync, reissue=False)
    key = await ledger.pop("client-a")
    await ledger.applied()
    clock = await ledger.rows("SELECT clock FROM kd_sync_clock WHERE id = 1")
    await refill(ledger)  # the cold table is empty: nothing taken
    assert await ledger.rows("SELECT clock FROM kd_sync_clock WHERE id = 1") == clock
    assert (await ledger.lookup(key))["client"] == "client-a"
