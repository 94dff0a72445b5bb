"""The Sentinel endpoint's branches on a real Sentinel group (one primary, one replica,
three Sentinels on loopback ports), below the drill.

- the primary is resolved through Sentinel;
- after a failover, a script refused by the demoted primary (READONLY) makes the
  endpoint resolve again, and the next call reaches the promoted replica;
- without any error, the background re-check (``_VERIFY_EVERY_S``) finds the new primary;
- while no primary can be found, callers fail at once (IDG-005) instead of queueing,
  and resolutions are throttled (``_RESOLVE_EVERY_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from keydispenser_ops.drill.topology import MASTER, Topology
from shared.domain import redis_keys
from shared.domain.config import SentinelConfig
from shared.domain.errors import StoreUnavailable
from shared.stores.hot.hot_store import HotStore
from shared.stores.redis import endpoint as redis_endpoint
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS

DEADLINE_S = 30.0
LOOKING = "looking for the primary"


@pytest.fixture
async def group() -> AsyncIterator[Topology]:
    with tempfile.TemporaryDirectory(prefix="kd-sentinel-") as tmp:
        topology = Topology(Path(tmp))
        try:
            await asyncio.to_thread(topology.start, 1, 3)
            await asyncio.to_thread(topology.wait_for_replicas, 1)
            await until(lambda: asyncio.to_thread(sentinel_sees_a_replica, topology))
            yield topology
        finally:
            await asyncio.to_thread(topology.stop)


def sentinel_sees_a_replica(group: Topology) -> bool:
    """The Sentinel asked to fail over knows a healthy replica it could promote."""
    replicas = group.sentinels[0].command("SENTINEL", "REPLICAS", MASTER)  # parsed to dicts
    return any(r["flags"] == "slave" and r["master-link-status"] == "ok" for r in replicas)


def endpoint_for(group: Topology) -> RedisEndpoint:
    config = SentinelConfig(sentinels=tuple(group.sentinel_addresses()), master_name=MASTER)
    return RedisEndpoint(sentinel=config)


async def fail_over(group: Topology, *, demote: bool) -> tuple[int, int]:
    """A Sentinel failover; returns (old primary port, new primary port) once the
    Sentinels name the new one. ``demote`` turns the old primary into the new one's
    replica at once, as Sentinel does at its next check of it (up to 10 s later)."""
    old = group.primary_port()
    assert old is not None
    await asyncio.to_thread(group.sentinel_failover)
    new = await asyncio.to_thread(group.wait_for_primary, DEADLINE_S, old)
    if demote:
        await asyncio.to_thread(group.server(old).command, "REPLICAOF", "127.0.0.1", str(new))
        await until(lambda: asyncio.to_thread(lambda: group.role(group.server(old)) == "slave"))
    return old, new


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s")
        await asyncio.sleep(0.05)


async def test_a_refused_script_on_the_demoted_primary_leads_to_the_new_one(
    group: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No background re-check: only the READONLY refusal can make the endpoint move.
    monkeypatch.setattr(redis_endpoint, "_VERIFY_EVERY_S", 3600.0)
    hot = HotStore(endpoint_for(group), NS)
    try:
        await hot.push("farmer", [f"f{i}" for i in range(10)], "b1")
        primary = await hot.endpoint.client()
        assert await primary.execute_command("WAIT", 1, 5000) == 1  # type: ignore[no-untyped-call]
        old, new = await fail_over(group, demote=True)
        assert hot.endpoint.address == ("127.0.0.1", old)
        # Sentinel may have closed the old primary's client connections; a bare PING
        # (which never invalidates the endpoint) drops a dead one, so the script below
        # runs on the demoted primary.
        with contextlib.suppress(RedisConnectionError):
            await (await hot.endpoint.client()).ping()
        with pytest.raises(StoreUnavailable, match="this server is a replica"):
            await hot.pop("farmer", 1)  # the demoted primary refuses
        await asyncio.sleep(2 * redis_endpoint._RESOLVE_EVERY_S)
        popped = await hot.pop("farmer", 1)
        assert hot.endpoint.address == ("127.0.0.1", new)
        assert popped.keys == []  # the promoted replica discarded what it inherited
        assert await hot.discarded_counts() == {redis_keys.hot_list_key(NS, "farmer"): 10}
    finally:
        await hot.close()


async def test_the_background_re_check_finds_a_new_primary_without_any_error(
    group: Topology,
) -> None:
    endpoint = endpoint_for(group)
    try:
        await endpoint.client()
        old, new = await fail_over(group, demote=False)
        assert endpoint.address == ("127.0.0.1", old)

        async def moved() -> bool:
            await endpoint.client()  # no command runs: nothing can fail and invalidate
            return endpoint.address == ("127.0.0.1", new)

        await until(moved)
    finally:
        await endpoint.close()


async def test_callers_fail_at_once_while_no_primary_can_be_found(
    group: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    for server in group.servers:  # the Sentinels still name a primary; nobody answers
        group.kill(server)
    endpoint = endpoint_for(group)
    try:
        # Concurrent callers: one resolves, the others fail at once rather than queue.
        results = await asyncio.gather(
            *(endpoint.client() for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        texts = [str(r) for r in results]
        assert sum("no primary found" in t for t in texts) == 1
        assert sum(LOOKING in t for t in texts) == 4
        # Throttled: the next caller does not start another resolution.
        monkeypatch.setattr(redis_endpoint, "_RESOLVE_EVERY_S", 3600.0)
        with pytest.raises(StoreUnavailable, match=LOOKING):
            await endpoint.client()
    finally:
        await endpoint.close()
