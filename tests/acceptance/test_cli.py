"""The real `keydispenser` command: config errors, migrate, status, graceful stop."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from keydispenser_ops.processes import cli_command, run_cli
from shared.domain.config import Settings
from shared.stores.postgres.databases import drop_database, scratch_database
from tests.acceptance.harness import ChildProcesses, process_env, write_config

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("id_types:\n  t:\n    kind: numeric\n    length: 40\n", "id_types.t"),
        (
            "id_types:\n  t:\n    kind: numeric\n    length: 10\n    hot: {low: 5, high: 1}\n",
            "id_types.t.hot",
        ),
        ("id_types: [", "config.yaml"),
        (  # shorter than the fence's detection time (5 + 1 + 0.5 s by default)
            "keysync:\n  ledger_retain_s: 5\n"
            "id_types:\n  t:\n    kind: numeric\n    length: 10\n    ledger: true\n",
            "keysync.ledger_retain_s: 5 s is shorter than the PostgreSQL fence's detection",
        ),
    ],
)
def test_bad_config_exits_non_zero_naming_the_field(
    tmp_path: Path, yaml_text: str, field: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    result = run_cli("--config", str(path), "migrate", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert field in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_permutation_key_is_refused(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    del env["KD_PERMUTATION_KEY"]
    result = run_cli("keygen", env=env)
    assert result.returncode == 2
    assert "permutation_key" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["keygen", "keysync", "dispenser", "migrate", "status"])
def test_no_configuration_file_is_refused_unless_the_builtin_is_asked_for(
    settings: Settings, tmp_path: Path, command: str
) -> None:
    """A process (or operator command) started with KD_CONFIG unset would run on the
    built-in types against a production database: it refuses, naming the fix."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    del env["KD_CONFIG"]
    result = run_cli(command, env=env)
    assert result.returncode == 2, result.stderr
    assert "KD_CONFIG" in result.stderr and "KD_CONFIG=builtin" in result.stderr
    assert "farmer" in result.stderr  # which types it would have run on
    assert "Traceback" not in result.stderr


