"""Every link of the drill through a proxy of its own, so any one can be cut.

- Each Redis server announces an "infrastructure" proxy (``replica-announce-port``):
  the Sentinels, the replicas and Sentinel's answers all use it. Cutting it isolates
  the server from the rest of its deployment.
- Under Patroni, each member's PostgreSQL is reached by the other members (replication)
  through its infrastructure proxy too, and each member reaches etcd through a proxy of
  its own: a leader can be cut off from its cluster.
- Each process reaches each Redis server, each Sentinel and each PostgreSQL server
  through a proxy of its own: its ``redis_sentinel`` lists its Sentinel proxies and
  maps the addresses Sentinel reports to its own proxies (``address_map``), and its
  ``postgres_dsn`` lists its PostgreSQL proxies. Cutting them puts a process on one
  side of a partition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from keydispenser_ops.drill.proxy import Proxy, ProxyHub

# The processes whose links are proxied, as the fleet names them.
PROCESSES = (
    "keygen",
    "keysync",
    "keysync-2",
    "dispenser-0",
    "dispenser-1",
    "lease-0",
    "lease-1",
)


@dataclass
class Links:
    hub: ProxyHub = field(default_factory=ProxyHub)
    infra: dict[int, Proxy] = field(default_factory=dict)  # redis port -> announced proxy
    redis: dict[str, dict[int, Proxy]] = field(default_factory=dict)  # process -> port -> proxy
    sentinels: dict[str, list[Proxy]] = field(default_factory=dict)
    postgres: dict[str, dict[int, Proxy]] = field(default_factory=dict)
    dcs: dict[str, Proxy] = field(default_factory=dict)  # a Patroni member -> its link to etcd

    def announce(self, port: int) -> int:
        """The port a server (Redis, or a Patroni member's PostgreSQL) is reached on by the
        rest of its deployment: its infrastructure proxy's (made here)."""
        if port not in self.infra:
            self.infra[port] = self.hub.proxy(port)
        return self.infra[port].port

    def dcs_route(self, member: str, etcd_port: int) -> int:
        """The port Patroni member ``member`` reaches etcd on: a proxy of its own."""
        self.dcs[member] = self.hub.proxy(etcd_port)
        return self.dcs[member].port

    def cut_dcs(self, member: str) -> None:
        self.dcs[member].set("cut")

    def wire(self, redis_ports: list[int], sentinel_ports: list[int], pg_ports: list[int]) -> None:
        """A proxy per process and server."""
        for name in PROCESSES:
            self.redis[name] = {port: self.hub.proxy(port) for port in redis_ports}
            self.sentinels[name] = [self.hub.proxy(port) for port in sentinel_ports]
            self.postgres[name] = {port: self.hub.proxy(port) for port in pg_ports}

    def env(self, name: str, master: str, database: str) -> dict[str, str]:
        """``name``'s own ``KD_REDIS_SENTINEL`` and ``KD_POSTGRES_DSN``."""
        address_map = {
            self.infra[port].address: proxy.address for port, proxy in self.redis[name].items()
        }
        sentinel = {
            "sentinels": [proxy.address for proxy in self.sentinels[name]],
            "master_name": master,
            "address_map": address_map,
        }
        hosts = ",".join(proxy.address for _, proxy in sorted(self.postgres[name].items()))
        dsn = f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"
        return {"KD_REDIS_SENTINEL": json.dumps(sentinel), "KD_POSTGRES_DSN": dsn}

    def cut_redis(self, name: str, port: int) -> None:
        self.redis[name][port].set("cut")

    def cut_sentinels(self, name: str) -> None:
        for proxy in self.sentinels[name]:
            proxy.set("cut")

    def cut_infra(self, port: int, mode: str = "cut") -> None:
        self.infra[port].set(mode)

    def cut_postgres(self, name: str, port: int, mode: str = "cut") -> None:
        self.postgres[name][port].set(mode)

    def heal(self) -> None:
        """Every link passes again."""
        for proxy in self.hub.proxies:
            if proxy.mode != "pass":
                proxy.set("pass")

    def close(self) -> None:
        self.hub.close()
