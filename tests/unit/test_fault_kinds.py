"""The drills' faults, declared once with their topology: what each topology runs by
default, which faults must be followed by the fence, which excuse lost records, and a
fault asked of the wrong drill refused (the command line, before any server starts:
tests/acceptance/test_cli.py)."""

from __future__ import annotations

import pytest

from keydispenser_ops.drill import fault_kinds
from shared.domain.errors import ConfigError


def test_each_topology_runs_its_own_faults_and_the_fence_follows_a_new_primary() -> None:
    sentinel, cluster = fault_kinds.of("sentinel"), fault_kinds.of("cluster")
    assert not set(sentinel) & set(cluster)
    assert fault_kinds.new_primary("sentinel") == {
        "primary_sigkill",
        "sentinel_failover",
        "failback",
        "cut_links_then_sigkill",
        "redis_restart_old_snapshot",
        "partition",
        "redis_restart_empty",
    }
    assert fault_kinds.new_primary("cluster") == set(cluster)


def test_only_faults_that_lose_redis_data_excuse_a_lost_record() -> None:
    excused = fault_kinds.DATA_LOSS_FAULTS
    assert "pause" in excused and "shard_restart_empty" in excused
    # PostgreSQL faults excuse nothing: keysync applies what a promotion lost again.
    assert not {"postgres_failover", "postgres_split_brain", "restart_postgres"} & excused
    assert "cluster_failover" not in excused  # the promoted replica had caught up


def test_a_fault_of_the_other_drill_is_refused_naming_its_flag() -> None:
    with pytest.raises(ConfigError, match="--redis cluster"):
        fault_kinds.chosen("sentinel", ["pause", "shard_restart_empty"])
    with pytest.raises(ConfigError, match="unknown fault 'unplug'"):
        fault_kinds.chosen("cluster", ["unplug"])
    assert fault_kinds.chosen("cluster", ["cluster_failover"]) == ["cluster_failover"]


def test_a_fault_implemented_or_declared_on_one_side_only_stops_the_drill_at_start() -> None:
    fault_kinds.check_implemented("cluster", fault_kinds.of("cluster"))
    with pytest.raises(RuntimeError, match=r"implemented only \['unplug'\]"):
        fault_kinds.check_implemented("cluster", [*fault_kinds.of("cluster"), "unplug"])
    with pytest.raises(RuntimeError, match=r"declared only \['pause'\]"):
        fault_kinds.check_implemented("sentinel", set(fault_kinds.of("sentinel")) - {"pause"})


def test_each_postgres_stack_runs_its_own_faults_beside_the_redis_ones() -> None:
    """--postgres pair keeps the drill's own promotions; --postgres patroni replaces them
    with Patroni's (a fault of the other stack is refused naming the flag)."""
    pair, patroni = fault_kinds.of("sentinel", "pair"), fault_kinds.of("sentinel", "patroni")
    assert {"postgres_failover", "postgres_split_brain", "restart_postgres"} <= set(pair)
    assert not {"postgres_failover", "postgres_split_brain", "restart_postgres"} & set(patroni)
    own = {"patroni_leader_kill", "patroni_switchover", "patroni_failover", "patroni_cut_leader"}
    assert own <= set(patroni) and not own & set(pair)
    assert set(pair) - set(patroni) == {
        "postgres_failover",
        "postgres_split_brain",
        "restart_postgres",
    }
    with pytest.raises(ConfigError, match="--postgres patroni"):
        fault_kinds.chosen("sentinel", ["patroni_switchover"])
    with pytest.raises(ConfigError, match="--postgres pair"):
        fault_kinds.chosen("sentinel", ["postgres_failover"], "patroni")
    assert fault_kinds.chosen("sentinel", ["pause"], "patroni") == ["pause"]
