"""The drill's verdict is a typed report: each broken check named, the JSON as before."""

from __future__ import annotations

import dataclasses

from keydispenser_ops.drill.leases import LeaseReport
from keydispenser_ops.drill.runner import DrillReport, format_table

LEASES = LeaseReport(
    lease_intervals=4,
    lease_renewals=9,
    lease_overlaps=0,
    lease_overlap_pairs=[],
    lease_holder_exits={"143": 1},
    lease_holder_unexpected_exits=0,
    snowflake_ids=1000,
    snowflake_duplicates=0,
    snowflake_errors={},
    snowflake_batches_by_worker={"dispenser-0": {"1": 3}},
)
ROW = {"round": 1, "fault": "pause", "keys_discarded": 0, "outage_began_ms": 0, "resume_ms": 0}
PASSED = DrillReport(
    faults=[ROW],
    by_fault={"pause": {"rounds": 1, "keys_discarded": 0, "resume_ms_max": 0}},
    keys_dispensed=500,
    unique_keys=500,
    duplicates=0,
    requests=50,
    errors={},
    faults_not_injected=0,
    ledger={"rows": 500, "missing": 0, "used_missing": 0, "marked": 10, "duplicate_alarms": 0,
            "lost_to_fault": {}},
    ledger_missing=0,
    ledger_used_missing=0,
    ledger_duplicate_alarms=0,
    ledger_lost_to_fault={},
    lifecycle={"uins_received": 40, "ledger_missing": 0, "replays_of_keys_reissued": 0},
    keys_in_two_hands=0,
    status_changes_lost=0,
    ledger_wrong_client=0,
    fail_closed_s=0.0,
    fail_closed_by_process={},
    lease_renewals_unreplicated=0,
    ledger_restores=2,
    ledger_halts=0,
    fence_not_engaged=[],
    not_resumed=[],
    lease_faults_not_observed=[],
    fault_kinds=["pause"],
    leases=LEASES,
    process_exits=[],
    postgres_fence=True,
    lease_wait=True,
)  # fmt: skip


def test_a_drill_where_every_check_held_has_no_failures() -> None:
    assert PASSED.failures() == []
    assert "FAILED" not in format_table(PASSED)


def test_each_broken_check_is_named() -> None:
    """The checks every drill makes come first, as written once (report.Report: the
    cluster drill's report extends it too), then the Sentinel drill's own."""
    broken = dataclasses.replace(
        PASSED,
        duplicates=3,
        ledger={**PASSED.ledger, "missing": 2},
        lifecycle={
            **PASSED.lifecycle,
            "keys_in_two_hands": 1,
            "status_changes_lost": 4,
            "ledger_wrong_client": 5,
            "put_pairs_both_applied": 6,
            "repeats_contradicted": 7,
        },
        not_resumed=[1],
        faults_not_injected=1,
        process_exits=["keysync"],
        leases=dataclasses.replace(LEASES, lease_overlaps=1, snowflake_duplicates=5),
        ledger_halts=1,
    )
    assert broken.failures() == [
        "3 keys dispensed twice",
        "2 ledger records lost",
        "1 keys live in two hands",
        "4 status changes lost",
        "5 under another client",
        "6 PUT pairs answered applied both",
        "7 acknowledged PUTs answered otherwise later",
        "processes exited: ['keysync']",
        "no key after rounds [1]",
        "1 faults not injected",
        "snowflake IDs issued twice",
        "1 leases overlapped",
        "the ledger halted 1 times",
    ]
    assert format_table(broken).count("FAILED: ") == 13


def test_the_cluster_drill_makes_the_same_checks() -> None:
    from keydispenser_ops.drill.cluster import ClusterDrillReport

    report = ClusterDrillReport(
        faults=[],
        keys_dispensed=500,
        unique_keys=500,
        duplicates=3,
        requests=50,
        errors={},
        faults_not_injected=1,
        ledger={**PASSED.ledger, "missing": 2},
        process_exits=[],
        fence_not_engaged=[],
        not_resumed=[],
        fault_kinds=[],
        lifecycle={**PASSED.lifecycle, "keys_in_two_hands": 1},
    )
    assert report.failures() == [
        "3 keys dispensed twice",
        "2 ledger records lost",
        "1 keys live in two hands",
        "1 faults not injected",
    ]


def test_the_json_report_keeps_its_flat_shape_and_carries_the_verdict() -> None:
    shown = PASSED.as_json()
    assert shown["drill"] == "failover" and shown["rounds"] == 1
    assert shown["lease_overlaps"] == 0 and shown["snowflake_ids"] == 1000  # lease figures inline
    assert "leases" not in shown and shown["verdict"] == []
    assert shown["ledger"]["duplicate_alarms"] == 0 and "ledger_duplicate_alarms" not in shown
    assert dataclasses.replace(PASSED, duplicates=1).as_json()["verdict"] == [
        "1 keys dispensed twice"
    ]


def test_entries_keysync_left_unapplied_at_the_end_fail_the_drill() -> None:
    """Records still in the stream when the fleet stopped would be counted as lost:
    the drill names that rather than let it pass as missing records (or hide it)."""
    left = dataclasses.replace(PASSED, ledger={**PASSED.ledger, "unapplied_at_end": 302})
    assert left.failures() == ["keysync left 302 ledger entries unapplied at the end"]
    unread = dataclasses.replace(PASSED, ledger={**PASSED.ledger, "unapplied_at_end": -1})
    assert unread.failures() == ["keysync left -1 ledger entries unapplied at the end"]


def test_in_synchronous_mode_a_promotion_that_lost_anything_fails_the_drill() -> None:
    """Under Patroni's synchronous mode the drill checks what the design promises: no
    PostgreSQL fence discards, nothing for the ledger's restore to write again."""
    synchronous = dataclasses.replace(
        PASSED, stack={"postgres": "patroni", "synchronous_mode": True}, ledger_restores=0
    )
    assert synchronous.failures() == []
    lossy = dataclasses.replace(
        synchronous,
        faults=[{**ROW, "postgres_keys_discarded": 12}],
        ledger_links_restored=3,
    )
    assert lossy.failures() == [
        "synchronous mode: PostgreSQL fences discarded 12 keys",
        "synchronous mode: the ledger restored 3 links",
    ]
    # Asynchronous, the same figures are the fence and the restore doing their work.
    assert dataclasses.replace(lossy, stack={"synchronous_mode": False}).failures() == []
    assert format_table(lossy).splitlines()[0].startswith("stack: postgres patroni")
