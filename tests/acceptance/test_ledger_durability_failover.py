"""Each ledger durability mode against the loss of a server of each tier, on real
servers: a PostgreSQL primary with an asynchronous streaming replica (behind the
multi-host DSN, ``target_session_attrs=read-write``), a Redis primary with a replica
(behind one loopback address the test moves to the promoted server, as a virtual IP is
moved after a failover done by hand), real keysync and dispenser processes, MOSIP's API
over HTTP. docs/reliability.md, "What each durability mode survives", is this module's
table.

The run: answers given while both tiers copy; PostgreSQL's replica stops receiving WAL;
answers given while only Redis's replica copies; then Redis's replica is frozen
(SIGSTOP) and its primary gives up on it (``repl-timeout``), so nothing written from then
on reaches it even once it runs again; answers asked for. Then the faults, each made for
real: Redis's primary SIGKILLed, its replica resumed and promoted (``REPLICAOF NO ONE``),
a new replica for it; PostgreSQL's primary SIGKILLed and its replica promoted, losing
every commit since its WAL stopped. Seconds apart (the processes reach the old
PostgreSQL primary through the promoted Redis first), or at once (a site holding both
primaries lost).

- ``replicated``, and ``fsynced`` (on servers with WAITAOF, each writing its
  append-only file): nothing is acknowledged while the replica is frozen (the answers
  wait for it), and every answer acknowledged before stands afterwards, the ledger
  running; at once, the PostgreSQL fence cannot tell what the record lost and halts
  leases and syncs until the runbook's ``fence-postgres``, after which every answer
  stands.
- ``async`` (the control): the answers given while the replica was frozen are
  acknowledged at once, and their ledger links die with both primaries: the ledger
  halts (its history cannot be restored) and answers nothing until an operator accepts
  the loss.
- A Redis primary restarted without persistence loses, whatever the mode, the issues
  keysync had not applied yet (answered status changes were applied first); restarted
  from its append-only file, ``fsynced`` keeps them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.drill.postgres import PostgresPair
from keydispenser_ops.drill.proxy import Proxy, standalone
from keydispenser_ops.embedded import EmbeddedRedis, free_port, waitaof_server_binary
from keydispenser_ops.processes import run_cli
from shared.domain import redis_keys
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.domain.tiers import not_issued
from shared.stores.fence.sync_record import SyncRecord
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
from tests.acceptance.test_ledger_failover import Mosip, replayed
from tests.conftest import NS
from tests.integration import test_replica_fence
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_ledger_durability import FSYNC_WAIT_MS, replica_fsyncs
from tests.integration.test_replica_fence import Pair, replicaof, synced

pytestmark = pytest.mark.acceptance

DATABASE = "kd_durability_failover"
CLIENTS = ("client-a", "client-b", "client-c", "client-d", "auditor")
UIN = "uin"
WAIT_S = 40.0  # every wait's deadline
PUT_WAIT_S = 4  # dispenser.mosip.ledger_wait_s: a PUT keysync cannot apply gives up then
HALTED = "IDG-017"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresPair]:
    with postgres_pair("kd-durability-failover-") as servers:
        yield servers


# Every Redis server of an ``fsynced`` test writes its append-only file, fsynced at each
# write (with ``everysec`` a WAITAOF may wait a second for a replica's acknowledgement).
AOF = ("--appendonly", "yes", "--appendfsync", "always")


def durability_of(request: pytest.FixtureRequest) -> str:
    """The durability the test's ``stack`` is parametrized with."""
    return str(request.node.callspec.params["stack"])


@pytest.fixture
async def redis_pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """An embedded Redis primary and its replica, caught up. For an ``fsynced`` test,
    servers that have WAITAOF (Redis 7.2 or later, Valkey), both writing their
    append-only file: once the replica's is written, every write reaches it."""
    if durability_of(request) != "fsynced":
        async with test_replica_fence.started_pair() as found:
            yield found
        return
    async with test_replica_fence.started_pair(waitaof_server_binary(), *AOF) as found:
        await found.replica_client.config_set("appendfsync", "always")
        await found.replica_client.config_set("appendonly", "yes")
        await test_replica_fence.until(
            lambda: replica_fsyncs(found.primary_client), "the replica's AOF written"
        )
        yield found


