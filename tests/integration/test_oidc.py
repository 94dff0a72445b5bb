"""OIDC tokens against a real dispenser: a JWKS served on loopback with keys made here
(RSA and EC), tokens minted here; every refusal, key rotation, the cookie form, an
identity provider outage, and API keys beside tokens."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import httpx
import jwt
import pytest
import redis.asyncio as aioredis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from keydispenser_client import AsyncKeyClient, Buffering, ClientCredentials
from shared.domain import redis_keys
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.hot.hot_store import HotStore
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

ISSUER = "https://keycloak.test/realms/mosip"
AUDIENCE = "keydispenser"


@dataclass
class IdentityProvider:
    """A JWKS endpoint on loopback whose keys the test changes (rotation, outage)."""

    keys: dict[str, Any] = field(default_factory=dict)  # kid -> private key
    algorithms: dict[str, str] = field(default_factory=dict)  # kid -> alg
    up: bool = True
    fetches: int = 0
    no_alg: set[str] = field(default_factory=set)  # kids published without an "alg"
    server: ThreadingHTTPServer | None = None

    def add(self, kid: str, algorithm: str) -> None:
        if algorithm.startswith("ES"):
            self.keys[kid] = ec.generate_private_key(ec.SECP256R1())
        else:
            self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.algorithms[kid] = algorithm

    def jwks(self) -> bytes:
        published = []
        for kid, key in self.keys.items():
            maker = ECAlgorithm if self.algorithms[kid].startswith("ES") else RSAAlgorithm
            jwk = json.loads(maker.to_jwk(key.public_key()))
            jwk |= {"kid": kid, "use": "sig"}
            if kid not in self.no_alg:
                jwk["alg"] = self.algorithms[kid]
            published.append(jwk)
        return json.dumps({"keys": published}).encode()

    def token(self, kid: str = "rsa-1", **claims: Any) -> str:
        now = int(time.time())
        body = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "azp": "mosip-regproc",
            "exp": now + 300,
            "iat": now,
            "realm_access": {"roles": ["REGISTRATION_PROCESSOR"]},
        } | claims
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.keys[kid], self.algorithms[kid], headers={"kid": kid})

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/certs"


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()
    provider.add("rsa-1", "RS256")
    provider.add("ec-1", "ES256")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            provider.fetches += 1
            if not provider.up:
                self.send_error(503)
                return
            body = provider.jwks()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            """The token endpoint: client credentials -> a token for that client."""
            length = int(self.headers.get("Content-Length", "0"))
            form = parse_qs(self.rfile.read(length).decode())
            if form.get("client_secret") != ["s3cret"]:
                self.send_error(401)
                return
            token = provider.token(azp=form["client_id"][0])
            body = json.dumps({"access_token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    provider.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=provider.server.serve_forever, daemon=True)
    thread.start()
    yield provider
    provider.server.shutdown()
    provider.server.server_close()


API_KEY, API_DIGEST = new_api_key()


def oidc_settings(servers: Servers, database: str, idp: IdentityProvider) -> Settings:
    auth = {
        "api_keys": [{"name": "batch-job", "sha256": API_DIGEST, "id_types": ["shortlink"]}],
        "oidc": {
            "providers": [{"issuer": ISSUER, "jwks_url": idp.url}],
            "audiences": [AUDIENCE],
            "algorithms": ["RS256", "ES256"],
            "roles": {
                "REGISTRATION_PROCESSOR": {"id_types": ["farmer"]},
                "ID_REPOSITORY": {"id_types": ["*"], "ledger_admin": True},
            },
            "jwks_min_refetch_s": 0.2,
            "leeway_s": 0,
        },
    }
    types = small_types()
    types["farmer"]["ledger"] = True  # MOSIP's UIN type keeps a ledger
    return make_settings(
        servers, database, id_types=types, dispenser={"auth": auth, "mosip": {"uin": "farmer"}}
    )


@pytest.fixture
async def http(
    servers: Servers, database: str, hot: HotStore, idp: IdentityProvider
) -> AsyncIterator[httpx.AsyncClient]:
    settings = oidc_settings(servers, database, idp)
    farmers = build_id_types(settings)["farmer"].generate(0, 2_000)[0][:50]
    await hot.push("farmer", farmers, uuid.uuid4().hex)
    await hot.push("shortlink", [f"S{i:06d}" for i in range(50)], uuid.uuid4().hex)
    async with dispenser_over_http(settings) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def allocate(
    http: httpx.AsyncClient, headers: dict[str, str], kind: str = "farmer"
) -> httpx.Response:
    return await http.post(f"/v1/idgenerator/{kind}/id", headers=headers)


def code(reply: httpx.Response) -> str:
    return str(reply.json()["errors"][0]["errorCode"])


async def test_rsa_and_ec_tokens_are_accepted_and_name_the_client(
    http: httpx.AsyncClient, idp: IdentityProvider, redis_client: aioredis.Redis
) -> None:
    for kid in ("rsa-1", "ec-1"):
        reply = await allocate(http, bearer(idp.token(kid)))
        assert reply.status_code == 200, reply.text
    # The token's client (azp) is the client the rate limits and the ledger see.
    reply = await http.post(
        "/v1/keys/farmer",
        params={"count": 2},
        headers=bearer(idp.token()) | {"Idempotency-Key": "t-1"},
    )
    assert reply.status_code == 200
    # The idempotency record is the token client's (keyed by its name).
    assert await redis_client.exists(redis_keys.idempotency_key(NS, "mosip-regproc", "t-1"))
    assert not await redis_client.exists(redis_keys.idempotency_key(NS, "-", "t-1"))


async def test_the_token_may_come_in_mosips_cookie(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    reply = await allocate(http, {"Cookie": f"Authorization={idp.token()}"})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("expired", "token expired"),
        ("not_yet", "token not valid yet"),
        ("audience", "audience"),
        ("issuer", "issuer"),
        ("unknown_kid", "signing key is not known"),
        ("malformed", "malformed"),
        ("none", "not allowed"),
        ("hs256_with_public_key", "not allowed"),
        ("no_client", "does not name a client"),
    ],
)
async def test_every_bad_token_is_a_401_in_the_envelope_and_logged_without_it(
    http: httpx.AsyncClient,
    idp: IdentityProvider,
    caplog: pytest.LogCaptureFixture,
    case: str,
    why: str,
) -> None:
    now = int(time.time())
    public_pem = (
        idp.keys["rsa-1"]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    tokens = {
        "expired": idp.token(exp=now - 10),
        "not_yet": idp.token(nbf=now + 600),
        "audience": idp.token(aud="someone-else"),
        "issuer": idp.token(iss="https://evil.test/realms/mosip"),
        "unknown_kid": jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "azp": "x", "exp": now + 60},
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "RS256",
            headers={"kid": "rsa-unknown"},
        ),
        "malformed": "eyJhbGciOi.not-a.token",
        "none": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": now + 60}, "", "none"),
        "hs256_with_public_key": _hs256(public_pem, now),
        "no_client": idp.token(azp=None),
    }
    token = tokens[case]
    with caplog.at_level(logging.INFO):
        reply = await allocate(http, bearer(token))
    assert reply.status_code == 401, reply.text
    assert code(reply) == "IDG-008" and why in reply.json()["errors"][0]["message"]
    assert reply.headers["www-authenticate"].startswith("Bearer")
    refused = [r for r in caplog.records if r.getMessage() == "token_refused"]
    assert len(refused) == 1
    assert all(token not in r.getMessage() and token not in str(r.__dict__) for r in caplog.records)


def _hs256(secret: bytes, now: int) -> str:
    """A token "signed" with the RSA public key as an HMAC secret (the classic confusion)."""
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"}).encode())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "azp": "x", "exp": now + 60}
    payload = b64(json.dumps(claims).encode())
    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


async def test_roles_scope_the_types_and_a_token_without_a_role_is_forbidden(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    registration = bearer(idp.token())
    assert (await allocate(http, registration, "shortlink")).status_code == 403
    admin = bearer(idp.token(realm_access={"roles": ["ID_REPOSITORY"]}, azp="mosip-idrepo"))
    assert (await allocate(http, admin, "shortlink")).status_code == 200
    nobody = await allocate(http, bearer(idp.token(realm_access={"roles": ["offline_access"]})))
    assert nobody.status_code == 403 and code(nobody) == "IDG-009"


async def test_a_rotated_key_is_picked_up_without_a_restart(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    idp.add("rsa-2", "RS256")  # the provider publishes a new key and signs with it
    token = idp.token("rsa-2")
    first = await allocate(http, bearer(token))
    assert first.status_code == 401  # refused at once; the keys are fetched off the path
    deadline = time.monotonic() + 10
    while (reply := await allocate(http, bearer(token))).status_code != 200:
        assert reply.status_code == 401 and time.monotonic() < deadline, reply.text
        await asyncio.sleep(0.1)


async def test_an_identity_provider_outage_keeps_known_keys_working(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    idp.up = False
    fetches = idp.fetches
    unknown = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "azp": "x", "exp": int(time.time()) + 60},
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "RS256",
        headers={"kid": "rsa-9"},
    )
    assert (await allocate(http, bearer(unknown))).status_code == 401  # asks for a refresh
    deadline = time.monotonic() + 10
    while idp.fetches == fetches:  # the refresh happened, and failed
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert (await allocate(http, bearer(idp.token()))).status_code == 200
    assert (await allocate(http, bearer(idp.token("ec-1")))).status_code == 200


async def test_api_keys_still_work_beside_tokens(http: httpx.AsyncClient) -> None:
    assert (await allocate(http, {"X-API-Key": API_KEY}, "shortlink")).status_code == 200
    assert (await allocate(http, bearer(API_KEY), "shortlink")).status_code == 200
    assert (await allocate(http, bearer(API_KEY), "farmer")).status_code == 403
    assert (await allocate(http, {})).status_code == 401


async def test_mosips_paths_take_the_token_from_mosips_cookie(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    """As MOSIP's clients call them: GET /v1/idgenerator/uin with Cookie: Authorization."""
    reply = await http.get(
        "/v1/idgenerator/uin", headers={"Cookie": f"Authorization={idp.token()}"}
    )
    assert reply.status_code == 200 and reply.json()["errors"] is None, reply.text
    assert reply.json()["response"]["uin"].isdigit()
    refused = await http.get("/v1/idgenerator/uin", headers={"Cookie": "Authorization=x.y.z"})
    assert refused.status_code == 401
    body = refused.json()
    assert body["response"] is None and body["errors"][0]["errorCode"] == "KER-ATH-401"
    assert (await http.get("/v1/idgenerator/uin")).json()["errors"][0]["errorCode"] == "KER-ATH-401"


