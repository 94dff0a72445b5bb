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
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from keydispenser_ops.embedded import free_port, waitaof_server_binary
from keysync.ledger import LedgerDrain
from shared.domain.config import Settings
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


async def asked(http: httpx.AsyncClient, client: str, count: int = REQUESTS) -> dict[str, str]:
    """``count`` single-ID requests as ``client`` (an API key each); key -> client of
    every answer given (200)."""
    given: dict[str, str] = {}
    for _ in range(count):
        reply = await http.post("/v1/idgenerator/farmer/id", headers={"X-API-Key": client})
        if reply.status_code == 200:
            given[reply.json()["response"]["id"]] = client
        else:
            assert reply.status_code == 503, reply.text
    return given


def ledger_settings(
    servers: Servers,
    database: str,
    pair: Pair,
    durability: str,
    keys: dict[str, str],
    wait_ms: int = 200,
) -> Settings:
    """The farmer type with a ledger of ``durability`` (``wait_ms`` to reach it), on the
    pair's primary; an API key per client of ``keys``."""
    types = small_types()
    types["farmer"] |= {
        "ledger": True,
        "ledger_durability": durability,
        "ledger_wait_ms": wait_ms,
    }
    api_keys = [
        {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, key in keys.items()
    ]
    return make_settings(
        servers,
        database,
        redis_url=pair.primary.url,
        id_types=types,
        dispenser={"auth": {"api_keys": api_keys}},
    )


async def answers_across_a_primary_loss(
    servers: Servers, database: str, pair: Pair, durability: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(every key answered -> its client, the ledger's key -> client) after the
    primary is killed while its replica is frozen, and the replica promoted."""
    keys = {name: f"key-of-{name}-{uuid.uuid4().hex[:8]}" for name in ("early", "late")}
    settings = ledger_settings(servers, database, pair, durability, keys)
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


# --- fsynced: the append-only files ---------------------------------------------------


@pytest.fixture
async def aof_pair() -> AsyncIterator[Pair]:
    """A primary writing its append-only file (fsync at every write: with ``everysec`` a
    WAITAOF waits up to a second, beyond ``ledger_wait_ms``) and a replica that copies
    it but writes none, on servers that have WAITAOF (Redis 7.2 or Valkey)."""
    async with test_replica_fence.started_pair(
        waitaof_server_binary(), "--appendonly", "yes", "--appendfsync", "always"
    ) as found:
        yield found


# A replica acknowledges its fsync with its next acknowledgement, which may be its
# once-a-second one: WAITAOF with replicas needs ledger_wait_ms above a second.
FSYNC_WAIT_MS = 1_500
REFUSED = 3  # requests asked for while the replica writes no AOF (each waits it out)


async def replica_fsyncs(primary: Any) -> bool:
    """Whether a write now reaches a replica's append-only file within FSYNC_WAIT_MS."""
    await primary.incr("kd-test-aof-probe")
    _, replicas = await primary.execute_command("WAITAOF", 0, 1, FSYNC_WAIT_MS)
    return bool(replicas)


@pytest.mark.parametrize("durability", ["fsynced", "replicated"])
async def test_fsynced_answers_once_a_replica_wrote_its_append_only_file(
    servers: Servers, database: str, aof_pair: Pair, durability: str
) -> None:
    """``fsynced`` waits for the primary's and a replica's append-only files (WAITAOF):
    with the replica copying but writing no AOF, every single-ID request is refused
    (503, its keys never handed out) where ``replicated`` (the control: WAIT counts a replica that
    holds the write in memory) answers each; once the replica writes its AOF,
    ``fsynced`` answers too."""
    pair = aof_pair
    client = f"key-{uuid.uuid4().hex[:8]}"
    settings = ledger_settings(servers, database, pair, durability, {"c": client}, FSYNC_WAIT_MS)
    await run_migrate(settings)
    farmer = build_id_types(settings)["farmer"]
    hot = HotStore(RedisEndpoint(pair.primary.url), NS)
    await hot.push("farmer", farmer.generate(0, 2_000)[0][:100], uuid.uuid4().hex)
    await hot.close()
    await caught_up(pair)
    async with dispenser_over_http(settings) as http:
        without_aof = await asked(http, client, REFUSED)
        refused = await http.post("/v1/idgenerator/farmer/id", headers={"X-API-Key": client})
        await pair.replica_client.config_set("appendfsync", "always")
        await pair.replica_client.config_set("appendonly", "yes")
        await test_replica_fence.until(
            lambda: replica_fsyncs(pair.primary_client), "the replica's AOF written"
        )
        with_aof = await asked(http, client)
    assert len(with_aof) == REQUESTS
    if durability == "replicated":
        assert len(without_aof) == REFUSED
        return
    assert without_aof == {}
    assert refused.status_code == 503
    assert refused.json()["errors"][0]["errorCode"] == "IDG-005", refused.text


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
