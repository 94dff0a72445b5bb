"""The token verifier's own rules: what it remembers and for how long, where roles and
tokens are found, what the configuration refuses."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pydantic import ValidationError

from dispenser import oidc
from dispenser.oidc import TokenForbidden, TokenRefused, Verifier, presented_token, roles_of
from shared.domain.config import OidcConfig

ISSUER = "https://idp.test/realms/r"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
JWKS = json.dumps(
    {"keys": [json.loads(RSAAlgorithm.to_jwk(KEY.public_key())) | {"kid": "k1", "alg": "RS256"}]}
).encode()


def config(**overrides: Any) -> OidcConfig:
    values: dict[str, Any] = {
        "providers": [{"issuer": ISSUER, "jwks_url": "https://idp.test/certs"}],
        "audiences": ["kd"],
        "roles": {"minter": {"id_types": ["farmer"]}, "auditor": {"ledger_admin": True}},
        "leeway_s": 0,
    }
    return OidcConfig.model_validate(values | overrides)


def token(**claims: Any) -> str:
    body = {"iss": ISSUER, "aud": "kd", "azp": "app", "exp": int(time.time()) + 60}
    body |= {"realm_access": {"roles": ["minter"]}} | claims
    return jwt.encode(body, KEY, "RS256", headers={"kid": "k1"})


async def verifier(**overrides: Any) -> Verifier:
    found = Verifier(config(**overrides), fetch=lambda url: JWKS)
    await found.keys.refresh(ISSUER)
    return found


async def test_a_verified_token_is_remembered_until_its_exp_and_never_after() -> None:
    checks = 0
    real = oidc.Verifier._verified

    def counting(self: Verifier, raw: str, now: float) -> Any:
        nonlocal checks
        checks += 1
        return real(self, raw, now)

    found = await verifier()
    found._verified = counting.__get__(found)  # type: ignore[method-assign]
    short = token(exp=int(time.time()) + 2)
    for _ in range(3):
        assert found.verify(short).client == "app"
    assert checks == 1  # one signature check, then remembered
    await asyncio.sleep(2.2)
    with pytest.raises(TokenRefused, match="expired"):
        found.verify(short)  # past its exp: checked again, and refused
    assert checks == 2


async def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oidc, "MAX_REMEMBERED_TOKENS", 3)
    found = await verifier()
    tokens = [token(jti=str(i)) for i in range(5)]
    for raw in tokens:
        found.verify(raw)
    assert len(found._remembered) == 3
    assert tokens[0] not in found._remembered and tokens[-1] in found._remembered


async def test_roles_grant_types_and_ledger_permission() -> None:
    found = await verifier()
    minter = found.verify(token())
    assert minter.may_use("farmer") and not minter.may_use("shortlink") and not minter.ledger_admin
    both = found.verify(token(realm_access={"roles": ["minter", "auditor"]}))
    assert both.may_use("shortlink") and both.ledger_admin  # auditor: every type
    with pytest.raises(TokenForbidden):
        found.verify(token(realm_access={"roles": ["other"]}))


async def test_scope_and_client_roles_and_the_client_claim() -> None:
    by_scope = await verifier(roles_claim="scope", client_claim="client_id")
    principal = by_scope.verify(token(scope="openid minter", client_id="svc-1"))
    assert principal.client == "svc-1" and principal.may_use("farmer")
    by_client = await verifier(roles_claim="resource_access.kd.roles", client_claim="sub")
    raw = token(resource_access={"kd": {"roles": ["minter"]}}, sub="7b1e")
    assert by_client.verify(raw).client == "7b1e"
    with pytest.raises(TokenRefused, match="does not name a client"):
        by_client.verify(token(sub="has space"))


def test_roles_are_found_along_a_dotted_path() -> None:
    claims = {"realm_access": {"roles": ["a", "b", 3]}, "scope": "x y", "flat": "z"}
    assert roles_of(claims, "realm_access.roles") == {"a", "b"}
    assert roles_of(claims, "scope") == {"x", "y"}
    assert roles_of(claims, "missing.roles") == set()


def test_the_token_comes_from_the_bearer_or_the_cookie() -> None:
    assert presented_token("a.b.c", None) == "a.b.c"
    assert presented_token("kd_apikey", None) is None  # an API key, not a token
    assert presented_token("", "lang=en; Authorization=a.b.c") == "a.b.c"
    assert presented_token("", 'Authorization="Bearer a.b.c"') == "a.b.c"
    assert presented_token("", "Other=1") is None
    assert presented_token("", "Authorization=kd_apikey") is None  # an API key's turn


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"algorithms": ["HS256"]}, "algorithms"),
        ({"algorithms": ["none"]}, "algorithms"),
        ({"providers": [{"issuer": ISSUER, "jwks_url": "http://idp.test/certs"}]}, "jwks_url"),
        ({"audiences": []}, "audiences"),
        ({"roles": {}}, "roles"),
    ],
)
def test_the_configuration_refuses_what_would_weaken_verification(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        config(**overrides)
    # Loopback JWKS over http is allowed (a sidecar, tests).
    config(providers=[{"issuer": ISSUER, "jwks_url": "http://127.0.0.1:9/certs"}])


OTHER = "https://idp.test/realms/partner"


async def test_each_issuers_clients_are_named_after_its_prefix() -> None:
    """Two realms with a client of one name are two clients (rate limits, idempotency
    records, the ledger): each issuer's prefix comes first."""
    providers = [
        {"issuer": ISSUER, "jwks_url": "https://idp.test/certs", "client_prefix": "home."},
        {"issuer": OTHER, "jwks_url": "https://idp.test/p/certs", "client_prefix": "partner."},
    ]
    found = Verifier(config(providers=providers), fetch=lambda url: JWKS)
    await found.keys.refresh(ISSUER)
    await found.keys.refresh(OTHER)
    assert found.verify(token()).client == "home.app"
    assert found.verify(token(iss=OTHER)).client == "partner.app"
    with pytest.raises(TokenRefused, match="client_prefix"):
        found.verify(token(azp="a" * 60))  # 65 characters with its prefix


