"""A bad setup is refused at start-up, naming the fix: never served on, never an outage
retried forever (docs/operations.md, "Start-up checks"). The real `keydispenser`
command against the test servers."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from keydispenser_ops.processes import run_cli
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.acceptance.harness import ChildProcesses, process_env, write_config
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

pytestmark = pytest.mark.acceptance


def ledger_types() -> dict[str, object]:
    types = small_types()
    types["shortlink"]["ledger"] = True
    return types


def with_query(dsn: str, query: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


def as_role(dsn: str, role: str) -> str:
    scheme, rest = dsn.split("://", 1)
    return f"{scheme}://{role}@{rest.rpartition('@')[2]}"


def refused(result: object, *named: str) -> str:
    """stderr of a command that exited 2 (a configuration error) naming each of ``named``,
    in one line, without a traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)  # type: ignore[attr-defined]
    err: str = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err
    for text in named:
        assert text in err, err
    return err


@pytest.mark.parametrize("command", ["keygen", "keysync"])
def test_a_missing_ca_file_is_a_configuration_error(
    settings: Settings, tmp_path: Path, command: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    env["KD_POSTGRES_DSN"] = with_query(
        settings.postgres_dsn, "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
    )
    refused(run_cli(command, env=env), "postgres_dsn", "sslrootcert", "/nonexistent")


def test_verify_full_without_a_ca_for_a_user_without_a_home_says_what_to_add(
    settings: Settings, tmp_path: Path
) -> None:
    """A service user with ``--home /nonexistent`` has no ~/.postgresql/root.crt."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), HOME="/nonexistent")
    env["KD_POSTGRES_DSN"] = with_query(settings.postgres_dsn, "sslmode=verify-full")
    refused(run_cli("keygen", env=env), "sslmode=verify-full", "sslrootcert=")


@pytest.mark.parametrize(
    ("query", "named"),
    [("sslmode=bogus", "sslmode"), ("no_such_option=1", "no_such_option")],
)
def test_an_invalid_dsn_option_is_a_configuration_error(
    settings: Settings, tmp_path: Path, query: str, named: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    env["KD_POSTGRES_DSN"] = with_query(settings.postgres_dsn, query)
    refused(run_cli("keygen", env=env), named)


def test_a_dispenser_that_cannot_log_in_to_read_the_ledger_does_not_start(
    servers: Servers, database: str, tmp_path: Path
) -> None:
    settings = make_settings(servers, database, id_types=ledger_types())
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), KD_DISPENSER__PORT="0")
    del env["KD_PERMUTATION_KEY"]
    env["KD_POSTGRES_DSN"] = as_role(settings.postgres_dsn, "kd_no_such_role")
    refused(run_cli("dispenser", env=env), "postgres_dsn", "kd_no_such_role")


def test_a_dispenser_without_ledger_types_needs_no_postgres(
    servers: Servers, database: str, tmp_path: Path
) -> None:
    """No type keeps a ledger: the dispenser never reads PostgreSQL, and starts without
    it (the check is only where it is needed)."""
    settings = make_settings(servers, database)
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), KD_DISPENSER__PORT="0")
    del env["KD_PERMUTATION_KEY"]
    env["KD_POSTGRES_DSN"] = as_role(settings.postgres_dsn, "kd_no_such_role")
    stack = ChildProcesses(tmp_path)
    child = stack.spawn("dispenser", env, "dispenser")
    try:
        wait_for_log(tmp_path / "dispenser.log", "Application startup complete")
        assert child.poll() is None
    finally:
        stack.close()


async def test_a_postgres_the_dispenser_cannot_use_is_503_and_readyz_says_so(
    servers: Servers, database: str
) -> None:
    """Started with a PostgreSQL it cannot log in to (a password rotated under it): a
    lookup is 503 IDG-005, never 500; /readyz stays 200 (issuing needs only Redis) and
    says PostgreSQL is unusable and which setting to check, as kd_postgres_up does; the
    log has the detail."""
    bad = make_settings(servers, database, id_types=ledger_types())
    bad = bad.model_copy(update={"postgres_dsn": as_role(bad.postgres_dsn, "kd_no_such_role")})
    hot = HotStore.from_settings(bad)
    try:
        await hot.push("shortlink", ["Kaaaaa1", "Kaaaaa2"], "batch-1")
    finally:
        await hot.close()
    async with dispenser_over_http(bad) as client:
        issued = await client.post("/v1/keys/shortlink")
        assert issued.status_code == 200
        key = issued.json()["keys"][0]
        looked = await client.get(f"/v1/keys/shortlink/{key}")
        assert looked.status_code == 503, looked.text
        [error] = looked.json()["errors"]
        assert error["errorCode"] == "IDG-005"
        assert "kd_no_such_role" not in error["message"]  # a client is not told the setup
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["postgres"]["ok"] is False
        assert "postgres_dsn" in ready.json()["postgres"]["error"]
        assert "kd_postgres_up 0.0" in (await client.get("/metrics")).text

    good = make_settings(servers, database, id_types=ledger_types())
    async with dispenser_over_http(good) as client:
        ready = await client.get("/readyz")
        assert ready.json()["postgres"] == {"ok": True}
        assert "kd_postgres_up 1.0" in (await client.get("/metrics")).text


@pytest.mark.parametrize("postgres", ["migrated", "away"])
@pytest.mark.parametrize("command", ["keygen", "keysync"])
def test_a_busy_metrics_port_names_the_port(
    settings: Settings, tmp_path: Path, command: str, postgres: str
) -> None:
    """Refused before any store is reached (both start through shared/startup.py): a
    PostgreSQL that is away, an outage waited for, does not hold the refusal back."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = process_env(
            settings,
            write_config(settings, tmp_path / "c.yaml"),
            **{f"KD_{command.upper()}__METRICS_PORT": str(port)},
        )
        if postgres == "away":
            env["KD_POSTGRES_DSN"] = "postgresql://postgres@127.0.0.1:1/none"  # nothing listens
        else:
            assert run_cli("migrate", env=env).returncode == 0
        done = run_cli(command, env=env, timeout_s=30)
        err = refused(done, f"{command}.metrics_port", str(port))
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"keydispenser: configuration error: {command}.metrics_port"), last
    assert "postgres" not in last and "redis" not in last


