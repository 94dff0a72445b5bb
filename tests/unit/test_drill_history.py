"""The drill's checker: ledger records against the history, fail-closed time from logs."""

from __future__ import annotations

import json
from pathlib import Path

from keydispenser_ops.drill import history
from keydispenser_ops.drill.history import check_ledger, fail_closed_seconds, loss_spans


def test_a_record_is_charged_to_a_fault_by_its_time_never_by_a_window() -> None:
    # The stream held entries not applied since 97.0 when the primary was killed at 100.
    spans = loss_spans([("primary_sigkill", 97.0, 103.0, {})])
    received = {"a": 50.0, "b": 101.0, "c": 103.5, "d": 96.9, "e": 98.0}
    recorded = {"a": False}
    found = check_ledger(recorded, received, {}, spans, 0)
    # c came after the fault was over, d was applied before it began: both are missing.
    assert found["missing"] == 2 and found["missing_sample"] == ["c", "d"]
    assert found["lost_to_fault"] == {"primary_sigkill": 2}  # b and e, in the stream


def test_an_accepted_mark_must_reach_the_ledger() -> None:
    received = {"a": 10.0, "b": 20.0}
    found = check_ledger({"a": True, "b": False}, received, {"a": 11.0, "b": 21.0}, [], 0)
    assert found["used_missing"] == 1 and found["used_missing_sample"] == ["b"]
    assert found["marked"] == 2


def test_postgresql_faults_and_process_pauses_excuse_nothing() -> None:
    spans = loss_spans(
        [
            ("pause", 100.0, 106.0, {"paused": "keysync"}),  # no data destroyed
            ("pause", 100.0, 106.0, {"paused": "postgres_primary"}),  # entries applied again
            ("postgres_split_brain", 109.0, 118.0, {}),
            ("postgres_failover", 119.0, 120.0, {}),
            ("pause", 121.0, 127.0, {"paused": "redis_primary"}),  # a failover meanwhile
            ("redis_restart_empty", 128.0, 129.0, {}),
        ]
    )
    assert [s.fault for s in spans] == ["pause", "redis_restart_empty"]
    received = {"a": 102.0, "b": 110.0, "c": 128.5, "d": 122.0}
    found = check_ledger({}, received, {}, spans, 0)
    assert found["missing_sample"] == ["a", "b"]
    assert found["lost_to_fault"] == {"pause": 1, "redis_restart_empty": 1}


def test_fail_closed_time_comes_from_the_processes_own_lines(tmp_path: Path) -> None:
    lines = [
        {"ts": "2026-01-01T00:00:01.000Z", "event": "store_unavailable", "store": "postgres"},
        {"ts": "2026-01-01T00:00:02.000Z", "event": "store_unavailable", "store": "postgres_fence"},
        {"ts": "2026-01-01T00:00:05.500Z", "event": "store_recovered", "store": "postgres_fence"},
        {"ts": "2026-01-01T00:00:09.000Z", "event": "store_unavailable", "store": "postgres_fence"},
    ]
    (tmp_path / "keysync.log").write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut")
    (tmp_path / "keygen.log").write_text("")
    assert fail_closed_seconds(tmp_path) == {"keygen": 0.0, "keysync": 3.5}
    assert history.count_events(tmp_path, "store_recovered") == 1


def test_a_slow_answer_is_charged_by_its_request_not_by_when_it_arrived() -> None:
    """An entry is written between a request and its answer: a request under way when
    a restart destroyed the stream's data may have lost its record, however late its
    answer came; one sent after the fault was over may not."""
    spans = loss_spans([("redis_restart_empty", 10.0, 12.0, {})])
    received = {"late": 20.0, "after": 20.0}
    requested = {"late": 11.5, "after": 12.5}
    found = check_ledger({}, received, {}, spans, 0, requested)
    assert found["lost_to_fault"] == {"redis_restart_empty": 1}
    assert found["missing"] == 1 and found["missing_sample"] == ["after"]
