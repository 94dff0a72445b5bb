"""Configuration: a YAML file plus KD_-prefixed environment overrides (env wins).

Built once in each process's ``main()`` and passed down; nothing here is global.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, date, datetime, time
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.domain.errors import ConfigError

# Anchored for OpenAPI; match it with fullmatch (a $ also matches before a final newline).
ID_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
BASE62_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Counter domains must fit PostgreSQL bigint sequences (and uint64 arithmetic).
LENGTH_LIMITS: dict[str, tuple[int, int]] = {"numeric": (2, 32), "base62": (1, 10)}
# Numeric types longer than this many counter digits take a keyed "head" on top
# of an 18-digit permuted tail: at most 10**18 keys each, unique by construction.
MAX_COUNTER_DIGITS = 18
DEFAULT_NAMESPACE = "kd"  # settings.redis_namespace unless set
# A type's hot list is "<namespace>:hot:<name>": "<namespace>:hot:registry" is the set of
# every hot list the fence discards from, so no type may be named "registry".
RESERVED_TYPE_NAMES = frozenset({"registry"})
AFFIX = re.compile(r"^[A-Za-z0-9_.:-]{0,16}$")  # safe in a URL path segment
# Another name for a type in request paths (a registry's own code, e.g. "FAR-"): one
# URL path segment that needs no percent-encoding, and never "." or "..".
ALIAS = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,40}$")
# Every Redis key is "<redis_namespace>:...": no ":" inside, so namespaces never overlap.
REDIS_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Watermarks(_Strict):
    low: int = Field(ge=0)
    high: int = Field(gt=0)

    @model_validator(mode="after")
    def _low_below_high(self) -> Watermarks:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class FilterLimits(_Strict):
    """Limits of the ten filters; names follow the OpenG2P ID Generator."""

    not_start_with: tuple[str, ...] = ("0", "1")
    sequence: int = Field(default=3, ge=2)
    repeating_digit: int = Field(default=2, ge=2)
    repeating_block: int = Field(default=2, ge=1)
    conjugative_even: int = Field(default=3, ge=1)
    first_equals_last: int = Field(default=5, ge=1)
    first_equals_reverse: int = Field(default=5, ge=1)
    # None: the profile's default (openg2p: none; mosip: 786, 666).
    restricted_numbers: tuple[str, ...] | None = None


# Keys a dispenser process holds per type when ``prefetch`` is not set: enough that a
# pop's round trip under load is covered by the half still held when it starts.
DEFAULT_PREFETCH = 256


class IdTypeConfig(_Strict):
    kind: Literal["numeric", "base62"]
    length: int
    # permuted: counters go through the keyed permutation (not guessable); sequential:
    # counter n is key n, zero-padded (FAR-00001 style; anyone can guess the next one).
    order: Literal["permuted", "sequential"] = "permuted"
    # Default: verhoeff for numeric, none for base62; none needs order: sequential.
    check_digit: Literal["verhoeff", "none"] = "verhoeff"
    # Default: openg2p, or none for sequential types (zero-padded numbers fail openg2p's).
    filter_profile: Literal["openg2p", "mosip", "none"] = "openg2p"
    # Other path segments that name this type (a registry's code, e.g. "FAR-").
    aliases: tuple[str, ...] = ()
    filters: FilterLimits = FilterLimits()
    prefix: str = Field(default="", pattern=AFFIX.pattern)
    suffix: str = Field(default="", pattern=AFFIX.pattern)
    # Warn when the share of counters never leased falls below each of these.
    headroom_warnings: tuple[float, ...] = (0.25, 0.10, 0.01)
    range_size: int = Field(default=1_048_576, ge=1, le=16_777_216)
    hot: Watermarks = Watermarks(low=5_000, high=20_000)
    cold: Watermarks = Watermarks(low=200_000, high=600_000)
    sync_batch: int = Field(default=5_000, ge=1, le=100_000)
    # Record every issued key (when, to which API client, used when) in PostgreSQL.
    ledger: bool = False
    # Keys each dispenser process pops ahead of single-ID requests and holds, so most
    # are answered without waiting for Redis. A stopping process counts the keys it
    # still holds as lost (a crash loses them uncounted): at most this many per type
    # and process. None: DEFAULT_PREFETCH, or 0 for a ledger type (its keys are
    # recorded to the client that asked at the pop itself).
    prefetch: int | None = Field(default=None, ge=0, le=1_000)

    @model_validator(mode="before")
    @classmethod
    def _filters_none(cls, data: Any) -> Any:
        """``filters: none`` is shorthand for ``filter_profile: none``."""
        if isinstance(data, dict) and data.get("filters") in ("none", None) and "filters" in data:
            data = {k: v for k, v in data.items() if k != "filters"} | {"filter_profile": "none"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _defaults_by_kind_and_order(cls, data: Any) -> Any:
        """check_digit follows the kind, filter_profile the order, unless given."""
        if not isinstance(data, dict):
            return data
        if "check_digit" not in data and data.get("kind") == "base62":
            data = data | {"check_digit": "none"}
        if "filter_profile" not in data and data.get("order") == "sequential":
            data = data | {"filter_profile": "none"}
        return data

    @model_validator(mode="after")
    def _length_in_range(self) -> IdTypeConfig:
        lo, hi = LENGTH_LIMITS[self.kind]
        if not lo <= self.length <= hi:
            raise ValueError(f"length {self.length} out of range for kind {self.kind} ({lo}..{hi})")
        if self.kind == "base62" and self.check_digit != "none":
            raise ValueError("check_digit: base62 types have none")
        if self.check_digit == "none" and self.kind == "numeric" and self.order != "sequential":
            raise ValueError("check_digit: none is only supported with order: sequential")
        for alias in self.aliases:
            if not ALIAS.fullmatch(alias):
                raise ValueError(f"aliases: {alias!r} must match {ALIAS.pattern}")
        if self.filter_profile == "mosip":
            for name in ("first_equals_last", "first_equals_reverse"):
                if getattr(self.filters, name) > self.length:
                    raise ValueError(f"filters.{name} must not exceed length for profile mosip")
        return self

    @model_validator(mode="after")
    def _no_prefetch_with_ledger(self) -> IdTypeConfig:
        if self.ledger and self.prefetch:
            raise ValueError(
                "prefetch: must be 0 for a ledger type (each key is recorded to the client "
                "that asked when it is popped)"
            )
        return self

    @property
    def stock(self) -> int:
        """Keys a dispenser process holds ahead of requests (``prefetch`` resolved)."""
        if self.prefetch is not None:
            return self.prefetch
        return 0 if self.ledger else DEFAULT_PREFETCH

    @property
    def body_digits(self) -> int:
        """Decimal digits before the check digit (numeric types)."""
        return self.length - (1 if self.check_digit == "verhoeff" else 0)

    @property
    def counter_digits(self) -> int:
        """Decimal digits drawn from the counter (numeric types)."""
        return min(self.body_digits, MAX_COUNTER_DIGITS)

    @property
    def domain_size(self) -> int:
        """Number of counters: the last numeric digit is the check digit."""
        if self.kind == "numeric":
            return int(10**self.counter_digits)
        return int(62**self.length)


# 2020-01-01T00:00:00Z in milliseconds since the Unix epoch: the default snowflake epoch.
SNOWFLAKE_EPOCH_MS = 1_577_836_800_000
SNOWFLAKE_BITS = 63  # the sign bit of a signed 64-bit integer stays 0
# A lease pool's largest range (shared.domain.leases.MAX_POOL_IDS, which imports this
# module): one acquire scans the whole range in a single script call.
MACHINE_RANGE_LIMIT = 4_096


class SnowflakeBits(_Strict):
    """Widths of the three fields, most significant first; they fill 63 bits."""

    time: int = Field(default=41, ge=30, le=45)
    machine: int = Field(default=10, ge=1, le=20)
    sequence: int = Field(default=12, ge=1, le=22)

    @model_validator(mode="after")
    def _fill_63_bits(self) -> SnowflakeBits:
        total = self.time + self.machine + self.sequence
        if total != SNOWFLAKE_BITS:
            raise ValueError(
                f"time + machine + sequence must be {SNOWFLAKE_BITS} bits, got {total} "
                f"({self.time} + {self.machine} + {self.sequence})"
            )
        return self


class MachineIds(_Strict):
    """The machine-ID lease pool a snowflake type's dispensers draw from."""

    pool: str | None = Field(default=None, pattern=ID_TYPE_NAME.pattern)  # None: the type's name
    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)  # None: 2^bits.machine - 1


