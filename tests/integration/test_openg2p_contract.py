"""OpenG2P's ID Generator shapes, pinned over real HTTP: what its clients (and its own
API test suite, which discovers ID types from /config) read, field for field."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from keydispenser_ops.embedded import EmbeddedRedis
from shared.domain.config import Settings
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

FILTER_RULES = {
    "sequence_limit": int,
    "repeating_limit": int,
    "repeating_block_limit": int,
    "conjugative_even_digits_limit": int,
    "digits_group_limit": int,
    "reverse_digits_group_limit": int,
    "not_start_with": list,
    "restricted_numbers": list,
}


def assert_openg2p_error(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status
    body = reply.json()
    assert body["id"] == "openg2p.idgenerator" and body["response"] is None
    assert [e["errorCode"] for e in body["errors"]] == [code]


def assert_filter_rules(rules: dict[str, object]) -> None:
    assert set(FILTER_RULES) <= set(rules)
    for name, kind in FILTER_RULES.items():
        assert isinstance(rules[name], kind), name


async def test_config_carries_id_types_with_id_length_and_filter_rules(
    settings: Settings,
) -> None:
    async with dispenser_over_http(settings) as client:
        reply = await client.get("/v1/idgenerator/config")
    assert reply.status_code == 200
    response = reply.json()["response"]
    assert set(response["id_types"]) == set(settings.id_types)
    for name, entry in response["id_types"].items():
        assert entry["id_length"] == settings.pooled(name).length
        assert_filter_rules(entry["filter_rules"])  # ours, per type, beside OpenG2P's
    assert_filter_rules(response["filter_rules"])
    described = response["filter_rules_id_type"]
    assert settings.id_types[described].kind == "numeric"
    assert response["filter_rules"] == response["id_types"][described]["filter_rules"]
    assert response["filter_rules"]["not_start_with"] == ["0", "1"]


async def test_version_carries_build_metadata(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEYDISPENSER_BUILD_TIME", "2026-11-26T10:00:00Z")
    monkeypatch.setenv("KEYDISPENSER_GIT_COMMIT", "4fa98eb")
    async with dispenser_over_http(settings) as client:
        reply = await client.get("/v1/idgenerator/version")
    assert reply.status_code == 200
    response = reply.json()["response"]
    assert response["build_time"] == "2026-11-26T10:00:00Z"
    assert response["git_commit"] == "4fa98eb"
    assert response["service_version"] == response["version"] != ""


async def test_health_is_idg005_until_started_then_up_then_idg006(
    servers: Servers, database: str, tmp_path: Path
) -> None:
    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    url = redis.url
    redis.stop()  # not there while the dispenser starts
    settings = make_settings(servers, database, redis_url=url)
    async with dispenser_over_http(settings) as client:
        assert_openg2p_error(await client.get("/v1/idgenerator/health"), 503, "IDG-005")
        redis.start()  # same data directory, same port
        try:
            up = await client.get("/v1/idgenerator/health")
            assert up.status_code == 200 and up.json()["response"] == {"status": "UP"}
        finally:
            redis.stop()
        failed = await client.get("/v1/idgenerator/health")
        assert_openg2p_error(failed, 503, "IDG-006")
        assert failed.headers["Retry-After"] == "1"
