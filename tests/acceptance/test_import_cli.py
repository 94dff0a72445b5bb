"""`keydispenser import` and `export` as an operator runs them: the real command line,
its report, its exit codes and messages."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from keydispenser_ops.processes import cli_command, run_cli
from shared.cli.imports import CHUNK
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.postgres.databases import run_migrate
from tests.acceptance.harness import process_env, write_config
from tests.integration.fixtures import Servers, cloned_database, make_settings
from tests.integration.test_imports import THIRD, TINY, TYPES

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


# A type with room for a large source: what a killed import leaves, and its next run.
MEMBER = {**TINY, "length": 10, "range_size": 1 << 16, "ledger": True, "prefetch": 0}
ROWS = 6 * CHUNK  # the source: enough chunks to kill the import after the first ones
STATUSES = ("UNUSED", "ISSUED", "ASSIGNED")
PROGRESS_DEADLINE_S = 60.0
KILLED_DEADLINE_S = 10.0


async def member_env(settings: Settings, config: Path) -> dict[str, str]:
    await run_migrate(settings)
    return process_env(settings, write_config(settings, config))


def write_source(path: Path, settings: Settings) -> None:
    """``ROWS`` IDs of the type, their statuses by turns, two lines that are no IDs, and
    the first ID again at the end (a duplicate on either side of the kill)."""
    member = build_id_types(settings)["member"]
    keys: list[str] = []
    start = 0
    while len(keys) < ROWS:
        keys += member.generate(start, start + (1 << 16))[0]
        start += 1 << 16
    lines = ["12345", "not-an-id", *(f"{k},{STATUSES[i % 3]}" for i, k in enumerate(keys[:ROWS]))]
    path.write_text("\n".join([*lines, f"{keys[0]},ASSIGNED"]) + "\n")


async def staged_rows(conn: asyncpg.Connection) -> int:
    """Rows the import's run says it has staged and committed (0: no run yet)."""
    found = await conn.fetchval(
        "SELECT (tally->>'rows')::bigint FROM kd_import_runs WHERE id_type = 'member'"
    )
    return int(found or 0)


async def kill_after_progress(process: asyncio.subprocess.Process, dsn: str) -> int:
    """SIGKILL the import (by its PID) once it has committed a chunk; the rows it had."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + PROGRESS_DEADLINE_S
        while (rows := await staged_rows(conn)) < CHUNK:
            assert process.returncode is None, "the import ended before it could be killed"
            assert time.monotonic() < deadline, f"no chunk committed in {PROGRESS_DEADLINE_S}s"
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), KILLED_DEADLINE_S)
        return rows
    finally:
        await conn.close()


async def what_imports_left(dsn: str) -> dict[str, Any]:
    """Exclusions and ledger issues (but the issue times an ID without any takes from
    the clock), runs and staging tables."""
    conn = await asyncpg.connect(dsn)
    try:
        found = {
            "excluded": await conn.fetch(
                "SELECT key, counter, source, status, created_at, updated_at"
                " FROM kd_excluded ORDER BY key"
            ),
            "ledger": await conn.fetch(
                "SELECT key, client, entry_id, used_at IS NOT NULL, used_by"
                ' FROM "kd_ledger_member" ORDER BY key'
            ),
            "runs": await conn.fetch("SELECT tally FROM kd_import_runs"),
            "staging": await conn.fetch(
                "SELECT relname FROM pg_class WHERE relname LIKE 'kd_stage_%'"
            ),
        }
    finally:
        await conn.close()
    return {name: [tuple(row) for row in rows] for name, rows in found.items()}


async def test_a_killed_import_resumes_where_it_stopped(
    servers: Servers, database: str, template_db: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """`keydispenser import file` SIGKILLed once it has committed a chunk: exclusions and
    ledger untouched, the rows read so far staged; run again, it says it resumed and
    from which row, reads only the rest, and leaves what a run never killed leaves."""
    settings = make_settings(servers, database, id_types={"member": MEMBER})
    env = await member_env(settings, tmp_path / "resumed.yaml")
    listing = tmp_path / "issued.txt"
    write_source(listing, settings)
    words = ("import", "file", str(listing), "--type", "member", "--client", "old")
    dsn = servers.direct_dsn_for(database)
    process = await asyncio.create_subprocess_exec(
        *cli_command(*words), env=env, stdout=subprocess.DEVNULL
    )
    try:
        killed_at = await kill_after_progress(process, dsn)
    finally:
        if process.returncode is None:
            process.kill()
            await asyncio.wait_for(process.wait(), KILLED_DEADLINE_S)
    assert process.returncode == -signal.SIGKILL
    half = await what_imports_left(dsn)
    assert half["excluded"] == [] and half["ledger"] == []  # nothing recorded yet
    assert CHUNK <= killed_at < ROWS + 3 and len(half["staging"]) == 1

    started = time.monotonic()
    again = await asyncio.to_thread(run_cli, *words, env=env, timeout_s=300)
    resumed_s = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    (report,) = json.loads(again.stdout)
    assert report["resumed"] == {"at_row": killed_at, "step": "reading"}
    assert f"resuming a killed run at row {killed_at:,} (reading)" in again.stderr

    async with cloned_database(servers, template_db) as other:
        whole = make_settings(servers, other, id_types={"member": MEMBER})
        started = time.monotonic()
        whole_env = await member_env(whole, tmp_path / "whole.yaml")
        never_killed = await asyncio.to_thread(run_cli, *words, env=whole_env, timeout_s=300)
        whole_s = time.monotonic() - started
        assert never_killed.returncode == 0, never_killed.stderr
        (uninterrupted,) = json.loads(never_killed.stdout)
        expected = await what_imports_left(servers.direct_dsn_for(other))
    assert await what_imports_left(dsn) == expected
    assert expected["runs"] == [] and expected["staging"] == []
    assert {**report, "resumed": None} == uninterrupted
    assert uninterrupted["rows_read"] == ROWS + 3 and uninterrupted["duplicate_keys"] == 1
    assert uninterrupted["excluded_added"] == ROWS and uninterrupted["invalid"] == 2
    print(f"killed at row {killed_at}; resumed run {resumed_s:.2f}s, whole run {whole_s:.2f}s")