@pytest.mark.parametrize("command", ["dispenser", "keysync"])
def test_a_process_given_the_permutation_key_it_never_uses_warns(
    settings: Settings, tmp_path: Path, command: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"), KD_DISPENSER__PORT="0")
    assert run_cli("migrate", env=env).returncode == 0
    stack = ChildProcesses(tmp_path)
    child = stack.spawn(command, env, command)
    try:
        started = {"dispenser": "Application startup complete", "keysync": "keysync_started"}
        wait_for_log(tmp_path / f"{command}.log", started[command])
        warnings = [
            json.loads(line)
            for line in (tmp_path / f"{command}.log").read_text().splitlines()
            if "secret_not_needed" in line
        ]
        assert len(warnings) == 1, warnings
        assert warnings[0]["setting"] == "permutation_key"
        assert "KD_PERMUTATION_KEY" in warnings[0]["advice"]
        child.send_signal(signal.SIGTERM)
        child.wait(15)
    finally:
        stack.close()


def test_keygen_holding_the_key_does_not_warn(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    assert run_cli("migrate", env=env).returncode == 0
    stack = ChildProcesses(tmp_path)
    stack.spawn("keygen", env, "keygen")
    try:
        wait_for_log(tmp_path / "keygen.log", "keygen_started")
        assert "secret_not_needed" not in (tmp_path / "keygen.log").read_text()
    finally:
        stack.close()


def wait_for_log(path: Path, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text() if path.exists() else ''}")
