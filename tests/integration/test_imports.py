"""`keydispenser import`: what another generator issued is never handed out here, by
any path, and a bad source is refused whole (docs/operations.md, "Moving from OpenG2P's
or MOSIP's generator")."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync
from shared.cli import imports
from shared.cli.main import parser
from shared.domain.apikeys import ANONYMOUS
from shared.domain.checkdigit import verhoeff_digit
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, KeydispenserError
from shared.domain.idtypes import build_id_types
from shared.domain.imports import Staged
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.batch import Applied
from shared.stores.ledger.decide import key_status, requeue
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, run_migrate, scratch_database
from shared.stores.postgres.imports import ImportTarget, Source
from tests.integration.fixtures import (
    Servers,
    cloned_database,
    dispenser_in_process,
    make_settings,
)
from tests.integration.test_mosip import error_code, mosip_settings, put
from tests.integration.test_mosip import stack as mosip_stack
from tests.integration.test_replica_fence import Pair, pair, replicaof  # noqa: F401

TINY = {
    "kind": "numeric",
    "length": 4,
    "filter_profile": "none",
    "range_size": 128,
    "hot": {"low": 100, "high": 300},
    "cold": {"low": 400, "high": 600},
    "sync_batch": 100,
    "prefetch": 16,
}
TYPES = {"tiny": TINY, "uin": {**TINY, "ledger": True, "prefetch": 0}}
EVERY_KEY = [f"{n:03d}" + verhoeff_digit(f"{n:03d}") for n in range(1000)]
THIRD = EVERY_KEY[::3]  # what the old generator issued or holds
_sources = count()


@pytest.fixture
async def settings(servers: Servers, database: str, redis_client: aioredis.Redis) -> Settings:
    configured = make_settings(servers, database, id_types=TYPES)
    await run_migrate(configured)
    return configured


@pytest.fixture(scope="module")
async def source(servers: Servers) -> AsyncIterator[str]:
    """A scratch database standing in for the old generator's: OpenG2P's id_pool_tiny,
    MOSIP's kernel.uin and kernel.uin_assigned, as their scripts create them."""
    name = f"kd_source_{os.getpid()}_{next(_sources)}"
    await scratch_database(servers.postgres_admin_dsn, name)
    dsn = servers.direct_dsn_for(name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """
            CREATE TABLE id_pool_tiny (id_value varchar(32) PRIMARY KEY,
                status varchar(16) NOT NULL, created_at timestamp, issued_at timestamp);
            CREATE SCHEMA kernel;
            CREATE TABLE kernel.uin (uin varchar(28) PRIMARY KEY, uin_status varchar(16),
                cr_by varchar(256) NOT NULL DEFAULT 'admin', cr_dtimes timestamp NOT NULL,
                upd_by varchar(256), upd_dtimes timestamp, is_deleted boolean DEFAULT false,
                del_dtimes timestamp);
            CREATE TABLE kernel.uin_assigned (LIKE kernel.uin INCLUDING ALL);
            """
        )
        pool = [(k, "TAKEN" if i % 2 else "AVAILABLE") for i, k in enumerate(THIRD)]
        await conn.executemany(
            "INSERT INTO id_pool_tiny VALUES ($1, $2::text, now(),"
            " CASE WHEN $2::text = 'TAKEN' THEN now() END)",
            pool,
        )
        uins = [(k, ("UNUSED", "ISSUED", "ASSIGNED")[i % 3]) for i, k in enumerate(THIRD)]
        await conn.executemany(
            "INSERT INTO kernel.uin (uin, uin_status, cr_dtimes, upd_dtimes) "
            "VALUES ($1, $2, '2024-01-02 03:04:05', '2024-02-03 04:05:06')",
            [u for u in uins if u[1] != "ASSIGNED"],
        )
        await conn.executemany(
            "INSERT INTO kernel.uin_assigned (uin, uin_status, cr_dtimes, upd_dtimes) "
            "VALUES ($1, $2, '2024-01-02 03:04:05', '2024-02-03 04:05:06')",
            [u for u in uins if u[1] == "ASSIGNED"],
        )
    finally:
        await conn.close()
    yield dsn
    await drop_database(servers.postgres_admin_dsn, name)