@dataclass
class RedisFailover:
    """Both Redis servers, the one address the processes use (a proxy in front of the
    primary), and the failover done by hand; every server it starts runs ``binary``
    with ``options`` (the pair's)."""

    pair: Pair
    front: Proxy
    base: Path
    binary: str = ""
    options: tuple[str, ...] = ()
    spares: list[EmbeddedRedis] = field(default_factory=list)

    def spare(self) -> EmbeddedRedis:
        """A new server started as the pair's are, empty."""
        server = EmbeddedRedis(self.base / f"spare-{len(self.spares)}", binary=self.binary)
        self.spares.append(server)
        server.start(*self.options)
        return server

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.front.port}/0"

    def pid(self, server: EmbeddedRedis) -> int:
        assert server.process is not None
        return server.process.pid

    async def freeze_replica(self) -> None:
        """The replica SIGSTOPped, and dropped by its primary once ``repl-timeout`` (1 s)
        passes without its acknowledgements: what the primary writes from then on never
        reaches it, even once it runs again."""
        await self.pair.primary_client.config_set("repl-timeout", 1)
        os.kill(self.pid(self.pair.replica), signal.SIGSTOP)
        deadline = time.monotonic() + WAIT_S
        while (await self.pair.primary_client.info("replication"))["connected_slaves"]:
            assert time.monotonic() < deadline, "the primary kept its frozen replica"
            await asyncio.sleep(0.1)

    async def fail_over(self) -> None:
        """The primary SIGKILLed; the frozen replica resumed and promoted; the front
        moved to it; a new empty server made its replica (``replicated`` waits for one)."""
        os.kill(self.pid(self.pair.primary), signal.SIGKILL)
        os.kill(self.pid(self.pair.replica), signal.SIGCONT)
        await replicaof(self.pair.replica_client, "NO", "ONE")
        self.front.retarget(self.pair.replica.port)
        spare = self.spare()
        async with aioredis.Redis.from_url(spare.url, decode_responses=True) as client:
            await replicaof(client, "127.0.0.1", str(self.pair.replica.port))
            await synced(self.pair.replica_client, client)

    async def restart_empty(self) -> None:
        """The primary restarted without persistence, before anyone fails over: the
        front reaches a new empty server, and the replica resyncs from it (empty)."""
        os.kill(self.pid(self.pair.primary), signal.SIGKILL)
        spare = self.spare()
        self.front.retarget(spare.port)
        async with aioredis.Redis.from_url(spare.url, decode_responses=True) as client:
            await client.config_set("repl-diskless-sync-delay", 0)
            await replicaof(self.pair.replica_client, "127.0.0.1", str(spare.port))
            await synced(client, self.pair.replica_client)

    async def restart_from_its_file(self) -> None:
        """The primary SIGKILLed and started again in its own data directory on its own
        port (the front's target): it loads its append-only file, and its replica,
        reconnected, resyncs from it."""
        process = self.pair.primary.process
        assert process is not None
        process.kill()
        process.wait()
        self.pair.primary.start(*self.options)
        async with aioredis.Redis.from_url(self.pair.primary.url, decode_responses=True) as client:
            await client.config_set("repl-diskless-sync-delay", 0)
            await synced(client, self.pair.replica_client)

    async def halted(self) -> str:
        """Why the fence halted leases and syncs, once it has."""
        sync = SyncRecord(RedisEndpoint(self.url), NS)
        try:
            deadline = time.monotonic() + WAIT_S
            while not (record := await sync.read()).halted:
                assert time.monotonic() < deadline, "the fence did not halt"
                await asyncio.sleep(0.1)
            return record.halt_reason
        finally:
            await sync.close()

    async def vouched(self) -> None:
        """Until a process has rebuilt the sync record the promoted server inherited
        (untrusted since its fence) from PostgreSQL's primary: Redis's failover has been
        seen by the processes before PostgreSQL's."""
        sync = SyncRecord(RedisEndpoint(self.url), NS)
        try:
            deadline = time.monotonic() + WAIT_S
            while (await sync.read()).needs_vouch:
                assert time.monotonic() < deadline, "no process vouched for the record"
                await asyncio.sleep(0.1)
        finally:
            await sync.close()


