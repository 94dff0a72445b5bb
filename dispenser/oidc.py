"""OIDC bearer tokens (Keycloak and other identity providers), beside API keys.

A token arrives as ``Authorization: Bearer <jwt>`` or as the cookie ``Authorization``
(how MOSIP's clients send it). It is verified with PyJWT against the signing keys its
issuer publishes (JWKS): signature, ``exp``/``nbf`` (with a small leeway), ``iss`` and
``aud``, with asymmetric algorithms only. The client it names (``azp``, ``client_id``
or ``sub``), after its issuer's ``client_prefix``, is the client everywhere a client
matters (rate limits, idempotency records, the ledger), and its roles say which ID
types it may use.

Keys are fetched at start and refreshed off the request path: on a schedule, and on
an unknown ``kid`` at most once per ``jwks_min_refetch_s`` (the request itself is
refused at once). A failed fetch keeps the keys already known, so an identity
provider outage does not refuse tokens signed with them. A verified token is
remembered (bounded, never past its ``exp``): a client reusing its token costs a
dictionary lookup, not a signature check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt
from jwt import PyJWK

from shared.domain.config import OidcConfig
from shared.domain.config.dispenser import API_CLIENT_NAME
from shared.domain.errors import KeydispenserError

log = logging.getLogger(__name__)
# Verified tokens remembered; beyond this the oldest are forgotten first.
MAX_REMEMBERED_TOKENS: Final = 10_000
MAX_JWKS_BYTES: Final = 1_048_576
FETCH_TIMEOUT_S: Final = 5.0

Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class SigningKey:
    jwk: PyJWK
    algorithm: str | None  # the JWKS's "alg" for it, when it names one
    kty: str  # its key type: which algorithms it can verify at all

    def verifies(self, algorithm: str) -> bool:
        """Whether a token signed with ``algorithm`` may be checked with this key."""
        if self.algorithm is not None:
            return algorithm == self.algorithm
        return algorithm.startswith(KEY_FAMILIES.get(self.kty, ("-",)))


# Which algorithms each JWK key type verifies (when the JWKS names none for a key).
KEY_FAMILIES: Final = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}


class TokenRefused(KeydispenserError):
    """A bearer token that is not accepted (401): malformed, expired, not yet valid,
    of an unknown issuer, audience or key, or signed with an algorithm not allowed."""


class TokenForbidden(KeydispenserError):
    """A valid token that carries none of the configured roles (403)."""


@dataclass(frozen=True)
class Principal:
    """Who a verified token speaks for, and what it may do."""

    client: str
    id_types: frozenset[str]  # type names (aliases resolved); "*": every type
    ledger_admin: bool
    expires: float  # unix seconds: the token's exp

    def may_use(self, name: str) -> bool:
        return "*" in self.id_types or name in self.id_types


def fetch_url(url: str) -> bytes:
    """GET ``url`` (blocking: run it in a thread), at most MAX_JWKS_BYTES."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as answer:
        body: bytes = answer.read(MAX_JWKS_BYTES + 1)
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS at {url} is over {MAX_JWKS_BYTES} bytes")
    return body


class SigningKeys:
    """Each issuer's signing keys by ``kid``, as its JWKS last published them."""

    def __init__(self, config: OidcConfig, fetch: Fetch = fetch_url) -> None:
        self._config = config
        self._fetch = fetch
        self._urls = {p.issuer: p.jwks_url for p in config.providers}
        self._keys: dict[str, dict[str, SigningKey]] = {issuer: {} for issuer in self._urls}
        self._fetched_at: dict[str, float] = dict.fromkeys(self._urls, -math.inf)
        self._wanted: set[str] = set()  # issuers with an unknown kid seen
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def key(self, issuer: str, kid: str | None) -> SigningKey | None:
        """The key ``kid`` of ``issuer``, or None (and a refresh is asked for)."""
        found = self._keys.get(issuer, {}).get(kid or "")
        if found is None and issuer in self._keys:
            self._wanted.add(issuer)
            self._wake.set()
        return found

    async def start(self) -> None:
        """Fetch every issuer's keys once (a failure is logged; tokens of that issuer
        are refused until a later fetch succeeds), then keep them fresh."""
        await asyncio.gather(*(self.refresh(issuer) for issuer in self._urls))
        self._task = asyncio.get_running_loop().create_task(self._keep_fresh())

    async def close(self) -> None:
        """Stop refreshing. The loop's own flag stops it too: a cancellation can be lost
        (before Python 3.12, asyncio.wait_for returns its wait's result when the wait
        ends as the cancellation lands), and a shutdown must not wait on it."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])

    async def refresh(self, issuer: str) -> bool:
        """Fetch ``issuer``'s JWKS now; on failure keep the keys known. True on success."""
        url = self._urls[issuer]
        self._fetched_at[issuer] = time.monotonic()
        try:
            raw = await asyncio.to_thread(self._fetch, url)
            keys = _signing_keys(json.loads(raw))
        except Exception as exc:  # an outage, a bad document: keep what is known
            log.warning(
                "jwks_fetch_failed",
                extra={"issuer": issuer, "url": url, "error": f"{type(exc).__name__}: {exc}"},
            )
            return False
        added = sorted(set(keys) - set(self._keys[issuer]))
        self._keys[issuer] = keys
        if added:
            log.info("jwks_keys_added", extra={"issuer": issuer, "kids": added})
        return True

    async def _keep_fresh(self) -> None:
        config = self._config
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), config.jwks_refresh_s)
            if self._closing:  # closed while waiting (its cancellation may be lost)
                return
            self._wake.clear()
            now = time.monotonic()
            for issuer in self._urls:
                since = now - self._fetched_at[issuer]
                if since >= config.jwks_refresh_s or (
                    issuer in self._wanted and since >= config.jwks_min_refetch_s
                ):
                    self._wanted.discard(issuer)
                    await self.refresh(issuer)
            if self._wanted:  # asked for again too soon: look again when allowed
                await asyncio.sleep(config.jwks_min_refetch_s)
                self._wake.set()


