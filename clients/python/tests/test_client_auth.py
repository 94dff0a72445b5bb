"""OIDC for the clients: a bearer token, or client credentials refreshed before expiry
and once more on a 401. The dispenser and the token endpoint are httpx mock transports."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

import httpx
import pytest

from keydispenser_client import AsyncKeyClient, BearerToken, Buffering, ClientCredentials, KeyClient

TOKEN_URL = "https://idp.test/realms/r/protocol/openid-connect/token"


class Server:
    """The token endpoint (tokens t1, t2, ...) and a dispenser accepting ``valid``."""

    def __init__(self) -> None:
        self.issued = 0
        self.valid: set[str] = set()
        self.seen: list[str] = []
        self.forms: list[dict[str, list[str]]] = []
        self.next_key = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if str(request.url) == TOKEN_URL:
            self.forms.append(parse_qs(request.content.decode()))
            self.issued += 1
            token = f"t{self.issued}"
            self.valid.add(token)
            return httpx.Response(200, json={"access_token": token, "expires_in": 300})
        header = request.headers.get("authorization", "")
        self.seen.append(header)
        if header.removeprefix("Bearer ") not in self.valid:
            return httpx.Response(401, json={"errors": [{"errorCode": "IDG-008", "message": "no"}]})
        count = int(request.url.params.get("count", "1"))
        keys = [f"k{self.next_key + i}" for i in range(count)]
        self.next_key += count
        return httpx.Response(200, content=json.dumps({"keys": keys}).encode())


def test_a_bearer_token_is_sent_as_is() -> None:
    server = Server()
    server.valid.add("given")
    with KeyClient(
        "http://kd.test",
        "farmer",
        auth=BearerToken("given"),
        buffering=Buffering(batch=5),
        transport=httpx.MockTransport(server),
    ) as keys:
        assert keys.take() == "k0"
    assert server.seen[0] == "Bearer given"


def test_client_credentials_are_exchanged_once_and_refreshed_before_expiry() -> None:
    server = Server()
    now = [0.0]
    auth = ClientCredentials(TOKEN_URL, "regproc", "s3cret", scope="openid", clock=lambda: now[0])
    with KeyClient(
        "http://kd.test",
        "farmer",
        auth=auth,
        buffering=Buffering(batch=2, low=1, high=2),
        transport=httpx.MockTransport(server),
    ) as keys:
        keys.take_many(4)
        assert server.issued == 1  # one token for every request so far
        assert server.forms[0] == {
            "grant_type": ["client_credentials"],
            "client_id": ["regproc"],
            "client_secret": ["s3cret"],
            "scope": ["openid"],
        }
        now[0] = 300 - 29  # within the refresh margin of its 300 s life
        keys.take_many(4)
        assert server.issued == 2
    assert set(server.seen) <= {"Bearer t1", "Bearer t2"}


async def test_a_401_fetches_a_new_token_once_and_asks_again() -> None:
    server = Server()
    auth = ClientCredentials(TOKEN_URL, "regproc", "s3cret")
    async with AsyncKeyClient(
        "http://kd.test",
        "farmer",
        auth=auth,
        buffering=Buffering(batch=3),
        transport=httpx.MockTransport(server),
    ) as keys:
        assert await keys.take() == "k0"
        server.valid.clear()  # the dispenser no longer accepts t1 (rotated, revoked)
        await keys.take_many(9)  # past what was fetched before
    assert server.issued == 2 and "Bearer t2" in server.seen


def test_a_token_endpoint_that_refuses_stops_the_client_with_its_answer() -> None:
    def refusing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": "unauthorized_client"})

    with (
        KeyClient(
            "http://kd.test",
            "farmer",
            auth=ClientCredentials(TOKEN_URL, "regproc", "wrong"),
            transport=httpx.MockTransport(refusing),
        ) as keys,
        pytest.raises(Exception, match="token endpoint answered 401"),
    ):
        keys.take(timeout_s=5)


def test_a_token_endpoint_that_is_down_is_asked_again() -> None:
    server = Server()
    calls = {"token": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        if str(request.url) == TOKEN_URL:
            calls["token"] += 1
            if calls["token"] < 3:
                return httpx.Response(503)
            assert request.extensions["timeout"]["read"] == 10.0  # bounded on its own
        return server(request)

    with KeyClient(
        "http://kd.test",
        "farmer",
        auth=ClientCredentials(TOKEN_URL, "regproc", "s3cret"),
        transport=httpx.MockTransport(flaky),
        sleep=lambda seconds: None,
    ) as keys:
        assert keys.take(timeout_s=5) == "k0"
    assert calls["token"] == 3
