"""Machine-ID leases under a Redis split brain: two servers both answering as primary.

Three real servers: a primary and two replicas. A replica is promoted (the other
follows it) while the old primary keeps running and keeps answering the holder that
still reaches it (a partition; ``SENTINEL FAILOVER`` with the old primary up). The
promoted server grants the same machine ID to a new holder once its settle period
(one TTL) has passed. With ``lease_wait_replicas`` the old holder's renewals on the
cut-off primary are acknowledged by no replica and do not count: it stops at its
deadline, before the new grant. Without (the control), it renews on and both hold
the ID at once.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.embedded import EmbeddedRedis
from shared.domain import redis_keys
from shared.domain.errors import NoMachineIdFree
from shared.domain.leases import LeaseWait
from shared.leases.holder import lease_machine_id
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import end_lease_settling
from tests.integration.test_replica_fence import replicaof, synced

TTL_S, RENEW_S = 2.0, 0.4


@pytest.fixture
async def three() -> AsyncIterator[list[EmbeddedRedis]]:
    with tempfile.TemporaryDirectory(prefix="kd-lease-split-") as tmp:
        servers = [EmbeddedRedis(Path(tmp) / name) for name in ("p", "r1", "r2")]
        for server in servers:
            server.start()
        try:
            for server in servers:  # full syncs start at once, not after 5 s
                async with aioredis.Redis.from_url(server.url) as client:
                    await client.config_set("repl-diskless-sync-delay", 0)
            primary = aioredis.Redis.from_url(servers[0].url)
            for replica in servers[1:]:
                async with aioredis.Redis.from_url(replica.url) as client:
                    await replicaof(client, "127.0.0.1", str(servers[0].port))
                    await synced(primary, client)
            await primary.aclose()
            yield servers
        finally:
            for server in servers:
                server.stop()


async def split(servers: list[EmbeddedRedis]) -> None:
    """r1 is promoted and r2 follows it; the old primary stays up, with no replica."""
    async with (
        aioredis.Redis.from_url(servers[1].url) as r1,
        aioredis.Redis.from_url(servers[2].url) as r2,
    ):
        await r1.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
        await replicaof(r2, "127.0.0.1", str(servers[1].port))
        await synced(r1, r2)


@pytest.mark.parametrize("replicas", [1, 0])
async def test_a_cut_off_primary_cannot_keep_a_lease_the_promoted_one_grants(
    three: list[EmbeddedRedis], replicas: int
) -> None:
    wait = LeaseWait(replicas, 200)
    old_side, new_side = RedisEndpoint(three[0].url), RedisEndpoint(three[1].url)
    async with aioredis.Redis.from_url(three[0].url, decode_responses=True) as client:
        await end_lease_settling(three[0].url, client)  # a fresh server grants at once

    def holder(endpoint: RedisEndpoint, owner: str, wait_s: float = 0.0) -> Any:
        return lease_machine_id(
            endpoint, "split", 0, 0, ttl_s=TTL_S, renew_every_s=RENEW_S, wait_s=wait_s,
            owner=owner, namespace=NS, wait=wait,
        )  # fmt: skip

    try:
        # Every step is bounded; this bounds them together, well under the suite's
        # per-test limit. (Under load this control once stalled: a renewer whose
        # cancellation asyncio.wait_for had lost renewed on, and the holder's exit
        # waited for it; the exit now stops it by the lease's flag as well.)
        async with asyncio.timeout(90):
            # Before the split both replicas are there: the first grant may wait (a busy
            # machine can take longer than one WAIT of 200 ms to acknowledge it).
            async with holder(old_side, "old", wait_s=3 * TTL_S) as old:
                await split(three)
                async with holder(new_side, "new", wait_s=3 * TTL_S) as new:
                    both = old.valid() and new.valid()
        if replicas:
            assert not both, "two live holders of one machine ID"
            assert old.lost_reason == "deadline"
        else:
            assert both  # the hazard WAIT closes: the old primary kept renewing
    finally:
        await old_side.close()
        await new_side.close()


async def test_a_cut_off_primary_grants_nothing_that_counts(three: list[EmbeddedRedis]) -> None:
    """A new holder that reaches only the old primary gets no lease (no replica has the
    grant), and the grant is given back there."""
    async with aioredis.Redis.from_url(three[0].url, decode_responses=True) as client:
        await end_lease_settling(three[0].url, client)
        await split(three)
        endpoint = RedisEndpoint(three[0].url)
        try:
            with pytest.raises(NoMachineIdFree, match="no Redis replica acknowledged"):
                async with lease_machine_id(
                    endpoint, "split", 0, 0, ttl_s=TTL_S, renew_every_s=RENEW_S,
                    wait_s=0.5, namespace=NS, wait=LeaseWait(1, 100),
                ):  # fmt: skip
                    pass
        finally:
            await endpoint.close()
        assert await client.hlen(redis_keys.machine_leases_key(NS, "split")) == 0
