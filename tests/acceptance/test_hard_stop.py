"""A hard stop leaves nothing behind: `keydispenser up` killed with SIGKILL takes its
embedded PostgreSQL and Redis and its processes with it (their reapers, the processes'
parent-death signal), and the next `up` says what it found and cleaned. The control
kills the reapers too: the servers stay (the hazard), and `up` cleans them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keydispenser_ops.embedded import EmbeddedPostgres, EmbeddedRedis, children_of, free_port
from tests.acceptance.test_first_hour import plain_env, running_up

pytestmark = pytest.mark.acceptance


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not reaped yet) is gone for our purpose.
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def wait_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


def reapers_of(owner: int) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"keydispenser_ops.reaper" in argv and str(owner).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def what_up_left(home: Path, up: subprocess.Popen[bytes]) -> dict[str, list[int]]:
    data = home / ".keydispenser"
    postmaster = EmbeddedPostgres(data / "postgres").postmaster()
    assert postmaster is not None
    return {
        "postgres": [postmaster],
        "redis": [pid] if (pid := EmbeddedRedis.left_running(data / "redis")) else [],
        "processes": children_of(up.pid),
    }


def test_up_killed_leaves_nothing_and_the_next_up_cleans_what_a_harder_stop_left(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(home, 0o755)
    env = plain_env()

    # 1. SIGKILL: the servers' reapers stop them, the processes get their parent's death.
    with running_up(home, env, free_port()) as up:
        left = what_up_left(home, up)
        assert left["redis"] and len(left["processes"]) >= 3, left
        up.kill()
        up.wait()
        remaining = wait_gone([pid for pids in left.values() for pid in pids])
    assert remaining == [], (remaining, left)

    # 2. The next up finds the killed one's files, says so and cleans them.
    with running_up(home, env, free_port()) as up:
        log = (home / "up.log").read_text()
        assert "found" in log and "up.pid" in log and "removed its stack.env" in log, log
        # 3. Control: the reapers killed too (a harder stop): the servers stay.
        left = what_up_left(home, up)
        for pid in reapers_of(up.pid):
            os.kill(pid, signal.SIGKILL)
        up.kill()
        up.wait()
        wait_gone(left["processes"])
        time.sleep(1)
        assert alive(left["postgres"][0]) and all(alive(pid) for pid in left["redis"])

    # 4. ... and the next up says it found them running and stopped them.
    with running_up(home, env, free_port()):
        log = (home / "up.log").read_text()
        assert f"found its PostgreSQL still running (pid {left['postgres'][0]}): stopped" in log
        assert f"found its Redis still running (pid {left['redis'][0]}): stopped" in log
    assert not alive(left["postgres"][0]) and not any(alive(pid) for pid in left["redis"])


# A test session's servers (tests/integration/fixtures.py) and the drill's are these same
# classes, started by a process that may be killed the same way.
OWNER = """
import sys, time
from pathlib import Path
from keydispenser_ops.embedded import EmbeddedPostgres, EmbeddedRedis
postgres, redis = EmbeddedPostgres(Path(sys.argv[1]) / "pg"), EmbeddedRedis(Path(sys.argv[1]) / "r")
postgres.start()
redis.start()
print(postgres.postmaster(), redis.process.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_owner_takes_its_embedded_servers_with_it(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, env=plain_env()
    )
    assert owner.stdout is not None
    servers = [int(pid) for pid in owner.stdout.readline().split()]
    assert len(servers) == 2 and all(alive(pid) for pid in servers), servers
    owner.kill()
    owner.wait()
    assert wait_gone(servers) == []