class SnowflakeConfig(_Strict):
    """A type of time-ordered 64-bit IDs minted in each dispenser process (no inventory)."""

    kind: Literal["snowflake"]
    # Other path segments that name this type, as for pooled types.
    aliases: tuple[str, ...] = ()
    # ISO-8601 date or time (UTC unless it says otherwise), or milliseconds since 1970.
    epoch: int = SNOWFLAKE_EPOCH_MS
    bits: SnowflakeBits = SnowflakeBits()
    text: Literal["decimal", "base62"] = "decimal"
    machine_ids: MachineIds = MachineIds()
    lease_ttl_s: float = Field(default=10.0, ge=1.0, le=300.0)
    lease_renew_s: float = Field(default=1.0, gt=0)
    # A clock behind the last issued time is waited for up to this long, then refused.
    max_backwards_ms: int = Field(default=5, ge=0, le=10_000)

    @field_validator("epoch", mode="before")
    @classmethod
    def _epoch_ms(cls, value: Any) -> Any:
        return epoch_ms(value)

    @model_validator(mode="after")
    def _consistent(self) -> SnowflakeConfig:
        for alias in self.aliases:
            if not ALIAS.fullmatch(alias):
                raise ValueError(f"aliases: {alias!r} must match {ALIAS.pattern}")
        if self.epoch > datetime.now(UTC).timestamp() * 1000:
            raise ValueError(f"epoch {self.epoch} ms is in the future: no ID could be minted")
        top = (1 << self.bits.machine) - 1
        if self.machine_ids.max is not None and self.machine_ids.max > top:
            raise ValueError(
                f"machine_ids.max {self.machine_ids.max} does not fit {self.bits.machine} "
                f"machine bits (at most {top})"
            )
        if self.machine_ids.min > self.machine_range[1]:
            raise ValueError(f"machine_ids.min {self.machine_ids.min} is above machine_ids.max")
        lo, hi = self.machine_range
        if hi - lo + 1 > MACHINE_RANGE_LIMIT:
            raise ValueError(
                f"machine_ids: [{lo}, {hi}] holds more than {MACHINE_RANGE_LIMIT} IDs; "
                "set machine_ids.min and machine_ids.max"
            )
        if self.lease_renew_s * 3 > self.lease_ttl_s:
            raise ValueError("lease_renew_s must be at most a third of lease_ttl_s")
        return self

    @property
    def machine_range(self) -> tuple[int, int]:
        """The machine IDs leased, both ends included."""
        top = (1 << self.bits.machine) - 1
        hi = top if self.machine_ids.max is None else self.machine_ids.max
        return self.machine_ids.min, hi

    def pool(self, name: str) -> str:
        return self.machine_ids.pool or name


