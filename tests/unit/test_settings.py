from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.domain.config import load_settings
from shared.domain.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_shipped_default_defines_farmer_and_shortlink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KD_CONFIG", raising=False)
    settings = load_settings()
    assert settings.pooled("farmer").kind == "numeric"
    assert settings.pooled("farmer").length == 10
    assert settings.pooled("shortlink").kind == "base62"
    assert settings.pooled("shortlink").length == 7


def test_environment_wins_over_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        "redis_url: redis://file:6379/0\n"
        "id_types:\n  farmer:\n    kind: numeric\n    length: 10\n"
        "    hot: {low: 10, high: 100}\n",
    )
    monkeypatch.setenv("KD_REDIS_URL", "redis://env:6379/1")
    monkeypatch.setenv("KD_ID_TYPES__FARMER__HOT__LOW", "42")
    settings = load_settings(path)
    assert settings.redis_url == "redis://env:6379/1"
    assert settings.pooled("farmer").hot.low == 42
    assert settings.pooled("farmer").hot.high == 100  # the rest of the file still applies


def test_kd_config_selects_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "id_types:\n  voter:\n    kind: numeric\n    length: 12\n")
    monkeypatch.setenv("KD_CONFIG", str(path))
    assert list(load_settings().id_types) == ["voter"]


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("id_types:\n  t:\n    kind: uuid\n    length: 10\n", "id_types.t.kind"),
        ("id_types:\n  t:\n    kind: numeric\n    length: 33\n", "id_types.t"),
        (
            "id_types:\n  t:\n    kind: numeric\n    length: 4\n    filter_profile: mosip\n",
            "first_equals_last",
        ),
        (
            'id_types:\n  t:\n    kind: base62\n    length: 7\n    prefix: "a/b"\n',
            "id_types.t.prefix",
        ),
        (
            "id_types:\n  t:\n    kind: base62\n    length: 7\n    hot: {low: 9, high: 3}\n",
            "id_types.t.hot",
        ),
        ("id_types:\n  Bad-Name:\n    kind: numeric\n    length: 10\n", "id_types.Bad-Name"),
        (
            "id_types:\n  t:\n    kind: numeric\n    length: 10\n    colour: red\n",
            "id_types.t.colour",
        ),
        ("dispenser:\n  port: 99999\n", "dispenser.port"),
        ("redis_namespace: Prod\n", "redis_namespace"),
        ("redis_namespace: 'kd:a'\n", "redis_namespace"),
        ('id_types:\n  t:\n    kind: numeric\n    length: 5\n    aliases: ["F/A"]\n', "aliases"),
        ('id_types:\n  t:\n    kind: numeric\n    length: 5\n    aliases: [".."]\n', "aliases"),
        (
            "id_types:\n  t:\n    kind: numeric\n    length: 5\n    check_digit: none\n",
            "order: sequential",
        ),
        (
            "id_types:\n  t:\n    kind: base62\n    length: 5\n    check_digit: verhoeff\n",
            "check_digit",
        ),
        # Configurations that cannot keep the ledger's promise, both keys named.
        (
            "id_types:\n  t:\n    kind: base62\n    length: 7\n    ledger: true\n"
            "    ledger_durability: replicated\n    ledger_replicas: 0\n",
            "ledger_replicas: 0",
        ),
        (
            "id_types:\n  t:\n    kind: base62\n    length: 7\n    ledger: true\n"
            "    ledger_durability: fsynced\n",
            "ledger_wait_ms of at least 1100",
        ),
        (
            "keysync:\n  ledger_retain_s: 0\n"
            "id_types:\n  t:\n    kind: base62\n    length: 7\n    ledger: true\n",
            "keysync.ledger_retain_s",
        ),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, yaml_text: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, yaml_text))
    assert field in str(caught.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KD_CONFIG"):
        load_settings(tmp_path / "absent.yaml")


def test_missing_permutation_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KD_PERMUTATION_KEY", raising=False)
    with pytest.raises(ConfigError, match="permutation_key"):
        load_settings().require_permutation_key()


def test_filters_none_is_shorthand_for_profile_none(tmp_path: Path) -> None:
    path = write(tmp_path, "id_types:\n  t:\n    kind: numeric\n    length: 8\n    filters: none\n")
    assert load_settings(path).pooled("t").filter_profile == "none"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"max_batch": 8_001}, "max_batch"),
        ({"idempotency_ttl_s": 30 * 86_400}, "idempotency_ttl_s"),
        ({"max_body_bytes": 10**9}, "max_body_bytes"),
    ],
)
def test_dispenser_bounds_are_refused_naming_the_field(
    tmp_path: Path, override: dict[str, int], field: str
) -> None:
    with pytest.raises(ConfigError, match=rf"dispenser.*{field}|{field}.*"):
        load_settings(write(tmp_path, "{}\n"), dispenser=override)