async def run_import(settings: Settings, *words: str) -> list[dict[str, Any]]:
    """The command as `keydispenser import ...` runs it, without its JSON printing."""
    args = parser(["import", *words]).parse_args(["import", *words])
    return await imports._run(settings, build_id_types(settings), args)


class Stack:
    """keygen and keysync of one settings, stepped by the test."""

    def __init__(self, settings: Settings, cold: ColdStore, sync: SyncRecord) -> None:
        self.generator = Generator(1)
        self.keygen = Keygen.on_postgres(settings, cold, sync, asyncio.Event(), self.generator)
        types = build_id_types(settings)
        self.cold = GuardedCold(cold, sync, types)
        self.keysync = Keysync(settings, self.cold, HotStore.from_settings(settings))
        self.types = types

    async def fill(self, name: str, ranges: int) -> None:
        for _ in range(ranges):
            if not await self.keygen.lease_and_generate(self.types[name]):
                return

    async def refill(self, name: str) -> int:
        return await self.keysync.refill(self.types[name])


@pytest.fixture
async def stack(settings: Settings, sync: SyncRecord) -> AsyncIterator[Stack]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    made = Stack(settings, cold, sync)
    try:
        yield made
    finally:
        made.generator.close()
        await cold.close()


async def pop_all(hot: HotStore, name: str) -> list[str]:
    popped = await hot.pop(name, 10_000, ("test",), False)
    return list(popped.keys)


async def test_a_serving_stack_never_hands_out_an_imported_id(
    settings: Settings, source: str, stack: Stack
) -> None:
    """Keys in the cold table and the hot list when the import runs, and every range
    keygen leases after it: dispensed to exhaustion, none of the imported among them,
    and no other key lost."""
    hot = HotStore.from_settings(settings)
    await stack.fill("tiny", 3)  # 384 counters in the cold table
    await stack.refill("tiny")  # 300 of them in the hot list
    taken = (await hot.pop("tiny", 20, ("test",), False)).keys  # handed out before
    held = (set(await _generated(settings, "tiny")) & set(THIRD)) - set(taken)
    (report,) = await run_import(settings, "openg2p", "--from", source, "--type", "tiny")
    assert report["excluded_added"] == len(THIRD) and report["rows_read"] == len(THIRD)
    assert report["cold_removed"] + report["hot_removed"] == len(held) > 0
    assert report["hot_removed"] > 0 and report["cold_removed"] > 0
    after: list[str] = []
    for _ in range(40):
        await stack.fill("tiny", 2)
        await stack.refill("tiny")
        got = await pop_all(hot, "tiny")
        if not got and stack.keygen.exhausted("tiny"):
            break
        after.extend(got)
    await hot.close()
    assert not set(after) & set(THIRD)
    assert len(after) == len(set(after))
    assert set(taken) | set(after) | set(THIRD) == set(EVERY_KEY)


async def test_no_key_a_dispenser_stocked_before_the_import_is_handed_out_after(
    settings: Settings, source: str, stack: Stack
) -> None:
    await stack.fill("tiny", 3)
    await stack.refill("tiny")
    async with dispenser_in_process(settings) as http:

        async def one() -> str:
            reply = await http.post("/v1/idgenerator/tiny/id")
            assert reply.status_code == 200, reply.text
            return str(reply.json()["response"]["id"])

        before = [await one() for _ in range(4)]  # the pops after the first fill a stock
        await run_import(settings, "openg2p", "--from", source, "--type", "tiny")
        after = [await one() for _ in range(40)]
    assert not set(after) & set(THIRD)
    assert not set(before) & set(after)


