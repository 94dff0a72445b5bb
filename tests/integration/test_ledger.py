"""The audit ledger: issued and used keys reach PostgreSQL via the Redis stream."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from keysync.ledger import LedgerDrain
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger import sql as ledger_sql
from shared.stores.ledger.batch import Applied, parse
from shared.stores.ledger.decide import apply
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

KEYS = [f"L{i:06d}" for i in range(100)]  # well-formed base62 keys of length 7


@pytest.fixture
def settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return make_settings(servers, database, id_types=types)


@pytest.fixture
async def cold_store(settings: Settings) -> AsyncIterator[ColdStore]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    yield cold
    await cold.close()


@pytest.fixture
async def drain(settings: Settings, hot: HotStore, cold_store: ColdStore) -> LedgerDrain:
    drain = LedgerDrain(
        LedgerStream(hot.endpoint, hot.namespace),
        cold_store,
        build_id_types(settings),
        "test-consumer",
        1_000,
    )
    assert await drain.drain_once(block_ms=10) is None  # creates the consumer group
    return drain


@pytest.fixture
async def client(settings: Settings, hot: HotStore) -> AsyncIterator[httpx.AsyncClient]:
    await hot.push("shortlink", KEYS, uuid.uuid4().hex)
    await hot.push("farmer", ["3029384756"], uuid.uuid4().hex)
    async with dispenser_over_http(settings) as http:
        yield http


async def drain_all(drain: LedgerDrain) -> list[Applied]:
    applied = []
    while (batch := await drain.drain_once(block_ms=10)) is not None:
        applied.append(batch)
    return applied


async def lookup(client: httpx.AsyncClient, key: str) -> dict[str, Any]:
    reply = await client.get(f"/v1/keys/shortlink/{key}")
    assert reply.status_code == 200
    body: dict[str, Any] = reply.json()
    return body


async def test_issued_keys_and_their_use_are_recorded(
    client: httpx.AsyncClient, drain: LedgerDrain, hot: HotStore
) -> None:
    one = (await client.post("/v1/idgenerator/shortlink/id")).json()["response"]["id"]
    batch = (await client.post("/v1/keys/shortlink", params={"count": 3})).json()["keys"]
    again = await client.post(
        "/v1/keys/shortlink", params={"count": 2}, headers={"Idempotency-Key": "order-7"}
    )
    replay = await client.post(
        "/v1/keys/shortlink", params={"count": 2}, headers={"Idempotency-Key": "order-7"}
    )
    assert again.json() == replay.json()
    assert (await lookup(client, one))["issued"] is False  # not drained yet
    applied = await drain_all(drain)
    assert sum(a.issued for a in applied) == 6  # the replay issued nothing new
    assert not any(a.duplicates for a in applied)
    assert (
        await LedgerStream(hot.endpoint, hot.namespace).backlog() == 0
    )  # applied entries leave the stream

    first = await lookup(client, one)
    assert first["issued"] is True and first["used"] is False
    assert first["client"] == "-" and first["issued_at"].endswith("Z")
    idem = await lookup(client, again.json()["keys"][0])
    assert idem["idempotency_key"] == "order-7"

    used = await client.post(f"/v1/idgenerator/shortlink/id/{one}/used")
    assert used.status_code == 202
    assert used.json()["response"] == {"id": one, "status": "ACCEPTED"}
    many = await client.post("/v1/keys/shortlink/used", json={"keys": batch[:2]})
    assert many.status_code == 202 and many.json() == {"accepted": 2}
    applied = await drain_all(drain)
    assert sum(a.used for a in applied) == 3
    marked = await lookup(client, one)
    assert marked["used"] is True and marked["used_at"] >= marked["issued_at"]
    assert (await lookup(client, batch[2]))["used"] is False
    assert (await lookup(client, "Zzzzzzz")) == {
        "id_type": "shortlink",
        "key": "Zzzzzzz",
        "issued": False,
        "used": False,
    }


async def test_a_key_issued_twice_raises_the_duplicate_alarm(
    drain: LedgerDrain, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    stream = redis_keys.ledger_stream_key(NS)
    entry: dict[Any, Any] = {
        "op": "issue",
        "type": "shortlink",
        "keys": "L000001 L000002",
        "clients": "a",
    }
    await redis_client.xadd(stream, entry)
    assert sum(a.issued for a in await drain_all(drain)) == 2
    await redis_client.xadd(stream, {**entry, "keys": "L000002 L000003"})
    applied = await drain_all(drain)
    assert [a.duplicates for a in applied] == [{"shortlink": ["L000002"]}]
    assert any(r.message == "duplicate_key_issued" for r in caplog.records)


async def test_entries_a_dead_keysync_left_are_taken_over_first_and_not_duplicates(
    drain: LedgerDrain,
    hot: HotStore,
    settings: Settings,
    redis_client: aioredis.Redis,
    cold_store: ColdStore,
) -> None:
    """A keysync died after its commit, before its ack (its heartbeat expires): its
    entry is claimed by the next drain before any newer entry, and is a redelivery."""
    stream = redis_keys.ledger_stream_key(NS)
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "clients": "a"}
    entry_id = await redis_client.xadd(stream, fields | {"keys": "L000009"})
    entries = await LedgerStream(hot.endpoint, hot.namespace).read("dead-keysync", 10, 10, 30_000)
    assert [e for e, _ in entries] == [entry_id]
    async with cold_store.connection() as conn, conn.transaction():
        await apply(conn, parse(entries, build_id_types(settings)))
    await redis_client.xadd(stream, fields | {"keys": "L000010"})  # a newer entry
    taken_over = await drain.drain_once(block_ms=10)
    assert taken_over is not None
    assert taken_over.issued == 0 and taken_over.duplicates == {}  # the old one, first
    newer = await drain.drain_once(block_ms=10)
    assert newer is not None and newer.issued == 1
    assert await LedgerStream(hot.endpoint, hot.namespace).backlog() == 0


async def test_a_batch_applied_but_not_acknowledged_is_taken_again_first(
    drain: LedgerDrain,
    hot: HotStore,
    redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The acknowledgement failed (the primary moved between commit and ack): the same
    drain takes its own batch again before any newer entry, rather than leaving it
    pending until another consumer's claim finds it idle (``ledger_claim_idle_s``)."""
    stream = redis_keys.ledger_stream_key(NS)
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "clients": "a"}
    first = await redis_client.xadd(stream, fields | {"keys": "L000012"})
    real_ack = LedgerStream.acknowledge

    async def lost_ack(self: LedgerStream, *args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(LedgerStream, "acknowledge", real_ack)
        raise StoreUnavailable("redis", "ledger_ack failed: Connection closed by server.")

    monkeypatch.setattr(LedgerStream, "acknowledge", lost_ack)
    with pytest.raises(StoreUnavailable):
        await drain.drain_once(block_ms=10)
    await redis_client.xadd(stream, fields | {"keys": "L000013"})  # a newer entry
    again = await drain.drain_once(block_ms=10)
    assert again is not None and again.issued == 0  # the committed batch, taken again
    assert await redis_client.xrange(stream, first, first) == []  # now acknowledged
    newer = await drain.drain_once(block_ms=10)
    assert newer is not None and newer.issued == 1
    assert await LedgerStream(hot.endpoint, hot.namespace).backlog() == 0


async def test_a_keysync_restarted_under_its_name_takes_what_it_held_first(
    drain: LedgerDrain, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """The consumer's name comes back (a container restarted: same host name and PID),
    or a promoted replica still lists an entry as pending under it: what it holds is
    taken first, not left until another consumer's claim finds it idle."""
    stream = redis_keys.ledger_stream_key(NS)
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "clients": "a"}
    held = await redis_client.xadd(stream, fields | {"keys": "L000014"})
    before = LedgerStream(hot.endpoint, hot.namespace)
    assert [e for e, _ in await before.read("test-consumer", 10, 10, 30_000)] == [held]
    await redis_client.xadd(stream, fields | {"keys": "L000015"})  # a newer entry
    first = await drain.drain_once(block_ms=10)
    assert first is not None and first.issued == 1
    assert await redis_client.xrange(stream, held, held) == []  # the one it held
    assert (await drain.drain_once(block_ms=10) or Applied(0, 0, {}, 0)).issued == 1


async def test_a_pending_entry_deleted_since_is_dropped_not_read_forever(
    drain: LedgerDrain, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """A promoted replica's pending list may still name an entry the old primary
    applied and deleted: the drain's own read passes over it, the entry leaves the
    pending list, and the drain goes on to new entries."""
    stream = redis_keys.ledger_stream_key(NS)
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "clients": "a"}
    for n in range(3):
        await redis_client.xadd(stream, fields | {"keys": f"L00002{n}"})
    stale = LedgerStream(hot.endpoint, hot.namespace)
    taken = [e for e, _ in await stale.read("test-consumer", 2, 10, 30_000)]
    await redis_client.xdel(stream, *taken)  # gone from the stream, still pending
    applied = await drain.drain_once(block_ms=10)
    assert applied is not None and applied.issued == 1  # the third, new entry
    assert (await redis_client.xpending(stream, "kd-ledger"))["pending"] == 0


async def test_a_live_keysyncs_entries_are_left_to_it_until_idle(
    drain: LedgerDrain, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "keys": "L000011"}
    await redis_client.xadd(redis_keys.ledger_stream_key(NS), fields)
    busy = LedgerStream(hot.endpoint, hot.namespace)
    await busy.beat("busy-keysync")
    assert await busy.read("busy-keysync", 10, 10, 30_000)
    assert await drain.drain_once(block_ms=10) is None  # pending there, not yet idle


async def test_a_use_applied_before_its_issue_is_kept_until_the_issue_comes(
    drain: LedgerDrain,
    hot: HotStore,
    settings: Settings,
    redis_client: aioredis.Redis,
    cold_store: ColdStore,
) -> None:
    """Two keysyncs: one holds a key's issue entry while the other applies the key's
    "used" entry first. Applying is order-independent: the use is not lost."""
    stream = redis_keys.ledger_stream_key(NS)
    issue: dict[Any, Any] = {"op": "issue", "type": "shortlink", "keys": "L000012", "clients": "a"}
    await redis_client.xadd(stream, issue)
    slow = LedgerStream(hot.endpoint, hot.namespace)
    await slow.beat("slow-keysync")
    held = await slow.read("slow-keysync", 10, 10, 30_000)  # the issue, not applied yet
    used: dict[Any, Any] = {"op": "used", "type": "shortlink", "keys": "L000012", "clients": "a"}
    await redis_client.xadd(stream, used)
    first = await drain.drain_once(block_ms=10)
    assert first is not None and first.used == 0 and first.used_unknown == 1
    async with cold_store.connection() as conn, conn.transaction():
        late = await apply(conn, parse(held, build_id_types(settings)))
    assert late.issued == 1 and late.used == 1
    async with cold_store.connection() as conn:
        row = await conn.fetchrow(
            sql.for_type(ledger_sql.SELECT_LEDGER_KEY, "shortlink"), "L000012"
        )
        assert await conn.fetchval("SELECT count(*) FROM kd_ledger_early_marks") == 0
    assert row is not None and row["used_at"] is not None and row["used_by"] == "a"


async def test_an_early_use_by_another_client_is_refused_when_the_issue_comes(
    drain: LedgerDrain, settings: Settings, redis_client: aioredis.Redis, cold_store: ColdStore
) -> None:
    stream = redis_keys.ledger_stream_key(NS)
    used: dict[Any, Any] = {"op": "used", "type": "shortlink", "keys": "L000013", "clients": "b"}
    await redis_client.xadd(stream, used)
    assert (await drain.drain_once(block_ms=10)) is not None
    issue: dict[Any, Any] = {"op": "issue", "type": "shortlink", "keys": "L000013", "clients": "a"}
    await redis_client.xadd(stream, issue)
    applied = await drain.drain_once(block_ms=10)
    assert applied is not None and applied.issued == 1
    assert applied.used == 0 and applied.used_refused == 1
    async with cold_store.connection() as conn:
        row = await conn.fetchrow(
            sql.for_type(ledger_sql.SELECT_LEDGER_KEY, "shortlink"), "L000013"
        )
    assert row is not None and row["used_at"] is None


async def test_marking_a_key_never_issued_is_counted_not_applied(
    client: httpx.AsyncClient, drain: LedgerDrain
) -> None:
    reply = await client.post("/v1/idgenerator/shortlink/id/Q000000/used")
    assert reply.status_code == 202
    applied = await drain_all(drain)
    assert sum(a.used_unknown for a in applied) == 1
    assert (await lookup(client, "Q000000"))["used"] is False


async def test_marking_used_on_a_type_without_ledger_is_accepted_and_counted(
    client: httpx.AsyncClient,
) -> None:
    """OpenG2P's registry notifies every ID it uses; a 409 would be retried forever."""
    reply = await client.post("/v1/idgenerator/farmer/id/3029384756/used")
    assert reply.status_code == 202
    assert reply.json()["response"] == {"id": "3029384756", "status": "ACCEPTED"}
    metrics = (await client.get("/metrics")).text
    assert 'kd_used_unrecorded_total{id_type="farmer"} 1.0' in metrics
    batch = await client.post("/v1/keys/farmer/used", json={"keys": ["3029384756"]})
    assert batch.status_code == 409  # this service's own batch route still says so


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/v1/idgenerator/farmer/id/30293847561/used", None, 422, "IDG-004"),
        ("GET", "/v1/keys/farmer/3029384756", None, 409, "IDG-011"),
        ("POST", "/v1/idgenerator/shortlink/id/short/used", None, 422, "IDG-004"),
        ("POST", "/v1/idgenerator/nope/id/L000001/used", None, 404, "IDG-003"),
        ("POST", "/v1/keys/shortlink/used", {"keys": []}, 422, "IDG-004"),
        ("POST", "/v1/keys/shortlink/used", {"keys": ["L000001", 5]}, 422, "IDG-004"),
        ("POST", "/v1/keys/shortlink/used", {"nope": 1}, 422, "IDG-004"),
        ("POST", "/v1/keys/shortlink/used", {"keys": ["L00000!"]}, 422, "IDG-004"),
    ],
)
async def test_ledger_routes_refuse_bad_requests_in_the_envelope(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    body: object,
    status: int,
    code: str,
) -> None:
    reply = await client.request(method, path, json=body)
    assert reply.status_code == status
    assert reply.json()["errors"][0]["errorCode"] == code