def _signing_keys(document: Any) -> dict[str, SigningKey]:
    """The JWKS's keys usable to verify signatures, by kid (keys without one, for
    encryption only, or of a type PyJWT cannot use are left out)."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document (no 'keys' list)")
    found: dict[str, SigningKey] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        kid, declared = entry.get("kid"), entry.get("alg")
        if not isinstance(kid, str) or not kid:
            continue
        try:
            algorithm = declared if isinstance(declared, str) else None
            found[kid] = SigningKey(PyJWK(entry), algorithm, str(entry.get("kty")))
        except jwt.PyJWTError:
            log.warning("jwks_key_skipped", extra={"kid": kid, "kty": entry.get("kty")})
    return found


class Verifier:
    """Bearer tokens -> Principals, by the ``dispenser.auth.oidc`` configuration."""

    def __init__(
        self,
        config: OidcConfig,
        segments: Mapping[str, str] | None = None,
        fetch: Fetch = fetch_url,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.keys = SigningKeys(config, fetch)
        self._clock = clock
        self._segments = segments or {}
        self._algorithms = list(config.algorithms)
        self._audiences = list(config.audiences)
        self._prefixes = {p.issuer: p.client_prefix for p in config.providers}
        self._remembered: dict[str, Principal] = {}

    def verify(self, token: str) -> Principal:
        """The token's principal; TokenRefused (401) or TokenForbidden (403) if not."""
        now = self._clock()
        known = self._remembered.get(token)
        if known is not None:
            if known.expires > now - self.config.leeway_s:
                return known
            del self._remembered[token]
        try:
            principal = self._verified(token, now)
        except TokenRefused as exc:
            log.warning("token_refused", extra={"reason": str(exc)})
            raise
        if len(self._remembered) >= MAX_REMEMBERED_TOKENS:
            del self._remembered[next(iter(self._remembered))]
        self._remembered[token] = principal
        return principal

    def _verified(self, token: str, now: float) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise TokenRefused("malformed token") from exc
        algorithm = header.get("alg")
        if algorithm not in self._algorithms:
            raise TokenRefused(f"token algorithm {algorithm!r} is not allowed")
        issuer = unverified.get("iss")
        if not isinstance(issuer, str) or issuer not in self.config.issuers:
            raise TokenRefused("token issuer is not accepted")
        kid = header.get("kid")
        key = self.keys.key(issuer, kid if isinstance(kid, str) else None)
        if key is None:
            raise TokenRefused("token signing key is not known (kid)")
        if not key.verifies(algorithm):
            raise TokenRefused("token algorithm does not match its key")
        try:
            claims = jwt.decode(
                token,
                key.jwk.key,
                algorithms=[algorithm],
                audience=self._audiences,
                issuer=issuer,
                leeway=self.config.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("token expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenRefused("token not valid yet (nbf)") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused("token audience is not accepted") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRefused("token issuer is not accepted") from exc
        except (jwt.PyJWTError, TypeError, ValueError) as exc:  # PyJWT's own, or a key
            raise TokenRefused(f"token not accepted: {type(exc).__name__}") from exc
        return self._principal(claims, self._prefixes[issuer])

    def _principal(self, claims: Mapping[str, Any], prefix: str) -> Principal:
        named = claims.get(self.config.client_claim)
        client = prefix + named if isinstance(named, str) else None
        if client is None or not API_CLIENT_NAME.fullmatch(client):
            raise TokenRefused(
                f"token claim {self.config.client_claim!r} does not name a client "
                f"(with its issuer's client_prefix, must match {API_CLIENT_NAME.pattern})"
            )
        roles = roles_of(claims, self.config.roles_claim)
        granted = [self.config.roles[r] for r in sorted(roles) if r in self.config.roles]
        if not granted:
            raise TokenForbidden(
                f"the token of client '{client}' carries none of the configured roles"
            )
        types = frozenset(self._segments.get(t, t) for grant in granted for t in grant.id_types)
        admin = any(grant.ledger_admin for grant in granted)
        return Principal(client, types, admin, float(claims["exp"]))


def roles_of(claims: Mapping[str, Any], path: str) -> set[str]:
    """The roles at ``path`` in the claims: a dotted path to a list of strings
    (``realm_access.roles``, ``resource_access.<client>.roles``) or to a
    space-separated string (``scope``)."""
    node: Any = claims
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, str):
        return set(node.split())
    if isinstance(node, list):
        return {role for role in node if isinstance(role, str)}
    return set()


def looks_like_a_token(value: str) -> bool:
    """A JWS in compact form (three dot-separated parts), not an API key."""
    return value.count(".") == 2


def presented_token(bearer: str, cookie_header: str | None) -> str | None:
    """The token of a request: its bearer value when that is a token, else the cookie
    ``Authorization`` (MOSIP's clients send the token so)."""
    if bearer and looks_like_a_token(bearer):
        return bearer
    if not cookie_header:
        return None
    for part in cookie_header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == "Authorization":
            value = value.strip().strip('"').removeprefix("Bearer ").strip()
            return value if looks_like_a_token(value) else None  # else: an API key's turn
    return None