async def _generated(settings: Settings, name: str) -> list[str]:
    """Keys of every range leased so far."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        rows = await conn.fetch(
            "SELECT range_start, range_end FROM kd_ranges WHERE id_type = $1", name
        )
    finally:
        await conn.close()
    id_type = build_id_types(settings)[name]
    return [k for r in rows for k in id_type.generate(r["range_start"], r["range_end"])[0]]


async def test_a_batch_taken_before_the_import_never_lands_after_it(
    settings: Settings, source: str, stack: Stack
) -> None:
    """keysync committed its take before the import removed the keys from the cold
    table, and pushes after the import swept the hot list: the push is refused."""
    await stack.fill("tiny", 8)  # the whole keyspace
    cold = stack.cold
    hot = HotStore.from_settings(settings)
    try:
        taken = await cold.begin_take("tiny", 1_000)
        await taken.commit()
        assert set(THIRD) & set(taken.keys)
        await run_import(settings, "openg2p", "--from", source, "--type", "tiny")
        pushed = await hot.push("tiny", taken.keys, "late-batch", epoch=taken.epoch)
        assert pushed.status == "superseded"
        assert await pop_all(hot, "tiny") == []
        later = await cold.begin_take("tiny", 1_000)
        await later.rollback()
        assert later.epoch > taken.epoch
    finally:
        await hot.close()


async def test_mosip_history_answers_as_the_kernel_did(settings: Settings, source: str) -> None:
    (report,) = await run_import(
        settings, "mosip", "--from", source, "--uin-type", "uin", "--client", "idrepo"
    )
    assert report["rows_read"] == len(THIRD) and report["excluded_added"] == len(THIRD)
    issued = [k for i, k in enumerate(THIRD) if i % 3]
    assert report["ledger_added"] == len(issued)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        states = {k: await key_status(conn, "uin", k) for k in THIRD[:6]}
        row = await conn.fetchrow(
            "SELECT source, status, created_at FROM kd_excluded WHERE key = $1", THIRD[2]
        )
    finally:
        await conn.close()
    assert [states[k].state for k in THIRD[:6]] == ["unknown", "issued", "assigned"] * 2
    assert {states[k].client for k in THIRD[1:3]} == {"idrepo"}
    assert row is not None and row["source"] == "mosip" and row["status"] == "ASSIGNED"
    assert row["created_at"].isoformat() == "2024-01-02T03:04:05+00:00"


async def test_a_released_id_the_import_excluded_never_goes_back(
    settings: Settings, source: str
) -> None:
    """A key keydispenser issued, given back by its client, later found issued by the
    old generator too: the requeue settles its release without putting it back."""
    key = THIRD[4]
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(
            "INSERT INTO kd_released_issues (id_type, key, issued_at, client, entry_id,"
            " released_at, released_by, recorded_at) VALUES ('uin', $1, now(), 'c', '1-0',"
            " now(), 'c', now() - interval '2 hours')",
            key,
        )
        words = ("openg2p", "--from", source, "--type", "uin", "--table", "id_pool_tiny")
        await run_import(settings, *words)
        async with conn.transaction():
            back = await requeue(conn, build_id_types(settings)["uin"], Applied())
        assert back == 0
        assert not await conn.fetchval('SELECT count(*) FROM "kd_cold_uin"')
        assert await conn.fetchval("SELECT requeue_discarded FROM kd_released_issues")
    finally:
        await conn.close()


async def test_running_it_again_changes_nothing(settings: Settings, source: str) -> None:
    words = ("openg2p", "--from", source, "--type", "uin", "--table", "id_pool_tiny")
    first = await run_import(settings, *words)
    again = await run_import(settings, *words)
    assert first[0]["excluded_added"] == len(THIRD) and first[0]["ledger_added"] > 0
    changed = {k: again[0][k] for k in ("excluded_added", "excluded_changed", "ledger_added")}
    assert changed == {"excluded_added": 0, "excluded_changed": 0, "ledger_added": 0}
    assert again[0]["epoch"] == first[0]["epoch"]


async def test_a_dry_run_changes_nothing(settings: Settings, source: str) -> None:
    (report,) = await run_import(
        settings, "openg2p", "--from", source, "--type", "tiny", "--dry-run"
    )
    assert report["dry_run"] and report["excluded_added"] == len(THIRD)
    assert await _excluded(settings) == 0


async def _excluded(settings: Settings) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM kd_excluded"))
    finally:
        await conn.close()


async def test_bad_ids_are_counted_duplicates_reported(settings: Settings, tmp_path: Path) -> None:
    listing = tmp_path / "issued.txt"
    wrong_check = THIRD[0][:3] + str((int(THIRD[0][3]) + 1) % 10)
    lines = [THIRD[0], THIRD[1] + ",TAKEN", THIRD[1], "12", "abcd", wrong_check, "", "# note"]
    listing.write_text("\n".join(lines) + "\n")
    (report,) = await run_import(settings, "file", str(listing), "--type", "tiny")
    assert report["invalid"] == 3 and report["invalid_examples"] == ["12", "abcd", wrong_check]
    assert report["duplicate_keys"] == 1 and report["duplicate_examples"] == [THIRD[1]]
    assert report["excluded_added"] == 2


@pytest.mark.parametrize(
    ("words", "error", "says"),
    [
        (
            ["openg2p", "--from", "postgresql://postgres@127.0.0.1:1/none", "--type", "tiny"],
            ConfigError,
            "cannot connect",
        ),
        (
            ["openg2p", "--from", "{source}", "--type", "tiny", "--table", "id_pool_gone"],
            ConfigError,
            "no table id_pool_gone",
        ),
        (
            ["openg2p", "--from", "{source}", "--type", "nope"],
            ConfigError,
            "no pooled ID type 'nope'",
        ),
        (["file", "/nonexistent/ids.txt", "--type", "tiny"], ConfigError, "cannot read"),
        (["file", "{listing}", "--type", "tiny"], KeydispenserError, "'SOLD' (1 rows)"),
    ],
    ids=["dsn", "table", "type", "file", "status"],
)
async def test_a_bad_source_is_refused_whole(
    settings: Settings,
    source: str,
    tmp_path: Path,
    words: list[str],
    error: type[Exception],
    says: str,
) -> None:
    listing = tmp_path / "ids.txt"
    listing.write_text(f"{THIRD[0]}\n{THIRD[1]} SOLD\n")
    filled = [w.format(source=source, listing=listing) for w in words]
    with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)")):
        await run_import(settings, *filled)
    assert await _excluded(settings) == 0


async def test_the_source_is_read_only(source: str) -> None:
    connected = await Source.connect(source)
    try:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await connected._conn.execute("DELETE FROM id_pool_tiny")
    finally:
        await connected.close()


async def test_the_keyspace_left_does_not_count_the_excluded(
    settings: Settings, source: str, stack: Stack, tmp_path: Path
) -> None:
    """Counted whole once per import, then by what the leases since passed over: the
    same figure as counting whole each time."""
    await stack.fill("tiny", 2)  # counters [0, 256) leased
    await run_import(settings, "openg2p", "--from", source, "--type", "tiny")
    tiny = stack.types["tiny"]
    excluded = [c for c in tiny.counters_of(THIRD) if c is not None]
    ahead = [c for c in excluded if c >= 256]
    cold = await ColdStore.connect(settings.postgres_dsn)
    try:
        state = await cold.sequence_state(tiny)
        assert state.excluded_ahead == len(ahead) > 0
        assert state.headroom == 1000 - 256 - len(ahead)
        seen = await stack.keygen.watch_headroom(tiny)
        assert seen.counters_left == state.headroom

        await stack.fill("tiny", 4)  # more ranges leased: passed over, not counted again
        later = await cold.sequence_state(tiny)
        assert later.leased_counters > 256
        assert later.excluded_ahead == len([c for c in excluded if c >= later.leased_counters])

        listing = tmp_path / "more.txt"  # another import (its epoch): counted whole again
        more = EVERY_KEY[1::3]
        listing.write_text("".join(f"{key},TAKEN\n" for key in more))
        await run_import(settings, "file", str(listing), "--type", "tiny")
        excluded += [c for c in tiny.counters_of(more) if c is not None]
        again = await cold.sequence_state(tiny)
        assert again.excluded_ahead == len([c for c in excluded if c >= again.leased_counters])
    finally:
        await cold.close()


async def test_the_switch_by_the_runbook_leaves_no_id_in_two_hands(
    settings: Settings, source: str, stack: Stack
) -> None:
    """docs/operations.md's switch: the old service keeps issuing from its pool while
    it is imported twice, callers move (both serve), it stops, a last import; then
    keydispenser serves its type to the end. No ID is issued by both."""
    old = await asyncpg.connect(source)
    hot = HotStore.from_settings(settings)
    words = ("openg2p", "--from", source, "--type", "tiny", "--table", "id_pool_switch")
    pool = EVERY_KEY[1::3]  # the old service's pool: none issued yet

    async def old_issues(count: int) -> list[str]:
        rows = await old.fetch(
            "UPDATE id_pool_switch SET status = 'TAKEN', issued_at = now() WHERE id_value IN"
            " (SELECT id_value FROM id_pool_switch WHERE status = 'AVAILABLE' LIMIT $1"
            "  FOR UPDATE SKIP LOCKED) RETURNING id_value",
            count,
        )
        return [r["id_value"] for r in rows]

    try:
        await old.execute("CREATE TABLE id_pool_switch (LIKE id_pool_tiny INCLUDING ALL)")
        await old.execute(
            "INSERT INTO id_pool_switch"
            " SELECT k, 'AVAILABLE', now(), NULL FROM unnest($1::text[]) AS k",
            pool,
        )
        by_old = await old_issues(10)
        _, more = await asyncio.gather(run_import(settings, *words), old_issues(10))
        by_old += more
        await run_import(settings, *words)  # each run takes what changed since
        await stack.fill("tiny", 2)
        await stack.refill("tiny")
        by_us = await pop_all(hot, "tiny")  # callers moved: both serve
        by_old += await old_issues(10)
        await run_import(settings, *words)  # the old service stopped: a last import
        for _ in range(40):
            await stack.fill("tiny", 2)
            await stack.refill("tiny")
            got = await pop_all(hot, "tiny")
            if not got and stack.keygen.exhausted("tiny"):
                break
            by_us += got
    finally:
        await old.execute("DROP TABLE IF EXISTS id_pool_switch")
        await old.close()
        await hot.close()
    assert len(by_old) == 30 and len(set(by_us)) == len(by_us) > 500
    assert not set(by_old) & set(by_us)
    assert not set(pool) & set(by_us)  # available there: never handed out here either


async def test_mosips_put_answers_for_imported_uins_as_the_kernel_would(
    servers: Servers, database: str, hot: HotStore, tmp_path: Path
) -> None:
    """An imported ASSIGNED UIN cannot be given back (KER-UIG-004, the kernel's "not
    ISSUED"); an imported ISSUED one is confirmed by its client."""
    farmer = build_id_types(mosip_settings(servers, database))["farmer"]
    assigned, issued = farmer.generate(2_000, 4_000)[0][:2]
    listing = tmp_path / "uins.txt"
    listing.write_text(f"{assigned},ASSIGNED\n{issued},ISSUED\n")
    async with mosip_stack(servers, database, hot) as (http, _, settings, _):
        words = ("file", str(listing), "--type", "farmer", "--client", ANONYMOUS)
        (report,) = await run_import(settings, *words)
        assert report["ledger_added"] == 2
        assert error_code(await put(http, assigned, "UNASSIGNED")) == "KER-UIG-004"
        assert (await put(http, assigned, "ASSIGNED"))["response"]["status"] == "ASSIGNED"
        assert (await put(http, issued, "ASSIGNED"))["response"]["status"] == "ASSIGNED"


class Killed(Exception):
    """Stands for a kill: the import's process ends in the middle of its run."""


class Stages:
    """ImportTarget.stage, counted (rows staged), ending the run as a kill would once
    ``left`` chunks were staged (None: never)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, left: int | None) -> None:
        self.rows, self.left = 0, left
        real = ImportTarget.stage

        async def stage(target: ImportTarget, rows: Sequence[Staged], *more: Any) -> None:
            if self.left == 0:
                raise Killed
            await real(target, rows, *more)
            self.rows += len(rows)
            self.left = None if self.left is None else self.left - 1

        monkeypatch.setattr(ImportTarget, "stage", stage)


async def _state(settings: Settings) -> dict[str, list[tuple[Any, ...]]]:
    """What imports left: exclusions, ledger issues, runs (their tallies), staging tables."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        found = {
            "excluded": await conn.fetch(
                "SELECT id_type, key, counter, source, status, created_at, updated_at"
                " FROM kd_excluded ORDER BY id_type, key"
            ),
            "ledger": await conn.fetch(
                "SELECT key, issued_at, client, entry_id, used_at, used_by"
                ' FROM "kd_ledger_uin" ORDER BY key'
            ),
            "runs": await conn.fetch(
                "SELECT id_type, source, cursor IS NOT NULL, tally, recorded IS NOT NULL"
                " FROM kd_import_runs ORDER BY id_type, source"
            ),
            "staging": await conn.fetch(
                "SELECT relname FROM pg_class WHERE relname LIKE 'kd_stage_%' ORDER BY 1"
            ),
        }
    finally:
        await conn.close()
    return {name: [tuple(row) for row in rows] for name, rows in found.items()}