async def test_a_body_that_is_not_json_is_422(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/keys/shortlink/used", content=b"{not json")
    assert reply.status_code == 422


async def test_a_failing_ledger_keeps_its_entries_and_keysync_running(
    drain: LedgerDrain,
    hot: HotStore,
    settings: Settings,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    cold_store: ColdStore,
) -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from keysync.main import drain_ledger
    from keysync.metrics import KeysyncMetrics

    async with cold_store.connection() as conn:
        await conn.execute(f"DROP TABLE {sql.ledger_table('shortlink')}")  # no connection error
    fields: dict[Any, Any] = {"op": "issue", "type": "shortlink", "keys": "L000001", "clients": "-"}
    await redis_client.xadd(redis_keys.ledger_stream_key(NS), fields)
    monkeypatch.setattr("keysync.main.LEDGER_FAILURE_DELAY_S", 0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(
        drain_ledger(
            drain,
            KeysyncMetrics(CollectorRegistry()),
            LedgerStream(hot.endpoint, hot.namespace).backlog,
            stop,
        )
    )
    await asyncio.sleep(0.5)
    assert not task.done()  # it keeps trying rather than crashing the process
    stop.set()
    await asyncio.wait_for(task, 5)
    assert any(r.message == "ledger_drain_failed" for r in caplog.records)
    assert (
        await LedgerStream(hot.endpoint, hot.namespace).backlog() == 1
    )  # nothing acknowledged, nothing lost


async def test_a_use_that_waited_too_long_for_its_issue_is_forgotten(
    drain: LedgerDrain, redis_client: aioredis.Redis, cold_store: ColdStore
) -> None:
    used: dict[Any, Any] = {"op": "used", "type": "shortlink", "keys": "L000014", "clients": "a"}
    await redis_client.xadd(redis_keys.ledger_stream_key(NS), used)
    assert (await drain.drain_once(block_ms=10)) is not None
    assert await drain.prune(3_600) == 0  # still waiting
    async with cold_store.connection() as conn:
        await conn.execute("UPDATE kd_ledger_early_marks SET received_at = now() - interval '2h'")
    assert await drain.prune(3_600) == 1


async def test_an_early_foreign_mark_never_hides_the_owners(
    settings: Settings, cold_store: ColdStore
) -> None:
    """Both marks were applied before the issue (two keysyncs draining out of order):
    another client's first, then the owner's. The owner's is applied; the other is
    refused. (Each mark's stream entry is, as always, later than the issue's.)"""
    types = build_id_types(settings)

    def entry(ms: int, op: str, client: str) -> tuple[str, dict[str, str]]:
        return f"{ms}-0", {"op": op, "type": "shortlink", "keys": "L000015", "clients": client}

    marks = [entry(2_000, "used", "intruder"), entry(2_001, "used", "owner")]
    issue = [entry(1_000, "issue", "owner")]
    applied = []
    async with cold_store.connection() as conn:
        for batch in (marks, issue):
            async with conn.transaction():
                applied.append(await apply(conn, parse(batch, types)))
        row = await conn.fetchrow(
            sql.for_type(ledger_sql.SELECT_LEDGER_KEY, "shortlink"), "L000015"
        )
    assert sum(a.used for a in applied) == 1 and sum(a.used_refused for a in applied) == 1
    assert row is not None and row["used_by"] == "owner"


async def test_a_stopped_consumer_holding_nothing_is_removed(
    drain: LedgerDrain, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    gone = LedgerStream(hot.endpoint, hot.namespace)
    stream, group = redis_keys.ledger_stream_key(NS), "kd-ledger"
    entry: dict[Any, Any] = {"op": "issue", "type": "shortlink", "keys": "L000016"}
    await redis_client.xadd(stream, entry)
    read = await gone.read("gone-keysync", 10, 10, 30_000)  # joins the group
    await gone.acknowledge({}, [entry_id for entry_id, _ in read])  # and holds nothing
    names = {c["name"] for c in await redis_client.xinfo_consumers(stream, group)}
    assert "gone-keysync" in names
    await drain.drain_once(block_ms=10)
    names = {c["name"] for c in await redis_client.xinfo_consumers(stream, group)}
    assert "gone-keysync" not in names