async def test_the_python_client_gets_its_token_by_client_credentials(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    """Keycloak's service-account flow: the client asks the token endpoint, then the
    dispenser, with the token it got."""
    token_url = idp.url.replace("/certs", "/token")
    auth = ClientCredentials(token_url, "mosip-regproc", "s3cret")
    async with AsyncKeyClient(
        str(http.base_url), "farmer", auth=auth, buffering=Buffering(batch=5)
    ) as keys:
        taken = await keys.take_many(7)
    assert len(set(taken)) == 7


async def test_a_token_signed_for_another_key_type_is_a_401_not_a_crash(
    servers: Servers, database: str, hot: HotStore, idp: IdentityProvider
) -> None:
    """A JWKS that names no "alg" for an RSA key, and a token claiming ES256 with that
    key's kid: refused (PyJWT itself would raise a TypeError on the RSA key)."""
    idp.no_alg.add("rsa-1")
    forged = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "azp": "x", "exp": int(time.time()) + 60},
        idp.keys["ec-1"],
        "ES256",
        headers={"kid": "rsa-1"},
    )
    async with dispenser_over_http(oidc_settings(servers, database, idp)) as http:
        reply = await allocate(http, bearer(forged))
        assert reply.status_code == 401 and "does not match its key" in reply.text
        # The RSA key itself still verifies RS256 tokens (its family, without an alg).
        await hot.push(
            "farmer",
            build_id_types(oidc_settings(servers, database, idp))["farmer"].generate(0, 100)[0][:3],
            uuid.uuid4().hex,
        )
        assert (await allocate(http, bearer(idp.token("rsa-1")))).status_code == 200


