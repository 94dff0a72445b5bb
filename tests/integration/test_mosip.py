"""MOSIP's kernel ID generator API, driven over real HTTP as MOSIP's clients call it
(GET a UIN, then PUT its status), with keysync's ledger drain running against real
PostgreSQL and Redis; the ledger is checked in PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from keysync.ledger import LedgerDrain
from shared.domain.config import Settings
from shared.domain.errors import SchemaError
from shared.domain.idtypes import build_id_types
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.batch import parse
from shared.stores.ledger.decide import apply
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres import sql
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import run_migrate
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

RESPONSE_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
WRAPPER_FIELDS = ["id", "version", "responsetime", "metadata", "response", "errors"]


def mosip_settings(servers: Servers, database: str, reissue: bool = False) -> Settings:
    types = small_types()
    types["farmer"] |= {"ledger": True, "filter_profile": "mosip", "reissue_released": reissue}
    if reissue:
        types["farmer"]["reissue_after_s"] = 0.5
    types["shortlink"]["ledger"] = True
    return make_settings(
        servers,
        database,
        id_types=types,
        dispenser={"mosip": {"uin": "farmer", "vid": "shortlink", "ledger_wait_s": 5}},
    )


@contextlib.asynccontextmanager
async def stack(
    servers: Servers, database: str, hot: HotStore, reissue: bool = False
) -> AsyncIterator[tuple[httpx.AsyncClient, list[str], Settings, LedgerDrain]]:
    """A dispenser over HTTP, keysync's ledger drain running, and the UINs in the hot list."""
    settings = mosip_settings(servers, database, reissue)
    await run_migrate(settings)
    types = build_id_types(settings)
    uins = types["farmer"].generate(0, 2_000)[0][:20]
    await hot.push("farmer", uins, uuid.uuid4().hex)
    await hot.push("shortlink", [f"V{i:06d}" for i in range(20)], uuid.uuid4().hex)
    cold = await ColdStore.connect(settings.postgres_dsn)
    drain = LedgerDrain(LedgerStream(hot.endpoint, hot.namespace), cold, types, "t", 1_000)
    stop = asyncio.Event()

    async def draining() -> None:
        while not stop.is_set():
            await drain.drain_once(block_ms=20)

    task = asyncio.create_task(draining())
    try:
        async with dispenser_over_http(settings) as http:
            yield http, uins, settings, drain
    finally:
        stop.set()
        await task
        await cold.close()


async def get_uin(http: httpx.AsyncClient) -> str:
    reply = await http.get("/v1/idgenerator/uin")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert list(body) == WRAPPER_FIELDS
    assert body["errors"] is None and body["id"] is None and body["metadata"] is None
    assert RESPONSE_TIME.fullmatch(body["responsetime"])
    uin: str = body["response"]["uin"]
    return uin


async def put(http: httpx.AsyncClient, uin: str, status: str, **more: Any) -> dict[str, Any]:
    request = {
        "id": "mosip.kernel.uinservice",
        "version": "1.0",
        "requesttime": "2026-11-27T10:00:00.000Z",
        "metadata": {},
        "request": {"uin": uin, "status": status},
    } | more
    reply = await http.put("/v1/idgenerator/uin", json=request)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert list(body) == WRAPPER_FIELDS
    assert body["id"] == request["id"] and body["version"] == request["version"]
    return body


def error_code(body: dict[str, Any]) -> str:
    assert body["response"] is None
    (error,) = body["errors"]
    assert set(error) == {"errorCode", "message"}
    code: str = error["errorCode"]
    return code


async def ledger_row(settings: Settings, uin: str) -> asyncpg.Record | None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await conn.fetchrow(
            sql.for_type("SELECT * FROM {ledger} WHERE key = $1", "farmer"), uin
        )
    finally:
        await conn.close()


async def count(settings: Settings, query: str, *args: Any) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return int(await conn.fetchval(sql.for_type(query, "farmer"), *args))
    finally:
        await conn.close()


