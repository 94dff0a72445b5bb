"""The drill's checker: ledger records against the history, fail-closed time from logs."""

from __future__ import annotations

import json
from pathlib import Path

from shared.ops.drill import history
from shared.ops.drill.history import check_ledger, fail_closed_seconds, loss_windows


def test_a_record_missing_outside_every_loss_window_is_missing() -> None:
    windows = loss_windows([("primary_sigkill", 100.0, 103.0, {})])
    received = {"a": 50.0, "b": 101.0, "c": 200.0, "d": 96.0}
    recorded = {"a": False, "d": False}
    found = check_ledger(recorded, received, {}, windows, 0)
    assert found["missing"] == 1 and found["missing_sample"] == ["c"]
    assert found["lost_with_data"] == {"primary_sigkill": 1}  # b, while the fault ran


def test_an_accepted_mark_must_reach_the_ledger() -> None:
    received = {"a": 10.0, "b": 20.0}
    found = check_ledger({"a": True, "b": False}, received, {"a": 11.0, "b": 21.0}, [], 0)
    assert found["used_missing"] == 1 and found["used_missing_sample"] == ["b"]
    assert found["marked"] == 2


def test_the_nearest_fault_takes_the_loss_and_process_pauses_lose_nothing() -> None:
    windows = loss_windows(
        [
            ("pause", 100.0, 106.0, {"paused": "keysync"}),  # no data destroyed
            ("postgres_split_brain", 109.0, 118.0, {}),
            ("redis_restart_empty", 121.0, 122.0, {}),
        ]
    )
    assert [w.fault for w in windows] == ["postgres_split_brain", "redis_restart_empty"]
    # a: during the keysync pause, before the split brain's lead; d: between two faults,
    # nearer the split brain's end than the restart's start.
    received = {"a": 102.0, "b": 110.0, "c": 121.5, "d": 119.0}
    found = check_ledger({}, received, {}, windows, 0)
    assert found["missing_sample"] == ["a"]
    assert found["lost_with_data"] == {"postgres_split_brain": 2, "redis_restart_empty": 1}


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
