"""Machine-ID lease pools: what a valid pool name and range are (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.domain.errors import ConfigError
from shared.domain.names import ID_TYPE_NAME

if TYPE_CHECKING:  # the configuration's ID types import MAX_POOL_IDS from here
    from shared.domain.config import Settings

MAX_POOL_IDS = 4_096  # one acquire scans the range in one script call: a full 4,096-ID
# pool takes tens of milliseconds of Redis time, which the hot tier shares
MIN_TTL_MS = 100


def check_pool(pool: str, lo: int, hi: int) -> None:
    """Raise ConfigError unless ``pool`` is a valid name (like an ID type's: it becomes
    part of Redis key names) and ``[lo, hi]`` a non-empty range of at most MAX_POOL_IDS."""
    if not ID_TYPE_NAME.fullmatch(pool):
        raise ConfigError(f"pool {pool!r}: must match {ID_TYPE_NAME.pattern}")
    if lo < 0 or hi < lo:
        raise ConfigError(f"pool '{pool}': range [{lo}, {hi}] must satisfy 0 <= min <= max")
    if hi - lo + 1 > MAX_POOL_IDS:
        raise ConfigError(f"pool '{pool}': range [{lo}, {hi}] holds more than {MAX_POOL_IDS} IDs")


def check_ttl(ttl_s: float, renew_every_s: float) -> None:
    """Raise ConfigError unless renewals come well within the TTL."""
    if ttl_s * 1000 < MIN_TTL_MS:
        raise ConfigError(f"lease ttl {ttl_s}s: at least {MIN_TTL_MS} ms")
    if not 0 < renew_every_s <= ttl_s / 3:
        raise ConfigError(
            f"lease renew_every {renew_every_s}s: must be positive and at most a third "
            f"of the ttl ({ttl_s}s), so a holder gets several tries before its deadline"
        )


def safety_margin_s(ttl_s: float) -> float:
    """How long before the lease could expire in Redis a holder stops using it."""
    return min(ttl_s / 10, 1.0)


@dataclass(frozen=True)
class LeaseWait:
    """When a machine-ID grant or renewal counts: once ``replicas`` Redis replicas
    acknowledged it (WAIT), within ``timeout_ms``. 0 replicas: at once (one server, no
    replicas). A primary cut off from its replicas (a partition, a failover that left
    it up) then cannot keep alive a lease the promoted replica may grant again."""

    replicas: int = 0
    timeout_ms: int = 500


NO_WAIT = LeaseWait()  # counts at once: one Redis server, no replicas


def lease_wait(settings: Settings) -> LeaseWait:
    """The configured LeaseWait (lease_wait_replicas, lease_wait_timeout_ms)."""
    return LeaseWait(settings.lease_wait_replicas_or_default(), settings.lease_wait_timeout_ms)
