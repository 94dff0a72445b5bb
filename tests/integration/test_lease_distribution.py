"""The lease library as its own distribution (clients/leases): its wheel, built as a user
would build it, installs one package, ``keydispenser_leases`` (no generic name such as
``shared`` that an application may have too), and installed alone leases a machine ID
from a real Redis, loading nothing of the server (no keygen, keysync, dispenser,
PostgreSQL driver, HTTP server, NumPy)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.conftest import NS
from tests.integration.fixtures import Servers, end_lease_settling

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("keygen", "keysync", "dispenser", "asyncpg", "starlette", "uvicorn", "numpy")

# Run with the wheel's files and the third-party packages only: no site processing
# (the checkout's editable install adds the repository to the path), no working directory.
USER = """
import asyncio, importlib.util, json, sys
sys.path[:0] = [WHEEL, SITE]
from keydispenser_leases import ConfigError, RedisEndpoint, lease_machine_id

async def main():
    try:
        async with lease_machine_id(RedisEndpoint(), "dist_pool", 0, 3, namespace=NS):
            unnamed = "accepted"
    except ConfigError as exc:
        unnamed = str(exc)
    endpoint = RedisEndpoint(URL)
    async with lease_machine_id(
        endpoint, "dist_pool", 0, 3, ttl_s=3, renew_every_s=0.5, wait_s=10, namespace=NS
    ) as lease:
        held = {"machine_id": lease.machine_id, "valid": lease.valid()}
    await endpoint.close()
    import keydispenser_leases.leases.holder as holder
    return {
        "held": held,
        "unnamed": unnamed,
        "from": holder.__file__,
        "server_modules": sorted(m for m in SERVER_ONLY if m in sys.modules),
        "server_findable": sorted(m for m in ("keygen", "keysync", "dispenser")
                                  if importlib.util.find_spec(m) is not None),
        "shared": sorted(m for m in sys.modules if m.split(".")[0] == "shared"),
        "ours": sorted(m for m in sys.modules if m.startswith("keydispenser_leases")),
    }

print(json.dumps(asyncio.run(main())))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The distribution built from clients/leases (its sdist, then the wheel from it)."""
    out = tmp_path_factory.mktemp("leases-dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT / "clients" / "leases")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("keydispenser_leases-*.whl")
    return built


def test_the_wheel_holds_the_library_and_the_redis_access_it_runs_on_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    files = [n for n in names if not n.startswith("keydispenser_leases-")]
    assert {n.split("/")[0] for n in files} == {"keydispenser_leases"}  # the one package
    assert "keydispenser_leases/leases/holder.py" in files
    assert "keydispenser_leases/stores/fence/lua/fence.lua" in files
    assert not [
        n
        for n in files
        if n.split("/")[1] in {"ops", "cli"} or n.startswith(f"{n.split('/')[0]}/stores/hot")
    ]
    for name in files:  # no import of, nor resource under, a package named shared
        if name.endswith(".py"):
            text = zipfile.ZipFile(wheel).read(name).decode()
            assert not re.search(r"^\s*(from|import) shared\b", text, re.M), name
            assert '"shared.' not in text, name
    metadata = (
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    )
    requires = sorted(
        line.split(":", 1)[1].split("[")[0].split(">")[0].strip().lower()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    )
    assert requires == ["prometheus-client", "pydantic", "redis"]


async def test_installed_alone_it_leases_and_loads_nothing_of_the_server(
    wheel: Path, tmp_path: Path, servers: Servers, redis_client: aioredis.Redis
) -> None:
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)  # a wheel's install is its files
    await end_lease_settling(servers.redis_url, redis_client)
    script = "\n".join(
        [
            f"WHEEL = {str(installed)!r}",
            f"SITE = {sysconfig.get_paths()['purelib']!r}",
            f"URL = {servers.redis_url!r}",
            f"NS = {NS!r}",
            f"SERVER_ONLY = {SERVER_ONLY!r}",
            USER,
        ]
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-I", "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["held"]["valid"] and 0 <= found["held"]["machine_id"] <= 3
    assert "the endpoint names no Redis" in found["unnamed"]
    assert found["from"].startswith(str(installed))
    assert found["server_modules"] == [] and found["server_findable"] == []
    assert found["shared"] == []
    assert all(m.split(".")[1] in {"domain", "stores", "leases"} for m in found["ours"][1:])
