"""API keys: hashed lookup, allowed types, token-bucket limits."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from dispenser.auth import (
    Forbidden,
    Gate,
    RateLimited,
    TokenBucket,
    Unauthenticated,
)
from shared.domain.apikeys import ANONYMOUS, digest, new_api_key
from shared.domain.config import AuthConfig


def gate(**client: object) -> tuple[Gate, str]:
    key, hashed = new_api_key()
    config = AuthConfig.model_validate({"api_keys": [{"name": "reg", "sha256": hashed, **client}]})
    return Gate(config), key


def test_without_api_keys_everyone_is_anonymous() -> None:
    assert Gate(AuthConfig()).admit(Headers({}), "farmer") == ANONYMOUS


def test_a_configured_key_is_recognised_by_its_digest_in_either_header() -> None:
    g, key = gate()
    assert g.admit(Headers({"authorization": f"Bearer {key}"}), "farmer") == "reg"
    assert g.admit(Headers({"x-api-key": key}), "farmer") == "reg"
    assert digest(key) != key and len(digest(key)) == 64


@pytest.mark.parametrize(
    "headers", [{}, {"authorization": "Bearer wrong"}, {"x-api-key": ""}, {"authorization": "x"}]
)
def test_missing_or_unknown_keys_are_refused(headers: dict[str, str]) -> None:
    g, _ = gate()
    with pytest.raises(Unauthenticated):
        g.admit(Headers(headers), "farmer")


def test_a_key_may_use_only_its_types() -> None:
    g, key = gate(id_types=["farmer"])
    headers = Headers({"x-api-key": key})
    assert g.admit(headers, "farmer") == "reg"
    with pytest.raises(Forbidden):
        g.admit(headers, "shortlink")
    assert g.admit(headers) == "reg"  # routes of no type need only a valid key


def test_a_key_may_name_its_types_by_alias() -> None:
    key, hashed = new_api_key()
    config = AuthConfig.model_validate(
        {"api_keys": [{"name": "reg", "sha256": hashed, "id_types": ["beneficiary"]}]}
    )
    segments = {"farmer": "farmer", "beneficiary": "farmer", "shortlink": "shortlink"}
    g = Gate(config, segments)
    headers = Headers({"x-api-key": key})
    assert g.admit(headers, "farmer") == "reg"  # requests are checked by the type's name
    with pytest.raises(Forbidden):
        g.admit(headers, "shortlink")


def test_the_settings_accept_an_alias_in_a_keys_types() -> None:
    from shared.domain.config import load_settings
    from tests.conftest import EMPTY_CONFIG

    _, hashed = new_api_key()
    settings = load_settings(
        EMPTY_CONFIG,
        id_types={"farmer": {"kind": "numeric", "length": 10, "aliases": ["beneficiary"]}},
        dispenser={
            "auth": {"api_keys": [{"name": "reg", "sha256": hashed, "id_types": ["beneficiary"]}]}
        },
    )
    assert settings.dispenser.auth.api_keys[0].id_types == ("beneficiary",)


def test_the_rate_limit_allows_the_burst_then_refuses_with_a_retry_after() -> None:
    g, key = gate(rate_per_s=0.5, burst=3)
    headers = Headers({"x-api-key": key})
    for _ in range(3):
        g.admit(headers, "farmer")
    with pytest.raises(RateLimited) as refused:
        g.admit(headers, "farmer")
    assert refused.value.retry_after_s == 2


def test_a_token_bucket_refills_at_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("dispenser.auth.time.monotonic", lambda: now[0])
    bucket = TokenBucket(rate_per_s=10, burst=2)
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(0.1)
    now[0] += 0.1
    assert bucket.take() == 0
    now[0] += 10
    assert bucket.take() == 0 and bucket.take() == 0 and bucket.take() > 0


def test_config_refuses_duplicate_names_and_unknown_types() -> None:
    from shared.domain.config import load_settings
    from shared.domain.errors import ConfigError
    from tests.conftest import EMPTY_CONFIG

    _, hashed = new_api_key()
    with pytest.raises(ConfigError, match=r"dispenser\.auth\.api_keys\.reg\.id_types"):
        load_settings(
            EMPTY_CONFIG,
            dispenser={
                "auth": {"api_keys": [{"name": "reg", "sha256": hashed, "id_types": ["x"]}]}
            },
        )
    with pytest.raises(ConfigError, match="names must be unique"):
        load_settings(
            EMPTY_CONFIG,
            dispenser={
                "auth": {
                    "api_keys": [
                        {"name": "a", "sha256": hashed},
                        {"name": "a", "sha256": "0" * 64},
                    ]
                }
            },
        )
    with pytest.raises(ConfigError, match="sha256"):
        load_settings(
            EMPTY_CONFIG, dispenser={"auth": {"api_keys": [{"name": "a", "sha256": "k"}]}}
        )