async def test_ledger_permission_is_this_tokens_not_the_last_one_of_its_client(
    http: httpx.AsyncClient, idp: IdentityProvider, redis_client: aioredis.Redis
) -> None:
    """Users of one frontend share its azp: an admin's request must not lend its rights
    to the next request of another user of that client."""
    admin = bearer(idp.token(azp="portal", realm_access={"roles": ["ID_REPOSITORY"]}))
    user = bearer(idp.token(azp="portal"))
    key = (await allocate(http, admin)).json()["response"]["id"]
    assert (
        await http.post(f"/v1/idgenerator/farmer/id/{key}/used", headers=admin)
    ).status_code == 202
    assert (
        await http.post(f"/v1/idgenerator/farmer/id/{key}/used", headers=user)
    ).status_code == 202
    stream = redis_keys.ledger_stream_key(NS)
    entries: Any = await redis_client.xrange(stream)
    marks = [fields for _, fields in entries if fields.get("op") == "used"]
    assert [m.get("admin") for m in marks] == ["1", None]


async def test_a_token_client_named_like_an_api_key_client_is_refused(
    http: httpx.AsyncClient, idp: IdentityProvider
) -> None:
    reply = await allocate(http, bearer(idp.token(azp="batch-job")))
    assert reply.status_code == 401 and "name of an API key client" in reply.text