async def test_get_then_assigned_marks_the_uin_used_in_the_ledger(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with stack(servers, database, hot) as (http, uins, settings, _):
        uin = await get_uin(http)
        assert uin in uins
        body = await put(http, uin, "ASSIGNED")  # at once: it waits for the ledger
        assert body["errors"] is None and body["response"] == {"uin": uin, "status": "ASSIGNED"}
        row = await ledger_row(settings, uin)
        assert row is not None and row["used_at"] is not None and row["released_at"] is None
        # Asked again: answered as the first time (status changes are idempotent).
        again = await put(http, uin, "ASSIGNED")
        assert again["response"] == {"uin": uin, "status": "ASSIGNED"}
        # Used: it can no longer be given back.
        assert error_code(await put(http, uin, "UNASSIGNED")) == "KER-UIG-004"


async def test_unassigned_is_recorded_and_never_issued_again_by_default(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with stack(servers, database, hot) as (http, _, settings, _):
        uin = await get_uin(http)
        body = await put(http, uin, "UNASSIGNED")
        assert body["response"] == {"uin": uin, "status": "UNASSIGNED"}
        row = await ledger_row(settings, uin)
        assert row is not None and row["released_at"] is not None and row["used_at"] is None
        assert await count(settings, "SELECT count(*) FROM {cold} WHERE key = $1", uin) == 0
        assert (await put(http, uin, "UNASSIGNED"))["response"]["status"] == "UNASSIGNED"
        assert error_code(await put(http, uin, "ASSIGNED")) == "KER-UIG-004"
        # Not marked used through the generic route either.
        await http.post(f"/v1/idgenerator/farmer/id/{uin}/used")
        await asyncio.sleep(0.3)
        row = await ledger_row(settings, uin)
        assert row is not None and row["used_at"] is None


async def test_a_released_uin_goes_back_to_the_cold_tier_once_when_the_type_opts_in(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with stack(servers, database, hot, reissue=True) as (http, _, settings, drain):
        uin = await get_uin(http)
        body = await put(http, uin, "UNASSIGNED")
        assert body["response"] == {"uin": uin, "status": "UNUSED"}  # back in the pool
        again = await put(http, uin, "UNASSIGNED")
        assert again["response"] == {"uin": uin, "status": "UNUSED"}
        cold = "SELECT count(*) FROM {cold} WHERE key = $1"
        released = "SELECT count(*) FROM kd_released_issues WHERE id_type = 'farmer' AND key = $1"
        assert await count(settings, released, uin) == 1
        assert await ledger_row(settings, uin) is None  # its issue row moved there
        # It waits reissue_after_s before going back, so a late retry of the release
        # finds it released, never its next issue.
        assert await drain.requeue_released() == {}
        assert await count(settings, cold, uin) == 0
        await asyncio.sleep(0.6)
        assert await drain.requeue_released() == {"farmer": 1}
        assert await drain.requeue_released() == {}  # once
        assert await count(settings, cold, uin) == 1
        # Issued again (keysync would move it to the hot list): the ledger holds both.
        await hot.push("farmer", [uin], uuid.uuid4().hex)
        for _ in range(25):
            if await get_uin(http) == uin:
                break
        else:
            raise AssertionError("the released UIN was not issued again")
        assert (await put(http, uin, "ASSIGNED"))["response"]["status"] == "ASSIGNED"
        assert await count(settings, released, uin) == 1
        row = await ledger_row(settings, uin)
        assert row is not None and row["used_at"] is not None


async def test_an_entry_applied_again_never_touches_the_keys_next_issue(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """A release or a mark of use redelivered (its ack lost, or claimed by a second
    keysync) after its key was given back and issued again does nothing to the new
    issue: it is older than the issue row."""
    settings = mosip_settings(servers, database, reissue=True)
    await run_migrate(settings)
    types = build_id_types(settings)
    key = types["farmer"].generate(0, 100)[0][0]

    def entry(ms: int, op: str, **fields: str) -> tuple[str, dict[str, str]]:
        return f"{ms}-0", {"op": op, "type": "farmer", "keys": key, "clients": "c", **fields}

    first_issue, release, old_mark = (
        entry(1_000, "issue"),
        entry(2_000, "release"),
        entry(2_500, "used"),
    )
    second_issue = entry(3_000, "issue")
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        for entries in ([first_issue], [release], [second_issue], [release, old_mark]):
            async with conn.transaction():
                await apply(conn, parse(entries, types))
        row = await conn.fetchrow(
            sql.for_type("SELECT * FROM {ledger} WHERE key = $1", "farmer"), key
        )
        assert row is not None and row["entry_id"] == "3000-0"  # the second issue
        assert row["released_at"] is None and row["used_at"] is None  # untouched
        moved = await conn.fetchval("SELECT count(*) FROM kd_released_issues WHERE key = $1", key)
        assert moved == 1
        early = await conn.fetchval("SELECT count(*) FROM kd_ledger_early_marks")
        assert early == 0  # the old mark was refused, not kept waiting
    finally:
        await conn.close()


async def test_a_type_may_not_take_the_name_of_a_ledger_table(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    types = small_types() | {"early_marks": small_types()["farmer"]}
    settings = make_settings(servers, database, id_types=types)
    with pytest.raises(SchemaError, match="kd_ledger_early_marks"):
        await run_migrate(settings)


async def test_mosip_errors_come_in_mosips_wrapper_with_mosips_codes(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with stack(servers, database, hot) as (http, _, settings, _):
        never = build_id_types(settings)["farmer"].generate(5_000, 6_000)[0][0]
        assert error_code(await put(http, never, "ASSIGNED")) == "KER-UIG-001"  # never issued
        assert error_code(await put(http, "12", "ASSIGNED")) == "KER-UIG-001"  # not a UIN
        uin = await get_uin(http)
        assert error_code(await put(http, uin, "LOST")) == "KER-UIG-003"  # unknown status
        assert error_code(await put(http, uin, None)) == "KER-UIG-003"  # type: ignore[arg-type]
        # Malformed JSON, no request: MOSIP's internal-error code, HTTP 200, never a 500.
        for raw in (b"{not json", b"[]", b'{"request": null}'):
            reply = await http.put("/v1/idgenerator/uin", content=raw)
            assert reply.status_code == 200 and error_code(reply.json()) == "KER-UIG-005"
        too_big = b"{" + b" " * (settings.dispenser.max_body_bytes + 1) + b"}"
        reply = await http.put("/v1/idgenerator/uin", content=too_big)
        assert reply.status_code == 413 and error_code(reply.json()) == "KER-UIG-005"
        reply = await http.post("/v1/idgenerator/uin")
        assert reply.status_code == 405 and error_code(reply.json()) == "KER-UIG-005"
        # The pool runs dry: MOSIP's "UIN could not be found", in its wrapper.
        await redis_client.delete(*await redis_client.keys("*hot:farmer"))
        reply = await http.get("/v1/idgenerator/uin")
        assert reply.status_code == 200 and error_code(reply.json()) == "KER-UIG-001"
        assert RESPONSE_TIME.fullmatch(reply.json()["responsetime"])


async def test_vid_is_served_and_its_expiry_checked_as_mosip_does(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with stack(servers, database, hot) as (http, _, _settings, _):
        reply = await http.get("/v1/idgenerator/vid")
        assert reply.status_code == 200
        body = reply.json()
        assert list(body) == WRAPPER_FIELDS and body["errors"] is None
        assert body["response"]["vid"].startswith("V")
        later = await http.get(
            "/v1/idgenerator/vid", params={"videxpiry": "2999-01-01T00:00:00.000Z"}
        )
        assert later.json()["errors"] is None
        for value, code in (
            ("", "KER-VID-002"),
            ("2000-01-01T00:00:00.000Z", "KER-VID-003"),
            ("tomorrow", "KER-VID-004"),
        ):
            refused = await http.get("/v1/idgenerator/vid", params={"videxpiry": value})
            assert refused.status_code == 200 and error_code(refused.json()) == code


async def test_the_mosip_paths_are_opt_in(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    async with dispenser_over_http(make_settings(servers, database)) as http:
        assert (await http.get("/v1/idgenerator/uin")).status_code == 404
        assert (await http.get("/v1/idgenerator/vid")).status_code == 404


async def test_a_retry_never_gets_back_a_uin_given_back(
    servers: Servers, database: str, hot: HotStore, redis_client: aioredis.Redis
) -> None:
    """The Idempotency-Key a UIN was issued under is forgotten with its release: a
    retry of that request is answered afresh, never with the UIN given back (which may
    be issued to another client by then)."""
    async with stack(servers, database, hot, reissue=True) as (http, _, _settings, _):
        path, headers = "/v1/idgenerator/farmer/id", {"Idempotency-Key": "enrol-7"}
        first = (await http.post(path, headers=headers)).json()["response"]["id"]
        replay = (await http.post(path, headers=headers)).json()["response"]["id"]
        assert replay == first  # held: the retry gets the same UIN
        assert (await put(http, first, "UNASSIGNED"))["response"]["status"] == "UNUSED"
        after = (await http.post(path, headers=headers)).json()["response"]["id"]
        assert after != first
        # The other request's record is untouched.
        other = {"Idempotency-Key": "enrol-8"}
        kept = (await http.post(path, headers=other)).json()["response"]["id"]
        assert (await http.post(path, headers=other)).json()["response"]["id"] == kept
