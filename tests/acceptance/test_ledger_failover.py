"""The ledger's one history on real servers: an embedded PostgreSQL primary with an
asynchronous streaming replica, the processes reaching them through the multi-host DSN
operators use (``target_session_attrs=read-write``), real keysync and dispenser
processes, MOSIP's API over HTTP. Each of round 4's three behaviours is made to happen
for real (the replica's WAL receiver stopped, then the primary SIGKILLed and the replica
promoted) and must not: what the service answered before the promotion is what it
answers after it (docs/reliability.md, "The ledger's one history").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.drill.postgres import PostgresPair
from keydispenser_ops.embedded import free_port
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.databases import run_migrate, scratch_database
from shared.stores.redis.endpoint import RedisEndpoint
from tests.acceptance.harness import (
    ChildProcesses,
    mosip_dispenser,
    postgres_pair,
    process_env,
    uin_ledger_type,
    wait_for_http,
    write_config,
)
from tests.conftest import NS
from tests.integration.fixtures import Servers, make_settings

pytestmark = pytest.mark.acceptance
DATABASE = "kd_ledger_failover"
CLIENTS = ("client-a", "client-b", "client-c", "auditor")
WAIT_S = 40.0  # every wait's deadline
UIN = "uin"
RETAIN_S = 1.5  # the ledger log's retention: the quiet spells are longer


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with postgres_pair("kd-ledger-failover-") as servers:
        yield servers


@dataclass
class Mosip:
    """MOSIP's API of a dispenser, as each client calls it."""

    settings: Settings
    http: httpx.AsyncClient
    keys: dict[str, str]  # client -> its API key

    def auth(self, client: str) -> dict[str, str]:
        return {"X-API-Key": self.keys[client]}

    async def get_uin(self, client: str) -> str | None:
        reply = await self.http.get("/v1/idgenerator/uin", headers=self.auth(client))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        return None if body["response"] is None else str(body["response"]["uin"])

    async def put(self, client: str, uin: str, status: str) -> str:
        """MOSIP's PUT: the status reported, or the error code."""
        request = {
            "id": "mosip.kernel.uinservice",
            "version": "1.0",
            "request": {"uin": uin, "status": status},
        }
        reply = await self.http.put("/v1/idgenerator/uin", json=request, headers=self.auth(client))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        if body["errors"]:
            return str(body["errors"][0]["errorCode"])
        return str(body["response"]["status"])

    async def lookup(self, uin: str) -> dict[str, Any] | None:
        """What the ledger says of ``uin`` (the auditor sees every client's); None while
        it does not answer (503: restoring, or the processes are moving over)."""
        reply = await self.http.get(f"/v1/keys/{UIN}/{uin}", headers=self.auth("auditor"))
        if reply.status_code == 503:
            return None
        assert reply.status_code == 200, reply.text
        found: dict[str, Any] = reply.json()
        return found

    async def looked_up(self, uin: str) -> dict[str, Any]:
        """The lookup once the ledger answers again (after a failover, its restore)."""
        deadline = time.monotonic() + WAIT_S
        while (found := await self.lookup(uin)) is None:
            assert time.monotonic() < deadline, "the ledger did not answer again"
            await asyncio.sleep(0.2)
        return found

    async def in_the_ledger(self, uin: str, client: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            found = await self.lookup(uin)
            if found is not None and found.get("client") == client:
                return
            assert time.monotonic() < deadline, f"{uin} not in the ledger under {client}"
            await asyncio.sleep(0.1)


@dataclass
class Stack(Mosip):
    pair: PostgresPair

    async def on_both_servers(self) -> None:
        await replayed(self.pair)


async def replayed(pair: PostgresPair) -> None:
    """Until the replica has replayed everything the primary has committed."""
    primary, replica = pair.pair()
    primary_conn = await asyncpg.connect(primary.dsn())
    replica_conn = await asyncpg.connect(replica.dsn())
    try:
        target = await primary_conn.fetchval("SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + WAIT_S
        while not await replica_conn.fetchval("SELECT pg_last_wal_replay_lsn() >= $1", target):
            assert time.monotonic() < deadline, "the replica did not catch up"
            await asyncio.sleep(0.05)
    finally:
        await primary_conn.close()
        await replica_conn.close()


def stack_settings(
    servers: Servers, pair: PostgresPair, keys: dict[str, str], keysyncs_batch: int
) -> Settings:
    settings = make_settings(
        Servers(pair.pair()[0].dsn(), servers.redis_url),
        DATABASE,
        id_types={UIN: uin_ledger_type(reissue_released=True, reissue_after_s=1)},
        dispenser=mosip_dispenser(UIN, 15, keys),
        keysync={
            "poll_interval_s": 0.2,
            "ledger_batch": keysyncs_batch,
            "ledger_retain_s": RETAIN_S,
            "ledger_requeue_every_s": 0.3,
            "ledger_claim_idle_s": 2,
            # The fence's detection time (0.5 + 0.4 + 0.5 s) within RETAIN_S.
            "ledger_watch_s": 0.4,
        },
        postgres_connect_timeout_s=0.5,
    )
    return settings.model_copy(update={"postgres_dsn": pair.dsn(DATABASE)})


@pytest.fixture
async def stack(
    pair: PostgresPair,
    servers: Servers,
    redis_client: aioredis.Redis,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    """One UIN in the hot list and none in the cold tier (no keygen): every UIN a client
    gets is that one, or one given back and requeued. ``keysyncs`` keysync processes
    (the test's parameter, default 1), one dispenser."""
    keysyncs: int = getattr(request, "param", 1)
    if pair.failovers:
        await pair.wait_for_replica()
    await scratch_database(pair.pair()[0].dsn(), DATABASE)
    await replayed(pair)  # the database exists on both servers
    keys = {name: new_api_key()[0] for name in CLIENTS}
    settings = stack_settings(servers, pair, keys, keysyncs_batch=1 if keysyncs > 1 else 100)
    await run_migrate(settings)
    uin = build_id_types(settings)[UIN].generate(500_000_000, 500_001_000)[0][0]
    hot = HotStore(RedisEndpoint(servers.redis_url), NS)
    await hot.push(UIN, [uin], "seed")
    await hot.close()
    children = ChildProcesses(tmp_path)
    config = write_config(settings, tmp_path / "config.yaml")
    port = free_port()
    try:
        for n in range(keysyncs):
            children.spawn("keysync", process_env(settings, config), f"keysync-{n}")
        env = process_env(
            settings, config, KD_DISPENSER__PORT=str(port), KD_DISPENSER__HOST="127.0.0.1"
        )
        children.spawn("dispenser", env, "dispenser")
        await asyncio.to_thread(wait_for_http, f"http://127.0.0.1:{port}/healthz")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield Stack(settings, http, keys, pair)
    finally:
        children.close()


async def test_a_failover_never_revives_a_release(stack: Stack) -> None:
    """Round 4: A is issued a UIN and releases it, it is reissued to B, B's PUT ASSIGNED
    is answered; the promotion lost all that; the replay put the UIN back, to C."""
    uin = await stack.get_uin("client-a")
    assert uin is not None
    await stack.in_the_ledger(uin, "client-a")
    await stack.on_both_servers()
    await stack.pair.pause_replication()  # from now on, on the primary only
    assert await stack.put("client-a", uin, "UNASSIGNED") == "UNUSED"
    deadline = time.monotonic() + WAIT_S
    while (again := await stack.get_uin("client-b")) is None:  # requeued after 1 s
        assert time.monotonic() < deadline, "the UIN given back did not come back"
        await asyncio.sleep(0.2)
    assert again == uin
    assert await stack.put("client-b", uin, "ASSIGNED") == "ASSIGNED"
    await stack.pair.fail_over()
    found = await stack.looked_up(uin)
    assert found["client"] == "client-b" and found["used"] is True
    assert await stack.put("client-b", uin, "ASSIGNED") == "ASSIGNED"  # as answered
    await asyncio.sleep(3)  # well past reissue_after_s and the requeue's period
    for _ in range(5):
        assert await stack.get_uin("client-c") != uin  # never handed out again


async def test_a_quiet_spell_after_a_failover_keeps_what_was_answered(stack: Stack) -> None:
    """Round 4: a failover a second after an answered GET and PUT ASSIGNED, then no
    ledger traffic for longer than the retention: the UIN was gone, A's PUT refused."""
    await stack.on_both_servers()
    await stack.pair.pause_replication()
    uin = await stack.get_uin("client-a")
    assert uin is not None
    assert await stack.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
    await asyncio.sleep(1)
    await stack.pair.fail_over()
    await asyncio.sleep(3 * RETAIN_S)  # quiet: no entry at all
    assert await stack.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
    found = await stack.looked_up(uin)
    assert found["client"] == "client-a" and found["used"] is True


@pytest.mark.parametrize("stack", [2], indirect=True)
async def test_two_keysyncs_a_failover_never_reverses_a_decision(stack: Stack) -> None:
    """Round 4: PUT ASSIGNED and PUT UNASSIGNED of one UIN at once, one in each
    keysync's batch: one answered, the other refused; after the promotion's replay the
    ledger said the opposite, and the answered PUT, repeated, was refused."""
    uin = await stack.get_uin("client-a")
    assert uin is not None
    await stack.in_the_ledger(uin, "client-a")
    await stack.on_both_servers()
    await stack.pair.pause_replication()
    assigned, released = await asyncio.gather(
        stack.put("client-a", uin, "ASSIGNED"), stack.put("client-a", uin, "UNASSIGNED")
    )
    answers = {assigned, released}
    assert answers in ({"ASSIGNED", "KER-UIG-004"}, {"UNUSED", "KER-UIG-004"}), answers
    await stack.pair.fail_over()
    found = await stack.looked_up(uin)
    if assigned == "ASSIGNED":
        assert found["used"] is True and found["client"] == "client-a"
        assert await stack.put("client-a", uin, "ASSIGNED") == "ASSIGNED"
        assert await stack.put("client-a", uin, "UNASSIGNED") == "KER-UIG-004"
    else:
        assert found.get("used") is not True
        assert await stack.put("client-a", uin, "UNASSIGNED") == "UNUSED"
        assert await stack.put("client-a", uin, "ASSIGNED") == "KER-UIG-004"
