"""Each in-memory adapter behaves like the real adapter it stands for.

The unit tests of the processes' logic run on ``shared.stores.memory``; what they prove
holds of the real processes only if the fakes keep the ports' contracts as the real
stores do. The same cases run here against both: the hot tier as dispensers and
keysync see it (``MemoryHot`` and ``HotStore`` on Redis), the cold tier as keygen and
keysync see it (``MemoryCold`` and ``ColdStore`` with ``GuardedCold`` on PostgreSQL),
and the ledger as dispensers write and read it (``MemoryLedger``, and on the servers
the stream, keysync's drain into PostgreSQL and the lookups).
The faults the real stores guard against (a new primary, a fork) are not part of the
contract a fake keeps: their own tests prove them on real servers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
import redis.asyncio as aioredis

from keysync.ledger import LedgerDrain
from shared.domain.config import Settings
from shared.domain.errors import IdempotencyMismatch, KeydispenserError
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.ports import (
    ColdInventory,
    HotLists,
    HotPool,
    KeyInventory,
    LedgerLookup,
    LedgerWrites,
    RangeLeases,
)
from shared.domain.tiers import KeyStatus, Pushed
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.reader import LedgerReader
from shared.stores.ledger.stream import LedgerStream
from shared.stores.memory import MemoryCold, MemoryHot, MemoryLedger
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings

KINDS = ["memory", "real"]


class HotTier(HotPool, HotLists, Protocol):
    """Both views of the hot tier (one adapter serves both; mypy checks each does)."""


@dataclass
class ColdTier:
    leases: RangeLeases
    inventory: KeyInventory
    takes: ColdInventory


@pytest.fixture
def settings(servers: Servers, database: str) -> Settings:
    return make_settings(servers, database)


@pytest.fixture
def farmer(settings: Settings) -> IdType:
    return build_id_types(settings)["farmer"]


@pytest.fixture(params=KINDS)
async def hot_tier(
    request: pytest.FixtureRequest, hot: HotStore, redis_client: aioredis.Redis
) -> AsyncIterator[HotTier]:
    tier: HotTier = MemoryHot() if request.param == "memory" else hot
    yield tier


@pytest.fixture(params=KINDS)
async def cold_tier(
    request: pytest.FixtureRequest, settings: Settings, sync: SyncRecord
) -> AsyncIterator[ColdTier]:
    if request.param == "memory":
        memory = MemoryCold()
        yield ColdTier(memory, memory, memory)
        return
    cold = await ColdStore.connect(settings.postgres_dsn)
    guarded = GuardedCold(cold, sync, build_id_types(settings))
    try:
        yield ColdTier(guarded, cold, guarded)
    finally:
        await cold.close()


async def push(tier: HotLists, keys: list[str], **options: Any) -> Pushed:
    return await tier.push("farmer", keys, uuid.uuid4().hex, **options)


# --- the hot tier ------------------------------------------------------------------


async def test_keys_pushed_are_popped_once_in_order(hot_tier: HotTier) -> None:
    pushed = await push(hot_tier, ["k1", "k2", "k3"])
    assert (pushed.status, pushed.length) == ("pushed", 3)
    assert (await hot_tier.observe("farmer")).length == 3
    first = await hot_tier.pop("farmer", 2)
    assert (first.keys, first.remaining, first.exhausted) == (["k1", "k2"], 1, False)
    rest = await hot_tier.pop("farmer", 5)
    assert (rest.keys, rest.remaining) == (["k3"], 0)
    none = await hot_tier.pop("farmer", 1)
    assert (none.keys, none.exhausted) == ([], False)
    assert await hot_tier.depth("farmer") == 0


async def test_a_batch_is_appended_once_whatever_its_retries(hot_tier: HotTier) -> None:
    batch = uuid.uuid4().hex
    assert (await hot_tier.push("farmer", ["a", "b"], batch)).status == "pushed"
    again = await hot_tier.push("farmer", ["a", "b"], batch)
    assert (again.status, again.length) == ("duplicate", 2)
    assert await hot_tier.depth("farmer") == 2


async def test_a_push_pinned_to_another_server_or_past_its_deadline_appends_nothing(
    hot_tier: HotTier,
) -> None:
    token = (await hot_tier.observe("farmer")).token
    assert (await push(hot_tier, ["a"], pin=token)).status == "pushed"
    assert (await push(hot_tier, ["b"], pin="another:server")).status == "refused"
    past = await hot_tier.server_time_ms() - 1
    assert (await push(hot_tier, ["c"], not_after_ms=past)).status == "expired"
    assert (await hot_tier.pop("farmer", 10)).keys == ["a"]


async def test_an_exhausted_type_says_so_once_its_list_is_empty(hot_tier: HotTier) -> None:
    await push(hot_tier, ["last"])
    await hot_tier.mark_exhausted("farmer")
    assert (await hot_tier.pop("farmer", 1)).keys == ["last"]
    empty = await hot_tier.pop("farmer", 1)
    assert (empty.keys, empty.exhausted) == ([], True)
    assert await hot_tier.exhausted("farmer")


async def test_an_idempotency_key_replays_its_keys_to_its_client_only(hot_tier: HotTier) -> None:
    await push(hot_tier, [f"k{i}" for i in range(6)])
    first = await hot_tier.pop_once("farmer", 2, "once-1", 60, "registry")
    again = await hot_tier.pop_once("farmer", 2, "once-1", 60, "registry")
    assert (again.keys, again.replayed) == (first.keys, True) and not first.replayed
    other = await hot_tier.pop_once("farmer", 2, "once-1", 60, "another")
    assert set(other.keys).isdisjoint(first.keys) and not other.replayed
    with pytest.raises(IdempotencyMismatch):
        await hot_tier.pop_once("farmer", 3, "once-1", 60, "registry")
    assert await hot_tier.depth("farmer") == 2


# --- the cold tier -----------------------------------------------------------------


async def test_ranges_are_leased_once_each_and_counted(cold_tier: ColdTier, farmer: IdType) -> None:
    first = await cold_tier.leases.lease_range(farmer, "keygen-a")
    second = await cold_tier.leases.lease_range(farmer, "keygen-b")
    assert first.stop - first.start == farmer.config.range_size
    assert second.start >= first.stop  # disjoint
    state = await cold_tier.inventory.sequence_state(farmer)
    assert state.leased_counters == 2 * farmer.config.range_size
    assert state.headroom == farmer.config.counter_share - state.leased_counters


async def filled(cold_tier: ColdTier, farmer: IdType, count: int) -> set[str]:
    leased = await cold_tier.leases.lease_range(farmer, "keygen")
    keys = [f"{leased.start + i:010d}" for i in range(count)]
    await cold_tier.inventory.insert_keys(farmer, leased, keys, count, final=False)
    return set(keys)


async def test_a_take_leaves_the_cold_tier_only_once_committed(
    cold_tier: ColdTier, farmer: IdType
) -> None:
    stored = await filled(cold_tier, farmer, 50)
    assert await cold_tier.inventory.depth("farmer", 1_000) == 50
    assert await cold_tier.inventory.depth("farmer", 10) == 10  # capped
    rolled = await cold_tier.takes.begin_take("farmer", 20)
    assert len(rolled.keys) == 20 and set(rolled.keys) <= stored
    await rolled.rollback()
    assert await cold_tier.inventory.depth("farmer", 1_000) == 50
    taken = await cold_tier.takes.begin_take("farmer", 20)
    await taken.commit()
    with pytest.raises(KeydispenserError):
        await taken.commit()  # a transaction ends once
    await taken.rollback()  # and a rollback after it changes nothing
    assert await cold_tier.inventory.depth("farmer", 1_000) == 30
    rest = await cold_tier.takes.begin_take("farmer", 100)
    await rest.commit()
    assert set(rest.keys) | set(taken.keys) == stored
    empty = await cold_tier.takes.begin_take("farmer", 10)
    await empty.commit()
    assert empty.keys == []


async def test_a_take_begun_while_another_is_open_never_shares_a_key(
    cold_tier: ColdTier, farmer: IdType
) -> None:
    """On PostgreSQL the second take waits for the first to end (the sync clock's row
    lock; begun one after the other in one task they would wait for the first's idle
    limit); in memory it does not wait. Either way no key is in both."""
    await filled(cold_tier, farmer, 30)
    first = await cold_tier.takes.begin_take("farmer", 20)
    later = asyncio.ensure_future(cold_tier.takes.begin_take("farmer", 20))
    await asyncio.sleep(0.2)
    await first.commit()
    second = await asyncio.wait_for(later, 10)
    await second.commit()
    assert set(first.keys).isdisjoint(second.keys)
    assert len(first.keys) + len(second.keys) == 30


# --- the ledger ----------------------------------------------------------------------

HIGH_COUNTER = 900_000_000  # far above any range a test's keygen leases


@dataclass
class LedgerTier:
    """The ledger as the dispenser sees it: pops that issue (``hot``), the writes and the
    lookups; ``settle`` waits until what was written is applied (keysync's drain on
    PostgreSQL, nothing in memory)."""

    hot: HotTier
    writes: LedgerWrites
    lookup: LedgerLookup
    settle: Callable[[], Awaitable[None]]
    keys: dict[str, list[str]]  # well-formed keys of each type, to push


@pytest.fixture(params=KINDS)
async def ledger_tier(
    request: pytest.FixtureRequest, servers: Servers, database: str, hot: HotStore
) -> AsyncIterator[LedgerTier]:
    """``shortlink`` keeps a ledger; ``farmer`` keeps one and takes released keys back."""
    types = small_types()
    types["shortlink"]["ledger"] = True
    types["farmer"] |= {"ledger": True, "reissue_released": True, "reissue_after_s": 3_600}
    settings = make_settings(servers, database, id_types=types)
    built = build_id_types(settings)
    farmer_keys = built["farmer"].generate(HIGH_COUNTER, HIGH_COUNTER + 60)[0]
    keys = {"shortlink": [f"L{i:06d}" for i in range(20)], "farmer": farmer_keys[:20]}
    if request.param == "memory":
        memory = MemoryHot()
        ledger = MemoryLedger(memory, reissue={"farmer"})

        async def nothing() -> None:
            return None

        yield LedgerTier(memory, ledger, ledger, nothing, keys)
        return
    await run_migrate(settings)
    stream = LedgerStream(hot.endpoint, hot.namespace)
    cold = await ColdStore.connect(settings.postgres_dsn)
    drain = LedgerDrain(stream, cold, built, "conformance", 1_000)
    reader = LedgerReader(settings.postgres_dsn)

    async def drained() -> None:
        while await drain.drain_once(block_ms=10) is not None:
            pass

    await drained()  # creates the consumer group
    try:
        yield LedgerTier(hot, stream, reader, drained, keys)
    finally:
        await reader.close()
        await cold.close()


async def issued(tier: LedgerTier, name: str, client: str, count: int = 1) -> list[str]:
    await tier.hot.push(name, tier.keys[name], uuid.uuid4().hex)
    popped = await tier.hot.pop(name, count, (client,), True)
    await tier.settle()
    return popped.keys


async def test_a_key_never_issued_is_unknown(ledger_tier: LedgerTier) -> None:
    assert await ledger_tier.lookup.status("shortlink", "L999999") == KeyStatus("unknown")
    found = await ledger_tier.lookup.lookup("shortlink", "L999999")
    assert (found["issued"], found["used"]) == (False, False)


async def test_an_issue_is_recorded_to_its_client_under_its_idempotency_key(
    ledger_tier: LedgerTier,
) -> None:
    (plain,) = await issued(ledger_tier, "shortlink", "registry")
    once = await ledger_tier.hot.pop_once("shortlink", 1, "once-1", 60, "registry", True)
    await ledger_tier.settle()
    assert await ledger_tier.lookup.status("shortlink", plain) == KeyStatus("issued", "registry")
    (key,) = once.keys
    status = await ledger_tier.lookup.status("shortlink", key)
    assert status == KeyStatus("issued", "registry", idempotency_key="once-1")
    found = await ledger_tier.lookup.lookup("shortlink", key)
    assert set(found) == set(LOOKUP_FIELDS)
    assert (found["issued"], found["client"], found["used"], found["released"]) == (
        True,
        "registry",
        False,
        False,
    )


LOOKUP_FIELDS = (
    *("id_type", "key", "issued", "issued_at", "client", "idempotency_key"),
    *("used", "used_at", "used_by", "released", "released_at", "released_by"),
)


async def test_only_its_client_or_a_ledger_admin_marks_a_key_used_and_the_first_mark_wins(
    ledger_tier: LedgerTier,
) -> None:
    mine, theirs = await issued(ledger_tier, "shortlink", "registry", 2)
    writes = ledger_tier.writes
    await writes.record_used("shortlink", [mine], "another")
    entry = await writes.record_used("shortlink", [theirs], "auditor", admin=True)
    await ledger_tier.settle()
    assert await writes.applied("shortlink", entry)
    assert await ledger_tier.lookup.status("shortlink", mine) == KeyStatus("issued", "registry")
    found = await ledger_tier.lookup.lookup("shortlink", theirs)
    assert (found["used"], found["used_by"]) == (True, "auditor")
    await writes.record_used("shortlink", [mine], "registry")
    await writes.record_used("shortlink", [mine], "auditor", admin=True)  # too late
    await ledger_tier.settle()
    found = await ledger_tier.lookup.lookup("shortlink", mine)
    assert (found["used"], found["used_by"], found["released"]) == (True, "registry", False)
    assert await ledger_tier.lookup.status("shortlink", mine) == KeyStatus("assigned", "registry")


async def test_a_released_key_is_never_marked_used_after_and_its_idempotency_record_is_gone(
    ledger_tier: LedgerTier,
) -> None:
    await ledger_tier.hot.push("shortlink", ledger_tier.keys["shortlink"], uuid.uuid4().hex)
    once = await ledger_tier.hot.pop_once("shortlink", 1, "once-2", 60, "registry", True)
    await ledger_tier.settle()
    (key,) = once.keys
    writes = ledger_tier.writes
    await writes.record_released("shortlink", [key], "another")  # not theirs: nothing
    await ledger_tier.settle()
    held = KeyStatus("issued", "registry", idempotency_key="once-2")
    assert await ledger_tier.lookup.status("shortlink", key) == held
    await writes.record_released("shortlink", [key], "registry", forget=[("registry", "once-2")])
    await writes.record_used("shortlink", [key], "registry")
    await ledger_tier.settle()
    found = await ledger_tier.lookup.lookup("shortlink", key)
    assert (found["released"], found["released_by"], found["used"]) == (True, "registry", False)
    assert await ledger_tier.lookup.status("shortlink", key) == KeyStatus("released", "registry")
    again = await ledger_tier.hot.pop_once("shortlink", 1, "once-2", 60, "registry", True)
    assert not again.replayed and again.keys != [key]


async def test_a_released_key_of_a_type_that_reissues_leaves_the_ledger_for_its_history(
    ledger_tier: LedgerTier,
) -> None:
    (key,) = await issued(ledger_tier, "farmer", "registry")
    await ledger_tier.writes.record_released("farmer", [key], "registry")
    await ledger_tier.settle()
    status = await ledger_tier.lookup.status("farmer", key)
    assert status == KeyStatus("released", "registry", reissued=True)
    assert (await ledger_tier.lookup.lookup("farmer", key))["issued"] is False
