"""Machine-ID leases on a real server: grants, compare-and-set renewals and releases,
expiry, the fence's settle period, and the last-timestamp record.

Most tests end the settle period the fence's takeover starts (first use counts) by
hand, by moving ``fenced_at`` back; the settle tests keep it. A new identity
is simulated as in test_fence.py: by overwriting the fence's owner token.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from shared.domain import redis_keys
from shared.domain.errors import NoMachineIdFree
from shared.leases import holder as leasing
from shared.leases.holder import LeaseMetrics, SyncMachineLease, lease_machine_id
from shared.leases.store import MachineLeases
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import Servers

TTL_MS = 400
WAIT_DEADLINE_S = 5.0


@pytest.fixture
async def leases(servers: Servers, redis_client: aioredis.Redis) -> AsyncIterator[MachineLeases]:
    store = MachineLeases(RedisEndpoint(servers.redis_url), NS)
    yield store
    await store.close()


async def settle(leases: MachineLeases, redis_client: aioredis.Redis) -> None:
    """End the settle period the fence's first use started, by moving it back."""
    await leases.holders("p")
    await redis_client.hset(redis_keys.sync_record_key(NS), "fenced_at", 0)


async def new_identity(redis_client: aioredis.Redis) -> None:
    await redis_client.set(redis_keys.fence_key(NS), "another-server:another-replid")


