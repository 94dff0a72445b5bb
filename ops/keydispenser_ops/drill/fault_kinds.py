"""Every fault the drills inject, declared once: the Redis topology it applies to, the
PostgreSQL stack it needs (none: either), whether it leaves Redis a primary of a new
identity (the fence must engage after it), and whether it may destroy Redis data a
ledger record sits in (records lost with it are excused, charged to it by their time:
history.LossSpan). The drills, the checker and the command line read these; the order
is the default order of rounds.

PostgreSQL stacks: ``pair`` (a primary and a replica the drill promotes itself,
pair_faults.py) or ``patroni`` (three members Patroni fails over, patroni_faults.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shared.domain.errors import ConfigError

Topology = Literal["sentinel", "cluster"]
PostgresStack = Literal["pair", "patroni"]


@dataclass(frozen=True)
class FaultKind:
    topology: Topology
    new_primary: bool = False  # Redis ends with a primary of a new identity
    destroys_data: bool = False  # writes not yet copied, or the data itself, may be lost
    postgres: PostgresStack | None = None  # the PostgreSQL stack it needs (None: either)


FAULTS: dict[str, FaultKind] = {
    # A primary with replicas and Sentinels (runner.py, faults.py)
    "primary_sigkill": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "sentinel_failover": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_keysync": FaultKind("sentinel"),
    "failback": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "postgres_failover": FaultKind("sentinel", postgres="pair"),  # lost entries applied again
    "cut_links_then_sigkill": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_keygen": FaultKind("sentinel"),
    "redis_restart_old_snapshot": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_dispenser": FaultKind("sentinel"),
    "restart_postgres": FaultKind("sentinel", postgres="pair"),
    "kill_lease_holder": FaultKind("sentinel"),
    "clock_back": FaultKind("sentinel"),
    "partition": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "pause": FaultKind("sentinel", destroys_data=True),  # of the Redis primary only
    "redis_restart_empty": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "postgres_split_brain": FaultKind("sentinel", postgres="pair"),
    # PostgreSQL under Patroni (patroni_faults.py), with Sentinel's Redis: the leader
    # killed (its replicas lagging, in asynchronous mode) and rejoining rewound, a
    # patronictl switchover and failover, the leader cut off from everything.
    "patroni_leader_kill": FaultKind("sentinel", postgres="patroni"),
    "patroni_switchover": FaultKind("sentinel", postgres="patroni"),
    "patroni_failover": FaultKind("sentinel", postgres="patroni"),
    "patroni_cut_leader": FaultKind("sentinel", postgres="patroni"),
    # A Redis Cluster of three shards (cluster.py): every round strikes the drill's slot
    "shard_primary_sigkill": FaultKind("cluster", new_primary=True, destroys_data=True),
    "cluster_failover": FaultKind("cluster", new_primary=True),  # a replica caught up
    "lagging_replica_failover": FaultKind("cluster", new_primary=True, destroys_data=True),
    "shard_restart_empty": FaultKind("cluster", new_primary=True, destroys_data=True),
}

DATA_LOSS_FAULTS = frozenset(name for name, kind in FAULTS.items() if kind.destroys_data)


def of(topology: Topology, postgres: PostgresStack = "pair") -> list[str]:
    """The faults of a topology on a PostgreSQL stack, in their default order."""
    return [
        name
        for name, kind in FAULTS.items()
        if kind.topology == topology and kind.postgres in (None, postgres)
    ]


def new_primary(topology: Topology) -> frozenset[str]:
    """The topology's faults after which the fence must engage."""
    return frozenset(
        name for name, kind in FAULTS.items() if kind.topology == topology and kind.new_primary
    )


def chosen(
    topology: Topology, only: list[str] | None, postgres: PostgresStack = "pair"
) -> list[str]:
    """The faults asked for (``--faults``), or all of the topology's on the stack; an
    unknown one, or one of another topology or stack, is refused naming the flag that
    takes it."""
    if not only:
        return of(topology, postgres)
    for name in only:
        kind = FAULTS.get(name)
        if kind is None:
            raise ConfigError(f"--faults: unknown fault {name!r} (known: {', '.join(FAULTS)})")
        if kind.topology != topology:
            raise ConfigError(
                f"--faults: {name} is a fault of the {kind.topology} drill "
                f"(--redis {kind.topology}); this is the {topology} drill"
            )
        if kind.postgres not in (None, postgres):
            raise ConfigError(
                f"--faults: {name} is a fault of PostgreSQL under --postgres {kind.postgres}; "
                f"this drill runs --postgres {postgres}"
            )
    return only


def check_implemented(
    topology: Topology, implemented: Iterable[str], postgres: PostgresStack = "pair"
) -> None:
    """A drill's own table of fault functions names exactly the faults declared here for
    its topology and stack (a fault added on one side only is a mistake, found at start)."""
    found, declared = set(implemented), set(of(topology, postgres))
    if found != declared:
        raise RuntimeError(
            f"the {topology} drill's faults differ from fault_kinds.FAULTS: "
            f"implemented only {sorted(found - declared)}, declared only {sorted(declared - found)}"
        )