def epoch_ms(value: Any) -> Any:
    """An epoch as milliseconds since 1970: from an ISO string, a date or datetime
    (naive ones are UTC), or a whole number of milliseconds; anything else unchanged."""
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"epoch {value!r}: neither an ISO-8601 time nor milliseconds") from exc
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime.combine(value, time(), tzinfo=UTC)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return round(value.timestamp() * 1000)
    return value


ID_KINDS = ("numeric", "base62", "snowflake")
AnyIdTypeConfig = Annotated[IdTypeConfig | SnowflakeConfig, Field(discriminator="kind")]


API_CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ApiKeyConfig(_Strict):
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


class AuthConfig(_Strict):
    """With no API keys configured, the API is open (every client is anonymous)."""

    api_keys: tuple[ApiKeyConfig, ...] = ()
    # Whether /metrics, /healthz, /readyz and the health route need a key too.
    protect_observability: bool = False

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        names = [k.name for k in self.api_keys]
        if len(set(names)) != len(names):
            raise ValueError("api_keys: names must be unique")
        if len({k.sha256 for k in self.api_keys}) != len(self.api_keys):
            raise ValueError("api_keys: two clients share one key")
        return self


# The pop script passes one API-client name per key as a script argument, and Lua's
# unpack() fails near 8,000 of them (after the keys were popped): max_batch stays below.
MAX_BATCH_LIMIT = 5_000
# An idempotency record lives at most this long (records are Redis memory).
IDEMPOTENCY_TTL_LIMIT_S = 7 * 86_400


class DispenserConfig(_Strict):
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

    @model_validator(mode="after")
    def _batch_fits_the_pop_script(self) -> DispenserConfig:
        if self.max_batch > MAX_BATCH_LIMIT:
            raise ValueError(
                f"max_batch {self.max_batch} is above {MAX_BATCH_LIMIT}: one pop can return "
                f"at most {MAX_BATCH_LIMIT} keys (the pop script's argument limit)"
            )
        return self