async def test_distinct_ids_until_the_range_is_used_up(
    leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    granted = [await leases.acquire("p", 10, 13, f"o{i}", 10_000, 0, i * 7) for i in range(4)]
    assert all(g.granted for g in granted)
    assert sorted(g.machine_id for g in granted) == [10, 11, 12, 13]
    full = await leases.acquire("p", 10, 13, "late", 10_000, 0, 0)
    assert full.status == "full" and 0 < full.wait_ms <= 10_000
    assert [h.machine_id for h in (await leases.holders("p")).holders] == [10, 11, 12, 13]
    # Another pool is another namespace.
    assert (await leases.acquire("q", 10, 13, "other", 10_000, 0, 0)).granted


async def test_exhaustion_is_a_domain_error_naming_pool_and_range(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(endpoint, "p", 0, 0, ttl_s=5, renew_every_s=1) as first:
            assert first.machine_id == 0 and first.valid()
            with pytest.raises(NoMachineIdFree, match=r"\[0, 0\] of pool 'p'.*every ID is held"):
                async with lease_machine_id(endpoint, "p", 0, 0, wait_s=0.3, renew_every_s=1):
                    pass
    finally:
        await endpoint.close()


async def test_renew_and_release_by_a_non_owner_are_refused(
    leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    mine = await leases.acquire("p", 0, 0, "me", 10_000, 0, 0)
    assert await leases.renew("p", 0, "intruder", mine.fence, 10_000, 0) == "lost"
    assert not await leases.release("p", 0, "intruder")
    assert [h.owner for h in (await leases.holders("p")).holders] == ["me"]
    assert await leases.renew("p", 0, "me", mine.fence, 10_000, 0) == "renewed"
    assert await leases.release("p", 0, "me")
    assert (await leases.holders("p")).holders == []
    assert await leases.renew("p", 0, "me", mine.fence, 10_000, 0) == "lost"  # released


async def test_naive_unconditional_renew_extends_a_stolen_lease(
    redis_client: aioredis.Redis, leases: MachineLeases
) -> None:
    """Control: raus renews with GETSET + EXPIRE. After its lease expired and another
    holder claimed the ID, the old holder's renewal takes it over again: two holders."""
    key = "control:machine:0"
    assert await redis_client.set(key, "A", nx=True, px=100)
    await asyncio.sleep(0.15)
    assert await redis_client.set(key, "B", nx=True, px=10_000)  # B claims the free ID
    previous = await redis_client.getset(key, "A")  # A's naive renewal
    await redis_client.pexpire(key, 10_000)
    assert previous == "B" and await redis_client.get(key) == "A"  # B still believes it holds
    # The same sequence with the compare-and-extend script: A's renewal is refused.
    await settle(leases, redis_client)
    a = await leases.acquire("p", 0, 0, "A", 100, 0, 0)
    await asyncio.sleep(0.15)
    assert (await leases.acquire("p", 0, 0, "B", 10_000, 0, 0)).granted
    assert await leases.renew("p", 0, "A", a.fence, 10_000, 0) == "lost"
    assert [h.owner for h in (await leases.holders("p")).holders] == ["B"]


async def test_a_holder_whose_lease_vanished_is_lost_at_its_next_renewal(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(endpoint, "p", 3, 3, ttl_s=5, renew_every_s=0.1) as held:
            await redis_client.hdel(redis_keys.machine_leases_key(NS, "p"), "3")  # stolen
            assert (await leases.acquire("p", 3, 3, "thief", 10_000, 0, 0)).granted
            await asyncio.wait_for(held.lost.wait(), WAIT_DEADLINE_S)
            assert held.lost_reason == "lost" and not held.valid()
        assert [h.owner for h in (await leases.holders("p")).holders] == ["thief"]  # kept
    finally:
        await endpoint.close()


async def test_expiry_lets_another_holder_in_after_the_old_one_stopped(
    servers: Servers,
    leases: MachineLeases,
    redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renewals hang (a paused or partitioned server looks like this): the holder's
    monotonic deadline alone ends its use, before Redis lets the next holder in."""
    await settle(leases, redis_client)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(
            endpoint, "p", 5, 5, ttl_s=TTL_MS / 1000, renew_every_s=0.1
        ) as held:

            async def hang(*args: object) -> str:
                await asyncio.sleep(3600)
                return "renewed"

            monkeypatch.setattr(MachineLeases, "renew", hang)
            deadline = time.monotonic() + WAIT_DEADLINE_S
            while not (answer := await leases.acquire("p", 5, 5, "next", TTL_MS, 0, 0)).granted:
                assert time.monotonic() < deadline, "the lease never expired"
                await asyncio.sleep(0.01)
            assert answer.machine_id == 5
            assert not held.valid() and held.lost.is_set() and held.lost_reason == "deadline"
    finally:
        await endpoint.close()


async def test_a_new_server_identity_refuses_renewals_and_grants_for_one_ttl(
    leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    old = await leases.acquire("p", 0, 1, "old", TTL_MS, 0, 0)
    await new_identity(redis_client)  # failover, failback, restart from a snapshot

    assert await leases.renew("p", old.machine_id, "old", old.fence, TTL_MS, 0) == "fenced"
    settling = await leases.acquire("p", 0, 1, "new", TTL_MS, 0, 0)
    assert settling.status == "settling" and 0 < settling.wait_ms <= TTL_MS
    began = time.monotonic()
    deadline = began + WAIT_DEADLINE_S
    while not (granted := await leases.acquire("p", 0, 1, "new", TTL_MS, 0, 0)).granted:
        assert granted.status == "settling" and time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert time.monotonic() - began >= (settling.wait_ms - 5) / 1000  # no earlier
    # The old holder's lease is dead on the new identity even where it had not expired.
    assert await leases.renew("p", old.machine_id, "old", old.fence, TTL_MS, 0) == "fenced"


async def test_first_use_of_a_server_waits_the_longest_ttl_granted(
    leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    """An empty server may be a restart that lost its leases: first use settles too,
    and a TTL granted once keeps counting for shorter later leases."""
    first = await leases.acquire("p", 0, 1, "a", TTL_MS, 0, 0)
    assert first.status == "settling"
    await redis_client.hset(redis_keys.sync_record_key(NS), "fenced_at", 0)
    assert (await leases.acquire("p", 0, 1, "a", 60_000, 0, 0)).granted
    await new_identity(redis_client)
    short = await leases.acquire("p", 0, 1, "b", TTL_MS, 0, 0)
    assert short.status == "settling" and short.wait_ms > TTL_MS


async def test_a_fenced_holder_is_lost_and_reacquires_after_the_settle_period(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    endpoint = RedisEndpoint(servers.redis_url)
    ttl_s = 1.0  # 0.9 s between the last renewal and the deadline: a slow server is no loss
    try:
        async with lease_machine_id(endpoint, "p", 0, 3, ttl_s=ttl_s, renew_every_s=0.1) as held:
            await new_identity(redis_client)
            await asyncio.wait_for(held.lost.wait(), WAIT_DEADLINE_S)
            assert held.lost_reason == "fenced"
        with pytest.raises(NoMachineIdFree, match="fence took over"):
            async with lease_machine_id(endpoint, "p", 0, 3, ttl_s=ttl_s, renew_every_s=0.1):
                pass
        async with lease_machine_id(
            endpoint, "p", 0, 3, ttl_s=ttl_s, renew_every_s=0.1, wait_s=WAIT_DEADLINE_S
        ) as again:
            assert again.valid()
    finally:
        await endpoint.close()


async def test_the_last_timestamp_is_carried_to_the_next_holder(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(endpoint, "p", 7, 7, ttl_s=5, renew_every_s=0.1) as first:
            assert first.floor_ms == 0
            now_ms = time.time_ns() // 1_000_000
            assert first.ceiling_ms() >= now_ms + 4_000  # recorded before any minting
            assert (await leases.holders("p")).last_ms[7] == first.ceiling_ms()
            await asyncio.sleep(0.25)  # a renewal or two: the recorded ceiling moves on
            assert (await leases.holders("p")).last_ms[7] == first.ceiling_ms() > now_ms + 4_000
            first.note_issued(now_ms + 1)
            first.note_issued(now_ms)  # not the latest: ignored
        async with lease_machine_id(endpoint, "p", 7, 7, ttl_s=5, renew_every_s=0.1) as second:
            assert second.floor_ms == now_ms + 1  # the release recorded what was minted
        # A holder that never says what it minted leaves its ceiling as the floor.
        async with lease_machine_id(endpoint, "p", 7, 7, ttl_s=5, renew_every_s=0.1) as third:
            ceiling = third.ceiling_ms()
        async with lease_machine_id(endpoint, "p", 7, 7, ttl_s=5, renew_every_s=0.1) as fourth:
            assert fourth.floor_ms == ceiling
    finally:
        await endpoint.close()


async def test_a_killed_holder_leaves_its_ceiling_as_the_floor(
    leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    killed = await leases.acquire("p", 2, 2, "killed", TTL_MS, 1_000, 0)
    assert await leases.renew("p", 2, "killed", killed.fence, TTL_MS, 5_000) == "renewed"
    assert await leases.renew("p", 2, "killed", killed.fence, TTL_MS, 4_000) == "renewed"
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while not (next_holder := await leases.acquire("p", 2, 2, "next", TTL_MS, 0, 0)).granted:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert next_holder.floor_ms == 5_000  # the highest ceiling, never lowered by renewals


async def test_the_sync_form_renews_in_its_own_thread_and_reports_a_loss(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)

    def hold() -> tuple[int, bool, bool]:
        endpoint = RedisEndpoint(servers.redis_url)
        with SyncMachineLease(endpoint, "p", 9, 9, ttl_s=5, renew_every_s=0.1) as held:
            first = held.lease.deadline
            give_up = time.monotonic() + WAIT_DEADLINE_S
            while held.lease.deadline == first and time.monotonic() < give_up:
                time.sleep(0.02)  # until the background thread renews
            renewed = held.lease.deadline > first and held.valid()
            held.note_issued(123)
        return held.machine_id, renewed, held.lost.is_set()

    machine_id, renewed, lost_after = await asyncio.to_thread(hold)
    assert (machine_id, renewed, lost_after) == (9, True, True)  # lost: released
    assert (await leases.holders("p")).last_ms[9] == 123

    def lose() -> str:
        endpoint = RedisEndpoint(servers.redis_url)
        with SyncMachineLease(endpoint, "p", 9, 9, ttl_s=5, renew_every_s=0.1) as held:
            asyncio.run(new_identity_now(servers.redis_url))
            assert held.lost.wait(WAIT_DEADLINE_S)
            return held.lease.lost_reason

    assert await asyncio.to_thread(lose) == "fenced"


async def new_identity_now(url: str) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await new_identity(client)
    finally:
        await client.aclose()


async def test_metrics_count_outcomes_held_leases_and_exhaustion(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis
) -> None:
    await settle(leases, redis_client)
    registry = CollectorRegistry()
    metrics = LeaseMetrics(registry)
    endpoint = RedisEndpoint(servers.redis_url)

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"pool": "p", **labels}) or 0.0

    try:
        async with lease_machine_id(endpoint, "p", 0, 0, renew_every_s=1, metrics=metrics):
            assert sample("kd_leases_held") == 1
            with pytest.raises(NoMachineIdFree):
                async with lease_machine_id(endpoint, "p", 0, 0, metrics=metrics):
                    pass
        assert sample("kd_leases_held") == 0
        assert sample("kd_lease_acquisitions_total", outcome="granted") == 1
        assert sample("kd_lease_acquisitions_total", outcome="full") == 1
        assert sample("kd_lease_pool_exhausted_total") == 1
        assert sample("kd_lease_acquire_duration_seconds_count") == 2
        async with lease_machine_id(
            endpoint, "p", 0, 0, ttl_s=5, renew_every_s=0.1, metrics=metrics
        ) as held:
            await redis_client.hdel(redis_keys.machine_leases_key(NS, "p"), "0")
            await asyncio.wait_for(held.lost.wait(), WAIT_DEADLINE_S)
        assert sample("kd_lease_renew_failures_total", reason="lost") == 1
    finally:
        await endpoint.close()


RENEWALS_CAP = 40  # the stub renewer's own bound, so that the hazard fails, not hangs


async def _renews_through_cancels(
    store: MachineLeases, lease: Any, renew_every_s: float, metrics: object = None
) -> None:
    """The renewer as it runs when its cancellation is lost (before Python 3.12,
    asyncio.wait_for returns its call's result when the call finishes as the
    cancellation lands): it goes on until the lease is lost (or, here, its cap), then
    takes a moment to end."""
    for _ in range(RENEWALS_CAP):
        if lease.lost.is_set():
            break
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(renew_every_s)
    else:
        lease.renewed_past_its_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.5)


async def test_leaving_the_block_stops_a_renewer_whose_cancellation_was_lost(
    servers: Servers,
    leases: MachineLeases,
    redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await settle(leases, redis_client)
    monkeypatch.setattr(leasing, "keep_renewed", _renews_through_cancels)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(endpoint, "p", 4, 4, ttl_s=5, renew_every_s=0.05) as held:
            await asyncio.sleep(0.2)  # the renewer runs
            assert held.valid()
        # Without the lease's flag the exit waited for a renewer that renewed on (up to
        # its cap here; forever in the real one).
        assert not getattr(held, "renewed_past_its_exit", False)
        assert held.lost_reason == "released"
        assert (await leases.holders("p")).holders == []  # released, not left to expire
    finally:
        await endpoint.close()


async def test_a_holder_cancelled_while_leaving_is_cancelled_and_releases(
    servers: Servers,
    leases: MachineLeases,
    redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's cancellation, landing while the exit waits for the renewer, is not
    swallowed (a task that would not stop when cancelled), and the ID is released."""
    await settle(leases, redis_client)
    monkeypatch.setattr(leasing, "keep_renewed", _renews_through_cancels)
    endpoint = RedisEndpoint(servers.redis_url)
    leaving = asyncio.Event()

    async def hold() -> None:
        async with lease_machine_id(endpoint, "p", 6, 6, ttl_s=5, renew_every_s=0.05):
            await asyncio.sleep(0.2)  # the renewer runs
            leaving.set()
        raise AssertionError("the holder went on after it was cancelled")

    try:
        task = asyncio.create_task(hold())
        await leaving.wait()
        await asyncio.sleep(0.1)  # in the exit, waiting for the renewer's last 0.5 s
        task.cancel()
        async with asyncio.timeout(WAIT_DEADLINE_S):
            await asyncio.wait([task])
        assert task.cancelled()
        assert (await leases.holders("p")).holders == []
    finally:
        await endpoint.close()


async def test_a_holder_leaving_after_an_unnoticed_deadline_says_deadline(
    servers: Servers,
    leases: MachineLeases,
    redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The renewer had not run since the deadline passed (a loaded event loop): the
    holder's use ended at its deadline, and its exit says so rather than "released"."""
    await settle(leases, redis_client)

    async def asleep(*args: object) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(leasing, "keep_renewed", asleep)
    endpoint = RedisEndpoint(servers.redis_url)
    try:
        async with lease_machine_id(
            endpoint, "p", 7, 7, ttl_s=TTL_MS / 1000, renew_every_s=0.1
        ) as held:
            await asyncio.sleep(held.deadline - time.monotonic() + 0.02)
            assert not held.valid()
            assert not held.lost.is_set()  # nothing noticed the deadline yet
        assert held.lost_reason == "deadline"
    finally:
        await endpoint.close()
