"""Redis: one server (``redis_url``) or a primary found through Sentinel (with TLS),
the namespace every key lives under, and how machine-ID leases wait for replicas."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, SecretStr, model_validator

from shared.domain.config.base import Strict

DEFAULT_NAMESPACE = "kd"  # settings.redis_namespace unless set
# Every Redis key is "<redis_namespace>:...": no ":" inside, so namespaces never overlap.
REDIS_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class SentinelConfig(Strict):
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


class RedisSettings(BaseModel):
    """The top-level settings of Redis (part of ``Settings``)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    # When set, Redis is found through Sentinel and redis_url is not used.
    redis_sentinel: SentinelConfig | None = None
    # Prefix of every Redis key: environments sharing one Redis server (and database)
    # each set their own and never see each other's hot lists, fence or ledger.
    redis_namespace: str = Field(default=DEFAULT_NAMESPACE, pattern=REDIS_NAMESPACE.pattern)
    # Machine-ID grants and renewals (snowflake types, `keydispenser lease`) count only
    # once this many Redis replicas acknowledged them (WAIT, within
    # lease_wait_timeout_ms): an old primary cut off from its replicas cannot keep a
    # lease alive that the promoted replica may grant again. None: 1 with
    # redis_sentinel (a deployment with replicas), 0 with a plain redis_url.
    lease_wait_replicas: int | None = Field(default=None, ge=0, le=16)
    lease_wait_timeout_ms: int = Field(default=500, ge=10, le=10_000)

    def lease_wait_replicas_or_default(self) -> int:
        """lease_wait_replicas, or its default for this Redis deployment."""
        if self.lease_wait_replicas is not None:
            return self.lease_wait_replicas
        return 1 if self.redis_sentinel is not None else 0