@pytest.fixture
async def redis(request: pytest.FixtureRequest, redis_pair: Pair) -> AsyncIterator[RedisFailover]:
    front = standalone("127.0.0.1", redis_pair.primary.port)
    fsynced = durability_of(request) == "fsynced"
    binary, options = (waitaof_server_binary(), AOF) if fsynced else ("", ())
    with tempfile.TemporaryDirectory(prefix="kd-durability-redis-") as tmp:
        found = RedisFailover(redis_pair, front, Path(tmp), binary, options)
        try:
            yield found
        finally:
            os.kill(found.pid(redis_pair.replica), signal.SIGCONT)  # frozen or not
            for spare in found.spares:
                spare.stop()
            front.hub.close()


def durable(durability: str) -> dict[str, object]:
    """The type's durability fields: ``fsynced`` waits long enough for a replica's
    acknowledgement of its fsync (config refuses less)."""
    wait = {"ledger_wait_ms": FSYNC_WAIT_MS} if durability == "fsynced" else {}
    return {"ledger_durability": durability, **wait}


def tier_settings(
    servers: Servers, postgres: PostgresPair, redis_url: str, keys: dict[str, str], durability: str
) -> Settings:
    settings = make_settings(
        Servers(postgres.pair()[0].dsn(), redis_url),
        DATABASE,
        redis_url=redis_url,
        id_types={UIN: uin_ledger_type(hot={"low": 1, "high": 8}, **durable(durability))},
        dispenser=mosip_dispenser(UIN, PUT_WAIT_S, keys),
        keysync={"poll_interval_s": 0.2, "ledger_batch": 100, "ledger_retain_s": 60},
        postgres_connect_timeout_s=0.5,
    )
    return settings.model_copy(update={"postgres_dsn": postgres.dsn(DATABASE)})


@dataclass
class Service(Mosip):
    """MOSIP's API as each client calls it, with the answers a fault may refuse, and
    keysync's log."""

    children: ChildProcesses
    keysync_env: dict[str, str]
    keysync: subprocess.Popen[bytes]

    @property
    def keysync_log(self) -> Path:
        return self.children.log_dir / "keysync.log"

    def stop_keysync(self) -> None:
        """keysync stopped (SIGTERM): nothing is applied until ``start_keysync``. (A
        SIGSTOP would not do: an entry written meanwhile reaches its blocked read, and is
        applied once it runs again, whatever became of Redis.)"""
        self.keysync.terminate()
        self.keysync.wait(WAIT_S)

    def start_keysync(self) -> None:
        self.keysync = self.children.spawn("keysync", self.keysync_env, "keysync")

    def restored(self) -> int:
        """How many ledger links keysync wrote again after a PostgreSQL promotion (its
        ``ledger_restored_after_fence`` events)."""
        events = [json.loads(line) for line in self.keysync_log.read_text().splitlines()]
        return sum(e["links"] for e in events if e.get("event") == "ledger_restored_after_fence")

    async def try_uin(self, client: str) -> str | None:
        """A UIN acknowledged to ``client``, or None (refused: not acknowledged)."""
        reply = await self.http.get("/v1/idgenerator/uin", headers=self.auth(client))
        if reply.status_code != 200:
            return None
        body = reply.json()
        return None if body["response"] is None else str(body["response"]["uin"])

    async def drained(self) -> None:
        """Until keysync has applied every entry of the ledger stream: a lookup shows an
        issue only once its entry is applied (docs/api.md, "Lag"), and an entry left
        pending by a failover is applied once the ledger is restored."""
        async with aioredis.Redis.from_url(self.settings.redis_url) as client:
            deadline = time.monotonic() + WAIT_S
            while await client.xlen(redis_keys.ledger_stream_key(NS)):
                assert time.monotonic() < deadline, "keysync did not drain the stream"
                await asyncio.sleep(0.1)

    async def settled(self, uin: str) -> dict[str, Any]:
        """The ledger's answer for ``uin`` once it answers (a failover's restore done),
        or ``{"halted": message}`` once it says it halted."""
        deadline = time.monotonic() + WAIT_S
        while True:
            reply = await self.http.get(f"/v1/keys/{UIN}/{uin}", headers=self.auth("auditor"))
            if reply.status_code == 200:
                found: dict[str, Any] = reply.json()
                return found
            errors = reply.json().get("errors") or [{}]
            if errors[0].get("errorCode") == HALTED:
                return {"halted": errors[0]["message"].split(" (request id")[0]}
            assert reply.status_code == 503, reply.text
            assert time.monotonic() < deadline, f"the ledger did not answer again: {reply.text}"
            await asyncio.sleep(0.2)