@pytest.mark.parametrize(
    "prefixes",
    [("", ""), ("a.", ""), ("a.", "a."), ("a", "b."), ("a.b.", "c.")],
)
def test_several_issuers_need_prefixes_of_their_own(prefixes: tuple[str, str]) -> None:
    providers = [
        {"issuer": issuer, "jwks_url": "https://idp.test/certs", "client_prefix": prefix}
        for issuer, prefix in zip((ISSUER, OTHER), prefixes, strict=True)
    ]
    with pytest.raises(ValidationError, match="client_prefix"):
        config(providers=providers)


def test_one_issuer_needs_no_prefix_and_may_have_one() -> None:
    one = {"issuer": ISSUER, "jwks_url": "https://idp.test/certs"}
    assert config(providers=[one]).providers[0].client_prefix == ""
    assert config(providers=[one | {"client_prefix": "kc."}]).providers[0].client_prefix == "kc."


def test_an_api_key_client_may_not_take_a_providers_prefix() -> None:
    from shared.domain.config.dispenser import AuthConfig

    provider = {"issuer": ISSUER, "jwks_url": "https://idp.test/certs", "client_prefix": "kc."}
    oidc_config = config(providers=[provider]).model_dump(mode="json")
    api_key = {"name": "kc.batch", "sha256": "0" * 64}
    with pytest.raises(ValidationError, match=r"kc\.batch begin with .*client_prefix"):
        AuthConfig.model_validate({"api_keys": [api_key], "oidc": oidc_config})
    AuthConfig.model_validate({"api_keys": [api_key | {"name": "batch"}], "oidc": oidc_config})


async def test_closing_stops_the_refresher_even_when_its_cancellation_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncio.wait_for before Python 3.12 may return instead of raising when it is
    cancelled as its wait ends: the refresher must stop on close all the same."""
    real, lost = asyncio.wait_for, list[bool]()

    async def loses_the_cancel(awaitable: Any, timeout: float | None) -> Any:  # noqa: ASYNC109
        try:
            return await real(awaitable, timeout)
        except asyncio.CancelledError:
            if lost:  # the race loses one; a later cancellation (teardown's) lands
                raise
            lost.append(True)
            return None

    found = await verifier()
    monkeypatch.setattr(asyncio, "wait_for", loses_the_cancel)  # as dispenser.oidc sees it
    await found.keys.start()
    await asyncio.sleep(0.05)  # the refresher waits (jwks_refresh_s: 300 s)
    async with asyncio.timeout(5):  # it waited on, for the next refresh, without the flag
        await found.keys.close()
    assert found.keys._task is not None and found.keys._task.done() and lost