async def _staged(settings: Settings, table: str) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{table}"'))
    finally:
        await conn.close()


async def _uninterrupted(
    servers: Servers, template_db: str, *words: str
) -> tuple[dict[str, Any], dict[str, list[tuple[Any, ...]]]]:
    """The same import, never killed, into a database of its own: its report and state."""
    async with cloned_database(servers, template_db) as other:
        whole = make_settings(servers, other, id_types=TYPES)
        await run_migrate(whole)
        (report,) = await run_import(whole, *words)
        return report, await _state(whole)


async def test_a_killed_import_resumes_where_it_stopped(
    settings: Settings,
    source: str,
    servers: Servers,
    template_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed after two chunks of its read: nothing is recorded yet, the next run reads
    only the rows left, says where it went on from, and leaves exactly what an import
    never killed leaves."""
    monkeypatch.setattr(imports, "CHUNK", 100)
    words = ("openg2p", "--from", source, "--type", "uin", "--table", "id_pool_tiny")
    stages = Stages(monkeypatch, left=2)
    with pytest.raises(Killed):
        await run_import(settings, *(*words, "--client", "old"))
    killed = await _state(settings)
    assert killed["excluded"] == [] and killed["ledger"] == []
    assert [run[:3] for run in killed["runs"]] == [("uin", "openg2p", True)]
    assert await _staged(settings, "kd_stage_openg2p_uin") == stages.rows == 200

    stages.rows, stages.left = 0, None
    (resumed,) = await run_import(settings, *(*words, "--client", "old"))
    assert resumed["resumed"] == {"at_row": 200, "step": "reading"}
    assert stages.rows == len(THIRD) - 200  # only what was left was read
    report, state = await _uninterrupted(servers, template_db, *words, "--client", "old")
    assert await _state(settings) == state
    assert state["runs"] == [] and state["staging"] == []  # each run ended
    assert report["resumed"] is None and {**resumed, "resumed": None} == report


@pytest.mark.parametrize(
    "changed", ["", "file", "type"], ids=["same-file", "changed-file", "changed-type"]
)
async def test_a_killed_import_of_a_file_changed_since_starts_over(
    servers: Servers,
    database: str,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    changed: str,
) -> None:
    """The control: the run goes on from where a killed one stopped only when it reads
    what that one read, checked as that one checked it; a file changed since is read
    from its first line (an unchanged one, only past the rows staged), and so is one
    whose type's settings changed since (its filters: rows staged under the old ones
    are checked again)."""
    monkeypatch.setattr(imports, "CHUNK", 100)
    listing = tmp_path / "issued.txt"
    listing.write_text("".join(f"{key},TAKEN\n" for key in THIRD))
    words = ("file", str(listing), "--type", "uin")
    stages = Stages(monkeypatch, left=2)
    with pytest.raises(Killed):
        await run_import(settings, *words)
    if changed == "file":
        with listing.open("a") as more:
            more.write(f"{EVERY_KEY[1]},TAKEN\n")
    if changed == "type":  # the same keyspace, other filters: some IDs now invalid
        filtered = {**TYPES, "uin": {**TYPES["uin"], "filter_profile": "openg2p"}}
        settings = make_settings(servers, database, id_types=filtered)
    stages.rows, stages.left = 0, None
    (report,) = await run_import(settings, *words)
    total = len(THIRD) + (changed == "file")
    invalid = report["invalid"] if changed == "type" else 0
    assert changed != "type" or invalid > 0
    assert report["resumed"] == (None if changed else {"at_row": 200, "step": "reading"})
    assert stages.rows == (total - invalid if changed else total - 200)  # the rows staged
    assert report["rows_read"] == total
    assert report["excluded_added"] == report["ledger_added"] == total - invalid


async def test_an_import_killed_before_its_sweep_only_sweeps_when_run_again(
    settings: Settings, source: str, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its record, before the hot list's sweep: the next run reads nothing
    again, sweeps, and reports what the killed one recorded."""
    hot = HotStore.from_settings(settings)
    await stack.fill("tiny", 8)
    await stack.refill("tiny")  # imported IDs in the hot list
    real_sweep = imports.sweep

    async def killed(*args: Any) -> imports.Swept:
        raise Killed

    monkeypatch.setattr(imports, "sweep", killed)
    words = ("openg2p", "--from", source, "--type", "tiny")
    with pytest.raises(Killed):
        await run_import(settings, *words)
    monkeypatch.setattr(imports, "sweep", real_sweep)
    stages = Stages(monkeypatch, left=None)
    (report,) = await run_import(settings, *words)
    try:
        listed = await pop_all(hot, "tiny")
    finally:
        await hot.close()
    assert report["resumed"] == {"at_row": len(THIRD), "step": "sweeping"}
    assert stages.rows == 0 and report["excluded_added"] == len(THIRD)
    assert report["hot_removed"] > 0 and listed and not set(listed) & set(THIRD)
    assert (await _state(settings))["runs"] == []


