"""A short drill on a Redis Cluster: real primaries and replicas, real processes, every
shard fault once, the UIN lifecycle beside the plain load (a file of its own, so the
suite's two workers run it beside the Sentinel drill). The full drill is `keydispenser
drill --redis cluster`; its figures are in docs/reliability.md. Behaviour only, never
speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.ops.processes import run_cli
from tests.conftest import TEST_SECRET

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("slot_per", ["namespace", "type"])
def test_no_key_is_dispensed_twice_through_cluster_shard_faults(
    tmp_path: Path, slot_per: str
) -> None:
    """`drill --redis cluster`: a Redis Cluster (3 primaries, 3 replicas) whose shard
    holding the namespace's slot (with ``--slot-per type``: the drill type's slot) is
    failed over, killed, failed over while its replica lags, and restarted empty, under
    load from real processes. With types spread, the two types on the other shards are
    answered with a key every time, throughout."""
    from shared.ops.drill import cluster

    report_path = tmp_path / "cluster.json"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KD_PERMUTATION_KEY": TEST_SECRET}
    kinds = list(cluster.CLUSTER_FAULTS)
    done = run_cli(
        "drill",
        "--redis",
        "cluster",
        "--slot-per",
        slot_per,
        "--rounds",
        str(len(kinds)),
        "--json",
        str(report_path),
        env=env,
        timeout_s=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"] == [] and report["duplicates"] == 0
    assert [row["fault"] for row in report["faults"]] == kinds
    assert report["process_exits"] == [] and report["faults_not_injected"] == 0
    for row in report["faults"]:
        # A new primary (or the same node restarted: a new identity) owned the fence
        # after every fault, and keys flowed again.
        assert row["identity_changed"] and row["fence_engaged"], row
        assert row["served_after_fault"] > 0, row
    by_fault = {row["fault"]: row for row in report["faults"]}
    assert (
        by_fault["cluster_failover"]["primary_after"]
        != (by_fault["cluster_failover"]["primary_before"])
    )
    # The lagging replica missed writes, and its inherited lists were discarded.
    lagging = by_fault["lagging_replica_failover"]
    assert lagging["replica_lag_bytes"] > 0 and lagging["keys_discarded"] > 0, lagging
    ledger = report["ledger"]
    assert ledger["missing"] == 0 and ledger["used_missing"] == 0, ledger
    assert ledger["duplicate_alarms"] == 0 and ledger["marked"] > 0
    assert set(ledger["lost_to_fault"]) <= set(cluster.CLUSTER_FAULTS) - {"cluster_failover"}
    # The UIN lifecycle ran through the shard faults: nothing contradicted.
    uins = report["lifecycle"]
    assert uins["uins_received"] > 0 and uins["status_changes_acknowledged"] > 0, uins
    assert uins["keys_in_two_hands"] == 0 and uins["status_changes_lost"] == 0, uins
    assert uins["ledger_wrong_client"] == 0 and uins["ledger_missing"] == 0, uins
    assert report["slot_per"] == slot_per
    if slot_per == "type":
        assert len(report["bystanders"]) == 2
        for seen in report["bystanders"].values():
            assert seen["keys"] > 0 and seen["duplicates"] == 0 and seen["refusals"] == 0, seen
            assert seen["longest_gap_ms"] <= cluster.BYSTANDER_PAUSE_S * 1000, seen
    else:
        assert report["bystanders"] == {}