class KeysyncConfig(_Strict):
    poll_interval_s: float = Field(default=0.5, gt=0)
    # How long a batch whose push got no answer is retried (on the same server only),
    # judged by that server's clock: a keysync paused longer never pushes it again.
    push_retry_s: float = Field(default=10.0, gt=0, le=3_600)
    # How long a take's transaction may sit open and idle (the next batch, held while the
    # previous one is pushed) before PostgreSQL ends it: a keysync frozen or cut off
    # there cannot hold the sync clock's lock, and every other take and lease, longer.
    take_idle_limit_s: float = Field(default=10.0, gt=1, le=600)
    # How long a pushed batch's marker (which makes a retried push add nothing) lives
    # at least; always past the batch's push deadline. Redis memory, one small key each.
    batch_marker_ttl_s: float = Field(default=3_600.0, ge=1, le=7 * 86_400)
    # Ledger events moved from Redis to PostgreSQL per transaction.
    ledger_batch: int = Field(default=1_000, ge=1, le=100_000)
    # Ledger entries another keysync read but never acknowledged (it died) are taken
    # over after this long.
    ledger_claim_idle_s: float = Field(default=30.0, ge=0)
    # A "used" mark applied before its key's issue entry waits this long for it, then
    # is forgotten (and logged): the key was never issued, or Redis lost its entry.
    ledger_early_mark_ttl_s: float = Field(default=7 * 86_400, ge=60)
    # Prometheus metrics over HTTP; None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


class KeygenConfig(_Strict):
    poll_interval_s: float = Field(default=2.0, gt=0)
    # Candidates generated and committed at a time (a range is several slices).
    slice_size: int = Field(default=1_048_576, ge=1_000)
    # Generation threads; None: one per CPU.
    threads: int | None = Field(default=None, ge=1, le=64)
    # Prometheus metrics over HTTP; None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


class SentinelConfig(_Strict):
    """Redis behind Sentinel: the primary is looked up (and re-looked up) by name."""

    sentinels: tuple[str, ...] = Field(min_length=1)  # "host:port" each
    master_name: str = "mymaster"
    username: str | None = None
    password: SecretStr | None = None  # of the Redis servers
    sentinel_password: SecretStr | None = None
    db: int = Field(default=0, ge=0)
    sentinel_username: str | None = None
    # TLS to the Redis servers and the Sentinels alike. The server certificate is
    # checked against tls_ca_file (else the system's CAs) and, with tls_check_hostname,
    # its name against the address Sentinel reports; tls_cert_file/tls_key_file are a
    # client certificate for servers that require one.
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_check_hostname: bool = True

    # Where this process reaches a server at another address than the one Sentinel
    # reports ("host:port" -> "host:port"): NAT, a port forward, a per-process proxy.
    address_map: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _addresses(self) -> SentinelConfig:
        for address in (*self.sentinels, *self.address_map, *self.address_map.values()):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"sentinel address {address!r} must be host:port")
        return self

    def addresses(self) -> list[tuple[str, int]]:
        return [_host_port(a) for a in self.sentinels]

    def reachable(self, address: tuple[str, int]) -> tuple[str, int]:
        """Where this process reaches a server Sentinel reports at ``address``."""
        mapped = self.address_map.get(f"{address[0]}:{address[1]}")
        return address if mapped is None else _host_port(mapped)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KD_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/keydispenser"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # When set, Redis is found through Sentinel and redis_url is not used.
    redis_sentinel: SentinelConfig | None = None
    permutation_key: SecretStr | None = None
    # Prefix of every Redis key: environments sharing one Redis server (and database)
    # each set their own and never see each other's hot lists, fence or ledger.
    redis_namespace: str = Field(default=DEFAULT_NAMESPACE, pattern=REDIS_NAMESPACE.pattern)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # json: one JSON object per line (what log collectors want); console: one readable
    # line per event (`keydispenser up` uses it on a terminal).
    log_format: Literal["json", "console"] = "json"
    # Per logger (and the loggers below it), overriding log_level: {"shared.leasing":
    # "DEBUG"} logs every machine-ID lease renewal, for an audit of who held an ID when.
    log_levels: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR"]] = Field(
        default_factory=dict
    )
    # The PostgreSQL fence (docs/reliability.md). Switch it off only to show the hazard
    # it closes (`keydispenser drill --no-postgres-fence`): a failover to an asynchronous
    # replica then dispenses keys twice.
    postgres_fence: bool = True
    # Machine-ID grants and renewals (snowflake types, `keydispenser lease`) count only
    # once this many Redis replicas acknowledged them (WAIT, within
    # lease_wait_timeout_ms): an old primary cut off from its replicas cannot keep a
    # lease alive that the promoted replica may grant again. None: 1 with
    # redis_sentinel (a deployment with replicas), 0 with a plain redis_url.
    lease_wait_replicas: int | None = Field(default=None, ge=0, le=16)
    lease_wait_timeout_ms: int = Field(default=500, ge=10, le=10_000)
    # Seconds each host of postgres_dsn may take to accept a connection: a frozen host
    # listed first in a multi-host DSN costs this long, then the next is tried.
    postgres_connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    id_types: dict[str, AnyIdTypeConfig] = Field(default_factory=dict)
    dispenser: DispenserConfig = DispenserConfig()
    keysync: KeysyncConfig = KeysyncConfig()
    keygen: KeygenConfig = KeygenConfig()

    @model_validator(mode="after")
    def _names_are_identifiers(self) -> Settings:
        for name in self.id_types:
            if not ID_TYPE_NAME.fullmatch(name):
                raise ValueError(f"id_types.{name}: name must match {ID_TYPE_NAME.pattern}")
            if name in RESERVED_TYPE_NAMES:
                raise ValueError(f"id_types.{name}: reserved name (a Redis key of its own)")
        _aliases_unique(self.id_types)
        for client in self.dispenser.auth.api_keys:
            unknown = set(client.id_types) - {"*", *path_segments(self.id_types)}
            if unknown:
                raise ValueError(
                    f"dispenser.auth.api_keys.{client.name}.id_types: unknown {sorted(unknown)}"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Order is priority: explicit arguments, then the environment, then YAML.
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))

    def pooled(self, name: str) -> IdTypeConfig:
        """The configuration of pooled (numeric or base62) type ``name``."""
        config = self.id_types[name]
        if not isinstance(config, IdTypeConfig):
            raise ConfigError(f"id_types.{name}: a {config.kind} type, not a pooled one")
        return config

    def lease_wait_replicas_or_default(self) -> int:
        """lease_wait_replicas, or its default for this Redis deployment."""
        if self.lease_wait_replicas is not None:
            return self.lease_wait_replicas
        return 1 if self.redis_sentinel is not None else 0

    def require_permutation_key(self) -> bytes:
        if self.permutation_key is None or not self.permutation_key.get_secret_value():
            raise ConfigError(
                "permutation_key: missing; set KD_PERMUTATION_KEY to a long random secret"
            )
        return self.permutation_key.get_secret_value().encode()