def test_max_batch_names_the_pop_script_limit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "{}\n"), dispenser={"max_batch": 8_001})
    assert "dispenser: max_batch 8001 is above 5000" in str(caught.value)


@pytest.mark.parametrize(
    ("aliases", "taken"),
    [
        ({"a": ["b"], "b": []}, "'b' already names id type 'b'"),
        ({"a": ["FAR-"], "b": ["FAR-"]}, "'FAR-' already names id type 'a'"),
        ({"a": ["x", "x"], "b": []}, "'x' already names id type 'a'"),
    ],
)
def test_an_alias_names_one_type_only(
    tmp_path: Path, aliases: dict[str, list[str]], taken: str
) -> None:
    types = "".join(
        f"  {name}:\n    kind: numeric\n    length: 5\n    aliases: {json.dumps(names)}\n"
        for name, names in aliases.items()
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "id_types:\n" + types))
    assert taken in str(caught.value)


def test_sequential_types_default_to_no_filters(tmp_path: Path) -> None:
    settings = load_settings(
        write(
            tmp_path, "id_types:\n  t:\n    kind: numeric\n    length: 5\n    order: sequential\n"
        )
    )
    assert settings.pooled("t").filter_profile == "none"
    assert settings.pooled("t").check_digit == "verhoeff"
    assert settings.redis_namespace == "kd"


def test_a_type_may_not_take_the_name_of_the_fences_registry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"id_types\.registry: reserved name"):
        load_settings(write(tmp_path, "id_types:\n  registry:\n    kind: numeric\n    length: 8\n"))


def test_a_ledger_log_too_short_names_the_ledger_types(tmp_path: Path) -> None:
    text = (
        "keysync:\n  ledger_retain_s: 0\n"
        "id_types:\n  uin:\n    kind: numeric\n    length: 10\n    ledger: true\n"
    )
    with pytest.raises(ConfigError, match="id_types uin keep a ledger"):
        load_settings(write(tmp_path, text))
    plain = "keysync:\n  ledger_retain_s: 0\nid_types:\n  t:\n    kind: base62\n    length: 7\n"
    assert load_settings(write(tmp_path, plain)).keysync.ledger_retain_s == 0  # no ledger


LEDGER_TYPE = "id_types:\n  uin:\n    kind: numeric\n    length: 10\n    ledger: true\n"


def test_a_ledger_log_shorter_than_the_fence_s_detection_time_is_refused(
    tmp_path: Path,
) -> None:
    """The floor is the fence's detection time, postgres_connect_timeout_s +
    keysync.ledger_watch_s + the ledger read block (5 + 1 + 0.5 s by default): the
    refusal names both settings, the formula and the figure."""
    short = "keysync:\n  ledger_retain_s: 6\n" + LEDGER_TYPE
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, short))
    refused = str(caught.value)
    assert "keysync.ledger_retain_s: 6 s" in refused and "6.5 s" in refused
    assert "postgres_connect_timeout_s" in refused and "keysync.ledger_watch_s" in refused
    enough = "keysync:\n  ledger_retain_s: 6.5\n" + LEDGER_TYPE
    assert load_settings(write(tmp_path, enough)).promotion_detected_s == 6.5
    faster = (
        "postgres_connect_timeout_s: 1\n"
        "keysync:\n  ledger_retain_s: 2\n  ledger_watch_s: 0.5\n" + LEDGER_TYPE
    )
    assert load_settings(write(tmp_path, faster)).keysync.ledger_retain_s == 2
