"""``keydispenser up`` with Redis named as a Redis Cluster: the stack runs on it, no
embedded Redis is started beside it, and every command run beside the stack reaches
the cluster (its stack file names the cluster, not a URL)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from keydispenser_ops.embedded import free_port
from keydispenser_ops.redis_cluster import EmbeddedRedisCluster
from tests.acceptance.test_first_hour import BIN, plain_env, read_stack_env, running_up
from tests.integration.fixtures import Servers, make_settings

pytestmark = [pytest.mark.acceptance, pytest.mark.not_pooled]


def keydispenser(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "keydispenser"), *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_up_runs_the_stack_on_the_cluster_the_user_named(
    servers: Servers, database: str, cluster: EmbeddedRedisCluster, tmp_path: Path
) -> None:
    dsn = make_settings(servers, database).postgres_dsn
    await asyncio.to_thread(up_on, cluster, dsn, tmp_path)


def up_on(cluster: EmbeddedRedisCluster, dsn: str, home: Path) -> None:
    named = json.dumps({"nodes": list(cluster.seeds)}, indent=2)  # as a YAML block gives it
    env = plain_env() | {"KD_POSTGRES_DSN": dsn, "KD_REDIS_CLUSTER": named}
    port = free_port()
    # A URL beside the cluster is refused before anything starts.
    both = keydispenser(home, env, "up", "--port", str(port), "--redis-url", "redis://127.0.0.1:1")
    assert both.returncode == 2 and "--redis-url" in both.stderr and "Cluster" in both.stderr
    assert not (home / ".keydispenser" / "stack.env").exists()

    base = f"http://127.0.0.1:{port}"
    with running_up(home, env, port) as up:
        assert "Redis Cluster (" in (home / "up.log").read_text()
        assert not (home / ".keydispenser" / "redis").exists()  # no embedded Redis
        written = read_stack_env(home / ".keydispenser" / "stack.env")
        assert "KD_REDIS_URL" not in written and json.loads(written["KD_REDIS_CLUSTER"]) == {
            "nodes": list(cluster.seeds)
        }

        request = urllib.request.Request(f"{base}/v1/idgenerator/farmer/id", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["response"]["id"]

        # A user's shell names nothing: the stack file leads it to the cluster.
        status = keydispenser(home, plain_env(), "status")
        assert status.returncode == 0, status.stderr
        assert "farmer" in status.stdout and "postgres fence: ok" in status.stdout
        # The keys are on the cluster: the farmer hot list is on the primary of its slot.
        hot = [key for node in cluster.live() for key in node.client().scan_iter("{kd}:*farmer*")]
        assert hot, "no farmer key on the cluster"
    assert up.returncode == 0
