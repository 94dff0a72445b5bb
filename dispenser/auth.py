"""Optional API keys and OIDC tokens: who is calling, which ID types it may use, how fast.

Keys are configured as SHA-256 digests only. A key arrives as ``Authorization:
Bearer <key>`` or ``X-API-Key: <key>``; an OIDC token (``dispenser.oidc``) as
``Authorization: Bearer <jwt>`` or the cookie ``Authorization``. Rate limits are token
buckets held in each dispenser process, charged one token per key asked for (a batch of
100 costs 100), so ``rate_per_s`` bounds keys per second, not requests; a batch larger
than the client's ``burst`` is refused (422). With N replicas (or workers) a client's
total is up to N times its ``rate_per_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dispenser.oidc import TokenForbidden, TokenRefused, Verifier, presented_token
from shared.domain.apikeys import ANONYMOUS, digest
from shared.domain.config import ApiKeyConfig, AuthConfig
from shared.domain.errors import InvalidInput, KeydispenserError

# Token clients whose rate bucket is kept; beyond this the oldest are forgotten first (a
# forgotten bucket starts full again).
MAX_TOKEN_CLIENTS = 10_000


class Unauthenticated(KeydispenserError):
    """No API key, or one that is not configured (401)."""


class Forbidden(KeydispenserError):
    """The API key may not use this ID type (403)."""


class RateLimited(KeydispenserError):
    """The client's request rate is over its limit (429)."""

    def __init__(self, client: str, retry_after_s: int) -> None:
        super().__init__(f"rate limit of API client '{client}' exceeded; retry later")
        self.retry_after_s = retry_after_s


class CountAboveBurst(InvalidInput):
    """A request for more keys than the client's burst: it could never pass (422). The
    answer names the largest count that can (the ``KD-Max-Count`` header), so a client
    may lower its batch once instead of failing."""

    def __init__(self, client: str, count: int, burst: int) -> None:
        super().__init__(
            f"count {count} exceeds the burst of API client '{client}' ({burst} keys); "
            f"ask for at most {burst} keys a request"
        )
        self.burst = burst


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self, cost: int = 1) -> float:
        """0 when ``cost`` tokens were taken now, else seconds until they can be."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= cost - 1e-9:  # float drift must not refuse a due token
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate


class HeaderLookup(Protocol):
    """A request's headers as every server gives them: a lookup by lower-case name
    (Starlette's ``Headers``, granian's RSGI headers)."""

    def get(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class Client:
    config: ApiKeyConfig
    bucket: TokenBucket | None
    # The type names this client may use ("*": all), aliases resolved to their type.
    id_types: frozenset[str]

    def may_use(self, name: str) -> bool:
        return "*" in self.id_types or name in self.id_types


class Gate:
    """Answers "who is this, and may it do this now" for a request."""

    def __init__(
        self,
        config: AuthConfig,
        segments: Mapping[str, str] | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        """``segments``: each type name and alias -> the type's name (an API key may
        name a type by either; requests are checked against the type's name).
        ``verifier``: OIDC tokens (default: one for ``config.oidc`` when set)."""
        names = segments or {}
        self.verifier = verifier
        if self.verifier is None and config.oidc is not None:
            self.verifier = Verifier(config.oidc, names)
        self.enabled = bool(config.api_keys) or self.verifier is not None
        self.protect_observability = config.protect_observability
        self._clients = {
            c.sha256: Client(
                c,
                _bucket(c.rate_per_s, c.burst) if c.rate_per_s is not None else None,
                frozenset(names.get(t, t) for t in c.id_types),
            )
            for c in config.api_keys
        }
        self._by_name = {c.config.name: c for c in self._clients.values()}
        self._token_buckets: dict[str, TokenBucket] = {}

    def admit(self, headers: HeaderLookup, name: str | None = None, cost: int = 1) -> str:
        """The calling client's name, ``cost`` keys charged to its rate limit.

        Raises Unauthenticated, Forbidden, RateLimited, or InvalidInput when ``cost``
        exceeds the client's burst (it could never pass).
        """
        return self.admit_with_rights(headers, name, cost)[0]

    def admit_with_rights(
        self, headers: HeaderLookup, name: str | None = None, cost: int = 1
    ) -> tuple[str, bool]:
        """``admit``, and whether this request's credentials carry ledger permission
        (an API key's ``ledger_admin``, or a role of this very token that grants it)."""
        if not self.enabled:
            return ANONYMOUS, False
        bearer = _bearer(headers)
        if self.verifier is not None:
            token = presented_token(bearer, headers.get("cookie"))
            if token is not None:
                return self._admit_token(token, name, cost)
        client = self._clients.get(digest(bearer or headers.get("x-api-key") or ""))
        if client is None:
            raise Unauthenticated("missing or unknown API key")
        if name is not None and not client.may_use(name):
            raise Forbidden(f"API client '{client.config.name}' may not use id_type '{name}'")
        _charge(client.config.name, client.bucket, cost)
        return client.config.name, client.config.ledger_admin

    def _admit_token(self, token: str, name: str | None, cost: int) -> tuple[str, bool]:
        assert self.verifier is not None
        try:
            principal = self.verifier.verify(token)
        except TokenRefused as exc:
            raise Unauthenticated(str(exc)) from exc
        except TokenForbidden as exc:
            raise Forbidden(str(exc)) from exc
        if principal.client in self._by_name:
            # One name, two identities: refused rather than sharing the API key's ledger
            # entries, idempotency records and rate.
            raise Unauthenticated(
                f"token client '{principal.client}' is the name of an API key client"
            )
        if name is not None and not principal.may_use(name):
            raise Forbidden(f"token client '{principal.client}' may not use id_type '{name}'")
        _charge(principal.client, self._bucket_of(principal.client), cost)
        return principal.client, principal.ledger_admin

    def _bucket_of(self, client: str) -> TokenBucket | None:
        """A token client's rate bucket (none: unlimited)."""
        oidc = self.verifier.config if self.verifier else None
        if oidc is None or oidc.rate_per_s is None:
            return None
        bucket = self._token_buckets.get(client)
        if bucket is None:
            if len(self._token_buckets) >= MAX_TOKEN_CLIENTS:
                del self._token_buckets[next(iter(self._token_buckets))]
            bucket = self._token_buckets[client] = _bucket(oidc.rate_per_s, oidc.burst)
        return bucket

    async def start(self) -> None:
        """Fetch the identity providers' signing keys, then keep them fresh."""
        if self.verifier is not None:
            await self.verifier.keys.start()

    async def close(self) -> None:
        if self.verifier is not None:
            await self.verifier.keys.close()


def _charge(client: str, bucket: TokenBucket | None, cost: int) -> None:
    """Take ``cost`` tokens of ``client``'s bucket (none: unlimited)."""
    if bucket is None:
        return
    if cost > bucket.burst:
        raise CountAboveBurst(client, cost, int(bucket.burst))
    wait = bucket.take(cost)
    if wait:
        raise RateLimited(client, max(1, math.ceil(wait)))


def _bucket(rate_per_s: float, burst: int | None) -> TokenBucket:
    """A client's bucket; its burst defaults to a second's worth (at least one key)."""
    return TokenBucket(rate_per_s, burst or max(1, int(rate_per_s)))


def _bearer(headers: HeaderLookup) -> str:
    """The value of ``Authorization: Bearer <value>``, or ""."""
    authorization = headers.get("authorization") or ""
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
