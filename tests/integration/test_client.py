"""The Python client against a real dispenser over real HTTP, with real Redis."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_client import (
    AsyncKeyClient,
    Buffering,
    KeyClient,
    KeyspaceExhausted,
    RequestRefused,
)
from shared.domain import redis_keys
from shared.domain.apikeys import digest
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

DEADLINE_S = 20.0
RETRY_AFTER_S = 7  # the dispenser's Retry-After for an empty pool, in these tests
API_KEY = "kd_client_test_key"
TAKER = """
import json, sys
from keydispenser_client import Buffering, KeyClient
url, count = sys.argv[1], int(sys.argv[2])
with KeyClient(url, "farmer", buffering=Buffering(batch=250)) as client:
    keys = client.take_many(count, timeout_s=20)
print(json.dumps(keys))
"""


@pytest.fixture
def client_settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return make_settings(
        servers, database, id_types=types, dispenser={"retry_after_s": RETRY_AFTER_S}
    )


@pytest.fixture
async def url(client_settings: Settings) -> AsyncIterator[str]:
    async with dispenser_over_http(client_settings) as http:
        yield str(http.base_url).rstrip("/")


async def fill(hot: HotStore, name: str, count: int, start: int = 0) -> list[str]:
    """Synthetic keys pushed as keysync pushes (the dispenser never looks inside keys)."""
    keys = [f"{i:010d}" for i in range(start, start + count)]
    await hot.push(name, keys, uuid.uuid4().hex)
    return keys


async def hot_depth(redis_client: aioredis.Redis, name: str) -> int:
    return int(await redis_client.llen(redis_keys.hot_list_key(NS, name)))


async def until(condition: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


class Recording(httpx.AsyncBaseTransport):
    """A real HTTP transport that records each exchange; optionally drops the answer
    to the first allocation (the server answered; the client never sees it)."""

    def __init__(self, drop_first: bool = False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.events: list[tuple[Any, ...]] = []
        self.drop_first = drop_first
        self.dropped: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.events.append(("request", request.url.path, request.headers.get("idempotency-key")))
        reply = await self.inner.handle_async_request(request)
        body = await reply.aread()
        self.events.append(
            ("answer", reply.status_code, reply.headers.get("retry-after"), dict(reply.headers))
        )
        if self.drop_first and not self.dropped and reply.status_code == 200:
            self.dropped = json.loads(body)["keys"]
            raise httpx.ReadError("connection lost before the answer arrived", request=request)
        return httpx.Response(
            reply.status_code, headers=reply.headers, content=body, request=request
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


async def take_in_process(url: str, count: int) -> list[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TAKER,
        url,
        str(count),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    keys: list[str] = json.loads(out)
    return keys


async def test_keys_are_unique_across_client_processes(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    pushed = set(await fill(hot, "farmer", 9_000))
    taken = await asyncio.gather(*(take_in_process(url, 2_000) for _ in range(3)))
    every = [key for keys in taken for key in keys]
    assert [len(keys) for keys in taken] == [2_000] * 3
    assert len(set(every)) == len(every) == 6_000
    assert set(every) <= pushed
    left = set(await redis_client.lrange(redis_keys.hot_list_key(NS, "farmer"), 0, -1))
    assert not left & set(every)  # each was issued: popped from the hot list


async def test_threads_sharing_a_client_never_get_the_same_key(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    await fill(hot, "farmer", 5_000)

    def run() -> list[list[str]]:
        with (
            KeyClient(url, "farmer", buffering=Buffering(batch=100)) as client,
            ThreadPoolExecutor(4) as pool,
        ):
            return list(pool.map(lambda _: client.take_many(800, timeout_s=20), range(4)))

    taken = await asyncio.to_thread(run)
    every = [key for keys in taken for key in keys]
    assert len(every) == len(set(every)) == 3_200


async def test_tasks_sharing_an_async_client_never_get_the_same_key(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    await fill(hot, "farmer", 5_000)
    async with AsyncKeyClient(url, "farmer", buffering=Buffering(batch=100)) as client:
        taken = await asyncio.gather(*(client.take_many(300, DEADLINE_S) for _ in range(8)))
    every = [key for keys in taken for key in keys]
    assert len(every) == len(set(every)) == 2_400


async def test_tasks_taking_without_awaiting_never_get_the_same_key(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    await fill(hot, "farmer", 5_000)

    async def taker(client: AsyncKeyClient) -> list[str]:
        keys = []
        for _ in range(300):
            keys.append(client.take_nowait() or await client.take(DEADLINE_S))
            await asyncio.sleep(0)  # the other takers run between two takes
        return keys

    async with AsyncKeyClient(url, "farmer", buffering=Buffering(batch=100)) as client:
        taken = await asyncio.gather(*(taker(client) for _ in range(8)))
    every = [key for keys in taken for key in keys]
    assert len(every) == len(set(every)) == 2_400


async def test_take_nowait_answers_none_once_the_buffer_is_empty_and_it_refills(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    pushed = await fill(hot, "farmer", 10)
    async with AsyncKeyClient(url, "farmer", buffering=Buffering(batch=5, low=1, high=5)) as client:
        await until(lambda: client.depth == 5)
        taken = [client.take_nowait() for _ in range(5)]
        assert client.take_nowait() is None  # no await since: the fetcher had no turn
        await until(lambda: client.depth == 5)
        assert await client.take(DEADLINE_S) == pushed[5]
    assert taken == pushed[:5]


async def test_retry_after_is_waited_before_asking_again(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    transport = Recording()

    async def sleep(seconds: float) -> None:
        transport.events.append(("sleep", seconds))
        await fill(hot, "farmer", 10)  # keys arrive while the client waits

    async with AsyncKeyClient(
        url, "farmer", buffering=Buffering(batch=5), transport=transport, sleep=sleep
    ) as client:
        key = await client.take(DEADLINE_S)
    assert key == f"{0:010d}"
    kinds = [event[0] for event in transport.events]
    assert kinds[:5] == ["request", "answer", "sleep", "request", "answer"]
    assert transport.events[1][1:3] == (503, str(RETRY_AFTER_S))
    assert transport.events[2][1] >= RETRY_AFTER_S
    assert transport.events[4][1] == 200
    # The retry is the same request: it carries the first attempt's Idempotency-Key.
    assert transport.events[0][2] == transport.events[3][2] is not None


async def test_a_lost_answer_is_asked_again_with_its_idempotency_key_and_wastes_nothing(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    await fill(hot, "farmer", 1_000)
    transport = Recording(drop_first=True)
    buffering = Buffering(batch=100, low=1, high=100)  # exactly one batch
    async with AsyncKeyClient(url, "farmer", buffering=buffering, transport=transport) as client:
        first = await client.take(DEADLINE_S)
        await until(lambda: client.depth == 99)
        taken = [first, *(await client.take_many(99, DEADLINE_S))]
    requests = [e for e in transport.events if e[0] == "request"]
    answers = [e for e in transport.events if e[0] == "answer"]
    assert requests[0][2] == requests[1][2] is not None
    assert answers[1][3].get("idempotent-replayed") == "true"
    assert taken == transport.dropped  # the lost answer's keys, replayed
    assert await hot_depth(redis_client, "farmer") == 900  # one batch taken, not two


async def test_a_used_up_keyspace_is_raised_once_the_buffer_is_drained(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    pushed = await fill(hot, "farmer", 3)
    await redis_client.set(redis_keys.exhausted_key(NS, "farmer"), "1")
    buffering = Buffering(batch=2, low=1, high=10)
    async with AsyncKeyClient(url, "farmer", buffering=buffering) as client:
        await until(lambda: client.depth == 3)
        taken = [await client.take(DEADLINE_S) for _ in range(3)]
        with pytest.raises(KeyspaceExhausted, match="IDG-002"):
            await client.take(DEADLINE_S)
        with pytest.raises(KeyspaceExhausted):  # and again, for every later caller
            await client.take(DEADLINE_S)
    assert taken == pushed


async def test_depth_is_reported_and_the_buffer_refills_below_its_low_mark(
    url: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    await fill(hot, "farmer", 2_000)
    buffering = Buffering(batch=100, low=50, high=200)
    async with AsyncKeyClient(url, "farmer", buffering=buffering) as client:
        await until(lambda: client.depth == 200)
        assert await hot_depth(redis_client, "farmer") == 1_800
        await client.take_many(150, DEADLINE_S)  # 50 left: at the mark, no refill yet
        assert client.depth == 50
        await client.take(DEADLINE_S)  # 49: below the mark
        await until(lambda: client.depth == 249)
        assert await hot_depth(redis_client, "farmer") == 1_600


async def test_used_keys_are_reported_in_batches(url: str, redis_client: aioredis.Redis) -> None:
    transport = Recording()
    keys = [f"abc{i:04d}" for i in range(250)]
    buffering = Buffering(batch=100)
    async with AsyncKeyClient(url, "shortlink", buffering=buffering, transport=transport) as client:
        assert await client.mark_used(keys) == 250
    used = [e for e in transport.events if e[0] == "request" and e[1].endswith("/used")]
    assert len(used) == 3
    async with AsyncKeyClient(url, "farmer", buffering=buffering) as client:
        with pytest.raises(RequestRefused) as refused:  # farmer keeps no ledger
            await client.mark_used(["3029384756"])
    assert (refused.value.status, refused.value.code) == (409, "IDG-011")


async def test_api_key_is_sent(
    servers: Servers, database: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    auth = {"api_keys": [{"name": "registry", "sha256": digest(API_KEY)}]}
    settings = make_settings(servers, database, dispenser={"auth": auth})
    await fill(hot, "farmer", 100)
    async with dispenser_over_http(settings) as http:
        url = str(http.base_url).rstrip("/")
        async with AsyncKeyClient(url, "farmer", buffering=Buffering(batch=10)) as anonymous:
            with pytest.raises(RequestRefused) as refused:
                await anonymous.take(DEADLINE_S)
        assert (refused.value.status, refused.value.code) == (401, "IDG-008")
        buffering = Buffering(batch=10)
        async with AsyncKeyClient(url, "farmer", api_key=API_KEY, buffering=buffering) as client:
            assert await client.take(DEADLINE_S) == f"{0:010d}"


async def test_a_batch_above_the_keys_burst_is_lowered_once_to_it(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    hot: HotStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API key whose burst (40) is below the client's default batch (1000): the
    dispenser's 422 names the largest count (KD-Max-Count), the client asks again with
    it, says so once, and every key comes; nothing was taken by the refused request."""
    key = {"name": "small", "sha256": digest(API_KEY), "rate_per_s": 1000, "burst": 40}
    settings = make_settings(servers, database, dispenser={"auth": {"api_keys": [key]}})
    keys = await fill(hot, "farmer", 200)
    recording = Recording()
    async with dispenser_over_http(settings) as http:
        url = str(http.base_url).rstrip("/")
        async with AsyncKeyClient(url, "farmer", api_key=API_KEY, transport=recording) as client:
            got = [await client.take(DEADLINE_S) for _ in range(60)]
    # The refused request took nothing: the first batch starts at the list's head.
    assert got[:40] == keys[:40] and len(set(got)) == 60
    answers = [event[1] for event in recording.events if event[0] == "answer"]
    assert answers[0] == 422 and answers.count(422) == 1  # then 200s (and 429s: the rate)
    assert [r.getMessage() for r in caplog.records if "burst" in r.getMessage()] == [
        "farmer: the API key may take at most 40 keys a request (its burst); batches of 40 "
        "from now on, not 1000: pass Buffering(batch=40) to say so, or raise the key's burst"
    ]


async def test_a_refusal_without_a_count_to_ask_for_stops_the_client(
    servers: Servers, database: str, redis_client: aioredis.Redis, hot: HotStore
) -> None:
    """Control: a 422 that names no smaller count (a batch above dispenser.max_batch)
    is raised as before, never retried."""
    settings = make_settings(servers, database, dispenser={"max_batch": 100})
    await fill(hot, "farmer", 10)
    async with dispenser_over_http(settings) as http:
        url = str(http.base_url).rstrip("/")
        async with AsyncKeyClient(url, "farmer", buffering=Buffering(batch=500)) as client:
            with pytest.raises(RequestRefused) as refused:
                await client.take(DEADLINE_S)
    assert (refused.value.status, refused.value.code) == (422, "IDG-004")