@pytest.fixture
async def stack(
    request: pytest.FixtureRequest,
    postgres: PostgresPair,
    redis: RedisFailover,
    servers: Servers,
    tmp_path: Path,
) -> AsyncIterator[Service]:
    """Five UINs in the hot list, none in the cold tier (no keygen); one keysync, one
    dispenser, reaching Redis through the front. The type's durability is the test's
    parameter."""
    durability: str = request.param
    if postgres.failovers:
        await postgres.wait_for_replica()
    await scratch_database(postgres.pair()[0].dsn(), DATABASE)
    await replayed(postgres)  # the database exists on both servers
    keys = {name: new_api_key()[0] for name in CLIENTS}
    settings = tier_settings(servers, postgres, redis.url, keys, durability)
    await run_migrate(settings)
    uins = build_id_types(settings)[UIN].generate(500_000_000, 500_001_000)[0][:5]
    hot = HotStore(RedisEndpoint(redis.url), NS)
    await hot.push(UIN, uins, "seed")
    await hot.close()
    children = ChildProcesses(tmp_path)
    config = write_config(settings, tmp_path / "config.yaml")
    port = free_port()
    try:
        keysync_env = process_env(settings, config)
        keysync = children.spawn("keysync", keysync_env, "keysync")
        env = process_env(
            settings, config, KD_DISPENSER__PORT=str(port), KD_DISPENSER__HOST="127.0.0.1"
        )
        children.spawn("dispenser", env, "dispenser")
        await asyncio.to_thread(wait_for_http, f"http://127.0.0.1:{port}/healthz")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield Service(settings, http, keys, children, keysync_env, keysync)
    finally:
        children.close()


@dataclass
class Answered:
    """What the service acknowledged before the faults: each UIN's client, whether it
    was answered ASSIGNED (True) or UNASSIGNED (False) last."""

    issued: dict[str, str] = field(default_factory=dict)  # uin -> client
    assigned: dict[str, bool] = field(default_factory=dict)  # uin -> last status answered


async def issue(service: Service, client: str, answered: Answered) -> str:
    uin = await service.get_uin(client)
    assert uin is not None
    answered.issued[uin] = client
    return uin


async def put(service: Service, client: str, uin: str, status: str, answered: Answered) -> None:
    reply = await service.put(client, uin, status)
    assert reply == status, reply  # a release of a type never reissuing: UNASSIGNED
    answered.assigned[uin] = status == "ASSIGNED"


async def answers_while_replicas_copy(
    service: Service, postgres: PostgresPair, answered: Answered
) -> None:
    """Answers on both tiers' replicas; then on Redis's replica only."""
    first = await issue(service, "client-a", answered)
    await put(service, "client-a", first, "ASSIGNED", answered)
    second = await issue(service, "client-b", answered)
    await service.in_the_ledger(second, "client-b")
    await replayed(postgres)
    await postgres.pause_replication()  # from now on, on PostgreSQL's primary only
    third = await issue(service, "client-c", answered)
    await put(service, "client-c", third, "ASSIGNED", answered)
    await put(service, "client-b", second, "UNASSIGNED", answered)
    await put(service, "client-a", first, "ASSIGNED", answered)  # a repeat, answered again
    await issue(service, "client-d", answered)  # left ISSUED


async def answers_while_frozen(service: Service, answered: Answered) -> None:
    """A UIN and a status change asked for while Redis's replica is frozen; what is
    acknowledged joins ``answered``."""
    fifth = await service.try_uin("client-a")
    if fifth is not None:
        answered.issued[fifth] = "client-a"
    fourth = next(u for u, c in answered.issued.items() if c == "client-d")
    if await service.put("client-d", fourth, "ASSIGNED") == "ASSIGNED":
        answered.assigned[fourth] = True


