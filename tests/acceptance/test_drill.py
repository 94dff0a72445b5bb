"""A short drill: real primary, replicas and Sentinels, real processes, every fault once:
SIGKILLs, failovers, a partition, pauses, a restart without persistence, two
PostgreSQL primaries at once.

The full drill (>= 30 rounds, every fault) is `keydispenser drill`; its figures are
in docs/reliability.md. This asserts behaviour only, never speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keydispenser_ops.drill import runner
from keydispenser_ops.processes import run_cli
from tests.conftest import TEST_SECRET

# The drills run alone, after the rest of the suite (`make test`): each measures pauses
# and counts what the faults destroyed, and a second worker's load would distort both.
pytestmark = [pytest.mark.acceptance, pytest.mark.drill]

REDIS_FAULTS = sorted(runner.REDIS_FAULTS)


# Mixed, not in the default order: PostgreSQL promotions (each followed by a quiet spell
# of the ledger) between partitions, pauses and Redis restarts, as `drill --faults
# partition,pause,postgres_split_brain,redis_restart_empty` mixes them.
FAULTS = [
    "partition",
    "postgres_split_brain",
    "pause",
    "redis_restart_empty",
    "postgres_failover",
    "cut_links_then_sigkill",
    "failback",
    "kill_keysync",
    "primary_sigkill",
    "redis_restart_old_snapshot",
    "sentinel_failover",
    "kill_lease_holder",
    "clock_back",
]
assert set(REDIS_FAULTS) <= set(FAULTS)


def test_no_key_is_dispensed_twice_through_failovers(tmp_path: Path) -> None:
    """The drill runs its own Redis and PostgreSQL pairs: it kills and promotes them."""
    report_path = tmp_path / "drill.json"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KD_PERMUTATION_KEY": TEST_SECRET}
    done = run_cli(
        "drill",
        "--rounds",
        str(len(FAULTS)),
        "--faults",
        ",".join(FAULTS),
        "--json",
        str(report_path),
        env=env,
        timeout_s=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"] == []
    assert report["duplicates"] == 0
    assert report["keys_dispensed"] > 0  # how many depends on speed: never asserted
    assert report["rounds"] == len(FAULTS)
    assert report["process_exits"] == []
    assert report["fence_not_engaged"] == [] and report["not_resumed"] == []
    assert report["faults_not_injected"] == 0, report["faults"]
    # Service resumed after every fault: keys were handed out once it was over.
    assert all(row["served_after_fault"] > 0 for row in report["faults"]), report["faults"]
    # After every Redis fault the primary had a new identity and the fence took it over.
    for row in report["faults"]:
        if row["fault"] in REDIS_FAULTS:
            assert row["identity_changed"] and row["fence_engaged"], row
    (failback,) = [row for row in report["faults"] if row["fault"] == "failback"]
    assert failback["returned_to_first_primary"], failback
    # The snapshot was stale (keys were dispensed after it), and its lists were discarded.
    (snapshot,) = [row for row in report["faults"] if row["fault"] == "redis_restart_old_snapshot"]
    assert snapshot["keys_dispensed_after_snapshot"] > 0, snapshot
    assert snapshot["keys_discarded"] > 0, snapshot
    # PostgreSQL failed over to a replica that had missed commits while keys flowed:
    # the PostgreSQL fence discarded its cold inventory.
    (failover,) = [row for row in report["faults"] if row["fault"] == "postgres_failover"]
    assert failover["keys_in_lag_window"] > 0, failover
    assert failover["postgres_keys_discarded"] > 0, failover
    # The ledger never saw a key issued twice, and holds every key clients received and
    # every use mark the dispensers accepted, under the client it went to, but for what
    # a Redis fault destroyed by definition (entries not applied when the primary was
    # lost, of the default durability), each charged to its fault by its time.
    # PostgreSQL promotions lose nothing: the entries they lost are applied again.
    ledger = report["ledger"]
    assert ledger["duplicate_alarms"] == 0
    assert report["ledger_missing"] == 0 and report["ledger_used_missing"] == 0, ledger
    assert ledger["marked"] > 0
    assert set(report["ledger_lost_to_fault"]) <= {*REDIS_FAULTS, "pause"}
    assert ledger["rows"] > 0.5 * report["unique_keys"], ledger
    # The UIN lifecycle (MOSIP's GET and PUT, retried Idempotency-Keys, released UINs
    # issued again) with replicated durability: nothing excused, nothing contradicted.
    uins = report["lifecycle"]
    assert uins["uins_received"] > 0 and uins["status_changes_acknowledged"] > 0, uins
    assert uins["retries"] > 0 and uins["uins_reissued"] > 0, uins
    assert report["keys_in_two_hands"] == 0 and report["status_changes_lost"] == 0, uins
    assert report["ledger_wrong_client"] == 0 and uins["ledger_missing"] == 0, uins
    assert uins["replays_of_keys_reissued"] == 0, uins
    # Two keysyncs decided PUT pairs (one applied, the other refused, never both), and
    # acknowledged PUTs asked again were answered as the first time, quiet spells after
    # each PostgreSQL promotion included.
    assert uins["put_pairs_decided"] > 0 and uins["put_pairs_both_applied"] == 0, uins
    assert uins["repeats"] > 0 and uins["repeats_contradicted"] == 0, uins
    for row in report["faults"]:
        if row["fault"] in ("postgres_failover", "postgres_split_brain"):
            assert row["quiet_s"] > 0, row
    # Two primaries at once: the promoted one fenced (refusing the old one meanwhile,
    # as fail_closed_s counts, when a process reached it during the split).
    (split,) = [row for row in report["faults"] if row["fault"] == "postgres_split_brain"]
    assert split["postgres_keys_discarded"] > 0, split
    assert report["fail_closed_s"] >= 0
    # The old Redis primary kept answering one side of the partition.
    (partition,) = [row for row in report["faults"] if row["fault"] == "partition"]
    assert partition["old_primary"] != partition["new_primary"], partition
    # Machine-ID leases: no two holders of one ID overlapped, no snowflake ID came twice,
    # and IDs came from both workers of both dispensers.
    assert report["lease_overlaps"] == 0, report["lease_overlap_pairs"]
    assert report["lease_renewals"] > report["lease_intervals"]  # each holder's deadlines
    assert report["snowflake_duplicates"] == 0 and report["snowflake_ids"] > 0
    assert report["lease_faults_not_observed"] == []
    # The `keydispenser lease -- sleep` holders ended only with a lost lease (exit 143).
    assert report["lease_holder_unexpected_exits"] == 0, report["lease_holder_exits"]
    by_worker = report["snowflake_batches_by_worker"]
    assert sorted(by_worker) == ["dispenser-0", "dispenser-1"], by_worker
    assert all(len(workers) >= 2 for workers in by_worker.values()), by_worker
    # Every holder (workers and lease CLI processes) re-acquired after each Redis fault.
    assert all(row["leases_reacquired"] for row in report["faults"] if row["fault"] in REDIS_FAULTS)
    # The killed holder's ID was granted again, after its deadline (it had expired).
    (killed,) = [row for row in report["faults"] if row["fault"] == "kill_lease_holder"]
    assert killed["regranted"] and killed["regrant_after_deadline_ms"] > 0, killed
    # The stepped clock was refused (503 IDG-015) rather than minting behind itself.
    (stepped,) = [row for row in report["faults"] if row["fault"] == "clock_back"]
    assert stepped["clock_behind_503s"] > 0, stepped


@pytest.mark.parametrize("slot_per", ["namespace", "type"])
def test_no_key_is_dispensed_twice_through_cluster_shard_faults(
    tmp_path: Path, slot_per: str
) -> None:
    """`drill --redis cluster`: a Redis Cluster (3 primaries, 3 replicas) whose shard
    holding the namespace's slot (with ``--slot-per type``: the drill type's slot) is
    failed over, killed, failed over while its replica lags, and restarted empty, under
    load from real processes. With types spread, the two types on the other shards are
    answered with a key every time, throughout."""
    from keydispenser_ops.drill import cluster

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
