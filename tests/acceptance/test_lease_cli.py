"""The real `keydispenser lease`: the command sees its machine ID, its exit status is
passed through, a full pool exits 75, a lost lease SIGTERMs the command, signals are
forwarded and the lease is released after."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.processes import cli_command, run_cli, scrubbed_env
from shared.domain import redis_keys
from shared.leases.store import MachineLeases
from shared.stores.redis.endpoint import RedisEndpoint
from tests.conftest import NS
from tests.integration.fixtures import Servers

pytestmark = pytest.mark.acceptance
POOL = "cli"
DEADLINE_S = 20.0
FAST = ["--ttl", "2", "--renew-every", "0.2"]
# A command that says it started, then waits; on SIGTERM it writes TERM and exits 42
# (or, with a third argument, ignores SIGTERM).
WAITER = """
import os, pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def term(*_):
    marker.write_text("TERM " + os.environ["KD_MACHINE_ID"])
    if len(sys.argv) < 3:
        sys.exit(42)
signal.signal(signal.SIGTERM, term)
marker.write_text("ready")
time.sleep(60)
"""


@pytest.fixture
async def leases(servers: Servers, redis_client: aioredis.Redis) -> AsyncIterator[MachineLeases]:
    """A settled pool: the fence's first-use settle period is moved back by hand."""
    store = MachineLeases(RedisEndpoint(servers.redis_url), NS)
    await store.holders(POOL)
    await redis_client.hset(redis_keys.sync_record_key(NS), "fenced_at", 0)
    yield store
    await store.close()


def env(servers: Servers) -> dict[str, str]:
    return scrubbed_env(KD_REDIS_URL=servers.redis_url)


def lease_cli(servers: Servers, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("lease", "--pool", POOL, *args, env=env(servers), timeout_s=DEADLINE_S)


def spawn_waiter(servers: Servers, marker: Path, *extra: str) -> subprocess.Popen[str]:
    argv = cli_command("lease", "--pool", POOL, "--min", "4", "--max", "4", *FAST)
    argv += ["--", sys.executable, "-c", WAITER, str(marker), *extra]
    return subprocess.Popen(argv, env=env(servers), stderr=subprocess.PIPE, text=True)


def says(path: Path, text: str) -> bool:
    return path.exists() and path.read_text().startswith(text)


async def wait_for(path: Path, text: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not says(path, text):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        await asyncio.sleep(0.02)


async def exit_of(child: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + DEADLINE_S
    while child.poll() is None:
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail("keydispenser lease did not exit")
        await asyncio.sleep(0.02)
    return child.returncode


async def test_the_command_sees_its_machine_id_and_its_status_is_passed_through(
    servers: Servers, leases: MachineLeases
) -> None:
    script = "import os, sys; print(os.environ['KD_MACHINE_ID'], os.environ['KD_MACHINE_ID_POOL'])"
    result = lease_cli(
        servers, "--min", "5", "--max", "5", "--", sys.executable, "-c", script + "; sys.exit(3)"
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["5", POOL]
    assert (await leases.holders(POOL)).holders == []  # released when it exited


async def test_a_full_pool_is_a_clear_message_and_exit_75(
    servers: Servers, leases: MachineLeases
) -> None:
    assert (await leases.acquire(POOL, 5, 5, "other", 30_000, 0, 0)).granted
    result = lease_cli(servers, "--min", "5", "--max", "5", "--wait", "0.3", "--", "true")
    assert result.returncode == 75
    assert "no machine ID free in [5, 5] of pool 'cli'" in result.stderr
    assert "Traceback" not in result.stderr


async def test_the_command_gets_sigterm_when_the_lease_is_taken(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    child = spawn_waiter(servers, marker)
    try:
        await wait_for(marker, "ready")
        listed = lease_cli(servers, "list", "--json")
        holders = json.loads(listed.stdout)["holders"]
        assert [h["id"] for h in holders] == [4] and holders[0]["expires_in_s"] > 0
        await redis_client.hdel(redis_keys.machine_leases_key(NS, POOL), "4")  # stolen by hand
        assert (await leases.acquire(POOL, 4, 4, "thief", 30_000, 0, 0)).granted
        assert await exit_of(child) == 42
    finally:
        if child.poll() is None:
            child.kill()
        assert child.stderr is not None
        stderr = child.stderr.read()
    assert marker.read_text() == "TERM 4"
    assert "lost machine ID 4 of pool 'cli'" in stderr, stderr
    assert [h.owner for h in (await leases.holders(POOL)).holders] == ["thief"]


async def test_sigterm_is_forwarded_and_the_lease_released_after(
    servers: Servers, leases: MachineLeases, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    child = spawn_waiter(servers, marker)
    try:
        await wait_for(marker, "ready")
        assert [h.machine_id for h in (await leases.holders(POOL)).holders] == [4]
        child.terminate()
        assert await exit_of(child) == 42
    finally:
        if child.poll() is None:
            child.kill()
    assert marker.read_text() == "TERM 4"
    assert (await leases.holders(POOL)).holders == []


async def test_a_command_that_ignores_sigterm_is_killed_after_a_lost_lease(
    servers: Servers, leases: MachineLeases, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    child = spawn_waiter(servers, marker, "ignore-sigterm")
    try:
        await wait_for(marker, "ready")
        await redis_client.hdel(redis_keys.machine_leases_key(NS, POOL), "4")
        assert await exit_of(child) == 128 + 9  # SIGKILL, the kill-after (0.2 s) later
    finally:
        if child.poll() is None:
            child.kill()
    assert marker.read_text() == "TERM 4"


async def test_the_command_is_terminated_when_the_lease_process_is_killed(
    servers: Servers, leases: MachineLeases, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    child = spawn_waiter(servers, marker)
    try:
        await wait_for(marker, "ready")
        child.kill()  # SIGKILL: no release, no forwarding; the kernel tells the command
        await exit_of(child)
        await wait_for(marker, "TERM 4")
    finally:
        if child.poll() is None:
            child.kill()