PARTNER = "https://keycloak.test/realms/partner"


async def test_two_realms_clients_of_one_name_are_two_clients(
    servers: Servers, database: str, hot: HotStore, idp: IdentityProvider
) -> None:
    """Each issuer's client_prefix scopes its clients: the same azp and Idempotency-Key
    from another realm is another client's request, never a replay of the first's keys."""
    settings = oidc_settings(servers, database, idp)
    auth = settings.dispenser.auth.model_dump(mode="json")
    auth["api_keys"][0]["sha256"] = API_DIGEST
    auth["oidc"]["providers"] = [
        {"issuer": ISSUER, "jwks_url": idp.url, "client_prefix": "mosip."},
        {"issuer": PARTNER, "jwks_url": idp.url, "client_prefix": "partner."},
    ]
    types = small_types()
    types["farmer"]["ledger"] = True
    settings = make_settings(
        servers, database, id_types=types, dispenser={"auth": auth, "mosip": {"uin": "farmer"}}
    )
    farmers = build_id_types(settings)["farmer"].generate(0, 2_000)[0][:50]
    await hot.push("farmer", farmers, uuid.uuid4().hex)
    async with dispenser_over_http(settings) as http:
        answers = {}
        for issuer in (ISSUER, PARTNER):
            reply = await http.post(
                "/v1/keys/farmer",
                params={"count": 2},
                headers=bearer(idp.token(iss=issuer)) | {"Idempotency-Key": "same-key"},
            )
            assert reply.status_code == 200, reply.text
            assert reply.headers.get("Idempotent-Replayed") is None, reply.headers
            answers[issuer] = reply.json()["keys"]
        assert not set(answers[ISSUER]) & set(answers[PARTNER])
        # Each realm's own retry is its replay.
        again = await http.post(
            "/v1/keys/farmer",
            params={"count": 2},
            headers=bearer(idp.token(iss=PARTNER)) | {"Idempotency-Key": "same-key"},
        )
        assert again.json()["keys"] == answers[PARTNER]