async def fail_over(
    service: Service, postgres: PostgresPair, redis: RedisFailover, faults: str
) -> Answered:
    """The run of the module docstring; what was acknowledged before the faults.
    ``faults``: ``postgres`` (Redis's replica never frozen, Redis never fails over);
    ``both`` (PostgreSQL's primary dies seconds after Redis's, once the processes have
    moved to the promoted Redis and rebuilt its record from PostgreSQL's primary);
    ``both-at-once`` (it dies with Redis's, a site lost: no process reaches it after)."""
    answered = Answered()
    await answers_while_replicas_copy(service, postgres, answered)
    if faults == "both-at-once":
        await redis.freeze_replica()
        await answers_while_frozen(service, answered)
        await asyncio.to_thread(postgres.pair()[0].kill)
        await redis.fail_over()
    elif faults == "both":
        await redis.freeze_replica()
        await answers_while_frozen(service, answered)
        await redis.fail_over()
        await redis.vouched()
    await postgres.fail_over()  # its replica promoted
    return answered


def contradictions(answered: Answered, ledger: dict[str, dict[str, Any]]) -> list[str]:
    """Every acknowledged answer the ledger no longer reports."""
    found = []
    for uin, client in answered.issued.items():
        row = ledger[uin]
        assigned = answered.assigned.get(uin)
        if assigned is False:
            if row["issued"] and not row["released"]:
                found.append(f"{uin}: released by {client}, the ledger has it issued")
        elif not row["issued"] or row["client"] != client:
            found.append(f"{uin}: issued to {client}, the ledger says {row}")
        elif assigned and not row["used"]:
            found.append(f"{uin}: ASSIGNED by {client}, the ledger has it unused")
    return found


async def stands(service: Service, answered: Answered) -> None:
    """Every acknowledged answer, as the ledger's lookup and MOSIP's PUT report it; the
    ledger running."""
    await service.drained()
    ledger = {uin: await service.settled(uin) for uin in answered.issued}
    assert [found for found in ledger.values() if "halted" in found] == []
    assert contradictions(answered, ledger) == []
    for uin, client in answered.issued.items():
        expected = "KER-UIG-004" if answered.assigned.get(uin) is False else "ASSIGNED"
        assert await service.put(client, uin, "ASSIGNED") == expected


