"""How the clients authenticate to a dispenser that takes OIDC tokens: a bearer token
the caller already has, or the OAuth2 client-credentials grant (Keycloak's service
accounts), refreshed before it expires. Both are ``httpx.Auth`` flows, so the sync and
the async client share them; an API key needs neither (``api_key=``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import httpx

from keydispenser_client.protocol import ClientError

# A token is refreshed this long before it expires (or at half its life, if shorter).
REFRESH_MARGIN_S = 30.0
TOKEN_TIMEOUT_S = 10.0  # the token request's own bound (the client's covers its requests)


class TokenUnavailable(httpx.TransportError):
    """The token endpoint answered 429 or 5xx: asked again, as any request that got no
    answer (the clients back off and retry transport errors)."""


class BearerToken(httpx.Auth):
    """A token obtained elsewhere, sent as ``Authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


class ClientCredentials(httpx.Auth):
    """OAuth2 client credentials: a token from ``token_url`` for ``client_id`` and
    ``client_secret`` (Keycloak: ``<realm URL>/protocol/openid-connect/token``), kept
    and asked for again shortly before it expires, and once more when the dispenser
    answers 401 (a token revoked or a key rotated). Safe to share between threads."""

    requires_response_body = True

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        *,
        scope: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token_url = token_url
        self._form = {
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": client_secret,
        } | ({"scope": scope} if scope else {})
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = threading.Lock()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self._stale():
            yield from self._fetch()
        request.headers["Authorization"] = f"Bearer {self._token}"
        response = yield request
        if response.status_code == 401:  # revoked, or the dispenser rotated trust: once more
            yield from self._fetch()
            request.headers["Authorization"] = f"Bearer {self._token}"
            yield request

    def _stale(self) -> bool:
        with self._lock:
            return self._token is None or self._clock() >= self._refresh_at

    def _fetch(self) -> Generator[httpx.Request, httpx.Response, None]:
        asked = self._clock()
        request = httpx.Request(
            "POST",
            self._token_url,
            data=self._form,
            extensions={"timeout": httpx.Timeout(TOKEN_TIMEOUT_S).as_dict()},
        )
        answer = yield request
        self._keep(answer, asked)

    def _keep(self, answer: httpx.Response, asked: float) -> None:
        if answer.status_code == 429 or answer.status_code >= 500:
            raise TokenUnavailable(f"token endpoint answered {answer.status_code}")
        if answer.status_code != 200:
            raise ClientError(f"token endpoint answered {answer.status_code}: {answer.text[:200]}")
        try:
            body: dict[str, Any] = answer.json()
            token, lifetime = str(body["access_token"]), float(body.get("expires_in", 60))
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"token endpoint answered no access_token: {exc}") from exc
        with self._lock:
            self._token = token
            self._refresh_at = asked + max(lifetime - REFRESH_MARGIN_S, lifetime / 2)
