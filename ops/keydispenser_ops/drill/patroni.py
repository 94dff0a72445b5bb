"""PostgreSQL under Patroni for the drill (``--postgres patroni``): etcd and three members
(keydispenser_ops.patroni), failing over by Patroni's own rules.

Each member's PostgreSQL is reached by the other members (replication) through its
infrastructure proxy, and each member reaches etcd through a proxy of its own
(links.py): a leader can be cut off from its cluster. The processes reach each member
through proxies of their own, with ``target_session_attrs=read-write``, as for the pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keydispenser_ops.drill.links import Links
from keydispenser_ops.embedded import system_postgres_bin
from keydispenser_ops.patroni import TTL_S, PatroniCluster, patroni_version


@dataclass
class PatroniStack:
    base: Path
    links: Links
    synchronous_mode: bool = False
    name: str = "patroni"
    # A promotion comes a whole leader key's life (TTL_S) after the last commit it may
    # lose, plus the lag before it and the time to fence: as docs/operations.md tells
    # operators, the log outlives that (three times the TTL).
    ledger_retain_s: float = 3.0 * TTL_S
    cluster: PatroniCluster = field(init=False)

    def __post_init__(self) -> None:
        self.cluster = PatroniCluster(
            self.base,
            synchronous_mode=self.synchronous_mode,
            announce=self.links.announce,
            dcs_route=self.links.dcs_route,
        )

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def ports(self) -> list[int]:
        return [member.pg_port for member in self.cluster.members]

    def dsn(self, database: str) -> str:
        return self.cluster.dsn(database)

    def admin_dsn(self, database: str) -> str:
        leader = self.cluster.wait_for_leader(60)
        return leader.dsn(database)

    def primary_pids(self) -> list[int]:
        leader = self.cluster.leader()
        return leader.postgres_pids() if leader is not None else []

    def describe(self) -> dict[str, Any]:
        binaries = system_postgres_bin()
        etcd = self.cluster.etcd
        return {
            "postgres": self.name,
            "synchronous_mode": self.synchronous_mode,
            "synchronous_mode_strict": self.synchronous_mode,
            "members": len(self.cluster.members),
            "patroni_version": patroni_version(),
            "etcd_version": etcd.version() if etcd is not None else None,
            "postgres_version": binaries.parent.name if binaries is not None else None,
            "failover_by": "patroni",
        }
