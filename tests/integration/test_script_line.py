"""The pop's own connection (ScriptLine) on a real server: every reply reaches the call
that sent its command, the connection follows the endpoint's client, and a server
without the script gets it loaded and runs the command once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.stores.hot.hot_store import HotStore
from shared.stores.redis.script_line import LineScript, ScriptLine
from tests.integration.fixtures import Servers

COUNTER = "kd-test-line-counter"
INCR = LineScript("return redis.call('INCR', KEYS[1])")


def given(client: aioredis.Redis) -> Callable[[], Awaitable[aioredis.Redis]]:
    """What a port passes a line: how to get the endpoint's current client."""

    async def client_of() -> aioredis.Redis:
        return client

    return client_of


@pytest.fixture
async def line() -> AsyncIterator[ScriptLine]:
    each = ScriptLine()
    yield each
    await each.close()


async def counted(client: aioredis.Redis) -> int:
    return int(str(await client.get(COUNTER)))


async def client_names(client: aioredis.Redis) -> set[str]:
    return {str(entry.get("name", "")) for entry in await client.client_list()}


async def test_a_pop_cancelled_before_its_reply_never_hands_that_reply_to_the_next_pop(
    hot: HotStore, redis_client: aioredis.Redis
) -> None:
    keys = [f"k{i:03d}" for i in range(100)]
    await hot.push("farmer", keys, "b1")
    first = await hot.pop_coalesced("farmer", 1)  # the line is connected
    # The server holds every script call from here on: the next pop's reply never comes.
    await redis_client.client_pause(10_000, all=False)  # writes (and scripts) wait
    try:
        stuck = asyncio.create_task(hot.pop_coalesced("farmer", 10))
        await asyncio.sleep(0.3)
        assert not stuck.done()
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
    finally:
        await redis_client.client_unpause()

    # Had the connection been kept, this pop would read the cancelled pop's reply:
    # ten keys for a request of three.
    popped = await hot.pop_coalesced("farmer", 3)
    rest = await hot.pop_coalesced("farmer", 1_000)
    assert len(popped.keys) == 3
    handed = first.keys + popped.keys + rest.keys
    assert len(handed) == len(set(handed))
    assert set(handed) <= set(keys)
    # The cancelled pop either never ran or ran and its keys are lost: never handed out.
    assert len(handed) in (100, 90)


async def test_an_error_reply_leaves_the_line_usable(
    line: ScriptLine, redis_client: aioredis.Redis
) -> None:
    failing = LineScript("return redis.error_reply('KDTEST no')")
    counting = INCR
    with pytest.raises(ResponseError, match="KDTEST no"):
        await line.run(given(redis_client), failing, [], [])
    assert await line.run(given(redis_client), counting, [COUNTER], []) == 1
    assert await line.run(given(redis_client), counting, [COUNTER], []) == 2


async def test_a_server_without_the_script_gets_it_and_runs_the_command_once(
    line: ScriptLine, redis_client: aioredis.Redis
) -> None:
    counting = INCR
    assert await line.run(given(redis_client), counting, [COUNTER], []) == 1
    await redis_client.script_flush()
    assert await line.run(given(redis_client), counting, [COUNTER], []) == 2
    assert await counted(redis_client) == 2


async def test_the_line_moves_to_a_new_client_and_closes_the_old_connection(
    line: ScriptLine, servers: Servers, redis_client: aioredis.Redis
) -> None:
    first = aioredis.Redis.from_url(servers.redis_url, client_name="kd-test-line-first")
    second = aioredis.Redis.from_url(servers.redis_url, client_name="kd-test-line-second")
    try:
        counting = INCR
        await line.run(given(first), counting, [COUNTER], [])
        names = await client_names(redis_client)
        assert "kd-test-line-first" in names

        await line.run(given(second), counting, [COUNTER], [])
        await asyncio.sleep(0.1)  # the server notices the closed connection
        names = await client_names(redis_client)
        assert "kd-test-line-second" in names
        assert "kd-test-line-first" not in names
        assert await counted(redis_client) == 2
    finally:
        await first.aclose()
        await second.aclose()


async def test_arguments_of_every_kind_arrive_as_the_library_would_send_them(
    line: ScriptLine, redis_client: aioredis.Redis
) -> None:
    echo = LineScript("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]}")
    got = await line.run(given(redis_client), echo, ["é-key", "k2"], [42, "ünï", b"raw"])
    assert got == ["é-key", "k2", "42", "ünï", "raw"]


async def test_a_call_without_a_reply_in_the_socket_timeout_fails_and_the_next_is_in_step(
    line: ScriptLine, servers: Servers, redis_client: aioredis.Redis
) -> None:
    impatient = aioredis.Redis.from_url(servers.redis_url, socket_timeout=0.3)
    try:
        counting = INCR
        assert await line.run(given(impatient), counting, [COUNTER], []) == 1
        await redis_client.client_pause(10_000, all=False)  # writes (and scripts) wait
        try:
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                await line.run(given(impatient), counting, [COUNTER], [])
            assert time.monotonic() - started < 3
        finally:
            await redis_client.client_unpause()
        # Its own reply (2, or 3 when the timed-out call ran before the server saw its
        # connection close), never the one the timed-out call was waiting for.
        after = await line.run(given(impatient), counting, [COUNTER], [])
        assert after == await counted(redis_client)
    finally:
        await impatient.aclose()


async def test_a_call_waiting_for_the_line_goes_where_the_endpoint_points_when_it_gets_it(
    line: ScriptLine, servers: Servers, redis_client: aioredis.Redis
) -> None:
    first = aioredis.Redis.from_url(servers.redis_url, client_name="kd-test-line-first")
    second = aioredis.Redis.from_url(servers.redis_url, client_name="kd-test-line-second")
    current = [first]

    async def client_of() -> aioredis.Redis:
        return current[0]

    try:
        assert await line.run(client_of, INCR, [COUNTER], []) == 1
        await redis_client.client_pause(10_000, all=False)  # writes (and scripts) wait
        try:
            held = asyncio.create_task(line.run(client_of, INCR, [COUNTER], []))
            await asyncio.sleep(0.2)
            waiting = asyncio.create_task(line.run(client_of, INCR, [COUNTER], []))
            await asyncio.sleep(0.1)
            current[0] = second  # a new primary while it waited for the line
        finally:
            await redis_client.client_unpause()
        assert await held == 2
        assert await waiting == 3
        await asyncio.sleep(0.1)  # the server notices the closed connection
        names = await client_names(redis_client)
        assert "kd-test-line-second" in names
        assert "kd-test-line-first" not in names
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_closed_line_refuses_calls(line: ScriptLine, redis_client: aioredis.Redis) -> None:
    assert await line.run(given(redis_client), INCR, [COUNTER], []) == 1
    await line.close()
    with pytest.raises(RedisConnectionError):
        await line.run(given(redis_client), INCR, [COUNTER], [])
    assert await counted(redis_client) == 1
