"""Redis: one server (``redis_url``) or a primary found through Sentinel (with TLS),
the namespace every key lives under, and how machine-ID leases wait for replicas."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

from shared.domain.config.base import Strict

DEFAULT_NAMESPACE = "kd"  # settings.redis_namespace unless set
# Every Redis key is "<redis_namespace>:...": no ":" inside, so namespaces never overlap.
REDIS_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class ServerAccess(Strict):
    """How to reach Redis servers whose addresses are discovered (through Sentinel or
    a cluster's own map): credentials, TLS, and addresses seen differently from here."""

    username: str | None = None
    password: SecretStr | None = None  # of the Redis servers
    # TLS to every server (and Sentinel). The server certificate is checked against
    # tls_ca_file (else the system's CAs) and, with tls_check_hostname, its name
    # against the address reported; tls_cert_file/tls_key_file are a client
    # certificate for servers that require one.
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_check_hostname: bool = True

    # Where this process reaches a server at another address than the one reported
    # ("host:port" -> "host:port"): NAT, a port forward, a per-process proxy.
    address_map: dict[str, str] = Field(default_factory=dict)

    @property
    def database(self) -> int:
        """The Redis database number (a cluster has database 0 only)."""
        return 0

    def seeds(self) -> tuple[str, ...]:
        """The addresses given to start from (Sentinels, or cluster nodes)."""
        return ()

    @model_validator(mode="after")
    def _addresses(self) -> ServerAccess:
        for address in (*self.seeds(), *self.address_map, *self.address_map.values()):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"address {address!r} must be host:port")
        return self

    def addresses(self) -> list[tuple[str, int]]:
        return [_host_port(a) for a in self.seeds()]

    def reachable(self, address: tuple[str, int]) -> tuple[str, int]:
        """Where this process reaches a server reported at ``address``."""
        mapped = self.address_map.get(f"{address[0]}:{address[1]}")
        return address if mapped is None else _host_port(mapped)


class SentinelConfig(ServerAccess):
    """Redis behind Sentinel: the primary is looked up (and re-looked up) by name."""

    sentinels: tuple[str, ...] = Field(min_length=1)  # "host:port" each
    master_name: str = "mymaster"
    sentinel_password: SecretStr | None = None
    db: int = Field(default=0, ge=0)
    sentinel_username: str | None = None

    @property
    def database(self) -> int:
        return self.db

    def seeds(self) -> tuple[str, ...]:
        return self.sentinels


class ClusterConfig(ServerAccess):
    """A Redis Cluster: ``nodes`` are where to ask for the cluster's map (list several:
    only these, and the primary in use, are asked). Every key of a namespace lives in
    one hash slot, so
    every process works with the one primary that holds it, found (and re-found after
    a failover or a move of the slot) from the map the nodes report."""

    nodes: tuple[str, ...] = Field(min_length=1)  # "host:port" each
    # Which keys share a hash slot. "namespace": every key of the namespace, on one
    # shard. "type": each ID type's keys (and each machine-ID pool's) in a slot of
    # their own, so types spread over the shards, and a shard's failover, restart or
    # slowness touches only the types it holds (docs/operations.md, "Redis Cluster").
    slot_per: Literal["namespace", "type"] = "namespace"

    def seeds(self) -> tuple[str, ...]:
        return self.nodes


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class RedisSettings(BaseModel):
    """The top-level settings of Redis (part of ``Settings``)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    # When set, Redis is found through Sentinel and redis_url is not used.
    redis_sentinel: SentinelConfig | None = None
    # When set, Redis is a Redis Cluster and redis_url is not used (docs/operations.md,
    # "Redis Cluster"). Not with redis_sentinel.
    redis_cluster: ClusterConfig | None = None
    # Prefix of every Redis key: environments sharing one Redis server (and database)
    # each set their own and never see each other's hot lists, fence or ledger.
    redis_namespace: str = Field(default=DEFAULT_NAMESPACE, pattern=REDIS_NAMESPACE.pattern)
    # Machine-ID grants and renewals (snowflake types, `keydispenser lease`) count only
    # once this many Redis replicas acknowledged them (WAIT, within
    # lease_wait_timeout_ms): an old primary cut off from its replicas cannot keep a
    # lease alive that the promoted replica may grant again. None: 1 with
    # redis_sentinel or redis_cluster (deployments with replicas), 0 with a plain
    # redis_url.
    lease_wait_replicas: int | None = Field(default=None, ge=0, le=16)
    lease_wait_timeout_ms: int = Field(default=500, ge=10, le=10_000)

    def lease_wait_replicas_or_default(self) -> int:
        """lease_wait_replicas, or its default for this Redis deployment."""
        if self.lease_wait_replicas is not None:
            return self.lease_wait_replicas
        return 1 if self.redis_sentinel is not None or self.redis_cluster is not None else 0

    @property
    def discovered(self) -> SentinelConfig | ClusterConfig | None:
        """How the primary is found when it is not ``redis_url``."""
        return self.redis_sentinel or self.redis_cluster

    @property
    def redis_key_namespace(self) -> str:
        """What every Redis key starts with: the namespace, and on a Redis Cluster the
        namespace as a hash tag (``{kd}``), so that every key, and every script's keys,
        share one hash slot. The braces never occur in a namespace: the two layouts
        never overlap."""
        if self.redis_cluster is not None:
            return "{" + self.redis_namespace + "}"
        return self.redis_namespace

    @property
    def slot_per_type(self) -> bool:
        """Whether each ID type's keys live in a hash slot of their own."""
        return self.redis_cluster is not None and self.redis_cluster.slot_per == "type"

    def key_namespace_of(self, name: str) -> str:
        """What the Redis keys of an ID type (or a machine-ID pool) named ``name``
        start with: ``redis_key_namespace``, or with ``slot_per: type`` a hash tag of
        the namespace and the name (``{kd.farmer}``), a slot of the type's own. Every
        key one script touches starts with the same one (docs/design.md)."""
        if self.slot_per_type:
            return "{" + f"{self.redis_namespace}.{name}" + "}"
        return self.redis_key_namespace

    @model_validator(mode="after")
    def _one_way_to_redis(self) -> RedisSettings:
        if self.redis_sentinel is not None and self.redis_cluster is not None:
            raise ValueError("redis_cluster: not with redis_sentinel (choose one)")
        return self