async def listed(settings: Settings, name: str) -> list[str]:
    hot = HotStore.from_settings(settings)
    try:
        return [key async for keys in hot.listed(name) for key in keys]
    finally:
        await hot.close()


async def test_a_redis_failover_right_after_the_import_hands_out_none_of_it(
    servers: Servers,
    database: str,
    source: str,
    pair: Pair,  # noqa: F811
) -> None:
    """A serving stack on a Redis primary with a replica (loopback, redis-server); a
    keysync batch taken before the import; the replica promoted (REPLICAOF NO ONE) as
    soon as the import returns. The late batch is refused there, and keygen and keysync,
    now on the promoted server, dispensed to exhaustion: none of the imported, and no
    other key lost but the late batch and the lists the promotion discards (the fence)."""
    on_primary = make_settings(servers, database, id_types=TYPES, redis_url=pair.primary.url)
    promoted = make_settings(servers, database, id_types=TYPES, redis_url=pair.replica.url)
    await run_migrate(on_primary)
    cold = await ColdStore.connect(on_primary.postgres_dsn)
    hot = HotStore.from_settings(promoted)
    try:
        before = Stack(on_primary, cold, SyncRecord.from_settings(on_primary))
        await before.fill("tiny", 3)
        await before.refill("tiny")  # imported IDs in the hot list, replicated
        late = await before.cold.begin_take("tiny", 100)
        await late.commit()  # taken before the import, pushed after the failover
        assert set(late.keys) & set(THIRD)
        (report,) = await run_import(on_primary, "openg2p", "--from", source, "--type", "tiny")
        assert report["replicas"] == report["replicas_acknowledged"] == 1
        before.generator.close()
        at_failover = await listed(on_primary, "tiny")  # discarded by the promotion
        await replicaof(pair.replica_client, "NO", "ONE")  # the failover

        pushed = await hot.push("tiny", late.keys, "late-batch", epoch=late.epoch)
        assert pushed.status == "superseded"
        after = Stack(promoted, cold, SyncRecord.from_settings(promoted))
        handed_out = await pop_all(hot, "tiny")
        for _ in range(40):
            await after.fill("tiny", 2)
            await after.refill("tiny")
            got = await pop_all(hot, "tiny")
            if not got and after.keygen.exhausted("tiny"):
                break
            handed_out += got
        after.generator.close()
    finally:
        await hot.close()
        await cold.close()
    assert len(set(handed_out)) == len(handed_out) > 300
    assert not set(handed_out) & set(THIRD)
    assert set(handed_out) | set(late.keys) | set(at_failover) | set(THIRD) == set(EVERY_KEY)
