"""Optional API keys: who is calling, which ID types it may use, how fast.

Keys are configured as SHA-256 digests only. A key arrives as ``Authorization:
Bearer <key>`` or ``X-API-Key: <key>``. Rate limits are token buckets held in each
dispenser process, charged one token per key asked for (a batch of 100 costs 100), so
``rate_per_s`` bounds keys per second, not requests; a batch larger than the client's
``burst`` is refused (422). With N replicas (or workers) a client's total is up to N
times its ``rate_per_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shared.domain.apikeys import ANONYMOUS, digest
from shared.domain.config import ApiKeyConfig, AuthConfig
from shared.domain.errors import InvalidInput, KeydispenserError


class Unauthenticated(KeydispenserError):
    """No API key, or one that is not configured (401)."""


class Forbidden(KeydispenserError):
    """The API key may not use this ID type (403)."""


class RateLimited(KeydispenserError):
    """The client's request rate is over its limit (429)."""

    def __init__(self, client: str, retry_after_s: int) -> None:
        super().__init__(f"rate limit of API client '{client}' exceeded; retry later")
        self.retry_after_s = retry_after_s


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

    def __init__(self, config: AuthConfig, segments: Mapping[str, str] | None = None) -> None:
        """``segments``: each type name and alias -> the type's name (an API key may
        name a type by either; requests are checked against the type's name)."""
        self.enabled = bool(config.api_keys)
        self.protect_observability = config.protect_observability
        names = segments or {}
        self._clients = {
            c.sha256: Client(
                c,
                _bucket(c) if c.rate_per_s is not None else None,
                frozenset(names.get(t, t) for t in c.id_types),
            )
            for c in config.api_keys
        }
        self._by_name = {c.config.name: c for c in self._clients.values()}

    def admit(self, headers: HeaderLookup, name: str | None = None, cost: int = 1) -> str:
        """The calling client's name, ``cost`` keys charged to its rate limit.

        Raises Unauthenticated, Forbidden, RateLimited, or InvalidInput when ``cost``
        exceeds the client's burst (it could never pass).
        """
        if not self.enabled:
            return ANONYMOUS
        client = self._clients.get(digest(_presented_key(headers)))
        if client is None:
            raise Unauthenticated("missing or unknown API key")
        if name is not None and not client.may_use(name):
            raise Forbidden(f"API client '{client.config.name}' may not use id_type '{name}'")
        if client.bucket is not None:
            if cost > client.bucket.burst:
                raise InvalidInput(
                    f"count {cost} exceeds the burst of API client '{client.config.name}' "
                    f"({int(client.bucket.burst)} keys)"
                )
            wait = client.bucket.take(cost)
            if wait:
                raise RateLimited(client.config.name, max(1, math.ceil(wait)))
        return client.config.name

    def ledger_admin(self, client: str) -> bool:
        """Whether ``client`` may read and mark every ledger entry, not only its own."""
        found = self._by_name.get(client)
        return found is not None and found.config.ledger_admin


def _bucket(config: ApiKeyConfig) -> TokenBucket:
    rate = config.rate_per_s or 1.0
    return TokenBucket(rate, config.burst or max(1, int(rate)))


def _presented_key(headers: HeaderLookup) -> str:
    authorization = headers.get("authorization") or ""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or ""
