"""The dispenser: its HTTP server and that server's limits, and who may call it."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from shared.domain.config.base import Strict
from shared.domain.tiers import MAX_KEYS_PER_POP

API_CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# An idempotency record lives at most this long (records are Redis memory).
IDEMPOTENCY_TTL_LIMIT_S = 7 * 86_400


class ApiKeyConfig(Strict):
    """One API client. Only the SHA-256 of its key is configured, never the key."""

    name: str = Field(pattern=API_CLIENT_NAME.pattern)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # ID types this client may use; "*" for all.
    id_types: tuple[str, ...] = ("*",)
    # Requests per second (token bucket, per dispenser process); None: unlimited.
    rate_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)  # None: max(1, rate_per_s)
    # May read every ledger entry and mark any key used, not only the keys issued to it.
    ledger_admin: bool = False


# What a token may be signed with: public-key algorithms only (an HMAC secret shared
# with the identity provider, or "none", would let anyone who has it mint tokens).
ASYMMETRIC_ALGORITHMS: tuple[str, ...] = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip


class OidcProvider(Strict):
    """An identity provider: tokens whose ``iss`` is ``issuer`` are verified with the
    keys published at ``jwks_url`` (Keycloak: <realm URL>/protocol/openid-connect/certs)."""

    issuer: str = Field(min_length=1)
    jwks_url: str
    # Put before the token's client name (e.g. "partner." makes "app" "partner.app"):
    # with several providers, each has its own, so two realms' clients never share a
    # name (rate limits, idempotency records, the ledger's client).
    client_prefix: str = Field(default="", pattern=r"^([A-Za-z0-9_-]{1,24}\.)?$")

    @model_validator(mode="after")
    def _fetched_safely(self) -> OidcProvider:
        parts = urlsplit(self.jwks_url)
        if parts.scheme == "https" and parts.hostname:
            return self
        if parts.scheme == "http" and _loopback(parts.hostname or ""):
            return self
        raise ValueError(
            f"jwks_url {self.jwks_url!r}: must be https (http only on a loopback host)"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OidcRole(Strict):
    """What a token carrying this role may do."""

    id_types: tuple[str, ...] = ("*",)  # names or aliases; "*" for all
    ledger_admin: bool = False  # read and mark every ledger entry, as an API key may


class OidcConfig(Strict):
    """Bearer tokens of an OIDC identity provider (Keycloak), beside API keys."""

    providers: tuple[OidcProvider, ...] = Field(min_length=1)
    # A token must name one of these in ``aud`` (Keycloak: add an audience mapper).
    audiences: tuple[str, ...] = Field(min_length=1)
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    # Where the token's roles are: a dotted path to a list (realm_access.roles,
    # resource_access.<client>.roles) or to a space-separated string (scope).
    roles_claim: str = Field(default="realm_access.roles", min_length=1)
    roles: dict[str, OidcRole] = Field(min_length=1)
    # The claim that names the client (ledger, rate limits, idempotency records).
    client_claim: Literal["azp", "client_id", "sub"] = "azp"
    leeway_s: float = Field(default=30.0, ge=0, le=300)  # for exp and nbf
    jwks_refresh_s: float = Field(default=300.0, ge=1, le=86_400)
    # An unknown kid fetches the issuer's keys again, at most this often.
    jwks_min_refetch_s: float = Field(default=10.0, ge=0.1, le=3_600)
    # Keys per second per token client (token bucket, per dispenser process).
    rate_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _asymmetric_and_unique(self) -> OidcConfig:
        weak = [a for a in self.algorithms if a not in ASYMMETRIC_ALGORITHMS]
        if weak or not self.algorithms:
            raise ValueError(
                f"algorithms: {weak or 'none'} not allowed; use public-key ones "
                f"({', '.join(ASYMMETRIC_ALGORITHMS)})"
            )
        if len(set(self.issuers)) != len(self.providers):
            raise ValueError("providers: each issuer once")
        prefixes = [p.client_prefix for p in self.providers]
        if len(prefixes) > 1 and ("" in prefixes or len(set(prefixes)) != len(prefixes)):
            raise ValueError(
                "providers: with several issuers each needs a client_prefix of its own "
                "(e.g. 'partner.'): client names are scoped by it, so that two realms' "
                "clients of one name never share rate limits, idempotency records or "
                "ledger entries"
            )
        return self

    @property
    def issuers(self) -> tuple[str, ...]:
        return tuple(p.issuer for p in self.providers)


class AuthConfig(Strict):
    """With neither API keys nor OIDC configured, the API is open (every client is
    anonymous)."""

    api_keys: tuple[ApiKeyConfig, ...] = ()
    oidc: OidcConfig | None = None
    # Whether /metrics, /healthz, /readyz and the health route need a key too.
    protect_observability: bool = False

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        names = [k.name for k in self.api_keys]
        if len(set(names)) != len(names):
            raise ValueError("api_keys: names must be unique")
        if len({k.sha256 for k in self.api_keys}) != len(self.api_keys):
            raise ValueError("api_keys: two clients share one key")
        providers = self.oidc.providers if self.oidc else ()
        prefixes = [p.client_prefix for p in providers if p.client_prefix]
        taken = sorted(n for n in names if any(n.startswith(p) for p in prefixes))
        if taken:
            raise ValueError(
                f"api_keys: {', '.join(taken)} begin with an OIDC provider's client_prefix: "
                "the names of that provider's token clients are not for API keys"
            )
        return self


class MosipConfig(Strict):
    """MOSIP's kernel ID generator API (``/v1/idgenerator/uin``, ``/v1/idgenerator/vid``),
    each path served from a configured ID type (which keeps a ledger)."""

    uin: str | None = None  # the type GET/PUT /v1/idgenerator/uin serve
    vid: str | None = None  # the type GET /v1/idgenerator/vid serves
    # How long a PUT waits for the ledger to hold the key's issue and then its new
    # status (keysync applies both): a PUT right after its GET finds the UIN issued.
    ledger_wait_s: float = Field(default=5.0, gt=0, le=60)


class DispenserConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # The HTTP server: uvicorn or granian (dispenser/server.py; how to choose in
    # docs/operations.md). Both enforce the limits below where they offer them.
    server: Literal["uvicorn", "granian"] = "uvicorn"
    # Server worker processes; each coalesces its own requests.
    workers: int = Field(default=1, ge=1, le=64)
    max_batch: int = Field(default=1_000, ge=1)
    # Largest request body read (POST /v1/keys/{t}/used); larger ones get 413 unread.
    max_body_bytes: int = Field(default=262_144, ge=1_024, le=16_777_216)
    # Server limits, per worker: connections served at once (uvicorn answers more with
    # 503, granian leaves them queued), seconds an idle keep-alive connection stays open
    # (granian: also the time to send a request head), and the largest request head
    # (request line and headers; granian's bound is at least 8192). docs/security.md.
    limit_concurrency: int | None = Field(default=4_096, ge=1)
    timeout_keep_alive_s: int = Field(default=5, ge=1, le=300)
    max_header_bytes: int = Field(default=16_384, ge=1_024, le=1_048_576)
    # Ledger types answer 503 (Retry-After) while the ledger stream holds more entries
    # than this (keysync is not draining it): the audit is never silently incomplete.
    ledger_max_backlog: int = Field(default=1_000_000, ge=1)
    # Retry-After of IDG-001 when no recent refill rate is known, and its upper bound.
    retry_after_s: int = Field(default=1, ge=1)
    retry_after_max_s: int = Field(default=60, ge=1)
    nudge_interval_s: float = Field(default=0.05, gt=0)
    # How long a retried request with the same Idempotency-Key gets the same keys.
    idempotency_ttl_s: int = Field(default=86_400, ge=1, le=IDEMPOTENCY_TTL_LIMIT_S)
    auth: AuthConfig = AuthConfig()
    mosip: MosipConfig | None = None

    @model_validator(mode="after")
    def _batch_fits_the_pop_script(self) -> DispenserConfig:
        if self.max_batch > MAX_KEYS_PER_POP:
            raise ValueError(
                f"max_batch {self.max_batch} is above {MAX_KEYS_PER_POP}: one pop can return "
                f"at most {MAX_KEYS_PER_POP} keys (tiers.MAX_KEYS_PER_POP)"
            )
        return self