def _aliases_unique(id_types: dict[str, IdTypeConfig | SnowflakeConfig]) -> None:
    """Every path segment names one type: aliases differ from every name and alias."""
    owner: dict[str, str] = {name: name for name in id_types}
    for name, config in id_types.items():
        for alias in config.aliases:
            if alias in owner:
                raise ValueError(
                    f"id_types.{name}.aliases: {alias!r} already names id type {owner[alias]!r}"
                )
            owner[alias] = name


def path_segments(id_types: dict[str, IdTypeConfig | SnowflakeConfig]) -> dict[str, str]:
    """Each path segment that names a type (its name, its aliases) -> the type's name."""
    segments = {name: name for name in id_types}
    for name, config in id_types.items():
        segments.update(dict.fromkeys(config.aliases, name))
    return segments


def default_config_path() -> Path:
    return Path(str(resources.files("shared.domain").joinpath("default.yaml")))


def load_settings(config_path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read the YAML file (KD_CONFIG, else the shipped default) and the environment."""
    path = Path(config_path or os.environ.get("KD_CONFIG") or default_config_path())
    if not path.is_file():
        raise ConfigError(f"KD_CONFIG: configuration file not found: {path}")
    bound = type(
        "BoundSettings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": path}}
    )
    try:
        settings: Settings = bound(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return settings


def describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in _located(err["loc"], err["type"])) or "(root)"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{field}: {message}")
    return "invalid configuration: " + "; ".join(lines)


def _located(loc: tuple[int | str, ...], kind: str) -> tuple[int | str, ...]:
    """An error's location as the YAML names it: without the kind pydantic puts after
    an ID type's name, and ending in ``kind`` when the kind itself is unknown."""
    if len(loc) >= 3 and loc[0] == "id_types" and loc[2] in ID_KINDS:
        loc = loc[:2] + loc[3:]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc = (*loc, "kind")
    return loc
