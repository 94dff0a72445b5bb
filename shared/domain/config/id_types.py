"""ID types: pooled ones (a format of ``shared.domain.formats``: keygen generates them,
the hot tier holds them) and snowflake ones (minted in each dispenser on a leased
machine ID)."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from shared.domain import redis_keys
from shared.domain.config.base import Strict
from shared.domain.formats import FORMATS, PooledKind
from shared.domain.leases import MAX_POOL_IDS
from shared.domain.names import AFFIX, ALIAS, ID_TYPE_NAME

# 2020-01-01T00:00:00Z in milliseconds since the Unix epoch: the default snowflake epoch.
SNOWFLAKE_EPOCH_MS = 1_577_836_800_000
SNOWFLAKE_BITS = 63  # the sign bit of a signed 64-bit integer stays 0


# fsynced with replicas: a replica acknowledges the offset it has fsynced with its next
# acknowledgement (REPLCONF ACK), which may be its once-a-second one when the primary's
# request for one (WAITAOF's GETACK) reached it before its fsync: WAITAOF then waits up
# to a second (measured on Valkey 8.1 with appendfsync always: 1-4 ms, one in twenty
# about 960 ms).
MIN_FSYNCED_WAIT_MS = 1_100


class Watermarks(Strict):
    low: int = Field(ge=0)
    high: int = Field(gt=0)

    @model_validator(mode="after")
    def _low_below_high(self) -> Watermarks:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class FilterLimits(Strict):
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


class Site(Strict):
    """One site's share of a type's counters: the ``index``-th of ``of`` contiguous,
    disjoint parts. Stacks with one permutation key and different indexes never produce
    the same key, with no link between them; an index is never used by two stacks."""

    index: int = Field(ge=0)
    of: int = Field(ge=2, le=1024)

    @model_validator(mode="after")
    def _index_below_of(self) -> Site:
        if self.index >= self.of:
            raise ValueError(f"index {self.index} must be below of ({self.of}): 0..{self.of - 1}")
        return self


# Keys a dispenser process holds per type when ``prefetch`` is not set: enough that a
# pop's round trip under load is covered by the half still held when it starts.
DEFAULT_PREFETCH = 256


class IdTypeConfig(Strict):
    kind: PooledKind
    length: int
    # permuted: counters go through the keyed permutation (not guessable); sequential:
    # counter n is key n, zero-padded (FAR-00001 style; anyone can guess the next one).
    order: Literal["permuted", "sequential"] = "permuted"
    # The check scheme: one of its format's ``check_schemes``, the first by default.
    check_digit: str = ""
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
    # A key released by its client (MOSIP's UNASSIGNED) goes back to the cold tier,
    # once, and may be issued again (the ledger keeps both issues). False: a released
    # key is recorded and never issued again.
    reissue_released: bool = False
    # How long a released key waits before it goes back (keysync looks every minute):
    # longer than any client retries a release, so that a late retry of the release
    # finds it released rather than releasing its next issue.
    reissue_after_s: float = Field(default=3_600.0, ge=0, le=30 * 86_400)
    # When a ledger type's answer is given (docs/reliability.md, "The ledger"): at once
    # (async: a Redis primary lost before its replica copied the issue entry loses that
    # record), once ``ledger_replicas`` replicas hold the entry (replicated: WAIT), or
    # once the primary's append-only file and ``ledger_replicas`` replicas' have it on
    # disk (fsynced: WAITAOF, Redis 7.2 or later). Not confirmed within
    # ``ledger_wait_ms``: the request is answered 503 and its keys are never handed out.
    ledger_durability: Literal["async", "replicated", "fsynced"] = "async"
    ledger_replicas: int = Field(default=1, ge=0, le=16)
    ledger_wait_ms: int = Field(default=500, ge=1, le=10_000)
    # This stack's share of the counters (docs/operations.md, "Two sites"). None: all.
    site: Site | None = None

    def idempotency_ttl_s(self, configured: int) -> int:
        """How long an idempotency record of this type lives: ``configured``
        (``dispenser.idempotency_ttl_s``), but no longer than a key given back waits
        before it may be issued again (``reissue_after_s``): a retry replayed by a
        server that never saw the release (a Redis split brain) can return a key given
        back, never one issued to another client since."""
        if self.ledger and self.reissue_released:
            return max(1, min(configured, math.floor(self.reissue_after_s)))
        return configured

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
        """check_digit follows the kind (its format's first check scheme), filter_profile
        the order, unless given."""
        if not isinstance(data, dict):
            return data
        kind = data.get("kind")
        if isinstance(kind, str) and kind in FORMATS:
            data = {"check_digit": FORMATS[kind].check_schemes[0]} | data
        if "filter_profile" not in data and data.get("order") == "sequential":
            data = data | {"filter_profile": "none"}
        return data

    @model_validator(mode="after")
    def _length_in_range(self) -> IdTypeConfig:
        lo, hi = FORMATS[self.kind].length_limits
        if not lo <= self.length <= hi:
            raise ValueError(f"length {self.length} out of range for kind {self.kind} ({lo}..{hi})")
        schemes = FORMATS[self.kind].check_schemes
        if self.check_digit not in schemes:
            raise ValueError(
                f"check_digit: {self.check_digit!r} is not a check scheme of kind {self.kind} "
                f"({', '.join(schemes)})"
            )
        FORMATS[self.kind].check(self)
        for alias in self.aliases:
            if not ALIAS.fullmatch(alias):
                raise ValueError(f"aliases: {alias!r} must match {ALIAS.pattern}")
        if self.filter_profile == "mosip":
            for name in ("first_equals_last", "first_equals_reverse"):
                if getattr(self.filters, name) > self.length:
                    raise ValueError(f"filters.{name} must not exceed length for profile mosip")
        return self

    @model_validator(mode="after")
    def _reissue_needs_a_ledger(self) -> IdTypeConfig:
        if self.reissue_released and not self.ledger:
            raise ValueError("reissue_released: needs ledger: true (releases are ledger records)")
        if self.ledger_durability != "async" and not self.ledger:
            raise ValueError("ledger_durability: needs ledger: true (it is the ledger's)")
        if self.ledger_durability == "replicated" and self.ledger_replicas == 0:
            raise ValueError(
                "ledger_durability: replicated with ledger_replicas: 0 waits for no replica "
                "(it is async): set ledger_replicas to every replica a failover may promote"
            )
        if (
            self.ledger_durability == "fsynced"
            and self.ledger_replicas > 0
            and self.ledger_wait_ms < MIN_FSYNCED_WAIT_MS
        ):
            raise ValueError(
                f"ledger_durability: fsynced with ledger_replicas: {self.ledger_replicas} "
                f"needs ledger_wait_ms of at least {MIN_FSYNCED_WAIT_MS} (is "
                f"{self.ledger_wait_ms}): a replica may acknowledge its fsync only with its "
                "once-a-second acknowledgement, and a request not confirmed in time is "
                "refused and its keys never handed out"
            )
        return self

    @model_validator(mode="after")
    def _no_prefetch_with_ledger(self) -> IdTypeConfig:
        if self.ledger and self.prefetch:
            raise ValueError(
                "prefetch: must be 0 for a ledger type (each key is recorded to the client "
                "that asked when it is popped)"
            )
        return self

    @model_validator(mode="after")
    def _site_share_not_empty(self) -> IdTypeConfig:
        # A sequence needs MINVALUE below MAXVALUE: a share of at least 2 counters.
        if self.site is not None and self.domain_size // self.site.of < 2:
            raise ValueError(
                f"site: {self.domain_size} counters cannot be split {self.site.of} ways "
                "(each share needs at least 2)"
            )
        return self

    @property
    def stock(self) -> int:
        """Keys a dispenser process holds ahead of requests (``prefetch`` resolved)."""
        if self.prefetch is not None:
            return self.prefetch
        return 0 if self.ledger else DEFAULT_PREFETCH

    @property
    def domain_size(self) -> int:
        """Number of counters (the format's keyspace before filters)."""
        return FORMATS[self.kind].domain_size(self)

    @property
    def counter_start(self) -> int:
        """The first counter of this stack's share (0 without a site)."""
        if self.site is None:
            return 0
        return self.domain_size * self.site.index // self.site.of

    @property
    def counter_stop(self) -> int:
        """One past the last counter of this stack's share (the domain's size without a
        site). Shares of consecutive indexes meet: [D*i//n, D*(i+1)//n)."""
        if self.site is None:
            return self.domain_size
        return self.domain_size * (self.site.index + 1) // self.site.of

    @property
    def counter_share(self) -> int:
        """Counters this stack may lease."""
        return self.counter_stop - self.counter_start


class SnowflakeBits(Strict):
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


class MachineIds(Strict):
    """The machine-ID lease pool a snowflake type's dispensers draw from."""

    pool: str | None = Field(default=None, pattern=ID_TYPE_NAME.pattern)  # None: the type's name
    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)  # None: 2^bits.machine - 1


class SnowflakeConfig(Strict):
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
        if hi - lo + 1 > MAX_POOL_IDS:
            raise ValueError(
                f"machine_ids: [{lo}, {hi}] holds more than {MAX_POOL_IDS} IDs; "
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


ID_KINDS: tuple[str, ...] = (*get_args(PooledKind), "snowflake")
AnyIdTypeConfig = Annotated[IdTypeConfig | SnowflakeConfig, Field(discriminator="kind")]


def check_type_names(id_types: dict[str, IdTypeConfig | SnowflakeConfig]) -> None:
    """Every type name is an identifier, none is a name the Redis key layout keeps for
    itself, and every path segment (name or alias) names one type."""
    for name in id_types:
        if not ID_TYPE_NAME.fullmatch(name):
            raise ValueError(f"id_types.{name}: name must match {ID_TYPE_NAME.pattern}")
        if name in redis_keys.RESERVED_TYPE_NAMES:
            raise ValueError(f"id_types.{name}: reserved name (a Redis key of its own)")
    _aliases_unique(id_types)


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
