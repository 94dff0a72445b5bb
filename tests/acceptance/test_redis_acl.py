"""Each process logs in to Redis as a user of its own that can do only its own work
(shared/stores/redis/acl.py, docs/security.md "Redis ACL users").

A Redis primary, a replica and three Sentinels of this module's own, loaded with the
ACL file ``keydispenser redis-acl`` renders (with passwords), the default user off:
Sentinel and the replica log in as their own users. Every process user is refused
(NOPERM) each command no process needs, another namespace's keys and the namespace's
state it must not delete; and every process (keygen, keysync, the dispenser, status, a
lease holder, retire and fence-postgres) runs end to end as its own user, through a
Sentinel failover (the fence, on the promoted replica, runs as they do).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from keydispenser_ops.drill.topology import MASTER, ServerAuth, Topology
from keydispenser_ops.embedded import free_port, valkey_server_binary
from keydispenser_ops.processes import run_cli
from shared.domain.config import Settings
from shared.stores.redis.acl import PROCESS_USERS, acl_file, user_names
from tests.acceptance.harness import ChildProcesses, process_env, wait_for_http, write_config
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings

pytestmark = [pytest.mark.acceptance, pytest.mark.not_pooled]

ADMIN = "kd-test-admin"  # this test's own user (the default user is off)
DEADLINE_S = 60.0
# What every process user is refused: no process of keydispenser needs any of these.
FORBIDDEN: list[tuple[str, ...]] = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "maxmemory-policy"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("SCRIPT", "FLUSH"),
    ("EVAL", "return 1", "0"),
    ("SAVE",),
    ("BGREWRITEAOF",),
    ("SHUTDOWN", "NOSAVE"),
    ("ACL", "LIST"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("REPLICAOF", "NO", "ONE"),
    ("MONITOR",),
    # Another namespace's keys.
    ("GET", "other:fence"),
    ("SET", "other:x", "1"),
    # The namespace's state, deleted whole: the fence's record, its token, the ledger.
    ("DEL", "kd:sync:record"),
    ("UNLINK", "kd:fence"),
    ("DEL", "kd:ledger"),
    ("DEL", "kd:ledger:log"),
]


def ledger_types() -> dict[str, Any]:
    types = small_types()
    types["shortlink"]["ledger"] = True
    types["events"] = {"kind": "snowflake", "lease_ttl_s": 2, "lease_renew_s": 0.5}
    return types


@pytest.fixture(scope="module")
def passwords() -> dict[str, str]:
    names = [*user_names(make_settings_stub()).values(), ADMIN]
    return {name: secrets.token_hex(16) for name in names}


def make_settings_stub() -> Settings:
    """Only the namespace matters to the users' names (the default, ``kd``)."""
    from shared.domain.config import load_settings
    from tests.conftest import EMPTY_CONFIG

    return load_settings(EMPTY_CONFIG)


@pytest.fixture(scope="module")
def topology(
    tmp_path_factory: pytest.TempPathFactory, passwords: dict[str, str]
) -> Iterator[Topology]:
    base = tmp_path_factory.mktemp("redis-acl")
    admin = hashlib.sha256(passwords[ADMIN].encode()).hexdigest()
    acl = base / "users.acl"
    acl.write_text(
        acl_file(make_settings_stub(), passwords)
        + f"user {ADMIN} on #{admin} ~* &* +@all\nuser default off\n"
    )
    auth = ServerAuth(
        acl,
        sentinel=("sentinel", passwords["sentinel"]),
        replica=("replica", passwords["replica"]),
        admin=(ADMIN, passwords[ADMIN]),
    )
    made = Topology(base / "redis", auth=auth)
    made.start(replicas=1, sentinels=3)
    try:
        made.wait_for_replicas(1)
        yield made
    finally:
        made.stop()


def as_user(topology: Topology, passwords: dict[str, str], name: str) -> redis.Redis:
    port = topology.primary().port
    return redis.Redis(port=port, username=name, password=passwords[name], socket_timeout=5)


@pytest.mark.parametrize("process", PROCESS_USERS)
def test_each_process_user_is_refused_what_it_must_not_do(
    topology: Topology, passwords: dict[str, str], process: str
) -> None:
    name = f"kd-{process}"
    client = as_user(topology, passwords, name)
    try:
        assert client.get("kd:nothing") is None  # it logs in, and reads its namespace
        for command in FORBIDDEN:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)  # type: ignore[no-untyped-call]
        # Deleting a type's state whole: retire's (the admin user's) alone.
        delete = ("DEL", "kd:exhausted:gone")
        if process == "admin":
            client.execute_command(*delete)  # type: ignore[no-untyped-call]
        else:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*delete)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def sentinel_env(topology: Topology, passwords: dict[str, str], process: str) -> dict[str, str]:
    """``process`` finds the primary through the Sentinels and logs in as its user."""
    name = f"kd-{process}"
    found = {
        "sentinels": topology.sentinel_addresses(),
        "master_name": MASTER,
        "username": name,
        "password": passwords[name],
    }
    return {"KD_REDIS_SENTINEL": json.dumps(found)}


