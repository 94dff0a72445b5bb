"""ledger_durability on a real primary and replica: a Redis primary killed (SIGKILL)
after its replica stopped copying loses no record of an answer given, when the type
asks for ``replicated``; with the default (``async``) it loses the records of the
answers given meanwhile (the control case, and the bound docs/reliability.md states).

Two embedded servers on loopback ports. The replication link is cut (the replica
pointed at a port nothing listens on: it keeps its data and copies nothing more) while
the dispenser answers; then the primary is SIGKILLed and the replica promoted, and the
ledger is drained from it into real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from keydispenser_ops.embedded import free_port
from keysync.ledger import LedgerDrain
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS, small_types
from tests.integration import test_replica_fence
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings
from tests.integration.test_replica_fence import Pair, caught_up, replicaof

pair = test_replica_fence.pair  # a fixture: an embedded primary and its replica

REQUESTS = 12


def signal_server(process: Any, sig: signal.Signals) -> None:
    assert process is not None
    os.kill(process.pid, sig)


async def asked(http: httpx.AsyncClient, client: str) -> dict[str, str]:
    """REQUESTS single-ID requests as ``client`` (an API key each); key -> client of
    every answer given (200)."""
    given: dict[str, str] = {}
    for _ in range(REQUESTS):
        reply = await http.post("/v1/idgenerator/farmer/id", headers={"X-API-Key": client})
        if reply.status_code == 200:
            given[reply.json()["response"]["id"]] = client
        else:
            assert reply.status_code == 503, reply.text
    return given


async def answers_across_a_primary_loss(
    servers: Servers, database: str, pair: Pair, durability: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(every key answered -> its client, the ledger's key -> client) after the
    primary is killed while its replica is frozen, and the replica promoted."""
    types = small_types()
    types["farmer"] |= {"ledger": True, "ledger_durability": durability, "ledger_wait_ms": 200}
    keys = {name: f"key-of-{name}-{uuid.uuid4().hex[:8]}" for name in ("early", "late")}
    api_keys = [
        {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, key in keys.items()
    ]
    settings = make_settings(
        servers,
        database,
        redis_url=pair.primary.url,
        id_types=types,
        dispenser={"auth": {"api_keys": api_keys}},
    )
    await run_migrate(settings)
    farmer = build_id_types(settings)["farmer"]
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    await hot.push("farmer", farmer.generate(0, 2_000)[0][:200], uuid.uuid4().hex)
    await caught_up(pair)
    given: dict[str, str] = {}
    async with dispenser_over_http(settings) as http:
        given |= await asked(http, keys["early"])
        await caught_up(pair)
        await replicaof(pair.replica_client, "127.0.0.1", str(free_port()))  # the link cut
        try:
            given |= await asked(http, keys["late"])
        finally:
            signal_server(pair.primary.process, signal.SIGKILL)
    await hot.close()
    await replicaof(pair.replica_client, "NO", "ONE")  # promoted
    names = {v: k for k, v in keys.items()}
    promoted = LedgerStream(RedisEndpoint(pair.replica.url), NS)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        drain = LedgerDrain(promoted, cold, build_id_types(settings), "k", 1_000)
        await drain.drain_once(block_ms=10)  # the group, if the replica had none
        while await drain.drain_once(block_ms=10) is not None:
            pass
    finally:
        await cold.close()
        await promoted.close()
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        rows = await conn.fetch(sql.for_type("SELECT key, client FROM {ledger}", "farmer"))
    finally:
        await conn.close()
    return {k: names[c] for k, c in given.items()}, {r["key"]: r["client"] for r in rows}


async def test_replicated_durability_loses_no_record_of_an_answer_given(
    servers: Servers, database: str, pair: Pair
) -> None:
    given, ledger = await answers_across_a_primary_loss(servers, database, pair, "replicated")
    assert sorted(set(given.values())) == ["early"]  # nothing answered once it could not copy
    assert len(given) == REQUESTS
    assert {k: ledger.get(k) for k in given} == given  # each under the client it went to


@pytest.mark.parametrize("durability", ["async"])
async def test_control_with_async_durability_answers_given_lose_their_record(
    servers: Servers, database: str, pair: Pair, durability: str
) -> None:
    given, ledger = await answers_across_a_primary_loss(servers, database, pair, durability)
    late = {k for k, c in given.items() if c == "late"}
    assert len(late) == REQUESTS  # answered at once, replica or not
    assert not late & set(ledger)  # their records died with the primary
    early = {k for k, c in given.items() if c == "early"}
    assert {k: ledger.get(k) for k in early} == dict.fromkeys(early, "early")


async def test_a_ledger_types_retry_is_never_replayed_from_before_a_failover(pair: Pair) -> None:
    """An idempotency record a promoted replica inherited may name a key given back
    since (the release that forgot the record can be what the failover lost): for a
    ledger type it is never replayed, the retry is answered afresh; other types replay
    it as before."""
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    await hot.push("farmer", ["3029384756", "2013023805"], "b1")
    await hot.push("shortlink", ["AAAAAAA", "BBBBBBB"], "b2")
    first = await hot.pop_once("farmer", 1, "enrol-1", 3_600, "c1", ledger=True)
    plain = await hot.pop_once("shortlink", 1, "link-1", 3_600, "c1")
    again = await hot.pop_once("farmer", 1, "enrol-1", 3_600, "c1", ledger=True)
    assert again.replayed and again.keys == first.keys  # the same server: replayed
    await caught_up(pair)
    await hot.close()
    await replicaof(pair.replica_client, "NO", "ONE")  # promoted: a new identity
    promoted = HotStore(RedisEndpoint(pair.replica.url), NS)
    try:
        await promoted.push("farmer", ["5057094587"], "b3")  # the fence discards first
        after = await promoted.pop_once("farmer", 1, "enrol-1", 3_600, "c1", ledger=True)
        assert not after.replayed and after.keys == ["5057094587"]
        kept = await promoted.pop_once("shortlink", 1, "link-1", 3_600, "c1")
        assert kept.replayed and kept.keys == plain.keys
    finally:
        await promoted.close()


# --- every answer the ledger gives, and the log's links --------------------------------


def mosip_types(durability: str) -> dict[str, Any]:
    types = small_types()
    types["farmer"] |= {
        "ledger": True,
        "filter_profile": "mosip",
        "ledger_durability": durability,
        "ledger_wait_ms": 200,
    }
    return types


async def test_a_put_is_answered_only_once_its_change_is_replicated(
    servers: Servers, database: str, pair: Pair
) -> None:
    """A replicated type's PUT ASSIGNED is answered once its entry, its outcome and the
    link that decided it are on a replica: with the replication link cut, keysync
    decides it (its drain here waits for no replica) but the PUT is not acknowledged
    (KER-UIG-005, Retry-After); the same PUT once the replica copies again is answered
    as decided."""
    mosip = {"mosip": {"uin": "farmer", "ledger_wait_s": 5}}
    settings = make_settings(
        servers,
        database,
        redis_url=pair.primary.url,
        id_types=mosip_types("replicated"),
        dispenser=mosip,
    )
    await run_migrate(settings)
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    uin = build_id_types(settings)["farmer"].generate(0, 2_000)[0][0]
    await hot.push("farmer", [uin], uuid.uuid4().hex)
    async_types = build_id_types(
        make_settings(servers, database, id_types=mosip_types("async"), dispenser=mosip)
    )
    stream = LedgerStream(RedisEndpoint(pair.primary.url), NS)
    cold = await ColdStore.connect(settings.postgres_dsn)
    drain = LedgerDrain(stream, cold, async_types, "k", 1_000)
    stop = asyncio.Event()

    async def draining() -> None:
        while not stop.is_set():
            await drain.drain_once(block_ms=20)

    task = asyncio.create_task(draining())
    body = {"id": "mosip.kernel.uinservice", "version": "1.0"}
    assign = body | {"request": {"uin": uin, "status": "ASSIGNED"}}
    try:
        async with dispenser_over_http(settings) as http:
            assert (await http.get("/v1/idgenerator/uin")).json()["response"]["uin"] == uin
            await caught_up(pair)
            await replicaof(pair.replica_client, "127.0.0.1", str(free_port()))  # cut
            cut = await http.put("/v1/idgenerator/uin", json=assign)
            (error,) = cut.json()["errors"]
            assert error["errorCode"] == "KER-UIG-005" and "replica" in error["message"]
            assert cut.headers["Retry-After"] == "1"
            await replicaof(pair.replica_client, "127.0.0.1", str(pair.primary.port))
            await caught_up(pair)
            again = await http.put("/v1/idgenerator/uin", json=assign)
            assert again.json()["response"] == {"uin": uin, "status": "ASSIGNED"}
    finally:
        stop.set()
        await task
        await cold.close()
        await stream.close()
        await hot.close()


async def test_a_ledger_link_commits_only_once_it_is_replicated(
    servers: Servers, database: str, pair: Pair
) -> None:
    """For a replicated type, keysync's ledger transaction waits for its link in the
    ledger log to be on a replica before it commits: with the replication link cut it
    does not commit (its entry stays pending) and commits once the replica copies."""
    settings = make_settings(
        servers, database, redis_url=pair.primary.url, id_types=mosip_types("replicated")
    )
    await run_migrate(settings)
    types = build_id_types(settings)
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    uin = types["farmer"].generate(0, 2_000)[0][0]
    await hot.push("farmer", [uin], uuid.uuid4().hex)
    stream = LedgerStream(RedisEndpoint(pair.primary.url), NS)
    sync = SyncRecord(RedisEndpoint(pair.primary.url), NS)
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        guard = GuardedCold(cold, sync, types)
        drain = LedgerDrain(stream, cold, types, "k", 1_000, guard=guard, sync=sync)
        await drain.drain_once(block_ms=10)  # the consumer group
        await caught_up(pair)
        await replicaof(pair.replica_client, "127.0.0.1", str(free_port()))  # cut
        assert (await hot.pop("farmer", 1, ["c1"], ledger=True)).keys == [uin]
        with pytest.raises(StoreUnavailable, match="not replicated"):
            await drain.drain_once(block_ms=10)
        found = "SELECT client FROM {ledger} WHERE key = $1"
        async with cold.connection() as conn:
            assert await conn.fetch(sql.for_type(found, "farmer"), uin) == []  # not committed
        await replicaof(pair.replica_client, "127.0.0.1", str(pair.primary.port))
        await caught_up(pair)
        assert await drain.drain_once(block_ms=10) is not None  # its entry, again
        async with cold.connection() as conn:
            assert await conn.fetchval(sql.for_type(found, "farmer"), uin) == "c1"
    finally:
        await cold.close()
        await stream.close()
        await sync.close()
        await hot.close()