def test_the_builtin_configuration_on_purpose(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    env["KD_CONFIG"] = "builtin"
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    status = run_cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert "farmer" in json.loads(status.stdout)["id_types"]


def test_secrets_come_from_systemd_credentials(settings: Settings, tmp_path: Path) -> None:
    """As a systemd unit with LoadCredential= runs it: the DSN and the permutation key are
    files in $CREDENTIALS_DIRECTORY, not environment variables."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o700)
    for variable in ("KD_POSTGRES_DSN", "KD_PERMUTATION_KEY"):
        (credentials / variable).write_text(env.pop(variable) + "\n")
    env["CREDENTIALS_DIRECTORY"] = str(credentials)
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    status = run_cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert set(json.loads(status.stdout)["id_types"]) == set(settings.id_types)
    # Without the directory the same command has no database to go to, and says so.
    del env["CREDENTIALS_DIRECTORY"]
    assert run_cli("status", env=env).returncode != 0


def test_unreachable_database_is_a_clear_error(settings: Settings, tmp_path: Path) -> None:
    env = process_env(
        settings,
        write_config(settings, tmp_path / "c.yaml"),
        KD_POSTGRES_DSN="postgresql://postgres@127.0.0.1:1/none",
    )
    result = run_cli("migrate", env=env)
    assert result.returncode == 1
    assert "postgres_dsn" in result.stderr and "Traceback" not in result.stderr


def test_migrate_then_status(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert "schema at version" in migrated.stdout
    status = run_cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert set(report["id_types"]) == {"farmer", "shortlink"}
    assert report["id_types"]["farmer"]["hot_depth"] == 0
    assert report["id_types"]["farmer"]["counters_headroom"] == 10**9
    assert report["postgres_fence"]["halted"] is False
    assert report["postgres_fence"]["last_fence"] is None
    table = run_cli("status", env=env)
    assert "farmer" in table.stdout and "headroom" in table.stdout
    assert "postgres fence: ok; never fenced" in table.stdout


def test_an_api_key_for_a_type_of_another_configuration_says_which_was_read(
    tmp_path: Path,
) -> None:
    env = {"PATH": os.environ["PATH"]}
    done = run_cli("apikey", "--name", "registry", "--types", "uin", env=env)
    assert done.returncode == 2
    assert "the built-in configuration" in done.stderr and "--config FILE" in done.stderr
    config = tmp_path / "mine.yaml"
    config.write_text("id_types: {uin: {kind: numeric, length: 10}}\n")
    mine = run_cli(
        "--config", str(config), "apikey", "--name", "registry", "--types", "uin", env=env
    )
    assert mine.returncode == 0, mine.stderr
    assert "uin" in mine.stdout


def test_status_into_a_closed_pipe_is_no_store_fault(settings: Settings, tmp_path: Path) -> None:
    """`keydispenser status | head -0`: the reader closed the pipe; said by the exit
    status a shell expects (141), never blamed on a store."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    assert run_cli("migrate", env=env).returncode == 0
    reader, writer = os.pipe()
    os.close(reader)  # nobody reads: the first write fails
    try:
        done = subprocess.run(
            cli_command("status"), env=env, stdout=writer, stderr=subprocess.PIPE,
            text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("command", ["keygen", "keysync", "dispenser"])
def test_processes_stop_cleanly_on_sigterm(
    settings: Settings, tmp_path: Path, command: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), KD_DISPENSER__PORT="0")
    stack = ChildProcesses(tmp_path)
    child = stack.spawn(command, env, command)
    try:
        started = {
            "keygen": "keygen_started",
            "keysync": "keysync_started",
            "dispenser": "Application startup complete",
        }[command]
        _wait_for_log(tmp_path / f"{command}.log", started)
        child.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once its graceful shutdown has finished.
        assert child.wait(15) in (0, -signal.SIGTERM)
        stopped = {
            "keygen": "keygen_stopped",
            "keysync": "keysync_stopped",
            "dispenser": "Application shutdown complete",
        }[command]
        assert stopped in (tmp_path / f"{command}.log").read_text()
    finally:
        stack.close()


def _wait_for_log(path: Path, text: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text() if path.exists() else ''}")


def test_fill_adds_keys_with_a_progress_bar(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    result = run_cli("fill", "--type", "farmer", "--count", "5000", env=env)
    assert result.returncode == 0, result.stderr
    assert "added" in result.stdout
    added = int(result.stdout.split("added ")[1].split()[0])
    assert added >= 5000
    assert "keys" in result.stderr  # tqdm draws on stderr
    report = json.loads(run_cli("status", "--json", env=env).stdout)["id_types"]
    assert report["farmer"]["cold_depth"] == added
    assert 0.05 < report["farmer"]["acceptance_rate"] < 0.2
    assert report["farmer"]["estimated_keys_left"] > 0


def test_fill_refuses_an_unknown_type(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    result = run_cli("fill", "--type", "nosuch", "--count", "10", env=env)
    assert result.returncode == 2
    assert "--type" in result.stderr and "Traceback" not in result.stderr
    bad_count = run_cli("fill", "--type", "farmer", "--count", "0", env=env)
    assert bad_count.returncode == 2 and "--count" in bad_count.stderr


@pytest.mark.not_pooled
@pytest.mark.parametrize("rate", ["fast", "-1", "nan", "inf"])
def test_bench_refuses_a_bad_rate_naming_the_option(
    settings: Settings, tmp_path: Path, rate: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    result = run_cli("bench", "pipeline", "--rate", rate, "--seconds", "0.1", env=env)
    assert result.returncode == 2
    assert "--rate" in result.stderr and "keys/s >= 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.not_pooled
@pytest.mark.parametrize(
    ("bench", "option", "value", "said"),
    [
        ("ledger", "--existing-rows", "-5", "whole number >= 0"),
        ("lifecycle", "--existing-rows", "1.5e6x", "whole number >= 0"),
        ("lifecycle", "--existing-rows", "2.5", "whole number >= 0"),
        ("keygen", "--spent", "1", "fraction in [0, 1)"),
        ("keygen", "--spent", "nan", "fraction in [0, 1)"),
    ],
)
def test_the_growth_benches_refuse_a_bad_size_naming_the_option(
    settings: Settings, tmp_path: Path, bench: str, option: str, value: str, said: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    result = run_cli("bench", bench, option, value, "--seconds", "0.1", env=env)
    assert result.returncode == 2
    assert option in result.stderr and said in result.stderr
    assert "Traceback" not in result.stderr


def test_apikey_prints_a_key_once_and_its_config_entry(settings: Settings, tmp_path: Path) -> None:
    import yaml

    from shared.domain.apikeys import digest

    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    result = run_cli("apikey", "--name", "registry", "--types", "farmer", "--rate", "20", env=env)
    assert result.returncode == 0, result.stderr
    key = result.stdout.split("\n")[1].strip()
    entry = yaml.safe_load(result.stdout.split("configuration:\n", 1)[1])
    assert entry == [
        {"name": "registry", "sha256": digest(key), "id_types": ["farmer"], "rate_per_s": 20.0}
    ]
    # A burst (20: a second of --rate) below the client's default batch is pointed out.
    assert "at most 20 keys a request" in result.stderr and "--burst" in result.stderr
    refused = run_cli("apikey", "--name", "x", "--types", "nope", env=env)
    assert refused.returncode == 2
    assert "id_types" in refused.stderr and "nope" in refused.stderr
    ample = run_cli("apikey", "--name", "bulk", "--rate", "20", "--burst", "5000", env=env)
    assert ample.returncode == 0 and ample.stderr == "", ample.stderr
    assert yaml.safe_load(ample.stdout.split("configuration:\n", 1)[1])[0]["burst"] == 5000
    no_rate = run_cli("apikey", "--name", "y", "--burst", "5", env=env)
    assert no_rate.returncode == 2 and "--burst" in no_rate.stderr


@pytest.mark.not_pooled
@pytest.mark.parametrize("load", ["auto", "bundled"])
def test_bench_dispense_measures_all_four_on_both_servers_and_writes_json(
    settings: Settings, tmp_path: Path, load: str
) -> None:
    """The benchmark runs end to end (its figures are reported, never asserted)."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench",
        "dispense",
        "--seconds",
        "1",
        "--load",
        load,
        # granian's phases once (with wrk when installed); the bundled client on uvicorn.
        "--servers",
        "uvicorn,granian" if load == "auto" else "uvicorn",
        "--json",
        str(out),
        env=env,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    for field in ("bare_rps", "single_rps", "single_p99_ms", "batch_keys_per_s", "pg_baseline_rps"):
        assert report[field] > 0, field
    # Bare and single on each server measured, in the same run; unprefixed: uvicorn's.
    servers = ("uvicorn", "granian") if load == "auto" else ("uvicorn",)
    for server in servers:
        for field in ("bare_rps", "bare_p99_ms", "single_rps", "single_p99_ms"):
            assert report[f"{server}_{field}"] > 0, (server, field)
    # ...and each server's own ceiling (a pure ASGI app on uvicorn, RSGI on granian).
    assert report["uvicorn_single_vs_bare_asgi"] > 0
    if "granian" in servers:
        assert report["granian_bare_rsgi_rps"] > 0
        assert report["granian_single_vs_bare_rsgi"] > 0
        assert report["granian_single_p99_vs_bare_rsgi"] > 0
    assert report["uvicorn_single_rps"] == report["single_rps"]
    assert ("granian_single_rps" in report) == ("granian" in servers)
    for run in report["runs"].values():
        assert run["non_2xx"] == {
            "bare": 0,
            "bare_asgi": 0,
            "single": 0,
            "batch": 0,
            "pg_baseline": 0,
        }
        if "granian" in servers:
            assert run["granian_non_2xx"] == {"bare": 0, "bare_rsgi": 0, "single": 0}
            assert run["granian_single_keys_served"] > 0
            assert "granian_single_vs_uvicorn_bare" in run["targets_met"]
            assert "granian_single_vs_bare_rsgi" in run["targets_met"]
        assert run["single_keys_served"] > 0
        assert isinstance(run["pool_ran_dry"], bool)  # reported; depends on speed
        assert isinstance(run["batch_pool_ran_dry"], bool)
    # auto picks wrk when installed, else the bundled client, and says which it used.
    wrk = load == "auto" and shutil.which("wrk") is not None
    assert report["load_generator"] == ("wrk" if wrk else "bundled-asyncio-client")


def test_fence_postgres_moves_sequences_on_and_reports(settings: Settings, tmp_path: Path) -> None:
    """The operator's command after a halt: unconditional, in one clear JSON answer."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    assert run_cli("migrate", env=env).returncode == 0
    fenced = run_cli("fence-postgres", "--skip-ranges", "3", env=env)
    assert fenced.returncode == 0, fenced.stderr
    report = json.loads(fenced.stdout)
    size = settings.pooled("farmer").range_size
    assert report["next_starts"]["farmer"] == 3 * size
    status = json.loads(run_cli("status", "--json", env=env).stdout)
    assert status["postgres_fence"]["last_fence"]["reason"] == "operator"
    assert status["id_types"]["farmer"]["counters_leased"] == 3 * size
    refused = run_cli("fence-postgres", "--skip-ranges", "x", env=env)
    assert refused.returncode == 2 and "whole number" in refused.stderr


@pytest.mark.parametrize(
    ("command", "dsn", "expected"),
    [
        (("status",), "postgresql://kd:pw-secret@127.0.0.1:99999/x", "port must be 0-65535"),
        (("status",), "postgresql://kd:pw-secret@127.0.0.1:1/x", "127.0.0.1"),
        (("status",), "postgresql://kd:pw-secret@127.0.0.1:port/x", "127.0.0.1:port/x"),
        (("bench", "keygen"), "postgresql://kd:pw-secret@127.0.0.1:1/x", "127.0.0.1"),
        (("bench", "dispense"), "postgresql://kd:pw-secret@127.0.0.1:99999/x", "99999"),
    ],
)
def test_operator_commands_fail_in_one_line(
    settings: Settings, tmp_path: Path, command: tuple[str, ...], dsn: str, expected: str
) -> None:
    """What failed, where, and the exit code; never a traceback, never the password."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), KD_POSTGRES_DSN=dsn)
    result = run_cli(*command, "--seconds", "1", env=env) if command[0] == "bench" else None
    result = result or run_cli(*command, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"keydispenser {command[0]}"), lines
    assert expected in lines[0] and "(exit 1)" in lines[0]
    assert "pw-secret" not in result.stderr + result.stdout


def test_status_on_a_server_without_the_database_is_one_line(
    settings: Settings, tmp_path: Path
) -> None:
    missing = settings.postgres_dsn.rsplit("/", 1)[0] + "/kd_no_such_database"
    env = process_env(
        settings, write_config(settings, tmp_path / "c.yaml"), KD_POSTGRES_DSN=missing
    )
    result = run_cli("status", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "keydispenser status: postgres "
        + missing.split("@")[-1]
        + ': database "kd_no_such_database" does not exist: '
        + "run `keydispenser migrate` (it creates the database) (exit 1)"
    ]


@pytest.mark.not_pooled
def test_bench_keygen_makes_its_scratch_database_through_the_maintenance_one(
    settings: Settings, tmp_path: Path
) -> None:
    """The configured database need not exist: benches work beside, not in, it."""
    missing = settings.postgres_dsn.rsplit("/", 1)[0] + "/kd_no_such_database"
    env = process_env(
        settings, write_config(settings, tmp_path / "c.yaml"), KD_POSTGRES_DSN=missing
    )
    result = run_cli("bench", "keygen", "--seconds", "0.2", env=env, timeout_s=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_up_announces_itself_only_when_every_type_serves(
    settings: Settings, tmp_path: Path
) -> None:
    """The first curl after "is up" gets a key of every type, never 503 IDG-001."""
    import select
    import subprocess
    import sys
    import urllib.request

    from keydispenser_ops.embedded import free_port

    port = free_port()
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shared.cli",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            "--postgres-dsn",
            settings.postgres_dsn,
            "--redis-url",
            settings.redis_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 240
        line = ""
        while "is up" not in line:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and up.poll() is None, "up never announced"
            readable, _, _ = select.select([up.stdout], [], [], min(remaining, 1.0))
            if readable:
                line = up.stdout.readline()
        for name in settings.id_types:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/idgenerator/{name}/id", method="POST"
            )
            with urllib.request.urlopen(request, timeout=5) as reply:
                assert reply.status == 200, name
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)


def test_errors_name_the_next_step(settings: Settings, tmp_path: Path) -> None:
    """A missing schema says to migrate; a missing --config file says it was --config; a
    misspelt KD_ variable is pointed out, with the setting it probably meant."""
    empty = "kd_unmigrated_" + str(os.getpid())
    admin_dsn = settings.postgres_dsn.rsplit("/", 1)[0] + "/postgres"
    asyncio.run(scratch_database(admin_dsn, empty))
    try:
        env = process_env(
            settings,
            write_config(settings, tmp_path / "c.yaml"),
            KD_POSTGRES_DSN=settings.postgres_dsn.rsplit("/", 1)[0] + "/" + empty,
            KD_DISPENSR__PORT="9000",
        )
        status = run_cli("status", env=env)
        assert status.returncode == 1
        assert "run `keydispenser migrate`" in status.stderr.splitlines()[-1]
        assert "KD_DISPENSR__PORT matches no setting" in status.stderr
        assert "did you mean KD_DISPENSER__PORT?" in status.stderr
        missing = run_cli("--config", "/nowhere/kd.yaml", "status", env=env)
        assert missing.returncode == 2
        assert "--config: configuration file not found: /nowhere/kd.yaml" in missing.stderr
    finally:
        asyncio.run(drop_database(admin_dsn, empty))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--faults", "shard_restart_empty"), "shard_restart_empty is a fault of the cluster"),
        (("--redis", "cluster", "--faults", "pause"), "pause is a fault of the sentinel"),
        (("--slot-per", "type"), "--slot-per: with --redis cluster only"),
        (("--redis", "cluster", "--no-lease-wait"), "--no-lease-wait: with --redis sentinel"),
    ],
)
def test_a_drill_flag_of_the_other_topology_is_refused_before_anything_starts(
    args: tuple[str, ...], said: str
) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KD_PERMUTATION_KEY": "x" * 16}
    done = run_cli("drill", *args, env=env, timeout_s=60)
    assert done.returncode != 0
    assert said in done.stderr