async def take(url: str, count: int) -> list[str]:
    keys: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while len(keys) < count:
            assert time.monotonic() < deadline, f"{len(keys)} of {count} keys"
            reply = await client.post("/v1/keys/shortlink", params={"count": 50})
            if reply.status_code == 503:
                await asyncio.sleep(0.2)
                continue
            assert reply.status_code == 200, reply.text
            batch = reply.json()["keys"]
            keys += batch
            while True:  # a 503 across the failover (a connection the old primary
                # closed) says "retry later", and a mark of use may be sent again
                assert time.monotonic() < deadline, "marks of use refused until the deadline"
                used = await client.post("/v1/keys/shortlink/used", json={"keys": batch[:5]})
                if used.status_code != 503:
                    break
                await asyncio.sleep(0.2)
            assert used.status_code == 202, used.text
    return keys


async def snowflake(url: str) -> str:
    deadline = time.monotonic() + DEADLINE_S
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while True:
            reply = await client.post("/v1/idgenerator/events/id")
            if reply.status_code == 200:
                return str(reply.json()["response"]["id"])
            assert time.monotonic() < deadline, reply.text
            await asyncio.sleep(0.5)


def read_logs(folder: Path) -> dict[str, str]:
    return {each.name: each.read_text() for each in folder.glob("*.log")}


async def test_every_process_runs_as_its_own_user_through_a_sentinel_failover(
    servers: Servers,
    database: str,
    topology: Topology,
    passwords: dict[str, str],
    tmp_path: Path,
) -> None:
    assert valkey_server_binary()
    settings = make_settings(servers, database, id_types=ledger_types())
    env = process_env(settings, write_config(settings, tmp_path / "config.yaml"))
    admin = sentinel_env(topology, passwords, "admin")
    # migrate knows a type more, which retire removes later (migrate touches no Redis).
    gone = ledger_types() | {"gone": small_types()["farmer"]}
    with_gone = make_settings(servers, database, id_types=gone)
    migrate_env = process_env(with_gone, write_config(with_gone, tmp_path / "with-gone.yaml"))
    migrated = run_cli("migrate", env=migrate_env | admin)
    assert migrated.returncode == 0, migrated.stderr
    stack = ChildProcesses(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        for process in ("keygen", "keysync"):
            stack.spawn(process, env | sentinel_env(topology, passwords, process), process)
        dispenser = env | sentinel_env(topology, passwords, "dispenser")
        stack.spawn("dispenser", dispenser | {"KD_DISPENSER__PORT": str(port)}, "dispenser")
        wait_for_http(f"{url}/healthz")
        before = await take(url, 500)
        first_id = await snowflake(url)
        old = topology.primary().port
        topology.sentinel_failover()
        assert topology.wait_for_primary(30, not_port=old) != old
        after = await take(url, 500)  # the fence ran on the promoted replica, as them
        second_id = await snowflake(url)
        status = run_cli("status", "--json", env=env | sentinel_env(topology, passwords, "status"))
        holder = env | sentinel_env(topology, passwords, "lease")
        leased = run_cli(
            "lease", "--pool", "acl", "--min", "0", "--max", "3", "--ttl", "3", "--wait", "20",
            "--", "true", env=holder, timeout_s=60,
        )  # fmt: skip
        retired = run_cli(
            "retire",
            "--type",
            "gone",
            "--yes",
            env=env | sentinel_env(topology, passwords, "admin"),
        )
        assert all(child.poll() is None for child in stack.children), "a process exited"
    finally:
        stack.close()
    fenced = run_cli("fence-postgres", "--skip-ranges", "1", env=env | admin)
    keys = before + after
    assert len(set(keys)) == len(keys)
    assert first_id != second_id
    assert status.returncode == 0, status.stderr
    assert leased.returncode == 0, leased.stderr
    assert retired.returncode == 0, retired.stderr
    assert fenced.returncode == 0, fenced.stderr
    logs = await asyncio.to_thread(read_logs, tmp_path)
    outputs = [status.stderr, leased.stderr, retired.stderr, fenced.stderr, *logs.values()]
    assert not [text for text in outputs if "NOPERM" in text], [
        name for name, text in logs.items() if "NOPERM" in text
    ]
