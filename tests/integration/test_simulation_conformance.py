"""The simulation's servers behave as the real ones, on the histories the simulation
plays (ops/keydispenser_ops/simulation: fake_postgres.py, fake_redis.py).

The same ledger history runs twice, through the service's own stores and processes
(keysync's refill and ledger drain, the hot store's pops, MOSIP's status changes, the
ledger's lookups): once on the real PostgreSQL and Redis, once on the simulation's
PostgreSQL (``SimPostgres``) and Redis (fakeredis running the service's Lua). After
every step, what the service saw (outcomes, lookups, what a drain restored) and what
the servers hold (the ledger's issue and release rows, the cold table, the hot list,
the stream's backlog) must be the same on both. The histories include a promotion that
loses ledger transactions (the fence and the restore), and a requeue of a released key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from keydispenser_ops.simulation import world as sim_world
from keydispenser_ops.simulation.fake_postgres import Commit, SimPostgres, cold_store
from keydispenser_ops.simulation.fake_redis import SimRedis, endpoint
from keysync.ledger import LedgerDrain
from keysync.main import Keysync
from shared.domain import outcomes
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.groups import SyncRecords
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.reader import LedgerReader
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from shared.stores.redis.endpoint import RedisEndpoint
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_postgres_fence import clone, drop, promote

TYPE, KEY = sim_world.TYPE, sim_world.KEY
TIMES = ("issued_at", "used_at", "released_at", "requeued_at")


class Side(Protocol):
    settings: Settings
    hot: HotStore
    stream: LedgerStream
    sync: SyncRecord

    def cold(self) -> contextlib.AbstractAsyncContextManager[ColdStore]: ...
    async def mark(self) -> None: ...
    async def promote(self) -> None: ...
    async def tables(self) -> dict[str, Any]: ...
    def reader(self) -> LedgerReader: ...


@dataclass
class Real:
    servers: Servers
    database: str
    settings: Settings
    hot: HotStore
    stream: LedgerStream
    sync: SyncRecord

    @contextlib.asynccontextmanager
    async def cold(self) -> AsyncIterator[ColdStore]:
        store = await ColdStore.connect(self.settings.postgres_dsn)
        try:
            yield store
        finally:
            await store.close()

    async def mark(self) -> None:
        await clone(self.servers, self.database, f"{self.database}_replica")

    async def promote(self) -> None:
        await promote(self.servers, self.database, f"{self.database}_replica")

    async def tables(self) -> dict[str, Any]:
        async with self.cold() as store, store.connection() as conn:
            issues = await conn.fetch(sql.for_type("SELECT * FROM {ledger}", TYPE))
            released = await conn.fetch("SELECT * FROM kd_released_issues WHERE id_type = $1", TYPE)
            cold = await conn.fetch(sql.for_type("SELECT key FROM {cold}", TYPE))
        return {
            "issues": sorted(_row(r) for r in issues),
            "released": sorted(_row(r) for r in released),
            "cold": sorted(r["key"] for r in cold),
        }

    def reader(self) -> LedgerReader:
        return LedgerReader(self.settings.postgres_dsn, SyncRecords.single(self.sync))


@dataclass
class Simulated:
    settings: Settings
    postgres: SimPostgres
    hot: HotStore
    stream: LedgerStream
    sync: SyncRecord
    marked: Commit | None = None

    @contextlib.asynccontextmanager
    async def cold(self) -> AsyncIterator[ColdStore]:
        yield cold_store(self.postgres, lambda: "conformance")

    async def mark(self) -> None:
        self.marked = self.postgres.head

    async def promote(self) -> None:
        assert self.marked is not None
        self.postgres.promote(self.marked)

    async def tables(self) -> dict[str, Any]:
        t = self.postgres.head.tables
        return {
            "issues": sorted(_row(r) for r in t.ledger.get(TYPE, {}).values()),
            "released": sorted(
                _row(r | {"key": key}) for (name, key, _), r in t.released.items() if name == TYPE
            ),
            "cold": sorted(t.cold[TYPE]),
        }

    def reader(self) -> LedgerReader:
        reader = LedgerReader(self.settings.postgres_dsn, SyncRecords.single(self.sync))
        reader._store = cold_store(self.postgres, lambda: "conformance")
        return reader


def _row(row: Any) -> tuple[tuple[str, Any], ...]:
    """A ledger row as both servers have it: its key, client and who changed it, and
    which of its times are set (the times themselves are each server's clock)."""
    found = dict(row)
    kept = {k: found.get(k) for k in ("key", "client", "used_by", "released_by")}
    kept |= {f"{k} set": found.get(k) is not None for k in TIMES if k in found}
    return tuple(sorted(kept.items()))


def _answer(found: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if found is None else {k: v for k, v in found.items() if k not in TIMES}


# --- the history ------------------------------------------------------------------------


@dataclass
class History:
    side: Side
    seen: list[tuple[str, Any]]

    async def step(self, name: str, value: Any) -> None:
        self.seen.append((name, value))
        self.seen.append((f"{name}: servers", await self.servers()))

    async def servers(self) -> dict[str, Any]:
        found = await self.side.tables()
        found["hot"] = await self.side.hot.depth(TYPE)
        found["backlog"] = await self.side.stream.backlog()
        return found

    def drain(self, store: ColdStore) -> LedgerDrain:
        types = build_id_types(self.side.settings, generating=False)
        config = self.side.settings.keysync
        return LedgerDrain(
            self.side.stream,
            store,
            types,
            "keysync-1",
            1,
            guard=GuardedCold(store, self.side.sync, types),
            retain_s=config.ledger_retain_s,
            sync=self.side.sync,
        )

    async def refill(self) -> None:
        types = build_id_types(self.side.settings, generating=False)
        async with self.side.cold() as store:
            guard = GuardedCold(store, self.side.sync, types)
            await Keysync(self.side.settings, guard, self.side.hot).refill(types[TYPE])
        await self.step("refill", None)

    async def applied(self) -> None:
        async with self.side.cold() as store:
            drain = self.drain(store)
            while (
                await drain.drain_once(block_ms=10) is not None
                or await self.side.stream.backlog() > 0
            ):
                pass
        await self.step("applied", drain.restored)

    async def requeue(self) -> None:
        async with self.side.cold() as store:
            await self.step("requeue", await self.drain(store).requeue_released())

    async def pop(self, client: str) -> None:
        popped = await self.side.hot.pop(TYPE, 1, [client], ledger=True)
        await self.step(f"pop {client}", popped.keys)

    async def change(self, op: str, client: str) -> None:
        if op == "used":
            entry = await self.side.stream.record_used(TYPE, [KEY], client, reply=True)
        else:
            entry = await self.side.stream.record_released(TYPE, [KEY], client, reply=True)
        await self.applied()
        await self.step(f"{op} {client}", await self.side.stream.outcome(TYPE, entry))

    async def lookup(self) -> None:
        reader = self.side.reader()
        try:
            found: Any = _answer(await reader.lookup(TYPE, KEY))
        except Exception as exc:  # the answer both must give: the same refusal
            found = type(exc).__name__
        finally:
            await reader.close()
        await self.step("lookup", found)


async def play(side: Side) -> list[tuple[str, Any]]:
    """A key issued to A, given back, requeued after its delay and issued to B, who
    uses it; then a promotion that loses B's issue and use: fenced and restored, and
    B's repeated PUT answered as first."""
    history = History(side, [])
    await history.refill()
    await history.pop("client-a")
    await history.applied()
    await history.lookup()
    await history.change("released", "client-a")
    await asyncio.sleep(sim_world.TYPE_CONFIG["reissue_after_s"] + 0.2)
    await history.requeue()
    await history.refill()
    await side.mark()  # the replica has what was committed so far
    await history.pop("client-b")
    await history.applied()
    await history.change("used", "client-b")
    await side.promote()
    await history.refill()  # fenced: the promoted server lacks B's issue and use
    await history.applied()  # restored
    await history.lookup()
    await history.change("used", "client-b")  # a repeat: assigned, as first answered
    await history.change("released", "client-a")  # not A's any more
    return history.seen


@pytest.fixture
async def real(servers: Servers, database: str, redis_client: Any) -> AsyncIterator[Real]:
    settings = make_settings(
        servers,
        database,
        id_types={TYPE: sim_world.TYPE_CONFIG},
        keysync=sim_world.KEYSYNC_CONFIG,
        dispenser={"mosip": {"uin": TYPE}},
        postgres_connect_timeout_s=sim_world.CONNECT_TIMEOUT_S,
    )
    await run_migrate(settings)
    endpoint = RedisEndpoint(servers.redis_url)
    ns = settings.redis_key_namespace
    side = Real(
        servers,
        database,
        settings,
        HotStore(endpoint, ns),
        LedgerStream(endpoint, ns),
        SyncRecord(endpoint, ns),
    )
    async with side.cold() as store, store.connection() as conn:
        await conn.execute(sql.for_type("INSERT INTO {cold} (key) VALUES ($1)", TYPE), KEY)
    yield side
    await side.hot.close()
    await drop(servers, f"{database}_replica")
    await drop(servers, f"{database}_old")


def simulated() -> Simulated:
    settings = sim_world.settings()
    postgres = SimPostgres({TYPE: sim_world.TYPE_CONFIG["range_size"]}, lambda: 0.0)
    postgres.root.tables.cold[TYPE][KEY] = None
    redis = SimRedis(lambda: 0.0, lambda: "0" * 40)
    on = endpoint(redis)
    ns = settings.redis_key_namespace
    return Simulated(settings, postgres, HotStore(on, ns), LedgerStream(on, ns), SyncRecord(on, ns))


async def test_the_simulated_servers_answer_as_the_real_ones(real: Real) -> None:
    on_servers = await play(real)
    on_fakes = await play(simulated())
    for (step, there), (_, here) in zip(on_servers, on_fakes, strict=True):
        assert here == there, f"{step}: real {there}, simulated {here}"
    # The history did what it says: released, requeued, fenced and restored, the
    # repeat answered as first.
    steps = [name for name, _ in on_servers]
    answers = {name: value for name, value in on_servers if not name.endswith("servers")}
    assert on_servers[steps.index("released client-a")][1] == outcomes.UNUSED
    assert answers["requeue"] == {TYPE: 1}
    assert on_servers[steps.index("used client-b")][1] == outcomes.ASSIGNED
    assert answers["used client-b"] == outcomes.ASSIGNED
    assert answers["released client-a"] != outcomes.UNUSED
    restored = [value for name, value in on_servers if name == "applied"]
    assert any(restored)
    assert answers["lookup"]["client"] == "client-b" and answers["lookup"]["used"] is True
