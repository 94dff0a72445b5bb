"""The client is a distribution of its own: httpx is all it needs, and importing it
loads nothing of the server."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SERVER = ("shared", "keygen", "keysync", "dispenser", "asyncpg", "redis", "starlette", "numpy")
PROBE = f"""
import sys
import keydispenser_client
loaded = {{name.split(".")[0] for name in sys.modules}}
print(",".join(sorted(loaded & set({SERVER!r}))))
"""


def test_its_only_dependency_is_httpx() -> None:
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    assert project["name"] == "keydispenser-client"
    assert [dep.split(">")[0] for dep in project["dependencies"]] == ["httpx"]


def test_importing_it_loads_nothing_of_the_server() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=HERE,
    )
    assert done.stdout.strip() == ""
