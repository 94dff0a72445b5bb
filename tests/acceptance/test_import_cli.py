"""`keydispenser import` and `export` as an operator runs them: the real command line,
its report, its exit codes and messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from keydispenser_ops.processes import run_cli
from shared.domain.config import Settings
from shared.stores.postgres.databases import run_migrate
from tests.acceptance.harness import process_env, write_config
from tests.integration.fixtures import Servers, make_settings
from tests.integration.test_imports import THIRD, TYPES

pytestmark = pytest.mark.acceptance


@pytest.fixture
async def env(
    servers: Servers, database: str, redis_client: aioredis.Redis, tmp_path: Path
) -> dict[str, str]:
    settings: Settings = make_settings(servers, database, id_types=TYPES)
    await run_migrate(settings)
    return process_env(settings, write_config(settings, tmp_path / "config.yaml"))


def test_an_import_reports_and_an_export_streams_the_ledger(
    env: dict[str, str], tmp_path: Path
) -> None:
    listing = tmp_path / "issued.txt"
    listing.write_text("".join(f"{key},ASSIGNED\n" for key in THIRD[:5]) + "bad\n")
    done = run_cli("import", "file", str(listing), "--type", "uin", "--client", "idrepo", env=env)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["excluded_added"] == 5 and report["ledger_added"] == 5
    assert report["invalid"] == 1 and report["invalid_examples"] == ["bad"]
    assert "rows/s" not in done.stderr  # no terminal: no progress lines

    exported = run_cli("export", "--type", "uin", "--format", "jsonl", env=env)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted(r["key"] for r in rows) == sorted(THIRD[:5])
    assert {(r["status"], r["client"], r["entry_id"]) for r in rows} == {
        ("used", "idrepo", "import:file")
    }
    as_csv = run_cli("export", "--type", "uin", env=env)
    assert as_csv.stdout.splitlines()[0].startswith("key,status,client,issued_at")


@pytest.mark.parametrize(
    ("words", "code", "says"),
    [
        (
            ["openg2p", "--from", "postgresql://postgres@127.0.0.1:1/old", "--type", "tiny"],
            2,
            "--from 127.0.0.1:1/old: cannot connect",
        ),
        (["file", "/nonexistent/ids.txt", "--type", "tiny"], 2, "cannot read /nonexistent"),
        (["file", "-", "--type", "gone"], 2, "no pooled ID type 'gone'"),
    ],
    ids=["dsn", "file", "type"],
)
def test_a_bad_import_exits_non_zero_saying_what_is_wrong(
    env: dict[str, str], words: list[str], code: int, says: str
) -> None:
    done = run_cli("import", *words, env=env)
    assert done.returncode == code and says in done.stderr
    assert "Traceback" not in done.stderr
