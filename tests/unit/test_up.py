"""What ``keydispenser up`` tells the operator once the stack serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from keydispenser_ops.up import dispenser_port, first_keys_note, greeting
from shared.domain.config import Settings, load_settings
from tests.conftest import EMPTY_CONFIG

BASE = "http://127.0.0.1:8080"


def test_the_banner_says_where_everything_is_and_what_to_try() -> None:
    numeric = {"kind": "numeric", "length": 10}
    snowflake = {"kind": "snowflake"}
    types = {"member": numeric, "farmer": numeric, "events": snowflake}
    settings = Settings.model_validate({"id_types": types})
    dsn, url = "postgresql://postgres@127.0.0.1:5/keydispenser", "redis://127.0.0.1:6/0"
    lines = greeting(settings, BASE, dsn, url, ".keydispenser/stack.env").splitlines()
    assert lines[0] == f"keydispenser is up: {BASE}  (Ctrl-C stops everything)"
    assert f"  PostgreSQL  {dsn}" in lines and f"  Redis       {url}" in lines
    assert "  settings    .keydispenser/stack.env" in lines
    assert f"  curl -X POST {BASE}/v1/idgenerator/member/id" in lines
    assert f"  curl -X POST '{BASE}/v1/keys/farmer?count=5'" in lines
    assert f"  curl -X POST {BASE}/v1/idgenerator/events/id" in lines
    assert any(line.endswith("decode --type events <an events ID>") for line in lines)
    assert any(line.endswith(" status") for line in lines)


def test_without_a_type_there_is_no_request_to_try() -> None:
    assert "curl -X POST" not in greeting(Settings.model_validate({"id_types": {}}), BASE)


def test_the_wait_for_first_keys_says_what_each_type_waits_for() -> None:
    types = {"farmer": {"kind": "numeric", "length": 10}, "events": {"kind": "snowflake"}}
    settings = Settings.model_validate({"id_types": types})
    note = first_keys_note(settings, ["events", "farmer"])
    assert note == (
        "keydispenser: generating the first keys of farmer; leasing a machine ID for events "
        "(a Redis server grants none for one lease TTL after its first use, 10 s)..."
    )


def test_up_serves_on_the_port_given_else_the_configurations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KD_DISPENSER__PORT", "8181")
    settings = load_settings(EMPTY_CONFIG)
    assert dispenser_port(settings, None) == 8181  # the environment wins, as documented
    assert dispenser_port(settings, 9090) == 9090  # --port wins over both
    monkeypatch.delenv("KD_DISPENSER__PORT")
    assert dispenser_port(load_settings(EMPTY_CONFIG), None) == 8080


def test_progress_says_keys_made_and_the_rate_since_the_line_before() -> None:
    from keydispenser_ops.up import progress_line

    assert progress_line("mosip_vid", 6_600, None, 10.0) == "  mosip_vid: 6,600 keys made"
    line = progress_line("mosip_vid", 16_600, (10.0, 6_600), 15.0)
    assert line == "  mosip_vid: 16,600 keys made (2,000/s)"


def test_purge_removes_only_a_stacks_own_entries_and_refuses_what_is_not_one(
    tmp_path: Path,
) -> None:
    from keydispenser_ops.up import purge
    from shared.domain.errors import ConfigError

    bare = tmp_path / "bare"
    (bare / "redis").mkdir(parents=True)  # only names up uses: no proof of a stack
    with pytest.raises(ConfigError, match="holds no stack's data"):
        purge(bare)
    assert (bare / "redis").is_dir()

    data = tmp_path / "data"
    (data / "secrets").mkdir(parents=True)
    (data / "secrets" / "permutation.key").write_text("k\n")
    (data / "up.pid").write_text("999999999\n")  # no such process: stopped
    (data / "stack.env").write_text("KD_REDIS_URL=redis://127.0.0.1:1/0\n")
    outside = tmp_path / "kept"
    outside.mkdir()
    (data / "redis").symlink_to(outside)  # a link is removed, never followed
    assert purge(data) == [data]
    assert not data.exists() and outside.is_dir()
    assert purge(data) == []  # nothing left: nothing to do


def test_purge_removes_postgres_data_outside_only_where_this_directory_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copied data directory names its original's PGDATA: never removed."""
    from keydispenser_ops.up import _pgdata_outside
    from shared.domain.errors import ConfigError

    runtime = tmp_path / "runtime"
    monkeypatch.setenv("KD_EMBEDDED_RUNTIME", str(runtime))
    data = tmp_path / "data"
    (data / "postgres").mkdir(parents=True)
    mine, other = runtime / "pgdata-mine", runtime / "pgdata-original"
    mine.mkdir(parents=True)
    other.mkdir()
    location = data / "postgres" / "PGDATA_LOCATION"
    location.write_text(f"{mine}\n")
    assert _pgdata_outside(data, mine) == mine
    location.write_text(f"{other}\n")  # a copy of another stack's data directory
    with pytest.raises(ConfigError, match="copied or moved"):
        _pgdata_outside(data, mine)
    stray = tmp_path / "elsewhere"
    stray.mkdir()
    location.write_text(f"{stray}\n")  # outside the runtime directory: never removed
    with pytest.raises(ConfigError):
        _pgdata_outside(data, stray)
    assert mine.is_dir() and other.is_dir() and stray.is_dir()


def test_apikeys_note_knows_the_clients_default_batch() -> None:
    """The server cannot import the client: the number it warns about is checked here."""
    from keydispenser_client import Buffering
    from shared.domain.apikeys import CLIENT_DEFAULT_BATCH

    assert Buffering().batch == CLIENT_DEFAULT_BATCH
