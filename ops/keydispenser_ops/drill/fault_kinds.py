"""Every fault the drills inject, declared once: the topology it applies to, whether it
leaves Redis a primary of a new identity (the fence must engage after it), and whether
it may destroy Redis data a ledger record sits in (records lost with it are excused,
charged to it by their time: history.LossSpan). The drills, the checker and the
command line read these; the order is the default order of rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shared.domain.errors import ConfigError

Topology = Literal["sentinel", "cluster"]


@dataclass(frozen=True)
class FaultKind:
    topology: Topology
    new_primary: bool = False  # Redis ends with a primary of a new identity
    destroys_data: bool = False  # writes not yet copied, or the data itself, may be lost


FAULTS: dict[str, FaultKind] = {
    # A primary with replicas and Sentinels (runner.py, faults.py)
    "primary_sigkill": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "sentinel_failover": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_keysync": FaultKind("sentinel"),
    "failback": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "postgres_failover": FaultKind("sentinel"),  # keysync applies lost entries again
    "cut_links_then_sigkill": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_keygen": FaultKind("sentinel"),
    "redis_restart_old_snapshot": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "kill_dispenser": FaultKind("sentinel"),
    "restart_postgres": FaultKind("sentinel"),
    "kill_lease_holder": FaultKind("sentinel"),
    "clock_back": FaultKind("sentinel"),
    "partition": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "pause": FaultKind("sentinel", destroys_data=True),  # of the Redis primary only
    "redis_restart_empty": FaultKind("sentinel", new_primary=True, destroys_data=True),
    "postgres_split_brain": FaultKind("sentinel"),
    # A Redis Cluster of three shards (cluster.py): every round strikes the drill's slot
    "shard_primary_sigkill": FaultKind("cluster", new_primary=True, destroys_data=True),
    "cluster_failover": FaultKind("cluster", new_primary=True),  # a replica caught up
    "lagging_replica_failover": FaultKind("cluster", new_primary=True, destroys_data=True),
    "shard_restart_empty": FaultKind("cluster", new_primary=True, destroys_data=True),
}

DATA_LOSS_FAULTS = frozenset(name for name, kind in FAULTS.items() if kind.destroys_data)


def of(topology: Topology) -> list[str]:
    """The topology's faults, in their default order."""
    return [name for name, kind in FAULTS.items() if kind.topology == topology]


def new_primary(topology: Topology) -> frozenset[str]:
    """The topology's faults after which the fence must engage."""
    return frozenset(n for n in of(topology) if FAULTS[n].new_primary)


def chosen(topology: Topology, only: list[str] | None) -> list[str]:
    """The faults asked for (``--faults``), or all of the topology's; an unknown one, or
    one of the other topology, is refused naming the flag that takes it."""
    if not only:
        return of(topology)
    for name in only:
        kind = FAULTS.get(name)
        if kind is None:
            raise ConfigError(f"--faults: unknown fault {name!r} (known: {', '.join(FAULTS)})")
        if kind.topology != topology:
            raise ConfigError(
                f"--faults: {name} is a fault of the {kind.topology} drill "
                f"(--redis {kind.topology}); this is the {topology} drill"
            )
    return only


def check_implemented(topology: Topology, implemented: Iterable[str]) -> None:
    """A drill's own table of fault functions names exactly the faults declared here for
    its topology (a fault added on one side only is a mistake, found at start)."""
    found, declared = set(implemented), set(of(topology))
    if found != declared:
        raise RuntimeError(
            f"the {topology} drill's faults differ from fault_kinds.FAULTS: "
            f"implemented only {sorted(found - declared)}, declared only {sorted(declared - found)}"
        )