@pytest.mark.parametrize("stack", ["replicated", "fsynced"], indirect=True)
async def test_both_tiers_failed_over_keep_every_answer(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    answered = await fail_over(stack, postgres, redis, "both")
    assert len(answered.issued) == 4  # nothing acknowledged while the replica was frozen
    await stands(stack, answered)
    assert stack.restored() > 0  # the promotion lost links: written again from Redis's


@pytest.mark.parametrize("stack", ["replicated", "fsynced"], indirect=True)
async def test_a_postgres_promotion_keeps_every_answer(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    answered = await fail_over(stack, postgres, redis, "postgres")
    await stands(stack, answered)
    assert stack.restored() > 0


@pytest.mark.parametrize("stack", ["replicated", "fsynced"], indirect=True)
async def test_both_primaries_lost_at_once_halt_until_an_operator_fences(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    """No process saw the promoted Redis before PostgreSQL's promotion: the fence cannot
    tell what the record lost (leases, syncs) and halts; the runbook's fence, then every
    acknowledged answer stands."""
    answered = await fail_over(stack, postgres, redis, "both-at-once")
    assert len(answered.issued) == 4
    reason = await redis.halted()
    assert "both lost state" in reason, reason
    for uin in answered.issued:  # nothing answered from a history that may be taken back,
        # and the halt said at once, with the operator's command
        reply = await stack.http.get(f"/v1/keys/{UIN}/{uin}", headers=stack.auth("auditor"))
        (error,) = reply.json()["errors"]
        assert reply.status_code == 503 and error["errorCode"] == "IDG-019", reply.text
        assert "fence-postgres" in error["message"]
    env = process_env(stack.settings, stack.keysync_log.parent / "config.yaml")
    fenced = await asyncio.to_thread(run_cli, "fence-postgres", "--skip-ranges", "1", env=env)
    assert fenced.returncode == 0, fenced.stderr
    await stands(stack, answered)
    assert stack.restored() > 0


@pytest.mark.parametrize("stack", ["async"], indirect=True)
async def test_control_async_both_tiers_failed_over_halt_the_ledger(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    """What ``replicated`` prevents: the answers given while Redis's replica was frozen
    are acknowledged, and their ledger links, committed on PostgreSQL's primary only,
    died with both primaries; the restore cannot walk the log back: the ledger halts
    (it answers nothing, not even what was answered before the freeze)."""
    answered = await fail_over(stack, postgres, redis, "both")
    assert len(answered.issued) == 5  # acknowledged at once, replica or not
    assert len([uin for uin, used in answered.assigned.items() if used]) == 3
    ledger = {uin: await stack.settled(uin) for uin in answered.issued}
    halts = {found.get("halted") for found in ledger.values()}
    (halt,) = halts
    assert halt is not None and "gone from the log" in halt, ledger
    assert "ledger-resume --accept-loss" in halt and "KdLedgerHalted" in halt
    assert stack.restored() == 0


@pytest.mark.parametrize("stack", ["async"], indirect=True)
async def test_control_async_both_primaries_lost_at_once_lose_what_the_replica_lagged(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    """What ``replicated`` prevents, at once: the fence halts leases and syncs as it does
    for ``replicated``; once an operator fences, the ledger answers again, without the
    answers given while Redis's replica was frozen. Their links died with both primaries
    and the promoted Redis's record never saw them, so the restore walks a log that
    looks complete: nothing halts, nothing says which answers were lost."""
    answered = await fail_over(stack, postgres, redis, "both-at-once")
    assert len(answered.issued) == 5  # acknowledged at once, replica or not
    reason = await redis.halted()
    assert "both lost state" in reason, reason
    env = process_env(stack.settings, stack.keysync_log.parent / "config.yaml")
    fenced = await asyncio.to_thread(run_cli, "fence-postgres", "--skip-ranges", "1", env=env)
    assert fenced.returncode == 0, fenced.stderr
    await stack.drained()
    ledger = {uin: await stack.settled(uin) for uin in answered.issued}
    assert [found for found in ledger.values() if "halted" in found] == []
    fifth = list(answered.issued)[-1]  # issued while frozen
    fourth = next(u for u, c in answered.issued.items() if c == "client-d")  # ASSIGNED then
    assert sorted(contradictions(answered, ledger)) == sorted(
        [
            f"{fourth}: ASSIGNED by client-d, the ledger has it unused",
            f"{fifth}: issued to client-a, the ledger says {not_issued(UIN, fifth)}",
        ]
    )


@pytest.mark.parametrize("stack", ["async", "replicated", "fsynced"], indirect=True)
async def test_redis_restarted_empty_loses_the_issues_not_yet_applied(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    """Whatever the durability: a UIN answered while keysync had not applied its issue
    (keysync stopped), then Redis's primary restarted without persistence (its replica
    resyncs from it, empty): the issue is gone from both tiers. A status change is
    answered only once applied in PostgreSQL, so the one answered before stands."""
    answered = Answered()
    first = await issue(stack, "client-a", answered)
    await put(stack, "client-a", first, "ASSIGNED", answered)
    await asyncio.to_thread(stack.stop_keysync)
    lost = await stack.get_uin("client-b")  # on the replica too, when replicated
    assert lost is not None
    await redis.restart_empty()
    stack.start_keysync()
    await stands(stack, answered)
    assert await stack.settled(lost) == not_issued(UIN, lost)


@pytest.mark.parametrize("stack", ["fsynced"], indirect=True)
async def test_fsynced_redis_restarted_from_its_append_only_file_keeps_every_answer(
    stack: Service, postgres: PostgresPair, redis: RedisFailover
) -> None:
    """What ``fsynced`` is for: a UIN answered while keysync had not applied its issue,
    then Redis's primary killed and restarted from its append-only file (no failover):
    the issue was in the file before the answer, so it stands, as every earlier answer
    (the restart empty, above, loses it)."""
    answered = Answered()
    first = await issue(stack, "client-a", answered)
    await put(stack, "client-a", first, "ASSIGNED", answered)
    await asyncio.to_thread(stack.stop_keysync)
    await issue(stack, "client-b", answered)
    await redis.restart_from_its_file()
    stack.start_keysync()
    await stands(stack, answered)
